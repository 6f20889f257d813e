"""Profile: what averaging the gradients across data-parallel replicas adds to a step, measured
where the replicas are processes of this host (``measure_allreduce_s``, ``allreduce_s``).

Between processes of one host (gloo over 127.0.0.1) the ring formulas (``train.dataparallel``,
``train.sharded``) miss DDP's and FSDP2's own work per step and gloo's latency at small sizes.
Measured instead: R processes (one intra-op thread each, as torchrun starts a CPU plan's
replicas) each hold a stand-in module with the model's trainable shapes in its order, whose
backward writes every gradient and nothing else. Each round, the ranks lined up by a barrier,
times a step without averaging and one averaging the ``mode`` way (``ddp``: under
``DistributedDataParallel``; ``buckets``: the micro-batched step's ``average_gradients``;
``fsdp``: the stand-in by FSDP unit under ``fully_shard``, each step with its optimizer;
``collectives``: a tensor-parallel pass's collectives, ``solve.tensor``): the
cost is rank 0's median of the second less that of the first, charged to the updates. Kept in
the profile cache (``forwards`` table, keyed ``allreduce:MODE:R=R:`` and a digest of the
shapes, on the host's CPU key). Rules and figures: ``docs/training.md``."""

from __future__ import annotations

import datetime
import gc
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from autoplace.cluster.local import free_port
from autoplace.profile.cache import ProfileCache
from autoplace.train.dataparallel import average_gradients, ddp_replica

__all__ = ["MODES", "allreduce_s", "measure_allreduce_s"]

MODES = ("ddp", "buckets", "fsdp", "collectives")
# ``collectives``: ``numels`` is a sequence of [kind, bytes], kind an index of these (the
# ``torch.ops._c10d_functional`` ops DTensor dispatches, ``solve.tensor``).
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single")
Numels = Sequence[int] | Sequence[Sequence[int]]  # ``fsdp``: one list per unit, the root's last
WARMUP, ROUNDS = 3, 25
TIMEOUT_S = 120.0  # the processes are stopped after it: a rank that hangs fails the measurement
_INIT_TIMEOUT = datetime.timedelta(seconds=60)


class _Gradients(torch.nn.Module):
    """Parameters of the given sizes; the forward sums them, so the backward only writes each
    parameter's gradient (a tensor of ones)."""

    def __init__(self, numels: Sequence[int]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for n in numels)

    def forward(self) -> torch.Tensor:
        return sum((w.sum() for w in self.weights), torch.zeros(()))


class _Units(torch.nn.Module):
    """``_Gradients`` per FSDP unit (``blocks``), the root's parameters (``rest``) last."""

    def __init__(self, units: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Gradients(u) for u in units[:-1])
        self.rest = _Gradients(units[-1])

    def forward(self) -> torch.Tensor:
        return sum((block() for block in self.blocks), self.rest())


