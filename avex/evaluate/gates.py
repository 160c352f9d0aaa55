"""Measured gates for a benchmark + frozen captioner (``python -m avex.evaluate gates``).

Everything here is measured, nothing asserted by construction:

1. full-token C_av / C_v / C_a (and BLEU-4, METEOR) on the test and transfer splits, through
   ``avex.metrics`` (pycocoevalcap where it runs);
2. random pruning at 50 / 40 / 30 / 20 / 10 % retention (several seeds), plus the attention
   baseline that the policy's warmup imitates (top text-to-AV attention within each modality,
   K_a = round(K * Na / N));
3. the phenomena: visual redundancy across frames, audio sparsity (share of caption-critical audio
   tokens), the rank correlation between text-to-AV attention and each token's counterfactual
   CIDEr gain (the paper's Fig. 1a), non-additivity of audio and visual evidence (Fig. 1b), and
   how much the references vary.

A token's counterfactual gain is CIDEr-D(caption of S + {i}) - CIDEr-D(caption of S), averaged
over a few random base sets S at ``base_retention`` that do not hold i (CIDEr-D x100, document
frequencies fixed from the split's AV references, as the training reward fixes them).
"""
from __future__ import annotations

import datetime
import os
import platform
import time
import zlib

import numpy as np
import torch

from avex import _checks
from avex.captioner import FrozenCaptioner
from avex.data import FeatureCache
from avex.judge_identity import judge_record
from avex.metrics import caption_metrics_by_reference_type, cider_source
from avex.paths import cache_relative
from avex.progress import progress_bar
from avex.reward import CiderD
from avex.selection import balanced_attention_keep, num_kept, random_keep

RETENTIONS = (0.5, 0.4, 0.3, 0.2, 0.1)
CRITICAL_GAIN = 5.0       # CIDEr points: where the paper's exchange weight saturates
NEGLIGIBLE_GAIN = 1.0


# -- small statistics helpers --------------------------------------------------------------------

