"""Where the lost CIDEr goes (issue #33): a trained policy's C_av loss against full tokens,
taken apart on the embedded benchmark.

At each retention, over the clips of one split:

* **exact reproduction**: the share of clips whose pruned caption is the full-token caption
  y_full word for word (such a clip loses nothing);
* **loss by clip**: the C_av loss (full − pruned, each clip's CIDEr) by what the generator
  drew for the clip (audio kind, number of sound events, whether the subject makes one, music);
* **loss by kind of difference**: a pruned caption that differs from y_full either changes a
  content slot (object, colour, action, event, music, place: :mod:`avex.evaluate.slots`) or
  says the same content in other words (a paraphrase); each kind's share of the clips and of the
  loss;
* **role-oracle sets** (diagnosis only: they read the generator's token annotations, which no
  method may): "every role" keeps every subject, event and music token, "one per role" keeps
  one coloured subject token and each event's onset, then music; either is cut or filled to
  exactly K by the policy's scores;
* **reference-free best-of-N**: N samples of the policy at the same K (its training
  temperature; Gumbel-Top-K, or the set-aware law for a policy trained with it); per clip,
  the sample under which the frozen captioner gives y_full the highest mean teacher-forced
  log-likelihood, beside the mean sample and the best sample by CIDEr (an oracle: it reads
  the references);
* **ties in training**: the share of RL groups whose anchors all tied, per retention, from the
  run's ``metrics.jsonl`` (``reward_diagnostics``, logged by ``python -m avex.train``).

Every row's per-clip C_av is pycocoevalcap's CIDEr against the AV references (document
frequencies from the scored clips), as in the sweep, so a row's mean is its corpus C_av and the
rows of one retention can be compared clip by clip (paired intervals against the policy).
"""
from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from avex import _checks
from avex.data.cache import FeatureCache
from avex.data.embedded import AUDIO_ROLES, VISUAL_ROLES, Backbone
from avex.fidelity import full_captions
from avex.figures import save_figure
from avex.intervals import paired_interval
from avex.judge_identity import file_sha256, judge_record
from avex.kernels import gumbel_topk
from avex.methods import load_policy
from avex.methods.learned import recipe
from avex.metrics import PER_CLIP, caption_metrics_by_reference_type
from avex.paths import portable_command, relative_path
from avex.progress import progress_bar
from avex.run_files import METRICS_FILE, read_run_config, run_policy_weights
from avex.selection import AVLayout, indices_to_keep
from avex.training.exchange_diagnostics import summarize

from .common import (PATHS_NOTE, ExperimentSettings, begin, check_retentions, check_split,
                     given_run, load_experiment_inputs, results_json, split_clips)
from .diagnose_report import compact_result, report_markdown
from .slots import SLOT_NAMES, changed_slots, parse_caption, slots_of_info

__all__ = ["DiagnoseSettings", "run_diagnose", "coloured_subject_token", "role_tiers",
           "tiered_keep", "sample_keep_sets", "best_of", "exact_share", "difference_kinds",
           "loss_by_attribute", "tie_shares", "ORACLES"]

RETENTIONS = (0.4, 0.1)
#: the role-oracle rules (:func:`role_tiers`), in table order
ORACLES = ("every-role", "one-per-role")



