"""Paired bootstrap intervals for the difference between two methods' scores.

A table's C_av for a method is the mean over the scored clips of each clip's CIDEr, averaged
over training seeds. The difference between method X and method Y at one retention is that
mean for X minus that mean for Y. Its interval comes from a paired bootstrap that resamples
clips and training seeds together. Each replicate draws N clips with replacement and S seeds
with replacement. Both methods get the same clips and the same seed draw. A method without a
seed (full tokens, FastV-AV, ToMe-AV, FastAV, Attention-AV, a policy given as one run) has one
row of per-clip scores, and that row is used as is for every seed drawn. The interval is the
percentile interval of the replicates' differences.

The per-clip scores are resampled; they are not re-scored. So CIDEr's document frequencies stay
those of the whole scored split: each clip's score was computed once, against the references of
every clip scored with it (:func:`avex.scoring.score_captions`).

Three training seeds are a small sample of seeds: the seed part of the interval is rough, and
the clip part carries most of its width on 1000 clips.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from avex import _checks
from avex.tables import markdown_table

__all__ = ["Interval", "paired_interval", "pooled_interval", "seed_rows", "differences",
           "difference_table", "compact_per_clip", "arm_pairs", "variance_components",
           "planned_interval", "parse_plans", "with_arms_of", "LEVEL", "REPLICATES", "SEED", "PER_CLIP_DIGITS",
           "RULE"]

LEVEL = 0.95
REPLICATES = 4000
SEED = 0
#: digits each per-clip CIDEr keeps in a results file (its mean moves by at most 0.005)
PER_CLIP_DIGITS = 2
#: the project's decision rule, stated once (docs/evaluation.md quotes it)
RULE = ("X beats Y at a retention when the 95% paired bootstrap interval of X − Y lies above "
        "0, and is worse when it lies below 0; otherwise the two are level there")
#: rows of a block of replicates drawn at once (bounds memory at about 8 MB per 1000 clips)
_BLOCK = 1000


@dataclass(frozen=True)
class Interval:
    """``difference`` (mean of ours − mean of other, over clips and seeds) and its
    ``level`` interval [``low``, ``high``] from ``replicates`` paired resamples of ``clips``
    clips and ``seeds`` seeds."""

    difference: float
    low: float
    high: float
    level: float
    clips: int
    seeds: int
    replicates: int

    @property
    def above_zero(self) -> bool:
        return self.low > 0

    @property
    def below_zero(self) -> bool:
        return self.high < 0

    def text(self, digits: int = 1) -> str:
        """``+2.4 [-1.1, +5.8]``."""
        return (f"{self.difference:+.{digits}f} [{self.low:+.{digits}f}, "
                f"{self.high:+.{digits}f}]")

    def as_dict(self) -> dict:
        return asdict(self)


def interval_fields(value) -> dict:
    """An entry of :func:`differences` as a results file stores it: the interval's fields, or
    ``{"none": why}`` where there is none."""
    return value.as_dict() if isinstance(value, Interval) else {"none": value}


def _seed_matrix(name: str, scores) -> np.ndarray:
    """Per-clip scores as a float64 [seeds, clips] array: a 1-D input is one seed."""
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be per-clip scores, a list of numbers or a list of "
                        f"equal-length lists (one per seed), got {type(scores).__name__}"
                        ) from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"{name} must be [clips] or [seeds, clips], got shape "
                         f"{tuple(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(array.shape)}); it needs at least one "
                         "seed and one clip")
    if not np.isfinite(array).all():
        seed, clip = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(f"{name} must be finite, got {array[seed, clip]} at seed row {seed}, "
                         f"clip {clip}")
    return array


def paired_interval(ours, other, *, level: float = LEVEL, replicates: int = REPLICATES,
                    seed: int = SEED) -> Interval:
    """The paired bootstrap interval of mean(``ours``) − mean(``other``).

    Args:
        ours, other: per-clip scores of the two methods on the same clips in the same order,
            ``[clips]`` or ``[seeds, clips]``. Rows are paired by position (row s of each is
            training seed s); a side with one row (a method without a seed) is used for every
            seed of the other.
        level: the interval's coverage, in (0, 1).
        replicates: bootstrap replicates (at least 100).
        seed: the resampling seed: the same inputs and seed give the same interval.
    """
    level = _checks.real("level", level, low=0, high=1, low_open=True, high_open=True)
    _checks.int_at_least("replicates", replicates, 100)
    _checks.int_at_least("seed", seed, 0)
    ours, other = _seed_matrix("ours", ours), _seed_matrix("other", other)
    _check_pairable(ours, other)
    diff = ours - other                      # [seeds, clips], broadcast over a seedless side
    stats = _replicates(diff, replicates, np.random.default_rng(seed))
    return _interval(float(diff.mean()), stats, level, *diff.shape)


def pooled_interval(strata, *, level: float = LEVEL, replicates: int = REPLICATES,
                    seed: int = SEED) -> Interval:
    """The mean over strata (benchmarks) of each stratum's mean(ours) − mean(other), with a
    stratified paired bootstrap: every replicate resamples each stratum's clips and training
    seeds on its own (they are other clips and other training runs) and averages the strata's
    replicate differences with equal weights.

    ``strata``: a list of (ours, other) pairs, each as :func:`paired_interval` takes them.
    ``clips`` and ``seeds`` of the result are the totals over strata."""
    level = _checks.real("level", level, low=0, high=1, low_open=True, high_open=True)
    _checks.int_at_least("replicates", replicates, 100)
    _checks.int_at_least("seed", seed, 0)
    strata = list(strata)
    if not strata:
        raise ValueError("strata is empty: pooling needs at least one (ours, other) pair")
    rng = np.random.default_rng(seed)
    diffs, stats = [], np.zeros(replicates)
    for k, (ours, other) in enumerate(strata):
        ours = _seed_matrix(f"strata[{k}] ours", ours)
        other = _seed_matrix(f"strata[{k}] other", other)
        try:
            _check_pairable(ours, other)
        except ValueError as err:
            raise ValueError(f"strata[{k}]: {err}") from None
        diffs.append(ours - other)
        stats += _replicates(diffs[-1], replicates, rng)
    stats /= len(strata)
    difference = float(np.mean([d.mean() for d in diffs]))
    return _interval(difference, stats, level, sum(d.shape[0] for d in diffs),
                     sum(d.shape[1] for d in diffs))


def _check_pairable(ours: np.ndarray, other: np.ndarray) -> None:
    if ours.shape[1] != other.shape[1]:
        raise ValueError(f"other has {other.shape[1]} clips but ours has {ours.shape[1]}; "
                         "both must be scored on the same clips, in the same order")
    if ours.shape[0] > 1 and other.shape[0] > 1 and ours.shape[0] != other.shape[0]:
        raise ValueError(f"other has {other.shape[0]} seed rows but ours has {ours.shape[0]}; "
                         "pass one row per training seed of ours (paired by seed), or one row "
                         "for a method without a seed")


def _replicates(diff: np.ndarray, replicates: int, rng) -> np.ndarray:
    """``replicates`` bootstrap means of ``diff`` [seeds, clips], clips and seeds resampled."""
    n_seeds, n_clips = diff.shape
    stats = np.empty(replicates)
    for start in range(0, replicates, _BLOCK):
        count = min(_BLOCK, replicates - start)
        # how often each clip / seed is drawn in each replicate (multinomial = N draws with
        # replacement); the same draws serve both methods: that is the pairing
        clip_draws = rng.multinomial(n_clips, np.full(n_clips, 1 / n_clips), size=count)
        seed_draws = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=count)
        per_seed = diff @ clip_draws.T / n_clips                 # [seeds, count]
        stats[start:start + count] = (seed_draws * per_seed.T).sum(axis=1) / n_seeds
    return stats


def _interval(difference: float, stats: np.ndarray, level: float, n_seeds: int,
              n_clips: int) -> Interval:
    tail = (1 - level) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    return Interval(difference=difference, low=float(low), high=float(high), level=level,
                    clips=n_clips, seeds=n_seeds, replicates=len(stats))


# -- from the rows of a results file -------------------------------------------------------------

def compact_per_clip(per_clip: dict) -> dict:
    """Metric -> per-clip scores, rounded to :data:`PER_CLIP_DIGITS` for a results file."""
    return {metric: [round(float(x), PER_CLIP_DIGITS) for x in values]
            for metric, values in per_clip.items()}


def seed_rows(rows, name: str, retention: float, metric: str = "C_av", *,
              key: str = "method") -> dict | None:
    """Seed -> per-clip ``metric`` scores of the rows whose ``key`` is ``name`` at
    ``retention`` (the first row of a seed: a seedless method repeated for every seed of a
    table counts once). None where a row records no per-clip scores (a file from before they
    were recorded); {} where no row matches."""
    out = {}
    for row in rows:
        if row.get(key) != name or not math.isclose(row["retention"], retention):
            continue
        scores = (row.get("per_clip") or {}).get(metric)
        if scores is None:
            return None
        out.setdefault(row.get("seed"), scores)
    return out


def _paired(ours: dict, other: dict, ours_name: str, other_name: str):
    """Two seed -> scores maps as paired [seeds, clips] inputs of :func:`paired_interval`."""
    if len(ours) > 1 and len(other) > 1:
        if set(ours) != set(other):
            raise ValueError(f"{other_name} has training seeds {sorted(other, key=str)} but "
                             f"{ours_name} has {sorted(ours, key=str)}; paired intervals need "
                             "the same seeds")
        seeds = sorted(ours, key=str)
        return [ours[s] for s in seeds], [other[s] for s in seeds]
    return list(ours.values()), list(other.values())


def differences(rows, ours: str, others, retentions, metric: str = "C_av", *,
                key: str = "method", full: dict | None = None, full_key: str = "full",
                **bootstrap) -> dict:
    """(other, retention) -> :class:`Interval` of ``ours`` − other, or a str saying why there
    is none (no per-clip scores recorded, a row missing, seeds that do not pair).

    ``rows``: a results file's rows (``key``, ``retention``, ``seed``, ``per_clip``);
    ``full``: the full-token row for a table without one among ``rows`` (named ``full_key``
    among ``others``, used at every retention; a row of ``rows`` must not carry that name).
    ``bootstrap``: :func:`paired_interval`'s settings."""
    if full is not None and any(r.get(key) == full_key for r in rows):
        raise ValueError(f"differences: a row's {key} is {full_key!r}, the name given to full "
                         "tokens; pass another full_key")
    full_scores = None if full is None else {None: (full.get("per_clip") or {}).get(metric)}
    out = {}
    for retention in retentions:
        mine = seed_rows(rows, ours, retention, metric, key=key)
        for other in others:
            if other == full_key and full_scores is not None:
                theirs = None if full_scores[None] is None else full_scores
            else:
                theirs = seed_rows(rows, other, 1.0 if other == full_key else retention, metric,
                                   key=key)
            if mine is None or theirs is None:
                out[(other, retention)] = "no interval: per-clip scores not recorded"
            elif not mine or not theirs:
                missing = ours if not mine else other
                out[(other, retention)] = f"no interval: no {missing} row at {retention:.0%}"
            else:
                try:
                    out[(other, retention)] = paired_interval(
                        *_paired(mine, theirs, ours, other), **bootstrap)
                except ValueError as err:
                    out[(other, retention)] = f"no interval: {err}"
    return out


