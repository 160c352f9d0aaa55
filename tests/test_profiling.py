"""The profiling suite: FLOPs against hand counts, the table on a CPU, argument errors."""
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Qwen2Config

from avex.kernels import compact, gumbel_topk
from avex.profiling import ProfileSettings, profile, token_layout
from avex.profiling import flops as F
from avex.profiling import latency
from avex.profiling import suite
from avex.profiling import methods as M
from avex.profiling.__main__ import main
from avex.profiling.latency import (alternate, cpu_peak_bytes, measure, paired_ratio, spread,
                                    timing_threads, timing_threads_set)
from badinput import exits_with_usage_error

# hidden 64, 4 heads of 16 (2 KV heads), MLP 128, vocabulary 128, 3 layers
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def tiny_config():
    return Qwen2Config(**TINY)


FVCORE_MISSING = F.fvcore_missing()   # the GPU image: the hand counts stand in


def fvcore_part():
    """Called where a test's hand-count checks are done and its fvcore comparison begins."""
    if FVCORE_MISSING:
        pytest.skip(f"the hand counts were checked; no fvcore count to compare: {FVCORE_MISSING}")


def test_tiny_llm_flops_equal_the_hand_count():
    cfg = tiny_config()
    p, n = 20, 5
    # per layer and token: q 64x64, k 64x32, v 64x32, o 64x64, MLP 3 x 64x128 = 36864 MACs
    per_token = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert per_token == 36864
    # attention: QK^T + AV over 4 heads of 16 = 128 MACs per (query, key) pair, causal
    prefill = 3 * (per_token * p + 128 * (p * (p + 1) // 2)) + 64 * 128   # + LM head, 1 token
    # 4 decode steps (the 1st token comes from the prefill), step t sees p + t keys
    decode = 4 * (3 * per_token + 64 * 128) + 3 * 128 * sum(p + t for t in range(1, 5))
    ref = F.analytic_llm_flops(cfg, p, n)
    assert (ref.prefill, ref.decode) == (prefill, decode) and prefill == 2300672
    # one decoder layer alone: causal, or dense as eager attention computes it
    assert F.analytic_layer_flops(cfg, p) == per_token * p + 128 * (p * (p + 1) // 2)
    assert F.analytic_layer_flops(cfg, p, causal=False) == per_token * p + 128 * p * p
    fvcore_part()
    models = (F.build_model(cfg, 1), F.build_model(cfg, 2))
    got = F.llm_flops(models, cfg, p, n)
    assert got.prefill == prefill
    assert got.decode == decode


@pytest.mark.parametrize("width", [0, 128])   # as wide as the LLM (64), or wider: projections
def test_policy_flops_equal_the_hand_count(width):
    cfg = tiny_config()
    policy = suite._policy(cfg, width)
    modality = token_layout(ProfileSettings(visual_tokens=16, audio_tokens=8, text_before=2,
                                            text_after=4))
    L = 30   # the policy reads every position
    w, heads = (64, 4) if width == 0 else (128, 2)
    assert (policy.config.hidden_size, policy.config.num_heads) == (w, heads)
    kv = 32 if width == 0 else 128   # matched: the LLM's 2 KV heads of 16; else no grouping
    mlp = 128 if width == 0 else 3 * w   # SwiGLU width: the LLM's when matched, else 3 x width
    per_token = ((0 if width == 0 else 2 * 64 * w)                 # av_in, text_in
                 + 46 * w                                         # 2 x 23 position features
                 + 2 * (2 * w * w + 2 * w * kv + 3 * w * mlp)     # 2 encoder blocks
                 + 4 * w * w + 2 * w * mlp + w * w + w)           # cross-attn, token MLP, head
    hand = per_token * L + 3 * L * L * 2 * w + 2 * 5 * w * L      # 3 dense attentions, 2 LNs
    assert hand == (3772800 if width == 0 else 19587840)
    got = F.policy_flops(policy, 64, modality, 0.5, traced=False)
    assert got["policy"] == got["policy_analytic"] == hand
    assert got["selection"] == got["selection_analytic"] == 24 * 5   # 24 scores, 5 stages
    fvcore_part()
    traced = F.policy_flops(policy, 64, modality, 0.5)
    assert traced["policy"] == hand and traced["selection"] == 24 * 5


def test_baseline_selection_flops_equal_the_hand_count():
    # 4 layers, so FastAV's rollout spans E = 2 layers (one L x L product)
    cfg = Qwen2Config(**{**TINY, "num_hidden_layers": 4})
    models = (F.build_model(cfg, 1, random_weights=False),
              F.build_model(cfg, 2, random_weights=False))
    # 2 text, 16 visual, 8 audio, 4 text: L = 30, N = 24; rho 0.5 keeps K = 12
    modality = token_layout(ProfileSettings(visual_tokens=16, audio_tokens=8, text_before=2,
                                            text_after=4))
    per_token, pair = 36864, 128
    dense_layer = per_token * 30 + pair * 30 * 30   # eager attention: the full 30 x 30 square
    sort_av = 24 * 5                                # 24 scores, ceil(log2 24) = 5 stages
    # the hand counts first (fvcore where installed: traced=True counts both)
    traced = FVCORE_MISSING is None
    if not traced:
        models = None   # the hand counts need no model

    fastv = F.fastv_flops(models, cfg, modality, 0.5, layer=2, traced=traced)
    assert fastv.analytic == 2 * dense_layer + sort_av == 2442360

    fastav = F.fastav_flops(models, cfg, modality, 0.5, traced=traced)
    # stage 1: 4 layers over 30 tokens; rollout: 1 product of 30 x 30 maps; stage 2: 4 layers
    # over the 6 text + K1 = 24 - ceil(0.5 * 12) = 18 survivors; one sort per stage
    stage2_layer = per_token * 24 + pair * 24 * 24
    fastav_hand = 4 * dense_layer + 30 ** 3 + 4 * stage2_layer + 2 * sort_av
    assert fastav.analytic == fastav_hand == 8745576
    assert fastav.detail["stage2_tokens"] == 24
    assert fastav.detail["stage1_unread_layers"] == 2 * dense_layer

    attention = F.attention_flops(models, cfg, modality, 0.5, traced=traced)
    # the whole model over every token (eager), the LM head at the last position only (the
    # maps are all it reads), then a sort of the 16 visual (4 stages) and 8 audio scores (3)
    head = 1 * TINY["hidden_size"] * TINY["vocab_size"]
    assert attention.analytic == 4 * dense_layer + head + 16 * 4 + 8 * 3
    assert attention.detail == dict(layers=4, prefill_tokens=30)

    tome = F.tome_flops(cfg, modality, 0.5, traced=traced)
    # K = 12 split 8 visual + 4 audio; visual 16 -> 8: one round, 8 x 8 similarities of width
    # 64 and a sort of 8 matches (3 stages); audio 8 -> 4: 4 x 4, a sort of 4 (2 stages)
    assert tome.analytic == 8 * 8 * 64 + 8 * 3 + 4 * 4 * 64 + 4 * 2 == 5152
    assert tome.detail["rounds"] == 2
    fvcore_part()
    for counted in (fastv, fastav, attention, tome):
        assert counted.fvcore == counted.analytic


def test_fastv_on_the_cut_model_selects_the_same_tokens():
    from avex.methods import fastv_selector
    from avex.selection import AVLayout

    torch.manual_seed(0)
    cfg = tiny_config()
    model = F.build_model(cfg)
    modality = token_layout(ProfileSettings(visual_tokens=16, audio_tokens=8, text_before=2,
                                            text_after=4))
    batch = M.av_batch(torch.randn(1, 30, 64), modality)
    layout = AVLayout.of(modality)
    whole = fastv_selector(model, layer=2)(batch, layout, 0.4)
    selector, cut = M.baseline_selector("fastv", model)
    assert len(cut.model.layers) == 2 and len(model.model.layers) == 3
    assert cut.model.layers[1].mlp.up_proj.weight is model.model.layers[1].mlp.up_proj.weight
    assert torch.equal(selector(batch, layout, 0.4), whole) and int(whole.sum()) == 10


def test_sdpa_and_custom_op_handles():
    fvcore_part()
    class Attn(nn.Module):
        def forward(self, q, k, v):
            return (nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                    nn.functional.scaled_dot_product_attention(q, k, v))

    q = torch.randn(2, 3, 5, 8)
    kv = torch.randn(2, 3, 7, 8)
    got = F.count(Attn(), (q, kv, kv))
    causal_pairs = sum(7 - 5 + i + 1 for i in range(5))
    assert got.by_operator["scaled_dot_product_attention"] == 6 * (causal_pairs + 35) * 16

    class Select(nn.Module):
        def forward(self, s, h, keep):
            return torch.ops.avex.topk_select(s, 3), torch.ops.avex.compact(h, keep)

    scores = torch.randn(2, 10)
    hidden = torch.randn(2, 10, 4)
    keep = torch.rand(2, 10) > 0.5
    keep[:, 0] = True
    sel = F.count(Select(), (scores, hidden, keep))
    assert sel.by_operator == {"topk_select": 2 * 10 * 4}   # compaction: handled, 0 flops
    assert not sel.unsupported
    # the custom ops return what the project's kernels return
    assert torch.equal(torch.ops.avex.topk_select(scores, 3),
                       gumbel_topk(scores, 3, sample=False)[0])
    ref = compact(hidden, keep, layout="padded", positions="contiguous", padding_side="left")
    assert torch.equal(torch.ops.avex.compact(hidden, keep), ref.hidden)


def test_table_on_cpu_at_a_tiny_configuration(tmp_path, monkeypatch):
    cfg_dir = tmp_path / "tiny"
    tiny_config().save_pretrained(cfg_dir)
    out = tmp_path / "out"
    counted = []
    count_flops = suite.flops_table
    monkeypatch.setattr(suite, "flops_table", lambda *a, **k: counted.append(a[1]) or
                        count_flops(*a, **k))
    res = profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                  text_before=2, text_after=4, decode_tokens=4, device="cpu", runs=2, warmup=0,
                  policy_hidden_size=0, out_dir=str(out), name="tiny", progress=False)
    fl = res["flops"]["rows"]
    assert len(counted) == 1  # timed at its real size: the FLOPs are counted once, not twice
    assert res["latency"]["flops"] is res["flops"]
    assert list(fl) == ["full", "avex", "fastv", "tome", "fastav", "attention"]
    assert fl["full"]["prefill_tokens"] == 30 and fl["avex"]["prefill_tokens"] == 18
    assert fl["avex"]["llm_prefill"] < fl["full"]["llm_prefill"]
    assert fl["avex"]["policy"] > 0 and fl["full"]["policy"] == 0
    for m in ("fastv", "tome", "fastav", "attention"):
        assert fl[m]["prefill_tokens"] == 18 and fl[m]["llm_prefill"] == fl["avex"]["llm_prefill"]
        assert fl[m]["policy"] > 0
    # FastAV runs the whole decoder twice before its pruned prefill, Attention-AV once
    assert fl["fastav"]["policy"] > fl["full"]["llm_prefill"]
    assert fl["attention"]["policy"] > fl["full"]["llm_prefill"]
    if FVCORE_MISSING is None:
        assert res["flops"]["counted_by"] == "fvcore"
        assert list(res["flops"]["cross_check"]) == list(fl)   # AVEX's policy included
        for c in res["flops"]["cross_check"].values():
            assert abs(c["relative_difference"]) < 1e-12
        assert res["flops"]["cross_check"]["tome"]["covers"].endswith("+ selection")
    else:   # the GPU image: the hand counts (test_flops_table_by_hand_without_fvcore)
        assert res["flops"]["counted_by"] == "hand" and res["flops"]["cross_check"] == {}
    lat = res["latency"]["rows"]
    assert list(lat) == list(fl)   # every method timed
    for m, r in lat.items():
        assert r["generated_tokens"] == 4
        # Separately timed medians on a shared machine: only their presence is checked here,
        # not their order (timings are for benchmarks, not tests).
        assert math.isfinite(r["prefill_ms"]) and r["prefill_ms"] > 0
        assert math.isfinite(r["e2e_ms"]) and r["e2e_ms"] > 0
        assert isinstance(r["memory_bytes"], int) and r["memory_bytes"] > 0
        assert r["prefill_tokens"] == (30 if m == "full" else 18)
        assert r["selection_ms"] > 0 and r["rounds"] == 2 and r["decode_steps"] == 3
        # stages of the same runs: the policy is AVEX's alone, full tokens only compact
        assert ("policy" in r["stages_ms"]) == (m == "avex")
        assert ("selection" in r["stages_ms"]) == (m != "full")
        assert math.isclose(sum(r["shares"].values()), 1.0)
        assert ("vs_full" in r) == (m != "full")
        if m != "full":
            e2e = r["vs_full"]["e2e"]
            assert e2e["n"] == 2 and e2e["q1"] <= e2e["median"] <= e2e["q3"]
    # the full-token run holds more activations and a longer KV cache than AVEX's
    assert lat["full"]["memory_bytes"] > lat["avex"]["memory_bytes"]
    md = (out / "profiling-tiny.md").read_text()
    for row in ("| Full tokens | 30 |", "| AVEX-Prune | 18 |", "| FastV-AV | 18 |",
                "| ToMe-AV | 18 |", "| FastAV | 18 |"):
        assert row in md
    assert "1 multiply-add = 1 flop" in md and "Prefill (ms)" in md and "E2E / full" in md
    assert "at 50% retention, batch 1" in md
    assert ("Counted by hand, not by fvcore" in md) == (FVCORE_MISSING is not None)
    assert "2 alternating rounds" in md and "end to end / full" in md
    assert res["measured"]["commit"] and f"at commit {res['measured']['commit']}" in md
    assert "Peak mem. (MB, run only)" in md and "n/a" not in md
    mem = [line.split("|")[5] for line in md.splitlines() if line.startswith("| ToMe-AV | 0.")]
    assert len(mem) == 1 and float(mem[0]) > 0   # the latency row's memory cell is a number
    data = json.loads((out / "profiling-tiny.json").read_text())
    assert data["flops"]["rows"]["avex"]["prefill_tokens"] == 18
    assert data["latency"]["rows"]["tome"]["memory_bytes"] == lat["tome"]["memory_bytes"]
    assert (out / "profiling-tiny.png").read_bytes()[:4] == b"\x89PNG"


def _flops_only(tmp_path, name, **settings):
    cfg_dir = tmp_path / "tiny"
    if not cfg_dir.exists():
        tiny_config().save_pretrained(cfg_dir)
    return profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                   text_before=2, text_after=4, decode_tokens=4, latency=False,
                   out_dir=str(tmp_path / "out"), name=name, progress=False, **settings)


def test_flops_table_by_hand_without_fvcore(tmp_path, monkeypatch):
    """The GPU image has no fvcore: the hand counts stand in, and the table says so."""
    reason = "fvcore is not installed (simulated)"
    monkeypatch.setattr(F, "fvcore_missing", lambda: reason)
    with pytest.raises(ModuleNotFoundError, match=r"fvcore is not installed \(simulated\)"):
        F.count(nn.Linear(2, 2), (torch.zeros(1, 2),))
    res = _flops_only(tmp_path, "hand")
    fl = res["flops"]
    assert fl["counted_by"] == "hand" and fl["by_hand_because"] == reason
    assert fl["cross_check"] == {}
    cfg = tiny_config()
    for m, row in fl["rows"].items():
        ref = F.analytic_llm_flops(cfg, row["prefill_tokens"], 4)
        assert (row["llm_prefill"], row["decode"]) == (ref.prefill, ref.decode)
        assert row["total"] == ref.prefill + row["policy"] + ref.decode
    assert fl["rows"]["full"]["policy"] == 0 and fl["rows"]["avex"]["policy"] > 0
    assert fl["rows"]["tome"]["policy"] == 5152   # the hand count of test_baseline_...
    md = (tmp_path / "out" / "profiling-hand.md").read_text()
    assert f"**Counted by hand, not by fvcore**: {reason}." in md
    assert "fvcore vs the analytic count" not in md and "| AVEX-Prune | 18 |" in md


def test_hand_table_equals_the_fvcore_table(tmp_path):
    """flops='hand' (the GPU stage's latency call) gives the numbers fvcore gives."""
    by_hand = _flops_only(tmp_path, "hand", flops="hand")["flops"]
    assert by_hand["counted_by"] == "hand" and by_hand["cross_check"] == {}
    assert "flops='hand'" in by_hand["by_hand_because"]
    fvcore_part()
    counted = _flops_only(tmp_path, "fvcore", flops="fvcore")["flops"]
    assert counted["counted_by"] == "fvcore"
    assert by_hand["rows"] == counted["rows"]


def test_flops_fvcore_without_fvcore_is_refused_up_front(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(F, "fvcore_missing", lambda: "fvcore is not installed (simulated)")
    with pytest.raises(ValueError, match=r"flops='fvcore' but fvcore is not installed "
                                         r"\(simulated\); or pass flops='hand'"):
        profile(flops="fvcore", out_dir=str(tmp_path / "out"), progress=False)
    exits_with_usage_error(main, ["--flops", "fvcore", "--out-dir", str(tmp_path / "out")],
                           "fvcore is not installed", capsys)
    with pytest.raises(ValueError, match=r"flops must be one of \['auto', 'fvcore', 'hand'\], "
                                         r"got 'fv'"):
        profile(flops="fv", out_dir=str(tmp_path / "out"), progress=False)
    with pytest.raises(ValueError, match=r"max_seconds must be a finite number > 0, got 0.0"):
        profile(max_seconds=0, out_dir=str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


def test_max_seconds_bounds_the_timed_rounds(tmp_path):
    """A spent time budget stops the rounds after the first (the GPU stage's bound); the table
    says how many ran of how many asked."""
    cfg_dir = tmp_path / "tiny"
    tiny_config().save_pretrained(cfg_dir)
    res = profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                  text_before=2, text_after=4, decode_tokens=2, device="cpu", runs=50,
                  warmup=0, methods=("full", "avex"), flops="hand", max_seconds=1e-6,
                  out_dir=str(tmp_path / "out"), name="bounded", progress=False)
    lat = res["latency"]
    assert lat["runs"] == 1 and lat["runs_asked"] == 50
    assert all(r["rounds"] == 1 for r in lat["rows"].values())
    assert "1 alternating rounds (of 50 asked: the 1e-06 s time budget ran out)" in \
        res["markdown"]


def test_alternate_stops_at_its_deadline():
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or {"ms": 1.0}) for name in "AB"}
    out = alternate(runs, rounds=5, warmup=1, deadline=0.0)   # long past
    assert "".join(calls) == "ABBA" and [len(v) for v in out.values()] == [1, 1]


