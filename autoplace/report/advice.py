"""The one sentence a report leads with (``advice``): what to do with the plan and why, read
from the plan's own figures; a plan that is a tensor-parallel mesh, no placement having fit,
says how to run its ranks (``_mesh_advice``)."""

from __future__ import annotations

from collections.abc import Sequence

from autoplace.config.choices import Objective
from autoplace.formats.plan import Plan, unplaced
from autoplace.formats.records import PinsRecord, TensorParallelRecord
from autoplace.ir import Device
from autoplace.report.units import format_bytes, format_seconds

__all__ = ["advice", "no_speedup_reason"]


def no_speedup_reason(pins: PinsRecord | None) -> str:
    """Why a plan has no speed-up over one device (``pins``: the plan's pins record)."""
    if pins is not None and len(set(pins.modules.values())) > 1:
        return "the pins span several devices"
    return "the model fits no single device"


def _kind_of(devices: Sequence[Device]) -> str:
    """What to call ``devices`` in a sentence: GPU, CPU worker, or device."""
    if all(d.torch_device.startswith("cuda") for d in devices):
        return "GPU"
    if all(d.torch_device.startswith("cpu:") for d in devices):
        return "CPU worker"
    return "device"


def advice(plan: Plan) -> str:
    """One sentence that says what to do with the plan and why: "Use one GPU (cuda:0): a split
    over 2 gains 1.1%, under --min-gain 5%."; "Split over 2 GPUs (cuda:0, cuda:1): 1.32x
    faster than cuda:0 alone, 14.5% from the lower bound." Read from the plan's own figures
    (its placement, the --min-gain record, the speed-up and the gap), as every summary shows
    them."""
    if plan.is_mesh and plan.tensor_parallel is not None:
        return _mesh_advice(plan, plan.tensor_parallel)
    cluster = plan.problem.cluster.devices
    placed = set(plan.schedule.placement.device_of.values())
    used = [d for d in cluster if d.name in placed]
    kind = _kind_of(used)
    names = ", ".join(d.name for d in used)
    label = ("step" if plan.training is not None else
             "largest device load" if plan.objective == Objective.THROUGHPUT else "makespan")
    value = f"{label} {format_seconds(plan.objective_s)}"
    replicas = int(plan.training.replicas or 1) if plan.training is not None else 1
    fsdp = plan.training is not None and plan.training.sharding == "fsdp"
    sharded = "sharded (FSDP2, ZeRO-3) " if fsdp else ""
    lead = (f"Train {replicas} {sharded}data-parallel replicas, each on" if replicas > 1
            else "Use")
    if len(used) == 1:
        gain = plan.min_gain
        if gain is not None and gain.single_device_chosen and gain.split_gain is not None:
            why = (f"a split over {gain.split_devices} gains {gain.split_gain:.1%}, "
                   f"under --min-gain {gain.threshold:.0%}")
        elif len(cluster) > 1:
            why = f"no split over the {len(cluster)} devices was faster ({value})"
        else:
            why = value
        return f"{lead} one {kind} ({names}): {why}."
    speedup, single = plan.speedup_over_single, plan.best_single_device
    if speedup is None or single is None:
        why = f"{no_speedup_reason(plan.pins)} ({value})"
    else:
        why = f"{speedup:.2f}x faster than {single} alone"
    if plan.gap is not None:
        why += f", {plan.gap:.1%} from the lower bound"
    idle = len(cluster) - len(used)
    if idle:
        why += f"; {idle} of the {len(cluster)} devices unused"
    lead = "Split" if replicas == 1 else lead
    return f"{lead} {'over ' if replicas == 1 else ''}{len(used)} {kind}s ({names}): {why}."


def _mesh_advice(plan: Plan, tp: TensorParallelRecord) -> str:
    """The advice of a plan that is a tensor-parallel mesh, no placement having fit or none
    able to beat it: "No placement fits: run dp 8 x tp 8 (FSDP2 over dp) over 64 GPUs with
    tensor_parallel/train.py: step 1.2 s predicted, rank 0 peaking at 60.1 GiB of 80 GiB."."""
    device = plan.problem.cluster.devices[0]
    script = "train.py" if tp.optimizer is not None else "launch.py"
    why = unplaced(plan.solver).capitalize()
    return (f"{why}: run {tp.mesh_text} over {tp.world} {_kind_of([device])}s with "
            f"tensor_parallel/{script}: {'step' if tp.optimizer is not None else 'makespan'} "
            f"{format_seconds(tp.makespan_s)} predicted, "
            f"{'the fullest stage' if tp.pp > 1 else 'rank 0'} peaking at "
            f"{format_bytes(tp.peak_bytes)} of {format_bytes(device.memory_bytes)}.")
