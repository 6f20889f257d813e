"""GPT-2 training on 4xA100-40GB with AdamW, batch 8: the plan, its memory and its schedule.

    python benchmarks/gpt2_training.py     # writes benchmarks/results/gpt2-training-4xa100.md
    python benchmarks/gpt2_training.py --dtype bfloat16   # ...-4xa100-bf16.md, mixed precision

The example GPT-2 (``examples/gpt2.py``: 6 layers, width 384, a vocabulary of 8,000, tied
embeddings) with a batch of 8 sequences of 128 tokens, planned for one AdamW step on the
catalog's 4xA100-40GB (analytic costs: no GPU here), every way the planner offers: data-parallel
replicas R = 1, 2, 4 (``--replicas auto``, one micro-batch), one replica over the four GPUs
with M = 2, 4 and 8 micro-batches (``--schedule auto``: GPipe and 1F1B), and M = 2 with
``--replicas auto`` (replicas of a micro-batched step). For each, the
predicted step time and the chosen schedule and R; for the fastest, the memory of each device
split into parameters, gradients, optimizer state and activations
(``train.breakdown.memory_breakdown``). Issue 14: "state the plan, the memory breakdown and the
chosen schedule and R".
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

BATCH, SEQ = 8, 128
DEVICES = "4xA100-40GB"


def _example():
    spec = importlib.util.spec_from_file_location("gpt2_example", ROOT / "examples" / "gpt2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan_one(microbatches: int, replicas: str | int, *, time_limit_s: float,
             dtype: str = "float32"):
    import torch

    from autoplace.config import Config, Cost, Emit, Solve, Training
    from autoplace.pipeline import plan

    example = _example()
    model, inputs = example.build(batch=BATCH, seq=SEQ)
    targets = torch.randint(0, 8000, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    began = time.perf_counter()
    planned = plan(
        model,
        inputs,
        Config(
            devices=DEVICES,
            mode="training",
            name="gpt2",
            dtype=dtype,
            solve=Solve(time_limit_s=time_limit_s, whatif=False),
            cost=Cost(profile=False),
            training=Training(optimizer="adamw", microbatches=microbatches, replicas=replicas),
            emit=Emit(model=False),
        ),
        loss=example.loss,
        example_targets=(targets,),
    ).plan
    return planned, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    from autoplace.train.breakdown import memory_breakdown
    from autoplace.train.precision import element_bytes as torch_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--dtype", default="float32",
                        help="float32 (default), or bfloat16 / float16: mixed precision "
                        "(Config(dtype=...)); the table is then ...-4xa100-bf16.md / -fp16.md")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    suffix = {"float32": "", "bfloat16": "-bf16", "float16": "-fp16"}[args.dtype]
    args.out = args.out or str(RESULTS / f"gpt2-training-4xa100{suffix}.md")
    runs = [(1, "auto"), (2, 1), (4, 1), (8, 1), (2, "auto")]
    rows = []
    for m, r in runs:
        planned, wall = plan_one(m, r, time_limit_s=args.time_limit, dtype=args.dtype)
        rows.append((m, r, planned, wall))
        print(m, r, planned.makespan_s, planned.training.schedule,
              planned.training.replicas, flush=True)
    best = min(rows, key=lambda row: row[2].makespan_s)
    lines = [
        f"# GPT-2 training on {DEVICES} with AdamW, batch {BATCH}"
        + (f", {args.dtype} mixed precision" if args.dtype != "float32" else ""), "",
        f"{machine_line()}. Command: `python benchmarks/gpt2_training.py --time-limit "
        f"{args.time_limit:g}" + (f" --dtype {args.dtype}" if args.dtype != "float32" else "")
        + "`."
        + (f" The model, its inputs and targets cast to {args.dtype} before tracing "
           "(`Config(dtype=...)`): weights, activations and gradients in "
           f"{args.dtype}, matmuls at the A100's {args.dtype} peak, and AdamW updating float32 "
           "master weights (docs/training.md, Mixed precision); data-parallel replicas in a "
           "half dtype are not built, so R = 1." if args.dtype != "float32" else "")
        + " `examples/gpt2.py` (6 layers, width 384, 6 heads, vocabulary "
        f"8,000, tied embeddings, 55 MB of weights) with {BATCH} sequences of {SEQ} tokens, "
        f"planned with `autoplace.plan(..., Config(devices='{DEVICES}', mode='training', "
        "training=Training(optimizer='adamw')))`: analytic costs (the catalog's A100, no "
        "GPU here), so the times "
        "are the roofline's and the launcher's, not measured. R = data-parallel replicas "
        "(each on 4/R GPUs, gradients all-reduced over NVLink, charged to the updates after "
        "the backward: an upper bound, DDP overlaps them; a micro-batched replica "
        "all-reduces after its whole backward, as charged), M = micro-batches. *step* is the "
        "plan's, after "
        "`--min-gain` (a split that gains less than 5% over the best single device is not "
        "made), so it can be above the replica option's own time.", "",
        "| asked | R kept | M | schedule kept | step (ms) | every option tried (ms per step) | "
        "devices used | peak per device (MB) | plan (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r, planned, wall in rows:
        t = planned.training
        options = "; ".join(f"R={o.replicas}: {o.step_s * 1e3:.3f}"
                            for o in t.replica_options or () if o.step_s is not None)
        schedules = [n for n in planned.notes if n.startswith("schedule:")]
        if schedules:
            options += "; " + schedules[0].removeprefix("schedule: ")
        used = sorted(set(planned.schedule.placement.device_of.values()))
        peaks = ", ".join(f"{planned.schedule.peak_bytes[d] / 1e6:.0f}" for d in used)
        lines.append(f"| M={m}, R={r} | {t.replicas} | {t.microbatches} | "
                     f"{t.schedule if t.microbatches > 1 else '-'} | "
                     f"{planned.makespan_s * 1e3:.3f} | {options} | {', '.join(used)} | {peaks} | "
                     f"{wall:.1f} |")
    m, r, planned, _ = best
    t = planned.training
    parts = memory_breakdown(planned.problem, planned.schedule)
    lines += [
        "", f"**The plan:** R = {t.replicas} replica(s) of "
        f"{len(planned.problem.cluster.devices)} GPU(s), M = {t.microbatches}"
        + (f", {t.schedule}" if t.microbatches > 1 else "")
        + f": {planned.makespan_s * 1e3:.3f} ms per step of {BATCH} sequences. Its memory per "
        "device (of one replica; every replica holds the same), in MB:", "",
        "| device | runtime reserve | parameters | gradients | AdamW state"
        + (" (with the float32 masters)" if args.dtype != "float32" else "")
        + " | activations | peak | capacity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d, part in parts.items():
        lines.append(
            f"| {d} | {part['reserved_bytes'] / 1e6:.1f} | {part['parameter_bytes'] / 1e6:.1f} | "
            f"{part['gradient_bytes'] / 1e6:.1f} | {part['optimizer_state_bytes'] / 1e6:.1f} | "
            f"{part['activation_bytes'] / 1e6:.1f} | {planned.schedule.peak_bytes[d] / 1e6:.1f} | "
            f"{planned.problem.cluster.device(d).memory_bytes / 1e6:.0f} |")
    held = sum(p["parameter_bytes"] + p["gradient_bytes"] + p["optimizer_state_bytes"]
               for p in parts.values())
    count = sum(n.trainable_bytes for n in planned.problem.graph.nodes) / torch_bytes(args.dtype)
    lines += ["", f"Parameters, gradients and optimizer state together: {held / 1e6:.1f} MB "
              f"for {count / 1e6:.2f} M trained parameters, {held / count:.2f} bytes each "
              "(ZeRO's 16 for Adam-style optimizers, in float32 or in mixed precision; "
              "buffers add a little)."]
    why = [n for n in planned.notes if n.startswith(("data-parallel replicas", "schedule:"))]
    lines += ["", "Why, in the plan's own words: " + " ".join(why)]
    return write_markdown(Path(args.out), lines)


if __name__ == "__main__":
    raise SystemExit(main())
