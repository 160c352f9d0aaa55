"""The profiling suite: FLOPs against hand counts, the table on a CPU, argument errors."""
import json
import math

import pytest
import torch
from torch import nn
from transformers import Qwen2Config

from avex.kernels import compact, gumbel_topk
from avex.profiling import flops as F
from avex.profiling import profile
from avex.profiling.__main__ import main

# hidden 64, 4 heads of 16 (2 KV heads), MLP 128, vocabulary 128, 3 layers
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def tiny_config():
    return Qwen2Config(**TINY)


def test_tiny_llm_flops_equal_the_hand_count():
    cfg = tiny_config()
    models = (F.build_model(cfg, 1), F.build_model(cfg, 2))
    p, n = 20, 5
    got = F.llm_flops(models, cfg, p, n)
    # per layer and token: q 64x64, k 64x32, v 64x32, o 64x64, MLP 3 x 64x128 = 36864 MACs
    per_token = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert per_token == 36864
    # attention: QK^T + AV over 4 heads of 16 = 128 MACs per (query, key) pair, causal
    prefill = 3 * (per_token * p + 128 * (p * (p + 1) // 2)) + 64 * 128   # + LM head, 1 token
    # 4 decode steps (the 1st token comes from the prefill), step t sees p + t keys
    decode = 4 * (3 * per_token + 64 * 128) + 3 * 128 * sum(p + t for t in range(1, 5))
    assert got.prefill == prefill == 2300672
    assert got.decode == decode
    ref = F.analytic_llm_flops(cfg, p, n)
    assert (ref.prefill, ref.decode) == (prefill, decode)
    # one decoder layer alone (FastV-AV's extra full-token layers)
    assert F.layer_prefill_flops(models, p) == per_token * p + 128 * (p * (p + 1) // 2)


def test_sdpa_and_custom_op_handles():
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


def test_table_on_cpu_at_a_tiny_configuration(tmp_path):
    cfg_dir = tmp_path / "tiny"
    tiny_config().save_pretrained(cfg_dir)
    out = tmp_path / "out"
    res = profile(backbone=str(cfg_dir), retention=0.5, visual_tokens=16, audio_tokens=8,
                  text_before=2, text_after=4, decode_tokens=4, device="cpu", runs=2, warmup=0,
                  policy_hidden_size=0, out_dir=str(out), name="tiny", progress=False)
    fl = res["flops"]["rows"]
    assert fl["full"]["prefill_tokens"] == 30 and fl["avex"]["prefill_tokens"] == 18
    assert fl["avex"]["llm_prefill"] < fl["full"]["llm_prefill"]
    assert fl["avex"]["policy"] > 0 and fl["full"]["policy"] == 0
    assert fl["fastv"]["prefill_tokens"] == 18 and fl["fastv"]["llm_prefill"] == \
        fl["avex"]["llm_prefill"] and fl["fastv"]["policy"] > 0
    assert set(res["latency"]["rows"]) == {"full", "avex"}   # FastV-AV: FLOPs only
    for c in res["flops"]["cross_check"].values():
        assert abs(c["relative_difference"]) < 1e-12
    lat = res["latency"]["rows"]
    for m in ("full", "avex"):
        assert lat[m]["generated_tokens"] == 4
        assert lat[m]["prefill_ms"] > 0 and lat[m]["e2e_ms"] > lat[m]["prefill_ms"]
    assert lat["avex"]["policy_ms"] > 0 and lat["avex"]["prefill_tokens"] == 18
    assert lat["full"]["memory_gb"] is None and lat["full"]["cpu_rss_growth_gb"] >= 0
    md = (out / "profiling-tiny.md").read_text()
    assert "| Full tokens | 30 |" in md and "| AVEX-Prune | 18 |" in md
    assert "1 multiply-add = 1 flop" in md and "Prefill (ms)" in md
    data = json.loads((out / "profiling-tiny.json").read_text())
    assert data["flops"]["rows"]["avex"]["prefill_tokens"] == 18
    assert (out / "profiling-tiny.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("retention", [0.0, -0.1, 1.5, math.nan])
def test_retention_outside_0_1_is_an_error(retention, tmp_path):
    with pytest.raises(ValueError, match=r"retention must be in \(0, 1\]"):
        profile(retention=retention, out_dir=str(tmp_path), progress=False)


def test_unknown_backbone_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="qwen2-7b.*'gpt-9'"):
        profile(backbone="gpt-9", out_dir=str(tmp_path), progress=False)
    assert main(["--backbone", "gpt-9", "--out-dir", str(tmp_path)]) == 2
    assert "'gpt-9'" in capsys.readouterr().err
    assert main(["--retention", "1.2", "--out-dir", str(tmp_path)]) == 2
    assert "retention must be in (0, 1], got 1.2" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_scaled_config_keeps_head_size_and_vocabulary():
    from avex.backbones import backbone_config
    from avex.profiling import scaled_config

    c = scaled_config(backbone_config("qwen2-7b"))
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (512, 4, 152064)
    assert c.head_dim == 128 and c.num_attention_heads == 4
