"""Emit: tensor parallelism of an emitted model over N ranks, run by DTensor.

``column_row`` chooses, from the emitted segments' fx graphs, how each matmul's weight is split
(Megatron-LM's pairs, Shoeybi et al. 2019, section 3): a matmul whose input is reached from a
column-parallel matmul's output without passing another matmul is row-parallel, every other one
column-parallel; so attention's q, k and v are columns and its output projection a row, an MLP's
up and gate columns and its down projection a row, and a language model's head a column (its
vocabulary split). ``dtensor.shard_model`` makes each parameter a DTensor on a 1-D mesh of the
ranks (a column's weight split along its outputs and its bias too, a row's along its inputs;
the rest replicated), and ``dtensor.run_sharded`` runs the model with its inputs replicated:
DTensor inserts every collective, a row's partial sums reduced at once. With ``pp`` the ranks
are a pp x tp mesh, the model cut into pipeline stages (``tensor_stages``).
``write_tensor_launch`` writes the ranks' ``launch.py`` (``tensor_main`` on each rank's planned
device); ``verify_tensor_parallel`` runs it on N gloo processes against the original.
``solve.tensor`` prices it; ``tensor_train`` trains it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch.utils import _pytree as pytree

from autoplace.emit.check.outputs import max_abs_diff
from autoplace.emit.codegen.lower import Lowered, fetch
from autoplace.emit.codegen.model import PartitionedModel
from autoplace.emit.distributed.dtensor import run_sharded, shard_model
from autoplace.errors import AutoplaceError, EmitError, VerificationError

__all__ = ["by_batch", "column_row", "compare_outputs", "divisible", "load_sharded", "matmuls",
           "run_sharded", "shard_model", "tensor_main", "verify_tensor_parallel",
           "write_tensor_launch"]

aten = torch.ops.aten
COLUMN, ROW = "column", "row"
# matmul op -> (activation argument, weight argument, bias argument or None, the weight's
# output dimension): ``linear`` takes W[out, in], ``addmm``/``mm``/``matmul`` W[in, out].
_MATMULS = {
    aten.linear.default: (0, 1, 2, 0),
    aten.addmm.default: (1, 2, 0, 1),
    aten.mm.default: (0, 1, None, 1),
    aten.matmul.default: (0, 1, None, 1),
}
VERIFY_TIMEOUT_S = 300.0
_TENSOR_TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "tensor_launch.py.tmpl"


def column_row(model: PartitionedModel | Lowered) -> dict[str, tuple[str, int]]:
    """Each split parameter of ``model`` (by its name in ``model.named_parameters()``): its
    matmul's kind and the dimension split, ``(COLUMN, d)`` or ``(ROW, d)``; a bias of a column
    is split along 0. A weight two matmuls read keeps the first's split; one that another op
    reads too (an embedding tied to the output layer) is not split. ``model`` may be the
    ``Lowered`` graph an emission cuts its segments from (``emit.codegen.lower``), its names
    then those of the one segment that emission on one device holds (``seg0.<name>``): its
    split without emitting it (an 80-layer Llama's takes a second)."""
    split: dict[str, tuple[str, int]] = {}
    if isinstance(model, Lowered):
        graphs = [("seg0", model.graph, model.attrs.__getitem__)]
    else:
        graphs = [(f"seg{i}", getattr(model, f"seg{i}").graph,
                   functools.partial(fetch, getattr(model, f"seg{i}")))
                  for i in range(len(model.segment_info))]
    for index, graph, attribute in graphs:
        kinds: dict[torch.fx.Node, str] = {}
        for node in graph.nodes:
            spec = _MATMULS.get(node.target) if node.op == "call_function" else None
            if spec is None:
                continue
            act, weight, bias, out_dim = spec
            w = node.args[weight] if len(node.args) > weight else None
            if not _is_param(w) or attribute(w.target).dim() != 2:
                continue
            if any(u.target not in _MATMULS for u in w.users):
                continue  # also read otherwise (a tied embedding): kept whole
            kind = ROW if _reaches(node.args[act], kinds, COLUMN) else COLUMN
            kinds[node] = kind
            split.setdefault(f"{index}.{w.target}",
                             (kind, out_dim if kind == COLUMN else 1 - out_dim))
            b = node.args[bias] if bias is not None and len(node.args) > bias else None
            if kind == COLUMN and _is_param(b):
                split.setdefault(f"{index}.{b.target}", (COLUMN, 0))
    return split


def matmuls(split: Mapping[str, tuple[str, int]]) -> tuple[int, int]:
    """The column and row matmuls of ``split`` (their weights; a column's bias is not one)."""
    weights = [kind for name, (kind, _) in split.items() if not name.endswith("bias")]
    return weights.count(COLUMN), weights.count(ROW)


def divisible(model: torch.nn.Module, split: Mapping[str, tuple[str, int]], ranks: int
              ) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """``split`` less the parameters whose split dimension ``ranks`` do not divide (an output
    layer of 7 classes over 2 ranks, say), which stay whole; and their names."""
    sizes = dict(model.named_parameters())
    whole = sorted(name for name, (_, dim) in split.items()
                   if name in sizes and sizes[name].shape[dim] % ranks)
    return {k: v for k, v in split.items() if k not in whole}, whole


def _is_param(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "get_attr"


def _reaches(start: Any, kinds: Mapping[torch.fx.Node, str], kind: str) -> bool:
    """Whether a matmul of ``kind`` is among the nearest matmuls ``start`` depends on."""
    stack, seen = [start], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, torch.fx.Node) or node in seen:
            continue
        seen.add(node)
        if node in kinds:
            if kinds[node] == kind:
                return True
            continue
        if node.op in ("placeholder", "get_attr"):
            continue
        stack.extend(node.all_input_nodes)
    return False


def tensor_main(model_dir: str | os.PathLike[str], argv: Sequence[str], *,
                devices: Sequence[str], names: Sequence[str], dp: int = 1, pp: int = 1) -> int:
    """One rank of ``torchrun --nproc-per-node N``: load ``model_dir`` on this rank's device
    (``devices[rank]``, plan name ``names[rank]``; ``--device-map`` remaps it as
    ``launch.py``'s does), split it over the N ranks (``--split FILE``: ``column_row``'s, as
    JSON; with ``dp`` > 1 over its tp group of a dp x N/dp mesh, on its group's share of the
    batch), run it on the saved example inputs ``--warmup`` times (once at least: rank 0's
    outputs are that pass's) and then ``--repeats`` times, the ranks lined up by a barrier
    before each timed pass; rank 0 saves the output tensors (in pytree order) and the timed
    passes' seconds (``--outputs FILE``, ``torch.save``). The exit code; an
    ``AutoplaceError`` is printed as one line and exits with 2."""
    from autoplace.emit.distributed.ddp import check_world, print_error

    parser = argparse.ArgumentParser(
        prog="launch.py", description=f"Run {model_dir} split over tensor-parallel ranks.")
    parser.add_argument("--split", required=True, metavar="FILE",
                        help="each split weight: [column or row, dimension], as JSON")
    parser.add_argument("--outputs", metavar="FILE", help="rank 0 writes the outputs here")
    parser.add_argument("--warmup", type=int, default=1, metavar="N")
    parser.add_argument("--repeats", type=int, default=5, metavar="N")
    parser.add_argument("--device-map", metavar="JSON",
                        help="where each planned torch device runs here: globs, the first "
                        "match wins, e.g. '{\"cuda:*\": \"cpu\"}' to rehearse a GPU plan "
                        "on CPU ranks (default: the planned devices)")
    options = parser.parse_args(list(argv))
    rank, world = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "0"))
    try:
        check_world(rank, len(devices), what=f"runs as {len(devices)} tensor-parallel ranks",
                    script="launch.py")
        if options.repeats < 0 or options.warmup < 0:
            raise AutoplaceError("--repeats and --warmup must be 0 or more")
        device = _rank_device(rank, devices, names, options.device_map)
    except AutoplaceError as error:
        print_error(type(error).__name__, error)
        return 2
    return _run_rank(Path(model_dir), options, device=device, world=world, dp=dp, pp=pp)


