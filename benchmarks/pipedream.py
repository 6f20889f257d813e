"""PipeDream's partitioner on PipeDream's own profiles: the baseline for training plans.

    python benchmarks/pipedream.py            # -> benchmarks/results/pipedream.md
    python benchmarks/pipedream.py --only vgg --devices 4 --out /tmp/p.md

For each profile in ``../shared/benchdata/pipedream`` (or ``$AUTOPLACE_BENCHDATA/pipedream``)
and each device count, the time per sample of PipeDream's dynamic program (Narayanan et al.,
SOSP 2019, section 3.1; ``autoplace.solve.pipedream``), of pure data parallelism and of one
device, all scored by the same formulas. A sample is one minibatch of the batch the profile was
taken with; times are in the profiles' unit, milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchdata  # noqa: E402
from common import RESULTS, machine_line, write_markdown  # noqa: E402

from autoplace.formats.pipedream import read_profile  # noqa: E402
from autoplace.solve.pipedream import (  # noqa: E402
    PIPEDREAM_BANDWIDTH_BYTES_PER_S,
    TrainingCluster,
    data_parallel,
    one_device,
    pipedream,
    training_chain,
)
from cost_models.links import NETWORK_LATENCY_S  # noqa: E402

MS = 1e3  # seconds to the profiles' milliseconds

NOTES = [
    "- **Model.** Stages are contiguous ranges of the layers in the profile's trace order (a "
    "topological order), numbered from 1 after the input is dropped; `a-b xR` is a stage of "
    "layers a to b replicated on R devices, stages on consecutive devices. A stage's time is "
    "`max(forward + backward compute, ring all-reduce of its weights) / R`, the all-reduce "
    "`2 (R-1)/R * bytes / bandwidth + 2 (R-1) * latency`; a boundary costs `2 * (latency + "
    "bytes / bandwidth)` for every activation crossing it (forward, and its gradient back). "
    "The time per sample is the slowest stage or boundary. Data parallel is one stage on every "
    "device; one device is the whole forward and backward. Memory is not modelled.",
    "- **The input.** Each profile's `Input` node carries the time to load a minibatch "
    "(up to 636 ms, in the column *input ms*). PipeDream's optimizer zeroes and removes input "
    "sources before partitioning (the input always enters at the first stage), and so does this "
    "baseline: that time is charged to no plan. Unused `__getitem__` outputs (GNMT, NASNet) are "
    "dropped likewise.",
    "- **Devices used.** The dynamic program may leave devices idle where another replica "
    "would be slower (PipeDream's `--use_fewer_machines`); the column counts those it uses.",
]


def _rows(path: Path, device_counts: list[int], bandwidth: float,
          latency: float) -> list[tuple[str, str, bool]]:
    """Each device count's table row, the model, and whether the plan reaches the work bound (one
    device's time over the devices, which no plan beats under this model)."""
    chain = training_chain(read_profile(path))
    rows = []
    for devices in device_counts:
        cluster = TrainingCluster(devices=devices, bandwidth_bytes_per_s=bandwidth,
                                  latency_s=latency)
        began = time.perf_counter()
        plan = pipedream(chain, cluster)
        wall = time.perf_counter() - began
        dp = data_parallel(chain, cluster).time_per_sample_s
        one = one_device(chain, cluster).time_per_sample_s
        print(f"{chain.name} x{devices}: {plan.time_per_sample_s * MS:.2f} ms "
              f"({plan.compact()}), data parallel {dp * MS:.2f}, one device {one * MS:.2f}, "
              f"{wall:.2f} s", flush=True)
        rows.append((
            chain.name,
            f"| {chain.name} | {len(chain.layers)} | {chain.input_s * MS:.1f} | {devices} "
            f"| **{plan.time_per_sample_s * MS:.2f}** | {plan.compact()} | {plan.devices_used} "
            f"| {dp * MS:.2f} | {one * MS:.2f} | {dp / plan.time_per_sample_s:.2f} "
            f"| {one / plan.time_per_sample_s:.2f} | {wall:.2f} |",
            plan.time_per_sample_s <= one / devices * (1 + 1e-9)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="only profiles whose file name contains this text")
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--bandwidth-gbps", type=float,
                        default=PIPEDREAM_BANDWIDTH_BYTES_PER_S * 8 / 1e9)
    parser.add_argument("--latency-us", type=float, default=NETWORK_LATENCY_S * 1e6)
    parser.add_argument("--out", default=str(RESULTS / "pipedream.md"))
    args = parser.parse_args()
    bandwidth, latency = args.bandwidth_gbps * 1e9 / 8, args.latency_us * 1e-6
    paths = sorted(p for p in (benchdata.benchdata_dir() / "pipedream").glob("*.graph.txt")
                   if args.only is None or args.only in p.name)
    if not paths:
        print(f"no profiles at {benchdata.benchdata_dir() / 'pipedream'}", file=sys.stderr)
        return 2
    lines = ["# PipeDream's partitioner on PipeDream's profiles", "",
             f"{machine_line()}. Command: `python benchmarks/pipedream.py"
             f"{' --only ' + args.only if args.only else ''}`. "
             f"{len(paths)} profiles (../shared/benchdata/pipedream), "
             f"{', '.join(map(str, args.devices))} identical devices, every pair joined by "
             f"{args.bandwidth_gbps:g} Gbps ({bandwidth / 1e9:g} GB/s, PipeDream's Cluster-A "
             f"network between servers, SOSP 2019 section 5.1) with {args.latency_us:g} us "
             "latency. Times are **milliseconds per sample**, a sample being one minibatch of "
             "the batch each profile was taken with (the profiles' unit). Lower is better; the "
             "training planner's target is to be no worse than the PipeDream column on every "
             "row.", "", *NOTES, "",
             "| model | layers | input ms (dropped) | devices | PipeDream ms | stages "
             "| devices used | data parallel ms | one device ms | x over data parallel "
             "| x over one device | DP s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = [row for path in paths for row in _rows(path, args.devices, bandwidth, latency)]
    lines += [line for _, line, _ in rows]
    at_bound = sum(bound for _, _, bound in rows)
    others = sorted({name for name, _, bound in rows if not bound})
    lines += ["", f"On {at_bound} of {len(rows)} rows the PipeDream plan reaches the work bound, "
              "one device's time over the devices: there weight synchronisation hides behind "
              "compute, data parallelism scales perfectly, and a training plan can at best tie. "
              f"The other rows ({', '.join(others) or 'none'}: models with large weights) are "
              "where the split matters."]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
