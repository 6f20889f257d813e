"""The emitted training step against the original: every example, schedule and micro-batch count.

    python benchmarks/training_check.py    # writes benchmarks/results/training-check.md
    python benchmarks/training_check.py --dtype bfloat16   # ...-bf16.md: mixed precision

For MLP, LeNet and GPT-2 (``examples/``), each planned for one Adam step on ``2xcpu-thread``
(analytic costs, ``--min-gain 0`` so that the step is split over both workers wherever a split
is no slower), under GPipe and 1F1B with M = 1, 2 and 4 micro-batches, and as 2 data-parallel
replicas (2 gloo processes on 127.0.0.1; DistributedDataParallel with M = 1, and with M = 2 under
GPipe and 1F1B each replica's micro-batches in the plan's order, then the gradients
all-reduced), and with every device recomputing (GPipe, M = 4; 1F1B, M = 2, R = 2): the plan's
own training check (``autoplace.emit.check.training.verify_training``,
``emit.distributed.replicas.verify_replicas``), which trains the emitted model 3 steps beside the
original on the whole batch on one device and compares the loss of every step, the gradients and the
updated parameters with ``torch.testing.assert_close``, and measures the emitted step's memory
against the plan's. A failing check raises: a row that is written passed. Issue 14's
correctness target.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

EXAMPLES = ("mlp", "lenet", "gpt2")
# (microbatches, schedule, replicas); with one micro-batch GPipe and 1F1B are one order.
# (microbatches, schedule, replicas, recompute); recompute "auto" recomputes only where a
# placement overflows (none of these do), "all" on every device.
CASES = ((1, "gpipe", 1, "auto"), (2, "gpipe", 1, "auto"), (2, "1f1b", 1, "auto"),
         (4, "gpipe", 1, "auto"), (4, "1f1b", 1, "auto"), (1, "gpipe", 2, "auto"),
         (2, "gpipe", 2, "auto"), (2, "1f1b", 2, "auto"), (4, "gpipe", 1, "all"),
         (2, "1f1b", 2, "all"))


def check(example: str, microbatches: int, schedule: str, replicas: int, recompute: str, *,
          time_limit_s: float, dtype: str = "float32") -> dict:
    from autoplace.config import Config, Cost, Solve, Training
    from autoplace.pipeline import plan
    from autoplace.trace.load import load_model_file

    loaded = load_model_file(ROOT / "examples" / f"{example}.py")
    began = time.perf_counter()
    planned, emitted = plan(
        loaded.model,
        loaded.kwargs or loaded.args,
        Config(
            devices="2xcpu-thread",
            mode="training",
            name=example,
            dtype=dtype,
            solve=Solve(time_limit_s=time_limit_s, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
            training=Training(
                optimizer="adam",
                microbatches=microbatches,
                schedule=schedule if microbatches > 1 else "auto",
                replicas=replicas,
                recompute=recompute,
            ),
        ),
        loss=loaded.loss,
        example_targets=loaded.targets,
    )
    training = planned.training
    record = training.check
    return {"example": example, "microbatches": microbatches, "schedule": schedule,
            "ran": training.schedule,
            "replicas": replicas, "segments": len(emitted.segment_info),
            "devices": sorted(set(emitted.planned_devices)), "status": record.status,
            "losses": list(record.losses), "original": list(record.original_losses),
            "loss_diff": max(abs(a - b) for a, b in zip(record.losses,
                                                          record.original_losses)),
            "grad_diff": record.max_abs_diff_gradients,
            "param_diff": record.max_abs_diff_parameters,
            "apart": record.ill_conditioned_elements or 0,
            "recompute": list(training.recompute or ()),
            "memory": max((v["measured_bytes"] / v["predicted_bytes"]
                           for v in (record.peak_bytes or {}).values()
                           if v["predicted_bytes"]), default=None),
            "skipped": record.skipped_steps or 0,
            "step_ms": planned.makespan_s * 1e3, "wall_s": time.perf_counter() - began}


def _schedule(row: dict) -> str:
    if row["microbatches"] == 1:
        return "-"
    if row["ran"] != row["schedule"]:
        return f"{row['schedule']} asked, {row['ran']} ran (devices feed each other both ways)"
    return row["schedule"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--dtype", default="float32",
                        help="float32 (default), bfloat16 or float16: mixed precision, its "
                        "own tolerances (docs/training.md); replicas in a half dtype are not "
                        "built, so the R = 2 rows are left out")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    half = args.dtype != "float32"
    suffix = {"float32": "", "bfloat16": "-bf16", "float16": "-fp16"}[args.dtype]
    args.out = args.out or str(RESULTS / f"training-check{suffix}.md")
    rows = []
    for example in args.only:
        for m, schedule, r, recompute in CASES:
            if half and r > 1:
                continue
            rows.append(check(example, m, schedule, r, recompute,
                              time_limit_s=args.time_limit, dtype=args.dtype))
            print(rows[-1], flush=True)
    tolerances = (
        "(rtol 1.3e-6, atol 1e-4 of the tensor's largest magnitude; under Adam, elements whose "
        "update divides a gradient of about eps by itself on both sides are set apart and "
        "re-synced, counted in *apart*)" if not half else
        f"in {args.dtype} mixed precision (`dtype='{args.dtype}'`: float32 master weights"
        + (", the loss scaled as torch.amp.GradScaler does; a step whose gradients overflowed "
           "on either side is skipped on both, counted in *skipped*, and its loss listed"
           if args.dtype == "float16" else "")
        + "), the original accumulating the same micro-batches, the losses with the dtype's "
        "tolerance, the gradients against the original's in float32 (within 8 times the half "
        "original's own error), each update from the same masters and gradients with "
        "float32's (docs/training.md, Mixed precision; *gradient*: the largest difference "
        "from the half original's; *apart* as for float32)")
    lines = [
        "# The emitted training step against the original"
        + (f", {args.dtype} mixed precision" if half else ""), "",
        f"{machine_line()}. Command: `python benchmarks/training_check.py --time-limit "
        f"{args.time_limit:g}" + (f" --dtype {args.dtype}" if half else "") + "`. Each row: "
        "`autoplace.plan(EXAMPLE, Config(devices='2xcpu-thread', mode='training', "
        "dtype=..., solve=Solve(min_gain=0), training=Training(optimizer='adam', "
        "microbatches=M, schedule=S, replicas=R, recompute=...)))`, whose training check "
        "trains the emitted model "
        "3 Adam steps beside the original on the whole batch (one device, one process) and "
        "compares each step's loss, the gradients and the updated parameters with "
        "`torch.testing.assert_close` " + tolerances + ". With M > 1 the emitted model runs "
        "each segment's forward and backward per micro-batch in the plan's order; with R = 2 "
        "the replicas train as 2 gloo processes, under DistributedDataParallel with M = 1, and "
        "with M = 2 each on its shard's micro-batches in the plan's order, the gradients "
        "all-reduced (bucketed) and divided by R after them. A failing check raises, so "
        "every row below passed. With one micro-batch GPipe and 1F1B are the same order. "
        "*recomputing on*: the devices whose segments run each micro-batch's forward again "
        "before its backward (`recompute='all'`; `auto` recomputes only where a placement "
        "overflows, and none here does). *memory*: the emitted step's peak (the second "
        "step) measured per device (`emit.check.memory.measure_step`, one process, replica 0's "
        "batch) over the plan's, the largest of the devices; the check fails above 1.", "",
        "| example | M | schedule | R | recomputing on | segments (devices) | losses, steps "
        "1-3 | largest loss difference | gradient | parameter | apart | "
        + ("skipped | " if half else "") + "memory, measured / planned | predicted step "
        "(ms) | plan + check (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if half else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r['example']} | {r['microbatches']} | "
            f"{_schedule(r)} | {r['replicas']} | {', '.join(r['recompute']) or '-'} | "
            f"{r['segments']} ({', '.join(r['devices'])}) | "
            f"{', '.join(f'{v:.5f}' for v in r['losses'])} | {r['loss_diff']:.1e} | "
            f"{r['grad_diff']:.1e} | {r['param_diff']:.1e} | {r['apart']} | "
            + (f"{r['skipped']} | " if half else "")
            + f"{'-' if r['memory'] is None else format(r['memory'], '.2f')} | "
            f"{r['step_ms']:.3f} | {r['wall_s']:.1f} |")
    return write_markdown(Path(args.out), lines)


if __name__ == "__main__":
    raise SystemExit(main())
