"""Emit: a training plan's data-parallel replicas, as each of their processes runs them.

A training plan with ``training.replicas`` R > 1 places one replica (on 1/R of the batch); R
copies of it train, one process each. ``pipeline.save`` writes ``OUT/train.py``
(``write_train_script``), run as ``torchrun --nproc-per-node R OUT/train.py --steps N``: each
process (rank r of R) calls ``replica_main``, which takes its shard of the example batch in
``OUT/model/inputs.safetensors`` (``shard``, by the rule in ``batch_size``), loads ``OUT/model``
on its own devices (``replica_device_map``) and runs ``--steps`` steps of the plan's optimizer
under ``DistributedDataParallel``; rank 0 reports each step's loss (the replicas' mean) and the
step times. With M > 1 micro-batches no DDP: the plan's micro-batch step
(``train.microbatch.train_step``) runs the segments directly, and then
``train.dataparallel.average_gradients`` all-reduces the gradients and divides them by R, as
the plan charges it. docs/training.md says more; ``replicas`` starts and checks the processes.

Read ``batch_size``, ``shard``, ``replica_device_map``, then ``replica_main`` and ``_train``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pprint
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from string import Template
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from autoplace.cluster.local import worker_threads
from autoplace.emit.check.training import _named, _named_buffers
from autoplace.emit.device_map import local_device_map
from autoplace.emit.files.saving import load_inputs, load_model, planned_devices
from autoplace.emit.train.microbatch import Action, action_order, split_batch, train_step
from autoplace.emit.train.microbatch import batch_size as cut_size
from autoplace.errors import AutoplaceError, EmitError
from autoplace.formats.records import TrainingRecord
from autoplace.ir import Problem, Schedule
from autoplace.train.dataparallel import average_gradients, ddp_replica, is_dtensor
from autoplace.train.graph import make_optimizer
from autoplace.train.layers import no_dropout

__all__ = ["INIT_TIMEOUT_S", "SHARDINGS", "add_training_flags", "batch_size", "checkpointed",
           "fully_shard_units", "microbatching", "print_error", "replica_backend",
           "replica_device_map", "replica_exit", "replica_main", "replicas_of", "say_trained",
           "shard", "write_train_script"]

# The rendezvous and every collective after it: a rank that died or never came makes the others
# fail within this, rather than wait for ever.
INIT_TIMEOUT_S = 60.0
# What the batch is cut into, as errors say it (``microbatch.batch_size``).
REPLICA_SHARDS = "data-parallel replicas"
# ``train.py``'s text, its $-placeholders filled by ``write_train_script``.
_TRAIN_TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "train.py.tmpl"

# How the replicas hold the model: whole, gradients all-reduced (DistributedDataParallel), or
# sharded (FSDP2's ``fully_shard``, ZeRO-3: ``train.sharded``).
SHARDINGS = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2 fully_shard"}

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
Groups = Sequence[Sequence[str]]
Step = Callable[[], torch.Tensor]  # a step's forward and backward, gradients averaged: the loss


def replicas_of(training: TrainingRecord | None) -> int:
    """A plan's ``training.replicas``: 1 when absent (and for an inference plan)."""
    return int(training.replicas or 1) if training is not None else 1


def microbatching(training: TrainingRecord | None, model: torch.nn.Module,
                  problem: Problem, schedule: Schedule) -> dict[str, Any] | None:
    """What each replica of a plan with ``training.microbatches`` M > 1 needs to run its step
    in the plan's order, as ``train.py`` holds it: ``count`` (M), ``loss`` (how the shard's
    loss combines its micro-batches', ``microbatch_loss``) and ``order``, the emitted
    ``model``'s actions as the plan's ``schedule`` of ``problem`` starts them
    (``microbatch.action_order``), each ``[segment, micro-batch, phase]``, and ``recompute``,
    the planned devices whose segments recompute (``training.recompute``). ``None`` for one
    micro-batch: DDP runs that step."""
    count = training.microbatches if training is not None else None
    if training is None or count is None or count == 1:
        return None
    order = action_order(model, problem, schedule, count)
    return {"count": count, "loss": training.microbatch_loss,
            "order": [[a.segment, a.microbatch, a.phase] for a in order],
            "recompute": list(training.recompute or ())}


