"""Tiny training runs for tests, and the weights they wrote read back: a safetensors file, and
the policy of the run's latest checkpoint."""
from pathlib import Path

from safetensors.torch import load_file


def saved_weights(path) -> dict:
    return load_file(str(path))


def final_weights(run_dir) -> dict:
    latest = (Path(run_dir) / "checkpoints" / "latest").read_text().strip()
    return saved_weights(Path(run_dir) / "checkpoints" / latest / "policy.safetensors")


def train_tiny(cache_dir, run_dir, *extra):
    """``python -m avex.train`` on the tiny benchmark (tests/conftest.py), without its table:
    a half-epoch warmup (none with --warmup-from), one RL epoch (none with --warmup-only)."""
    from avex.train import main
    warmup = [] if "--warmup-from" in extra else ["--warmup-epochs", "0.5"]
    epochs = [] if "--warmup-only" in extra else ["--epochs", "1"]
    return main(["--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                 "--cache-dir", str(cache_dir), "--run-dir", str(run_dir), "--batch-size", "8",
                 "--micro-batch-size", "4", *epochs, *warmup,
                 "--no-progress", "--no-evaluate", "--seed", "3", *extra])
