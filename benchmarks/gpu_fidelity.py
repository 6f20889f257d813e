"""The GPU fidelity check: plan Inception and GPT-2 for this GPU alone and for two GPUs of its
type, run each emitted model on this one GPU (two planned devices: two streams, launched from one
thread), and set the measured time and peak memory beside the plan's.

    python benchmarks/gpu_fidelity.py --out results/gpu-fidelity.md      # on a machine with a GPU
    python benchmarks/gpu_fidelity.py --device cpu --out /tmp/dry.md     # dry run of every step

The plans are profiled here, the launcher's segment call and handover included
(``autoplace/profile/launcher.py``; the catalog's ``GPU_SEGMENT_CALL_S`` and ``GPU_HANDOVER_S``
are estimates of them). Per example: a plan on the GPU alone (``cuda:0``, profiled), a plan on
two simulated GPUs of its type (``cuda:1`` calibrated from ``cuda:0``), which may keep one
device when splitting does not pay, and the same two GPUs each capped to a share of the one-GPU
plan's memory, which forces a split. Each emitted model is loaded with every planned device on
the one GPU here and timed (CUDA synchronised, median of ``--repeats`` after ``--warmup``); the
eager model is timed the same way. Memory: the caching allocator's peak over one pass, less what
was allocated before it (weights), against the plan's weights plus activations. Every figure is
what this run measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine_line, write_markdown  # noqa: E402

import autoplace  # noqa: E402
from autoplace.cluster import resolve_cluster  # noqa: E402
from autoplace.config import Config, Cost, Solve
from autoplace.emit import load_model  # noqa: E402
from autoplace.errors import InfeasibleError  # noqa: E402
from autoplace.profile import open_cache  # noqa: E402
from autoplace.trace.load import load_model_file  # noqa: E402

EXAMPLES = ("inception", "gpt2")
CAPS = (0.6, 0.7, 0.8, 0.9)  # shares of the one-GPU plan's memory tried, tightest first


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_s(fn, device: str, *, warmup: int, repeats: int) -> float:  # noqa: ANN001
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        _sync(device)
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def _peak_bytes(fn, device: str) -> int | None:  # noqa: ANN001
    if not device.startswith("cuda"):
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        fn()
    _sync(device)
    return torch.cuda.max_memory_allocated() - before


def _to(value, device: str):  # noqa: ANN001, ANN202
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_to(v, device) for v in value)
    return value


def _plan(example: str, model, loaded, cluster, time_limit_s: float):  # noqa: ANN001, ANN202
    return autoplace.plan(
        model,
        loaded.kwargs or loaded.args,
        Config(
            devices=cluster,
            name=example,
            solve=Solve(time_limit_s=time_limit_s, whatif=False, min_gain=0.0),
            cost=Cost(profile=True, cache=open_cache()),
        ),
    )


def _capped(example: str, model, loaded, cluster, one_peak: int,  # noqa: ANN001, ANN202
            time_limit_s: float):
    """The two-GPU plan with each GPU capped to the tightest share of ``CAPS`` of the one-GPU
    plan's tensor bytes that still plans: a model that does not fit one GPU."""
    for share in CAPS:
        capped = dataclasses.replace(cluster, devices=tuple(
            dataclasses.replace(d, memory_bytes=d.reserved_bytes + int(share * one_peak))
            for d in cluster.devices))
        try:
            return _plan(example, model, loaded, capped, time_limit_s), share
        except InfeasibleError:
            continue
    raise InfeasibleError(f"no two-GPU plan within {CAPS[-1]:.0%} of one GPU's memory")


