"""Pruned vs full prefill (and end-to-end generation) of a small Qwen2, batch 1.

Tokens: 256 visual + 64 audio + 24 text (the profiling suite's layout); AVEX keeps 40% of the AV
tokens. Baseline: the full-token prefill. Compared: the AVEX path, scoring with a random policy,
Top-K selection, compaction and the prefill of the pruned sequence. The end-to-end group adds
a forced decode of 16 tokens. On CUDA the model runs in bf16, on a CPU in float32. On CUDA
also: the packed (varlen) prefill of 16 ragged samples against padded SDPA, for equality and time.
"""
import pytest
import torch
from transformers import Qwen2Config

from avex.profiling import ProfileSettings, token_layout
from avex.profiling.flops import build_model
from avex.profiling.suite import _policy
from avex import pruning
from avex.pruning import generate, prune_inputs
from conftest import DEVICE, synchronized

RETENTION, DECODE = 0.4, 16
CONFIG = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    cfg = Qwen2Config(**CONFIG)
    model = build_model(cfg, dtype=dtype, device=DEVICE)
    policy = _policy(cfg, 128, device=DEVICE)
    modality = token_layout(ProfileSettings()).to(DEVICE)
    embeds = torch.randn(1, modality.shape[1], cfg.hidden_size, device=DEVICE, dtype=dtype)
    return model, policy, embeds, modality


def _inputs(impl, policy, embeds, modality):
    if impl.startswith("full"):
        return prune_inputs(embeds, modality, keep=modality >= 0)
    scores = policy(embeds, modality)
    return prune_inputs(embeds, modality, scores=scores, retention=RETENTION)


IMPLS = ["full-tokens (baseline)", "avex-40%"]


def _info(benchmark, impl, group):
    benchmark.group = f"{group} small Qwen2 (4 layers, width 256) L=344 batch 1"
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["baseline"] = impl.endswith("(baseline)")
    if DEVICE.type == "cuda":
        benchmark.extra_info["device_name"] = torch.cuda.get_device_name()


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill(benchmark, setup, impl):
    model, policy, embeds, modality = setup
    _info(benchmark, impl, "prefill")

    @torch.inference_mode()
    def step():
        pruned = _inputs(impl, policy, embeds, modality)
        out = model(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                    position_ids=pruned.position_ids, use_cache=True, logits_to_keep=1)
        return pruned, out.logits

    pruned, logits = benchmark(synchronized(step))
    assert pruned.inputs_embeds.shape[1] == (344 if impl.startswith("full") else 24 + 128)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_end_to_end(benchmark, setup, impl):
    model, policy, embeds, modality = setup
    _info(benchmark, impl, f"end-to-end ({DECODE} decoded tokens)")

    @torch.inference_mode()
    def step():
        pruned = _inputs(impl, policy, embeds, modality)
        return generate(model, pruned, max_new_tokens=DECODE, min_new_tokens=DECODE,
                        do_sample=False)

    tokens = benchmark.pedantic(synchronized(step), rounds=5, warmup_rounds=1)
    assert tokens.shape == (1, DECODE)


# P7: the packed (varlen) prefill against padded SDPA, batch 16 with ragged kept lengths -------

VARLEN_BATCH = 16
VARLEN_IMPLS = ["padded SDPA (baseline)", "packed, generate's varlen path"]


@pytest.fixture(scope="module")
def ragged(setup):
    """16 samples of the profiling layout, each keeping its own random share (10-60%) of its
    AV tokens: kept lengths from ~50 to ~220."""
    model, _, _, modality = setup
    gen = torch.Generator().manual_seed(1)
    modality = modality.expand(VARLEN_BATCH, -1).contiguous()
    embeds = torch.randn(*modality.shape, model.config.hidden_size, generator=gen).to(
        DEVICE, model.dtype)
    share = torch.rand(VARLEN_BATCH, 1, generator=gen) * 0.5 + 0.1
    keep = (torch.rand(modality.shape, generator=gen) < share).to(DEVICE) | (modality == 2)
    return prune_inputs(embeds, modality, keep=keep)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="packed prefill kernels (flash-attn, "
                    "torch's varlen_attn) run on CUDA only; the CPU path is the SDPA reference")
@pytest.mark.parametrize("impl", VARLEN_IMPLS)
def test_varlen_prefill_vs_padded(benchmark, setup, ragged, impl):
    """The prompt minus its last token into a generate-ready cache, both ways; the packed path
    (flash-attn if installed, else torch's varlen_attn) must give the padded path's keys and
    values at every real token, within bf16 rounding."""
    model = setup[0]
    attention = pruning.packed_attention(ragged.inputs_embeds.device, model.dtype)
    _info(benchmark, impl, f"prefill to a cache, batch {VARLEN_BATCH} ragged (kept lengths "
          f"{int(ragged.attention_mask.sum(1).min())}-{int(ragged.attention_mask.sum(1).max())})")
    benchmark.extra_info["packed_attention"] = attention

    @torch.inference_mode()
    def padded():
        return model(inputs_embeds=ragged.inputs_embeds[:, :-1],
                     attention_mask=ragged.attention_mask[:, :-1],
                     position_ids=ragged.position_ids[:, :-1], use_cache=True,
                     logits_to_keep=1).past_key_values

    @torch.inference_mode()
    def packed():
        return pruning._varlen_prefill(model, ragged, 1)

    cache = benchmark(synchronized(packed if impl.startswith("packed") else padded))
    want = padded()
    mask = ragged.attention_mask[:, :-1].bool()
    for layer, ref in zip(cache.layers, want.layers):
        for got, exp in ((layer.keys, ref.keys), (layer.values, ref.values)):
            torch.testing.assert_close(got.transpose(1, 2)[mask].float(),
                                       exp.transpose(1, 2)[mask].float(), rtol=1.6e-2,
                                       atol=2e-2)
