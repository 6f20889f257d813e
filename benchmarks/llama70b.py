"""Planning a Llama-2-70B-shaped model on the meta device (``examples/llama70b_meta.py``) for
8xA100-80GB at sequence 2048: wall seconds and peak resident memory of the planning process.

    PYTHONPATH=. python benchmarks/llama70b.py     # -> benchmarks/results/llama70b.md

Each row runs ``autoplace plan`` in a subprocess, as a user would (default options: solve time
limit, what-if table), once with transformers' default ``use_cache=True`` and once with the
config's ``use_cache=False``, and reads the child's own maximum resident set size from
``os.wait4``. Targets (issue 15): at most 30 s and at most 1 GiB. The machine is shared, so the
load average (1 min) before and after each run is recorded beside its time; CPU seconds (user +
system) are the figure the load does not inflate.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, machine_line, write_markdown  # noqa: E402

MODEL = ROOT / "examples" / "llama70b_meta.py"
DEVICES = "8xA100-80GB"
TARGET_S, TARGET_BYTES = 30.0, 2**30

# A model file that calls the example's build with the cache off.
NO_CACHE = f"""import importlib.util
_spec = importlib.util.spec_from_file_location("llama70b_meta", {str(MODEL)!r})
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)


def build():
    return _mod.build(use_cache=False)
"""


def run_plan(model_file: Path, out: Path) -> dict[str, float | str]:
    """One ``autoplace plan`` in a child process: its wall and CPU seconds and max RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "autoplace.cli", "plan", str(model_file),
                              "--devices", DEVICES, "--out", str(out)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Read to its end first: a child that fills the pipe would block, never to be waited for.
    stderr = child.stderr.read().decode() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"autoplace plan {model_file} failed: {stderr}")
    plan = json.loads((out / "plan.json").read_text())
    return {"wall_s": wall_s, "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "makespan_s": plan["makespan_s"], "nodes": plan["coarsening"]["plan_nodes"],
            "solve_s": plan["solver"]["wall_s"],
            "whatif_s": sum(r["wall_s"] for r in plan.get("whatif", ())
                            if r.get("detail") != "the plan"),
            "cache_note": any("use_cache=False" in n for n in plan["notes"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS / "llama70b.md"))
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of both runs, interleaved (default: 2; the first round "
                        "also warms the file cache)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        no_cache = Path(tmp) / "llama70b_no_cache.py"
        no_cache.write_text(NO_CACHE)
        runs = [("True (default)", MODEL), ("False", no_cache)] * args.rounds
        for label, model_file in runs:
            r = run_plan(model_file, Path(tmp) / "out")
            print(label, r, flush=True)
            within = r["wall_s"] <= TARGET_S and r["max_rss_bytes"] <= TARGET_BYTES
            rows.append(
                f"| {label} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
                f"| {r['max_rss_bytes'] / 2**30:.2f} | {r['solve_s']:.1f} | {r['whatif_s']:.1f} "
                f"| {r['load_before']:.2f} / "
                f"{r['load_after']:.2f} | {r['nodes']} | {r['makespan_s']:.2f} "
                f"| {'yes' if r['cache_note'] else 'no'} "
                f"| {'yes' if within else 'no'} |")
    lines = ["# Planning Llama-2-70B on the meta device", "",
             f"{machine_line()}, shared with other work (the load average is beside each run). "
             "Command: `PYTHONPATH=. python benchmarks/llama70b.py`. Each row is one "
             f"`autoplace plan examples/llama70b_meta.py --devices {DEVICES}` (sequence 2048, "
             f"default options) in a child process, {args.rounds} rounds in this order; peak "
             "memory is its max resident set size (`os.wait4`). Targets: at most 30 s and "
             "1 GiB.", "",
             "| use_cache | wall s | CPU s | peak RSS GiB | solve s | what-if s "
             "| load 1 min before / after | plan nodes | makespan s | cache note "
             "| within targets |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, "",
             "`solve s` and `what-if s` are plan.json's own timings. Both come out of the "
             "one time limit (10 s by default): the what-if rows (the first 1..7 devices; "
             "1-3 cannot hold the weights and take no time) are solved first within half of "
             "it, at most 1 s each, and the plan's solve has the rest, starting from the best "
             "row's plan; a row can run past its share when a baseline heuristic it has "
             "started takes longer (the contiguous DP on 3,086 nodes), and the plan's solve "
             "then still gets half the limit. The rest (loading transformers, building the "
             "model on the meta device, torch.export of 80 layers, the FLOP count, the report) "
             "is plain CPU work and stretches with the load."]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