def test_alternate_reverses_the_order_every_other_round():
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or {"ms": len(calls)}) for name in "AB"}
    out = alternate(runs, rounds=3, warmup=1)
    assert "".join(calls) == "ABBAABBA"
    # warm-up dropped; each round's result kept in order
    assert [r["ms"] for r in out["A"]] == [4, 5, 8] and [r["ms"] for r in out["B"]] == [3, 6, 7]
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        alternate(runs, rounds=0)


def test_paired_ratio_is_the_median_of_per_round_ratios():
    num = [{"ms": v} for v in (2.0, 9.0, 3.0, 5.0)]
    den = [{"ms": v} for v in (4.0, 10.0, 3.0, 4.0)]
    got = paired_ratio(num, den)
    # per round 0.5, 0.9, 1.0, 1.25: the median of ratios, not a ratio of medians (4 / 4)
    assert got["median"] == pytest.approx(0.95) and got["n"] == 4
    assert got["q1"] == pytest.approx(0.8) and got["q3"] == pytest.approx(1.0625)
    assert spread([7.0]) == dict(median=7.0, q1=7.0, q3=7.0, n=1)


def test_timing_threads_follow_omp_num_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert timing_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert timing_threads() == 3
    before = torch.get_num_threads()
    with timing_threads_set(torch.device("cpu"), 1) as used:
        assert used == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_cpu_peak_bytes_follows_allocations_and_frees():
    def run():
        a = torch.empty(1_000_000, dtype=torch.uint8)
        b = torch.empty(2_000_000, dtype=torch.uint8)
        del a
        c = torch.empty(500_000, dtype=torch.uint8)
        del b
        return c

    weights = torch.empty(5_000_000, dtype=torch.uint8)   # allocated before: not counted
    result, peak = cpu_peak_bytes(run)
    assert peak == 3_000_000 and result.numel() == 500_000
    del weights


