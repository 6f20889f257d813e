"""What the emitted runtime's launcher thread pays on a GPU here, measured (``ir.HostCosts``):
one segment call beyond its ops, and one handover; and the same for a CPU worker, whose own
thread pays them (``measure_worker``).

The runtime's own engine (``emit.runtime.engine``, as ``emit.codegen.source.runtime_namespace``
binds it for every generated forward) is run, not a copy of it; the caller hands it in, as the
profiler does not import the emitter. A segment call is a ``RunStep`` as ``_launch`` takes it
(``run_step`` on the segment's stream, the segment a one-op ``GraphModule`` reading and storing
its values), timed against the bare op. A handover is the engine's ``hand_over`` of a
``HandoverStep`` followed by the reader's ``wait``, to a second GPU where there is one (else
between two streams of the one GPU, as between two planned devices that share it). Nothing is
synchronised while the host is timed, as in the runtime; the medians of ``rounds`` batches are
returned."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["measure_launcher", "measure_worker"]


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class _Steps:
    """What both measurements run through ``engine``: a call holding value ``x``, a run step
    of a one-op segment (``functions``) and the bare op it runs, and a handover of ``x`` to
    ``target`` with the run step that waits for it."""

    def __init__(self, engine: Mapping[str, Any], x: torch.Tensor,
                 target: torch.device) -> None:
        gm = torch.fx.symbolic_trace(_AddOne())
        self.call = call = engine["_Call"](1)
        call.values["x"] = x
        self.hand = engine["_HandoverStep"](handover=0, value="x", target=target,
                                            key=("x", "reader"))
        self.wait = engine["_RunStep"](segment=0, waits=(0,))
        self.step = engine["_RunStep"](segment=0)
        self.functions = {0: lambda: call.values.__setitem__("y", gm(call.values["x"]))}

    def bare(self) -> None:
        self.call.values["y"] = self.call.values["x"] + 1


def _per_call(fn: Callable[[], None], calls: int, rounds: int,
              sync: Callable[[], None] = lambda: None) -> float:
    """Seconds per call of ``fn``: the median of ``rounds`` batches of ``calls``, ``sync``
    run before each batch and after the last."""
    times = []
    for _ in range(rounds):
        sync()
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - began) / calls)
    sync()
    return statistics.median(times)


def measure_launcher(torch_device: str, *, engine: Mapping[str, Any], calls: int = 500,
                     rounds: int = 5) -> tuple[float, float]:
    """``(segment call, handover)`` seconds of host time on CUDA device ``torch_device``, run
    by ``engine`` (the namespace ``emit.codegen.source.runtime_namespace()`` returns)."""
    device = torch.device(torch_device)
    # A handover copies to another GPU where there is one, as the runtime does between GPUs;
    # on one GPU it stays there, as between two planned devices that share it.
    others = [i for i in range(torch.cuda.device_count()) if i != device.index]
    target = torch.device("cuda", others[0]) if others else device
    it = _Steps(engine, torch.zeros(16, device=device), target)
    streams: dict = {}
    run = torch.cuda.Stream(device)
    reader = torch.cuda.Stream(target)

    def segment() -> None:  # a run step as ``_launch`` takes it: on its stream, via ``run_step``
        with torch.cuda.stream(run):
            engine["_run_step"](it.call, it.step, it.functions, device, streams)

    def handover() -> None:
        it.call.ready[0].clear()
        with torch.cuda.stream(run):
            engine["_hand_over"](it.call, it.hand, device, streams)
        with torch.cuda.stream(reader):
            engine["_wait"](it.call, it.wait, target)

    def per_call(fn: Callable[[], None]) -> float:
        return _per_call(fn, calls, rounds, sync=lambda: torch.cuda.synchronize(device))

    per_call(segment)  # warm up: kernels loaded, streams made
    per_call(handover)
    return max(0.0, per_call(segment) - per_call(it.bare)), per_call(handover)


def measure_worker(*, engine: Mapping[str, Any], calls: int = 500,
                   rounds: int = 5) -> tuple[float, float, float, float]:
    """``(segment call, handover, dispatch, switch)`` seconds a CPU worker's thread pays
    (``cpu-thread``, ``cpu-process``), run by ``engine`` on this thread on one intra-op thread,
    as a worker runs: a ``RunStep`` of a one-op segment timed against the bare op, a
    ``HandoverStep`` to another worker followed by the reader's ``wait`` (the reader's wake-up
    is the link's latency, ``links.measure_handover``), one op of one element called as
    generated code calls it (``torch.ops.aten``), nearly all of it dispatch; and taking the
    interpreter over from another thread: two threads calling that op at once each take
    ``2 x (dispatch + switch)`` per call. Medians of ``rounds`` batches of ``calls``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        device, target = torch.device("cpu", 0), torch.device("cpu", 1)
        it = _Steps(engine, torch.zeros(16), target)

        def segment() -> None:
            engine["_run_step"](it.call, it.step, it.functions, device, {})

        one, add = torch.zeros(1), torch.ops.aten.add.Tensor

        def dispatch() -> None:
            add(one, one)

        def handover() -> None:
            it.call.ready[0].clear()
            engine["_hand_over"](it.call, it.hand, device, {})
            engine["_wait"](it.call, it.wait, target)

        def per_call(fn: Callable[[], None]) -> float:
            return _per_call(fn, calls, rounds)

        per_call(segment)  # warm up
        alone = per_call(dispatch)
        return (max(0.0, per_call(segment) - per_call(it.bare)), per_call(handover), alone,
                max(0.0, _paired(dispatch, rounds) / 2 - alone))
    finally:
        torch.set_num_threads(before)


def _paired(fn: Callable[[], None], rounds: int, window_s: float = 0.05) -> float:
    """Seconds per call of ``fn`` on each of two threads calling it at once for ``window_s``,
    started together (the median over ``rounds``)."""
    import threading

    times = []
    for _ in range(rounds):
        counts: list[int] = []
        gate = threading.Barrier(2)

        def loop(counts: list[int] = counts, gate: threading.Barrier = gate) -> None:
            torch.set_num_threads(1)
            gate.wait()
            stop, done = time.perf_counter() + window_s, 0
            while time.perf_counter() < stop:
                fn()
                done += 1
            counts.append(done)

        threads = [threading.Thread(target=loop) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        times.append(window_s / max(statistics.mean(counts), 1))
    return statistics.median(times)
