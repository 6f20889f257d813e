"""``autoplace run OUT/ --nproc N --tensor-parallel``: the plan's tensor-parallel candidate run as
N ranks, checked and timed.

Starts ``OUT/tensor_parallel/launch.py`` (``emit.distributed.tensor.tensor_main``) under
``python -m torch.distributed.run`` on 127.0.0.1 (``replicas.launch_replicas``: a free port, a
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

import torch
from torch.utils import _pytree as pytree

from autoplace.cli.run import plan_and_model, save_outputs
from autoplace.cli.run_ranks import RUN_TIMEOUT_S, RanksResult
from autoplace.emit import load_model, local_device_map
from autoplace.emit.device_map import check_device, remap
from autoplace.emit.distributed.replicas import launch_replicas
from autoplace.emit.distributed.tensor import compare_outputs
from autoplace.emit.files.saving import load_inputs
from autoplace.errors import AutoplaceError, EmitError, OutputError

__all__ = ["run_tensor"]


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
    plan, _ = plan_and_model(directory)
    record = plan.tensor_parallel
    if record is None:
        raise AutoplaceError(f"{directory}'s plan has no tensor-parallel candidate for "
                             "--tensor-parallel to run: plan it with --tp N")
    root = Path(directory) / "tensor_parallel"
    if not (root / "launch.py").is_file() or not (root / "model").is_dir():
        raise EmitError(f"{root} holds no launch.py and model/, the ranks' entry point and the "
                        "model they split: plan it again with --tp N (an older autoplace, "
                        "--no-emit, or a model on the meta device, whose candidate is planned, "
                        "not emitted, wrote none)")
    if nproc != record.ranks:
        raise AutoplaceError(f"--nproc {nproc}: the tensor-parallel candidate has "
                             f"{record.ranks} ranks ({', '.join(record.devices)}): pass "
                             f"--nproc {record.ranks}, or plan again with --tp {nproc}")
    torch_device = {d.name: d.torch_device for d in plan.problem.cluster.devices}
    planned = [torch_device[name] for name in record.devices]
    here = ({d: remap(d, device_map) for d in planned} if device_map is not None
            else local_device_map(planned))
    for device, ran in here.items():  # before any process starts
        check_device(ran, planned=device, option="--device-map")
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
    model = load_model(root / "model", device_map={"*": "cpu"})
    args, kwargs = load_inputs(root / "model")
    with torch.no_grad():
        expected = model(*args, **kwargs)
    diff = compare_outputs(saved["outputs"], expected, what=f"the {nproc} tensor-parallel ranks",
                           against="the one-device model's")
    written = () if outputs_file is None else tuple(save_outputs(
        _as_returned(expected, saved["outputs"]), outputs_file))
    moved = {d: ran for d, ran in here.items() if d != ran}
    notes = [f"tensor parallel: {record.columns} column and {record.rows} row matmuls split "
             f"over the {nproc} ranks by DTensor; predicted: plan.json's "
             "tensor_parallel.makespan_s"]
    if moved:
        notes.append("devices differ from the plan: " + "; ".join(
            f"{d} ran on {ran}" for d, ran in moved.items())
            + (" (--device-map)" if device_map is not None else " (not on this machine)"))
    times = tuple(saved["times_s"])
    return RanksResult(
        measured_s=statistics.median(times), predicted_s=record.makespan_s, times_s=times,
        nproc=nproc, microbatches=1, pipelining="tensor parallel (DTensor)",
        backend=saved["backend"], max_abs_diff=diff, ranks=tuple(record.devices),
        inputs=f"the example inputs ({root / 'model' / 'inputs.safetensors'})",
        notes=tuple(notes), written=written)


def _as_returned(expected: object, ours: list[torch.Tensor]) -> object:
    """``expected``'s structure with its tensors, in order, replaced by rank 0's."""
    leaves, spec = pytree.tree_flatten(expected)
    mine = iter(ours)
    return pytree.tree_unflatten([next(mine) if isinstance(x, torch.Tensor) else x
                                  for x in leaves], spec)