@dataclass
class DiagnoseSettings(ExperimentSettings):
    """The diagnosis of the policy of ``run`` (a ``python -m avex.train`` run directory, its
    latest checkpoint) at each of ``retentions`` on ``split``: ``samples`` (N) policy samples
    per clip (by its own selection rule) at temperature ``tau`` (None: the run's own), drawn
    from ``seed``; ``ties_run``: the run whose ``metrics.jsonl`` gives the ties in training
    (default: ``run``); the report is ``<out>/<name>.md``, ``.json`` and ``-ties.png``."""

    run: str | None = None
    retentions: list = field(default_factory=lambda: list(RETENTIONS))
    split: str = "test"
    samples: int = 8
    tau: float | None = None
    seed: int = 0
    ties_run: str | None = None
    name: str = "diagnose"
    allow_unfinished: bool = False

    def check(self) -> None:
        super().check()
        if self.run is None:
            raise ValueError("run is required: the python -m avex.train run directory whose "
                             "policy is diagnosed (--run DIR)")
        _checks.text("run", self.run)
        _checks.text("ties_run", self.ties_run, optional=True)
        check_retentions(self.retentions)
        check_split("split", self.split)
        _checks.int_at_least("samples", self.samples, 2)
        if self.tau is not None:
            _checks.real("tau", self.tau, low=0, low_open=True)
        _checks.int_at_least("seed", self.seed, 0)
        _checks.flag("allow_unfinished", self.allow_unfinished)
        if not isinstance(self.name, str) or not self.name or "/" in self.name \
                or self.name.startswith("."):
            raise ValueError(f"name must be a file name stem (no '/', not starting with '.'), "
                             f"got {self.name!r}")
        for flag, path in (("run", self.run), ("ties_run", self.ties_run)):
            if path is not None and not Path(path).is_dir():
                raise FileNotFoundError(f"{flag}: no run directory at {path!r}")
        ties = self.ties_run if self.ties_run is not None else self.run
        if not (Path(ties) / METRICS_FILE).is_file():
            flag = "ties_run" if self.ties_run is not None else "run"
            raise FileNotFoundError(f"{flag}: no {METRICS_FILE} in {ties!r}")
        if self.data != "embedded":
            check_annotated(FeatureCache(self.data), "data")

    def given_runs(self) -> dict:
        return {"--run": given_run(self.run, "latest", "run",
                                   finished=not self.allow_unfinished,
                                   captioner=self.captioner_model())}

    def training_unused(self) -> str:
        return "diagnose trains no policy (it reads the one of --run)"


# -- the generator's annotations -------------------------------------------------------------

def check_annotated(cache, name: str = "data") -> None:
    """Refuse a cache that is not an embedded benchmark with token roles: the role oracles and
    the clip attributes read the generator's annotations."""
    source = cache.meta.source
    if source.get("kind") != "embedded" or "roles" not in source:
        raise ValueError(f"{name}: {cache.root} is not an embedded benchmark with token roles "
                         f"(its meta.json source kind is {source.get('kind')!r}); the "
                         "diagnosis reads the generator's annotations")
    roles = source["roles"]
    if roles.get("visual") != VISUAL_ROLES or roles.get("audio") != AUDIO_ROLES:
        raise ValueError(f"{name}: {cache.root} codes its token roles as {roles!r}, not as this "
                         f"generator does ({VISUAL_ROLES}, {AUDIO_ROLES})")


def colour_vectors(cache) -> dict:
    """Colour name -> the concept vector the generator mixed into coloured subject tokens (the
    benchmark's fixed random "backbone", rebuilt from the seed and shape in meta.json)."""
    cfg = cache.meta.source["config"]
    backbone = Backbone(cfg["seed"], cfg["dim"], cfg["grid"], cfg["n_frames"],
                        cfg["n_frames"] * cfg["audio_per_frame"])
    return {name: torch.from_numpy(v).float() for name, v in backbone.color.items()}


def coloured_subject_token(visual: torch.Tensor, visual_role: torch.Tensor,
                           colour: torch.Tensor) -> int | None:
    """The visual token (its index) of the subject that carries its colour most strongly: the
    subject token whose features project highest on the colour's concept vector. About 3 in 4
    subject tokens carry the colour; the rest of a subject token's mixture is the same across
    the clip, so this is a coloured one whenever the clip has one. None: no subject token."""
    _checks.tensor("visual", visual, ndim=2, floating=True)
    subject = torch.nonzero(visual_role == VISUAL_ROLES["subject"]).flatten()
    if subject.numel() == 0:
        return None
    projection = visual[subject].float() @ colour.float()
    return int(subject[int(projection.argmax())])


