"""The retention sweep: every method at every retention (the paper's Table 2 and Fig. 3), and
AVEX-Prune's difference from every other method with its paired bootstrap 95% interval
(:mod:`avex.intervals`), computed from the per-clip scores every row records."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from avex import _checks
from avex.figures import save_figure
from avex.intervals import (LEVEL, REPLICATES, SEED, Interval, compact_per_clip,
                            difference_table, differences, interval_fields)
from avex.judge_identity import judge_line, judge_record
from avex.methods import METHODS, SELECTORS, label, load_policy, make_selector
from avex.methods.learned import recipe
from avex.metrics import cider_source
from avex.paths import cache_relative, portable_command, relative_path
from avex.registry import privileged_notes
from avex.run_files import read_run_config, run_progress
from avex.scoring import caption_and_score
from avex.tables import markdown_table
from avex.training.loop import train_variant, variant_config
from avex.training.run_records import check_reusable

from .common import (PATHS_NOTE, ExperimentSettings, begin, check_names, check_retentions,
                     check_seeds, check_split, check_training_references, fmt, given_run,
                     load_experiment_inputs, results_json, split_clips, trained_elsewhere)

RETENTIONS = (0.5, 0.4, 0.3, 0.2, 0.1)


@dataclass
class SweepSettings(ExperimentSettings):
    """Every method of ``methods`` at every retention of ``retentions``, for each of ``seeds``
    (Random's seed; a trained method's training seed), on ``split`` and the transfer split.

    ``avex_run`` / ``cacovid_run``: a ``python -m avex.train`` run to score instead of training
    one here, or a pattern with ``{seed}`` (one run per seed); ``allow_unfinished`` scores the
    latest checkpoint of a run that did not finish. ``fastv_layer``: FastV-AV's K (default
    its own); ``qualitative``: clips whose captions the report shows."""

    methods: list = field(default_factory=lambda: list(SELECTORS))
    retentions: list = field(default_factory=lambda: list(RETENTIONS))
    seeds: list = field(default_factory=lambda: [0])
    split: str = "test"
    transfer_split: str = "transfer"   # "none": no transfer column
    avex_run: str | None = None
    cacovid_run: str | None = None
    allow_unfinished: bool = False
    fastv_layer: int | None = None
    qualitative: int = 3

    def check(self) -> None:
        super().check()
        check_split("split", self.split)
        check_names("methods", self.methods, SELECTORS)
        check_retentions(self.retentions)
        check_seeds(self.seeds)
        check_split("transfer_split", self.transfer_split, "none")
        _checks.flag("allow_unfinished", self.allow_unfinished)
        _checks.optional_int_at_least("fastv_layer", self.fastv_layer, 1)
        depth = self.captioner_depth()
        if self.fastv_layer is not None and depth is not None and self.fastv_layer > depth:
            raise ValueError(f"fastv_layer must be <= the captioner's {depth} layers, got "
                             f"{self.fastv_layer}")
        _checks.int_at_least("qualitative", self.qualitative, 0)
        self.check_flags_used()
        self.check_training_kept({METHODS[m].label: METHODS[m].train
                                  for m in trained_methods(self.methods)
                                  if getattr(self, f"{m}_run") is None}, "method")
        if self.out is not None:   # a run already in --out must be the run asked for
            for cfg in self.planned_runs(Path(self.out)):
                check_reusable(cfg)

    def check_flags_used(self) -> None:
        """Refuse a flag about a method not in ``methods``, and ``--allow-unfinished`` without a
        given run: accepted, either would change nothing."""
        for flag, method in (("--avex-run", "avex"), ("--cacovid-run", "cacovid"),
                             ("--fastv-layer", "fastv")):
            value = getattr(self, flag[2:].replace("-", "_"))
            if value is not None and method not in self.methods:
                raise ValueError(f"{flag} {value!r} would have no effect: {method} is not in "
                                 f"--methods ({','.join(self.methods)}); add it or drop it")
        if self.allow_unfinished and all(getattr(self, f"{m}_run") is None
                                         for m in trained_methods(self.methods)):
            raise ValueError("--allow-unfinished would have no effect: it applies to a given "
                             "run (--avex-run, --cacovid-run), and none is given")

    def training_unused(self) -> str | None:
        """Why ``train`` would change nothing: no method of ``methods`` is trained here."""
        trained = trained_methods(self.methods)
        if not trained:
            return (f"no method of --methods ({','.join(self.methods)}) is trained (only "
                    f"{' and '.join(trained_methods(METHODS))} are)")
        if all(getattr(self, f"{m}_run") is not None for m in trained):
            return (f"every trained method of --methods ({','.join(trained)}) is given a run "
                    "(--avex-run, --cacovid-run), so the sweep trains none")
        return None

    def planned_runs(self, out: Path) -> list:
        """The settings of each run the sweep trains in ``out``, in its order: every trained
        method without a given run (AVEX-Prune first), per seed; CaCoVID-AV starts from
        AVEX-Prune's warmup where the sweep trains both (as :func:`run_sweep` does)."""
        base = self.base_train_config()
        runs = []
        for method in sorted(trained_methods(self.methods), key=lambda m: m != "avex"):
            if getattr(self, f"{method}_run") is not None:
                continue
            for seed in self.seeds:
                shares = method != "avex" and "avex" in self.methods and self.avex_run is None
                runs.append(variant_config(
                    base, out / "runs" / f"{method}-seed{seed}",
                    warmup_from=out / "runs" / f"avex-seed{seed}" if shares else None,
                    seed=seed, **METHODS[method].train))
        return runs

    def given_runs(self) -> dict:
        """The given runs (``--avex-run``, ``--cacovid-run``, one per seed for a pattern),
        finished unless ``allow_unfinished``: flag -> the run's settings."""
        runs, captioner = {}, None
        for method in ("avex", "cacovid"):
            path = getattr(self, f"{method}_run")
            if path is not None and captioner is None:
                captioner = self.captioner_model()
            if path is None:
                continue
            flag = f"--{method}-run"
            for seed in self.seeds if "{seed}" in path else [None]:
                runs[flag if seed is None else f"{flag} (seed {seed})"] = given_run(
                    path if seed is None else path.replace("{seed}", str(seed)), "latest", flag,
                    finished=not self.allow_unfinished, captioner=captioner)
        return runs


