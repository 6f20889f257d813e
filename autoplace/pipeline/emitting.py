"""Stages emit and verify: the partitioned model built as the plan places it and run against the
original (``emit.emit_and_verify``): outputs with ``torch.testing.assert_close``, peak memory
per device against the plan's. ``Emitting`` is what each mode's stages hand this one: the graph
and placement to emit and the inputs to check it on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from autoplace.config import Emit
from autoplace.emit import PartitionedModel, emit_and_verify
from autoplace.formats.plan import Plan
from autoplace.ir import Problem, Schedule
from autoplace.progress import stage
from autoplace.trace import TracedModel

__all__ = ["Emitting", "emit_plan"]


@dataclass(frozen=True)
class Emitting:
    """What to emit: ``problem``'s nodes placed by ``schedule`` (each traced op's device in
    ``device_of_op``), checked against ``model`` on ``args``/``kwargs``; with
    ``meta_weights`` the weights come from a checkpoint when the emitted model is loaded;
    ``units``: FSDP2's unit of each op that has one (``train.sharded``), for sharded replicas."""

    problem: Problem
    schedule: Schedule
    device_of_op: Mapping[str, str]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    model: torch.nn.Module
    meta_weights: bool = False
    units: Mapping[str, str] | None = None


def emit_plan(planned: Plan, traced: TracedModel, what: Emitting, how: Emit
              ) -> tuple[Plan, PartitionedModel | None]:
    """The partitioned model of ``planned`` (``None`` where there are no weights to emit) and
    the plan with its verification record."""
    stage("emit")
    emitted, verification = emit_and_verify(
        traced, what.model, what.args, what.kwargs, problem=what.problem,
        schedule=what.schedule, device_of_op=what.device_of_op, check_outputs=how.verify,
        check_memory=how.check_memory, meta_weights=what.meta_weights, units=what.units)
    return replace(planned, verification=verification), emitted
