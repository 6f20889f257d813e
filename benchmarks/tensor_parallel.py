"""Tensor parallelism weighed beside the placement (``--tp 2``): predicted against measured.

    python benchmarks/tensor_parallel.py      # writes benchmarks/results/tensor-parallel.md

For each example (MLP, GPT-2, Llama, T5): ``autoplace plan EXAMPLE --devices 2xcpu-thread
--tp 2`` (profiled): the matmuls split as columns and rows from the traced graph, DTensor
observed on 2 fake ranks, rank 0 simulated with its ops and collectives measured here, then the
model run on 2 gloo processes (one thread each), checked against the original and timed (the
median of 5 passes); then ``autoplace run OUT --nproc 2 --tensor-parallel`` runs the emitted
candidate (``OUT/tensor_parallel/launch.py``) and times it again. The table gives the split,
the collectives a pass, the prediction against both measurements, and the placement's makespan
the candidate is weighed against. Then, for GPT-2
and Llama on 2xA100-40GB (analytic costs, DTensor's dispatch measured on this CPU), the
prediction only: no GPU here. The load average is printed: other work on the two cores slows
the gloo ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

EXAMPLES = ("mlp", "gpt2", "llama", "t5")
GPU_EXAMPLES = ("gpt2", "llama")


def _plan(example: str, devices: str, *extra: str) -> tuple[dict, dict | None]:
    """The plan of ``example`` with ``--tp 2`` and, on this machine's workers, what
    ``autoplace run OUT --nproc 2 --tensor-parallel --json`` measured of its emitted ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        subprocess.run([sys.executable, "-m", "autoplace.cli", "plan",
                        str(ROOT / "examples" / f"{example}.py"), "--devices", devices,
                        "--tp", "2", "--out", str(out), *extra],
                       capture_output=True, text=True, check=True, cwd=ROOT)
        ran = None
        if devices.endswith("cpu-thread"):
            ran = json.loads(subprocess.run(
                [sys.executable, "-m", "autoplace.cli", "run", str(out), "--nproc", "2",
                 "--tensor-parallel", "--json"],
                capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        return json.loads((out / "plan.json").read_text()), ran


def _row(example: str, devices: str, planned: tuple[dict, dict | None], load: float) -> str:
    plan, ran = planned
    tp = plan["tensor_parallel"]
    measured = tp.get("measured_s")
    here = devices.endswith("cpu-thread")
    ratio = f"{measured / tp['makespan_s']:.2f}" if measured and here else "n/a"
    run = (f"{ran['measured_s'] * 1e3:.2f} | {ran['measured_s'] / ran['predicted_s']:.2f}"
           if ran else "no GPU here | n/a")
    return (f"| {example} | {devices} | {tp['columns']} / {tp['rows']} | {tp['collectives']} "
            f"({tp['collective_bytes'] / 1e6:.2f} MB) | {tp['makespan_s'] * 1e3:.2f} | "
            + (f"{measured * 1e3:.2f}" if measured and here else "no GPU here") + f" | {ratio} | "
            f"{run} | {tp['check']} | {plan['makespan_s'] * 1e3:.2f} | "
            f"{'tp' if tp['makespan_s'] < plan['makespan_s'] else 'placement'} | {load:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--out", default=str(RESULTS / "tensor-parallel.md"))
    args = parser.parse_args(argv)
    rows = []
    for example in args.only:
        load = os.getloadavg()[0]
        rows.append(_row(example, "2xcpu-thread", _plan(example, "2xcpu-thread"), load))
    for example in (e for e in GPU_EXAMPLES if e in args.only):
        load = os.getloadavg()[0]
        rows.append(_row(example, "2xA100-40GB", _plan(example, "2xA100-40GB"), load))
    lines = [
        "# Tensor parallelism weighed beside the placement: predicted against measured", "",
        f"{machine_line()}. Command: `python benchmarks/tensor_parallel.py"
        + (f" --only {' '.join(args.only)}" if tuple(args.only) != EXAMPLES else "") + "`: "
        "`autoplace plan EXAMPLE --devices D --tp 2` (profiled on CPU workers, analytic on the "
        "A100s). *split*: column / row matmuls (`emit/distributed/tensor.py`); *collectives*: "
        "those DTensor inserts in a pass, observed on 2 fake ranks (`solve/tensor.py`); "
        "*predicted*: rank 0 simulated; *measured at plan time*: the median of 5 passes on 2 "
        "gloo processes of this machine (one thread each), after the checked one; *measured "
        "by `autoplace run`*: `autoplace run OUT --nproc 2 --tensor-parallel --json` right "
        "after the plan, the emitted `OUT/tensor_parallel/launch.py` under torchrun, its "
        "outputs checked against the one-device model (the median of 5 passes); "
        "*placement*: the plan's own makespan; *faster*: which the plan predicts faster (both "
        "are written: the placement's `model/`, the candidate's `tensor_parallel/`). The load "
        "average is the 1-minute one before the plan.",
        "",
        "| example | devices | split (columns / rows) | collectives a pass | predicted (ms) | "
        "measured at plan time (ms) | measured / predicted | measured by `autoplace run` "
        "(ms) | measured / predicted | outputs checked on 2 gloo ranks | "
        "placement (ms) | faster | load |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|",
        *rows,
    ]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