def trained_methods(methods) -> list[str]:
    return [m for m in methods if METHODS[m].train is not None]


def given_run_dir(settings: SweepSettings, method: str, seed: int) -> str | None:
    """The run directory given for a trained method (``avex_run``, ``cacovid_run``): one run,
    or one per seed when it holds ``{seed}`` (e.g. ``ABL/runs/seed{seed}/A``)."""
    given = getattr(settings, f"{method}_run")
    return None if given is None else given.replace("{seed}", str(seed))


def shared_across_seeds(method: str, settings: SweepSettings) -> bool:
    """Captioned once for all seeds: deterministic methods and a policy given as one run."""
    if METHODS[method].train is not None:
        given = getattr(settings, f"{method}_run")
        return given is not None and "{seed}" not in given
    return not METHODS[method].seeded


def policy_for(settings: SweepSettings, method: str, seed: int, captioner, out: Path,
               warmup_from=None):
    """(policy, run_dir, seed_of_run) for a trained method (AVEX-Prune, CaCoVID-AV);
    ``warmup_from``: a run of the same seed whose warmup policy it starts from."""
    given = given_run_dir(settings, method, seed)
    if given is not None:
        run_dir = Path(given)
    else:
        run_dir = train_variant(settings.base_train_config(),
                                out / "runs" / f"{method}-seed{seed}", warmup_from=warmup_from,
                                seed=seed, **METHODS[method].train)
    run_seed = read_run_config(run_dir).get("seed")
    policy = load_policy(run_dir, captioner, allow_unfinished=settings.allow_unfinished)
    return policy, run_dir, run_seed


def relative_performance(row: dict, full: dict) -> float | None:
    """The paper's Rel.: 100 x the mean of C_av, C_v, C_a and transfer CIDEr, each divided by
    its full-token value (``full``). Without a transfer column, the mean of the other three;
    a column without references (None) is left out. None ("n/a" in the table) when a
    full-token value is 0: the ratio is undefined (:func:`rel_note` says which)."""
    keys = [k for k in ("C_av", "C_v", "C_a", "C_T")
            if row.get(k) is not None and full.get(k) is not None]
    if not keys or any(full[k] == 0 for k in keys):
        return None
    return 100.0 * sum(row[k] / full[k] for k in keys) / len(keys)


