"""P7: the packed (varlen) prefill against padded SDPA, batch 16 with ragged kept lengths.

Model: a small Qwen2 (4 layers, width 256), bf16 on CUDA. Each of the 16 samples keeps its own
random share (10-60%) of the profiling layout's 320 AV tokens, plus its 24 text tokens. Baseline:
the padded prefill (the model's SDPA over the left-padded batch). Compared: ``generate``'s varlen
path (flash-attn if installed, else ``torch.nn.attention.varlen.varlen_attn``), which packs the
kept tokens with ``cu_seqlens``. Both fill a generate-ready cache; the keys and values must agree
at every real token within bf16 rounding. CUDA only: on a CPU the packed path is the SDPA
reference, which would time nothing of interest.
"""
import pytest
import torch
from transformers import Qwen2Config

from avex import pruning
from avex.pruning import generation
from avex.profiling import ProfileSettings, token_layout
from avex.profiling.flops import build_model
from avex.pruning import prune_inputs
from conftest import DEVICE, label, synchronized

BATCH = 16
CONFIG = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
IMPLS = ["padded SDPA (baseline)", "packed, generate's varlen path"]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = build_model(Qwen2Config(**CONFIG), dtype=torch.bfloat16, device=DEVICE)
    gen = torch.Generator().manual_seed(1)
    modality = token_layout(ProfileSettings()).expand(BATCH, -1).contiguous()
    embeds = torch.randn(*modality.shape, model.config.hidden_size, generator=gen)
    share = torch.rand(BATCH, 1, generator=gen) * 0.5 + 0.1
    keep = (torch.rand(modality.shape, generator=gen) < share) | (modality == 2)
    ragged = prune_inputs(embeds.to(DEVICE, model.dtype), modality.to(DEVICE),
                          keep=keep.to(DEVICE))
    return model, ragged


@pytest.mark.skipif(DEVICE.type != "cuda", reason="packed prefill kernels (flash-attn, "
                    "torch's varlen_attn) run on CUDA only; the CPU path is the SDPA reference")
@pytest.mark.parametrize("impl", IMPLS)
def test_varlen_prefill_vs_padded(benchmark, setup, impl):
    model, ragged = setup
    lengths = ragged.attention_mask.sum(1)
    label(benchmark, f"prefill to a cache, batch {BATCH} ragged (kept lengths "
          f"{int(lengths.min())}-{int(lengths.max())})", impl)
    benchmark.extra_info["packed_attention"] = pruning.packed_attention(
        ragged.inputs_embeds.device, model.dtype)

    @torch.inference_mode()
    def padded():
        return model(inputs_embeds=ragged.inputs_embeds[:, :-1],
                     attention_mask=ragged.attention_mask[:, :-1],
                     position_ids=ragged.position_ids[:, :-1], use_cache=True,
                     logits_to_keep=1).past_key_values

    @torch.inference_mode()
    def packed():
        return generation._varlen_prefill(model, ragged, 1)

    cache = benchmark(synchronized(packed if impl.startswith("packed") else padded))
    want = padded()
    mask = ragged.attention_mask[:, :-1].bool()
    for layer, ref in zip(cache.layers, want.layers):
        for got, exp in ((layer.keys, ref.keys), (layer.values, ref.values)):
            torch.testing.assert_close(got.transpose(1, 2)[mask].float(),
                                       exp.transpose(1, 2)[mask].float(), rtol=1.6e-2,
                                       atol=2e-2)