def test_cpu_peak_memory_grows_with_the_sequence():
    torch.manual_seed(0)
    model = F.build_model(tiny_config())
    peaks = []
    for visual in (16, 128):
        modality = token_layout(ProfileSettings(visual_tokens=visual, audio_tokens=8,
                                                text_before=2, text_after=4))
        embeds = torch.randn(1, modality.shape[1], 64)
        rows = measure(model, None, embeds, modality, retention=0.5, decode_tokens=2, runs=1,
                       warmup=0, methods=("full",))
        peaks.append(rows["full"]["memory_bytes"])
    assert peaks[1] > peaks[0] > 0


def test_unknown_method_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"unknown method 'tome-av'; available: \['full', "
                                         r"'avex', 'fastv', 'tome', 'fastav', 'attention'\]"):
        profile(methods=("full", "tome-av"), out_dir=str(tmp_path), progress=False)
    exits_with_usage_error(main, ["--methods", "full,fastvv", "--out-dir", str(tmp_path)],
                           "unknown method 'fastvv'", capsys)
    with pytest.raises(ValueError, match="methods: none given"):
        profile(methods=(), out_dir=str(tmp_path), progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("retention", [0.0, -0.1, 1.5, math.nan])
def test_retention_outside_0_1_is_an_error(retention, tmp_path):
    with pytest.raises(ValueError, match=r"retention must be in \(0, 1\]"):
        profile(retention=retention, out_dir=str(tmp_path), progress=False)


def test_unknown_backbone_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="qwen2-7b.*'gpt-9'"):
        profile(backbone="gpt-9", out_dir=str(tmp_path), progress=False)
    exits_with_usage_error(main, ["--backbone", "gpt-9", "--out-dir", str(tmp_path)], "'gpt-9'",
                           capsys)
    exits_with_usage_error(main, ["--retention", "1.2", "--out-dir", str(tmp_path)],
                           r"retention must be in \(0, 1\], got 1.2", capsys)
    assert not list(tmp_path.iterdir())