def _rank_device(rank: int, devices: Sequence[str], names: Sequence[str],
                 device_map: str | None) -> str:
    """Rank ``rank``'s torch device here: its planned one, remapped by ``--device-map``, and
    able to hold tensors (``EmitError`` naming the remap that would run it on the CPU)."""
    from autoplace.emit.device_map import check_device, parse_device_map, remap

    mapping = parse_device_map(device_map) if device_map else None
    here = [remap(d, mapping) for d in devices]
    check_device(here[rank], planned=devices[rank], option="--device-map")
    kinds = {torch.device(d).type for d in here}
    if len(kinds) > 1:
        raise EmitError("the ranks of one mesh share a device type, and these would run on "
                        + ", ".join(f"{n} on {d}" for n, d in zip(names, here))
                        + ": remap every planned device alike")
    return here[rank]


def load_sharded(model_dir: Path, split_file: str, *, kind: str, device: str, dp: int = 1,
                 pp: int = 1) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any], Any]:
    """A rank's model: the one-device model in ``model_dir`` on ``device``, its weights split
    as ``split_file`` (``split.json``) says over a mesh of every rank (``kind``'s devices),
    or with ``dp`` > 1 over this rank's tp group of a ``("dp", "tp")`` mesh; its example inputs
    there (with ``dp`` > 1 its dp group's share of the batch, ``ddp.shard``); and the mesh.
    With ``pp`` > 1 the mesh is ``("pp", "tp")`` and the model is left whole: its stage is
    ``tensor_stages.stage_runner``'s to split."""
    from torch.distributed.device_mesh import init_device_mesh

    from autoplace.emit.distributed.ddp import shard
    from autoplace.emit.files.saving import load_inputs, load_model

    world = dist.get_world_size()
    if world % (dp * pp):
        raise AutoplaceError(f"{world} ranks do not make a mesh of {dp * pp} groups: "
                             f"run {dp * pp} x tp ranks")
    outer = ("pp", pp) if pp > 1 else ("dp", dp)
    mesh = (init_device_mesh(kind, (outer[1], world // outer[1]),
                             mesh_dim_names=(outer[0], "tp")) if outer[1] > 1
            else init_device_mesh(kind, (world,)))

    model = load_model(model_dir, device_map={"*": device})
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no example inputs (and targets, for a training "
                        "plan): plan it again")
    args, kwargs = pytree.tree_map(
        lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, example)
    split = {k: tuple(v) for k, v in json.loads(Path(split_file).read_text()).items()}
    if pp == 1:
        shard_model(model, mesh["tp"] if dp > 1 else mesh, split)
    if dp > 1:
        args, kwargs = shard((args, kwargs), rank=mesh["dp"].get_local_rank(), replicas=dp)
    return model, args, kwargs, mesh


def _run_rank(model_dir: Path, options: argparse.Namespace, *, device: str, world: int,
              dp: int = 1, pp: int = 1) -> int:
    """``tensor_main``'s run on ``device``: the process group (gloo, nccl on GPUs), the mesh
    (``dp`` x tp, or ``pp`` x tp), the split model, the passes; rank 0 writes what it
    measured, with every group's outputs in batch order (``_gathered``)."""
    import datetime
    import time

    from autoplace.emit.distributed.ddp import INIT_TIMEOUT_S, print_error

    kind = torch.device(device).type
    if kind == "cpu":
        torch.set_num_threads(1)
    elif kind == "cuda":
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if kind == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    try:
        model, args, kwargs, mesh = load_sharded(model_dir, options.split, kind=kind,
                                                 device=device, dp=dp, pp=pp)
        once = functools.partial(run_sharded, model, args, kwargs)
        if pp > 1:
            from autoplace.emit.distributed.tensor_stages import STAGES_FILE, stage_runner

            split = {k: tuple(v) for k, v in json.loads(Path(options.split).read_text()).items()}
            once = stage_runner(model, mesh, split, Path(options.split).parent / STAGES_FILE,
                                args, kwargs)
        for _ in range(max(options.warmup, 1)):
            outputs = once()
        times = []
        for _ in range(options.repeats):
            dist.barrier()
            _synchronize(device)
            began = time.perf_counter()
            outputs = once()
            _synchronize(device)
            times.append(time.perf_counter() - began)
        leaves = [x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]
        if dp > 1:  # on the ranks' devices, as the backend (nccl on GPUs) moves them
            leaves = _gathered(leaves, mesh["dp"].get_group(), dp)
        leaves = [x.cpu() for x in leaves]
        if dist.get_rank() == 0 and options.outputs:
            torch.save({"outputs": leaves, "times_s": times, "device": device,
                        "backend": dist.get_backend()}, options.outputs)
        if dist.get_rank() == 0 and times:
            print(f"ran {world} tensor-parallel ranks ({dist.get_backend()}): "
                  f"{statistics.median(times) * 1e3:.3f} ms a pass (median of {len(times)})",
                  flush=True)
        # The DTensors and the mesh go before the process group, which the ranks leave
        # together (as ddp._train does: left to the interpreter's exit, a rank aborted now
        # and then).
        del model, outputs, once
        dist.barrier()
    except AutoplaceError as error:
        print_error(type(error).__name__, error)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


def _gathered(leaves: list[torch.Tensor], group: Any, dp: int) -> list[torch.Tensor]:
    """This tp group's output tensors joined with every other group's of ``group`` (the dp
    group), in batch order: each along dimension 0 (``by_batch``)."""
    parts: list[list[torch.Tensor]] = [[] for _ in leaves]
    for i, leaf in enumerate(leaves):
        gathered = [torch.empty_like(leaf) for _ in range(dp)]
        dist.all_gather(gathered, leaf.contiguous(), group=group)
        parts[i] = gathered
    return by_batch(parts)


def by_batch(parts: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Each output's parts (one per data-parallel group, in batch order) joined along
    dimension 0; an output without one (a scalar) is the first group's."""
    return [torch.cat(list(p)) if p[0].dim() else p[0] for p in parts]


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(torch.device(device))


def write_tensor_launch(directory: str | os.PathLike[str], *, devices: Sequence[str],
                        names: Sequence[str], split: Mapping[str, tuple[str, int]],
                        dp: int = 1, pp: int = 1, model: torch.nn.Module | None = None,
                        example: Any = None) -> Path:
    """Write ``directory/launch.py`` (``templates/tensor_launch.py.tmpl``: ``tensor_main`` for
    rank r on ``devices[r]``, plan name ``names[r]``, ``dp`` data-parallel groups, ``pp``
    pipeline stages) and ``directory/split.json`` (with ``pp`` > 1, ``stages.json`` too, from
    one pass of ``model`` on ``example``, its ``(args, kwargs)``); the script's path. The model
    it runs is ``directory/model``."""
    from string import Template

    root = Path(directory)
    if pp > 1:
        from autoplace.emit.distributed.tensor_stages import write_stage_table

        write_stage_table(root, model, example)
    (root / "split.json").write_text(json.dumps({k: list(v) for k, v in split.items()},
                                                indent=1) + "\n")
    path = root / "launch.py"
    path.write_text(Template(_TENSOR_TEMPLATE.read_text()).substitute(
        world=len(devices), devices=repr(list(devices)), names=repr(list(names)), dp=dp, pp=pp))
    return path


def verify_tensor_parallel(emitted: PartitionedModel, original: torch.nn.Module,
                           args: tuple[Any, ...], kwargs: dict[str, Any], *, ranks: int,
                           repeats: int = 0, timeout_s: float = VERIFY_TIMEOUT_S,
                           split: Mapping[str, tuple[str, int]] | None = None, dp: int = 1,
                           pp: int = 1) -> dict[str, Any]:
    """Run ``emitted`` split over ``ranks`` gloo processes (``column_row``, ``shard_model``,
    ``run_sharded``; one intra-op thread each; ``dp`` x ``ranks`` of them on a dp x tp mesh,
    each tp group on 1/dp of the batch; ``pp`` x ``ranks``, ``emitted`` cut into ``pp`` stages
    on a pp x tp mesh) on ``args``/``kwargs`` and check its outputs
    against ``original``'s with ``torch.testing.assert_close`` (``VerificationError`` where
    they differ), then time ``repeats`` passes more. Returns the split, the largest
    difference and the median pass (``measured_s``, with ``repeats``). ``split``: the one to
    run (default ``column_row``'s)."""
    from autoplace.emit.distributed.replicas import _save, launch_replicas

    split = dict(column_row(emitted) if split is None else split)
    with tempfile.TemporaryDirectory(prefix="autoplace-tensor-") as tmp:
        root = Path(tmp)
        _save(emitted, root / "model", (tuple(args), dict(kwargs)))
        world = ranks * dp * pp
        script = write_tensor_launch(root, devices=["cpu"] * world,
                                     names=[f"rank {r}" for r in range(world)], split=split,
                                     dp=dp, pp=pp, model=emitted,
                                     example=(tuple(args), dict(kwargs)))
        launch_replicas(script, replicas=world, timeout_s=timeout_s, what="tensor-parallel",
                        argv=["--repeats", str(repeats), "--outputs", str(root / "outputs.pt")])
        saved = torch.load(root / "outputs.pt", weights_only=True)
    ours, times = saved["outputs"], saved["times_s"]
    with torch.no_grad():
        expected = original(*args, **kwargs)
    worst = compare_outputs(ours, expected, what=f"the {world} tensor-parallel ranks",
                            against="the original's")
    columns, rows = matmuls(split)
    return {"status": "passed", "ranks": ranks, "split": split, "max_abs_diff": worst,
            "measured_s": statistics.median(times) if times else None,
            "columns": columns, "rows": rows}



def compare_outputs(ours: Sequence[torch.Tensor], expected: Any, *, what: str, against: str
                    ) -> float:
    """The largest difference of ``ours`` (rank 0's output tensors, in pytree order) from the
    tensors of ``expected`` (a model's outputs), each checked with
    ``torch.testing.assert_close``: ``VerificationError`` naming ``what`` and ``against``
    where they differ."""
    theirs = [x.detach().cpu() for x in pytree.tree_leaves(expected)
              if isinstance(x, torch.Tensor)]
    if len(ours) != len(theirs):
        raise VerificationError(f"{what} returned {len(ours)} outputs, {against} "
                                f"{len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        try:
            torch.testing.assert_close(a, b)
        except AssertionError as exc:
            raise VerificationError(f"output {i} of {what} differs from {against}: {exc}"
                                    ) from None
    return max_abs_diff(theirs, list(ours))
