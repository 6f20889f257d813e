"""Measure the link between two devices here: copy tensors of growing size, fit latency and
bandwidth.

A copy of ``n`` bytes is modelled as ``latency_s + n / bandwidth_bytes_per_s`` (the alpha-beta
model of ``cost_models.roofline.transfer_time_s``). ``measure_link`` times ``dst.copy_(src)``
into a buffer allocated beforehand on the destination, for sizes from 4 KiB to 64 MiB, each a
stable median (``timing.measure``), and ``fit_alpha_beta`` fits the line by least squares on
relative error, so the small copies (which set the latency) weigh as much as the large ones
(which set the bandwidth). The copy is the one the emitted model makes (``Tensor.to`` from
ordinary, pageable memory), not a pinned-memory best case. Between two ``cpu-thread`` workers
no byte moves (the threads share memory): ``measure_handover`` times what two threads taking
turns at real work pay per handover instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoplace.profile.timing import Timer, measure, timer_for

__all__ = ["DEFAULT_SIZES", "fit_alpha_beta", "measure_handover", "measure_link"]

DEFAULT_SIZES = tuple(4096 * 4**k for k in range(8))  # 4 KiB .. 64 MiB


def fit_alpha_beta(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(latency_s, bandwidth_bytes_per_s)`` of the line through ``(bytes, seconds)`` points,
    fitted on relative error; latency is kept >= 0. Needs two sizes at least."""
    if len({n for n, _ in points}) < 2:
        raise ValueError("fitting a link needs copies of at least two sizes")
    n = np.array([float(p[0]) for p in points])
    t = np.array([float(p[1]) for p in points])
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if latency < 0:  # the line goes below the origin: no measurable latency
        latency = 0.0
        per_byte = float(np.dot(n / t, np.ones_like(t)) / np.dot(n / t, n / t))
    if per_byte <= 0:
        raise ValueError(f"copy times do not grow with size ({list(zip(n, t))}): cannot fit a "
                         "bandwidth")
    return float(latency), float(1.0 / per_byte)


def measure_link(
    src: str,
    dst: str,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    timer: Timer | None = None,
) -> tuple[float, float, tuple[tuple[int, float], ...]]:
    """Copy ``sizes`` bytes from torch device ``src`` to ``dst``; return the fitted latency,
    bandwidth and the measured points. A GPU end is timed with CUDA events."""
    import torch

    if timer is None:
        gpu = dst if dst.startswith("cuda") else src
        timer = timer_for(gpu)
    points = []
    for nbytes in sizes:
        source = torch.empty(nbytes, dtype=torch.uint8, device=src).random_(0, 255)
        target = torch.empty(nbytes, dtype=torch.uint8, device=dst)
        m = measure(lambda s=source, d=target: d.copy_(s), timer=timer, min_samples=5,
                    max_samples=20, budget_s=0.5)
        points.append((nbytes, m.median_s))
        del source, target
    latency, bandwidth = fit_alpha_beta(points)
    return latency, bandwidth, tuple(points)


def measure_handover(*, rounds: int = 40, repeats: int = 5, work: int = 10) -> float:
    """Seconds one ``cpu-thread`` worker's handover to another costs, as the emitted runtime
    makes it between segments: two threads take turns, each running ``work`` matmuls of its
    own (4 x 512 by a 2 MiB weight, about 1 ms a turn here) and then setting the other's
    ``threading.Event``, ``rounds`` turns each; one thread running the same matmuls in the
    same order takes less, and the difference per turn is the handover: the sleeping thread's
    wake-up, and its core's caches and clock after the sleep. The median of ``repeats``.
    (On this project's 2-core machine, a virtual machine's CPUs, 60 to 220 us, where a bare
    event's wake-up took 13 us after no sleep and 43 us after 1 ms.)"""
    import statistics
    import threading
    import time

    import torch

    data = [(torch.randn(4, 512), torch.randn(1024, 512)) for _ in range(2)]

    def turn(i: int) -> None:
        x, weight = data[i]
        for _ in range(work):
            torch.nn.functional.linear(x, weight)

    def alone() -> float:
        began = time.perf_counter()
        for _ in range(rounds):
            turn(0)
            turn(1)
        return time.perf_counter() - began

    def taking_turns() -> float:
        events = [threading.Event(), threading.Event()]

        def worker(i: int) -> None:
            torch.set_num_threads(1)
            for _ in range(rounds):
                events[i].wait()
                events[i].clear()
                turn(i)
                events[1 - i].set()

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
        for thread in threads:
            thread.start()
        began = time.perf_counter()
        events[0].set()
        for thread in threads:
            thread.join()
        return time.perf_counter() - began

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = [(taking_turns() - alone()) / (2 * rounds) for _ in range(repeats)]
    finally:
        torch.set_num_threads(before)
    return max(statistics.median(costs), 1e-6)
