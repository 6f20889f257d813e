"""Profile: what the optimizer's update of a model's parameters takes, measured through
``torch.optim`` on a device that is here (``measure_update_s_per_byte``).

A training plan's update nodes (``f@step``) are priced by the roofline of the traffic an
update moves (``train.graph.Optimizer.traffic_bytes_per_param``: Adam 28 bytes a parameter).
``torch.optim``'s one-tensor-at-a-time Adam (``train.graph.make_optimizer``) makes more
passes than that over each tensor (the two moments, the square root, the division and the
step, each its own kernel) and pays Python's per-tensor work: on this machine's CPU workers it
measured about 1.5x the roofline's time (``docs/training.md``, "Data-parallel replicas").
Measured instead: the update of all of the model's trainable parameters (a copy), timed as a
training step runs it, right after a forward and backward pass of the model on the example
batch (which leave the parameters and the optimizer's state out of the caches, and the
allocator's memory as a step does: LeNet's Adam update measured 1.1 ms repeated alone, 2.4 ms
in the step), one intra-op thread on a ``cpu-thread`` worker, the median of the rounds; per
byte of trainable parameters, which ``train.updates.with_measured_updates`` multiplies by each
update node's bytes. One figure per device, applied to every update on it: the per-tensor
split is not measured.
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