def role_tiers(clip, rule: str, colour: torch.Tensor | None = None) -> list[list[int]]:
    """The annotated tokens a role oracle keeps first, in priority tiers of AV-axis indices
    (video then audio: audio token a is ``n_visual + a``). ``"every-role"``: one tier, every
    subject, event and music token. ``"one-per-role"``: the coloured subject token
    (:func:`coloured_subject_token`, ``colour`` the clip colour's vector) and each event's onset
    (its first token), then the music tokens."""
    _checks.choice("rule", rule, ORACLES)
    visual_role, audio_role = clip.annotations["visual_role"], clip.annotations["audio_role"]
    offset = clip.n_visual

    def audio(role):
        return [offset + int(i) for i in torch.nonzero(audio_role == AUDIO_ROLES[role]).flatten()]
    if rule == "every-role":
        subject = [int(i) for i in torch.nonzero(visual_role == VISUAL_ROLES["subject"])
                   .flatten()]
        return [subject + audio("event") + audio("music")]
    if colour is None:
        raise ValueError("rule 'one-per-role' needs colour (the clip colour's concept vector)")
    token = coloured_subject_token(clip.visual, visual_role, colour)
    onsets = [offset + int(e["start"]) for e in clip.info.get("events", [])]
    return [([] if token is None else [token]) + onsets, audio("music")]


def tiered_keep(scores: torch.Tensor, valid: torch.Tensor, tiers, k: int) -> torch.Tensor:
    """bool [M]: exactly ``k`` valid tokens, taken tier by tier (``tiers``: lists of indices),
    each tier in order of ``scores`` (highest first, ties to the lower index), then the
    remaining valid tokens by score, until ``k`` are kept. A tier larger than what is left is
    cut by score."""
    _checks.tensor("scores", scores, ndim=1, floating=True)
    _checks.tensor("valid", valid, ndim=1, boolean=True)
    count = int(valid.sum())
    _checks.int_at_least("k", k, 0)
    if k > count:
        raise ValueError(f"k = {k} exceeds the row's {count} valid tokens")
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    keep = torch.zeros(len(scores), dtype=torch.bool)
    kept = 0
    for tier in [*tiers, order]:
        members = set(int(i) for i in tier)
        for i in order:
            if kept == k:
                return keep
            if i in members and bool(valid[i]) and not keep[i]:
                keep[i] = True
                kept += 1
    return keep