def batch_size(inputs: Inputs, *, replicas: int) -> int:
    """B, the batch the replicas share (``microbatch.batch_size``'s rule, the one micro-batches
    follow), which must divide into ``replicas`` equal shards."""
    return cut_size(inputs, parts=replicas, what=REPLICA_SHARDS)


def shard(inputs: Inputs, *, rank: int, replicas: int) -> Inputs:
    """Rank ``rank``'s share of ``inputs``: rows ``rank * B/R`` to ``(rank + 1) * B/R`` of
    every tensor whose dimension 0 is the batch (``batch_size``); everything else whole."""
    args, kwargs = split_batch(*inputs, replicas, what=REPLICA_SHARDS)[rank]
    args, kwargs = pytree.tree_map(
        lambda x: x.contiguous() if isinstance(x, torch.Tensor) else x, (args, kwargs))
    return tuple(args), dict(kwargs)


def replica_device_map(planned: Sequence[str], *, rank: int,
                       groups: Groups | None = None) -> dict[str, str]:
    """Where rank ``rank`` runs each planned device: with ``groups`` (the plan's replica
    groups, as torch devices: ``groups[0]`` is the planned replica's), the device that plays
    its part in group ``rank``; without, ``cuda:i`` as ``cuda:(i + rank * G)``, G one more than
    the highest CUDA index the replica plans (rank 0 on the plan's GPUs, rank 1 on the next G,
    ...), the CPU shared. A GPU absent here runs on the CPU, as ``local_device_map`` has it for
    one process."""
    if groups is not None:
        part = {d: i for i, d in enumerate(groups[0])}
        mine = {d: groups[rank][part[d]] if d in part else d for d in planned}
        here = local_device_map(sorted(set(mine.values())))
        return {d: here[mine[d]] for d in planned}
    indices = [torch.device(d).index or 0 for d in planned if torch.device(d).type == "cuda"]
    stride = max(indices) + 1 if indices else 0

    def own(device: str) -> str:
        parsed = torch.device(device)
        if parsed.type != "cuda":
            return device
        return f"cuda:{(parsed.index or 0) + rank * stride}"

    mine = {d: own(d) for d in planned}
    here = local_device_map(sorted(set(mine.values())))
    return {d: here[mine[d]] for d in planned}


def replica_backend(planned: Sequence[str], *, replicas: int,
                    groups: Groups | None = None) -> str:
    """``nccl`` when every device of every rank is a GPU here, else ``gloo`` (which takes CPU
    tensors, and CUDA ones too): all ranks must agree, so each derives every rank's map."""
    every = [d for rank in range(replicas)
             for d in replica_device_map(planned, rank=rank, groups=groups).values()]
    return "nccl" if all(torch.device(d).type == "cuda" for d in every) else "gloo"


def write_train_script(directory: str | os.PathLike[str], *, optimizer: str,
                       replicas: int, groups: Groups | None = None,
                       microbatches: Mapping[str, Any] | None = None,
                       sharding: str = "ddp", recompute: bool = False) -> Path:
    """Write ``directory/train.py`` (``templates/train.py.tmpl`` filled in), the torchrun entry
    point of the replicas of the model in ``directory/model`` (``groups``: each replica's torch
    devices, as ``replica_device_map`` takes them; ``microbatches``: ``microbatching``'s);
    ``sharding``: a key of ``SHARDINGS``; ``recompute``: sharded replicas checkpoint each
    unit); returns its path."""
    if replicas < 2:
        raise ValueError(f"train.py is for 2 or more replicas, got {replicas}")
    path = Path(directory) / "train.py"
    groups = None if groups is None else [list(g) for g in groups]
    literal = pprint.pformat(None if microbatches is None else dict(microbatches), width=84,
                             compact=True).replace("\n", "\n" + " " * len("MICROBATCHES = "))
    path.write_text(Template(_TRAIN_TEMPLATE.read_text()).substitute(
        optimizer=optimizer, optimizer_literal=repr(optimizer), replicas=replicas,
        groups=repr(groups), microbatches=literal, sharding=repr(sharding),
        sharding_name=SHARDINGS[sharding], recompute=repr(recompute)))
    return path