def rel_note(full: dict) -> str | None:
    """Why Rel. is n/a, when it is: the full-token metrics that are 0."""
    zero = [k for k in ("C_av", "C_v", "C_a", "C_T") if full.get(k) == 0]
    if not zero:
        return None
    return (f"Rel. is n/a: full tokens score 0 on {', '.join(zero)}, so a ratio to it is "
            "undefined (the captioner captions nothing the references share, even with every "
            "token; check the captioner and its tokenizer)")


def aggregate(rows: list[dict]) -> list[dict]:
    """Rows of several seeds -> one row per (method, retention) with mean, std and seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["method"], r["retention"]), []).append(r)
    out = []
    for (method, retention), group in groups.items():
        agg = {"method": method, "label": group[0]["label"], "retention": retention,
               "seeds": [g["seed"] for g in group]}
        for key in ("C_av", "C_v", "C_a", "C_T", "C_av_full", "Rel", "BLEU-4", "METEOR"):
            values = [g[key] for g in group if g.get(key) is not None]
            if values:
                agg[key] = float(np.mean(values))
                agg[key + "_std"] = float(np.std(values))
                agg[key + "_values"] = values
        out.append(agg)
    return out


def sweep_table(agg: list[dict], has_transfer: bool) -> str:
    header = ["method", "retention", "C_av", "C_v", "C_a"] + \
        (["transfer C"] if has_transfer else []) + ["C_av / full", "Rel.", "seeds"]
    rows, last = [], None
    for r in agg:
        if last is not None and r["retention"] != last:
            rows.append([])   # a blank line between retentions
        last = r["retention"]
        cells = [r["label"], f"{r['retention']:.0%}"]
        for key in ("C_av", "C_v", "C_a") + (("C_T",) if has_transfer else ()):
            cells.append(fmt(r.get(key + "_values", [])))
        cells.append(fmt(r.get("C_av_full_values", []), digits=3))
        cells.append(fmt(r.get("Rel_values", [])))
        seeds = sorted({s for s in r["seeds"] if s is not None})
        cells.append(",".join(map(str, seeds)) if seeds else "–")
        rows.append(cells)
    return markdown_table(header, rows)


def sweep_figure(agg: list[dict], path: Path, bar_retention: float,
                 intervals: dict | None = None) -> Path:
    """Left: Rel. against retention; middle (with ``intervals``, from :func:`differences`):
    AVEX-Prune − each method in C_av with its 95% interval; right: C_av, C_v, C_a at
    ``bar_retention``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if intervals else 2, figsize=(18 if intervals else 12, 4.2))
    left, right = axes[0], axes[-1]
    methods = [m for m in dict.fromkeys(r["method"] for r in agg) if m != "full"]
    palette = plt.get_cmap("tab10").colors
    colour = {"full": "gray", **{m: palette[i % 10] for i, m in enumerate(SELECTORS)}}
    labels = {r["method"]: r["label"] for r in agg}
    if intervals:
        difference_panel(axes[1], intervals, labels, colour)
    for m in methods:
        pts = sorted((r["retention"], r.get("Rel", float("nan")), r.get("Rel_std", 0.0))
                     for r in agg if r["method"] == m)
        xs = [100 * p[0] for p in pts]
        left.errorbar(xs, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                      capsize=3, label=labels[m], color=colour[m])
    left.axhline(100, color="gray", linestyle="--", linewidth=1, label="Full tokens")
    left.set_xlabel("retention ratio (%)")
    left.set_ylabel("Rel. (% of full tokens)")
    left.set_title("Relative performance")
    left.invert_xaxis()
    left.legend(fontsize=8)
    at = [r for r in agg if abs(r["retention"] - bar_retention) < 1e-9 or r["method"] == "full"]
    keys = ("C_av", "C_v", "C_a")
    width = 0.8 / max(1, len(at))
    for i, r in enumerate(at):
        xs = np.arange(len(keys)) + (i - (len(at) - 1) / 2) * width
        right.bar(xs, [r.get(k, float("nan")) for k in keys], width,
                  yerr=[r.get(k + "_std", 0.0) for k in keys],
                  label=r["label"], capsize=2, color=colour[r["method"]])
    right.set_xticks(np.arange(len(keys)), ["$C_{av}$", "$C_v$", "$C_a$"])
    right.set_ylabel("CIDEr")
    right.set_title(f"Test split at {bar_retention:.0%} retention")
    right.legend(fontsize=7)
    return save_figure(fig, path)


