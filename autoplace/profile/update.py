"""Profile: what the optimizer's update of a model's parameters takes, measured through
``torch.optim`` on a device that is here (``measure_update_s_per_byte``).

A training plan's update nodes (``f@step``) are priced by the roofline of the traffic an update
moves (``train.graph.Optimizer.traffic_bytes_per_param``: Adam 28 bytes a parameter), which
``torch.optim``'s one-tensor-at-a-time Adam (``train.graph.make_optimizer``) exceeds: a kernel per
operation (the two moments, the square root, the division, the step) and Python's work per tensor
(about 1.5x the roofline on this machine's CPU workers: ``docs/training.md``). Measured instead:
the update of a copy of all the model's trainable parameters, timed as a step runs it, right after
a forward and backward pass on the example batch (which leave the caches and the allocator as a
step does; ``docs/design-notes.md``, "profile"), one intra-op thread on a ``cpu-thread`` worker,
the median of the rounds, per byte of trainable parameters: ``train.updates.with_measured_updates``
multiplies it by each update node's bytes. One figure per device, applied to every update on it:
the per-tensor split is not measured.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from autoplace.profile.backward import model_copy_on
from autoplace.profile.timing import threads_for, timer_for
from autoplace.train.graph import make_optimizer

__all__ = ["measure_update_s_per_byte"]

WARMUP = 2
MIN_ROUNDS, MAX_ROUNDS = 5, 25
BUDGET_S = 1.0


def measure_update_s_per_byte(model: torch.nn.Module, args: tuple[Any, ...],
                              kwargs: dict[str, Any], *, optimizer: str,
                              torch_device: str) -> float | None:
    """Seconds per byte of trainable parameters of one ``optimizer`` step (a key of
    ``train.OPTIMIZERS``) of ``model`` (a ``train.LossModel``: its output is the loss) on
    ``torch_device``, each after a forward and backward pass on ``args``/``kwargs``, on a copy
    of the model; ``None`` for a model with nothing to train."""
    local, moved = model_copy_on(model, args, kwargs, torch_device)
    params = [p for p in local.parameters() if p.requires_grad]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    if not nbytes:
        return None
    opt = make_optimizer(optimizer, params)
    timer = timer_for(torch_device)
    rounds: list[float] = []
    with threads_for(torch_device):
        began = time.perf_counter()
        while len(rounds) < WARMUP + MAX_ROUNDS and (
                len(rounds) < WARMUP + MIN_ROUNDS or time.perf_counter() - began < BUDGET_S):
            opt.zero_grad(set_to_none=True)
            local(*moved[0], **moved[1]).backward()
            rounds.append(timer.per_call_s(opt.step, 1))
    # The first steps make the optimizer's state: not counted.
    return statistics.median(rounds[WARMUP:]) / nbytes
