"""How one piece of work is timed: a clock per device kind, and a loop that stops when the median
is stable.

``timer_for("cpu")`` is a ``ClockTimer`` (``time.perf_counter``, monotonic); ``timer_for("cuda:0")``
a ``CudaEventTimer`` (CUDA events on the current stream, so the GPU's time is measured, not the
launch). Both time a batch of calls and return seconds per call. ``measure`` warms up, then takes
samples until the median of all samples and the median of the first three quarters agree within
``rel_tol`` (a median that still moves means the machine is still settling), or a budget runs
out; it reports the median and the spread (interquartile range over median).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from autoplace.cluster.local import is_thread_worker, worker_threads

__all__ = ["ClockTimer", "CudaEventTimer", "Measurement", "Timer", "is_stable",
           "is_thread_worker", "measure", "relative_spread", "threads_for", "timer_for"]


class Timer(Protocol):
    """Times ``calls`` back-to-back calls of ``fn``; returns seconds per call."""

    def per_call_s(self, fn: Callable[[], object], calls: int) -> float: ...


class ClockTimer:
    """Wall time with the monotonic ``time.perf_counter``: what a CPU op costs its caller.

    ``clock`` may be another clock, such as ``time.thread_time`` (the CPU time of the calling
    thread, which a busy machine's other processes do not inflate; only right when torch runs
    one intra-op thread): benchmarks use it to tell contention from cost.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def per_call_s(self, fn: Callable[[], object], calls: int) -> float:
        began = self.clock()
        for _ in range(calls):
            fn()
        return (self.clock() - began) / calls


class CudaEventTimer:
    """GPU time between two CUDA events recorded around the calls on the current stream."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self._torch = torch

    def per_call_s(self, fn: Callable[[], object], calls: int) -> float:
        cuda = self._torch.cuda
        with cuda.device(self.device):
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            cuda.synchronize()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / calls


def timer_for(torch_device: str) -> Timer:
    """The timer for a torch device: CUDA events on GPUs, the monotonic clock on the CPU, and
    the calling thread's CPU time on a ``cpu-thread`` worker (``cpu:N``), which runs torch on one
    thread: what the op costs the worker, not inflated by other processes sharing the cores."""
    if torch_device.startswith("cuda"):
        return CudaEventTimer(torch_device)
    return ClockTimer(time.thread_time) if is_thread_worker(torch_device) else ClockTimer()


@contextlib.contextmanager
def threads_for(torch_device: str) -> Iterator[None]:
    """Time a ``cpu-thread`` worker as the emitted runtime runs it: torch on one intra-op thread
    (restored afterwards); other devices as they are (``cluster.local.worker_threads``)."""
    with worker_threads([torch_device]):
        yield


@dataclass(frozen=True)
class Measurement:
    """``median_s`` per call, ``spread`` = interquartile range / median, ``samples`` taken and
    ``calls`` per sample."""

    median_s: float
    spread: float
    samples: int
    calls: int


def relative_spread(values: list[float]) -> float:
    """Interquartile range over median (the range over the median below 4 values)."""
    if len(values) < 4:
        return (max(values) - min(values)) / statistics.median(values)
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def is_stable(values: list[float], rel_tol: float) -> bool:
    """Whether the median of all ``values`` is within ``rel_tol`` of the median of their first
    three quarters: more samples no longer move it."""
    recent = statistics.median(values)
    earlier = statistics.median(values[: max(3, len(values) * 3 // 4)])
    return abs(recent - earlier) <= rel_tol * recent


def measure(
    fn: Callable[[], object],
    *,
    timer: Timer,
    warmup: int = 2,
    min_samples: int = 5,
    max_samples: int = 40,
    rel_tol: float = 0.03,
    sample_s: float = 2e-3,
    budget_s: float = 1.0,
) -> Measurement:
    """Median seconds per call of ``fn``, after warm-up, until the median is stable.

    Each sample batches enough calls to last about ``sample_s`` (short ops are otherwise lost in
    the clock's own cost). Stops once ``min_samples`` are in and the median moved less than
    ``rel_tol``, at ``max_samples``, or when ``budget_s`` of sampling is spent. Exceptions from
    ``fn`` propagate: the caller decides what a failing op means.
    """
    first = timer.per_call_s(fn, 1)
    for _ in range(max(warmup - 1, 0)):
        first = min(first, timer.per_call_s(fn, 1))
    calls = max(1, min(1000, int(sample_s / max(first, 1e-7))))
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < max_samples:
        samples.append(timer.per_call_s(fn, calls))
        if len(samples) >= min_samples and is_stable(samples, rel_tol):
            break
        if time.perf_counter() - began > budget_s and len(samples) >= 3:
            break
    return Measurement(median_s=statistics.median(samples), spread=relative_spread(samples),
                       samples=len(samples), calls=calls)