def difference_panel(axis, intervals: dict, labels: dict, colour: dict) -> None:
    """AVEX-Prune − each method against retention, with the 95% interval as error bars; a
    symmetric log scale keeps gaps of a few points readable beside gaps of hundreds."""
    from matplotlib.ticker import ScalarFormatter

    others = list(dict.fromkeys(other for other, _ in intervals))
    for i, other in enumerate(others):
        points = sorted((r, v) for (o, r), v in intervals.items()
                        if o == other and isinstance(v, Interval))
        if not points:
            continue
        offset = (i - (len(others) - 1) / 2) * 0.6   # side by side within a retention
        xs = [100 * r + offset for r, _ in points]
        ys = [v.difference for _, v in points]
        err = [[v.difference - v.low for _, v in points], [v.high - v.difference
                                                          for _, v in points]]
        axis.errorbar(xs, ys, yerr=err, marker="o", linestyle="none", capsize=3,
                      label=labels.get(other, other), color=colour.get(other, "black"))
    axis.axhline(0, color="black", linewidth=1)
    axis.set_yscale("symlog", linthresh=10)
    axis.yaxis.set_major_formatter(ScalarFormatter())   # 10 and -100, not powers of ten
    axis.set_xlabel("retention ratio (%)")
    axis.set_ylabel("AVEX-Prune − method, C_av")
    axis.set_title("Paired differences, 95% bootstrap intervals")
    axis.invert_xaxis()
    axis.legend(fontsize=7)


def run_sweep(settings: SweepSettings) -> dict:
    """Caption every split under every (method, seed, retention) of ``settings``, score,
    aggregate and write ``sweep.md``, ``sweep.json`` and ``sweep.png`` under ``settings.out``
    (default ``runs/eval-<time>``). Every setting is checked first."""
    started = time.perf_counter()
    settings, out = begin(settings, SweepSettings, "eval")
    cache, captioner = load_experiment_inputs(settings)
    if "fastv" in settings.methods:  # fastv_layer against the LLM's depth, before captioning
        make_selector("fastv", captioner=captioner, layer=settings.fastv_layer)
    test = split_clips(cache, settings.split, settings.max_clips, shown=settings.qualitative)
    transfer = [] if settings.transfer_split == "none" else \
        split_clips(cache, settings.transfer_split, settings.max_clips)
    for method in trained_methods(settings.methods):
        if any(given_run_dir(settings, method, seed) is None for seed in settings.seeds):
            check_training_references(variant_config(settings.base_train_config(), out,
                                                     **METHODS[method].train),
                                      cache, f"--methods {method}")
    out.mkdir(parents=True, exist_ok=True)
    splits = {"test": test, **({"transfer": transfer} if transfer else {})}
    policies = train_policies(settings, captioner, out)  # training has its own progress bars
    checkpoints = scored_checkpoints(policies, out)
    jobs = [(m, s, r) for s in settings.seeds for m in settings.methods
            for r in settings.retentions]
    captions, scores = caption_jobs(settings, captioner, splits, policies, jobs)
    labels = method_labels(settings.methods, policies,
                           given=[m for m in trained_methods(settings.methods)
                                  if getattr(settings, f"{m}_run") is not None])
    rows = score_rows(scores, policies, jobs, labels, out, has_transfer=bool(transfer))
    order = {m: i for i, m in enumerate(["full"] + list(settings.methods))}
    agg = sorted(aggregate(rows), key=lambda r: (-r["retention"], order[r["method"]]))
    intervals = avex_differences(rows, settings)
    bar_retention = min(settings.retentions, key=lambda r: abs(r - 0.4))
    qualitative = qualitative_examples(test[:settings.qualitative], captions, settings.methods,
                                       settings.seeds[0], bar_retention)
    seconds = time.perf_counter() - started
    cache_dir = settings.cache_dir
    result = {"rows": rows, "aggregate": agg, "qualitative": qualitative,
              "intervals": interval_records(intervals),
              "settings": {"methods": list(settings.methods),
                           "retentions": list(settings.retentions),
                           "seeds": list(settings.seeds), "split": settings.split,
                           "test_clips": len(test),
                           "transfer_clips": len(transfer), "num_beams": settings.num_beams,
                           "max_new_tokens": settings.max_new_tokens,
                           "decoding_source": settings.decoding_source,
                           "checkpoints": checkpoints,
                           "data": cache_relative(cache.root, cache_dir),
                           "captioner": cache_relative(captioner.path, cache_dir),
                           "judge": judge_record(cache.root, captioner.path,
                                                 cache_dir=cache_dir),
                           "runs": {m: {str(s): relative_path(v[1], out) for s, v in p.items()}
                                    for m, p in policies.items()},
                           "paths": PATHS_NOTE,
                           "bootstrap": {"level": LEVEL, "replicates": REPLICATES,
                                         "seed": SEED, "metric": "C_av",
                                         "resampled": "clips and training seeds, paired"}},
              "seconds": round(seconds, 1), "command": "python -m avex.evaluate " +
              portable_command(sys.argv[1:], cache_dir)
              if sys.argv and Path(sys.argv[0]).parent.name == "evaluate" else None}
    table = sweep_table(agg, bool(transfer))
    header = (f"# Pruning comparison ({settings.split} split, {len(test)} clips"
              + (f"; transfer split, {len(transfer)} clips" if transfer else "") + ")")
    notes = [decoding_note(settings)] + [n for n in [rel_note(rows[0])] if n] + [
        f"{labels[m]}: {text}." for m, text in checkpoints.items()] + \
        transfer_notes(policies, labels, cache.root, captioner.path, out) + \
        privileged_notes(settings.methods)
    differences_md = differences_markdown(intervals, labels, settings.retentions)
    (out / "sweep.md").write_text(sweep_markdown(header, table, qualitative, labels,
                                                 bar_retention, seconds,
                                                 result["settings"]["judge"], notes,
                                                 differences_md))
    (out / "sweep.json").write_text(results_json(result))
    sweep_figure(agg, out / "sweep.png", bar_retention, intervals)
    result["table"], result["out"] = table, str(out)
    print(table)
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.json'}, {out / 'sweep.png'} "
          f"({seconds:.0f} s)")
    return result


