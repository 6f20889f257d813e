"""``autoplace run OUT/ --nproc N``: an inference plan run as N processes, checked and timed.

Starts ``OUT/launch.py`` (``emit.distributed.ranks``) under torchrun (``cluster.local.torchrun``) on
127.0.0.1, one rank per planned device (``emit.distributed.replicas.launch_replicas``: a free port,
a time limit, and torchrun and every rank stopped on a timeout or a failure), rank 0 writing the
outputs and its pass times to a temporary directory. Then, in this process, runs the same
micro-batches through the whole emitted model (segment by segment, the one-process semantics the
plan verified against the original) and compares rank 0's outputs with
``torch.testing.assert_close``. The prediction per batch is the plan's makespan for one
micro-batch; for M, the simulator's makespan of M copies of the plan's graph, each device running
them in GPipe's order (``pipelined_makespan_s``). Every check on the user's input (a training plan,
no ``launch.py``, N not the plan's device count, inputs not M times the example's) comes before a
process starts. Users: ``docs/multiprocess.md``.

Read ``run_ranks``, then ``pipelined_makespan_s``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch.utils import _pytree as pytree

from autoplace.cli.run import plan_and_model, save_outputs
from autoplace.emit import load_model, local_device_map
from autoplace.emit.check.outputs import max_abs_diff
from autoplace.emit.device_map import check_device, remap
from autoplace.emit.distributed.ranks import Exchange, flat_inputs, repeated, run_pass
from autoplace.emit.distributed.replicas import launch_replicas
from autoplace.emit.files.saving import load_inputs, planned_devices, read_inputs_file
from autoplace.emit.train.microbatch import split_batch
from autoplace.errors import AutoplaceError, EmitError, OutputError, VerificationError
from autoplace.formats.plan import Plan
from autoplace.ir import Placement, Problem, Schedule
from autoplace.simulate import simulate
from autoplace.simulate.schedules import microbatch_name
from autoplace.train.graph import microbatch_copies

__all__ = ["RUN_TIMEOUT_S", "RanksResult", "pipelined_makespan_s", "run_ranks",
           "where_ranks_run"]

# A bound on the whole run of the ranks (start, rendezvous, passes), for a process that neither
# ends nor fails; each exchange already fails after launch.py's --timeout.
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RanksResult:
    """One ``autoplace run --nproc``: times in seconds per batch of ``microbatches``."""

    measured_s: float
    predicted_s: float
    times_s: tuple[float, ...]
    nproc: int
    microbatches: int
    pipelining: str
    backend: str
    max_abs_diff: float
    ranks: tuple[str, ...]
    inputs: str
    notes: tuple[str, ...] = ()
    outputs: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    written: tuple[str, ...] = ()  # the tensors written to --save-outputs' file

    def to_dict(self) -> dict[str, Any]:
        return {"measured_s": self.measured_s, "predicted_s": self.predicted_s,
                "times_s": list(self.times_s), "nproc": self.nproc,
                "microbatches": self.microbatches, "pipelining": self.pipelining,
                "backend": self.backend, "outputs_equal": True,
                "max_abs_diff": self.max_abs_diff, "ranks": list(self.ranks),
                "inputs": self.inputs, "notes": list(self.notes)}

    def lines(self) -> list[str]:
        ratio = self.measured_s / self.predicted_s if self.predicted_s > 0 else float("nan")
        return [f"ran {self.nproc} processes ({self.backend}, 127.0.0.1), one per planned "
                f"device: " + ", ".join(f"rank {r} {d}" for r, d in enumerate(self.ranks)),
                f"inputs: {self.inputs}",
                f"{self.microbatches} micro-batch(es) a batch, {self.pipelining}",
                f"outputs: equal to the one-process model's (max abs diff "
                f"{self.max_abs_diff:.3g})",
                f"time per batch: measured {self.measured_s * 1e3:.3f} ms (median of "
                f"{len(self.times_s)}), predicted {self.predicted_s * 1e3:.3f} ms "
                f"(measured/predicted {ratio:.2f})",
                *(f"note: {note}" for note in self.notes)]


def run_ranks(directory: str | os.PathLike[str], *, nproc: int, microbatches: int = 1,
              inputs_file: str | os.PathLike[str] | None = None, warmup: int = 1,
              repeats: int = 5, pipelining: str = "auto", timeout_s: float = RUN_TIMEOUT_S,
              exchange_timeout_s: float | None = None,
              device_map: Mapping[str, str] | None = None,
              outputs_file: str | os.PathLike[str] | None = None) -> RanksResult:
    """Run ``directory``'s inference plan as ``nproc`` processes on this machine, a batch of
    ``microbatches`` micro-batches (each of the planned example's shape) per pass; check the
    outputs against the one-process model and time them against the plan. ``device_map``
    (``load_model``'s: globs of planned torch devices to devices here) says where the ranks
    run; without it, planned devices absent here run on the CPU, as in one process. With
    ``outputs_file``, rank 0's outputs are written there once checked, as ``autoplace run
    --save-outputs`` writes one process's (``run.save_outputs``)."""
    if warmup < 0 or repeats < 1 or microbatches < 1:
        raise AutoplaceError(f"--warmup must be 0 or more, --repeats and --microbatches 1 or "
                             f"more, got {warmup}, {repeats} and {microbatches}")
    plan, model_dir = plan_and_model(directory)
    devices = plan.problem.cluster.devices
    script = model_dir.parent / "launch.py"
    _check(plan, script, nproc=nproc)
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no example inputs (inputs.safetensors): plan again")
    batch = repeated(example, microbatches)
    if inputs_file is not None:
        batch = read_inputs_file(inputs_file, example=batch)
        inputs = str(inputs_file)
    else:
        inputs = f"the example inputs ({model_dir / 'inputs.safetensors'})" + (
            f", {microbatches} times" if microbatches > 1 else "")
    planned = sorted({d.torch_device for d in devices} | set(planned_devices(model_dir)))
    here = where_ranks_run(planned, device_map)
    if outputs_file is not None and not Path(outputs_file).parent.is_dir():
        raise OutputError(f"cannot write {str(outputs_file)!r}: "
                          f"{str(Path(outputs_file).parent)!r} is not a directory")
    argv = ["--warmup", str(warmup), "--repeats", str(repeats), "--microbatches",
            str(microbatches), "--pipelining", pipelining, "--device-map", json.dumps(here),
            *(["--inputs", str(inputs_file)] if inputs_file is not None else []),
            *(["--timeout", repr(exchange_timeout_s)] if exchange_timeout_s else [])]
    with tempfile.TemporaryDirectory(prefix="autoplace-ranks-") as tmp:
        rank0_file, report_file = Path(tmp) / "outputs.safetensors", Path(tmp) / "rank0.json"
        launch_replicas(script, replicas=nproc, timeout_s=timeout_s, what="rank",
                        argv=[*argv, "--outputs", str(rank0_file), "--json", str(report_file)])
        report = json.loads(report_file.read_text())
        got = safetensors.torch.load_file(str(rank0_file))
    model = load_model(model_dir, device_map=here)
    diff = _compare(model, got, batch, microbatches)
    written = () if outputs_file is None else tuple(save_outputs(
        _as_returned(model, got, batch, microbatches), outputs_file))
    notes = []
    moved = {d: ran for d, ran in here.items() if d != ran}
    if moved:
        notes.append("devices differ from the plan: " + "; ".join(
            f"{', '.join(d for d in moved if moved[d] == ran)} ran on {ran}"
            for ran in sorted(set(moved.values())))
            + (" (--device-map)" if device_map is not None else " (not on this machine)"))
    if microbatches > 1:
        notes.append(f"predicted: the simulator's makespan of {microbatches} copies of the "
                     "plan's graph, each device running its part of one micro-batch after "
                     "another (GPipe), on the plan's placement")
    return RanksResult(
        measured_s=report["measured_s"],
        predicted_s=pipelined_makespan_s(plan.problem, plan.schedule, microbatches),
        times_s=tuple(report["times_s"]),
        nproc=nproc, microbatches=microbatches, pipelining=report["pipelining"],
        backend=report["backend"], max_abs_diff=diff, ranks=tuple(d.name for d in devices),
        inputs=inputs, notes=tuple(notes), outputs=got, written=written)


def where_ranks_run(planned: Sequence[str], device_map: Mapping[str, str] | None
                    ) -> dict[str, str]:
    """Where each ``planned`` torch device's rank runs here: as ``device_map`` (load_model's
    globs) says or, without one, on that device, those absent here on the CPU; each checked
    to exist here (``--device-map``'s error), before any process starts."""
    here = ({d: remap(d, device_map) for d in planned} if device_map is not None
            else local_device_map(planned))
    for device, ran in here.items():
        check_device(ran, planned=device, option="--device-map")
    return here


def _check(plan: Plan, script: Path, *, nproc: int) -> None:
    """The plan can run as ``nproc`` processes: an inference plan of ``nproc`` devices with its
    ``launch.py``."""
    devices = plan.problem.cluster.devices
    if plan.training is not None:
        raise AutoplaceError("--nproc runs an inference plan; a --mode training plan trains "
                             "with `--train STEPS` (its replicas as processes)")
    if nproc != len(devices):
        raise AutoplaceError(
            f"--nproc {nproc}: the plan has {len(devices)} devices "
            f"({', '.join(d.name for d in devices)}) and runs one process per device: pass "
            f"--nproc {len(devices)}, or plan again for {nproc} devices")
    if not script.is_file():
        torch_devices = [d.torch_device for d in devices]
        why = ("its devices share torch devices (" + ", ".join(
            f"{d.name} is {d.torch_device}" for d in devices) + "): give each its own "
            "torch_device in the cluster file" if len(set(torch_devices)) < len(devices)
            else "it was planned without an emitted model, by an older autoplace, or with "
            "a value crossing devices that launch.py cannot carry (not a tensor nor a "
            "literal)")
        raise EmitError(f"{script.parent} holds no launch.py, the ranks' entry point: {why}; "
                        "plan it again")


def _compare(model: torch.nn.Module, got: Mapping[str, torch.Tensor],
             batch: tuple[tuple[Any, ...], dict[str, Any]], count: int) -> float:
    """The largest difference of rank 0's outputs from the whole emitted ``model``'s (loaded
    on the ranks' devices) on the same micro-batches, run here segment by segment;
    ``VerificationError`` where they differ."""
    batches = [flat_inputs(model, a, kw) for a, kw in split_batch(*batch, count)]
    with torch.no_grad():
        expected = run_pass(model, batches, Exchange(0, [], count), mine=None)
    pairs = []
    for name, values in expected.items():
        for k, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                continue
            key = f"{name}.{k}"
            if key not in got:
                raise VerificationError(f"rank 0 returned no {name} for micro-batch {k}")
            expected = value.to("cpu")
            try:
                torch.testing.assert_close(got[key], expected)
            except AssertionError as error:
                raise VerificationError(
                    f"output {name} of micro-batch {k} from {len(model.planned_devices)} "
                    f"processes differs from the one-process model's: {error}") from None
            pairs.append((expected, got[key]))
    return max_abs_diff([e for e, _ in pairs], [g for _, g in pairs])


def _as_returned(model: torch.nn.Module, got: Mapping[str, torch.Tensor],
                 batch: tuple[tuple[Any, ...], dict[str, Any]], count: int) -> Any:
    """Rank 0's outputs (``got``: ``NAME.k`` for output ``NAME`` of micro-batch ``k``) in the
    structure the model returns: its forward's on micro-batch 0, each tensor leaf replaced, in
    order, by the output of that name (the tensor-valued ``model.output_names``; the generated
    forward returns them in that order); with ``count`` > 1, the micro-batches' rows
    concatenated along dimension 0, the batch's outputs."""
    args, kwargs = split_batch(*batch, count)[0]
    with torch.no_grad():
        shape = model(*args, **kwargs)
    names = [n for n in model.output_names if f"{n}.0" in got]
    leaves, spec = pytree.tree_flatten(shape)
    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if len(tensors) != len(names):
        raise EmitError(f"rank 0 returned {len(names)} output tensors, the model returns "
                        f"{len(tensors)}: the outputs cannot be written as it returns them")
    for i, name in zip(tensors, names):
        parts = [got[f"{name}.{k}"] for k in range(count)]
        if count > 1 and not parts[0].dim():
            raise AutoplaceError(f"output {name} has no batch dimension to concatenate "
                                 f"{count} micro-batches along: --save-outputs takes "
                                 "--microbatches 1 for this model")
        leaves[i] = parts[0] if count == 1 else torch.cat(parts)
    return pytree.tree_unflatten(leaves, spec)


def pipelined_makespan_s(problem: Problem, schedule: Schedule, count: int) -> float:
    """The predicted time of a batch of ``count`` micro-batches, each the plan's example: the
    ``schedule``'s makespan for one; for more, the simulator's makespan of ``count`` copies of
    the plan's graph (``f#k``, as a training step's micro-batches are built,
    ``train.graph``), each on its node's device, every device running its nodes of micro-batch
    0, then of 1, ... (GPipe's order, ``simulate.schedules``)."""
    if count == 1:
        return schedule.makespan_s
    copies = microbatch_copies(problem, count, "gpipe")
    device_of = {microbatch_name(name, k): device
                 for name, device in schedule.placement.device_of.items()
                 for k in range(count)}
    return simulate(copies, Placement(device_of)).makespan_s
