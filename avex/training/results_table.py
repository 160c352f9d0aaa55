"""The table a ``python -m avex.train`` run ends with: its policy beside full tokens, the methods
of ``eval_methods`` and the warmup-only policy, at each of ``eval_retentions``, captioned and
scored by the sweep's loop (:func:`avex.scoring.caption_and_score`) and written to the run's
``results.md`` and ``results.json``. An evaluation split without reference captions is scored
by fidelity instead: the share of clips whose pruned caption is the full-token caption y_full
exactly, and the mean log p(y_full | S) (:func:`avex.fidelity.fidelity_split`).

Scored by CIDEr, the table is followed by this run's C_av minus each other row's, with a paired
95% bootstrap interval over the scored clips (:mod:`avex.intervals`): one training seed
on 200 clips moves by several points, and the interval says which gaps the clips can resolve."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from avex import metrics
from avex.fidelity import fidelity_split, full_captions
from avex.intervals import compact_per_clip, difference_table, differences, interval_fields
from avex.judge_identity import judge_line, judge_record
from avex.methods import label, load_policy, make_selector, policy_selector
from avex.run_files import RESULTS_JSON, RESULTS_MD, WARMUP_POLICY_FILE
from avex.scoring import caption_and_score, keep_all
from avex.tables import markdown_table
from avex.training.config import TrainConfig


@torch.no_grad()
def score_run(cfg: TrainConfig, run_dir: Path, policy, captioner, cache,
              comparisons: dict) -> dict:
    """Score the run's ``policy`` (``comparisons``: method name -> the run directory of a
    comparison policy trained for the table, e.g. CaCoVID-AV) and write the table."""
    split = cache.split(cfg.eval_split)
    count = len(split) if cfg.max_eval_clips is None else min(len(split), cfg.max_eval_clips)
    clips = [split[i] for i in range(count)]
    policy.eval()
    methods = {}
    for name in cfg.eval_methods:
        if name in comparisons:
            methods[label(name)] = policy_selector(load_policy(comparisons[name], captioner))
        elif name == "cacovid":   # a warmup-only run trains no comparison policy
            continue
        else:
            methods[label(name)] = make_selector(name, captioner=captioner, seed=cfg.seed)
    warmup_policy_path = Path(run_dir) / WARMUP_POLICY_FILE
    if warmup_policy_path.exists() and not cfg.warmup_only:
        warmup_policy = copy.deepcopy(policy)
        warmup_policy.load_state_dict(load_file(str(warmup_policy_path)))
        methods["warmup only"] = policy_selector(warmup_policy)
    methods[run_label(cfg)] = policy_selector(policy)
    jobs = [(name, retention) for retention in cfg.eval_retentions for name in methods]
    intervals = []
    if all(clip.refs_av for clip in clips):
        rows = cider_rows(cfg, captioner, clips, methods, jobs)
        table = results_table(rows, f"{cfg.eval_split} split, {len(clips)} clips")
        if label("cacovid") in methods:
            table += ("\n\nCaCoVID-AV is trained for this table from this run's warmup and "
                      "seed, with its own reward (CIDEr against the references) and Top-K "
                      "selection, whatever this run's reward.")
        ours = run_label(cfg)
        found = differences(rows, ours, [name for name in methods if name != ours],
                            cfg.eval_retentions)
        table += "\n\n" + differences_text(found, ours, methods, cfg.eval_retentions, len(clips))
        intervals = [{"other": other, "retention": retention,
                      **interval_fields(value)}
                     for (other, retention), value in found.items()]
    else:   # no references to score against: how faithfully each selection keeps y_full
        rows = fidelity_rows(cfg, captioner, cache, clips, methods, jobs)
        table = fidelity_table(rows, f"{cfg.eval_split} split, {len(clips)} clips")
    judge = judge_record(cache.root, captioner.path, cache_dir=cfg.cache_dir) \
        if captioner.path is not None else None
    if judge is not None:
        table += "\n\n" + judge_line(judge)
    (Path(run_dir) / RESULTS_JSON).write_text(json.dumps(
        {"rows": rows, "differences": intervals, "judge": judge}, indent=2))
    (Path(run_dir) / RESULTS_MD).write_text(table + "\n")
    print(table)
    return {"rows": rows, "table": table}


def cider_rows(cfg: TrainConfig, captioner, clips, methods: dict, jobs) -> list[dict]:
    """C_av, C_v, C_a, BLEU-4 and METEOR of full tokens and of every (method, retention), with
    each clip's C_av (``per_clip``, rounded as the experiments' files round it) for the paired
    intervals."""
    scored = caption_and_score(captioner, {"eval": clips}, jobs, methods.__getitem__,
                               num_beams=cfg.num_beams, max_new_tokens=cfg.max_new_tokens,
                               progress=cfg.progress, desc="evaluation")
    rows = []
    for key, retention in [("full", 1.0)] + jobs:
        got = scored[("eval", key, retention)][1]
        rows.append({"method": label("full") if key == "full" else key, "retention": retention,
                     **{k: v for k, v in got.items() if k != "per_clip"},
                     "per_clip": compact_per_clip({"C_av": got["per_clip"]["C_av"]})})
    return rows


def differences_text(found: dict, ours: str, methods: dict, retentions, clips: int) -> str:
    """The paired intervals of this run's C_av against every other row, as a table with a
    sentence on what they do and don't cover."""
    table = difference_table(found, "this run", {name: name for name in methods if name != ours},
                             retentions)
    return (f"This run's C_av minus each method's, with its paired 95% bootstrap interval over "
            f"these {clips} clips. One training seed: the spread between seeds is not in it, "
            f"so a gap inside a few points can change sign with the seed "
            f"(docs/evaluation.md):\n\n{table}")


