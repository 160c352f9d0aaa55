"""Ship a trained embedded captioner as the package's reference for its benchmark.

    AVEX_CACHE=... python -m avex.captioner train --seed N      # on the machine of record
    python scripts/make_reference_captioner.py --seed N          # copy it under avex/captioner/reference

Copies the captioner's files into ``avex/captioner/reference/<benchmark>-<preset>/`` and records
the sha256 of each file, of its weights and of the benchmark it was trained on in
``avex/captioner/reference/references.json`` (avex.captioner.reference.write_reference). From
then on ``ensure_captioner`` installs that captioner instead of training one, on every machine,
and ``FrozenCaptioner.load`` checks it against these hashes.
"""
import argparse
import json

from avex.captioner.reference import write_reference
from avex.data.embedded import default_benchmark_path
from avex.paths import default_captioner_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="benchmark seed")
    parser.add_argument("--benchmark-preset", default="default")
    parser.add_argument("--captioner-preset", default="default")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    bench = default_benchmark_path(args.benchmark_preset, args.cache_dir, seed=args.seed)
    captioner = default_captioner_path(bench.name, args.captioner_preset, args.cache_dir)
    record = write_reference(captioner, bench)
    print(json.dumps({k: v for k, v in record.items() if k != "files"}, indent=1))


if __name__ == "__main__":
    main()