def print_error(kind: str, message: object) -> None:
    """The one line a worker (a replica, a rank) prints for an ``AutoplaceError`` of class
    ``kind``, which ``replicas`` reads back as that error."""
    print(f"autoplace: error: {kind}: {message}", file=sys.stderr, flush=True)


def check_world(rank: int, world: int, *, what: str, script: str) -> None:
    """This process is one of ``world`` started by torchrun (``RANK``, ``WORLD_SIZE``), or an
    ``AutoplaceError`` that says how to start ``script`` (``OUT/train.py``, ``OUT/launch.py``)."""
    if rank < 0 or int(os.environ.get("WORLD_SIZE", "0")) != world:
        raise AutoplaceError(
            f"this plan {what}: run `torchrun --nproc-per-node {world} {script}`, not "
            f"{os.environ.get('WORLD_SIZE', 'without torchrun')} process(es)")


def replica_exit(code: int) -> None:
    """End a replica's process with ``code`` once its output is flushed, without the
    interpreter's teardown: there the process group's threads were destroyed after the
    objects that use them, and a replica that had trained aborted (SIGABRT, "terminate called
    without an active exception"): about one run in five before the DDP wrapper was dropped
    and the ranks met at a barrier first (``_train``), and once more since, in a test of
    ``autoplace run --train`` on a loaded machine. Everything a replica reports is written
    and flushed by then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def replica_main(model_dir: str | os.PathLike[str], argv: Sequence[str], *, optimizer: str,
                 replicas: int, groups: Groups | None = None,
                 microbatches: Mapping[str, Any] | None = None, sharding: str = "ddp",
                 recompute: bool = False) -> int:
    """One process of ``torchrun --nproc-per-node replicas train.py``: the exit code. An
    ``AutoplaceError`` is printed as one line, ``autoplace: error: KIND: message`` (the line
    ``launch_replicas`` looks for), and exits with 2."""
    parser = argparse.ArgumentParser(
        prog="train.py", description=f"Train {model_dir} as {replicas} data-parallel replicas "
        f"({SHARDINGS[sharding]}) with {optimizer}; run under torchrun --nproc-per-node "
        f"{replicas}.")
    add_training_flags(parser)
    parser.add_argument("--record", metavar="FILE",
                        help="for verify_replicas: rank 0 saves (torch.save) each step's loss, "
                        "averaged gradients, updated parameters, optimizer state and buffers "
                        "to FILE")
    parser.add_argument("--no-dropout", action="store_true",
                        help="for verify_replicas: every dropout runs at probability zero "
                        "(the segments on this thread, one after another), so that a model "
                        "in train() is compared exactly")
    options = parser.parse_args(list(argv))
    rank = int(os.environ.get("RANK", "-1"))
    try:
        check_world(rank, replicas, what=f"trains {replicas} replicas", script="train.py")
        if options.steps < 1:
            raise AutoplaceError(f"--steps must be 1 or more, got {options.steps}")
        report, record = _train(Path(model_dir), optimizer=optimizer, replicas=replicas,
                                rank=rank, steps=options.steps, lr=options.lr,
                                recording=options.record is not None, groups=groups,
                                microbatches=microbatches, sharding=sharding,
                                dropout=not options.no_dropout, recompute=recompute)
    except AutoplaceError as error:
        print_error(type(error).__name__, error)
        return 2
    if rank == 0:
        cut = report["microbatches"]
        say_trained(options, report, record, losses="losses (mean over the replicas)", what=(
            f"{replicas} replicas ({SHARDINGS[sharding]}, {report['backend']}), each on "
            f"{report['shard']} of the batch of {report['batch']}"
            + (f" in {cut} micro-batches" if cut > 1 else "")
            + f", {len(report['losses'])} steps of {optimizer}"))
    return 0


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every ``train.py`` takes: ``--steps``, ``--lr`` and ``--json`` (rank 0's
    report, ``say_trained``)."""
    parser.add_argument("--steps", type=int, required=True, metavar="N")
    parser.add_argument("--lr", type=float, metavar="RATE",
                        help="the learning rate (default: the optimizer's torch default)")
    parser.add_argument("--json", metavar="FILE",
                        help="rank 0 writes the losses and step times to FILE as JSON")


