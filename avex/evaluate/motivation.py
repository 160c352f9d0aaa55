"""The paper's Fig. 1 on the embedded benchmark: attention against counterfactual gain, and the
non-additivity of audio-visual content (the analysis of :mod:`avex.evaluate.gates`)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avex import _checks
from avex.figures import save_figure
from avex.judge_identity import judge_line, judge_record
from avex.progress import progress_bar
from avex.reward import CiderD

from . import gates
from .common import (ExperimentSettings, begin, check_split, fmt, load_experiment_inputs,
                     percent, split_clips)


@dataclass
class MotivationSettings(ExperimentSettings):
    """Fig. 1 on ``clips`` clips of ``split``: counterfactual gains over ``base_sets`` random
    base sets at ``base_retention`` (drawn from ``seed``), and groups of ``group`` tokens."""

    split: str = "test"
    clips: int = 40
    base_retention: float = 0.2
    base_sets: int = 3
    group: int = 2
    seed: int = 0

    def check(self) -> None:
        super().check()
        check_split("split", self.split)
        _checks.ratio("base_retention", self.base_retention)
        _checks.int_at_least("clips", self.clips, 1)
        _checks.int_at_least("base_sets", self.base_sets, 1)
        _checks.int_at_least("group", self.group, 1)
        _checks.int_at_least("seed", self.seed, 0)

    def training_unused(self) -> str:
        return "motivation trains no policy"


def run_motivation(settings: MotivationSettings) -> dict:
    """Fig. 1 of the paper on ``settings.clips`` clips of ``settings.split``; every setting is
    checked first.

    (a) every AV token's counterfactual CIDEr-D gain (``gates.counterfactual_gains``: added to
    ``base_sets`` random base sets at ``base_retention``) against its rank by full-token
    text-to-AV attention within its clip (0 = most attended); Spearman per clip (mean) and
    pooled. (b) ``gates.non_additivity``: gain of a visual group, an audio group and both over a
    shared base set; the joint gain is plotted against the sum of the separate ones."""
    started = time.perf_counter()
    settings, out = begin(settings, MotivationSettings, "motivation")
    cache, captioner = load_experiment_inputs(settings)
    clips = split_clips(cache, settings.split, settings.max_clips)[:settings.clips]
    out.mkdir(parents=True, exist_ok=True)
    scorer = CiderD([c.refs_av for c in clips])
    attention = captioner.text_to_av_attention(clips)
    ranks, gains, per_clip = [], [], []
    for clip, att in progress_bar(list(zip(clips, attention)), desc="counterfactual gains",
                                  unit="clip", disable=not settings.progress):
        gain = gates.counterfactual_gains(captioner, clip, scorer,
                                          base_retention=settings.base_retention,
                                          base_sets=settings.base_sets, seed=settings.seed,
                                          batch_size=settings.batch_size * 4)
        att = att.numpy()
        rank = gates.rank_average(-att)  # 0 = most attended
        ok = ~np.isnan(gain)
        ranks.append(rank[ok])
        gains.append(gain[ok])
        per_clip.append(gates.spearman(att[ok], gain[ok]))
    rank_all, gain_all = np.concatenate(ranks), np.concatenate(gains)
    pairs = [gates.non_additivity(captioner, c, scorer, base_retention=settings.base_retention,
                                  group=settings.group, seed=settings.seed)
             for c in progress_bar(clips, desc="non-additivity", unit="clip",
                                   disable=not settings.progress)]
    pairs = [p for p in pairs if p is not None]
    finite = [v for v in per_clip if np.isfinite(v)]
    numbers = {
        "clips": len(clips), "split": settings.split, "seed": settings.seed,
        "base_retention": settings.base_retention, "base_sets": settings.base_sets,
        "spearman_attention_gain_per_clip_mean": float(np.mean(finite)) if finite
        else float("nan"),  # NaN: every clip's gains were constant
        "spearman_attention_gain_pooled": gates.spearman(-rank_all, gain_all),
        "top_decile_attention_negligible_gain_share": float(
            (gain_all[rank_all < np.quantile(rank_all, 0.1)] < gates.NEGLIGIBLE_GAIN).mean()),
        "critical_tokens": int((gain_all >= gates.CRITICAL_GAIN).sum()),
        "critical_below_median_attention_share": float(
            (rank_all[gain_all >= gates.CRITICAL_GAIN] > np.median(rank_all)).mean())
        if (gain_all >= gates.CRITICAL_GAIN).any() else None,
        "non_additivity": gates._summarise_additivity(pairs, settings.group),
        "pairs": pairs,
        "judge": judge_record(cache.root, captioner.path, cache_dir=settings.cache_dir),
    }
    motivation_figure(rank_all, gain_all, numbers, pairs, out / "motivation.png")
    numbers["seconds"] = round(time.perf_counter() - started, 1)
    (out / "motivation.json").write_text(json.dumps(numbers, indent=1, default=float) + "\n")
    lines = motivation_table(numbers)
    lines += ["", f"Figure: `motivation.png`. Took {numbers['seconds']:.0f} s."]
    lines += ["", judge_line(numbers["judge"])]
    (out / "motivation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    numbers["out"] = str(out)
    return numbers


def motivation_table(numbers: dict) -> list[str]:
    """The report's heading and table (Markdown lines) of :func:`run_motivation`'s numbers."""
    na = numbers["non_additivity"]
    lines = [f"# Motivation (Fig. 1): {numbers['clips']} {numbers['split']} clips, seed "
             f"{numbers['seed']}", "",
             "| measure | value |", "|---|---|",
             f"| Spearman(attention, counterfactual gain), per clip mean | "
             f"{fmt([numbers['spearman_attention_gain_per_clip_mean']], 3)} |",
             f"| Spearman, pooled over clips | "
             f"{fmt([numbers['spearman_attention_gain_pooled']], 3)} |",
             f"| top-10% attention tokens with gain < {gates.NEGLIGIBLE_GAIN:g} | "
             f"{100 * numbers['top_decile_attention_negligible_gain_share']:.0f}% |",
             f"| critical tokens (gain >= {gates.CRITICAL_GAIN:g}) below median attention | "
             f"{percent(numbers['critical_below_median_attention_share'])} "
             f"(of {numbers['critical_tokens']}) |"]
    for name, label in (("own_sound", "subject makes the sound"),
                        ("background_sound", "sound from elsewhere")):
        if name in na:
            r = na[name]
            lines.append(f"| non-additivity, {label} ({r['clips']} clips): gain V / A / both, "
                         f"mean deviation | {r['mean_gain_visual']:.1f} / "
                         f"{r['mean_gain_audio']:.1f} / {r['mean_gain_both']:.1f}, "
                         f"{r['mean_deviation']:+.1f} |")
    return lines


def motivation_figure(rank, gain, numbers, pairs, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.scatter(rank, gain, s=4, alpha=0.25, color="tab:blue")
    edges = np.linspace(0, rank.max() + 1, 11)
    centres, means = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (rank >= lo) & (rank < hi)
        if sel.any():
            centres.append((lo + hi) / 2)
            means.append(gain[sel].mean())
    a.plot(centres, means, color="tab:red", marker="o", label="mean per rank bin")
    a.axhline(0, color="gray", linewidth=0.8)
    rho = numbers["spearman_attention_gain_per_clip_mean"]
    a.set_title(f"(a) gain vs attention rank (Spearman per clip {rho:.2f}, pooled "
                f"{numbers['spearman_attention_gain_pooled']:.2f})", fontsize=9)
    a.set_xlabel("attention rank within clip (0 = most attended)")
    a.set_ylabel("counterfactual CIDEr-D gain")
    a.legend(fontsize=8)
    for own, colour, label in ((True, "tab:orange", "subject makes the sound"),
                               (False, "tab:green", "sound from elsewhere")):
        chosen = [p for p in pairs if p["own"] == own]
        if chosen:
            b.scatter([p["d_v"] + p["d_a"] for p in chosen], [p["d_av"] for p in chosen], s=12,
                      alpha=0.7, color=colour, label=label)
    if pairs:
        values = [p["d_v"] + p["d_a"] for p in pairs] + [p["d_av"] for p in pairs]
        lo, hi = min(values), max(values)
        b.plot([lo, hi], [lo, hi], color="gray", linestyle="--", label="additive (y = x)")
    b.set_xlabel("gain(V group) + gain(A group)")
    b.set_ylabel("gain(V group + A group)")
    b.set_title("(b) non-additivity", fontsize=9)
    b.legend(fontsize=8)
    return save_figure(fig, path)


