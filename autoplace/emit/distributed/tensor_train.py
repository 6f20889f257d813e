"""Emit: tensor-parallel training of an emitted model over N ranks, run by DTensor.

A training plan's candidate (``--tp N --mode training``): the one-device model of the model and
its loss, its matmuls split as ``tensor.column_row`` finds them, trained by N ranks, each on the
whole batch (the ranks divide each matmul's work); with ``--dp D`` a D x N mesh, each tp group
on 1/D of the batch, sharded over dp by FSDP2 (``fully_shard`` per unit, torchtitan's FSDP + TP)
or its gradients averaged over dp (DDP's algorithm: DDP takes no DTensor); each unit
checkpointed where the plan recomputes (``ddp.checkpointed``). ``write_tensor_train``
writes ``OUT/tensor_parallel/train.py``; each rank (``tensor_train_main``) makes its parameters
DTensors (``dtensor.shard_model``) and runs ``--steps`` steps under ``dtensor.dtensor_rules``.
``verify_tensor_training`` trains it on gloo ranks with every dropout at zero and compares the
losses, the gradients (gathered whole) and the updated parameters with the original's step by
step (``replicas._compare``). ``solve.tensor_train`` prices it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from string import Template
from typing import Any

import torch
import torch.distributed as dist

from autoplace.emit.codegen.model import PartitionedModel
from autoplace.emit.distributed.dtensor import dtensor_rules
from autoplace.emit.distributed.tensor import _rank_device, load_sharded
from autoplace.errors import AutoplaceError, VerificationError
from autoplace.formats.records import SHARDING_SAID

__all__ = ["tensor_train_main", "verify_tensor_training", "write_tensor_train"]

VERIFY_TIMEOUT_S = 300.0
_TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "tensor_train.py.tmpl"


def write_tensor_train(directory: str | os.PathLike[str], *, devices: Sequence[str],
                       names: Sequence[str], split: Mapping[str, tuple[str, int]],
                       optimizer: str, dp: int = 1, sharding: str = "ddp",
                       recompute: bool = False, pp: int = 1, microbatches: int = 1,
                       schedule: str = "gpipe", model: torch.nn.Module | None = None,
                       example: Any = None) -> Path:
    """Write ``directory/train.py`` (``templates/tensor_train.py.tmpl``: ``tensor_train_main``
    for rank r on ``devices[r]``, plan name ``names[r]``, with ``optimizer``; ``dp``
    data-parallel groups, ``sharding`` over them; ``recompute``, each unit checkpointed;
    ``pp`` pipeline stages run by ``schedule`` with ``microbatches``) and
    ``directory/split.json`` (with ``pp`` > 1 ``stages.json`` too, from one pass of ``model``
    on ``example``, one micro-batch of the batch and its targets); the script's path. The
    model it trains is ``directory/model``."""
    root = Path(directory)
    if pp > 1:
        from autoplace.emit.distributed.tensor_stages import write_stage_table

        write_stage_table(root, model, example)
    (root / "split.json").write_text(json.dumps({k: list(v) for k, v in split.items()},
                                                indent=1) + "\n")
    path = root / "train.py"
    path.write_text(Template(_TEMPLATE.read_text()).substitute(
        world=len(devices), devices=repr(list(devices)), names=repr(list(names)),
        optimizer=repr(optimizer), dp=dp, sharding=repr(sharding), recompute=recompute, pp=pp,
        microbatches=microbatches, schedule=repr(schedule)))
    return path


def tensor_train_main(model_dir: str | os.PathLike[str], argv: Sequence[str], *,
                      devices: Sequence[str], names: Sequence[str], optimizer: str,
                      dp: int = 1, sharding: str = "ddp", recompute: bool = False,
                      pp: int = 1, microbatches: int = 1, schedule: str = "gpipe") -> int:
    """One rank of ``torchrun --nproc-per-node N train.py``: train ``model_dir`` split over the
    N ranks (``--split FILE``; with ``dp`` > 1 a dp x N/dp mesh, ``sharding`` over dp; with
    ``recompute`` each unit's segments checkpointed, ``checkpointed``; with ``pp`` > 1 a pp x
    N/pp mesh of pipeline stages, ``microbatches`` of them scheduled by ``schedule``,
    ``tensor_stages_train``) for
    ``--steps`` steps on its saved example batch (its dp group's share), on this rank's
    device (``devices[rank]``, remapped by ``--device-map``). Rank 0 writes the report
    (``--json``) and, for ``verify_tensor_training``, each step's loss, gradients, parameters
    and optimizer state gathered whole (``--record``, ``torch.save``). The exit code; an
    ``AutoplaceError`` is printed as one line and exits with 2."""
    from autoplace.emit.distributed.ddp import (
        add_training_flags,
        check_world,
        print_error,
        say_trained,
    )

    mesh = (f"a {dp} x {len(devices) // dp} mesh (dp x tp, {SHARDING_SAID[sharding]} over dp)"
            if dp > 1 else f"a {pp} x {len(devices) // pp} mesh (pp x tp, {microbatches} "
            f"micro-batches by {schedule})" if pp > 1
            else f"{len(devices)} tensor-parallel ranks")
    parser = argparse.ArgumentParser(
        prog="train.py", description=f"Train {model_dir} as {mesh} with {optimizer}; run "
        f"under torchrun --nproc-per-node {len(devices)}.")
    parser.add_argument("--split", required=True, metavar="FILE",
                        help="each split weight: [column or row, dimension], as JSON")
    add_training_flags(parser)
    parser.add_argument("--record", metavar="FILE",
                        help="rank 0 saves each step's loss, gradients, updated parameters and "
                        "optimizer state, gathered whole, to FILE (torch.save)")
    parser.add_argument("--no-dropout", action="store_true",
                        help="every dropout runs at probability zero, so that a model in "
                        "train() is compared exactly")
    parser.add_argument("--device-map", metavar="JSON",
                        help="where each planned torch device runs here (globs, the first "
                        "match wins), e.g. '{\"cuda:*\": \"cpu\"}'")
    options = parser.parse_args(list(argv))
    rank = int(os.environ.get("RANK", "-1"))
    try:
        check_world(rank, len(devices), what=f"trains {mesh}", script="train.py")
        if options.steps < 1:
            raise AutoplaceError(f"--steps must be 1 or more, got {options.steps}")
        device = _rank_device(rank, devices, names, options.device_map)
        report, record = _train(Path(model_dir), options, device=device, optimizer=optimizer,
                                dp=dp, sharding=sharding, recompute=recompute,
                                stages=(pp, microbatches, schedule))
    except AutoplaceError as error:
        print_error(type(error).__name__, error)
        return 2
    if rank == 0:
        say_trained(options, report, record, what=(
            f"{mesh} ({report['backend']}), "
            + (f"each tp group on 1/{dp} of the batch" if dp > 1 else
               "the batch through the stages" if pp > 1 else "each on the whole batch")
            + f", {len(report['losses'])} steps of {optimizer}"))
    return 0


def _train(model_dir: Path, options: argparse.Namespace, *, device: str, optimizer: str,
           dp: int = 1, sharding: str = "ddp", recompute: bool = False,
           stages: tuple[int, int, str] = (1, 1, "gpipe")
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's part: the process group, the mesh (``dp`` x tp), the split model (sharded
    over dp), its share of the batch, the steps (``ddp._steps``, the loss a plain tensor:
    every rank of a tp group holds it whole); with ``stages`` (pp, micro-batches, schedule)
    a pp x tp mesh's (``tensor_stages_train``). Rank 0's report and record."""
    from torch.distributed.tensor.experimental import implicit_replication

    from autoplace.emit.distributed.ddp import INIT_TIMEOUT_S, _steps, checkpointed
    from autoplace.train.graph import make_optimizer
    from autoplace.train.layers import no_dropout

    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.set_device(torch.device(device))
    threads = torch.get_num_threads()
    if kind == "cpu":
        torch.set_num_threads(1)  # one intra-op thread a rank, as the plan times them
    dist.init_process_group("nccl" if kind == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    try:
        world, runs = dist.get_world_size(), []
        if stages[0] > 1:
            losses, times, record = _train_stages(model_dir, options, kind=kind, device=device,
                                                  optimizer=optimizer, stages=stages)
        else:
            model, args, kwargs, averaged = _meshed(model_dir, options.split, kind=kind,
                                                    device=device, dp=dp, sharding=sharding)
            runs = checkpointed(model) if recompute else []
            opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad],
                                 options.lr)
            step = _step(model, args, kwargs, averaged)
            with implicit_replication(), dtensor_rules(), (
                    no_dropout() if options.no_dropout else contextlib.nullcontext()):
                losses, times, record = _steps(step, model, opt, steps=options.steps,
                                               recording=options.record is not None)
            # The DTensors and the mesh go before the process group (as tensor._run_rank
            # does).
            del model, opt, step
        dist.barrier()
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    timed = times[1:] or times
    report = {"losses": losses, "times_s": times, "measured_s": statistics.median(timed),
              "ranks": world, "dp": dp, "sharding": sharding,
              "backend": "nccl" if kind == "cuda" else "gloo",
              "optimizer": optimizer, "lr": options.lr, "device": device,
              "threads": 1 if kind == "cpu" else threads,
              "checkpointed": len(runs), "unit_forwards": sum(runs)}
    return report, record | {"optimizer": optimizer, "replicas": dp, "ranks": world}


