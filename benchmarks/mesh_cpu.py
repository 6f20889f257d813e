"""Tensor parallelism on a mesh: tp 2, and dp 2 x tp 2 (trained with FSDP2 or averaged
gradients over dp), on this machine's CPU processes (gloo), in training and inference.

    python benchmarks/mesh_cpu.py          # writes benchmarks/results/mesh-cpu.md

For each model (the MLP and GPT-2 examples; the Llama and T5 examples with a batch of 2, so
that two data-parallel groups divide it, T5 with a cross-entropy loss on its decoder's logits):
``autoplace plan MODEL --mode training --optimizer adamw --devices Nxcpu-process --tp 2
[--dp 2 --fsdp on|off]`` (profiled), whose tensor-parallel candidate is trained 3 steps on N
gloo ranks against the original (losses, gradients gathered whole, updated parameters:
``assert_close``); then ``autoplace run OUT --nproc N --tensor-parallel --train 5 --json``
trains the emitted ``OUT/tensor_parallel/train.py`` under torchrun and times it. The table
gives the check, its largest difference, the predicted step against both measurements, and the
1-minute load average before the plan: four ranks share two cores. Then inference: ``autoplace
plan MODEL --devices Nxcpu-process --tp 2 [--dp 2]``, its outputs checked on N gloo ranks
against the original's, then ``autoplace run OUT --nproc N --tensor-parallel --json``.
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

from benchmarks.common import RESULTS, batch_of_2, cli_json, machine_line, write_markdown  # noqa: E402

MODELS = ("mlp", "gpt2", "llama", "t5")
MESHES = {"tp 2": ("2xcpu-process", ()),
          "dp 2 x tp 2, FSDP2": ("4xcpu-process", ("--dp", "2", "--fsdp", "on")),
          "dp 2 x tp 2, averaged": ("4xcpu-process", ("--dp", "2", "--fsdp", "off"))}
INFERENCE = {"tp 2": ("2xcpu-process", ()), "dp 2 x tp 2": ("4xcpu-process", ("--dp", "2"))}
STEPS = 5
def _planned_and_run(model: str, devices: str, plan_flags: list[str], run_flags: list[str]
                     ) -> tuple[dict, dict, float] | str:
    """``autoplace plan MODEL --devices DEVICES --tp 2 PLAN_FLAGS`` and then ``autoplace run OUT
    --nproc N --tensor-parallel RUN_FLAGS --json``: the plan's ``tensor_parallel``, the run's
    report and the plan's wall seconds; or the plan's last error line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        began = time.perf_counter()
        planned = subprocess.run(
            [sys.executable, "-m", "autoplace.cli", "plan", str(batch_of_2(model, Path(tmp))),
             "--devices", devices, "--tp", "2", *plan_flags, "--time-limit", "2", "--out",
             str(out), "--quiet"], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - began
        if planned.returncode:
            return (planned.stderr.strip().splitlines() or ["?"])[-1]
        tp = json.loads((out / "plan.json").read_text())["tensor_parallel"]
        ran = cli_json("run", str(out), "--nproc", devices[0], "--tensor-parallel", *run_flags)
    return tp, ran, wall


def _against(tp: dict, ran: dict) -> str:
    """The predicted step or pass against the plan's measurement and ``autoplace run``'s."""
    predicted, at_plan = tp["makespan_s"], tp.get("measured_s")
    return (f"{predicted * 1e3:.1f} | "
            + (f"{at_plan * 1e3:.1f} | {at_plan / predicted:.2f}" if at_plan else "n/a | n/a")
            + f" | {ran['measured_s'] * 1e3:.1f} | {ran['measured_s'] / predicted:.2f}")


def _row(model: str, mesh: str) -> str:
    devices, extra = MESHES[mesh]
    load = os.getloadavg()[0]
    found = _planned_and_run(model, devices, ["--mode", "training", "--optimizer", "adamw",
                                              *extra, "--no-check-memory"],
                             ["--train", str(STEPS)])
    if isinstance(found, str):
        return f"| {model} | {mesh} | failed: {found} |" + " |" * 11
    tp, ran, wall = found
    shard = (f"fsdp {tp['weighed_sharding']['fsdp'] * 1e3:.1f} / ddp "
             f"{tp['weighed_sharding']['ddp'] * 1e3:.1f}" if tp.get("weighed_sharding") else "")
    return (f"| {model} | {mesh} | {tp['check']} | {tp.get('max_abs_diff', 0):.1e} | "
            f"{tp['columns']} / {tp['rows']} | {_against(tp, ran)} | "
            f"{', '.join(f'{v:.4f}' for v in ran['losses'][:3])} | {wall:.0f} | {load:.2f} |"
            + (f" {shard} |" if shard else " |"))


def _inference_row(model: str, mesh: str) -> str:
    devices, extra = INFERENCE[mesh]
    load = os.getloadavg()[0]
    found = _planned_and_run(model, devices, list(extra), [])
    if isinstance(found, str):
        return f"| {model} | {mesh} | failed: {found} |" + " |" * 8
    tp, ran, _ = found
    return (f"| {model} | {mesh} | {tp['check']} | {tp.get('max_abs_diff', 0):.1e} | "
            f"{ran['max_abs_diff']:.1e} | {_against(tp, ran)} | {load:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    parser.add_argument("--meshes", nargs="*", default=list(MESHES))
    parser.add_argument("--out", default=str(RESULTS / "mesh-cpu.md"))
    args = parser.parse_args(argv)
    rows = []
    for model in args.only:
        for mesh in args.meshes:
            rows.append(_row(model, mesh))
            print(rows[-1], flush=True)
    inference = []
    for model in args.only:
        for mesh in INFERENCE:
            inference.append(_inference_row(model, mesh))
            print(inference[-1], flush=True)
    lines = [
        "# Tensor parallelism on a mesh of CPU processes: tp 2 and dp 2 x tp 2, trained and run",
        "",
        f"{machine_line()}. Command: `python benchmarks/mesh_cpu.py`. "
        "`autoplace plan MODEL --mode training --optimizer adamw --devices Nxcpu-process --tp 2 "
        "[--dp 2 --fsdp on|off] --time-limit 2 --no-check-memory` (profiled; Llama and T5 with a "
        "batch of 2, T5 with a cross-entropy loss on its decoder's logits: "
        "`benchmarks/mesh_cpu.py`). *check*: the plan's own, 3 AdamW steps of the candidate on "
        "N gloo ranks against the original, every dropout at zero (losses, gradients gathered "
        "whole, parameters; *largest difference* of gradients and parameters); *split*: column "
        "/ row matmuls; *predicted*: rank 0's step simulated (`plan.json` "
        "`tensor_parallel.makespan_s`); *measured at plan time*: the check's median step; "
        f"*measured by `autoplace run`*: `autoplace run OUT --nproc N --tensor-parallel --train "
        f"{STEPS} --json`, rank 0's median of steps 2 on; *losses*: that run's first three "
        "(rank 0's, the mean over dp; dropout on, so GPT-2's and T5's differ from row to row, "
        "while the check compares with it at zero); *plan s*: the whole `autoplace plan`; "
        "*load*: the 1-minute load average before it. With `--fsdp auto` both shardings are "
        "priced (the last column, ms) and the faster kept; here each is asked for.",
        "",
        "| model | mesh | check | largest difference | split | predicted step (ms) | "
        "measured at plan time (ms) | / predicted | measured by `autoplace run` (ms) | / "
        "predicted | losses | plan s | load | weighed |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
        *rows,
        "",
        "## Inference",
        "",
        "`autoplace plan MODEL --devices Nxcpu-process --tp 2 [--dp 2] --time-limit 2` (the "
        "same models): *check*: the candidate's outputs on N gloo ranks against the original's "
        "(`assert_close`; with dp each tp group on half the batch, the outputs joined in batch "
        "order); *difference by `autoplace run`*: `autoplace run OUT --nproc N "
        "--tensor-parallel --json` against the one-device model; *predicted*: one group's pass "
        "on its share of the batch; the measured passes are medians of 5.",
        "",
        "| model | mesh | check | largest difference | difference by `autoplace run` | "
        "predicted pass (ms) | measured at plan time (ms) | / predicted | measured by "
        "`autoplace run` (ms) | / predicted | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *inference,
    ]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
