"""The replica counts a training plan weighs (``plan_step``): each R that divides the devices
into alike groups and the batch into shards (``replica_counts``), how each holds the model
(``replica_variants``: whole replicas, DDP, or sharded by FSDP2), and the solve time each gets
(``time_share``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from autoplace.emit.distributed.ddp import REPLICA_SHARDS
from autoplace.emit.train.microbatch import loss_rule, split_batch
from autoplace.errors import AutoplaceError, ConfigError
from autoplace.ir import Cluster
from autoplace.progress.notes import note
from autoplace.train.dataparallel import replica_groups

__all__ = ["replica_counts", "replica_variants", "shard_cut", "time_share"]

Batch = tuple[tuple[Any, ...], dict[str, Any]]


def time_share(limit_s: float, variants: list[tuple[int, Any, str]], sharding: str, *,
                fsdp: str, found: Mapping[tuple[int, str], tuple[Any, list[str]]]) -> float:
    """The solve time of one candidate, the candidates' together at most ``limit_s``: shared
    evenly, except under ``fsdp=auto``, where the whole replicas' steps share all but one
    slice and the sharded ones that run (those of counts whose whole replicas do not fit)
    share that slice."""
    whole = sum(1 for _, _, s in variants if s == "ddp")
    sharded = len(variants) - whole
    if fsdp != "auto" or not sharded:
        return limit_s / len(variants)
    if sharding == "ddp":
        return limit_s / (whole + 1)
    running = sum(1 for r, _, s in variants if s == "fsdp" and not (
        (r, "ddp") in found and found[r, "ddp"][0].solved.schedule.feasible))
    return limit_s / (whole + 1) / max(running, 1)


def replica_variants(counts: list[tuple[int, list[tuple[str, ...]]]], fsdp: str,
                     microbatches: int) -> list[tuple[int, list[tuple[str, ...]], str]]:
    """Each replica count with how its replicas hold the model: ``ddp`` unless ``fsdp`` is
    ``on``, and then ``fsdp`` (``train.sharded``) unless it is ``off``, where a replica is one
    device running one batch (R > 1; no micro-batches). The whole replicas' steps come first
    (``auto`` shards a count only once its whole replicas are found not to fit). ``fsdp=on``
    with no such count is an error."""
    variants = []
    for r, groups in counts:
        if fsdp != "on":
            variants.append((r, groups, "ddp"))
    for r, groups in counts:
        if fsdp != "off" and r > 1 and len(groups[0]) == 1 and microbatches == 1:
            variants.append((r, groups, "fsdp"))
    if not variants:
        tried = ", ".join(f"R={r} ({len(g[0])} device{'s' if len(g[0]) > 1 else ''} each)"
                          for r, g in counts)
        raise ConfigError("{training.fsdp=on} shards over replicas of one device each (R the "
                          "number of devices, 2 or more, and a batch that divides into R "
                          f"shards), and none could be planned here ({tried}; the notes say "
                          "why a count was not considered): plan on 2 or more devices whose "
                          "number divides the batch, or set {training.fsdp=auto}")
    return variants


def replica_counts(model: torch.nn.Module, whole: Batch, cluster: Cluster,
                    replicas: int | str, microbatches: int, dtype: str
                    ) -> list[tuple[int, list[tuple[str, ...]]]]:
    """The replica counts to plan, each with its device groups: ``replicas``, or with
    ``auto`` every R that divides the devices into alike groups, the batch into equal
    shards (each of which divides into ``microbatches``), and whose loss is the mean of the
    shards' (the replicas' gradients are averaged); the others are said in notes. An
    asked-for R that cannot be is an error. In a half ``dtype`` (mixed precision) one replica
    only."""
    asked = replicas != "auto"
    count = len(cluster.devices)
    wanted = [int(replicas)] if asked else [r for r in range(1, count + 1) if count % r == 0]
    if dtype != "float32" and any(r > 1 for r in wanted):
        # train.py (emit/distributed/ddp.py) steps a float32 optimizer: its replicas would need
        # MasterWeights and, for float16, one loss scale agreed on by every rank.
        if asked:
            raise ConfigError(f"data-parallel replicas in {dtype} (mixed precision) are not "
                              "built yet: use {training.replicas=1} or {dtype=float32}")
        note(f"data-parallel replicas in {dtype} (mixed precision) are not built yet: "
             "one replica over every device (R=1)")
        wanted = [1]
    kept = []
    for r in wanted:
        if r == 1:
            kept.append((1, [cluster.names]))
            continue
        groups = replica_groups(cluster, r)
        why = None
        if count % r:
            why = f"{r} does not divide the {count} devices into equal groups"
        elif groups is None:
            why = (f"the {count} devices do not form {r} alike groups (the same device types "
                   "and the same links inside each)")
        else:
            try:
                shards = split_batch(*whole, r, what=REPLICA_SHARDS)
                if loss_rule(model, *whole, shards) != "mean":
                    why = ("the loss is the sum of the shards' losses, and "
                           "the replicas' gradients are averaged")
                else:
                    why = shard_cut(shards[0], microbatches)
            except AutoplaceError as exc:
                why = str(exc)
        if why is None:
            kept.append((r, groups))
        elif asked:
            cut = f" {{training.microbatches={microbatches}}}" if microbatches > 1 else ""
            raise ConfigError(f"{{training.replicas={r}}}{cut}: {why}")
        else:
            note(f"{r} data-parallel replicas not considered: {why}")
    return kept


def shard_cut(shard: Batch, microbatches: int) -> str | None:
    """Why a replica's ``shard`` does not divide into ``microbatches``, or ``None``."""
    try:
        split_batch(*shard, microbatches)
    except AutoplaceError as exc:
        return f"each replica's shard: {exc}"
    return None
