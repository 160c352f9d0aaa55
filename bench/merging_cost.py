"""Serving cost of merging the dropped tokens (avex/merging.py) against serving without it.

Two policies with the same weights and the default's selection (set-aware, redundancy 4), one
saved without a merge threshold and one with ``merge_threshold`` 0.8, serve
``avex.pruning.prune_inputs(policy=)`` (the policy's call, the selection, the merge where it
has one, the compaction) on the same random inputs, at the sizes of
``bench/set_aware_selection.py``:

* ``benchmark``: M = 80 AV tokens (64 visual + 16 audio), a 20-token prompt, width 128, the
  embedded recipe's policy sizes; B = 1 and B = 16;
* ``video``: M = 2000 (1728 visual + 272 audio), a 32-token prompt, width 3584, the paper
  preset's compact policy (hidden 768); B = 1.

Half of each modality's tokens are noisy copies of the other half, so that merges happen.
Each round times both in turn (order reversed every other round) and ``merge_dropped`` alone
on the kept set. Prints a Markdown table: medians in ms and the median of the per-round ratios
merged / unmerged with its IQR.

    OMP_NUM_THREADS=1 python bench/merging_cost.py [--rounds-benchmark 30] [--rounds-video 5]
"""
import argparse
import dataclasses
import platform
import subprocess
from pathlib import Path

import torch

from avex.merging import merge_dropped
from avex.modality import AUDIO, VISUAL
from avex.policy import AVEXPolicy, PolicyConfig
from avex.profiling.latency import alternate, paired_ratio, spread, timed
from avex.pruning import prune_inputs, select_keep
# the same sizes and token layout as the set-aware selection's bench (run from bench/)
from set_aware_selection import SIZES, inputs as random_inputs

THRESHOLD = 0.8
RETENTIONS = (0.1, 0.2, 0.4)


def policies(width: int, sizes: dict):
    torch.manual_seed(0)
    plain = AVEXPolicy(PolicyConfig(input_size=width, **sizes, selection="set-aware",
                                    redundancy=4.0)).eval()
    merging = AVEXPolicy(dataclasses.replace(plain.config, merge_threshold=THRESHOLD)).eval()
    merging.load_state_dict(plain.state_dict())
    return plain, merging


def inputs(visual: int, audio: int, prompt: int, width: int, batch: int):
    embeds, modality = random_inputs(visual, audio, prompt, width, batch)
    for code in (VISUAL, AUDIO):   # the second half of a modality: copies of the first, noisy
        cols = torch.nonzero(modality[0] == code).flatten()
        half = len(cols) // 2
        embeds[:, cols[half:2 * half]] = embeds[:, cols[:half]] \
            + 0.2 * torch.randn(batch, half, width)
    return embeds, modality


def rows_for(name: str, rounds: int) -> None:
    visual, audio, prompt, width, sizes, batches = SIZES[name]
    plain, merging = policies(width, sizes)
    cpu = torch.device("cpu")
    for batch in batches:
        embeds, modality = inputs(visual, audio, prompt, width, batch)
        for retention in RETENTIONS:
            keep = select_keep(embeds, modality, policy=plain, retention=retention)
            runs = {
                "plain": timed(lambda: prune_inputs(embeds, modality, policy=plain,
                                                    retention=retention), cpu),
                "merged": timed(lambda: prune_inputs(embeds, modality, policy=merging,
                                                     retention=retention), cpu),
                "merge alone": timed(lambda: merge_dropped(embeds, modality, keep, THRESHOLD),
                                     cpu),
            }
            got = alternate(runs, rounds)
            med = {key: spread(r["ms"] for r in got[key])["median"] for key in got}
            ratio = paired_ratio(got["merged"], got["plain"])
            print(f"| {name} | {visual + audio} | {batch} | {retention:.0%} | "
                  f"{med['plain']:.3g} | {med['merged']:.3g} | "
                  f"{ratio['median']:.2f} ({ratio['q1']:.2f}-{ratio['q3']:.2f}) | "
                  f"{med['merge alone']:.3g} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds-benchmark", type=int, default=30)
    parser.add_argument("--rounds-video", type=int, default=5)
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), python "
          f"{platform.python_version()}, commit {commit}\n")
    print("| size | M | B | rho | prune_inputs ms | merged ms | ratio (IQR) | "
          "merge_dropped alone ms |")
    print("|---|---|---|---|---|---|---|---|")
    rows_for("benchmark", args.rounds_benchmark)
    rows_for("video", args.rounds_video)


if __name__ == "__main__":
    main()
