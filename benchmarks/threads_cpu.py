"""``autoplace run`` on one and two ``cpu-thread`` workers: Inception against its two plans.

    python benchmarks/threads_cpu.py        # writes benchmarks/results/threads-cpu.md

``autoplace plan examples/inception.py --devices 1xcpu-thread --profile``, and the same for
``2xcpu-thread`` (each op profiled on one torch thread, as a worker runs it, into a fresh
profile cache); then ``autoplace run OUT --json`` of each, ``--rounds`` times, the two plans
alternating so that both see the same load, each run in a fresh process, as a user runs them.
Per plan: the predicted makespan, the median of the runs' medians (and their range), measured /
predicted (target: within 15%), and the intra-op threads each worker ran on (``run``'s
``threads``: one, as planned; a one-worker plan ran on every core before). Then the two-worker
plan's speed-up over the emitted one-worker plan, as a user would measure it, against the plans'
(``overlap_cpu.py`` sets two workers against the original model on one thread). The 1-minute
load average at the start and the end: other processes on these cores take time from the
workers."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

SPECS = ("1xcpu-thread", "2xcpu-thread")
TOLERANCE = 0.15


def _autoplace(*argv: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "autoplace.cli", *argv], capture_output=True,
                          text=True, check=True, cwd=ROOT, env=env).stdout


def measure(example: str, *, rounds: int, repeats: int, warmup: int,
            time_limit_s: float) -> list[dict]:
    """Plan ``example`` for each of ``SPECS``, then run the emitted models in turn."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = {spec: Path(tmp) / spec for spec in SPECS}
        # A private profile cache: the ops are profiled now, under the load the runs see, not
        # read from an earlier session's cache.
        env = {**os.environ, "AUTOPLACE_CACHE_DIR": str(Path(tmp) / "cache")}
        for spec, out in outs.items():
            _autoplace("plan", str(ROOT / "examples" / f"{example}.py"), "--devices", spec,
                       "--profile", "--time-limit", str(time_limit_s), "--out", str(out),
                       env=env)
        runs: dict[str, list[dict]] = {spec: [] for spec in SPECS}
        for _ in range(rounds):
            for spec, out in outs.items():
                runs[spec].append(json.loads(_autoplace(
                    "run", str(out), "--json", "--warmup", str(warmup), "--repeats",
                    str(repeats))))
        plans = {spec: json.loads((out / "plan.json").read_text()) for spec, out in outs.items()}
    rows = []
    for spec in SPECS:
        medians = sorted(r["measured_s"] for r in runs[spec])
        used = sorted({n["device"] for n in plans[spec]["nodes"] if not n["is_input"]})
        rows.append({"spec": spec, "used": used, "predicted_s": plans[spec]["makespan_s"],
                     "measured_s": statistics.median(medians),
                     "spread_s": (medians[0], medians[-1]),
                     "threads": runs[spec][-1]["threads"],
                     "remapped": runs[spec][-1]["remapped"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "threads-cpu.md"))
    parser.add_argument("--example", default="inception")
    parser.add_argument("--rounds", type=int, default=5,
                        help="`autoplace run` each plan this many times, alternating")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = measure(args.example, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup,
                   time_limit_s=args.time_limit)
    load_after = os.getloadavg()[0]
    command = (f"python benchmarks/threads_cpu.py --example {args.example} --rounds "
               f"{args.rounds} --repeats {args.repeats} --warmup {args.warmup} --time-limit "
               f"{args.time_limit:g}")
    lines = [
        "# `autoplace run` on one and two cpu-thread workers, against the plan", "",
        f"`{command}` ({machine_line()}; load average {load_before:.2f} at the start, "
        f"{load_after:.2f} at the end). Each plan: `autoplace plan examples/{args.example}.py "
        "--devices SPEC --profile` (each op profiled on one torch thread, into a fresh profile "
        "cache); then `autoplace run "
        f"OUT --json --warmup {args.warmup} --repeats {args.repeats}` {args.rounds} times, the "
        "two plans alternating, each run in a fresh process. Measured: the median of the runs' "
        f"medians (their range). Target: within {TOLERANCE:.0%} of the prediction.", "",
        "| plan | devices used | predicted (ms) | measured (ms), median (range) | "
        "measured / predicted | within 15% | intra-op threads per worker |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    within = True
    for r in rows:
        ratio = r["measured_s"] / r["predicted_s"]
        ok = abs(ratio - 1) <= TOLERANCE and not r["remapped"]
        within = within and ok
        low, high = (t * 1e3 for t in r["spread_s"])
        threads = ", ".join(f"{d}: {n}" for d, n in r["threads"].items())
        lines.append(f"| `{r['spec']}` | {', '.join(r['used'])} | {r['predicted_s'] * 1e3:.2f} | "
                     f"{r['measured_s'] * 1e3:.2f} ({low:.2f}-{high:.2f}) | {ratio:.2f} | "
                     f"{'yes' if ok else 'NO'} | {threads} |")
    one, two = rows
    predicted = one["predicted_s"] / two["predicted_s"]
    measured = one["measured_s"] / two["measured_s"]
    lines += [
        "",
        f"Two workers over the emitted one-worker plan: predicted {predicted:.2f}x, measured "
        f"{measured:.2f}x (measured / predicted {measured / predicted:.2f}), both emitted "
        "models run as `autoplace run` runs them.",
    ]
    code = write_markdown(args.out, lines)
    return code if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
