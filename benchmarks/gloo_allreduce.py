"""The all-reduce two data-parallel replicas on this machine's CPU pay: gloo over 127.0.0.1.

    python benchmarks/gloo_allreduce.py    # prints the median all-reduce per size

Two processes (one intra-op thread each, as torchrun starts the replicas of a training plan)
all-reduce a float32 tensor of 1, 8 and 55 MB (55 MB: the example GPT-2's gradients) five
times after two warm-ups; rank 0 prints the median and the bandwidth the ring formula
(``cost_models.ring_allreduce_s``: ``2 (R-1)/R * bytes / bandwidth`` for R = 2) implies. The
plan prices the ring between two ``cpu-thread`` workers at their thread link instead (10 GB/s,
20 us), which is why it predicts data-parallel replicas on this CPU faster than they run
(``benchmarks/results/training-cpu.md``).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autoplace.cluster.local import free_port

SIZES_MB = (1, 8, 55)


def _rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for mb in SIZES_MB:
            tensor = torch.ones(mb * 2**20 // 4)
            times = []
            for i in range(7):
                dist.barrier()
                began = time.perf_counter()
                dist.all_reduce(tensor)
                if i >= 2:
                    times.append(time.perf_counter() - began)
            if rank == 0:
                median = statistics.median(times)
                print(f"{mb:3d} MB: {median * 1e3:7.2f} ms, "
                      f"{mb * 2**20 / median / 1e9:5.2f} GB/s by the ring formula", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> int:
    port = free_port()
    mp.spawn(_rank, args=(port,), nprocs=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