def train_policies(settings: SweepSettings, captioner, out: Path) -> dict:
    """method -> seed -> (policy, run_dir, seed_of_run) for the trained methods of the sweep:
    one given run for every seed, or one training run per seed."""
    policies: dict = {}
    # AVEX-Prune first: the other trained methods of a seed start from its warmup policy, so
    # that they differ from it only in the training signal (and the warmup runs once)
    methods = sorted(trained_methods(settings.methods), key=lambda m: m != "avex")
    for method in methods:
        if shared_across_seeds(method, settings):
            one = policy_for(settings, method, settings.seeds[0], captioner, out)
            policies[method] = {seed: one for seed in settings.seeds}
            continue
        policies[method] = {}
        for seed in settings.seeds:
            shared = policies.get("avex", {}).get(seed) if method != "avex" else None
            warmup_from = None if shared is None or settings.avex_run is not None else shared[1]
            if given_run_dir(settings, method, seed) is not None:
                warmup_from = None
            policies[method][seed] = policy_for(settings, method, seed, captioner, out,
                                                warmup_from)
    return policies


def caption_jobs(settings: SweepSettings, captioner, splits: dict, policies: dict, jobs: list):
    """Captions and scores keyed by (split, method, seed, retention); full tokens once per
    split, and a method that does not depend on the seed once for all seeds."""
    def key(method, seed):
        return method, None if shared_across_seeds(method, settings) else seed
    seed_of = {}   # the seed a key's selector is built with
    for method, seed, _ in jobs:
        seed_of.setdefault(key(method, seed), seed)

    def selector_for(key):
        method, seed = key[0], seed_of[key]
        if method in policies:
            return make_selector(method, policy=policies[method][seed][0])
        options = {"layer": settings.fastv_layer} if method == "fastv" else {}
        return make_selector(method, captioner=captioner, seed=seed, **options)

    scored = caption_and_score(captioner, splits, [(key(m, s), r) for m, s, r in jobs],
                               selector_for, batch_size=settings.batch_size,
                               num_beams=settings.num_beams,
                               max_new_tokens=settings.max_new_tokens,
                               progress=settings.progress, desc="sweep")
    captions: dict = {}
    scores: dict = {}
    for split in splits:
        for method, seed, retention in [("full", None, 1.0)] + list(jobs):
            caps, score = scored[(split, "full" if method == "full" else key(method, seed),
                                  retention)]
            captions[(split, method, seed, retention)] = caps
            # the transfer split gives one column: CIDEr against its AV references
            scores[(split, method, seed, retention)] = score if split == "test" else \
                {"C_T": score["C_av"], "per_clip": {"C_T": score["per_clip"]["C_av"]}}
    return captions, scores


