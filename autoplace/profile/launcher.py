"""What the emitted runtime's launcher thread pays on a GPU here, measured (``ir.HostCosts``):
one segment call beyond its ops, and one handover.

The runtime's own engine (``emit.runtime.RUNTIME_SOURCE``, as ``emit.codegen.runtime_namespace``
loads it for every generated forward) is run, not a copy of it: a segment
call is a closure that reads its input from the call's values, calls a one-op ``GraphModule``
and stores its output, timed against the bare op; a handover is the engine's ``_hand_over``
followed by the reader's ``_wait``, between two streams of the one GPU. Nothing is synchronised
while the host is timed, as in the runtime; the medians of ``rounds`` batches are returned.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["measure_launcher"]


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def measure_launcher(torch_device: str, *, calls: int = 500,
                     rounds: int = 5) -> tuple[float, float]:
    """``(segment call, handover)`` seconds of host time on CUDA device ``torch_device``."""
    from autoplace.emit.codegen import runtime_namespace

    device = torch.device(torch_device)
    engine = runtime_namespace()
    x = torch.zeros(16, device=device)
    gm = torch.fx.symbolic_trace(_AddOne())
    call = engine["_Call"](1)
    call.values["x"] = x
    streams: dict = {}
    reader = torch.cuda.Stream(device)
    hand = ("send", 0, "x", device, ("x", "reader"), ())
    wait = ("run", 0, (0,), ())

    def segment() -> None:
        call.values["y"] = gm(call.values["x"])

    def bare() -> None:
        call.values["y"] = call.values["x"] + 1

    def handover() -> None:
        call.ready[0].clear()
        engine["_hand_over"](call, hand, device, streams)
        with torch.cuda.stream(reader):
            engine["_wait"](call, wait, device)

    def per_call(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(rounds):
            torch.cuda.synchronize(device)
            began = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - began) / calls)
        torch.cuda.synchronize(device)
        return statistics.median(times)

    per_call(segment)  # warm up: kernels loaded, streams made
    per_call(handover)
    return max(0.0, per_call(segment) - per_call(bare)), per_call(handover)