def rank_average(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties sharing their mean rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start:stop + 1]] = (start + stop) / 2
        start = stop + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman rank correlation (NaN when either side is constant)."""
    ra, rb = rank_average(a), rank_average(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _seeded_perm(n: int, *key) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(":".join(map(str, key)).encode()))
    return torch.randperm(n, generator=gen)


# -- selections ----------------------------------------------------------------------------------

def random_keeps(clips, retention: float, seed: int) -> list:
    """Per clip, K = round(rho * M) AV tokens uniformly at random (:func:`random_keep`)."""
    counts = torch.tensor([c.n_visual + c.n_audio for c in clips])
    keep = random_keep([c.clip_id for c in clips], counts, num_kept(retention, counts), seed)
    return [row[:n] for row, n in zip(keep, counts.tolist())]


def attention_keeps(clips, attention: list, retention: float) -> list:
    """Per clip, the balanced attention keep-set (:func:`balanced_attention_keep`)."""
    return [balanced_attention_keep(att, c.n_visual, c.n_audio, retention)
            for c, att in zip(clips, attention)]


def modality_cider(captions: list, clips) -> dict:
    """C_av, C_v, C_a (x100) and BLEU-4 / METEOR against the AV references
    (``avex.metrics``: pycocoevalcap, or CiderD with BLEU-4 and METEOR NaN without it)."""

    refs = {"AV": [c.refs_av for c in clips]}
    if all(c.refs_v for c in clips):
        refs["V"] = [c.refs_v for c in clips]
    if all(c.refs_a for c in clips):
        refs["A"] = [c.refs_a for c in clips]
    scores = caption_metrics_by_reference_type(captions, refs)
    out = {"C_av": 100 * scores["AV"]["CIDEr"], "BLEU-4": 100 * scores["AV"]["BLEU-4"],
           "METEOR": 100 * scores["AV"]["METEOR"]}
    if "V" in scores:
        out["C_v"] = 100 * scores["V"]["CIDEr"]
    if "A" in scores:
        out["C_a"] = 100 * scores["A"]["CIDEr"]
    return out


# -- counterfactual gains ------------------------------------------------------------------------

def counterfactual_gains(captioner, clip, scorer, *, base_retention: float, base_sets: int,
                         seed: int, batch_size: int = 256) -> np.ndarray:
    """Per AV token: mean CIDEr-D gain of adding it to random base sets that lack it."""
    m = clip.n_visual + clip.n_audio
    k = int(num_kept(base_retention, torch.tensor(m)))
    keeps, which = [], []
    for r in range(base_sets):
        base = torch.zeros(m, dtype=torch.bool)
        base[_seeded_perm(m, "base", seed, clip.clip_id, r)[:k]] = True
        keeps.append(base)
        which.append((r, -1))
        for i in torch.nonzero(~base).flatten().tolist():
            extended = base.clone()
            extended[i] = True
            keeps.append(extended)
            which.append((r, i))
    captions = captioner.caption([clip] * len(keeps), keep=torch.stack(keeps),
                                 batch_size=batch_size)
    scores = 100 * scorer.score(captions, [clip.refs_av] * len(captions))
    base_score = {r: scores[j] for j, (r, i) in enumerate(which) if i < 0}
    total, count = np.zeros(m), np.zeros(m)
    for j, (r, i) in enumerate(which):
        if i >= 0:
            total[i] += scores[j] - base_score[r]
            count[i] += 1
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def non_additivity(captioner, clip, scorer, *, base_retention: float, group: int,
                   seed: int) -> dict | None:
    """Fig. 1b on one clip: gains of a visual group (subject tokens), an audio group (event
    tokens) and both, over a base set drawn from the remaining tokens."""
    roles_v = clip.annotations.get("visual_role")
    roles_a = clip.annotations.get("audio_role")
    if roles_v is None or roles_a is None:
        return None
    nv = clip.n_visual
    subject = torch.nonzero(roles_v == 1).flatten()
    event = nv + torch.nonzero(roles_a == 1).flatten()
    if len(subject) == 0 or len(event) == 0:
        return None
    m = nv + clip.n_audio
    g_v = subject[_seeded_perm(len(subject), "gv", seed, clip.clip_id)[:group]]
    g_a = event[_seeded_perm(len(event), "ga", seed, clip.clip_id)[:group]]
    rest = torch.ones(m, dtype=torch.bool)
    rest[subject] = False
    rest[event] = False
    pool = torch.nonzero(rest).flatten()
    k = min(len(pool), int(num_kept(base_retention, torch.tensor(m))) - len(g_v) - len(g_a))
    base = torch.zeros(m, dtype=torch.bool)
    base[pool[_seeded_perm(len(pool), "nb", seed, clip.clip_id)[:max(k, 0)]]] = True
    sets = [base.clone() for _ in range(4)]
    sets[1][g_v] = True
    sets[2][g_a] = True
    sets[3][g_v] = True
    sets[3][g_a] = True
    captions = captioner.caption([clip] * 4, keep=torch.stack(sets))
    s = 100 * scorer.score(captions, [clip.refs_av] * 4)
    d_v, d_a, d_av = s[1] - s[0], s[2] - s[0], s[3] - s[0]
    return {"own": bool(any(e.get("own") for e in clip.info.get("events", []))),
            "d_v": d_v, "d_a": d_a, "d_av": d_av, "deviation": d_av - d_v - d_a}


# -- feature statistics --------------------------------------------------------------------------

def _cos_matrix(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    return x @ x.T


def redundancy_stats(clips, n_frames: int) -> dict:
    """Adjacent-step cosine similarity (same patch in the next frame; the next audio token) and
    the share of tokens with a near-duplicate (cosine >= 0.9) in another frame / time step."""
    adj_v, adj_a, dup_v, dup_a = [], [], [], []
    for clip in clips:
        nv, na = clip.n_visual, clip.n_audio
        per_frame = nv // n_frames
        v = clip.visual.float().reshape(n_frames, per_frame, -1)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        adj_v.append((v[1:] * v[:-1]).sum(-1).mean().item())
        a = clip.audio.float()
        a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        adj_a.append((a[1:] * a[:-1]).sum(-1).mean().item())
        sim_v = _cos_matrix(clip.visual)
        frame = torch.arange(nv) // per_frame
        other_frame = frame[:, None] != frame[None, :]
        dup_v.append(((sim_v >= 0.9) & other_frame).any(1).float().mean().item())
        sim_a = _cos_matrix(clip.audio)
        off_diag = ~torch.eye(na, dtype=torch.bool)
        dup_a.append(((sim_a >= 0.9) & off_diag).any(1).float().mean().item())
    return {"visual_adjacent_frame_cosine": float(np.mean(adj_v)),
            "audio_adjacent_step_cosine": float(np.mean(adj_a)),
            "visual_near_duplicate_share": float(np.mean(dup_v)),
            "audio_near_duplicate_share": float(np.mean(dup_a))}


def reference_stats(clips, scorer) -> dict:
    """Distinct references per clip and leave-one-out CIDEr-D of a reference against the
    other four (how far apart the annotators are; a ceiling-like figure for a captioner)."""
    distinct = [len(set(c.refs_av)) for c in clips]
    cands, refs = [], []
    for c in clips:
        for j, r in enumerate(c.refs_av):
            others = c.refs_av[:j] + c.refs_av[j + 1:]
            if others:
                cands.append(r)
                refs.append(others)
    loo = 100 * scorer.score(cands, refs).mean() if cands else float("nan")
    words = {w for c in clips for r in c.refs_av + c.refs_v + c.refs_a for w in r.split()}
    return {"distinct_av_refs_per_clip": float(np.mean(distinct)),
            "leave_one_out_cider_av": float(loo), "reference_vocabulary": len(words),
            "mean_av_ref_words": float(np.mean([len(r.split()) for c in clips
                                                for r in c.refs_av]))}


# -- the whole report ----------------------------------------------------------------------------

def run_gates(benchmark_path, captioner_path=None, *, seeds: int = 3,
              retentions=RETENTIONS, counterfactual_clips: int = 100, base_sets: int = 3,
              base_retention: float = 0.2, group: int = 2, device=None, max_clips=None,
              cache_dir=None, progress: bool = True) -> dict:
    """The gates on the test (and transfer) split's first ``max_clips`` clips (all: None);
    paths in the report are relative to the cache root ``cache_dir`` (default: the usual
    one)."""
    _checks.optional_int_at_least("max_clips", max_clips, 1)
    started = time.perf_counter()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cache = FeatureCache(benchmark_path)
    splits_present = {r["split"] for r in cache.rows}
    test_rows = cache.split("test").indices[:max_clips]
    transfer_rows = cache.split("transfer").indices[:max_clips] \
        if "transfer" in splits_present else []
    # a flipped bit passes the header checks: hash the shards the gates read
    print(f"benchmark: {cache.verify_shards(test_rows + transfer_rows)}")
    captioner = FrozenCaptioner.load(captioner_path, device=device, progress=progress)
    test = [cache.split("test")[i] for i in range(len(test_rows))]
    transfer = [cache.split("transfer")[i] for i in range(len(transfer_rows))]
    scorer = CiderD([c.refs_av for c in test])
    report: dict = {"benchmark": cache_relative(benchmark_path, cache_dir),
                    "captioner": cache_relative(captioner.path, cache_dir),
                    "test_clips": len(test), "transfer_clips": len(transfer),
                    "captioner_training": captioner.info.get("training", {}),
                    "benchmark_source": cache.meta.source,
                    "judge": judge_record(benchmark_path, captioner.path, cache_dir=cache_dir)}

    bar = progress_bar(total=2 + len(retentions) * (seeds + 1) + 2, desc="gates", unit="stage",
                       disable=not progress)
    full = captioner.caption(test)
    report["full"] = modality_cider(full, test)
    report["examples"] = [{"clip_id": c.clip_id, "caption": t, "reference": c.refs_av[0]}
                          for c, t in zip(test[:4], full[:4])]
    bar.update(1)
    if transfer:
        report["transfer_full"] = modality_cider(captioner.caption(transfer), transfer)
    bar.update(1)

    attention = captioner.text_to_av_attention(test)
    report["random_sweep"] = sweep = random_sweep(captioner, test, attention, retentions, seeds,
                                                  bar)
    lowest = f"{min(retentions):g}"
    report["gate_random_lowest_share"] = share_of(sweep[lowest]["C_av"], report["full"]["C_av"])

    # counterfactual gains on the first clips of the test split
    sample = test[:counterfactual_clips]
    report["phenomena"] = gain_phenomena(captioner, sample, scorer, attention, cache.meta.n_frames,
                                         base_retention=base_retention, base_sets=base_sets,
                                         progress=progress)
    bar.update(1)
    report["phenomena"]["redundancy"] = redundancy_stats(test, cache.meta.n_frames)
    report["phenomena"]["references"] = reference_stats(test, scorer)
    deviations = [non_additivity(captioner, c, scorer, base_retention=base_retention,
                                 group=group, seed=0) for c in test]
    report["phenomena"]["non_additivity"] = _summarise_additivity(
        [d for d in deviations if d is not None], group)
    bar.update(1)
    bar.close()
    report["run"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(), "cider_source": cider_source(), "load_average_start": load_start,
        "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "settings": {"seeds": seeds, "retentions": list(retentions),
                     "counterfactual_clips": len(sample), "base_sets": base_sets,
                     "base_retention": base_retention, "group": group}}
    return report


def random_sweep(captioner, test, attention, retentions, seeds: int, bar) -> dict:
    """Per retention: random pruning's metrics (mean and spread over ``seeds``) and the
    attention baseline's (``attention``: the clips' text-to-AV attention)."""
    sweep = {}
    for rho in retentions:
        runs = []
        for seed in range(seeds):
            captions = captioner.caption(test, keep=random_keeps(test, rho, seed))
            runs.append(modality_cider(captions, test))
            bar.update(1)
        row = {}
        for key in runs[0]:
            values = [r[key] for r in runs]
            row[key] = float(np.mean(values))
            row[key + "_std"] = float(np.std(values))
        captions = captioner.caption(test, keep=attention_keeps(test, attention, rho))
        row["attention"] = modality_cider(captions, test)
        bar.update(1)
        sweep[f"{rho:g}"] = row
    return sweep


def gain_phenomena(captioner, sample, scorer, attention, n_frames, *, base_retention: float,
                   base_sets: int, progress: bool) -> dict:
    """The phenomena read from each ``sample`` clip's counterfactual gains, against its
    attention (``attention``: the suffix's, in the clips' order; the last token's is computed
    here), its tokens' roles and its kind of audio."""
    gains, atts, atts_last, roles, kinds = [], [], [], [], []
    last = captioner.text_to_av_attention(sample, query="last")
    for index, clip in enumerate(progress_bar(sample, desc="counterfactual gains", unit="clip",
                                              disable=not progress, leave=False)):
        gains.append(counterfactual_gains(captioner, clip, scorer, base_retention=base_retention,
                                          base_sets=base_sets, seed=0))
        atts.append(attention[index].numpy())
        atts_last.append(last[index].numpy())
        vr, ar = clip.annotations.get("visual_role"), clip.annotations.get("audio_role")
        roles.append(None if vr is None or ar is None else
                     np.concatenate([vr.numpy(), 10 + ar.numpy()]))
        kinds.append(clip.info.get("audio", "unknown"))
    return _phenomena(sample, gains, atts, atts_last, roles, kinds, n_frames)


