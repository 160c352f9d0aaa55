"""The files of a ``python -m avex.train`` run directory, named in one place::

    <run>/config.json                  the run's settings (TrainConfig.to_dict)
         policy.json                   the policy's sizes and what it is trained on
         metrics.jsonl                 one line per optimiser step (warmup, then RL)
         warmup_policy.safetensors     the policy after the warmup (other runs start from it)
         exchange_calibration.json     w(dR)'s saturation, measured once (with the exchange term)
         exchange_diagnostics.json     the RL groups' reward ties; with the exchange term, its
                                       labels and gradients (and a .png)
         checkpoints/step-N/, latest   atomic checkpoints (avex.checkpoint)
         policy/                       the finished policy (AVEXPolicy.save_pretrained)
         results.md, results.json      the end-of-run table
         cacovid/                      CaCoVID-AV, trained from this run's warmup for the table

A leaf module: anything that reads or writes a run directory names its files from here.
"""
from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.json"
POLICY_RECORD_FILE = "policy.json"
METRICS_FILE = "metrics.jsonl"
WARMUP_POLICY_FILE = "warmup_policy.safetensors"
EXCHANGE_CALIBRATION_FILE = "exchange_calibration.json"
EXCHANGE_DIAGNOSTICS_FILE = "exchange_diagnostics.json"
EXCHANGE_DIAGNOSTICS_FIGURE = "exchange_diagnostics.png"
CHECKPOINTS_DIR = "checkpoints"
SAVED_POLICY_DIR = "policy"
RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
CACOVID_DIR = "cacovid"


def warmup_policy_file(run_dir, *, name: str = "warmup_from") -> Path:
    """The warmup policy of the run directory ``run_dir``; a missing one is refused, naming the
    setting (``name``) the directory came from."""
    path = Path(run_dir) / WARMUP_POLICY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no {WARMUP_POLICY_FILE} in {str(run_dir)!r}")
    return path
