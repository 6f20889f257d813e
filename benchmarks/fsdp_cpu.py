"""Sharded data-parallel replicas (FSDP2, ZeRO-3) on this machine's CPU, against DDP's.

    python benchmarks/fsdp_cpu.py      # writes benchmarks/results/fsdp-cpu.md

Step time. For each example (by default MLP, LeNet, GPT-2; ``--only llama t5`` builds those with
a batch of 2, ``benchmarks.common.batch_of_2``), two plans on ``2xcpu-thread``,
profiled (the default): ``autoplace plan EXAMPLE --mode training --fsdp on`` (2 sharded
replicas, FSDP2 ``fully_shard`` per block; their overhead over an unsharded step measured as
two gloo processes, ``autoplace/profile/allreduce.py`` mode fsdp) and ``--fsdp off --replicas
2`` (2 DDP replicas; the gradients' all-reduce measured the same way). Each is trained by
``autoplace run OUT --train STEPS --json`` ``--repeat`` times in fresh processes (the two
plans' runs alternate, so both see the same load), and the median step is set against the
plan's predicted step. The plans' own training checks (3 steps against the original) and
predicted peaks per device are given too. The load average is recorded: other processes on
these two cores take time from the ranks (``--quiet-below LOAD --wait S`` waits for a quieter
machine before each run, as ``benchmarks/training_cpu.py`` does).

Memory. With the Python API (analytic costs, ``Cost(profile=False)``; ``Emit(verify=False)``,
so no training check), each model planned with ``Training(fsdp="off", replicas=2)`` (DDP),
``Training(fsdp="on")`` and ``Training(fsdp="auto")`` (replicas auto) on two CPU workers whose
memory is capped (``benchmarks.common.capped``) at a few values: fractions of the uncapped DDP
plan's peak, and the uncapped DDP and FSDP peaks themselves and one byte under each. A cap at
which no plan fits raises ``InfeasibleError``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, batch_of_2, capped, machine_line, write_markdown  # noqa: E402

EXAMPLES = ("mlp", "lenet", "gpt2")
STEPS = {"mlp": 20, "lenet": 20, "gpt2": 10, "llama": 5, "t5": 5}
MODES = {"fsdp": ("--fsdp", "on"), "ddp": ("--fsdp", "off", "--replicas", "2")}
SPEC = "2xcpu-thread"
FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6)  # of the uncapped DDP plan's peak
MEASURED = re.compile(r"measured( before)?: ([\d.]+) ms a step")


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}] {text}",
          file=sys.stderr, flush=True)


def _autoplace(*argv: str) -> subprocess.CompletedProcess:
    """``autoplace ARGV``, which must succeed: else the benchmark stops with its error."""
    done = subprocess.run([sys.executable, "-m", "autoplace.cli", *argv], capture_output=True,
                          text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"autoplace {' '.join(argv)} exited with {done.returncode}: "
                         + (done.stderr.strip().splitlines() or ["(no output)"])[-1])
    return done


def wait_for_quiet(below: float | None, *, at_most_s: float) -> None:
    """Wait until the 1-minute load average is under ``below`` (``None``: no wait), for at
    most ``at_most_s`` (as ``benchmarks/training_cpu.py`` does)."""
    deadline = time.monotonic() + at_most_s
    while below is not None and os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(5)


# --- step time: autoplace plan and autoplace run --train, FSDP and DDP side by side
def step_times(example: str, *, repeat: int, time_limit_s: float, quiet: float | None = None,
               wait_s: float = 0.0) -> dict:
    steps = STEPS[example]
    with tempfile.TemporaryDirectory() as tmp:
        plans = {}
        for mode, flags in MODES.items():
            _say(f"plan {example} {' '.join(flags)}")
            out = Path(tmp) / mode
            _autoplace("plan", str(batch_of_2(example, Path(tmp))), "--devices", SPEC,
                       "--mode", "training", "--time-limit", str(time_limit_s), *flags,
                       "--out", str(out))
            plans[mode] = json.loads((out / "plan.json").read_text())
        runs = {mode: [] for mode in MODES}
        loads = []
        for _ in range(repeat):  # alternate: both plans' runs see the same machine
            for mode in MODES:
                wait_for_quiet(quiet, at_most_s=wait_s)
                loads.append(os.getloadavg()[0])
                _say(f"run {example} {mode} --train {steps}")
                runs[mode].append(json.loads(_autoplace(
                    "run", str(Path(tmp) / mode), "--train", str(steps), "--json").stdout))
        loads.append(os.getloadavg()[0])
    row = {"example": example, "steps": steps, "load": (min(loads), max(loads))}
    for mode, planned in plans.items():
        training = planned["training"]
        measured = sorted(r["measured_s"] for r in runs[mode])
        overhead = next((n for n in planned["notes"]
                         if n.startswith("gradients averaged across")), "")
        found = MEASURED.search(overhead)
        row[mode] = {
            "replicas": training["replicas"],
            "predicted_s": planned["makespan_s"],
            "measured_s": statistics.median(measured),
            "spread_s": (measured[0], measured[-1]),
            "check": training["check"]["status"],
            "peak_bytes": {d: m["peak_bytes"] for d, m in planned["memory"].items()},
            "measured_peak_bytes": {d: m["measured_bytes"] for d, m in
                                    (training["check"].get("peak_bytes") or {}).items()},
            "fastest_s": min(t for r in runs[mode] for t in (r["times_s"][1:] or r["times_s"])),
            "collective_ms": float(found.group(2)) if found else None,
            "collective_cached": bool(found and found.group(1)),
            "analytic_note": any("are analytic" in n for n in planned["notes"]),
        }
    return row


# --- memory: the smallest cap at which each kind of plan fits, by the plan itself
def _model(example: str):
    from autoplace.trace.load import load_model_file

    loaded = load_model_file(ROOT / "examples" / f"{example}.py")
    return loaded.model, loaded.kwargs or loaded.args, loaded.loss, loaded.targets


def _sharding(kept) -> str:
    """A plan's or a replica option's kind: one replica, DDP or FSDP replicas."""
    return "one replica" if kept.replicas == 1 else (kept.sharding or "ddp")


def _plan_at(example: str, cap: int | None, training: dict, *, time_limit_s: float) -> dict:
    from autoplace.config import Config, Cost, Emit, Solve, Training
    from autoplace.errors import InfeasibleError
    from autoplace.pipeline import plan

    model, inputs, loss, targets = _model(example)
    devices = SPEC if cap is None else capped(SPEC, cap)
    try:
        planned = plan(model, inputs, Config(
            devices=devices, mode="training", name=example,
            solve=Solve(time_limit_s=time_limit_s, whatif=False),
            cost=Cost(profile=False), emit=Emit(verify=False),
            training=Training(**training)), loss=loss, example_targets=targets).plan
    except InfeasibleError as error:
        return {"fits": False, "why": str(error).split(". ")[0]}
    kept = planned.training
    return {"fits": True, "replicas": kept.replicas, "sharding": _sharding(kept),
            "step_s": planned.makespan_s,
            "peak": max(planned.schedule.peak_bytes.values()),
            "options": [(o.replicas, _sharding(o), o.fits, o.step_s)
                        for o in kept.replica_options]}


KINDS = {"DDP (fsdp=off, R=2)": {"fsdp": "off", "replicas": 2},
         "FSDP (fsdp=on)": {"fsdp": "on"},
         "auto (fsdp=auto, R auto)": {}}


def memory_scan(example: str, *, time_limit_s: float) -> dict:
    _say(f"memory {example}: uncapped")
    ddp = _plan_at(example, None, KINDS["DDP (fsdp=off, R=2)"], time_limit_s=time_limit_s)
    fsdp = _plan_at(example, None, KINDS["FSDP (fsdp=on)"], time_limit_s=time_limit_s)
    caps = {round(f * ddp["peak"]) for f in FRACTIONS}
    caps |= {ddp["peak"], ddp["peak"] - 1, fsdp["peak"], fsdp["peak"] - 1}
    rows = []
    for cap in sorted(caps, reverse=True):
        _say(f"memory {example}: cap {cap}")
        rows.append((cap, {kind: _plan_at(example, cap, training, time_limit_s=time_limit_s)
                           for kind, training in KINDS.items()}))
    return {"example": example, "ddp": ddp, "fsdp": fsdp, "rows": rows}


# --- the tables
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.3f}"


def step_table(rows: list[dict]) -> list[str]:
    lines = [
        "| example | steps | FSDP: R | FSDP: predicted step (ms) | FSDP: measured step (ms), "
        "median (range) | FSDP: measured / predicted | FSDP: training check | DDP: R | DDP: "
        "predicted step (ms) | DDP: measured step (ms), median (range) | DDP: measured / "
        "predicted | DDP: training check | FSDP / DDP, predicted | FSDP / DDP, measured | "
        "fastest step / predicted, FSDP | fastest step / predicted, DDP | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["example"], str(r["steps"])]
        for mode in MODES:
            m = r[mode]
            cells += [str(m["replicas"]), _ms(m["predicted_s"]),
                      f"{_ms(m['measured_s'])} ({_ms(m['spread_s'][0])}-"
                      f"{_ms(m['spread_s'][1])})",
                      f"{m['measured_s'] / m['predicted_s']:.2f}", m["check"]]
        f, d = r["fsdp"], r["ddp"]
        cells += [f"{f['predicted_s'] / d['predicted_s']:.2f}",
                  f"{f['measured_s'] / d['measured_s']:.2f}",
                  f"{f['fastest_s'] / f['predicted_s']:.2f}",
                  f"{d['fastest_s'] / d['predicted_s']:.2f}",
                  f"{r['load'][0]:.2f}-{r['load'][1]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "", "*fastest step*: the shortest step of all of a plan's runs (each run's first "
        "left out), the one least disturbed by other work.", "",
        "What each plan charged for its collectives (the plan's note: measured as two gloo "
        "processes of this host, `autoplace/profile/allreduce.py`; *cached*: taken from the "
        "profile cache, measured by an earlier plan) and its predicted peak per replica device "
        "(plan.json `memory`), with the peak the plan's training check measured on that "
        "device (FSDP: rank 0 under torch's `FSDPMemTracker`; DDP: the emitted step in the "
        "planning process, `training.check.peak_bytes`):", "",
        "| example | FSDP: gathers, reduce-scatters and sharded update, measured (ms a step) | "
        "DDP: gradients' all-reduce, measured (ms a step) | FSDP: predicted peak (MB) | FSDP: "
        "measured peak (MB) | DDP: predicted peak (MB) | DDP: measured peak (MB) | FSDP / DDP "
        "peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, d = r["fsdp"], r["ddp"]
        fp, dp = max(f["peak_bytes"].values()), max(d["peak_bytes"].values())
        lines.append(
            f"| {r['example']} | "
            + " | ".join("n/a" if m["collective_ms"] is None else f"{m['collective_ms']:.3f}"
                         + (" (cached)" if m["collective_cached"] else "") for m in (f, d))
            + f" | {_mb(fp)} | {_measured(f)} | {_mb(dp)} | {_measured(d)} | {fp / dp:.2f} |")
    flagged = [f"{r['example']} ({mode})" for r in rows for mode in MODES
               if r[mode]["analytic_note"]]
    if flagged:
        lines += ["", "The plans of " + ", ".join(flagged) + " also carry the note that some "
                  "op times on the CPU workers are analytic (the roofline), though the plan "
                  "was profiled."]
    return lines


def _measured(mode: dict) -> str:
    """The largest peak the plan's training check measured, or why there is none."""
    peaks = mode.get("measured_peak_bytes")
    return _mb(max(peaks.values())) if peaks else "not measured"


