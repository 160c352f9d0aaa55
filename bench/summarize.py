"""Turn pytest-benchmark JSON into a Markdown table: median per entry, ratio to the baseline.

    pytest bench/ --benchmark-only --benchmark-json=out.json
    python bench/summarize.py out.json > bench/results/<name>.md

A benchmark names itself in ``extra_info["impl"]`` and marks its baseline with
``extra_info["baseline"] = True``; the ratio
column is baseline median / entry median (above 1 means faster than the baseline).

A paired measurement (``extra_info["paired"]``: the paths alternated within one process, see
``avex.profiling.latency``) gets its own table instead: medians per stage and the median of the
per-round ratios with their interquartile range.
"""
import argparse
import json
import subprocess
from collections import defaultdict
from datetime import date

from avex.profiling.latency import ratio_table, stage_table
from avex.tables import markdown_table


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("--title", default="Benchmark results")
    parser.add_argument("--commit", default=None,
                        help="the commit the benchmarks ran at, where the JSON's git record is "
                             "wrong (a device machine's copy of the tree has stale git metadata)")
    args = parser.parse_args(argv)
    try:  # an unreadable file is a usage error naming it
        with open(args.json_file, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
            raise ValueError("not pytest-benchmark JSON (no 'benchmarks' list)")
    except (OSError, ValueError) as err:
        parser.error(f"{args.json_file}: {err}")
    commit = data.get("commit_info", {}).get("id") or subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    machine = data.get("machine_info", {})
    groups = defaultdict(list)
    paired = []
    for bench in data["benchmarks"]:
        if "paired" in bench.get("extra_info", {}):
            paired.append(bench["extra_info"]["paired"])
        else:
            groups[bench["group"] or bench["name"]].append(bench)

    print(f"# {args.title}\n")
    print(f"- date: {data.get('datetime', str(date.today()))[:10]}")
    print(f"- machine: {machine.get('cpu', {}).get('brand_raw', machine.get('processor', '?'))}, "
          f"{machine.get('cpu', {}).get('count', '?')} cores; python {machine.get('python_version')}")
    extra = data["benchmarks"][0].get("extra_info", {}) if data["benchmarks"] else {}
    if extra.get("device_name"):
        print(f"- device: {extra['device_name']}")
    if args.commit:
        print(f"- commit: {args.commit[:12]} (given; the JSON's git record says {commit[:12]})")
    else:
        print(f"- commit: {commit[:12]} (dirty: {data.get('commit_info', {}).get('dirty', '?')})")
    if groups:
        print("- medians of pytest-benchmark rounds; ratio = baseline median / entry median\n")
    rows = []
    for group, benches in groups.items():
        base = [b for b in benches if b.get("extra_info", {}).get("baseline")]
        base_median = base[0]["stats"]["median"] if base else None
        for b in sorted(benches, key=lambda b: b["stats"]["median"], reverse=True):
            stats = b["stats"]
            name = b.get("extra_info", {}).get("impl") or b["name"]
            ratio = f"{base_median / stats['median']:.1f}x" if base_median else "-"
            rows.append([group, name, fmt_time(stats["median"]), fmt_time(stats["iqr"]),
                         stats["rounds"], ratio])
    if rows:
        print(markdown_table(["group", "implementation", "median", "IQR", "rounds",
                              "vs baseline"], rows))
    for p in paired:
        if "baseline" in p:   # alternate() over timed() runs
            print(f"\n### {p['group']}\n\n{p['what']}\n")
            print(ratio_table(p["results"], p["baseline"]))
            continue
        first = next(iter(p["rows"].values()))
        what = (f"{first['rounds']} alternating rounds, {first['threads']} CPU threads"
                if "device_name" not in extra else f"{first['rounds']} alternating rounds")
        print(f"\n### {p['size']}\n\n{p['decode_tokens']} decoded tokens (forced), "
              f"{p['dtype']}, {what}; ms are medians over the rounds, ratios the median of the "
              "per-round ratios (IQR across rounds).\n")
        print(stage_table(p["rows"], p.get("names")))


if __name__ == "__main__":
    main()
