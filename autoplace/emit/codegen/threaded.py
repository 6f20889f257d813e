"""Emit: the threaded runtime's forward, and the engine that runs its program.

On CUDA devices the caller's thread launches every GPU's segments in the plan's launch order
(``Schedule.launch_order``), each planned device on a stream of its own, handovers on the
producer's copy stream, waited for through events; the simulator charges this one thread's work
(``ir.HostCosts``). Every other device (``cpu-thread`` workers, ``cpu:0``, ...) gets a worker
thread that runs its segments in the plan's order on one intra-op thread, tensors handed over by
reference. docs/design-notes.md ("emit") says why one launching thread.

Read ``threaded_forward_source`` (the forward that runs a ``runtime.program.Program``) and
``RUNTIME_SOURCE`` (the engine, which imports only torch and the standard library).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from autoplace.emit.runtime.program import Program, Run

__all__ = ["RUNTIME_SOURCE", "SegmentCallLike", "threaded_forward_source"]


# The engine, written into the generated source after source.py's helpers (it uses no name from
# autoplace). Workers are daemon threads kept on the model between calls (starting a thread per
# call would cost more than a small segment); a failure in one worker releases every waiter and
# is raised in the caller.
RUNTIME_SOURCE = '''\
import queue as _queue
import threading as _threading


class _WorkerThreads:
    """The sequential forward's body, run on the caller's thread: on one intra-op thread where
    the ``devices`` not on a GPU are all cpu-thread workers (``cpu:N``), as the plan profiled
    them, torch's count restored after; elsewhere torch's count (the same rule as
    ``autoplace.cluster.local.intra_op_threads``, which this file cannot import)."""

    def __init__(self, *devices):
        on_cpu = [d for d in map(torch.device, devices) if d.type != "cuda"]
        self.one = bool(on_cpu) and all(d.type == "cpu" and d.index is not None for d in on_cpu)
        self.before = None

    def __enter__(self):
        self.before = torch.get_num_threads()
        if self.one and self.before != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc_info):
        if self.one and self.before != 1:
            torch.set_num_threads(self.before)


class _Failed(Exception):
    """Another worker failed: this one stops at its next wait."""


class _Worker:
    """A daemon thread that runs the jobs put in its queue, on its (CPU) device."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.jobs = _queue.SimpleQueue()
        self.thread = _threading.Thread(target=self._loop, daemon=True,
                                        name=f"autoplace-{device}")
        self.thread.start()

    def _loop(self):
        torch.set_num_threads(1)
        while True:
            self.jobs.get()()


class _Call:
    """One forward call: the values, the handover events, the first error."""

    def __init__(self, handovers):
        self.values = {}
        self.ready = [_threading.Event() for _ in range(handovers)]
        self.cuda_events = [None] * handovers
        self.moved = [None] * handovers
        self.error = None
        self.lock = _threading.Lock()

    def fail(self, error):
        with self.lock:
            if self.error is None:
                self.error = error
        for event in self.ready:
            event.set()


def _hand_over(call, step, device, copy_streams):
    """Make ``step``'s value readable on its destination, then release its readers."""
    _, number, name, target, key, _ = step
    value = call.values[name]
    if device.type == "cuda" and isinstance(value, torch.Tensor):
        stream = _stream(copy_streams, device, device)
        stream.wait_stream(torch.cuda.current_stream(device))  # after the producer
        # A copy between devices also waits for the destination's current stream (torch's
        # copy_between_devices); an idle receiving stream there keeps it from waiting for the
        # destination's compute.
        receive = None
        if torch.device(target).type == "cuda" and torch.device(target) != device:
            receive = _stream(copy_streams, ("in", target), torch.device(target))
        with torch.cuda.stream(stream):
            if receive is None:
                moved = value.to(target, non_blocking=True)
            else:
                with torch.cuda.stream(receive):
                    moved = value.to(target, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        value.record_stream(stream)  # not reused before the copy has read it
        call.cuda_events[number] = done
        call.moved[number] = moved
    elif torch.device(target).type == "cpu" and device.type == "cpu":
        moved = value  # worker threads share memory: the tensor itself is handed over
    else:
        # A value that is not one tensor, or one from a CPU worker to a GPU: copied on the
        # current stream of the GPU it involves (the source's, else the destination's); the
        # event tells its readers' streams when the copy is done.
        moved = _move(value, target)
        gpu = device if device.type == "cuda" else torch.device(target)
        if gpu.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(gpu))
            call.cuda_events[number] = done
            call.moved[number] = moved
    call.values[key] = moved
    call.ready[number].set()


