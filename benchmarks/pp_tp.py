"""A pp 2 x tp 2 mesh on 4 gloo processes of this machine: checked, predicted and measured.

    python benchmarks/pp_tp.py      # writes benchmarks/results/pp-tp.md

For each example (MLP, GPT-2, Llama, T5) in inference and in training with AdamW:
``autoplace plan EXAMPLE --devices 4xcpu-process --tp 2 --pp 2 [--mode training --optimizer
adamw --replicas 1]`` (profiled): the model cut into 2 pipeline stages, each run by 2
tensor-parallel ranks (``pipeline/staged.py``), simulated, then run on 4 gloo processes (one
thread each) and checked against the original: outputs in inference; 3 AdamW steps' losses,
gradients and parameters in training. The table gives each stage's rank peak, the prediction
against what the ranks measured while planning, the check and the placement beside it. The
load average is printed: other work on the two cores slows the ranks. A row that stops gives
the error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

INFERENCE = ("mlp", "gpt2", "llama", "t5")
TRAINING = ("mlp", "gpt2", "llama", "t5")
TRAINING_FLAGS = ("--mode", "training", "--optimizer", "adamw", "--replicas", "1")


def _row(example: str, training: bool) -> str:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "autoplace.cli", "plan",
                               str(ROOT / "examples" / f"{example}.py"), "--devices",
                               "4xcpu-process", "--tp", "2", "--pp", "2", "--time-limit", "5",
                               "--out", str(out), *(TRAINING_FLAGS if training else ())],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - began
        if done.returncode:  # the row gives the error
            error = done.stderr.strip().splitlines()[-1].replace("|", "/")
            return (f"| {example} | {'training (AdamW)' if training else 'inference'} | "
                    f"stopped: {error} |||||||| {wall:.0f} | {load:.2f} |")
        plan = json.loads((out / "plan.json").read_text())
    tp = plan["tensor_parallel"]
    measured = tp.get("measured_s")
    return (f"| {example} | {'training (AdamW)' if training else 'inference'} | "
            f"{tp['columns']} / {tp['rows']} | "
            f"{', '.join(f'{b / 1e6:.1f}' for b in tp['stage_peak_bytes'])} | "
            f"{tp['makespan_s'] * 1e3:.1f} | {measured * 1e3:.1f} | "
            f"{measured / tp['makespan_s']:.2f} | {tp['check']} ({tp['max_abs_diff']:.1e}) | "
            f"{plan['makespan_s'] * 1e3:.1f} | {wall:.0f} | {load:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "pp-tp.md"))
    args = parser.parse_args(argv)
    rows = [_row(e, False) for e in INFERENCE] + [_row(e, True) for e in TRAINING]
    lines = [
        "# A pp 2 x tp 2 mesh on 4 gloo processes: checked, predicted and measured", "",
        f"{machine_line()}. Command: `python benchmarks/pp_tp.py`: `autoplace plan EXAMPLE "
        "--devices 4xcpu-process --tp 2 --pp 2 --time-limit 5` (training: `--mode training "
        "--optimizer adamw --replicas 1`, one micro-batch a step; profiled). *stage peaks*: "
        "each stage's rank peak, simulated (MB); *predicted*: a pass, or a step, through the "
        "stages, simulated (four processes on two cores priced at 2x each); *measured*: the "
        "median on the 4 gloo ranks (one thread each) while planning, after the checked pass or "
        "steps; *check*: outputs equal in inference, 3 AdamW steps' losses, gradients and "
        "parameters equal in training (`torch.testing.assert_close`), the largest difference; "
        "*placement*: the plan's own makespan or step, which it keeps (faster here); *wall*: "
        "the planning process; *load*: the 1-minute load average before it.",
        "",
        "| example | mode | split (columns / rows) | stage peaks (MB) | predicted (ms) | "
        "measured (ms) | measured / predicted | check (max abs diff) | placement (ms) | "
        "wall (s) | load |",
        "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|",
        *rows,
    ]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
