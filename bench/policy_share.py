"""The policy's share of AVEX's end to end at batch 8 with ragged lengths, before and after
the policy reads only the AV tokens and the text (issue 24): the same process, the same random
model and inputs as bench_end_to_end.py's batch-8 sizes, measured with
``avex.profiling.latency.measure`` once with the full-sequence scoring (``AVEXPolicy.forward``,
what serving ran before) and once with ``AVEXPolicy.score`` (what it runs now).

    OMP_NUM_THREADS=1 python bench/policy_share.py

Prints one line per size and path: the policy's median ms, its share of the stages' sum, AVEX's
end to end and its per-round ratio to full tokens.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_end_to_end import RETENTION, SIZES  # noqa: E402

from avex.policy import AVEXPolicy  # noqa: E402
from avex.profiling.latency import measure  # noqa: E402
from avex.profiling.suite import latency_inputs  # noqa: E402

GATHERED = AVEXPolicy.score


def full_sequence(self, inputs_embeds, modality):
    with torch.no_grad():
        return self.forward(inputs_embeds, modality)


def main():
    for size_id in ("small-qwen2-batch8-ragged", "qwen2-7b-cpu-scaled-batch8-ragged"):
        size, make, batch, decode, rounds = SIZES[size_id]
        config, width, modality = make(batch)
        model, policy, embeds, modality = latency_inputs(config, width, modality,
                                                         dtype=torch.float32,
                                                         device=torch.device("cpu"))
        for name, score in (("full sequence (before)", full_sequence),
                            ("gathered (after)", GATHERED)):
            AVEXPolicy.score = score
            try:
                rows = measure(model, policy, embeds, modality, retention=RETENTION,
                               decode_tokens=decode, runs=rounds, warmup=1, memory=False)
            finally:
                AVEXPolicy.score = GATHERED
            avex = rows["avex"]
            print(json.dumps({"size": size, "policy": name,
                              "policy_ms": round(avex["stages_ms"]["policy"], 1),
                              "share": round(avex["shares"]["policy"], 3),
                              "e2e_ms": round(avex["e2e_ms"], 1),
                              "e2e_vs_full": round(avex["vs_full"]["e2e"]["median"], 3)}),
                  flush=True)


if __name__ == "__main__":
    main()