def test_scaled_config_keeps_head_size_and_vocabulary():
    from avex.backbones import backbone_config
    from avex.profiling import scaled_config

    c = scaled_config(backbone_config("qwen2-7b"))
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (512, 4, 152064)
    assert c.head_dim == 128 and c.num_attention_heads == 4


def test_provenance_takes_the_callers_commit(monkeypatch):
    """On a device machine the copy's git metadata need not match its files: bench/gpu.sh
    passes the commit in AVEX_COMMIT, and the tables record that one."""
    monkeypatch.setenv("AVEX_COMMIT", "0123456789abcdef0123")
    assert suite._provenance()["commit"] == "0123456789ab"
    monkeypatch.delenv("AVEX_COMMIT")
    assert suite._provenance()["commit"] != "0123456789ab"



@pytest.mark.parametrize("attention", ["padded", "varlen"])
def test_prefill_ends_with_the_forward_that_yields_the_first_token(monkeypatch, attention):
    """On the packed path ``generate`` prefills in two forwards (the packed pass over all but
    the prompt's last column, then ``model.generate``'s forward of that column): the prefill
    stage holds both, and the decode the remaining decode_tokens - 1 forwards, as on the padded
    path. (The packed path is the default on a GPU, where the count was once one off.)"""
    forwards = []
    original = latency.generate

    def generate(model, pruned, **kwargs):
        handle = model.register_forward_hook(
            lambda _m, _a, kw, _o: forwards.append("cu_seq_lens_q" in kw), with_kwargs=True)
        try:
            return original(model, pruned, attention=attention, **kwargs)
        finally:
            handle.remove()
    monkeypatch.setattr(latency, "generate", generate)
    model, policy, embeds, modality = suite.latency_inputs(
        tiny_config(), 64, token_layout(ProfileSettings(visual_tokens=12, audio_tokens=6,
                                                        text_before=3, text_after=4)))
    rows = measure(model, policy, embeds, modality, retention=0.5, decode_tokens=5, runs=1,
                   warmup=0, memory=False)
    for row in rows.values():
        assert row["decode_steps"] == 4 and row["generated_tokens"] == 5
    # one run per method; each: 5 forwards that yield a token, plus the packed pass if packed
    packed = attention == "varlen"
    assert forwards.count(True) == (2 if packed else 0)
    assert forwards.count(False) == 2 * 5