def difference_table(intervals: dict, ours_label: str, labels: dict, retentions, *,
                     others: str = "method") -> str:
    """One line per other method (``labels``: name -> printed label, in order), one column per
    retention: ``ours − other`` with its interval, or why there is none. ``others``: what the
    lines are called in the header ("method", "arm", "variant")."""
    lines = []
    for name, label in labels.items():
        cells = []
        for retention in retentions:
            value = intervals.get((name, retention), "n/a")
            cells.append(value.text() if isinstance(value, Interval) else value)
        lines.append([label, *cells])
    return markdown_table([f"{ours_label} − {others}", *(f"{r:.0%}" for r in retentions)],
                          lines)


def arm_pairs(text: str) -> list[tuple[str, str]]:
    """``"X:Y[,X:Y...]"`` -> [(X, Y), ...]: the pairs of arms a comparison script reports
    X − Y for (its ``--pairs``). An ``argparse`` type: a malformed item raises
    ``argparse.ArgumentTypeError``, whose message argparse prints as it is."""
    pairs = []
    for item in text.split(","):
        ours, sep, other = item.partition(":")
        if not sep or not ours or not other:
            raise argparse.ArgumentTypeError(f"--pairs must be X:Y[,X:Y...], got {item!r}")
        pairs.append((ours, other))
    return pairs


