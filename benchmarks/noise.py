"""Run-to-run noise of a measured forward pass, the figure ``--min-gain``'s default rests on.

Each example runs on one CPU thread: 3 warm-up passes, then 7 rounds of 9 passes; the spread
of the 7 round medians (standard deviation over their median) is what a user comparing two
placements by measurement would see.

    PYTHONPATH=. python benchmarks/noise.py
"""

from __future__ import annotations

import runpy
import statistics
import sys
import time

import torch
from common import ROOT


def main() -> int:
    torch.set_num_threads(1)
    for name in ("mlp", "gpt2"):
        built = runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["build"]()
        model, inputs = built[0].eval(), built[1]
        args, kwargs = ((), inputs) if isinstance(inputs, dict) else (
            inputs if isinstance(inputs, tuple) else (inputs,), {})
        with torch.no_grad():
            for _ in range(3):
                model(*args, **kwargs)
            medians = []
            for _ in range(7):
                times = []
                for _ in range(9):
                    began = time.perf_counter()
                    model(*args, **kwargs)
                    times.append(time.perf_counter() - began)
                medians.append(statistics.median(times))
        mid = statistics.median(medians)
        spread = (max(medians) - min(medians)) / mid
        print(f"{name}: median {mid * 1e3:.3f} ms, round medians' stdev "
              f"{statistics.stdev(medians) / mid:.1%}, span {spread:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