@pytest.mark.parametrize("flops", ["hand", "fvcore"])
def test_a_set_aware_policy_is_profiled_with_its_own_picks(tmp_path, flops):
    """--selection set-aware: the policy built for the tables selects set-aware, its picks are
    counted by hand on either counter (fvcore then counts the policy and the compaction), and
    the table says what the selection was."""
    if flops == "fvcore":
        fvcore_part()
    top = _flops_only(tmp_path, f"topk-{flops}", flops=flops)["flops"]["rows"]["avex"]
    res = _flops_only(tmp_path, f"aware-{flops}", flops=flops, selection="set-aware",
                      redundancy=4.0)
    row = res["flops"]["rows"]["avex"]
    picks = row["selection_detail"]["set_aware"]
    assert picks["tokens"] == 24 and picks["k"] == 12
    assert picks["flops"] == 24 * picks["width"] * 12   # unit vectors + 11 cosine rows
    # the same policy pass; the Top-K sort's count replaced by the picks'
    assert row["policy"] - top["policy"] == picks["flops"] - F.selection_flops(24)
    assert row["extra_name"] == "policy + set-aware picks + compaction"
    assert res["settings"]["selection"] == "set-aware" and res["settings"]["redundancy"] == 4.0
    md = (tmp_path / "out" / f"profiling-aware-{flops}.md").read_text()
    assert "the set-aware picks (by hand" in md