# -- planning a deciding benchmark --------------------------------------------------------------

def variance_components(diff) -> tuple[float, float, float]:
    """(seed, clip, residual) variances of a [seeds, clips] matrix of one benchmark's per-clip
    differences X − Y, under d[s, c] = mu + a_s + b_c + e_sc: a training seed's effect, a
    clip's effect and what is left (two-way analysis of variance without replication; a
    component estimated below 0 is 0). Needs >= 2 seeds and >= 2 clips."""
    d = _seed_matrix("diff", diff)
    if d.shape[0] < 2 or d.shape[1] < 2:
        raise ValueError(f"diff must be [seeds, clips] with >= 2 of each, got shape "
                         f"{list(d.shape)}")
    seeds, clips = d.shape
    residual = d - d.mean(1, keepdims=True) - d.mean(0, keepdims=True) + d.mean()
    ms_residual = float((residual ** 2).sum() / ((seeds - 1) * (clips - 1)))
    ms_seed = clips * float(d.mean(1).var(ddof=1))
    ms_clip = seeds * float(d.mean(0).var(ddof=1))
    return (max(0.0, (ms_seed - ms_residual) / clips),
            max(0.0, (ms_clip - ms_residual) / seeds), ms_residual)


def planned_interval(components, gap: float, clips: int, seeds: int, *,
                     level: float = LEVEL) -> tuple[float, float]:
    """(half-width, chance) of X − Y's interval on a new benchmark of ``clips`` clips and
    ``seeds`` training seeds, when the true difference is ``gap``: the normal approximation
    with the variance ``components`` (:func:`variance_components`) scaled to that size, and
    the chance that the interval excludes 0 on ``gap``'s side. An ideal interval: the paired
    bootstrap's seed part, drawn from a few seeds, is rougher than this."""
    seed_var, clip_var, residual_var = (float(v) for v in components)
    _checks.int_at_least("clips", clips, 1)
    _checks.int_at_least("seeds", seeds, 1)
    _checks.ratio("level", level)
    se = math.sqrt(seed_var / seeds + clip_var / clips + residual_var / (seeds * clips))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    if se == 0:
        return 0.0, float(gap != 0)
    return z * se, NormalDist().cdf(abs(gap) / se - z)