def run(example: str, devices: str, device: str, out: Path, *, warmup: int, repeats: int,
        time_limit_s: float, cap_of: int | None = None) -> dict:
    loaded = load_model_file(ROOT / "examples" / f"{example}.py")
    model = loaded.model.eval()
    cluster, notes = resolve_cluster(spec=devices)
    share = None
    if cap_of is None:
        result = _plan(example, model, loaded, cluster, time_limit_s)
    else:
        result, share = _capped(example, model, loaded, cluster, cap_of, time_limit_s)
    planned = result.plan
    used = sorted(set(planned.schedule.placement.device_of.values()))
    target = out / f"{example}-{len(cluster.devices)}{'' if share is None else '-capped'}"
    autoplace.save(planned, target, result.model)
    mapping = {d.torch_device: device for d in cluster.devices}
    emitted = load_model(target / "model", device_map=mapping)
    args = _to(tuple(loaded.args), device)
    kwargs = _to(dict(loaded.kwargs), device)
    eager = model.to(device)

    def call_emitted():  # noqa: ANN202
        return emitted(*args, **kwargs)

    def call_eager():  # noqa: ANN202
        return eager(*args, **kwargs)

    with torch.no_grad():
        torch.testing.assert_close(call_emitted(), call_eager(), rtol=1e-3, atol=1e-3)
    emitted_s = _time_s(call_emitted, device, warmup=warmup, repeats=repeats)
    eager_s = _time_s(call_eager, device, warmup=warmup, repeats=repeats)
    return {
        "example": example, "devices": devices if share is None else
        f"{devices}, each capped at {share:.0%}", "used": len(used),
        "tensor_bytes": sum(planned.schedule.peak_bytes.values())
        - sum(d.reserved_bytes for d in planned.problem.cluster.devices),
        "segments": len(emitted.segment_info)
        if hasattr(emitted, "segment_info") else len(getattr(emitted, "planned_devices", ())),
        "runtime": getattr(emitted, "runtime", "?"), "predicted_s": planned.makespan_s,
        "measured_s": emitted_s, "eager_s": eager_s,
        "predicted_peak_bytes": sum(planned.schedule.peak_bytes.values())
        - sum(d.reserved_bytes for d in planned.problem.cluster.devices),
        "measured_peak_bytes": _peak_bytes(call_emitted, device),
        "status": planned.solver.status, "notes": [*notes, *planned.notes],
        "launcher": _launcher_line(planned),
    }


def _launcher_line(planned) -> str:  # noqa: ANN001
    host = planned.problem.costs.host
    if host is None:
        return ""
    device = next(iter(host.call_s))
    return (f"a segment call {host.call_s[device] * 1e6:.1f} us, a handover "
            f"{host.handover_s[device] * 1e6:.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:0, or cpu for a dry run")
    parser.add_argument("--out", default=None, help="markdown output (default: print only)")
    parser.add_argument("--plans", default="/tmp/gpu-fidelity-plans")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--time-limit", type=float, default=10.0)
    opts = parser.parse_args()
    if opts.device == "cpu":
        one, two = "cpu", "2xcpu-thread"
    else:
        name = torch.cuda.get_device_name(0)
        found, _ = resolve_cluster(spec="cuda:0")
        kind = found.devices[0].type
        one, two = "cuda:0", f"2x{kind}"
        print(f"GPU: {name} (catalog type {kind})", flush=True)
    rows = []
    for example in EXAMPLES:
        single_peak = None
        for devices, capped in ((one, False), (two, False), (two, True)):
            began = time.perf_counter()
            try:
                row = run(example, devices, opts.device, Path(opts.plans), warmup=opts.warmup,
                          repeats=opts.repeats, time_limit_s=opts.time_limit,
                          cap_of=single_peak if capped else None)
                single_peak = single_peak or row["tensor_bytes"]
            except Exception as exc:  # noqa: BLE001 - a row says what failed, the rest still run
                row = {"example": example, "devices": devices, "error": repr(exc)[:300]}
            row["wall_s"] = time.perf_counter() - began
            rows.append(row)
            print(row, flush=True)
    lines = ["# GPU fidelity: measured against predicted", "",
             f"{machine_line()}; {torch.cuda.get_device_name(0) if opts.device != 'cpu' else 'cpu'}"
             f", torch {torch.__version__}. Command: `python benchmarks/gpu_fidelity.py`. Two "
             "planned devices run on the one device here, a stream each, launched from one "
             "thread.", "",
             "The launcher's costs the plans used (profiled here, "
             "`autoplace/profile/launcher.py`): "
             + next((r["launcher"] for r in rows if r.get("launcher")), "none measured")
             + ".", "",
             "| example | planned on | devices used | runtime | segments | predicted ms "
             "| measured ms | measured / predicted | eager ms | predicted peak MiB "
             "| measured peak MiB | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['example']} | {r['devices']} | failed: {r['error']} "
                         "|||||||||| |")
            continue
        peak = r["measured_peak_bytes"]
        lines.append(
            f"| {r['example']} | {r['devices']} | {r['used']} | {r['runtime']} | {r['segments']} "
            f"| {r['predicted_s'] * 1e3:.3f} "
            f"| {r['measured_s'] * 1e3:.3f} | {r['measured_s'] / r['predicted_s']:.2f} "
            f"| {r['eager_s'] * 1e3:.3f} | {r['predicted_peak_bytes'] / 2**20:.1f} "
            f"| {'-' if peak is None else f'{peak / 2**20:.1f}'} | {r['status']} |")
    if opts.out:
        return write_markdown(opts.out, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
