"""``autoplace run OUT/ --nproc N --tensor-parallel``: the plan's tensor-parallel candidate run as
N ranks, checked and timed; with ``--train K`` (a training plan's candidate, ``train_tensor``)
trained K steps by its ``train.py`` (``emit.distributed.tensor_train``), rank 0's losses and step
times against ``tensor_parallel.makespan_s``.

Starts ``OUT/tensor_parallel/launch.py`` (``emit.distributed.tensor.tensor_main``) under
torchrun (``cluster.local.torchrun``) on 127.0.0.1 (``replicas.launch_replicas``: a free port, a
time limit, every process stopped on a timeout or a failure), rank 0 writing the outputs and
its pass times to a temporary directory. Then, in this process, runs the one-device model the
ranks split (``OUT/tensor_parallel/model``) on the same example and compares rank 0's outputs
with ``torch.testing.assert_close``. The prediction is ``plan.json``'s
``tensor_parallel.makespan_s``. Every check on the user's input comes before a process
starts. Users: ``docs/multiprocess.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.cli.run import TrainResult, _on_cpu, _remapped, plan_in, save_outputs
from autoplace.cli.run_ranks import RUN_TIMEOUT_S, RanksResult, where_ranks_run
from autoplace.emit import load_model
from autoplace.emit.distributed.replicas import launch_replicas
from autoplace.emit.distributed.tensor import by_batch, compare_outputs
from autoplace.emit.files.saving import load_inputs
from autoplace.emit.train.microbatch import split_batch
from autoplace.errors import AutoplaceError, EmitError, OutputError
from autoplace.formats.plan import Plan
from autoplace.formats.records import TensorParallelRecord

__all__ = ["run_tensor", "train_tensor"]


def run_tensor(directory: str | os.PathLike[str], *, nproc: int, warmup: int = 1,
               repeats: int = 5, timeout_s: float = RUN_TIMEOUT_S,
               device_map: Mapping[str, str] | None = None,
               outputs_file: str | os.PathLike[str] | None = None) -> RanksResult:
    """Run ``directory``'s tensor-parallel candidate as ``nproc`` ranks on this machine on its
    example inputs; check rank 0's outputs against the one-device model's and time the passes
    against the plan's prediction. ``device_map``: where the planned torch devices run (globs;
    default the planned devices, those absent here on the CPU); ``outputs_file``: rank 0's
    outputs written there once checked."""
    if warmup < 0 or repeats < 1:
        raise AutoplaceError(f"--warmup must be 0 or more and --repeats 1 or more, got "
                             f"{warmup} and {repeats}")
    plan, record, root, here = _candidate(directory, nproc=nproc, device_map=device_map,
                                          training=False)
    if outputs_file is not None and not Path(outputs_file).parent.is_dir():
        raise OutputError(f"cannot write {str(outputs_file)!r}: "
                          f"{str(Path(outputs_file).parent)!r} is not a directory")
    with tempfile.TemporaryDirectory(prefix="autoplace-tensor-run-") as tmp:
        saved_file = Path(tmp) / "outputs.pt"
        launch_replicas(root / "launch.py", replicas=nproc, timeout_s=timeout_s,
                        what="tensor-parallel", argv=[
                            "--warmup", str(warmup), "--repeats", str(repeats),
                            "--device-map", json.dumps(here), "--outputs", str(saved_file)])
        saved = torch.load(saved_file, weights_only=True)
    expected = _one_device_outputs(root / "model", record.dp)
    diff = compare_outputs(saved["outputs"], expected, what=f"the {nproc} tensor-parallel ranks",
                           against="the one-device model's")
    written = () if outputs_file is None else tuple(save_outputs(
        _as_returned(expected, saved["outputs"]), outputs_file))
    moved = {d: ran for d, ran in here.items() if d != ran}
    over = (f"each stage's {record.ranks} ranks (pp {record.pp} x tp {record.ranks})"
            if record.pp > 1 else f"the {nproc} ranks")
    notes = [f"tensor parallel: {record.columns} column and {record.rows} row matmuls split "
             f"over {over} by DTensor; predicted: plan.json's tensor_parallel.makespan_s"]
    if moved:
        notes.append("devices differ from the plan: " + "; ".join(
            f"{d} ran on {ran}" for d, ran in moved.items())
            + (" (--device-map)" if device_map is not None else " (not on this machine)"))
    times = tuple(saved["times_s"])
    return RanksResult(
        measured_s=statistics.median(times), predicted_s=record.makespan_s, times_s=times,
        nproc=nproc, microbatches=1, pipelining="tensor parallel (DTensor)" if record.pp == 1
        else f"{record.pp} stages by torch.distributed.pipelining's ScheduleGPipe, "
        "tensor parallel (DTensor) in each",
        backend=saved["backend"], max_abs_diff=diff, ranks=tuple(record.devices),
        inputs=f"the example inputs ({root / 'model' / 'inputs.safetensors'})",
        notes=tuple(notes), written=written)


def _one_device_outputs(model_dir: Path, dp: int) -> Any:
    """The one-device model's outputs on its example inputs, in this process: with ``dp`` > 1
    (traced on one tp group's share of the batch) on each group's share, each output joined
    in batch order (``tensor.by_batch``), as the ranks' rank 0 joins theirs."""
    model = load_model(model_dir, device_map={"*": "cpu"})
    args, kwargs = load_inputs(model_dir)
    with torch.no_grad():
        if dp == 1:
            return model(*args, **kwargs)
        outs = [model(*a, **k) for a, k in split_batch(args, kwargs, dp,
                                                        what="data-parallel groups")]
    leaves = [[x for x in pytree.tree_leaves(o) if isinstance(x, torch.Tensor)] for o in outs]
    return _as_returned(outs[0], by_batch(list(zip(*leaves))))


def train_tensor(directory: str | os.PathLike[str], *, nproc: int, steps: int,
                 lr: float | None = None, timeout_s: float = RUN_TIMEOUT_S,
                 device_map: Mapping[str, str] | None = None) -> TrainResult:
    """Train ``directory``'s tensor-parallel candidate (a training plan's, ``--tp N --mode
    training``) for ``steps`` steps as ``nproc`` ranks on this machine
    (``OUT/tensor_parallel/train.py``), every rank on the whole example batch; rank 0's losses
    and step times (the first, which makes the optimizer's state, not in the median) against
    the plan's prediction. ``device_map``: as ``run_tensor``'s."""
    if steps < 1:
        raise AutoplaceError(f"--train must be 1 or more steps, got {steps}")
    plan, record, root, here = _candidate(directory, nproc=nproc, device_map=device_map,
                                          training=True)
    with tempfile.TemporaryDirectory(prefix="autoplace-tensor-train-") as tmp:
        report_file = Path(tmp) / "train.json"
        launch_replicas(root / "train.py", replicas=nproc, timeout_s=timeout_s,
                        what="tensor-parallel", argv=[
                            "--steps", str(steps), "--json", str(report_file),
                            "--device-map", json.dumps(here),
                            *(["--lr", repr(lr)] if lr is not None else [])])
        report = json.loads(report_file.read_text())
    remapped = _remapped(here)
    batch = (f"a {record.dp} x {record.ranks} mesh, each tp group on 1/{record.dp} of the "
             f"batch ({'FSDP2' if record.sharding == 'fsdp' else 'gradients averaged'} over "
             "dp)" if record.dp > 1 else f"a {record.mesh_text} mesh of pipeline stages "
             "(torch.distributed.pipelining), the loss the last stage's" if record.pp > 1
             else "each on the whole batch")
    notes = (f"{nproc} processes ran (torchrun, {report['backend']}), one per tensor-parallel "
             f"rank, {batch}, {record.columns} column and {record.rows} row "
             "matmuls split by DTensor: the losses and step times are rank 0's; predicted: "
             "plan.json's tensor_parallel.makespan_s",)
    return TrainResult(losses=tuple(report["losses"]), times_s=tuple(report["times_s"]),
                       measured_s=report["measured_s"],
                       predicted_s=None if remapped else record.makespan_s,
                       optimizer=record.optimizer or "", lr=lr, device_map=here, notes=notes,
                       remapped=remapped, threads=_on_cpu(here, report["threads"]))


def _candidate(directory: str | os.PathLike[str], *, nproc: int,
               device_map: Mapping[str, str] | None, training: bool
               ) -> tuple[Plan, TensorParallelRecord, Path, dict[str, str]]:
    """The plan, its tensor-parallel record, ``OUT/tensor_parallel`` and where each planned
    device runs here, once every check on the user's input has passed (before any process
    starts): a candidate there, of the mode asked for, of ``nproc`` ranks, its entry point
    written, its devices able to run here."""
    plan = plan_in(directory)  # a mesh alone has no model/
    record = plan.tensor_parallel
    if record is None:
        raise AutoplaceError(f"{directory}'s plan has no tensor-parallel candidate for "
                             "--tensor-parallel to run: plan it with --tp N")
    trains = record.optimizer is not None
    if trains != training:
        raise AutoplaceError(
            f"{directory}'s tensor-parallel candidate is a training plan's: pass --train STEPS"
            if trains else f"{directory}'s tensor-parallel candidate is an inference plan's: "
            "it takes no --train (plan with --mode training --tp N to train one)")
    root = Path(directory) / "tensor_parallel"
    script = "train.py" if training else "launch.py"
    if not (root / script).is_file() or not (root / "model").is_dir():
        raise EmitError(f"{root} holds no {script} and model/, the ranks' entry point and the "
                        "model they split: plan it again with --tp N (an older autoplace, "
                        "--no-emit, or a model on the meta device, whose candidate is planned, "
                        "not emitted, wrote none)")
    if nproc != record.world:
        outer = f"{record.dp} x " if record.dp > 1 else f"pp {record.pp} x tp "
        shape = (f"a {outer}{record.ranks} mesh of {record.world} ranks"
                 if record.world > record.ranks else f"{record.ranks} ranks")
        raise AutoplaceError(f"--nproc {nproc}: the tensor-parallel candidate has {shape} "
                             f"({', '.join(record.devices)}): pass --nproc {record.world}, or "
                             f"plan again for {nproc} ranks")
    torch_device = {d.name: d.torch_device for d in plan.problem.cluster.devices}
    planned = list(record.torch_devices) or [torch_device[name] for name in record.devices]
    return plan, record, root, where_ranks_run(planned, device_map)


def _as_returned(expected: object, ours: list[torch.Tensor]) -> object:
    """``expected``'s structure with its tensors, in order, replaced by ``ours`` (rank 0's, or
    the groups' joined)."""
    leaves, spec = pytree.tree_flatten(expected)
    mine = iter(ours)
    return pytree.tree_unflatten([next(mine) if isinstance(x, torch.Tensor) else x
                                  for x in leaves], spec)
