"""Emit, runtime: the engine every generated model runs, importing only torch and the stdlib.

``save_model`` copies this file next to ``model.py`` as ``_runtime.py`` and ``model.py`` imports
it (``from ._runtime import ...``); in memory ``codegen.source.runtime_namespace`` binds the same
objects. Either way each name of ``__all__`` is bound with a leading underscore (``move`` as
``_move``), out of the way of the graph's value names.

Read the helpers every model uses (``move``, ``unflatten``, ``empty``, ``attach``,
``WorkerThreads``), then the threaded runtime: a program is a ``WorkerProgram`` per planned
device, each a sequence of typed steps (``RunStep``, ``HandoverStep``, as
torch.distributed.pipelining types its ``_Action``), and ``run_program`` runs it: CUDA devices'
steps launched from the caller's thread (``_launch``), every other device's on a worker thread
of its own (``_Worker``), values handed over (``hand_over``) and waited for (``wait``) through
events. Workers are daemon threads kept on the model between calls (a thread per call would cost
more than a small segment); a failure in one releases every waiter and is raised in the caller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree

__all__ = [
    "Call",
    "HandoverStep",
    "RunStep",
    "WorkerProgram",
    "WorkerThreads",
    "attach",
    "empty",
    "hand_over",
    "move",
    "run_program",
    "run_step",
    "unflatten",
    "wait",
]

Key = str | tuple[str, str]  # a value in ``Call.values``: its name, or (name, planned device)


def move(value: Any, device: torch.device | str) -> Any:
    """Copy tensors, also inside tuples, lists and dicts, to ``device``; pass other values."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=False)
    if type(value) in (tuple, list):
        return type(value)(move(item, device) for item in value)
    if type(value) is dict:
        return {key: move(item, device) for key, item in value.items()}
    return value


def unflatten(flat: Sequence[Any], spec: pytree.TreeSpec | None) -> Any:
    """Rebuild the original output structure; a flat tuple when the structure was not saved."""
    if spec is None:
        return tuple(flat)
    return pytree.tree_unflatten(list(flat), spec)


def empty(shape: tuple[int, ...], dtype: torch.dtype, *, parameter: bool,
          requires_grad: bool = False) -> torch.Tensor:
    """A meta-device stand-in that load_model replaces with the saved tensor."""
    tensor = torch.empty(shape, dtype=dtype, device="meta")
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor


def attach(root: torch.nn.Module, target: str, value: Any) -> None:
    """Set ``root.<dotted target>``, creating empty parent modules so state_dict keys keep the
    original model's names."""
    *path, name = target.split(".")
    module = root
    for part in path:
        if part not in module._modules:
            module.add_module(part, torch.nn.Module())
        module = module._modules[part]
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        module.register_buffer(name, value)
    else:
        setattr(module, name, value)


class WorkerThreads:
    """The sequential forward's body, run on the caller's thread: on one intra-op thread where
    the ``devices`` not on a GPU are all cpu-thread workers (``cpu:N``), as the plan profiled
    them, torch's count restored after; elsewhere torch's count (the same rule as
    ``autoplace.cluster.local.intra_op_threads``, which this file cannot import)."""

    def __init__(self, *devices: torch.device | str) -> None:
        on_cpu = [d for d in map(torch.device, devices) if d.type != "cuda"]
        self.one = bool(on_cpu) and all(d.type == "cpu" and d.index is not None for d in on_cpu)
        self.before: int | None = None

    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        if self.one and self.before != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc_info: object) -> None:
        if self.one and self.before != 1:
            torch.set_num_threads(self.before)


class RunStep(NamedTuple):
    """Call segment ``segment`` once the handovers ``waits`` (their numbers) are done; then drop
    the values ``drops``, whose last reader this step is."""

    segment: int
    waits: tuple[int, ...] = ()
    drops: tuple[Key, ...] = ()


class HandoverStep(NamedTuple):
    """Handover number ``handover``: make value ``value`` readable on ``target`` (the reading
    segment's device) under ``key``, then release its readers; then drop ``drops``."""

    handover: int
    value: str
    target: torch.device
    key: tuple[str, str]
    drops: tuple[Key, ...] = ()


class WorkerProgram(NamedTuple):
    """What one planned device does: its ``steps`` in order, on torch device ``device``."""

    planned: str
    device: torch.device
    steps: tuple[RunStep | HandoverStep, ...]


class _Failed(Exception):
    """Another worker failed: this one stops at its next wait."""


