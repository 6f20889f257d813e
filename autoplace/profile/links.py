"""Measure the link between two devices here: copy tensors of growing size, fit latency and
bandwidth.

A copy of ``n`` bytes is modelled as ``latency_s + n / bandwidth_bytes_per_s`` (the alpha-beta
model of ``cost_models.roofline.transfer_time_s``). ``measure_link`` times ``dst.copy_(src)``
into a buffer allocated beforehand on the destination, for sizes from 4 KiB to 64 MiB, each a
stable median (``timing.measure``), and ``fit_alpha_beta`` fits the line by least squares on
relative error, so the small copies (which set the latency) weigh as much as the large ones
(which set the bandwidth). The copy is the one the emitted model makes (``Tensor.to`` from
ordinary, pageable memory), not a pinned-memory best case. Between two ``cpu-thread`` workers
no byte moves (the threads share memory): ``measure_handover`` times the wake-up of a
thread that slept instead.
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


def measure_handover(*, rounds: int = 100, idle_s: float = 1e-3) -> float:
    """Seconds from one thread setting a ``threading.Event`` to another thread, asleep on it
    for ``idle_s``, running on: the median of ``rounds``. This is how the emitted runtime hands
    a value from one ``cpu-thread`` worker to another, whose thread sleeps in ``wait`` until
    then; a thread that slept wakes slower than one just gone to sleep (13 us after none, 43 us
    after 1 ms and 80 us after 5 ms on this project's 2-core machine, whose CPUs are a virtual
    machine's), and a worker waits about a segment's time, so ``idle_s`` is 1 ms."""
    import statistics
    import threading
    import time

    ping, pong = threading.Event(), threading.Event()
    set_at = [0.0]
    woke: list[float] = []

    def echo() -> None:
        for _ in range(rounds):
            ping.wait()
            woke.append(time.perf_counter() - set_at[0])
            ping.clear()
            pong.set()

    partner = threading.Thread(target=echo, daemon=True)
    partner.start()
    for _ in range(rounds):
        began = time.perf_counter()
        while time.perf_counter() - began < idle_s:  # the partner sleeps meanwhile
            pass
        set_at[0] = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
    partner.join()
    return statistics.median(woke)