def method_labels(methods, policies: dict, given=()) -> dict:
    """Method name -> its printed label. AVEX-Prune's names the recipe its runs trained (read
    from their config.json), e.g. "AVEX-Prune (RLOO over 8 anchors, no exchange term)", and so
    does CaCoVID-AV's when its runs were given (``given``: those methods), since a given run
    may have trained with another reward or warmup than the sweep's own."""
    labels = {name: label(name) for name in ["full", *methods]}
    for name in ("avex", "cacovid"):
        if name in policies and (name == "avex" or name in given):
            recipes = dict.fromkeys(recipe(read_run_config(run_dir))
                                    for _, run_dir, _ in policies[name].values())
            labels[name] = f"{label(name)} ({'; '.join(recipes)})"
    return labels


def score_rows(scores: dict, policies: dict, jobs: list, labels: dict, out: Path, *,
               has_transfer: bool) -> list[dict]:
    """One row per (method, seed, retention) with Rel. against the full-token row, each clip's
    scores (``per_clip``, rounded) and a trained method's run relative to ``out``."""
    def scored(split, method, seed, retention):
        score = dict(scores[(split, method, seed, retention)])
        return score, score.pop("per_clip")

    full, per_clip = scored("test", "full", None, 1.0)
    if has_transfer:
        transfer, transfer_clips = scored("transfer", "full", None, 1.0)
        full.update(transfer)
        per_clip.update(transfer_clips)
    rows = [{"method": "full", "label": labels["full"], "retention": 1.0, "seed": None,
             **full, "C_av_full": 1.0, "Rel": None if rel_note(full) else 100.0,
             "per_clip": compact_per_clip(per_clip)}]
    for method, seed, retention in jobs:
        score, per_clip = scored("test", method, seed, retention)
        row = {"method": method, "label": labels[method], "retention": retention,
               "seed": seed, **score}
        if has_transfer:
            transfer, transfer_clips = scored("transfer", method, seed, retention)
            row.update(transfer)
            per_clip.update(transfer_clips)
        if method in policies:
            _, run_dir, run_seed = policies[method][seed]
            row["run"], row["seed"] = relative_path(run_dir, out), run_seed
        row["C_av_full"] = row["C_av"] / full["C_av"] if full["C_av"] else float("nan")
        row["Rel"] = relative_performance(row, full)
        row["per_clip"] = compact_per_clip(per_clip)
        rows.append(row)
    return rows


def avex_differences(rows: list[dict], settings: SweepSettings) -> dict:
    """(method, retention) -> AVEX-Prune − method in C_av with its paired 95% interval (or
    why there is none); {} when the sweep has no AVEX-Prune row."""
    if "avex" not in settings.methods:
        return {}
    others = ["full"] + [m for m in settings.methods if m != "avex"]
    return differences(rows, "avex", others, settings.retentions, "C_av")


def interval_records(intervals: dict) -> list[dict]:
    """The intervals as sweep.json lists them: one record per (method, retention)."""
    return [{"ours": "avex", "method": other, "retention": retention, "metric": "C_av",
             **interval_fields(value)}
            for (other, retention), value in intervals.items()]


def differences_markdown(intervals: dict, labels: dict, retentions) -> list[str]:
    """The section under the main table: AVEX-Prune − each method, 95% interval."""
    if not intervals:
        return []
    others = {m: labels[m] for m in dict.fromkeys(o for o, _ in intervals)}
    return [f"## {label('avex')} − method, 95% CI (C_av)", "",
            f"The difference of the mean C_av (AVEX-Prune's minus the method's; mean over "
            f"training seeds) and its paired bootstrap {LEVEL:.0%} interval: {REPLICATES} "
            "replicates, each resampling the clips and the training seeds with replacement, "
            "the same draw for both methods; a method without a seed is used as is for every "
            "seed. The per-clip scores are resampled, not re-scored, so CIDEr's document "
            "frequencies stay those of the whole scored split. An interval above 0: AVEX-Prune "
            "is ahead at that retention; below 0: behind; across 0: level "
            "(docs/evaluation.md, \"Paired intervals\").", "",
            difference_table(intervals, label("avex"), others, retentions), ""]