class _Worker:
    """A daemon thread that runs the jobs put in its queue, on its (CPU) device."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"autoplace-{device}")
        self.thread.start()

    def _loop(self) -> None:
        torch.set_num_threads(1)
        while True:
            self.jobs.get()()


class Call:
    """One forward call: the values, the handover events, the first error."""

    def __init__(self, handovers: int) -> None:
        self.values: dict[Key, Any] = {}
        self.ready = [threading.Event() for _ in range(handovers)]
        self.cuda_events: list[torch.cuda.Event | None] = [None] * handovers
        self.moved: list[Any] = [None] * handovers
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = error
        for event in self.ready:
            event.set()


Streams = dict[Any, torch.cuda.Stream]  # CUDA streams kept on the model, by key


def hand_over(call: Call, step: HandoverStep, device: torch.device, copy_streams: Streams) -> None:
    """Make ``step``'s value readable on its destination, then release its readers."""
    value, target = call.values[step.value], step.target
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
        call.cuda_events[step.handover] = done
        call.moved[step.handover] = moved
    elif torch.device(target).type == "cpu" and device.type == "cpu":
        moved = value  # worker threads share memory: the tensor itself is handed over
    else:
        # A value that is not one tensor, or one from a CPU worker to a GPU: copied on the
        # current stream of the GPU it involves (the source's, else the destination's); the
        # event tells its readers' streams when the copy is done.
        moved = move(value, target)
        gpu = device if device.type == "cuda" else torch.device(target)
        if gpu.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(gpu))
            call.cuda_events[step.handover] = done
            call.moved[step.handover] = moved
    call.values[step.key] = moved
    call.ready[step.handover].set()


def _record(value: Any, stream: torch.cuda.Stream) -> None:
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


def wait(call: Call, step: RunStep, device: torch.device) -> None:
    """Block until the handovers ``step`` reads are done; on CUDA, order the stream after them."""
    for number in step.waits:
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


def _stream(streams: Streams, key: Any, device: torch.device) -> torch.cuda.Stream:
    """The CUDA stream kept under ``key``, made on ``device`` the first time."""
    stream = streams.get(key)
    if stream is None:
        stream = streams[key] = torch.cuda.Stream(device)
    return stream


Functions = Mapping[int, Callable[[], None]]  # segment index -> its call in this forward


def _work(call: Call, steps: Sequence[RunStep | HandoverStep], functions: Functions,
          worker: _Worker, copy_streams: Streams, finished: threading.Semaphore,
          modes: tuple[bool, bool]) -> None:
    try:
        grad, inference = modes  # the caller's thread-local state
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            for step in steps:
                run_step(call, step, functions, worker.device, copy_streams)
    except _Failed:
        pass
    except BaseException as error:
        call.fail(error)
    finally:
        finished.release()


def run_step(call: Call, step: RunStep | HandoverStep, functions: Functions,
             device: torch.device, copy_streams: Streams) -> None:
    """Run a segment once its handovers are done, or hand a value over; then drop the values
    this step was the last to read."""
    if isinstance(step, RunStep):
        wait(call, step, device)
        functions[step.segment]()
    else:
        hand_over(call, step, device, copy_streams)
    for key in step.drops:
        call.values.pop(key, None)


def _launch(call: Call, entries: Sequence[WorkerProgram], functions: Functions,
            streams: Streams) -> None:
    """Issue the CUDA devices' steps (``entries``) from this thread, in segment order: every
    launch and copy is asynchronous, ordered by events, so no device waits on the host for
    another device's work. Each planned device runs on a stream of its own (two planned devices
    on one GPU still overlap), after the caller's stream."""
    merged = []
    for entry in entries:
        stream = _stream(streams, ("run", entry.planned), entry.device)
        stream.wait_stream(torch.cuda.current_stream(entry.device))  # the inputs the caller queued
        segment = -1
        for position, step in enumerate(entry.steps):
            if isinstance(step, RunStep):
                segment = step.segment
            merged.append((segment, position, entry.device, stream, step))
    merged.sort(key=lambda m: (m[0], m[1]))  # a handover right after its producer's segment
    try:
        for _, _, device, stream, step in merged:
            with torch.cuda.stream(stream):
                run_step(call, step, functions, device, streams)
    except _Failed:
        pass
    except BaseException as error:
        call.fail(error)
    for entry in entries:  # the caller's stream goes on after this work
        torch.cuda.current_stream(entry.device).wait_stream(streams[("run", entry.planned)])


def run_program(model: torch.nn.Module, program: Sequence[WorkerProgram], functions: Functions,
                call: Call) -> None:
    """Run ``program``: the CUDA devices' steps launched from the caller's thread (``_launch``),
    every other device's on a worker thread of its own; return when all are done, raising the
    first error any raised."""
    workers = model.__dict__.setdefault("_autoplace_workers", {})
    streams = model.__dict__.setdefault("_autoplace_copy_streams", {})
    finished = threading.Semaphore(0)
    threaded = [entry for entry in program if entry.device.type != "cuda"]
    for entry in threaded:
        worker = workers.get(entry.planned)
        if worker is None or worker.device != entry.device:
            worker = workers[entry.planned] = _Worker(entry.device)
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        worker.jobs.put(lambda steps=entry.steps, worker=worker, modes=modes: _work(
            call, steps, functions, worker, streams, finished, modes))
    launched = [entry for entry in program if entry.device.type == "cuda"]
    if launched:
        _launch(call, launched, functions, streams)
    for _ in threaded:
        finished.acquire()
    if call.error is not None:
        raise call.error