def _sharded(units: Sequence[Sequence[int]]) -> _Units:
    """The stand-in of ``units`` as the emitted ``train.py`` shards a model (``ddp._fsdp_step``):
    ``fully_shard`` on each unit, then on the whole, over every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _Units(units)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _rounds(numels: Numels, mode: str, rounds: int, optimizer: str | None = None
            ) -> tuple[list[float], list[float]]:
    """Each round's step of the stand-in alone and with its gradients averaged, this rank's."""
    import torch.distributed as dist

    from autoplace.train.graph import make_optimizer

    if mode == "collectives":
        return _collective_rounds(numels, rounds)  # type: ignore[arg-type]
    if mode == "fsdp":
        plain, averaged = _Units(numels), _sharded(numels)  # type: ignore[arg-type]
    else:
        plain, averaged = _Gradients(numels), _Gradients(numels)  # type: ignore[arg-type]
    run: torch.nn.Module = averaged
    if mode == "ddp":
        run = ddp_replica(averaged)
    updates = {id(m): make_optimizer(optimizer, m.parameters())
               for m in (plain, averaged)} if optimizer else {}

    def step(model: torch.nn.Module, average: bool) -> float:
        for w in model.parameters():
            w.grad = None
        dist.barrier()
        began = time.perf_counter()
        (run if average else model)().backward()
        if average and mode == "buckets":
            average_gradients(list(averaged.parameters()))
        if updates:
            updates[id(model)].step()
        return time.perf_counter() - began

    alone, with_average = [], []
    for i in range(WARMUP + rounds):
        a, b = step(plain, False), step(averaged, True)
        if i >= WARMUP:
            alone.append(a)
            with_average.append(b)
    return alone, with_average


def _collective_rounds(sequence: Sequence[Sequence[int]], rounds: int
                       ) -> tuple[list[float], list[float]]:
    """Each round's time of nothing and of ``sequence`` (``[kind, bytes]``, in order), each
    collective a float32 tensor of its bytes (an all-gather's result, the input of the others)
    through ``torch.distributed._functional_collectives`` and waited for, as DTensor runs
    them; this rank's."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    world = dist.get_world_size()
    runs = []
    for kind, nbytes in sequence:
        numel = max(world, int(nbytes) // 4 // world * world)
        name = COLLECTIVES[int(kind)]
        if name == "all_gather_into_tensor":
            x = torch.zeros(numel // world)
            runs.append(lambda x=x: funcol.all_gather_tensor(x, 0, mesh))
        elif name == "reduce_scatter_tensor":
            x = torch.zeros(numel)
            runs.append(lambda x=x: funcol.reduce_scatter_tensor(x, "sum", 0, mesh))
        elif name == "all_to_all_single":
            x = torch.zeros(numel)
            runs.append(lambda x=x: funcol.all_to_all_single(x, None, None, mesh))
        else:
            x = torch.zeros(numel)
            runs.append(lambda x=x: funcol.all_reduce(x, "sum", mesh))

    def step(run: bool) -> float:
        dist.barrier()
        began = time.perf_counter()
        for collective in runs if run else ():
            funcol.wait_tensor(collective())
        return time.perf_counter() - began

    alone, with_all = [], []
    for i in range(WARMUP + rounds):
        a, b = step(False), step(True)
        if i >= WARMUP:
            alone.append(a)
            with_all.append(b)
    return alone, with_all


def _rank(rank: int, replicas: int, port: int, numels: Numels, mode: str, rounds: int,
          out: str, optimizer: str | None = None) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=replicas, timeout=_INIT_TIMEOUT)
    try:
        alone, with_average = _rounds(numels, mode, rounds, optimizer)
        # DDP's reducer goes before its process group: left to the interpreter's exit, after
        # it, it aborted a rank now and then ("terminate called without an active exception").
        gc.collect()
        if rank == 0:
            Path(out).write_text(f"{statistics.median(alone)!r} "
                                 f"{statistics.median(with_average)!r}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_allreduce_s(numels: Numels, *, replicas: int, mode: str = "ddp",
                        rounds: int = ROUNDS, timeout_s: float = TIMEOUT_S,
                        optimizer: str | None = None) -> float:
    """Seconds the averaging of gradients of ``numels`` float32 elements each (the model's
    trainable parameters, in order; ``fsdp``: by unit, the root's last, each step with
    ``optimizer``'s update) across ``replicas`` processes of this host adds to a step, the
    ``mode`` way (see the module's docstring); at least 0, but for ``fsdp``, whose sharded
    update may save more than its collectives cost. Raises ``RuntimeError`` when the
    processes fail or take longer than ``timeout_s``."""
    import multiprocessing

    import torch.multiprocessing as mp

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    if mode == "fsdp":
        if optimizer is None:
            raise ValueError("the fsdp mode measures a step with its optimizer's update")
        sizes: Numels = [[int(n) for n in unit if n] for unit in numels]  # type: ignore[union-attr]
    elif mode == "collectives":
        sizes = [[int(k), int(b)] for k, b in numels]  # type: ignore[misc]
    else:
        sizes = [int(n) for n in numels if n]  # type: ignore[arg-type]
    # The ranks fork from a server process that imported this module (and torch) once: the
    # first measurement of a planning process starts it, the next ones pay no imports (a
    # spawned rank imports torch each time: seconds per rank).
    multiprocessing.set_forkserver_preload(["__main__", __name__])
    with tempfile.TemporaryDirectory(prefix="autoplace-allreduce-") as tmp:
        out = Path(tmp) / "times"
        context = mp.start_processes(_rank, args=(replicas, free_port(), sizes, mode, rounds,
                                                  str(out), optimizer),
                                     nprocs=replicas, join=False, start_method="forkserver")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {replicas} processes took over {timeout_s:.0f} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        alone_s, averaged_s = (float(x) for x in out.read_text().split())
    if mode == "fsdp":  # may save time: the update runs on 1/R of each tensor
        return averaged_s - alone_s
    return max(0.0, averaged_s - alone_s)


def cache_key(numels: Numels, *, replicas: int, mode: str, optimizer: str | None = None) -> str:
    """The profile cache's key for the measurement of ``numels`` (see the module's
    docstring)."""
    if mode in ("fsdp", "collectives"):
        text = "|".join(",".join(str(int(n)) for n in unit if n)
                        for unit in numels) + f"|{optimizer}"  # type: ignore[union-attr]
    else:
        text = ",".join(str(int(n)) for n in numels if n)  # type: ignore[union-attr]
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"allreduce:{mode}:R={replicas}:{digest[:32]}"


def allreduce_s(numels: Numels, *, replicas: int, mode: str, cache: ProfileCache,
                device_key: str, optimizer: str | None = None) -> tuple[float, bool]:
    """``measure_allreduce_s``'s figure from ``cache`` under
    ``device_key`` (the host's CPU), measured and stored when it is not there; with whether
    it came from the cache."""
    key = cache_key(numels, replicas=replicas, mode=mode, optimizer=optimizer)
    found = cache.get_forward(key, device_key)
    if found is not None:
        return found[0], True
    seconds = measure_allreduce_s(numels, replicas=replicas, mode=mode, optimizer=optimizer)
    cache.put_forward(key, device_key, median_s=seconds, spread=0.0, samples=ROUNDS)
    return seconds, False