def sample_keep_sets(scores: torch.Tensor, k: int, samples: int, tau: float, seed: int, *,
                     policy=None, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """bool [samples, M]: ``samples`` draws of ``k`` tokens from one row of policy scores [M]
    at temperature ``tau`` (the training anchors' distribution), noise from ``seed``: Gumbel-
    Top-K, or the step-wise set-aware law of a ``policy`` trained with it (``hidden`` [M, D]:
    the row's hidden states)."""
    _checks.tensor("scores", scores, ndim=1, floating=True)
    rows = scores[None].expand(samples, -1).contiguous()
    budget = torch.full((samples,), int(k), dtype=torch.long, device=scores.device)
    if policy is not None and policy.set_aware:
        vectors = hidden[None].expand(samples, -1, -1).contiguous()
        indices, _ = policy.select(rows, vectors, budget, tau=tau, seed=seed, sample=True)
    else:
        indices, _ = gumbel_topk(rows, budget, tau=tau, seed=seed)
    return indices_to_keep(indices, scores.shape[0])


def sample_seed(seed: int, clip_id: str, retention: float) -> int:
    """The noise seed of one clip's samples: a function of (seed, clip, retention) alone, so
    a clip draws the same sets whatever the batch or the number of clips scored."""
    return zlib.crc32(f"{seed}:{clip_id}:{retention!r}".encode())


def best_of(values: np.ndarray) -> np.ndarray:
    """Per row of ``values`` [clips, N], the index of the largest (ties to the first)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"values must be [clips, N] with N >= 1, got shape {values.shape}")
    return values.argmax(axis=1)


# -- reading the captions ----------------------------------------------------------------------

def exact_share(pruned: list[str], full: list[str]) -> float:
    """The share of clips whose pruned caption equals the full-token caption."""
    if len(pruned) != len(full) or not full:
        raise ValueError(f"pruned has {len(pruned)} captions and full {len(full)}; need the "
                         "same clips, at least one")
    return sum(p == f for p, f in zip(pruned, full)) / len(full)


def _loss_record(mask: np.ndarray, loss: np.ndarray) -> dict:
    """Clips in ``mask``: their count and share, their mean loss, and the points of the mean
    loss over all clips they carry (``carried``; the parts of a partition sum to the total)."""
    n = int(mask.sum())
    total = float(loss.mean())
    carried = float(loss[mask].sum() / len(loss))
    return {"clips": n, "share": n / len(loss),
            "mean_loss": float(loss[mask].mean()) if n else None, "carried": carried,
            "carried_share": carried / total if total else None}


def difference_kinds(pruned: list[str], full: list[str]) -> list[dict]:
    """Per clip: ``kind`` ("exact", "paraphrase" or "content") and ``slots``, the slots
    (:data:`avex.evaluate.slots.SLOT_NAMES`) the pruned caption changed."""
    out = []
    for p, f in zip(pruned, full):
        if p == f:
            out.append({"kind": "exact", "slots": []})
            continue
        changed = changed_slots(parse_caption(p), parse_caption(f))
        out.append({"kind": "content" if changed else "paraphrase", "slots": changed})
    return out


def loss_by_difference(kinds: list[dict], loss: np.ndarray) -> dict:
    """The loss carried by each kind of difference, and by each changed slot (a caption can
    change several: the slot rows overlap)."""
    kind = np.array([k["kind"] for k in kinds])
    out = {name: _loss_record(kind == name, loss) for name in ("exact", "paraphrase", "content")}
    out["slots"] = {slot: _loss_record(np.array([slot in k["slots"] for k in kinds]), loss)
                    for slot in SLOT_NAMES}
    return out


def clip_attributes(info: dict) -> dict:
    """What the generator drew for a clip, as the diagnosis groups clips."""
    events = info.get("events", [])
    return {"audio": info["audio"], "events": str(len(events)),
            "own event": "yes" if any(e["own"] for e in events) else "no",
            "music": "yes" if info["audio"] == "music" else "no"}


def loss_by_attribute(infos: list[dict], full: np.ndarray, pruned: np.ndarray) -> dict:
    """attribute -> value -> the clips' full and pruned mean C_av and the loss they carry."""
    loss = full - pruned
    attributes = [clip_attributes(info) for info in infos]
    out: dict = {}
    for name in attributes[0]:
        values = np.array([a[name] for a in attributes])
        out[name] = {}
        for value in sorted(set(values)):
            mask = values == value
            out[name][value] = {"full": float(full[mask].mean()),
                                "pruned": float(pruned[mask].mean()),
                                **_loss_record(mask, loss)}
    return out


def tie_shares(metrics_path) -> dict:
    """Retention ("0.4", ...) -> {"tied": the mean share of RL groups whose anchors all tied,
    "micro_batches"}, from a run's ``metrics.jsonl`` (``reward_diagnostics``); {} where the run
    did not log them (trained before they were logged)."""
    anchors = summarize(metrics_path).get("anchors", {})
    return {key: {"tied": slot["tied"], "micro_batches": slot["micro_batches"]}
            for key, slot in anchors.items()}


def tie_series(metrics_path) -> dict:
    """Retention -> (steps, tied share) per RL micro-batch, for the figure."""
    series: dict = {}
    for line in Path(metrics_path).read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("phase") != "rl":
            continue
        for micro in record.get("reward_diagnostics") or []:
            if micro.get("tied") is not None:
                steps, values = series.setdefault(f"{micro['retention']:g}", ([], []))
                steps.append(record["step"])
                values.append(micro["tied"])
    return series


def ties_figure(series: dict, shares: dict, path: Path) -> Path:
    """Left: the tied share per micro-batch against the step (a running mean of 10 per
    retention); right: its mean per retention."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    keys = sorted(series, key=float, reverse=True)
    for key in keys:
        steps, values = series[key]
        window = min(10, len(values))
        smooth = np.convolve(values, np.ones(window) / window, mode="valid")
        left.plot(steps[window - 1:], 100 * smooth, label=f"{float(key):.0%}")
    left.set_xlabel("RL step")
    left.set_ylabel("groups whose anchors all tie (%)")
    left.set_title("Ties in training (running mean of 10 micro-batches)", fontsize=9)
    left.set_ylim(0, 100)
    left.legend(fontsize=8, title="retention")
    bars = [k for k in sorted(shares, key=lambda k: -float(k) if k != "all" else 0)
            if k != "all"]
    right.bar([f"{float(k):.0%}" for k in bars], [100 * shares[k]["tied"] for k in bars])
    right.set_ylim(0, 100)
    right.set_xlabel("retention")
    right.set_ylabel("mean share of tied groups (%)")
    right.set_title("Mean over the run", fontsize=9)
    return save_figure(fig, path)


# -- captioning -----------------------------------------------------------------------------

def per_clip_cider(captions: list[str], clips) -> np.ndarray:
    """Each clip's C_av (pycocoevalcap CIDEr x 100 against its AV references, document
    frequencies from ``clips``), as the sweep scores them."""
    metrics = caption_metrics_by_reference_type(captions, {"AV": [c.refs_av for c in clips]},
                                                per_clip=True)
    return 100 * np.asarray(metrics["AV"][PER_CLIP], dtype=np.float64)


@torch.no_grad()
def caption_retention(settings, captioner, policy, clips, full, retention: float, tau: float,
                      colours: dict) -> dict:
    """Every set of every clip at ``retention``: the policy's own set, the role oracles and
    ``settings.samples`` policy samples, captioned in one generation per batch and scored by
    y_full's teacher-forced log-likelihood in one forward. Returns {"captions": name -> [clip]
    (``samples``: [clip][N]), "log_prob": name -> [clip] (``samples``: [clip, N]), "k": K}."""
    names = ["policy", *ORACLES]
    out = {"captions": {n: [] for n in [*names, "samples"]},
           "log_prob": {n: [] for n in [*names, "samples"]}}
    n = settings.samples
    starts = range(0, len(clips), settings.batch_size)
    for start in progress_bar(starts, desc=f"diagnose @ {retention:.0%}", unit="batch",
                              disable=not settings.progress, leave=False):
        chunk = clips[start:start + settings.batch_size]
        batch = captioner.embed(chunk)
        layout = AVLayout.of(batch.modality)
        hidden = None
        if policy.set_aware:  # its sets read the hidden states too
            scores, hidden = policy.score(batch.inputs_embeds, batch.modality,
                                          retention=retention, with_hidden=True)
            hidden = layout.gather_vectors(hidden).float()
        else:
            scores = policy.score(batch.inputs_embeds, batch.modality, retention=retention)
        scores = layout.gather(scores).float()
        budget = layout.budget(retention)
        valid = layout.modality >= 0
        top, _ = policy.select(scores, hidden, budget)   # the deployed set, by its own rule
        sets = [indices_to_keep(top, scores.shape[1])[:, None]]
        for rule in ORACLES:
            sets.append(torch.stack([
                tiered_keep(scores[b].cpu(), valid[b].cpu(),
                            role_tiers(clip, rule, colours[clip.info["color"]]),
                            int(budget[b])) for b, clip in enumerate(chunk)])[:, None]
                        .to(scores.device))
        sets.append(torch.stack([
            sample_keep_sets(scores[b], int(budget[b]), n, tau,
                             sample_seed(settings.seed, clip.clip_id, retention), policy=policy,
                             hidden=None if hidden is None else hidden[b])
            for b, clip in enumerate(chunk)]))
        keep = torch.cat(sets, dim=1)                                      # [B, 3 + N, M]
        captions = captioner.caption_keep_sets(
            batch.inputs_embeds, batch.modality, keep, num_beams=settings.num_beams,
            max_new_tokens=settings.max_new_tokens, position_ids=batch.native_position_ids)
        forced = captioner.teacher_forced(batch.inputs_embeds, batch.modality, keep,
                                          full.targets(chunk),
                                          position_ids=batch.native_position_ids)
        log_prob = forced.mean_log_prob.cpu().numpy()
        for i, name in enumerate(names):
            out["captions"][name] += [row[i] for row in captions]
            out["log_prob"][name] += log_prob[:, i].tolist()
        out["captions"]["samples"] += [row[len(names):] for row in captions]
        out["log_prob"]["samples"].append(log_prob[:, len(names):])
    out["log_prob"]["samples"] = np.concatenate(out["log_prob"]["samples"])
    out["k"] = int(budget.max())
    return out


def retention_rows(got: dict, clips, full_texts: list[str], full_scores: np.ndarray,
                   progress: bool) -> dict:
    """Score every set of one retention and build its rows: name -> {"C_av", "exact",
    "log_prob", "per_clip"} (and, against the policy, a paired interval)."""
    scores = {name: per_clip_cider(got["captions"][name], clips)
              for name in ("policy", *ORACLES)}
    n = got["log_prob"]["samples"].shape[1]
    sample_scores = np.stack([per_clip_cider([row[j] for row in got["captions"]["samples"]],
                                             clips)
                              for j in progress_bar(range(n), desc="scoring samples",
                                                    unit="set", disable=not progress,
                                                    leave=False)], axis=1)   # [clips, N]
    picks = {"best-fidelity": best_of(got["log_prob"]["samples"]),
             "best-cider": best_of(sample_scores)}
    rows = {}
    for name in ("policy", *ORACLES):
        rows[name] = _row(scores[name], got["captions"][name], full_texts,
                          np.asarray(got["log_prob"][name]))
    sample_exact = np.mean([exact_share([row[j] for row in got["captions"]["samples"]],
                                        full_texts) for j in range(n)])
    rows["sample-mean"] = {"C_av": float(sample_scores.mean()), "exact": float(sample_exact),
                           "log_prob": float(got["log_prob"]["samples"].mean()),
                           "per_clip": sample_scores.mean(axis=1)}
    for name, pick in picks.items():
        chosen = np.arange(len(clips))
        rows[name] = _row(sample_scores[chosen, pick],
                          [got["captions"]["samples"][c][j] for c, j in zip(chosen, pick)],
                          full_texts, got["log_prob"]["samples"][chosen, pick])
    rows["best-fidelity"]["agrees_with_best_cider"] = float(
        (sample_scores[np.arange(len(clips)), picks["best-fidelity"]]
         == sample_scores.max(axis=1)).mean())
    for name, row in rows.items():
        row["loss"] = float(full_scores.mean() - row["C_av"])
        if name != "policy":
            row["minus_policy"] = paired_interval(row["per_clip"],
                                                  rows["policy"]["per_clip"]).as_dict()
    return rows


def _row(per_clip: np.ndarray, captions: list[str], full_texts: list[str],
         log_prob: np.ndarray) -> dict:
    return {"C_av": float(per_clip.mean()), "exact": exact_share(captions, full_texts),
            "log_prob": float(log_prob.mean()), "per_clip": per_clip, "captions": captions}


# -- the report -------------------------------------------------------------------------------

def run_diagnose(settings: DiagnoseSettings) -> dict:
    """Diagnose the policy of ``settings.run`` at every retention of ``settings.retentions``
    and write ``<out>/<name>.md``, ``.json`` and ``-ties.png``. Every setting is checked
    first."""
    started = time.perf_counter()
    settings, out = begin(settings, DiagnoseSettings, "diagnose")
    cache, captioner = load_experiment_inputs(settings)
    check_annotated(cache, "data")
    clips = split_clips(cache, settings.split, settings.max_clips)
    run_dir = Path(settings.run)
    config = read_run_config(run_dir)
    tau = settings.tau if settings.tau is not None else float(config.get("tau", 1.0))
    policy = load_policy(run_dir, captioner, allow_unfinished=settings.allow_unfinished)
    weights, _ = run_policy_weights(run_dir, "latest", name="run")
    out.mkdir(parents=True, exist_ok=True)
    full = full_captions(captioner, cache, settings.split, num_beams=settings.num_beams,
                         max_new_tokens=settings.max_new_tokens, cache_dir=settings.cache_dir,
                         batch_size=settings.batch_size, progress=settings.progress)
    full_texts = [full.texts[c.clip_id] for c in clips]
    full_scores = per_clip_cider(full_texts, clips)
    colours = colour_vectors(cache)
    infos = [c.info for c in clips]
    truth = [slots_of_info(info) for info in infos]
    full_slots_correct = float(np.mean([parse_caption(t) == s
                                        for t, s in zip(full_texts, truth)]))
    retentions = {}
    for retention in settings.retentions:
        got = caption_retention(settings, captioner, policy, clips, full, retention, tau,
                                colours)
        rows = retention_rows(got, clips, full_texts, full_scores, settings.progress)
        policy_row = rows["policy"]
        kinds = difference_kinds(policy_row["captions"], full_texts)
        loss = full_scores - policy_row["per_clip"]
        retentions[f"{retention:g}"] = {
            "retention": retention, "k": got["k"], "rows": rows,
            "by_difference": loss_by_difference(kinds, loss),
            "by_clip": loss_by_attribute(infos, full_scores, policy_row["per_clip"]),
            "policy_slots_correct": float(np.mean([parse_caption(c) == s for c, s in
                                                   zip(policy_row["captions"], truth)]))}
    ties_dir = Path(settings.ties_run) if settings.ties_run is not None else run_dir
    # another run's ties describe this policy's training only if it trained the same weights
    ties_weights = weights if settings.ties_run is None else \
        run_policy_weights(ties_dir, "latest", name="ties_run")[0]
    ties = tie_shares(ties_dir / METRICS_FILE)
    series = tie_series(ties_dir / METRICS_FILE)
    figure = out / f"{settings.name}-ties.png"
    if series:
        ties_figure(series, ties, figure)
    seconds = time.perf_counter() - started
    cache_dir = settings.cache_dir
    result = {
        "settings": {"run": relative_path(run_dir, out), "recipe": recipe(config),
                     "policy_sha256": file_sha256(weights),
                     "ties_run": relative_path(ties_dir, out),
                     "ties_run_policy_sha256": file_sha256(ties_weights),
                     "retentions": list(settings.retentions), "split": settings.split,
                     "clips": len(clips), "samples": settings.samples, "tau": tau,
                     "seed": settings.seed, "num_beams": settings.num_beams,
                     "max_new_tokens": settings.max_new_tokens,
                     "decoding_source": settings.decoding_source,
                     "judge": judge_record(cache.root, captioner.path, cache_dir=cache_dir),
                     "paths": PATHS_NOTE},
        "full": {"C_av": float(full_scores.mean()), "slots_correct": full_slots_correct,
                 "per_clip": full_scores, "captions": full_texts,
                 "clip_ids": [c.clip_id for c in clips]},
        "retentions": retentions, "ties": ties,
        "ties_figure": figure.name if series else None,
        "seconds": round(seconds, 1),
        "command": "python -m avex.evaluate " + portable_command(sys.argv[1:], cache_dir)
        if sys.argv and Path(sys.argv[0]).parent.name == "evaluate" else None}
    markdown = report_markdown(result)
    (out / f"{settings.name}.md").write_text(markdown)
    (out / f"{settings.name}.json").write_text(results_json(compact_result(result)))
    print(markdown)
    print(f"wrote {out / (settings.name + '.md')}, {out / (settings.name + '.json')}"
          + (f", {figure}" if series else "") + f" ({seconds:.0f} s)")
    result["out"] = str(out)
    return result