def _train_stages(model_dir: Path, options: argparse.Namespace, *, kind: str, device: str,
                  optimizer: str, stages: tuple[int, int, str]
                  ) -> tuple[list[float], list[float], dict[str, Any]]:
    """``_train``'s steps on a pp x tp mesh (``tensor_stages_train.train_stages``), each
    dropout at zero with ``--no-dropout``."""
    from autoplace.emit.distributed.tensor_stages import STAGES_FILE
    from autoplace.emit.distributed.tensor_stages_train import train_stages
    from autoplace.train.layers import no_dropout

    pp, microbatches, schedule = stages
    model, args, kwargs, mesh = load_sharded(model_dir, options.split, kind=kind,
                                             device=device, pp=pp)
    split = {k: tuple(v) for k, v in json.loads(Path(options.split).read_text()).items()}
    with no_dropout() if options.no_dropout else contextlib.nullcontext():
        found = train_stages(model, mesh, split, Path(options.split).parent / STAGES_FILE,
                             args, kwargs, optimizer=optimizer, lr=options.lr,
                             microbatches=microbatches, schedule=schedule,
                             steps=options.steps, recording=options.record is not None)
    del model, mesh
    return found


def _meshed(model_dir: Path, split: str, *, kind: str, device: str, dp: int, sharding: str
            ) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any], Any]:
    """This rank's model split over its tp group and its inputs (``tensor.load_sharded``:
    with ``dp`` > 1 its dp group's share of the batch), the model sharded over dp by FSDP2
    (``sharding="fsdp"``: ``ddp.fully_shard_units``) or, returned last, the dp process group
    whose gradients the step averages (``None``: nothing to average)."""
    from autoplace.emit.distributed.ddp import fully_shard_units

    model, args, kwargs, mesh = load_sharded(model_dir, split, kind=kind, device=device, dp=dp)
    if dp == 1:
        return model, args, kwargs, None
    if sharding == "fsdp":
        fully_shard_units(model, mesh["dp"])
        return model, args, kwargs, None
    return model, args, kwargs, mesh["dp"].get_group()