def parse_plans(text: str) -> list[tuple[int, int]]:
    """``"CLIPSxSEEDS[,...]"`` (e.g. ``"1000x3,2000x10"``) -> [(clips, seeds), ...]: the
    benchmark sizes a comparison script plans for (its ``--plan``). An ``argparse`` type."""
    plans = []
    for item in text.split(","):
        clips, sep, seeds = item.partition("x")
        if not (sep and clips.isdigit() and seeds.isdigit() and int(clips) > 0
                and int(seeds) > 0):
            raise argparse.ArgumentTypeError(f"--plan must be CLIPSxSEEDS[,...] with positive "
                                             f"integers, got {item!r}")
        plans.append((int(clips), int(seeds)))
    return plans


def with_arms_of(result: dict, other: dict, name: str, tag: str = "") -> dict:
    """``result`` (an ablation.json's contents) with the rows of every arm it lacks taken from ``other``, an ablation.json of
    the same judge (benchmark and captioner SHA-256), split and clips whose full-token scores
    are ``result``'s clip for clip; anything else is refused, naming what differs. With
    ``tag``, every arm of ``other`` is added, renamed ``ARM@tag``."""
    for key in ("split", "clips"):
        if other.get(key) != result.get(key):
            raise ValueError(f"--with {name}: its {key} is {other.get(key)!r}, the file's "
                             f"{result.get(key)!r}")
    for part in ("benchmark", "captioner"):
        if other["judge"][part]["sha256"] != result["judge"][part]["sha256"]:
            raise ValueError(f"--with {name}: another {part} (sha256 "
                             f"{other['judge'][part]['sha256'][:12]}...) than the file's")
    if other["full"]["per_clip"] != result["full"]["per_clip"]:
        raise ValueError(f"--with {name}: its full-token scores differ from the file's, so its "
                         "captioning is not the file's")
    if tag:
        return {**result, "rows": result["rows"] + [{**r, "variant": f"{r['variant']}@{tag}"}
                                                    for r in other["rows"]]}
    have = {r["variant"] for r in result["rows"]}
    return {**result, "rows": result["rows"] + [r for r in other["rows"]
                                                if r["variant"] not in have]}
