"""Profile: how much longer a model's backward pass takes than its forward pass, measured through
autograd on a device that is here (``measure_backward_factor``), and the forward pass itself as
training runs it (``measure_training_passes``).

A training plan's backward nodes take ``factor`` times their forward node's time (``train.graph``):
2 without a measurement, the FLOP count's (Kaplan et al., 2020); with one, this model's own on that
device. The whole forward pass (autograd recording, as in training) and the whole forward and
backward pass are timed, one of each per round, and the factor is the median over the rounds of the
backward's share over the forward's: one per device, applied to every node (the per-op split of the
backward is not measured). The same rounds' median forward pass is what a step's forward nodes are
scaled to (``train.updates.with_measured_forward``): the ops timed one by one (``profile.ops``) add
up short of the pass, more so of one that records for autograd; the backward, a factor of them,
follows. Figures: ``docs/training.md``, "Formulas and their sources".
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.profile.timing import threads_for, timer_for

__all__ = ["TrainingPasses", "measure_backward_factor", "measure_training_passes",
           "model_copy_on"]

WARMUP = 3
MIN_ROUNDS, MAX_ROUNDS = 7, 41
BUDGET_S = 2.0
MIN_FACTOR = 0.25


@dataclass(frozen=True)
class TrainingPasses:
    """A model's whole forward pass with autograd recording (``forward_s``, seconds) and its
    backward's time over it (``backward_factor``)."""

    forward_s: float
    backward_factor: float


def model_copy_on(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  torch_device: str) -> tuple[torch.nn.Module, tuple[Any, Any]]:
    """A copy of ``model`` and its inputs ``(args, kwargs)`` on ``torch_device`` (a
    ``cpu-thread`` worker's, ``cpu:N``, is the CPU), to measure without touching the model."""
    device = torch.device("cpu" if torch_device.startswith("cpu") else torch_device)
    moved = pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v,
                            (args, kwargs))
    return copy.deepcopy(model).to(device), moved


def measure_backward_factor(model: torch.nn.Module, args: tuple[Any, ...],
                            kwargs: dict[str, Any], torch_device: str) -> float:
    """Backward time over forward time of ``model`` (a ``train.LossModel``: its output is the
    loss) on ``torch_device`` (a ``cpu-thread`` worker ``cpu:N`` on one intra-op thread), on
    a copy of the model and the inputs."""
    return measure_training_passes(model, args, kwargs, torch_device).backward_factor


def measure_training_passes(model: torch.nn.Module, args: tuple[Any, ...],
                            kwargs: dict[str, Any], torch_device: str) -> TrainingPasses:
    """``measure_backward_factor``'s rounds, with the forward pass's median time too."""
    local, moved = model_copy_on(model, args, kwargs, torch_device)
    timer = timer_for(torch_device)

    def forward() -> None:
        local(*moved[0], **moved[1])

    def both() -> None:
        local.zero_grad(set_to_none=True)  # as a training step: no gradient to add into
        local(*moved[0], **moved[1]).backward()

    ratios: list[float] = []
    forwards: list[float] = []
    with threads_for(torch_device):
        for _ in range(WARMUP):
            both()
        began = time.perf_counter()
        # Interleaved, one of each per round, so that both see the same state of the machine;
        # the median of the rounds' ratios.
        while len(ratios) < MAX_ROUNDS and (len(ratios) < MIN_ROUNDS
                                             or time.perf_counter() - began < BUDGET_S):
            forward_s = timer.per_call_s(forward, 1)
            both_s = timer.per_call_s(both, 1)
            if forward_s > 0:
                ratios.append(max(both_s - forward_s, 0.0) / forward_s)
                forwards.append(forward_s)
    # A backward measured as nearly free is noise (a forward measured slow), not a free pass.
    factor = max(statistics.median(ratios), MIN_FACTOR) if ratios else 2.0
    return TrainingPasses(forward_s=statistics.median(forwards) if forwards else 0.0,
                          backward_factor=factor)