def _step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
          averaged: Any = None) -> Callable[[], torch.Tensor]:
    """A step's forward and backward of the split ``model`` on this rank's batch, its
    gradients then averaged over the ``averaged`` process group (DDP's buckets,
    ``train.dataparallel.average_gradients``) where there is one; the step returns the loss
    as a plain tensor (replicated: every rank of a tp group holds it whole)."""
    from torch.distributed.tensor import DTensor

    from autoplace.train.dataparallel import average_gradients

    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> torch.Tensor:
        loss = model(*args, **kwargs)
        loss.backward()
        if averaged is not None:
            average_gradients(params, averaged)
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    return step


def verify_tensor_training(emitted: PartitionedModel, original: torch.nn.Module,
                           args: tuple[Any, ...], kwargs: Mapping[str, Any],
                           targets: tuple[Any, ...], *, ranks: int, optimizer: str,
                           split: Mapping[str, tuple[str, int]], steps: int | None = None,
                           dp: int = 1, sharding: str = "ddp", recompute: bool = False,
                           timeout_s: float = VERIFY_TIMEOUT_S, pp: int = 1,
                           microbatches: int = 1, schedule: str = "gpipe") -> dict[str, Any]:
    """Train ``emitted`` (one device's model of the model and its loss) split as ``split`` over
    ``ranks`` gloo processes (``dp`` x ``ranks`` of them on a dp x tp mesh, ``sharding`` over
    dp, each tp group on 1/dp of the batch) for ``steps`` (3) steps of ``optimizer`` on the batch
    ``args``/``kwargs``/``targets``, every dropout at probability zero, and a copy of
    ``original`` (a ``train.LossModel``) here; compare every step's loss, gradients (gathered
    whole) and updated parameters (``replicas._compare``); with ``pp`` > 1 ``emitted`` is cut
    into that many stages on a pp x tp mesh, ``microbatches`` scheduled by ``schedule``.
    Where the emitted graph drops out,
    a step with dropout on shows it active (``check.training.dropout_active``). Returns the
    record (``verify_replicas``'s, with ``measured_s``: rank 0's median step); raises
    ``VerificationError`` naming the first step and tensor that differ."""
    from autoplace.emit.check.training import TRAINING_STEPS, dropout_active
    from autoplace.emit.distributed.replicas import _compare, _forward, _save, launch_replicas
    from autoplace.emit.train.microbatch import split_batch
    from autoplace.train.layers import kept_state

    steps = TRAINING_STEPS if steps is None else steps
    batch = (tuple(args), {**kwargs, "targets": tuple(targets)})
    with tempfile.TemporaryDirectory(prefix="autoplace-tensor-train-") as tmp:
        root = Path(tmp)
        _save(emitted, root / "model", batch)
        world = ranks * dp * pp
        script = write_tensor_train(root, devices=["cpu"] * world,
                                    names=[f"rank {r}" for r in range(world)], split=split,
                                    optimizer=optimizer, dp=dp, sharding=sharding,
                                    recompute=recompute, pp=pp, microbatches=microbatches,
                                    schedule=schedule, model=emitted,
                                    example=split_batch(*batch, microbatches)[0])
        launch_replicas(script, replicas=world, timeout_s=timeout_s, what="tensor-parallel",
                        argv=["--steps", str(steps), "--record", str(root / "record.pt"),
                              "--json", str(root / "report.json"), "--no-dropout"])
        record = torch.load(root / "record.pt", weights_only=True)
        report = json.loads((root / "report.json").read_text())
    if (record["optimizer"], record["ranks"], record["replicas"]) != (optimizer, world, dp):
        raise VerificationError(f"the tensor-parallel ranks trained {record['ranks']} ranks "
                                f"in {record['replicas']} data-parallel groups with "
                                f"{record['optimizer']}, not {world} in {dp} with {optimizer}")
    if recompute and not (report["checkpointed"] and report["unit_forwards"]
                          == 2 * report["checkpointed"] * len(report["losses"])):
        raise VerificationError(
            f"the tensor-parallel ranks were to recompute each unit's forward in the backward: "
            f"{report['checkpointed']} segments checkpointed ran {report['unit_forwards']} "
            f"forwards in {len(report['losses'])} steps, not twice a step each")
    with kept_state(emitted, original):  # the emitted graph runs a tp group's micro-batch
        dropout = dropout_active(emitted, _forward(emitted, split_batch(
            *batch, dp * microbatches, what="data-parallel groups")[0]))
        check = _compare(record, original, tuple(args), dict(kwargs), tuple(targets),
                         optimizer=optimizer, lr=None, cut=(dp, None), dropout=dropout)
    return check | dropout | {"ranks": ranks, "dp": dp, "sharding": sharding,
                              "recompute": recompute,
                              "measured_s": report["measured_s"],
                              "times_s": report["times_s"]}
