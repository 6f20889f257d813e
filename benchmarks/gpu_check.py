"""The GPU check: profile every example on a GPU, measure the host-device link, and compare the
predicted forward time with the measured one (target: within 10%).

    python benchmarks/gpu_check.py                      # cuda:0; writes results/gpu_check.md
    python benchmarks/gpu_check.py --device cpu --out /tmp/dry.md   # dry run of every step

One script, meant to finish in a few minutes on one GPU (each example's ops are timed once,
identical ops once). Per example: the whole forward pass of the eager model timed with CUDA
events (``autoplace.profile``), the sum of the ops timed one by one in isolation (the measured
prediction), and the calibrated roofline fitted on the other examples' ops on the same GPU
(leave-one-out). Then the link host -> GPU and GPU -> host: copies from 4 KiB to 64 MiB, latency
and bandwidth fitted. Every figure in the output is what this run measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine_line, write_markdown  # noqa: E402

from autoplace.cluster import device_key, inventory, resolve_cluster  # noqa: E402
from autoplace.emit.codegen.source import runtime_namespace  # noqa: E402
from autoplace.profile import profile_model  # noqa: E402
from autoplace.profile.cache import ProfileCache  # noqa: E402
from autoplace.profile.calibrate import compare, fit_from_records  # noqa: E402
from autoplace.profile.links import measure_link  # noqa: E402
from autoplace.trace import trace_model  # noqa: E402
from autoplace.trace.load import load_model_file  # noqa: E402

EXAMPLES = ("mlp", "lenet", "inception", "gpt2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a dry run")
    parser.add_argument("--out", default=None,
                        help="markdown output (default: benchmarks/results/gpu_check.md on a "
                        "GPU; printed only on the CPU)")
    opts = parser.parse_args()
    began = time.perf_counter()
    inv = inventory()
    cluster, notes = resolve_cluster(spec=opts.device, gpus=inv.gpus)
    (device,) = cluster.devices
    key = device_key(device.torch_device, inv)
    for note in notes:  # e.g. a GPU that the catalog lacks, costed as the closest type
        print(f"note: {note}")
    rows = {}
    traced_of = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = ProfileCache(Path(tmp) / "profile.sqlite3", torch_version=torch.__version__)
        for name in EXAMPLES:
            loaded = load_model_file(ROOT / "examples" / f"{name}.py")
            model = loaded.model.eval()
            traced = trace_model(model, loaded.args, loaded.kwargs, name=name)
            traced_of[name] = traced
            t0 = time.perf_counter()
            result = profile_model(traced, model, loaded.args, loaded.kwargs, cluster,
                                   cache=cache, inv=inv, links=False,
                                   engine=runtime_namespace())
            (dp,) = result.devices
            if dp.whole_forward is None:
                raise SystemExit(f"{name}: the whole forward pass was not timed: "
                                 f"{result.notes}")
            rows[name] = {"ops": len(dp.ops), "distinct": dp.measured_now, "sum_s": dp.sum_s,
                          "whole_s": dp.whole_forward.median_s,
                          "spread": dp.whole_forward.spread,
                          "profile_s": time.perf_counter() - t0,
                          "measured": {n: p.median_s for n, p in dp.ops.items()},
                          "signatures": {p.signature for p in dp.ops.values()},
                          "unmeasured": len(dp.unmeasured)}
            print(f"{name}: {len(dp.ops)} ops, sum {dp.sum_s * 1e3:.3f} ms, whole "
                  f"{dp.whole_forward.median_s * 1e3:.3f} ms", flush=True)
        records = [r for r in cache.ops_for(device.type) if r.device_key == key]
        for name, row in rows.items():
            fitted = fit_from_records(device.type, [r for r in records
                                                    if r.signature not in row["signatures"]])
            c = compare(traced_of[name].graph, row["measured"], fitted,
                        device=device.name, device_type=device.type) if fitted else None
            row["calibrated_s"] = c.calibrated_s if c else None
        cache.close()
    link_rows = []
    for src, dst in (("cpu", device.torch_device), (device.torch_device, "cpu")):
        latency, bandwidth, points = measure_link(src, dst)
        link_rows.append((src, dst, latency, bandwidth, points))

    gpu = ", ".join(inv.lines())
    lines = [
        f"# GPU check on {device.torch_device} ({device.type})",
        "",
        f"{machine_line()}; {gpu}; torch {torch.__version__}. Reproduce with `python "
        f"benchmarks/gpu_check.py --device {opts.device}` ({time.perf_counter() - began:.0f} s "
        "in all).",
        "",
        "Whole forward: the eager model, CUDA events, stable median. Ops summed: every op timed "
        "alone (the measured prediction; target within 10%). Calibrated: the roofline fitted "
        "to the other examples' ops on this GPU (leave-one-out).",
        "",
        "| example | ops (distinct) | whole forward (ms) | spread | ops summed (ms) | error "
        "| calibrated (ms) | error | profile (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        cal = r["calibrated_s"]
        cal_text = ("n/a | n/a" if cal is None
                    else f"{cal * 1e3:.3f} | {cal / r['whole_s'] - 1:+.1%}")
        lines.append(f"| {name} | {r['ops']} ({r['distinct']}) | {r['whole_s'] * 1e3:.3f} "
                     f"| {r['spread']:.0%} | {r['sum_s'] * 1e3:.3f} "
                     f"| {r['sum_s'] / r['whole_s'] - 1:+.1%} | {cal_text} "
                     f"| {r['profile_s']:.1f} |")
    lines += ["", "| link | latency (us) | bandwidth (GB/s) | largest copy (ms) |",
              "|---|---|---|---|"]
    for src, dst, latency, bandwidth, points in link_rows:
        lines.append(f"| {src} -> {dst} | {latency * 1e6:.1f} | {bandwidth / 1e9:.2f} "
                     f"| {points[-1][1] * 1e3:.2f} |")
    errors = [abs(r["sum_s"] / r["whole_s"] - 1) for r in rows.values()]
    lines += ["", f"Largest error of the summed ops: {max(errors):.1%} (median "
              f"{statistics.median(errors):.1%}); target 10%."]
    out = opts.out or (str(RESULTS / "gpu_check.md") if device.torch_device != "cpu" else None)
    if out is None:
        print("\n".join(lines))
        return 0
    return write_markdown(out, lines)


if __name__ == "__main__":
    sys.exit(main())