def _record(value, stream):
    """Mark every CUDA tensor in ``value`` as in use on ``stream`` (the caching allocator then
    keeps it until the stream is past its use), through tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _record(item, stream)
    elif isinstance(value, dict):
        for item in value.values():
            _record(item, stream)


def _wait(call, step, device):
    """Block until the handovers ``step`` reads are done; on CUDA, order the stream after them."""
    for number in step[2]:
        call.ready[number].wait()
        if call.error is not None:
            raise _Failed()
        event = call.cuda_events[number]
        if event is not None and device.type != "cuda":
            event.synchronize()  # a copy from a GPU to this CPU worker must have landed
        elif event is not None:
            stream = torch.cuda.current_stream(device)
            stream.wait_event(event)
            _record(call.moved[number], stream)  # in use here until this stream is past it


def _stream(streams, key, device):
    """The CUDA stream kept under ``key``, made on ``device`` the first time."""
    stream = streams.get(key)
    if stream is None:
        stream = streams[key] = torch.cuda.Stream(device)
    return stream


def _work(call, steps, functions, worker, copy_streams, finished, modes):
    try:
        grad, inference, _ = modes  # the caller's thread-local state
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            _steps(call, steps, functions, worker.device, copy_streams)
    except _Failed:
        pass
    except BaseException as error:
        call.fail(error)
    finally:
        finished.release()


def _steps(call, steps, functions, device, copy_streams):
    for step in steps:
        _step(call, step, functions, device, copy_streams)


def _step(call, step, functions, device, copy_streams):
    """Run a segment once its handovers are done, or hand a value over; then drop the values
    this step was the last to read."""
    if step[0] == "run":
        _wait(call, step, device)
        functions[step[1]]()
    else:
        _hand_over(call, step, device, copy_streams)
    for key in step[-1]:
        call.values.pop(key, None)


def _launch(call, entries, functions, streams):
    """Issue the CUDA devices' steps (``entries``: planned device, device, steps) from this
    thread, in segment order: every launch and copy is asynchronous, ordered by events, so no
    device waits on the host for another device's work. Each planned device runs on a stream of
    its own (two planned devices on one GPU still overlap), after the caller's stream."""
    merged = []
    for planned, device, steps in entries:
        stream = _stream(streams, ("run", planned), device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the inputs the caller queued
        segment = -1
        for position, step in enumerate(steps):
            if step[0] == "run":
                segment = step[1]
            merged.append((segment, position, device, stream, step))
    merged.sort(key=lambda m: (m[0], m[1]))  # a handover right after its producer's segment
    try:
        for _, _, device, stream, step in merged:
            with torch.cuda.stream(stream):
                _step(call, step, functions, device, streams)
    except _Failed:
        pass
    except BaseException as error:
        call.fail(error)
    for planned, device, _ in entries:  # the caller's stream goes on after this work
        torch.cuda.current_stream(device).wait_stream(streams[("run", planned)])


def _run_program(model, program, functions, call):
    """Run ``program`` (per worker: its planned device, the device it runs on, its steps): the
    CUDA devices' steps launched from the caller's thread (``_launch``), every other device's on
    a worker thread of its own; return when all are done, raising the first error any raised."""
    workers = model.__dict__.setdefault("_autoplace_workers", {})
    streams = model.__dict__.setdefault("_autoplace_copy_streams", {})
    finished = _threading.Semaphore(0)
    threaded = [entry for entry in program if entry[1].type != "cuda"]
    for planned, device, steps in threaded:
        worker = workers.get(planned)
        if worker is None or worker.device != device:
            worker = workers[planned] = _Worker(device)
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), None)
        worker.jobs.put(lambda steps=steps, worker=worker, modes=modes: _work(
            call, steps, functions, worker, streams, finished, modes))
    launched = [entry for entry in program if entry[1].type == "cuda"]
    if launched:
        _launch(call, launched, functions, streams)
    for _ in threaded:
        finished.acquire()
    if call.error is not None:
        raise call.error
'''


class SegmentCallLike(Protocol):
    """What ``threaded_forward_source`` reads of a ``source.SegmentCall`` (not imported:
    codegen writes this module's engine into ``model.py``)."""

    index: int
    planned_device: str
    moves: tuple[tuple[str, str, bool], ...]
    args: tuple[str, ...]
    outputs: tuple[str, ...]


def threaded_forward_source(
    *,
    signature: str,
    bindings: Sequence[str],
    calls: Sequence[SegmentCallLike],
    program: Program,
    result: str,
) -> str:
    """The top-level ``def forward(self, ...)`` that runs ``program`` on worker threads: one
    closure per segment (reads its inputs, calls the segment, stores its outputs), the program
    as a literal, ``_run_program``, then the outputs bound to their names for ``result``.

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
        lines.append(f"        ({device!r}, self.seg{first}.device, (")
        for position, step in enumerate(steps):
            drop = tuple(frees.get((device, position), ()))
            if isinstance(step, Run):
                lines.append(f"            ('run', {step.segment}, {step.waits!r}, {drop!r}),")
            else:
                reader = next(c.index for c in calls if c.planned_device == step.dst_device)
                lines.append(f"            ('send', {step.id}, {step.value!r}, "
                             f"self.seg{reader}.device, {(step.value, step.dst_device)!r}, "
                             f"{drop!r}),")
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
    calls: Mapping[int, SegmentCallLike],
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
