"""Profile every example on this machine's CPU and check the measured and calibrated costs
against the measured whole forward pass; time profiling the GPT-2-style example cold and warm.

    python benchmarks/profile_cpu.py              # writes benchmarks/results/profile.md
    python benchmarks/profile_cpu.py --threads 2  # torch's intra-op threads (default 1)
    python benchmarks/profile_cpu.py --clock thread --out benchmarks/results/profile-thread-time.md

Per example, ``--rounds`` times, each with a fresh cache: the whole forward pass of the original
(eager) model, and of the traced graph, each a stable median (``autoplace.profile.timing``);
the sum of the ops' medians timed where they run in the model (``autoplace profile``, in situ),
and for comparison each timed alone (isolated, into a separate in-memory cache); and the
calibrated CPU roofline's prediction. The calibrated prediction is leave-one-out: fitted on the
other examples' ops only, so it predicts a model it has not seen. Rows report the medians over
rounds. Last, the `autoplace profile examples/gpt2.py --devices cpu` command is run twice in fresh
processes on an empty cache directory: cold, then warm. ``--clock thread`` times with the calling
thread's CPU time instead of the wall clock (with one intra-op thread, all of torch's work),
which the other processes of a shared machine do not inflate.

(Not named ``profile.py``: run as a script, that would shadow the standard library's ``profile``
module, which torch imports.)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine_line, write_markdown  # noqa: E402

from autoplace.cluster import inventory, resolve_cluster  # noqa: E402
from autoplace.profile import profile_model  # noqa: E402
from autoplace.profile.cache import ProfileCache  # noqa: E402
from autoplace.profile.calibrate import compare, fit_from_records  # noqa: E402
from autoplace.profile.timing import ClockTimer, measure  # noqa: E402
from autoplace.trace import trace_model  # noqa: E402
from autoplace.trace.load import load_model_file  # noqa: E402

EXAMPLES = ("mlp", "lenet", "inception", "gpt2")


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _forward_s(fn, timer: ClockTimer) -> float:  # noqa: ANN001
    with torch.no_grad():
        return measure(fn, timer=timer, min_samples=9, max_samples=40, budget_s=8.0).median_s


def one_round(cache_dir: Path, timer: ClockTimer) -> dict[str, dict]:
    """Profile every example into one fresh cache; return per-example figures."""
    inv = inventory()
    cache = ProfileCache(cache_dir / "profile.sqlite3", torch_version=torch.__version__)
    cluster, _ = resolve_cluster(spec="cpu", gpus=inv.gpus)
    rows: dict[str, dict] = {}
    traced_of = {}
    for name in EXAMPLES:
        loaded = load_model_file(ROOT / "examples" / f"{name}.py")
        model = loaded.model.eval()
        traced = trace_model(model, loaded.args, loaded.kwargs, name=name)
        traced_of[name] = traced
        eager_before = _forward_s(lambda m=model, lm=loaded: m(*lm.args, **lm.kwargs), timer)
        began = time.perf_counter()
        result = profile_model(traced, model, loaded.args, loaded.kwargs, cluster, cache=cache,
                               inv=inv, links=False, timer=timer)
        profile_s = time.perf_counter() - began
        eager_after = _forward_s(lambda m=model, lm=loaded: m(*lm.args, **lm.kwargs), timer)
        graph_s = _forward_s(lambda g=traced.module, lm=loaded: g(*lm.args, **lm.kwargs), timer)
        (dp,) = result.devices
        alone = profile_model(traced, model, loaded.args, loaded.kwargs, cluster,
                              cache=ProfileCache(None, torch_version=torch.__version__), inv=inv,
                              links=False, timer=timer, in_situ=False).devices[0]
        rows[name] = {"ops": len(dp.ops), "measured_now": dp.measured_now,
                      "sum_s": dp.sum_s, "isolated_s": alone.sum_s,
                      "eager_s": statistics.median(
                          [eager_before, eager_after, dp.whole_forward.median_s]),
                      "graph_s": graph_s, "profile_s": profile_s,
                      "measured": {n: p.median_s for n, p in dp.ops.items()},
                      "signatures": {p.signature for p in dp.ops.values()}}
    records = cache.ops_for("CPU")
    everything = fit_from_records("CPU", records)
    for name, row in rows.items():
        others = [r for r in records if r.signature not in row["signatures"]]
        unseen = compare(traced_of[name].graph, row["measured"],
                         fit_from_records("CPU", others), device="cpu", device_type="CPU")
        seen = compare(traced_of[name].graph, row["measured"], everything, device="cpu",
                       device_type="CPU")
        row["calibrated_s"] = unseen.calibrated_s
        row["op_error"] = unseen.op_error
        row["in_sample_s"] = seen.calibrated_s
        row["in_sample_op_error"] = seen.op_error
    cache.close()
    return rows


def command_wall(cache_dir: Path, threads: int) -> tuple[float, float]:
    """Wall seconds of `autoplace profile examples/gpt2.py --devices cpu`, and the profile
    stage's own seconds as the command reports them."""
    env = {**os.environ, "AUTOPLACE_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": str(threads)}
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autoplace.cli", "profile",
                           str(ROOT / "examples" / "gpt2.py"), "--devices", "cpu"],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"autoplace profile failed:\n{proc.stderr}")
    stage = float(re.search(r"profiled in ([\d.]+) s", proc.stdout).group(1))
    return wall, stage


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: time.perf_counter, as autoplace profiles (default); thread: "
                        "the thread's CPU time")
    parser.add_argument("--out", default=str(RESULTS / "profile.md"))
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    rounds = []
    for _ in range(opts.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp), ClockTimer(CLOCKS[opts.clock])))
    cold = warm = None
    if opts.clock == "wall":
        with tempfile.TemporaryDirectory() as tmp:
            cold = command_wall(Path(tmp), opts.threads)
            warm = command_wall(Path(tmp), opts.threads)
    inv = inventory()
    load = os.getloadavg()
    default_out = Path(opts.out).resolve() == (RESULTS / "profile.md").resolve()
    out_arg = "" if default_out else f" --out {os.path.relpath(opts.out, ROOT)}"
    out_arg = (f" --rounds {opts.rounds}" if opts.rounds != 3 else "") + out_arg
    lines = [
        "# Profiling on the CPU",
        "",
        f"{machine_line()}, {inv.host.cpu_model}, torch {torch.__version__} with "
        f"{opts.threads} intra-op thread(s), timed with the "
        f"{'wall clock' if opts.clock == 'wall' else 'thread CPU-time clock'}; load average "
        f"when done {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (other jobs share the cores). "
        "Reproduce with `python benchmarks/profile_cpu.py --threads "
        f"{opts.threads} --clock {opts.clock}{out_arg}`.",
        "",
        f"Each figure is the median over {opts.rounds} rounds, each on a fresh cache. *Whole "
        "forward*: the original eager model, a stable median of repeated calls. *Ops summed*: "
        "every op timed by `autoplace profile` where it runs in the model (in situ: the graph "
        "walked again and again, one call of each op timed between its neighbours), added up "
        "(target: within 15% of the whole forward). *Isolated*: the same ops each timed alone, "
        "called over and over (`in_situ=False`, how the CPU was profiled before; inputs, "
        "weights and output buffer stay hot in the caches), added up. *Calibrated*: the "
        "calibrated CPU roofline's prediction of the same "
        "ops, summed (target: within 30%); *in-sample* is fitted to all four examples' ops, "
        "which is what the cache holds once they are profiled; *unseen* to the other three "
        "examples' ops only (leave-one-out: a model the fit has not seen). *Per op*: the median "
        "relative error of the calibrated time of one op. *Traced graph*: the exported fx graph "
        "run as code, the form the emitted model runs in.",
        "",
        "| example | ops timed | whole forward (ms) | traced graph (ms) | ops summed (ms) | error "
        "| isolated (ms) | error | calibrated, in-sample (ms) | error | per op "
        "| calibrated, unseen (ms) | error "
        "| per op | profile stage (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in EXAMPLES:
        def med(key: str, name: str = name) -> float:
            return statistics.median(r[name][key] for r in rounds)

        whole = med("eager_s")
        errors_sum = [r[name]["sum_s"] / r[name]["eager_s"] - 1 for r in rounds]
        errors_iso = [r[name]["isolated_s"] / r[name]["eager_s"] - 1 for r in rounds]
        errors_cal = [r[name]["calibrated_s"] / r[name]["eager_s"] - 1 for r in rounds]
        errors_in = [r[name]["in_sample_s"] / r[name]["eager_s"] - 1 for r in rounds]
        lines.append(
            f"| {name} | {rounds[0][name]['ops']} ({rounds[0][name]['measured_now']} distinct) "
            f"| {whole * 1e3:.2f} | {med('graph_s') * 1e3:.2f} | {med('sum_s') * 1e3:.2f} "
            f"| {_pct(statistics.median(errors_sum))} | {med('isolated_s') * 1e3:.2f} "
            f"| {_pct(statistics.median(errors_iso))} | {med('in_sample_s') * 1e3:.2f} "
            f"| {_pct(statistics.median(errors_in))} | {med('in_sample_op_error'):.0%} "
            f"| {med('calibrated_s') * 1e3:.2f} | {_pct(statistics.median(errors_cal))} "
            f"| {med('op_error'):.0%} | {med('profile_s'):.1f} |")
    lines += ["", "Each round's errors (ops summed; isolated; calibrated in-sample; unseen), to "
              "show the spread between rounds:", ""]
    for name in EXAMPLES:
        per_round = "; ".join(
            f"{_pct(r[name]['sum_s'] / r[name]['eager_s'] - 1)}, "
            f"{_pct(r[name]['isolated_s'] / r[name]['eager_s'] - 1)}, "
            f"{_pct(r[name]['in_sample_s'] / r[name]['eager_s'] - 1)}, "
            f"{_pct(r[name]['calibrated_s'] / r[name]['eager_s'] - 1)}" for r in rounds)
        lines.append(f"- {name}: {per_round}")
    if cold is None or warm is None:
        return write_markdown(opts.out, lines)
    lines += [
        "",
        "`autoplace profile examples/gpt2.py --devices cpu`, fresh process, empty cache "
        "directory (targets: profiling at most 60 s cold and 5 s warm):",
        "",
        "| cache | profile stage (s) | whole command (s) |",
        "|---|---|---|",
        f"| cold | {cold[1]:.1f} | {cold[0]:.1f} |",
        f"| warm | {warm[1]:.1f} | {warm[0]:.1f} |",
        "",
        "The profile stage walks the graph once, times the ops it has no measurement for, and "
        "times the whole forward pass for comparison; the command adds starting Python, "
        "importing torch and transformers, loading the model file and tracing it.",
    ]
    return write_markdown(opts.out, lines)


if __name__ == "__main__":
    sys.exit(main())