def qualitative_examples(clips, captions: dict, methods, seed: int, retention: float):
    examples = []
    for i, clip in enumerate(clips):
        entry = {"clip_id": clip.clip_id, "reference": clip.refs_av[0],
                 "full": captions[("test", "full", None, 1.0)][i]}
        for method in methods:
            entry[method] = captions[("test", method, seed, retention)][i]
        examples.append(entry)
    return examples


def decoding_note(settings: SweepSettings) -> str:
    """The decoding every caption of the sweep used, and where the setting came from."""
    keys_by_source: dict[str, list[str]] = {}
    for key, source in (settings.decoding_source or {}).items():
        keys_by_source.setdefault(source, []).append(key)
    where = "; ".join(f"{' and '.join(keys)} from {source}"
                      for source, keys in keys_by_source.items())
    return (f"Decoding: {settings.num_beams} beam(s), at most {settings.max_new_tokens} new "
            "tokens"
            + (f" ({where})" if where else "") + ".")


def transfer_notes(policies: dict, labels: dict, data_root, captioner_path,
                   out_dir: Path) -> list[str]:
    """One note per run trained on another benchmark or with another captioner than the sweep
    scores with (:func:`avex.evaluate.common.trained_elsewhere`), said as such."""
    notes = []
    for method, by_seed in policies.items():
        for run_dir in dict.fromkeys(run_dir for _, run_dir, _ in by_seed.values()):
            elsewhere = trained_elsewhere(read_run_config(run_dir), data_root, captioner_path)
            if elsewhere:
                notes.append(f"{labels[method]}: {relative_path(run_dir, out_dir)} was "
                             f"{elsewhere}.")
    return notes


def scored_checkpoints(policies: dict, out_dir: Path) -> dict:
    """method -> which checkpoint was scored, for runs that did not finish training (each run
    named relative to ``out_dir``)."""
    out = {}
    for method, by_seed in policies.items():
        for _, run_dir, _ in by_seed.values():
            progress = run_progress(run_dir)
            if not progress["finished"]:
                out[method] = (f"{relative_path(run_dir, out_dir)} did not finish training; "
                               f"scored its latest "
                               f"checkpoint, {progress['checkpoint']} ({progress['phase']} "
                               f"step {progress['step']}), under --allow-unfinished")
    return out


def sweep_markdown(header: str, table: str, qualitative: list, labels: dict,
                   bar_retention: float, seconds: float, judge: dict, notes=(),
                   differences_md=()) -> str:
    md = [header, "",
          f"CIDEr points ({cider_source()}, x100). C_av / C_v / C_a: the same captions against the "
          "AV, visual-only and audio-only references. transfer C: CIDEr against the AV "
          "references of the transfer split (the paper's MSRVTT column). C_av / full: C_av over "
          "its full-token value, the comparable measure on this benchmark (docs/results.md, "
          "\"Rel. and C_av / full\"). Rel. = 100 x mean of "
          "the four, each over its full-token value in this run. Seeds: Random's seed; for a "
          "policy, the seed of its training run; FastV/ToMe/FastAV are deterministic. With "
          "several seeds: mean ± std.", "", judge_line(judge), "",
          *[x for note in notes for x in (note, "")], table, "", *differences_md,
          "Figure: `sweep.png` (left: Rel. against retention; "
          + ("middle: AVEX-Prune − each method with its 95% interval; " if differences_md
             else "")
          + f"right: C_av, C_v, C_a at {bar_retention:.0%}). The sweep took {seconds:.0f} s.",
          "", f"## Qualitative examples at {bar_retention:.0%} retention", ""]
    methods = [m for m in labels if m != "full"]
    for q in qualitative:
        md += [f"**{q['clip_id']}** (a reference: \"{q['reference']}\")", "",
               markdown_table(["method", "caption"], [[labels["full"], q["full"]]] +
                              [[labels[m], q[m]] for m in methods]), ""]
    return "\n".join(md) + "\n"
