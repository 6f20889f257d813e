"""Emit, runtime: the threaded runtime's program, as data.

The sequential forward calls the segments one after another from the caller's thread; the
threaded runtime hands every value another device reads over right after the segment that
computes it, and its readers wait for that handover only. ``Program`` says, per planned device,
the segments it runs (``Run``) and the handovers it issues (``Handover``), in order;
``build_program`` makes it from the segments' devices and inputs. ``codegen.threaded`` writes
the forward that runs it, and ``check.replay`` plays it back under the plan's costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplace.errors import EmitError

__all__ = ["Handover", "Program", "Run", "build_program"]


@dataclass(frozen=True)
class Handover:
    """Value ``value`` (a segment output) handed from ``src_device`` to ``dst_device``, issued
    right after segment ``after`` ends; ``id`` is the event its readers wait for."""

    id: int
    value: str
    after: int
    src_device: str
    dst_device: str


@dataclass(frozen=True)
class Run:
    """Segment ``segment`` run by its device's worker once ``waits`` (handover ids) are done;
    ``inputs_from_caller`` are the model inputs it moves to its device itself."""

    segment: int
    waits: tuple[int, ...]
    inputs_from_caller: tuple[str, ...] = ()


@dataclass(frozen=True)
class Program:
    """What the threaded runtime does, as data: per worker (a planned torch device) the steps it
    takes in order, each a ``Run`` or a ``Handover`` it issues."""

    workers: Mapping[str, tuple[Run | Handover, ...]]
    handovers: tuple[Handover, ...]
    origin: Mapping[str, str] = field(default_factory=dict)  # value -> traced op it came from

    def to_dict(self) -> dict[str, Any]:
        def step(s: Run | Handover) -> dict[str, Any]:
            if isinstance(s, Run):
                return {"run": s.segment, "waits": list(s.waits),
                        "inputs_from_caller": list(s.inputs_from_caller)}
            return {"handover": s.id, "value": s.value, "to": s.dst_device}
        return {device: [step(s) for s in steps] for device, steps in self.workers.items()}


def build_program(
    planned_devices: Sequence[str],
    inputs: Sequence[Sequence[str]],
    source_of: Mapping[str, int | None],
    *,
    origin: Mapping[str, str] | None = None,
) -> Program:
    """The program of segments ``0..n-1``: ``planned_devices[i]`` runs segment ``i``, which
    reads ``inputs[i]``; ``source_of[value]`` is the segment that computes a value (``None``
    for the caller's inputs).

    Each worker's runs keep the segments' order, a topological order of the schedule, so no
    worker waits for a handover that a later step of its own must issue: the program cannot
    deadlock. A value goes to each other device once, however many segments there read it.
    """
    handovers: dict[tuple[str, str], Handover] = {}
    issued: dict[int, list[Handover]] = {}
    runs: list[Run] = []
    for index, (device, names) in enumerate(zip(planned_devices, inputs, strict=True)):
        waits: list[int] = []
        caller: list[str] = []
        for name in names:
            source = source_of.get(name)
            if source is None:
                caller.append(name)
                continue
            if source >= index:
                raise EmitError(f"segment {index} reads {name!r} from segment {source}, which "
                                "runs later: the segment order is not topological")
            if planned_devices[source] == device:
                continue
            key = (name, device)
            if key not in handovers:
                handovers[key] = Handover(id=len(handovers), value=name, after=source,
                                          src_device=planned_devices[source], dst_device=device)
                issued.setdefault(source, []).append(handovers[key])
            waits.append(handovers[key].id)
        runs.append(Run(segment=index, waits=tuple(dict.fromkeys(waits)),
                        inputs_from_caller=tuple(caller)))
    workers: dict[str, list[Run | Handover]] = {}
    for run in runs:
        steps = workers.setdefault(planned_devices[run.segment], [])
        steps.append(run)
        steps.extend(issued.get(run.segment, ()))
    return Program(workers={d: tuple(s) for d, s in workers.items()},
                   handovers=tuple(sorted(handovers.values(), key=lambda h: h.id)),
                   origin=dict(origin or {}))
