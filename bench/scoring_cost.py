"""The judge's scoring of an evaluation table (avex.metrics: PTBTokenizer, BLEU-4, METEOR and
CIDEr from pycocoevalcap) as it runs now, against the way it ran before (the baseline):

* ``now``: each reference set goes through PTBTokenizer once per process (later calls copy
  its tokens), and METEOR runs in its Java process while BLEU-4 and CIDEr run in Python;
* ``before``: every call tokenises its references again, and METEOR runs after BLEU-4.

The workload is `make train`'s table: SETTINGS candidate sets (11: full tokens, then five
methods at two retentions) of the default benchmark's first CLIPS (200) test clips, each scored
against the AV, visual-only and audio-only references. The candidates are references of the
same clips (reference k for setting k), so the text is the benchmark's own. Each round scores
the whole table both ways, in turn, the order reversed every other round, the reference memo
emptied first (one table is one process's first look at its references). The scores are
checked equal both ways. Prints a Markdown table: medians in seconds and the median of the
per-round ratios now / before with its IQR.

    OMP_NUM_THREADS=1 python bench/scoring_cost.py [--rounds 5] [--clips 200]
"""
import argparse
import platform
import subprocess
from pathlib import Path

import torch

from avex import metrics
from avex.data import FeatureCache
from avex.data.embedded import ensure_benchmark
from avex.profiling.latency import alternate, paired_ratio, spread, timed

SETTINGS = 11


def workload(clips: int):
    path = ensure_benchmark(progress=False)
    test = list(FeatureCache(path).split("test"))[:clips]
    references = {"AV": [c.refs_av for c in test], "V": [c.refs_v for c in test],
                  "A": [c.refs_a for c in test]}
    tables = [[c.refs_av[k % len(c.refs_av)] for c in test] for k in range(SETTINGS)]
    return tables, references


def table(tables, references):
    return [metrics.caption_metrics_by_reference_type(candidates, references, per_clip=True)
            for candidates in tables]


def score_now(tables, references):
    metrics._REFERENCE_TOKENS.clear()
    return table(tables, references)


def score_before(tables, references):
    """The same calls with the reference memo bypassed and METEOR run in line."""
    memo, background = metrics._tokenized_references, metrics._in_background
    metrics._tokenized_references = metrics._tokenized

    def in_line(function, *args):
        value = function(*args)
        return lambda: value
    metrics._in_background = in_line
    try:
        return table(tables, references)
    finally:
        metrics._tokenized_references, metrics._in_background = memo, background


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clips", type=int, default=200)
    args = parser.parse_args(argv)
    missing = metrics.java_tools_missing()
    if missing:
        raise SystemExit(f"this benchmark times the Java path, which is not available: {missing}")
    tables, references = workload(args.clips)
    if score_now(tables, references) != score_before(tables, references):
        raise SystemExit("the two ways gave different scores")
    cpu = torch.device("cpu")
    got = alternate({"now": timed(lambda: score_now(tables, references), cpu),
                     "before": timed(lambda: score_before(tables, references), cpu)},
                    args.rounds)
    med = {key: spread(r["ms"] / 1000 for r in got[key])["median"] for key in got}
    ratio = paired_ratio(got["now"], got["before"])
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"python {platform.python_version()}, commit {commit}, {args.rounds} rounds, "
          f"{SETTINGS} settings x {len(tables[0])} clips x 3 reference sets\n")
    print("| before s | now s | now / before (IQR) |")
    print("|---|---|---|")
    print(f"| {med['before']:.2f} | {med['now']:.2f} | {ratio['median']:.2f} "
          f"({ratio['q1']:.2f}-{ratio['q3']:.2f}) |")


if __name__ == "__main__":
    main()
