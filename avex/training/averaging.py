"""Moving averages over the RL phase: of the policy's weights over RL steps
(``TrainConfig.ema``), and of RLOO's advantage deviation over micro-batches
(``TrainConfig.advantage_scale``: "running").

The average starts from the weights RL starts from (the warmup's), moves toward the policy's
after every optimiser step, ``avg = decay * avg + (1 - decay) * w``, and is what the run
saves at the end. It lives in the checkpoint's state, so a resumed run averages the same
steps as one that never stopped.
"""
from __future__ import annotations

import torch

#: the running advantage scale's decay per micro-batch: about 20 micro-batches (10 steps), so
#: that every retention RL draws is in it
ADVANTAGE_SCALE_DECAY = 0.95


class WeightAverage:
    """The running average of ``policy``'s floating-point parameters and buffers."""

    def __init__(self, policy: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.weights = {name: value.detach().clone()
                        for name, value in policy.state_dict().items()
                        if value.is_floating_point()}

    @torch.no_grad()
    def update(self, policy: torch.nn.Module) -> None:
        current = policy.state_dict()
        for name, average in self.weights.items():
            average.lerp_(current[name].detach(), 1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, policy: torch.nn.Module) -> None:
        """Load the average into ``policy`` (its other entries stay as they are)."""
        policy.load_state_dict(self.weights, strict=False)

    def state_dict(self) -> dict:
        return {"decay": self.decay,
                "weights": {name: value.cpu() for name, value in self.weights.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["decay"] != self.decay or set(state["weights"]) != set(self.weights):
            raise ValueError(f"the checkpoint's weight average (decay {state['decay']}) does "
                             f"not match this run's (decay {self.decay})")
        for name, value in state["weights"].items():
            self.weights[name].copy_(value)


class RunningScale:
    """An exponential moving average of a positive scale, ``value = decay * value + (1 -
    decay) * x``, started at the first ``x``; None until then. A non-positive ``x`` (every
    anchor of every clip tied: no advantage to measure) leaves it as it is. Kept in the RL
    checkpoint's state, as the weight average is."""

    def __init__(self, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.value: float | None = None

    def update(self, x: float) -> None:
        if not x > 0:
            return
        self.value = x if self.value is None else self.decay * self.value + (1 - self.decay) * x
