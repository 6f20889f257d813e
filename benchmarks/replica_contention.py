"""What two data-parallel replicas on this machine's two cores cost beyond one replica's step.

    python benchmarks/replica_contention.py [--only lenet gpt2] [--steps 25]
    # writes benchmarks/results/replica-contention.md

For each example, one replica's Adam step (its half of the example batch, one intra-op thread,
as ``autoplace run --train`` runs a plan of 2 replicas on ``2xcpu-thread``) is run three ways,
each in fresh processes: **alone** (one process), **side by side** (two processes at once, no
DDP: what the second replica's mere presence costs), and **DDP** (two processes under
``DistributedDataParallel``, gloo over 127.0.0.1, as ``train.py`` runs them). Per step, the
median of: the wall time, this thread's CPU time (``time.thread_time``: not inflated by other
processes taking the core) and the process's CPU time (``time.process_time``: with gloo's own
threads, which do DDP's all-reduce). The plan prices a replica's step as one alone, plus the
all-reduce measured by ``benchmarks/gloo_allreduce.py``: side by side against alone is what it
leaves out (the two processes share the caches and the memory bandwidth), DDP's process CPU
against side by side is DDP's own work (hooks, bucket copies, gloo), which the plan charges as
the all-reduce's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplace.cluster.local import free_port  # noqa: E402
from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

MODES = ("alone", "side by side", "DDP")
WARMUP = 3


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rank(rank: int, world: int, port: int, name: str, mode: str, steps: int,
          queue: mp.Queue) -> None:
    torch.set_num_threads(1)
    example = _example(name)
    built = example.build()
    model, inputs = built[0], built[1]
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {})
    batch = [*args, *kwargs.values()][0].shape[0]
    half = batch // 2

    def cut(value):  # this replica's half of every tensor with the batch's rows
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch:
            return value[rank * half:(rank + 1) * half].contiguous()
        return value

    args, kwargs = tuple(map(cut, args)), {k: cut(v) for k, v in kwargs.items()}
    targets = tuple(map(cut, example.example_targets))
    model.eval()  # as a training plan runs it (dropout off)

    def loss() -> torch.Tensor:
        return example.loss(step_model(*args, **kwargs), *targets)

    step_model = model
    if mode == "DDP":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        step_model = torch.nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    wall, thread, process = [], [], []
    for i in range(WARMUP + steps):
        w, t, p = time.perf_counter(), time.thread_time(), time.process_time()
        opt.zero_grad()
        loss().backward()
        opt.step()
        if i >= WARMUP:
            wall.append(time.perf_counter() - w)
            thread.append(time.thread_time() - t)
            process.append(time.process_time() - p)
    if mode == "DDP":
        del step_model
        dist.barrier()
        dist.destroy_process_group()
    queue.put({"wall": statistics.median(wall), "thread": statistics.median(thread),
               "process": statistics.median(process)})


def measure(name: str, mode: str, steps: int) -> dict[str, float]:
    """Rank 0's medians (seconds) of ``mode`` (one of ``MODES``)."""
    world = 1 if mode == "alone" else 2
    port = free_port()
    context = mp.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, world, port, name, mode, steps, queue))
             for r in range(world)]
    for r in ranks:
        r.start()
    results = [queue.get(timeout=600) for _ in ranks]
    for r in ranks:
        r.join()
    return {k: max(x[k] for x in results) for k in results[0]} | {
        "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=["lenet", "gpt2"])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--out", default=str(RESULTS / "replica-contention.md"))
    args = parser.parse_args(argv)
    lines = [
        "# Two data-parallel replicas on two cores: what one replica's step leaves out", "",
        f"{machine_line()}. Command: `python benchmarks/replica_contention.py --steps "
        f"{args.steps} --only {' '.join(args.only)}`. One replica's Adam step on half the "
        "batch, one intra-op thread a process; per step the median (the slower rank's) of the "
        "wall time, the thread's CPU time and the process's CPU time (gloo's threads "
        "included), in ms.", "",
        "| example | run | wall | thread CPU | process CPU | load average |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.only:
        for mode in MODES:
            r = measure(name, mode, args.steps)
            print(name, mode, {k: round(v * 1e3, 3) if k != "load" else v
                               for k, v in r.items()}, flush=True)
            lines.append(f"| {name} | {mode} | {r['wall'] * 1e3:.2f} | "
                         f"{r['thread'] * 1e3:.2f} | {r['process'] * 1e3:.2f} | "
                         f"{r['load']:.2f} |")
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