def test_a_set_aware_profile_times_its_picks(tmp_path):
    cfg_dir = tmp_path / "tiny"
    tiny_config().save_pretrained(cfg_dir)
    res = profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                  text_before=2, text_after=4, decode_tokens=2, runs=1, warmup=0,
                  methods=("full", "avex"), selection="set-aware", redundancy=4.0,
                  flops="hand", out_dir=str(tmp_path / "out"), name="aware", progress=False)
    stages = res["latency"]["rows"]["avex"]["stages_ms"]
    assert stages["policy"] > 0 and stages["selection"] > 0


@pytest.mark.parametrize("settings,match", [
    (dict(redundancy=2.0), "redundancy = 2.0 has no effect with selection 'topk'"),
    (dict(selection="set-aware", redundancy=-1.0), "redundancy must be .*>= 0"),
    (dict(selection="greedy"), "selection"),
])
def test_bad_selection_settings_are_refused(tmp_path, settings, match):
    with pytest.raises(ValueError, match=match):
        profile(out_dir=str(tmp_path), progress=False, **settings)


def test_without_out_dir_the_tables_go_to_a_new_runs_folder_not_results(tmp_path, monkeypatch):
    """The committed tables in results/ are replaced only when --out-dir names it."""
    cfg_dir = tmp_path / "tiny"
    tiny_config().save_pretrained(cfg_dir)
    monkeypatch.chdir(tmp_path)
    res = profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                  text_before=2, text_after=4, decode_tokens=4, device="cpu", latency=False,
                  flops="hand", policy_hidden_size=0, name="tiny", progress=False)
    folders = list((tmp_path / "runs").glob("profiling-*"))
    assert len(folders) == 1 and not (tmp_path / "results").exists()
    assert sorted(p.name for p in folders[0].iterdir()) == \
        ["profiling-tiny.json", "profiling-tiny.md", "profiling-tiny.png"]
    assert res["files"][0] == str(Path("runs") / folders[0].name / "profiling-tiny.md")
