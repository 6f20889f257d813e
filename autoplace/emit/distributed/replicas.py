"""Emit: start a training plan's data-parallel replicas, and check them against the original.

``launch_replicas`` runs ``OUT/train.py`` (``ddp.write_train_script``) as R processes under
torchrun (``cluster.local.torchrun``) on 127.0.0.1 and a free port, within a time limit. On a
timeout, an interrupt or an error here it stops torchrun and every worker it started (they lead
process groups of their own); when a worker fails, the error raised here is the worker's own
(the ``autoplace: error:`` line ``ddp.replica_main`` prints) or, for a crash, the last lines of
the processes' output.

``verify_replicas`` trains the replicas for a few steps with ``train.py --record`` and, in this
process, a copy of the original model on the whole batch, and compares each step as
``check.training.verify_training`` does, with its helpers: the loss (the replicas' mean), the
gradients and the updated parameters (under Adam, where the update is well conditioned).

Read ``launch_replicas`` and ``_stop``, then ``verify_replicas`` and ``_compare``.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import tempfile
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace import errors
from autoplace.cluster.local import free_port, torchrun
from autoplace.emit.check.training import (
    TRAINING_STEPS,
    _all_trained,
    _apart,
    _close,
    _compare_buffers,
    _compare_update,
    _known,
    _named,
    _named_buffers,
    _same_dropouts,
    dropout_active,
    take_step_state,
)
from autoplace.emit.codegen.model import PartitionedModel
from autoplace.emit.distributed.ddp import REPLICA_SHARDS, batch_size, write_train_script
from autoplace.emit.files.saving import load_inputs, save_model
from autoplace.emit.train.microbatch import split_batch
from autoplace.errors import AutoplaceError, EmitError, VerificationError
from autoplace.train.graph import make_optimizer
from autoplace.train.layers import no_dropout

__all__ = ["VERIFY_TIMEOUT_S", "launch_replicas", "verify_replicas"]

# verify_replicas: three steps of a model the one-process check has just trained in seconds;
# nearly all of this is left for R processes to start, import torch and meet.
VERIFY_TIMEOUT_S = 300.0
# The lines of the processes' output a crash's error quotes (a traceback's end and torchrun's
# summary of the failed ranks).
_TAIL_LINES = 25
# The directory that holds this autoplace package (autoplace/emit/distributed/ is three
# levels below it): the workers import the same one.
_ROOT = Path(__file__).resolve().parents[3]


def launch_replicas(script: str | os.PathLike[str], *, replicas: int, argv: Sequence[str],
                    timeout_s: float, what: str = "replica") -> str:
    """Run ``torchrun --nproc-per-node replicas script *argv`` on this machine and wait at most
    ``timeout_s``; the processes' output (stdout and stderr). Raises ``AutoplaceError`` (the
    workers' own kind where they printed one) when they fail or run past the limit; either
    way, no process is left behind. ``what``: the processes, as errors name them. torchrun
    runs in a forked copy of this process (``cluster.local.torchrun``), which spares it the
    seconds of importing torch that ``python -m torch.distributed.run`` takes."""
    command = ["--nproc-per-node", str(replicas), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(script), *argv]
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), *([path] if path else [])])}
    with tempfile.TemporaryDirectory(prefix="autoplace-torchrun-") as tmp:
        log = Path(tmp) / "output"
        process = torchrun(command, env=env, log=log)
        try:
            process.join(timeout_s)
            if process.exitcode is None:
                raise AutoplaceError(
                    f"the {replicas} {what} processes of {script} ran past {timeout_s:g} s: "
                    "stopped them (torchrun and its workers)")
        finally:
            _stop(process)
        code = process.exitcode
        output = log.read_bytes().decode(errors="replace") if log.exists() else ""
    if code != 0:
        raise _failure(output, code=code, replicas=replicas, script=script, what=what)
    return output


def _stop(process: BaseProcess) -> None:
    """Kill torchrun and every process under it, if it still runs. torchrun is stopped first
    (SIGSTOP: it starts no worker while its tree is read), then each descendant's group (a
    worker leads its own) and torchrun's are killed. Descendants are found through /proc; on a
    system without it, workers outlive torchrun until their rendezvous store goes."""
    if process.exitcode is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    for pid in _descendants(process.pid):
        for kill, target in ((os.killpg, pid), (os.kill, pid)):
            try:
                kill(target, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.join()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from the parent ids in /proc/*/stat (empty without /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces: the fields follow its ")".
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # it ended while we read
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _failure(output: str, *, code: int, replicas: int, script: str | os.PathLike[str],
             what: str = "replica") -> AutoplaceError:
    """The error of a failed run: the first ``autoplace: error: KIND: message`` a worker
    printed, as that kind; else the end of the output."""
    said = re.search(r"^autoplace: error: (\w+): (.*)$", output, re.MULTILINE)
    kind = getattr(errors, said[1], None) if said else None
    if said and isinstance(kind, type) and issubclass(kind, AutoplaceError):
        return kind(said[2])
    tail = "\n".join(output.strip().splitlines()[-_TAIL_LINES:])
    return EmitError(f"the {replicas} {what} processes of {script} failed (torchrun exited "
                     f"with {code}); the end of their output:\n{tail}")


def verify_replicas(emitted_or_dir: PartitionedModel | str | os.PathLike[str],
                    original: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    targets: tuple[Any, ...], *, optimizer: str, replicas: int,
                    steps: int = TRAINING_STEPS, lr: float | None = None,
                    timeout_s: float = VERIFY_TIMEOUT_S,
                    groups: Sequence[Sequence[str]] | None = None,
                    microbatches: Mapping[str, Any] | None = None,
                    sharding: str = "ddp", recompute: bool = False) -> dict[str, Any]:
    """Train ``replicas`` data-parallel replicas of the emitted model (gloo, or nccl on GPUs,
    on 127.0.0.1) for ``steps`` steps of ``optimizer``, each on its shard of the batch
    ``args``/``kwargs``/``targets``, and a copy of ``original`` (a ``train.LossModel``) on the
    whole batch here; compare every step. Returns the record (as ``verify_training``'s, with
    ``replicas``); raises ``VerificationError`` naming the first step and tensor that differ.

    ``emitted_or_dir``: a ``PartitionedModel`` (saved with the batch, and its ``train.py``
    written, in a temporary directory, with each replica on its ``groups`` entry, torch
    devices as ``ddp.replica_device_map`` takes them, and its shard cut as ``microbatches``
    says, ``ddp.microbatching``'s; held as ``sharding`` says, a key of ``ddp.SHARDINGS``:
    FSDP2's gradients and state are gathered whole to be recorded; ``recompute``: each unit of
    a sharded replica checkpointed, its forwards counted: twice a step), or an output directory
    holding ``train.py`` and ``model/`` whose saved example is this batch (its own
    ``train.py`` runs).

    Every dropout runs at probability zero on both sides (``train.py --no-dropout``,
    ``train.layers.no_dropout``); an original in ``train()`` is run as the replicas run it
    (``_reference_step``), and the buffers rank 0 records (its running statistics) are
    compared. Where the emitted graphs drop out, a step of the emitted model with dropout on
    (replica 0's first micro-batch, here) shows it active (``check.training.dropout_active``)."""
    batch = (tuple(args), {**kwargs, "targets": tuple(targets)})
    batch_size(batch, replicas=replicas)  # a batch that does not divide fails before any start
    with tempfile.TemporaryDirectory(prefix="autoplace-replicas-") as tmp:
        if isinstance(emitted_or_dir, PartitionedModel):
            root = Path(tmp)
            _save(emitted_or_dir, root / "model", batch)
            write_train_script(root, optimizer=optimizer, replicas=replicas, groups=groups,
                               microbatches=microbatches, sharding=sharding,
                               recompute=recompute)
        else:
            root = Path(emitted_or_dir)
            _check_saved_batch(root, batch)
        record_file = Path(tmp) / "record.pt"
        launch_replicas(root / "train.py", replicas=replicas, timeout_s=timeout_s,
                        argv=["--steps", str(steps), "--record", str(record_file),
                              "--no-dropout", *(["--lr", repr(lr)] if lr is not None else [])])
        record = torch.load(record_file, weights_only=True)
    if (record["optimizer"], record["replicas"]) != (optimizer, replicas):
        raise VerificationError(
            f"{root / 'train.py'} trains {record['replicas']} replicas with "
            f"{record['optimizer']}, not the {replicas} with {optimizer} asked for")
    if recompute and not (record["checkpointed"]
                          and record["unit_forwards"] == 2 * record["checkpointed"] * steps):
        raise VerificationError(
            f"the sharded replicas were to recompute each unit's forward in the backward: "
            f"{record['checkpointed']} segments checkpointed ran {record['unit_forwards']} "
            f"forwards in {steps} steps, not twice a step each")
    dropout: dict[str, Any] = {}
    if isinstance(emitted_or_dir, PartitionedModel):
        first = split_batch(*split_batch(*batch, replicas, what=REPLICA_SHARDS)[0],
                            int((microbatches or {}).get("count", 1)))[0]
        dropout = dropout_active(emitted_or_dir, _forward(emitted_or_dir, first))
    return _compare(record, original, args, kwargs, targets, optimizer=optimizer, lr=lr,
                    cut=(replicas, microbatches),
                    dropout=dropout if isinstance(emitted_or_dir, PartitionedModel) else None
                    ) | dropout


def _forward(model: torch.nn.Module, batch: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    def run() -> torch.Tensor:
        with torch.no_grad():
            return model(*batch[0], **batch[1])

    return run


def _save(emitted: PartitionedModel, directory: Path,
          batch: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
    """``save_model`` with ``batch`` as the example inputs (the whole batch, which each replica
    shards), leaving the model's own example as it was."""
    before = emitted.__dict__.get("example_inputs")
    emitted.example_inputs = batch
    try:
        save_model(emitted, directory)
    finally:
        emitted.example_inputs = before


def _check_saved_batch(root: Path, batch: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
    """The batch saved in ``root/model`` is ``batch``, and ``root`` has its ``train.py``."""
    if not (root / "train.py").is_file():
        raise EmitError(f"{root} holds no train.py, the replicas' entry point: save the plan "
                        "again with training.replicas above 1")
    saved = load_inputs(root / "model")
    ours, spec = pytree.tree_flatten(batch)
    theirs, saved_spec = pytree.tree_flatten(saved) if saved is not None else ([], None)
    same = saved_spec == spec and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        else a == b for a, b in zip(ours, theirs))
    if not same:
        raise VerificationError(f"the batch given differs from the example saved in "
                                f"{root / 'model'}, which the replicas train on")


def _reference_step(reference: torch.nn.Module, batch: tuple[tuple[Any, ...], dict[str, Any]],
                    cut: tuple[int, Mapping[str, Any] | None]) -> tuple[torch.Tensor, int]:
    """The original's forward and backward, as the ``cut`` (replicas, micro-batching) runs it,
    every dropout at probability zero: on the whole batch, or, with its layers in ``train()``
    (batch norm normalizes by what it is given), on each replica's shard cut into its
    micro-batches, each shard's gradients accumulated apart and then summed and divided by
    the replicas as their all-reduce does (another order of the sums rounds otherwise, which
    Adam amplifies where a gradient is small); the buffers afterwards replica 0's (as rank 0
    records them: DDP broadcasts rank 0's before each forward, and micro-batched replicas
    keep their own). The loss (the replicas' mean) and how many dropouts would have dropped
    per forward."""
    replicas, microbatches = cut
    with no_dropout() as mode:
        if not any(m.training for m in reference.modules()):
            loss = reference(*batch[0], **batch[1])
            loss.backward()
            return loss, mode.dropped
        count = int((microbatches or {}).get("count", 1))
        share = 1.0 / count if (microbatches or {}).get("loss", "mean") == "mean" else 1.0
        params = [p for p in reference.parameters() if p.requires_grad]
        losses, shards, kept = [], [], {}
        for rank, shard in enumerate(split_batch(*batch, replicas, what=REPLICA_SHARDS)):
            for args, kwargs in split_batch(*shard, count):
                loss = reference(*args, **kwargs)
                loss.backward(torch.full_like(loss, share))
                losses.append(loss.detach().to("cpu", torch.float64) * share)
            shards.append([p.grad for p in params])
            for p in params:
                p.grad = None
            if rank == 0:
                kept = {b: b.detach().clone() for b in reference.buffers()}
        with torch.no_grad():
            for buffer, value in kept.items():
                buffer.copy_(value)
            for p, grads in zip(params, zip(*shards)):
                if all(g is not None for g in grads):
                    p.grad = sum(grads[1:], grads[0].clone()) / replicas
    return (sum(losses) / replicas).float(), mode.dropped // (replicas * count)


def _restart(opt: torch.optim.Optimizer, twin: torch.optim.Optimizer,
             theirs: Mapping[str, torch.Tensor], params: Sequence[torch.Tensor],
             names: Mapping[str, int]) -> None:
    """The original's parameters and optimizer state set to the replicas' once a step is
    compared, so that each step is checked from the same point (as ``check.training`` does
    under mixed precision). In ``train()`` batch norm makes the next gradient of a
    convolution before it sensitive to its weights: the replicas' step-1 gradients, a
    rounding apart from the original's (6.5e-8 in ``examples/resnet.py``, 2 replicas of 2
    micro-batches), moved Adam's update of small gradients by 8e-6, within the parameters'
    tolerance, and the next gradient of the stem's convolution by 5e-4, 1.3% of its largest
    element; from the replicas' parameters the original's is 5e-8 from theirs."""
    for name, i in names.items():
        take_step_state(theirs[name], opt, params[i], twin)


def _compare(record: Mapping[str, Any], original: torch.nn.Module, args: tuple[Any, ...],
             kwargs: Mapping[str, Any], targets: tuple[Any, ...], *, optimizer: str,
             lr: float | None, cut: tuple[int, Mapping[str, Any] | None] = (1, None),
             dropout: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replay the recorded steps beside ``original`` trained as ``_reference_step`` runs it
    (``cut``: the replicas and their micro-batching); with ``dropout``, the emitted graphs'
    (``check.training.dropout_active``), the original must drop out at as many places."""
    reference = copy.deepcopy(original)
    in_train = any(m.training for m in reference.modules())
    theirs = _named(reference, prefix=False)
    their_buffers = _named_buffers(reference, False)
    initial = {name: b.detach().to("cpu", copy=True) for name, b in their_buffers.items()}
    names: Mapping[str, int] = record["names"]
    replicas = record["replicas"]
    # Tensor-parallel ranks (``tensor_train``) each run the whole batch: nothing is averaged.
    ranks = record.get("ranks")
    whose = (f"the {ranks} tensor-parallel ranks' (gathered whole)" if ranks
             else f"the mean of the {replicas} replicas'")
    _known(names, theirs)
    opt = make_optimizer(optimizer, dict.fromkeys(theirs.values()), lr)
    original_losses: list[float] = []
    worst = {"grad": 0.0, "param": 0.0, "buffer": 0.0}
    masks: dict[str, torch.Tensor] = {}
    for step, mine in enumerate(record["steps"], start=1):
        opt.zero_grad()
        loss, dropped = _reference_step(reference, (args, {**kwargs, "targets": targets}), cut)
        if step == 1 and dropout is not None:
            _same_dropouts(dropped, dropout)
        original_losses.append(float(loss.detach()))
        worst["buffer"] = max(worst["buffer"], _compare_buffers(
            mine.get("buffers", {}), their_buffers, initial, f"after step {step} (rank 0's)"))
        _close(mine["loss"], loss, f"the loss at step {step} ({whose} against the whole "
               "batch's)")
        _all_trained(names, theirs, step - 1)
        for name, i in names.items():
            worst["grad"] = max(worst["grad"], _close(
                mine["grads"][i], theirs[name].grad,
                f"the gradient of {name} "
                + (f"of {whose}" if ranks else "averaged over the replicas")
                + f" at step {step}"))
        opt.step()
        # The replicas' optimizer, rebuilt on their updated parameters, for _conditioned.
        twin = make_optimizer(optimizer, mine["params"], lr)
        twin.load_state_dict(mine["state"])
        for name, i in names.items():
            # The replicas ran on: where set apart, the original takes their values.
            worst["param"] = max(worst["param"], _compare_update(
                (opt, theirs[name]), (twin, mine["params"][i]), f"{name} after step {step}",
                masks, name, follow="original"))
        if in_train:
            _restart(opt, twin, theirs, mine["params"], names)
    return {"status": "passed", "optimizer": optimizer, "steps": len(record["steps"]),
            "replicas": replicas, "losses": [float(s["loss"]) for s in record["steps"]],
            "original_losses": original_losses,
            "max_abs_diff_gradients": worst["grad"], "max_abs_diff_parameters": worst["param"],
            "ill_conditioned_elements": _apart(masks), "max_abs_diff_buffers": worst["buffer"],
            "buffers_compared": len(set(record["steps"][0].get("buffers", {}))
                                    & set(their_buffers)) if record["steps"] else 0} | (
                {"measured_peak_bytes": record["peak_bytes"]} if "peak_bytes" in record else {})
