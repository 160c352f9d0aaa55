"""Markdown tables for bench/gpu.sh's stages that pytest-benchmark does not cover.

    python bench/gpu_tables.py tests JUNIT_XML --title T    # pass / fail / skip per test file
    python bench/gpu_tables.py train RUN_DIR --title T      # a training run: steps, timing, results

Both print to stdout; gpu.sh writes the output under $OUT.
"""
import argparse
import json
import statistics
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

from avex.tables import markdown_table


def tests_table(junit_xml: str) -> str:
    counts = defaultdict(Counter)
    failures = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        where = (case.get("classname") or "?").split(".")[-1]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                failures.append(f"- {where}::{case.get('name')}: "
                                f"{(child.get('message') or '').splitlines()[0][:200]}")
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[where][outcome] += 1
    rows = [[name, c["passed"], c["failed"], c["skipped"]] for name, c in sorted(counts.items())]
    total = sum(counts.values(), Counter())
    rows.append(["**total**", total["passed"], total["failed"], total["skipped"]])
    out = markdown_table(["test module", "passed", "failed", "skipped"], rows)
    if failures:
        out += "\n\nFailures:\n\n" + "\n".join(failures)
    return out


def train_table(run_dir: str) -> str:
    run = Path(run_dir)
    log = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    lines = []
    for phase in ("warmup", "rl"):
        times = [r["time"] for r in log if r.get("phase") == phase and "time" in r]
        steps = len(times)
        if steps >= 2:
            gaps = [b - a for a, b in zip(times, times[1:])]
            lines.append([phase, steps, f"{statistics.median(gaps):.2f}",
                          f"{times[-1] - times[0]:.1f}"])
        else:
            lines.append([phase, steps, "-", "-"])
    out = markdown_table(["phase", "steps", "median s / step (log gaps)", "s first to last"],
                         lines)
    results = run / "results.md"
    if results.exists():
        out += "\n\n" + results.read_text().strip()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("tests", "train"))
    parser.add_argument("path")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    body = tests_table(args.path) if args.kind == "tests" else train_table(args.path)
    print(f"# {args.title}\n\n{body}" if args.title else body)


if __name__ == "__main__":
    main()
