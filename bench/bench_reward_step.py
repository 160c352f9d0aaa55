"""One RL micro-batch under each reward (issue #36): the default recipe's size, 16 clips of the
default embedded benchmark's train split x 8 Gumbel-Top-K anchors at 40% retention, the shipped
captioner, RLOO; the policy's scores, the sets, their rewards, the loss and its backward
(``avex.training.steps.rl_loss``), no optimiser step.

Baseline: ``cider`` (a batched greedy generation of 24 new tokens over the 128 sets, then
CIDEr-D). Compared: ``fidelity`` (one teacher-forced forward of y_full per set, no
generation) and ``cider+fidelity`` (both). ``bench/reward_step.py`` measures the same step with
the rewards alternating within one process; this is pytest-benchmark's view of it.

Skips unless the default benchmark is already built in the avex cache ($AVEX_CACHE, default
~/.cache/avex): building it takes minutes (``python -m avex.train`` does it on first use).
"""
import dataclasses

import pytest
import torch

from avex.captioner import ensure_captioner
from avex.data.embedded import default_benchmark_path
from avex.reward import CiderD
from avex.selection import AVLayout
from avex.training.config import TrainConfig
from avex.training.loop import load_run_inputs
from avex.training.steps import rl_loss, sample_seed
from conftest import DEVICE, label, synchronized

RETENTION = 0.4
GROUP = "RL micro-batch: 16 clips x 8 anchors at 40%, default benchmark, shipped captioner"
REWARDS = {"cider (baseline)": "cider", "fidelity": "fidelity",
           "cider+fidelity": "cider+fidelity"}


@pytest.fixture(scope="module")
def step_inputs():
    bench = default_benchmark_path()
    if not (bench / "meta.json").is_file():
        pytest.skip(f"the default embedded benchmark is not built at {bench}; run "
                    "`python -m avex.train` (or avex.data.ensure_benchmark()) once first")
    cfg = TrainConfig(progress=False, selection="topk")   # the rewards on one selection
    cache, captioner, policy = load_run_inputs(cfg, bench, ensure_captioner(progress=False), DEVICE)
    train = cache.split("train")
    clips = [train[i] for i in range(cfg.micro_batch_size)]
    cider = CiderD(corpus_references=[c.refs_av for c in (train[i] for i in range(len(train)))],
                   tokenize=True)
    batch = captioner.embed(clips)
    everything = AVLayout.of(batch.modality).modality >= 0
    targets = [row[0] for row in captioner.keep_set_tokens(   # y_full of the 16 clips
        batch.inputs_embeds, batch.modality, everything[:, None],
        max_new_tokens=cfg.max_new_tokens)]
    return cfg, captioner, policy, cider, clips, targets


@pytest.mark.parametrize("impl", list(REWARDS))
def test_rl_step_by_reward(benchmark, impl, step_inputs):
    cfg, captioner, policy, cider, clips, targets = step_inputs
    cfg = dataclasses.replace(cfg, reward=REWARDS[impl])
    label(benchmark, GROUP, impl)

    def step():
        policy.zero_grad(set_to_none=True)
        batch = captioner.embed(clips)
        terms = rl_loss(cfg, policy, captioner, cider, batch, clips, sample_seed(cfg.seed, 1, 0),
                        RETENTION, full_tokens=targets)
        terms["loss"].backward()
        return terms

    terms = benchmark.pedantic(synchronized(step), rounds=5, warmup_rounds=1)
    assert torch.isfinite(terms["loss"])
    assert (float(terms["reward"]) < 0) == (cfg.reward == "fidelity")