def _cell(result: dict) -> str:
    if not result["fits"]:
        return "no plan fits"
    what = f"R={result['replicas']} {result['sharding']}"
    return f"{what}, peak {_mb(result['peak'])}, step {_ms(result['step_s'])} ms"


def memory_table(scan: dict) -> list[str]:
    ddp, fsdp = scan["ddp"]["peak"], scan["fsdp"]["peak"]
    lines = [
        f"**{scan['example']}**: uncapped, the DDP plan's peak is {_mb(ddp)} MB a device and "
        f"the FSDP plan's {_mb(fsdp)} MB ({fsdp / ddp:.2f}x).", "",
        "| cap per device (bytes) | cap / uncapped DDP peak | " + " | ".join(KINDS) + " |",
        "|---|---|" + "---|" * len(KINDS),
    ]
    for cap, results in scan["rows"]:
        lines.append(f"| {cap:,} | {cap / ddp:.3f} | "
                     + " | ".join(_cell(results[k]) for k in KINDS) + " |")
    lines.append("")
    for kind in KINDS:
        fit = [cap for cap, results in scan["rows"] if results[kind]["fits"]]
        miss = [cap for cap, results in scan["rows"] if not results[kind]["fits"]
                and (not fit or cap < min(fit))]
        lines.append(f"- {kind}: smallest cap tried that fits "
                     + (f"{min(fit):,} bytes" if fit else "none")
                     + (f"; the largest below it that does not, {max(miss):,}" if miss else "")
                     + ".")
    between = [(cap, results["auto (fsdp=auto, R auto)"]) for cap, results in scan["rows"]
               if fsdp <= cap < ddp]
    for cap, auto in between:
        if auto["fits"]:
            options = "; ".join(f"R={r} {s}: " + (f"fits, {_ms(t)} ms" if ok else "does not fit")
                                for r, s, ok, t in auto["options"])
            lines.append(f"- At {cap:,} bytes (between the two peaks) `fsdp=auto` kept "
                         f"R={auto['replicas']} {auto['sharding']}; it weighed {options}.")
        else:
            lines.append(f"- At {cap:,} bytes (between the two peaks) `fsdp=auto` found no "
                         f"plan: {auto['why']}.")
    auto = [(cap, results["auto (fsdp=auto, R auto)"]) for cap, results in scan["rows"]]
    seen: dict[tuple[int, str], list[tuple[int, bool]]] = {}
    for cap, result in auto:
        for r, s, ok, _ in result.get("options", ()):
            seen.setdefault((r, s), []).append((cap, ok))
    for (r, s), fits in seen.items():
        odd = [(high, low) for high, ok_high in fits for low, ok_low in fits
               if high > low and ok_low and not ok_high]
        if odd:
            high, low = odd[0]
            lines.append(f"- Not monotonic: under `fsdp=auto` the R={r} {s} option fits at "
                         f"{low:,} bytes but not at {high:,}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--memory", nargs="*", default=["mlp", "gpt2"],
                        help="the examples of the memory section")
    parser.add_argument("--repeat", type=int, default=2,
                        help="train each plan this many times (fresh processes)")
    parser.add_argument("--time-limit", type=float, default=5.0,
                        help="autoplace plan's --time-limit (the step-time plans)")
    parser.add_argument("--scan-time-limit", type=float, default=3.0,
                        help="Solve(time_limit_s) of the memory scan's plans")
    parser.add_argument("--quiet-below", type=float, default=None, metavar="LOAD",
                        help="before each training run, wait until the 1-minute load average "
                             "is under LOAD (at most --wait seconds)")
    parser.add_argument("--wait", type=float, default=30.0)
    parser.add_argument("--out", default=str(RESULTS / "fsdp-cpu.md"))
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = [step_times(e, repeat=args.repeat, time_limit_s=args.time_limit,
                       quiet=args.quiet_below, wait_s=args.wait) for e in args.only]
    scans = [memory_scan(e, time_limit_s=args.scan_time_limit) for e in args.memory]
    wall = time.monotonic() - began
    command = (f"python benchmarks/fsdp_cpu.py --only {' '.join(args.only)} --memory "
               f"{' '.join(args.memory)} --repeat {args.repeat} --time-limit "
               f"{args.time_limit:g} --scan-time-limit {args.scan_time_limit:g}"
               + (f" --quiet-below {args.quiet_below:g} --wait {args.wait:g}"
                  if args.quiet_below is not None else ""))
    lines = [
        "# Sharded replicas (FSDP2, ZeRO-3) on two CPU workers, against DDP", "",
        f"{machine_line()}. Command: `{command}`"
        + (" (the defaults: `python benchmarks/fsdp_cpu.py`)"
           if vars(args) == vars(parser.parse_args([])) else "")
        + f"; the whole run took {wall:.0f} s.", "",
        "## Step time", "",
        f"`autoplace plan EXAMPLE --mode training --devices {SPEC} --time-limit "
        f"{args.time_limit:g}` with `--fsdp on` (2 sharded replicas, one CPU worker each) "
        "and with `--fsdp off --replicas 2` (2 DDP replicas), profiled (the default), then "
        f"`autoplace run OUT --train STEPS --json` {args.repeat} times for each plan, each a "
        "fresh torchrun of two gloo processes, the FSDP and DDP runs alternating. A run's step "
        "is its median of steps 2 on (rank 0's); the table gives the median of the runs and "
        "their range, against the plan's predicted step"
        + (f" (before each run, a wait of at most {args.wait:g} s for the load average to "
           f"fall under {args.quiet_below:g})" if args.quiet_below is not None else "")
        + ". *training check*: the plan's own, 3 "
        "Adam steps of the replicas against the original. The load average (1 minute) is the "
        "lowest and highest seen before and after the runs: above about 1, other work shares "
        "the two cores.", "",
        *step_table(rows), "",
    ]
    if scans:
        lines += memory_intro(args.scan_time_limit)
    for scan in scans:
        lines += [*memory_table(scan), ""]
    return write_markdown(args.out, lines)


def memory_intro(time_limit_s: float) -> list[str]:
    """The memory section's heading and what its tables hold."""
    return [
        "## Memory: the smallest per-device memory at which each plan fits", "",
        "`autoplace.plan(model, inputs, Config(devices=capped, mode=\"training\", "
        "cost=Cost(profile=False), emit=Emit(verify=False), solve=Solve(time_limit_s="
        f"{time_limit_s:g}, whatif=False), training=...), loss=..., "
        "example_targets=...)` on two CPU workers each capped at the bytes given "
        "(`benchmarks.common.capped`: `memory_bytes` set, no reserve): analytic costs, so the "
        "steps here are the roofline's, not this CPU's; no training check (verify off), so "
        "these plans were not run. The caps are fractions of the uncapped DDP plan's peak, "
        "and the uncapped DDP and FSDP peaks and one byte under each. A cell gives the kept "
        "plan's replicas and sharding, its predicted peak per device (MB) and step, or that "
        "`InfeasibleError` was raised.", "",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