def _finite(values, reduce) -> float:
    """``reduce`` over the finite values (a clip whose gains are all equal has no rank
    correlation); NaN when there are none."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(reduce(values)) if len(values) else float("nan")


def share_of(part: float, whole: float) -> float:
    return part / whole if whole > 0 else float("nan")


def _phenomena(clips, gains, atts, atts_last, roles, kinds, n_frames) -> dict:
    out: dict = {}
    per_clip = [spearman(a[~np.isnan(g)], g[~np.isnan(g)]) for a, g in zip(atts, gains)]
    per_clip_last = [spearman(a[~np.isnan(g)], g[~np.isnan(g)])
                     for a, g in zip(atts_last, gains)]
    g_all, a_all = np.concatenate(gains), np.concatenate(atts)
    ok = ~np.isnan(g_all)
    g_all, a_all = g_all[ok], a_all[ok]
    top = a_all >= np.quantile(a_all, 0.9)
    critical = g_all >= CRITICAL_GAIN
    out["attention_vs_gain"] = {
        "spearman_per_clip_mean": _finite(per_clip, np.mean),
        "spearman_per_clip_median": _finite(per_clip, np.median),
        "spearman_pooled": spearman(a_all, g_all),
        "spearman_per_clip_mean_last_token": _finite(per_clip_last, np.mean),
        "top_decile_attention_negligible_gain_share": float((g_all[top] < NEGLIGIBLE_GAIN).mean()),
        "critical_tokens": int(critical.sum()),
        "critical_below_median_attention_share":
            float((a_all[critical] < np.median(a_all)).mean()) if critical.any() else None,
    }
    nv = [c.n_visual for c in clips]
    visual_gain = np.concatenate([g[:n] for g, n in zip(gains, nv)])
    visual_gain = visual_gain[~np.isnan(visual_gain)]
    out["visual_negligible_gain_share"] = float((np.abs(visual_gain) < NEGLIGIBLE_GAIN).mean())
    audio = {}
    for kind in sorted(set(kinds)):
        chosen = [g[n:] for g, n, k in zip(gains, nv, kinds) if k == kind]
        values = np.concatenate(chosen)
        values = values[~np.isnan(values)]
        audio[kind] = {"clips": len(chosen),
                       "critical_share": float((values >= CRITICAL_GAIN).mean())}
    every = np.concatenate([g[n:] for g, n in zip(gains, nv)])
    every = every[~np.isnan(every)]
    audio["all"] = {"clips": len(clips), "critical_share": float((every >= CRITICAL_GAIN).mean())}
    out["audio_critical"] = audio
    visual_every = np.concatenate([g[:n] for g, n in zip(gains, nv)])
    visual_every = visual_every[~np.isnan(visual_every)]
    out["visual_critical_share"] = float((visual_every >= CRITICAL_GAIN).mean())
    if all(r is not None for r in roles):
        names = {0: "visual scene", 1: "visual subject", 2: "visual artifact",
                 3: "visual distractor", 10: "audio silence", 11: "audio event",
                 12: "audio music", 13: "audio distractor"}
        r_all = np.concatenate(roles)[ok]
        table = {}
        for code, name in names.items():
            mask = r_all == code
            if mask.any():
                table[name] = {"tokens": int(mask.sum()),
                               "attention_mean": float(a_all[mask].mean()),
                               "gain_mean": float(g_all[mask].mean()),
                               "critical_share": float((g_all[mask] >= CRITICAL_GAIN).mean())}
        out["by_role"] = table
        audio_roles = np.concatenate([r[n:] for r, n in zip(roles, nv)]) - 10
        out["audio_content_token_share"] = float(np.isin(audio_roles, (1, 2)).mean())
    kinds_all = [c.info.get("audio") for c in clips]
    out["audio_kinds_in_sample"] = {k: kinds_all.count(k) for k in sorted(set(map(str,
                                                                                  kinds_all)))}
    return out


def _summarise_additivity(rows: list, group: int) -> dict:
    out = {"group_size": group, "clips": len(rows)}
    for name, chosen in (("own_sound", [r for r in rows if r["own"]]),
                         ("background_sound", [r for r in rows if not r["own"]])):
        if not chosen:
            continue
        dev = np.array([r["deviation"] for r in chosen])
        out[name] = {"clips": len(chosen),
                     "mean_gain_visual": float(np.mean([r["d_v"] for r in chosen])),
                     "mean_gain_audio": float(np.mean([r["d_a"] for r in chosen])),
                     "mean_gain_both": float(np.mean([r["d_av"] for r in chosen])),
                     "mean_deviation": float(dev.mean()),
                     "mean_abs_deviation": float(np.abs(dev).mean()),
                     "share_abs_deviation_over_5": float((np.abs(dev) > 5).mean())}
    return out


def _machine() -> dict:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.cuda.is_available(), "python": platform.python_version()}
