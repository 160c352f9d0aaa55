"""Inference cost of set-aware selection against Top-K (issue #36 item 5).

Two policies with the same weights, one with ``selection="topk"`` and one with
``selection="set-aware"`` (redundancy 2), serve ``avex.pruning.select_keep`` on the same
random inputs: one policy call, then the selection. Two sizes:

* ``benchmark``: the embedded benchmark's rows, M = 80 AV tokens (64 visual + 16 audio), a
  20-token prompt, width 128 and the policy the pilot trained (hidden 128, 2 layers); B = 1
  (one request) and B = 16 (an evaluation batch);
* ``video``: a real clip's size, M = 2000 (1728 visual + 272 audio), a 32-token prompt, a
  Qwen2-7B width of 3584 and the paper preset's compact policy (hidden 768); B = 1.

K = round(rho M) at rho = 10%, 20%, 40%. Each round times ``select_keep`` with each policy in
turn (order reversed every other round, ``avex.profiling.latency.alternate``), and the
selection alone (``gumbel_topk(sample=False)`` against ``set_aware_indices(sample=False)`` on
the same scores and hidden states). Prints a Markdown table: medians in ms and the median of
the per-round ratios set-aware / Top-K with its IQR. Then, for training, the RL step's draw
at the benchmark's size (128 rows: 16 clips x 8 anchors) with its log-probability and backward.

    OMP_NUM_THREADS=1 python bench/set_aware_selection.py [--rounds-benchmark 30] [--rounds-video 5]
"""
import argparse
import platform
import subprocess
from pathlib import Path

import torch

from avex.kernels import gumbel_topk
from avex.modality import AUDIO, TEXT, VISUAL
from avex.policy import AVEXPolicy, PolicyConfig
from avex.profiling.latency import alternate, paired_ratio, spread, timed
from avex.pruning import select_keep
from avex.selection import AVLayout
from avex.set_selection import set_aware_indices, set_aware_select

REDUNDANCY = 2.0
RETENTIONS = (0.1, 0.2, 0.4)
#: name -> (visual, audio, prompt tokens, input width, policy sizes, batch sizes)
SIZES = {
    "benchmark": (64, 16, 20, 128, dict(hidden_size=128, num_heads=4, num_kv_heads=2,
                                        intermediate_size=256, qkv_bias=True), (1, 16)),
    "video": (1728, 272, 32, 3584, dict(hidden_size=768, num_heads=12), (1,)),
}


def policies(width: int, sizes: dict):
    torch.manual_seed(0)
    topk = AVEXPolicy(PolicyConfig(input_size=width, **sizes)).eval()
    aware = AVEXPolicy(PolicyConfig(input_size=width, **sizes, selection="set-aware",
                                    redundancy=REDUNDANCY)).eval()
    aware.load_state_dict(topk.state_dict())
    return topk, aware


def inputs(visual: int, audio: int, prompt: int, width: int, batch: int):
    codes = [TEXT] * (prompt // 2) + [VISUAL] * visual + [AUDIO] * audio + \
        [TEXT] * (prompt - prompt // 2)
    modality = torch.tensor([codes] * batch)
    return torch.randn(batch, len(codes), width), modality


def rows_for(name: str, rounds: int) -> list[list[str]]:
    visual, audio, prompt, width, sizes, batches = SIZES[name]
    topk, aware = policies(width, sizes)
    out = []
    for batch in batches:
        embeds, modality = inputs(visual, audio, prompt, width, batch)
        layout = AVLayout.of(modality)
        scores, hidden = aware.score(embeds, modality, with_hidden=True)
        scores, hidden = layout.gather(scores), layout.gather_vectors(hidden)
        for retention in RETENTIONS:
            budget = layout.budget(retention)
            cpu = torch.device("cpu")
            runs = {
                "keep topk": timed(lambda: select_keep(embeds, modality, policy=topk,
                                                       retention=retention), cpu),
                "keep set-aware": timed(lambda: select_keep(embeds, modality, policy=aware,
                                                            retention=retention), cpu),
                "select topk": timed(lambda: gumbel_topk(scores, budget, sample=False), cpu),
                "select set-aware": timed(lambda: set_aware_indices(
                    scores, hidden, budget, redundancy=REDUNDANCY, sample=False), cpu),
            }
            got = alternate(runs, rounds)
            med = {key: spread(r["ms"] for r in got[key])["median"] for key in got}
            keep = paired_ratio(got["keep set-aware"], got["keep topk"])
            select = paired_ratio(got["select set-aware"], got["select topk"])
            out.append([name, str(visual + audio), str(batch), f"{retention:.0%}",
                        str(int(budget[0])), f"{med['keep topk']:.3g}",
                        f"{med['keep set-aware']:.3g}",
                        f"{keep['median']:.2f} ({keep['q1']:.2f}-{keep['q3']:.2f})",
                        f"{med['select topk']:.3g}", f"{med['select set-aware']:.3g}",
                        f"{select['median']:.1f} ({select['q1']:.1f}-{select['q3']:.1f})"])
            print("| " + " | ".join(out[-1]) + " |", flush=True)
    return out


def training_rows(rounds: int) -> None:
    """The RL step's draw at the benchmark's size: 16 clips x 8 anchors = 128 rows of M = 80,
    sampled with the log-probability, then its backward; ``gumbel_topk`` against set-aware."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(128, 80, generator=gen).requires_grad_()
    hidden = torch.randn(128, 80, 128, generator=gen).requires_grad_()
    cpu = torch.device("cpu")
    print("\n| draw + log-prob + backward, B=128 M=80 | K | gumbel_topk ms | set-aware ms | "
          "ratio (IQR) |")
    print("|---|---|---|---|---|")
    for retention in RETENTIONS:
        k = round(retention * 80)
        budget = torch.full((128,), k)

        def topk_draw():
            gumbel_topk(scores, budget, tau=0.5, seed=1)[1].sum().backward()

        def aware_draw():
            set_aware_select(scores, hidden, budget, redundancy=REDUNDANCY, tau=0.5,
                             seed=1)[1].sum().backward()
        got = alternate({"topk": timed(topk_draw, cpu), "aware": timed(aware_draw, cpu)},
                        rounds)
        ratio = paired_ratio(got["aware"], got["topk"])
        med = {key: spread(r["ms"] for r in got[key])["median"] for key in got}
        print(f"| {retention:.0%} | {k} | {med['topk']:.3g} | {med['aware']:.3g} | "
              f"{ratio['median']:.1f} ({ratio['q1']:.1f}-{ratio['q3']:.1f}) |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds-benchmark", type=int, default=30)
    parser.add_argument("--rounds-video", type=int, default=5)
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), python "
          f"{platform.python_version()}, commit {commit}\n")
    print("| size | M | B | rho | K | select_keep topk ms | select_keep set-aware ms | "
          "ratio (IQR) | selection topk ms | selection set-aware ms | ratio (IQR) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows_for("benchmark", args.rounds_benchmark)
    rows_for("video", args.rounds_video)
    training_rows(args.rounds_benchmark)


if __name__ == "__main__":
    main()