def fidelity_rows(cfg: TrainConfig, captioner, cache, clips, methods: dict, jobs) -> list[dict]:
    """Without references: per (method, retention), the share of clips whose pruned caption is
    y_full exactly (``exact``, %) and the mean log p(y_full | S) per token (``log_prob``), y_full
    being the captioner's full-token caption under the run's decoding
    (:func:`avex.fidelity.fidelity_split`)."""
    full = full_captions(captioner, cache, cfg.eval_split, num_beams=cfg.num_beams,
                         max_new_tokens=cfg.max_new_tokens, cache_dir=cfg.cache_dir,
                         progress=cfg.progress)
    rows = []
    for key, retention in [("full", 1.0)] + jobs:
        selector = keep_all if key == "full" else methods[key]
        got = fidelity_split(captioner, clips, selector, retention, full,
                             progress=cfg.progress, desc=f"fidelity: {key} @ {retention:.0%}")
        rows.append({"method": label("full") if key == "full" else key, "retention": retention,
                     "exact": 100.0 * sum(got["exact"]) / len(clips),
                     "log_prob": sum(got["log_prob"]) / len(clips)})
    return rows


def run_label(cfg: TrainConfig) -> str:
    """This run's row: its recipe, its reward where that isn't CIDEr, its selection where
    that isn't Top-K and its merge threshold where it has one."""
    name = _recipe_label(cfg)
    if cfg.reward != "cider" and not cfg.warmup_only:
        form = ", margin" if cfg.fidelity_form == "margin" else ""
        name = f"{name}, {cfg.reward} reward{form}"
    if cfg.selection == "set-aware":
        name = f"{name}, set-aware selection"
    if cfg.merge_threshold is not None:
        name = f"{name}, dropped tokens merged from cosine {cfg.merge_threshold:g}"
    return f"{name} (this run)"


def _recipe_label(cfg: TrainConfig) -> str:
    if cfg.warmup_only:
        return "warmup only"
    if cfg.exchange_search:
        return "AVEX, exchange search + distillation"
    if not cfg.exchanges:
        if cfg.rl_estimator == "rloo":
            return "AVEX, L_RL (RLOO)"
        return "set-level reward, no exchanges"
    if cfg.exchange_selection == "random":
        return "random exchanges"
    terms = []
    if cfg.rl:
        terms.append("L_RL (RLOO)" if cfg.rl_estimator == "rloo" else "L_RL")
    if cfg.lambda_ex > 0:
        terms.append("L_ex")
    return f"AVEX, {' + '.join(terms) or 'no loss'}"


def results_table(rows: list[dict], caption: str) -> str:
    table = markdown_table(
        ["method", "retention", "C_av", "C_v", "C_a", "BLEU-4", "METEOR"],
        [[r["method"], f"{r['retention']:.0%}"] + ["n/a" if r[k] is None else f"{r[k]:.1f}"
                                                   for k in ("C_av", "C_v", "C_a", "BLEU-4",
                                                             "METEOR")]
         for r in rows])
    return f"Results on the {caption} (CIDEr points; {metrics.cider_source()}):\n\n{table}"


def fidelity_table(rows: list[dict], caption: str) -> str:
    table = markdown_table(
        ["method", "retention", "y_full exact (%)", "mean log p(y_full)"],
        [[r["method"], f"{r['retention']:.0%}", f"{r['exact']:.1f}", f"{r['log_prob']:.4f}"]
         for r in rows])
    return (f"Results on the {caption}, which have no reference captions: how faithfully each "
            "selection keeps the captioner's full-token caption y_full (the share of clips "
            "whose pruned caption is y_full exactly, and the mean log-probability per token "
            f"of y_full under the kept tokens):\n\n{table}")
