"""The weights a training run wrote, read back for tests: a safetensors file, and the policy of
the run's latest checkpoint."""
from pathlib import Path

from safetensors.torch import load_file


def saved_weights(path) -> dict:
    return load_file(str(path))


def final_weights(run_dir) -> dict:
    latest = (Path(run_dir) / "checkpoints" / "latest").read_text().strip()
    return saved_weights(Path(run_dir) / "checkpoints" / latest / "policy.safetensors")
