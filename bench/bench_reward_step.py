"""One RL micro-batch under each reward (issue #36): the default recipe's size, 16 clips of the
default embedded benchmark's train split x 8 Gumbel-Top-K anchors at 40% retention, the shipped
captioner, RLOO; the policy's scores, the sets, their rewards, the loss and its backward
(``avex.training.steps.rl_loss``), no optimiser step.

Baseline: ``cider`` (a batched greedy generation of 24 new tokens over the 128 sets, then
CIDEr-D). Compared: ``fidelity`` (one teacher-forced forward of y_full per set, no
generation) and ``cider+fidelity`` (both). ``bench/reward_step.py`` measures the same step with
the rewards alternating within one process; this is pytest-benchmark's view of it.

The default benchmark and its captioner are built in the avex cache ($AVEX_CACHE, default
~/.cache/avex) first if missing, as ``python -m avex.train`` builds them on first use: a few
minutes, once.
"""
import dataclasses

import pytest
import torch

import reward_step
from avex.selection import AVLayout
from avex.training.config import TrainConfig
from avex.training.steps import rl_loss, sample_seed
from conftest import label, synchronized

RETENTION = 0.4
GROUP = "RL micro-batch: 16 clips x 8 anchors at 40%, default benchmark, shipped captioner"
REWARDS = {"cider (baseline)": "cider", "fidelity": "fidelity",
           "cider+fidelity": "cider+fidelity"}


@pytest.fixture(scope="module")
def step_inputs():
    cfg = TrainConfig(progress=False, selection="topk")   # the rewards on one selection
    inputs = reward_step.step_inputs(cfg, progress=True)
    captioner, policy, cider, clips = (inputs.captioner, inputs.policy, inputs.cider,
                                       inputs.batch_clips)
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
