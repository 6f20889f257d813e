"""Emit: the forward that runs a plan's schedule over several devices (``forward_threaded``).

``threaded_forward_source`` writes it from the segment calls and a ``runtime.program.Program``:
one closure per segment, the program as ``runtime.engine`` steps (``RunStep``,
``HandoverStep`` in a ``WorkerProgram`` per planned device) and a call of the engine's
``run_program``, which launches CUDA devices' steps from the caller's thread and runs every
other device's on a worker thread of its own. ``_frees`` says which step drops which value.
docs/design-notes.md ("emit") says why one launching thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from autoplace.emit.codegen.source import SegmentCall
from autoplace.emit.runtime.program import Program, Run

__all__ = ["threaded_forward_source"]


def threaded_forward_source(
    *,
    signature: str,
    bindings: Sequence[str],
    calls: Sequence[SegmentCall],
    program: Program,
    result: str,
) -> str:
    """The top-level ``def forward(self, ...)`` that runs ``program`` on worker threads: one
    closure per segment (reads its inputs, calls the segment, stores its outputs), the program
    as the engine's typed steps, ``_run_program``, then the outputs bound to their names for
    ``result``.

    Values live in one dict per call: a segment's outputs under their names, a handed-over value
    under ``(name, planned device)``, a moved one under its new name. Each step lists the keys
    whose last reader it is, and the worker drops them after it, so a value is freed after its
    last use (the simulator's rule), not when the forward returns.
    """
    head = f"def forward(self, {signature}):" if signature else "def forward(self):"
    lines = [head, *(f"    {line}" for line in bindings),
             f"    _c = _Call({len(program.handovers)})"]
    runs = {s.segment: s for steps in program.workers.values() for s in steps
            if isinstance(s, Run)}
    by_index = {call.index: call for call in calls}
    reads: dict[int, list[object]] = {}
    for call in calls:
        caller = set(runs[call.index].inputs_from_caller)
        target = f"self.seg{call.index}.device"
        lines.append(f"    def _seg{call.index}():  # planned on {call.planned_device}")
        local, read = set(), []
        for new_name, value, is_tensor in call.moves:
            local.add(new_name)
            if value in caller:
                move = (f"{value}.to({target}, non_blocking=False)" if is_tensor
                        else f"_move({value}, {target})")
                lines.append(f"        {new_name} = {move}")
            else:
                key = (value, call.planned_device)
                read.append(key)
                lines.append(f"        {new_name} = _c.values[{key!r}]")
            # A later segment on this device reads the moved value under the same name.
            lines.append(f"        _c.values[{new_name!r}] = {new_name}")
        read += [a for a in call.args if a not in local]
        reads[call.index] = read
        args = ", ".join(a if a in local else f"_c.values[{a!r}]" for a in call.args)
        invoke = f"self.seg{call.index}({args})"
        if call.outputs:
            lines.append(f"        _out = {invoke}")
            for i, name in enumerate(call.outputs):
                lines.append(f"        _c.values[{name!r}] = _out[{i}]")
        else:
            lines.append(f"        {invoke}")
    functions = ", ".join(f"{c.index}: _seg{c.index}" for c in calls)
    lines.append(f"    _functions = {{{functions}}}")
    returned = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", result))
    frees = _frees(program, by_index, reads, keep=returned)
    lines.append("    _program = (")
    for device, steps in program.workers.items():
        first = next(s.segment for s in steps if isinstance(s, Run))
        lines.append(f"        _WorkerProgram(planned={device!r}, device=self.seg{first}.device, "
                     "steps=(")
        for position, step in enumerate(steps):
            drop = tuple(frees.get((device, position), ()))
            if isinstance(step, Run):
                lines.append(f"            _RunStep(segment={step.segment}, waits={step.waits!r}, "
                             f"drops={drop!r}),")
            else:
                reader = next(c.index for c in calls if c.planned_device == step.dst_device)
                lines.append(f"            _HandoverStep(handover={step.id}, value={step.value!r}, "
                             f"target=self.seg{reader}.device, "
                             f"key={(step.value, step.dst_device)!r}, drops={drop!r}),")
        lines.append("        )),")
    lines.append("    )")
    lines.append("    _run_program(self, _program, _functions, _c)")
    for call in calls:
        for name in call.outputs:
            if name in returned:
                lines.append(f"    {name} = _c.values[{name!r}]")
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"


def _frees(
    program: Program,
    calls: Mapping[int, SegmentCall],
    reads: Mapping[int, Sequence[object]],
    *,
    keep: set[str],
) -> dict[tuple[str, int], list[object]]:
    """``(worker, step position) -> keys to drop after that step``: each key at its last
    reader, or where it is written when nothing reads it; never a key the result returns.

    Every key is read on one worker only (a segment's outputs on its own device's worker, by its
    segments and handovers; a handed-over or moved value by the segments of the device it was
    handed to), so "last" is well defined within that worker's order.
    """
    last: dict[object, tuple[str, int]] = {}
    for device, steps in program.workers.items():
        for position, step in enumerate(steps):
            if isinstance(step, Run):
                call = calls[step.segment]
                written = [*call.outputs, *(new for new, _, _ in call.moves)]
                for key in written:
                    last.setdefault(key, (device, position))
                for key in reads[step.segment]:
                    last[key] = (device, position)
            else:  # written here, read (and so dropped) by a segment on the destination
                last.setdefault((step.value, step.dst_device), (device, position))
                last[step.value] = (device, position)
    frees: dict[tuple[str, int], list[object]] = {}
    for key, where in last.items():
        if not (isinstance(key, str) and key in keep):
            frees.setdefault(where, []).append(key)
    return frees