def say_trained(options: argparse.Namespace, report: Mapping[str, Any], record: Any, *,
                what: str, losses: str = "losses") -> None:
    """Rank 0's end of a training run: ``--json`` and ``--record`` written, and what it
    trained (``what``), the ``losses`` and the median step said."""
    if options.json:
        Path(options.json).write_text(json.dumps(report) + "\n")
    if options.record:
        torch.save(record, options.record)
    print(f"trained {what}\n{losses}: " + ", ".join(f"{v:.6g}" for v in report["losses"])
          + f"\nstep time: {report['measured_s'] * 1e3:.3f} ms (median)", flush=True)


def _train(model_dir: Path, *, optimizer: str, replicas: int, rank: int, steps: int,
           lr: float | None, recording: bool, groups: Groups | None = None,
           microbatches: Mapping[str, Any] | None = None, sharding: str = "ddp",
           dropout: bool = True, recompute: bool = False
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's part: shard, load, wrap (under DDP or, with ``sharding="fsdp"``, FSDP2, each
    unit checkpointed with ``recompute``; or, with ``microbatches``, cut the shard), train.
    Returns rank 0's report and record (with ``checkpointed``, the segments checkpointed, and
    ``unit_forwards``, their forwards in the steps). Without
    ``dropout`` every dropout runs at probability zero (``train.layers.no_dropout``, a mode of
    this thread: the segments run on it, the sequential forward and the micro-batches'
    actions in order)."""
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no example inputs and targets (inputs.safetensors): "
                        "plan it again")
    size = batch_size(example, replicas=replicas)
    args, kwargs = shard(example, rank=rank, replicas=replicas)
    planned = planned_devices(model_dir)
    here = replica_device_map(planned, rank=rank, groups=groups)
    kinds = sorted({torch.device(d).type for d in here.values()})
    if len(kinds) > 1 and microbatches is None:
        raise EmitError(f"replica {rank} runs on {' and '.join(kinds)} devices "
                        f"({', '.join(sorted(set(here.values())))}): DistributedDataParallel "
                        "takes a module on one type of device; plan one replica on GPUs only")
    backend = replica_backend(planned, replicas=replicas, groups=groups)
    if backend == "nccl":
        torch.cuda.set_device(torch.device(next(iter(here.values()))))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    try:
        model = load_model(model_dir, device_map=here)
        if not dropout:
            model.runtime = "sequential"
        runs: list[int] = []
        if sharding == "fsdp":
            runs = checkpointed(model) if recompute else []
            step = _fsdp_step(model, args, kwargs)
        elif microbatches is None:
            step = _ddp_step(model, args, kwargs)
        else:
            step = _microbatched_step(model, args, kwargs, microbatches, threads=dropout)
        opt = make_optimizer(optimizer, model.parameters(), lr)
        # A replica of CPU workers runs on one intra-op thread each, as the plan times them
        # (without, torch's default, one per core, unless torchrun's OMP_NUM_THREADS=1 set it).
        with worker_threads(here.values()) as threads, (
                contextlib.nullcontext() if dropout else no_dropout()):
            losses, times, record = _steps(step, model, opt, steps=steps, recording=recording)
            record |= {"checkpointed": len(runs), "unit_forwards": sum(runs)}  # the steps'
            if recording and sharding == "fsdp":
                record["peak_bytes"] = _fsdp_peak_bytes(step, model, opt, args, kwargs)
        # DDP's reducer (held by the step) goes before its process group: left to the
        # interpreter's exit, it was destroyed after the group, and about one run in five
        # aborted ("terminate called without an active exception") once training was done.
        del step
        dist.barrier()
    finally:
        dist.destroy_process_group()
    timed = times[1:] or times
    count = microbatches["count"] if microbatches is not None else 1
    report = {"losses": losses, "times_s": times, "measured_s": statistics.median(timed),
              "replicas": replicas, "microbatches": count, "backend": backend, "batch": size,
              "sharding": sharding,
              "threads": threads,
              "shard": size // replicas, "optimizer": optimizer, "lr": lr,
              "device_maps": [replica_device_map(planned, rank=r, groups=groups)
                              for r in range(replicas)]}
    return report, record | {"optimizer": optimizer, "replicas": replicas}


def _ddp_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Step:
    """A step's forward and backward of the shard under DistributedDataParallel, which
    averages the gradients across the replicas during the backward; the step returns the
    shard's loss."""
    replica = ddp_replica(model)

    def step() -> torch.Tensor:
        loss = replica(*args, **kwargs)
        loss.backward()  # DDP's hooks average the gradients across the replicas here
        return loss

    return step


