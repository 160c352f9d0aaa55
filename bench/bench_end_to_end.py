"""End to end, AVEX at 40% retention against full tokens, measured in alternating rounds.

Baseline: full tokens (``prune_inputs`` with every token kept, then ``generate``). Compared:
the AVEX path: policy scores, Top-K, compaction, prefill of the pruned sequence and a forced
greedy decode. Both run once per round, in turn (A B, B A, ...), in one process; each figure is
the median of the per-round ratios AVEX / full with its interquartile range, and every stage's
median and share: policy, selection, compaction, prefill, decode (per step). The measurement is
``avex.profiling.latency.measure``, the one the profiling suite's latency table uses.

Three sizes, on CUDA in bf16, on a CPU in float32 on ``OMP_NUM_THREADS`` threads (else 1; see
``avex.profiling.latency``):

* the small Qwen2: 4 layers, width 256, vocabulary 8192; 256 visual + 64 audio + 24 text tokens
  (L = 344), batch 1, 16 decoded tokens;
* qwen2-7b as the profiling suite scales it for a CPU: width 512, 4 layers, the real vocabulary
  (152064); the same tokens, batch 1, 32 decoded tokens;
* the small Qwen2 at batch 8 with ragged lengths (232 to 344 tokens, left-padded), 16 decoded;
* the CPU-scaled qwen2-7b at batch 8 with the same ragged lengths, 32 decoded tokens.

pytest-benchmark's own time for an entry is the whole measurement; the figures are in its
``extra_info["paired"]``, which ``bench/summarize.py`` turns into a table.
"""
import pytest
import torch
from transformers import Qwen2Config

from avex.backbones import backbone_config
from avex.modality import PAD
from avex.profiling import ProfileSettings, scaled_config, token_layout
from avex.profiling.latency import measure
from avex.profiling.suite import latency_inputs
from conftest import DEVICE

RETENTION = 0.4
SMALL_QWEN2 = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)


def ragged_layout(batch: int) -> torch.Tensor:
    """modality [batch, 344]: row i has 256 - 12 i visual and 64 - 4 i audio tokens, the 24 text
    tokens of the suite's layout around them, left-padded."""
    rows = [token_layout(ProfileSettings(visual_tokens=256 - 12 * i, audio_tokens=64 - 4 * i))[0]
            for i in range(batch)]
    width = max(len(r) for r in rows)
    return torch.stack([torch.cat([torch.full((width - len(r),), PAD), r]) for r in rows])


def small_qwen2(batch):
    return Qwen2Config(**SMALL_QWEN2), 128, token_layout(ProfileSettings()) if batch == 1 \
        else ragged_layout(batch)


def qwen2_7b_cpu_scaled(batch):
    return scaled_config(backbone_config("qwen2-7b")), 128, token_layout(ProfileSettings()) \
        if batch == 1 else ragged_layout(batch)


# id: (description, set-up, batch, decoded tokens, rounds)
SIZES = {
    "small-qwen2": ("small Qwen2 (4 layers, width 256) L=344 batch 1", small_qwen2, 1, 16, 20),
    "qwen2-7b-cpu-scaled": ("qwen2-7b CPU-scaled (4 layers, width 512, vocab 152064) L=344 "
                            "batch 1", qwen2_7b_cpu_scaled, 1, 32, 10),
    "small-qwen2-batch8-ragged": ("small Qwen2 (4 layers, width 256) batch 8 ragged "
                                  "L=232..344", small_qwen2, 8, 16, 10),
    "qwen2-7b-cpu-scaled-batch8-ragged": ("qwen2-7b CPU-scaled (4 layers, width 512, vocab "
                                          "152064) batch 8 ragged L=232..344",
                                          qwen2_7b_cpu_scaled, 8, 32, 10),
}


@pytest.mark.parametrize("size_id", list(SIZES))
def test_end_to_end_avex_vs_full(benchmark, size_id):
    size, make, batch, decode, rounds = SIZES[size_id]
    config, policy_width, modality = make(batch)
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    model, policy, embeds, modality = latency_inputs(config, policy_width, modality, dtype=dtype,
                                                     device=DEVICE)
    benchmark.group = f"end to end, paired rounds: {size}"
    benchmark.extra_info["impl"] = "full tokens vs avex-40% (whole paired measurement)"
    if DEVICE.type == "cuda":
        benchmark.extra_info["device_name"] = torch.cuda.get_device_name()

    def run():
        return measure(model, policy, embeds, modality, retention=RETENTION,
                       decode_tokens=decode, runs=rounds, warmup=1, memory=False)

    rows = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["paired"] = dict(size=size, batch=batch, decode_tokens=decode,
                                          dtype=str(dtype).replace("torch.", ""), rows=rows)
    full, avex = rows["full"], rows["avex"]
    assert full["prefill_tokens"] == modality.shape[1]
    assert avex["prefill_tokens"] < full["prefill_tokens"]
    assert full["decode_steps"] == avex["decode_steps"] == decode - 1
    assert avex["vs_full"]["e2e"]["n"] == rounds