def _fsdp_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Step:
    """A step's forward and backward of the shard under FSDP2: ``fully_shard`` on each unit's
    segments (the plan's, ``SegmentInfo.unit``: ``train.sharded``) and then on the whole
    model, over a mesh of every rank; the backward reduce-scatters the gradients (their mean,
    each rank keeping its shard). The step returns the shard's loss."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = torch.device(model.devices[0]).type
    fully_shard_units(model, init_device_mesh(kind, (dist.get_world_size(),)))

    def step() -> torch.Tensor:
        loss = model(*args, **kwargs)
        loss.backward()  # FSDP2's hooks reduce-scatter each unit's gradients here
        return loss

    return step


def checkpointed(model: torch.nn.Module) -> list[int]:
    """Each segment of ``model`` that belongs to a unit (``SegmentInfo.unit``, FSDP2's) runs
    under ``torch.utils.checkpoint`` (non-reentrant): it keeps its inputs, and its forward runs
    again in the backward (torchtitan's per-block activation checkpointing; FSDP2's hooks stay
    outside it, as they do around torchtitan's checkpoint wrapper). Returns each such
    segment's count of forward runs, which the runs add to (twice a step)."""
    import functools

    from torch.utils.checkpoint import checkpoint

    runs: list[int] = []
    for seg in model.segment_info:
        if seg.unit is not None:
            module = getattr(model, f"seg{seg.index}")
            runs.append(0)

            def counted(*args: Any, _forward: Any = module.forward, _i: int = len(runs) - 1,
                        **kwargs: Any) -> Any:
                runs[_i] += 1
                return _forward(*args, **kwargs)

            module.forward = functools.partial(checkpoint, counted, use_reentrant=False,
                                               context_fn=_recomputed_as_run)
    return runs


def _recomputed_as_run() -> tuple[Any, Any]:
    """``checkpoint``'s contexts for a unit's forward and its run again in the backward: where
    the forward runs under ``train.layers.NoDropout`` (``--no-dropout``, a mode of the thread
    that the backward's recomputation runs outside), the recomputation does too, so that both
    save the same tensors and give the same values."""
    from torch.overrides import _get_current_function_mode_stack

    from autoplace.train.layers import NoDropout

    zeroed = any(isinstance(m, NoDropout) for m in _get_current_function_mode_stack())
    return contextlib.nullcontext(), NoDropout() if zeroed else contextlib.nullcontext()


def fully_shard_units(model: torch.nn.Module, mesh: Any) -> None:
    """FSDP2's ``fully_shard`` over ``mesh`` on each unit's segments of ``model`` (the plan's,
    ``SegmentInfo.unit``: ``train.sharded``), then on the whole model (the root's)."""
    from torch.distributed.fsdp import fully_shard

    units: dict[str, list[torch.nn.Module]] = {}
    for seg in model.segment_info:
        if seg.unit is not None:
            units.setdefault(seg.unit, []).append(getattr(model, f"seg{seg.index}"))
    for modules in units.values():
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh)
    fully_shard(model, mesh=mesh)


def _fsdp_peak_bytes(step: Step, model: torch.nn.Module, opt: torch.optim.Optimizer,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """This rank's peak bytes over one more step (its optimizer's state already made), as
    torch's ``FSDPMemTracker`` counts them: sharded and unsharded parameters and gradients,
    optimizer state, activations, inputs, collectives' buffers and temporaries."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = FSDPMemTracker(model, opt)
    tracker.track_inputs((args, kwargs))
    with tracker:
        opt.zero_grad()
        step()
        opt.step()
    return int(sum(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()))


def _microbatched_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                       microbatches: Mapping[str, Any], *, threads: bool = True) -> Step:
    """A step of the shard cut into ``microbatches["count"]``, run in the plan's order
    (``microbatch.train_step``, which checks the order against the model's segments), then
    the gradients averaged across the replicas (``average_gradients``); the step returns the
    shard's loss. No parameter is broadcast first, as DDP does: every rank loads the same
    weights from model/. Without ``threads`` this thread runs every action (``train_step``'s
    ``threads=False``)."""
    batches = split_batch(args, kwargs, int(microbatches["count"]))
    order = [Action(int(s), int(k), str(phase)) for s, k, phase in microbatches["order"]]
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> torch.Tensor:
        loss = train_step(model, batches, order, str(microbatches["loss"]),
                          recompute=microbatches.get("recompute", ()),
                          threads=None if threads else False)
        average_gradients(params)
        return loss

    return step


def _steps(step: Step, model: torch.nn.Module, opt: torch.optim.Optimizer, *, steps: int,
           recording: bool) -> tuple[list[float], list[float], dict[str, Any]]:
    """``steps`` optimizer steps, each after a ``step`` (the forward and backward, gradients
    averaged); the losses (all-reduced mean), the step times and, when ``recording``, what
    ``verify_replicas`` compares: the parameters' names (each with its index in the
    optimizer), and per step the loss, the averaged gradients, the updated parameters, the
    optimizer's state and the buffers by name (batch norm's running statistics: this rank's),
    all on the CPU."""
    gpus = [torch.device(d) for d in set(model.devices) if d.startswith("cuda")]
    # nccl all-reduces CUDA tensors only; a micro-batched step's loss comes back on the CPU.
    where = (torch.device("cuda", torch.cuda.current_device())
             if dist.get_backend() == "nccl" else None)
    params = opt.param_groups[0]["params"]
    index = {id(p): i for i, p in enumerate(params)}
    losses, times, steps_record = [], [], []
    for _ in range(steps):
        began = time.perf_counter()
        opt.zero_grad()
        loss = step()
        opt.step()
        for gpu in gpus:
            torch.cuda.synchronize(gpu)
        times.append(time.perf_counter() - began)
        mean = loss.detach().to(where or loss.device, copy=True)
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        losses.append(float(mean.to("cpu")))
        if recording:  # the step's gradients are still there: the next zero_grad clears them
            steps_record.append({
                "loss": mean.to("cpu"),
                "grads": [None if p.grad is None else _cpu(p.grad) for p in params],
                "params": [_cpu(p) for p in params],
                "state": pytree.tree_map(_cpu, opt.state_dict()),
                "buffers": {name: _cpu(b) for name, b in _named_buffers(model, True).items()}})
    names = {name: index[id(p)] for name, p in _named(model, prefix=True).items()}
    return losses, times, {"names": names, "steps": steps_record}


def _cpu(value: Any) -> Any:
    """A tensor copied to the CPU, detached (the next step changes the original in place); a
    DTensor (FSDP2's shards) gathered whole first, which every rank does in the same order."""
    if is_dtensor(value):
        value = value.full_tensor()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return value
