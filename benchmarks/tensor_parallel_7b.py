"""Tensor parallelism for a Llama-2-7B shape on A100s (issue 28's inference target): the plan's
predicted speed-up over one GPU, and whether tensor parallelism would be faster.

    PYTHONPATH=. python benchmarks/tensor_parallel_7b.py   # -> results/tensor-parallel-7b.md

A Llama-2-7B shape (32 layers, width 4096, 32 heads, an 11,008-wide MLP, a 32,000-token
vocabulary) on the meta device in float16, planned for inference with ``autoplace.plan`` on
2, 4 and 8 x A100-80GB with ``Parallel(tp=N)`` over all N: the placement solved as usual, and
beside it the tensor-parallel candidate, observed under DTensor on N fake ranks on fake tensors
and simulated (analytic costs; DTensor's dispatch per op measured on this CPU). Batch 1 with
512 tokens is the issue's row; batch 8 with 2,048 tokens shows where the GPU work per op
outgrows the host's. No GPU here: everything is predicted. Planning seconds are wall time on a
shared 2-core machine (the load average is recorded).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine_line, write_markdown  # noqa: E402

SHAPES = ((1, 512), (8, 2048))
GPUS = (2, 4, 8)


def _model():  # noqa: ANN202 - transformers is imported here
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                         max_position_embeddings=4096, use_cache=False)
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.float16).eval()


def _row(batch: int, tokens: int, gpus: int, time_limit_s: float) -> str:
    import torch

    import autoplace
    from autoplace.config import Config, Parallel, Solve

    ids = torch.zeros((batch, tokens), dtype=torch.long, device="meta")
    load = os.getloadavg()[0]
    began = time.perf_counter()
    planned = autoplace.plan(_model(), {"input_ids": ids}, Config(
        devices=f"{gpus}xA100-80GB", dtype="float16", parallel=Parallel(tp=gpus),
        solve=Solve(time_limit_s=time_limit_s)))
    took = time.perf_counter() - began
    plan, tp = planned.plan, planned.plan.tensor_parallel
    single = plan.best_single_makespan_s
    chosen = "tp" if tp.makespan_s < plan.makespan_s else "placement"
    return (f"| {batch} x {tokens} | {gpus} | {single * 1e3:.2f} | {plan.makespan_s * 1e3:.2f} | "
            f"{single / plan.makespan_s:.2f}x | {tp.makespan_s * 1e3:.2f} | "
            f"{single / tp.makespan_s:.2f}x | {tp.columns} / {tp.rows} | {tp.collectives} "
            f"({tp.collective_bytes / 2**20:.0f} MiB) | {tp.peak_bytes / 2**30:.2f} | {chosen} | "
            f"{took:.0f} | {load:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--out", default=str(RESULTS / "tensor-parallel-7b.md"))
    args = parser.parse_args(argv)
    from autoplace.solve.tensor import dispatch_s

    rows = [_row(b, t, g, args.time_limit) for b, t in SHAPES for g in GPUS]
    lines = [
        "# Tensor parallelism for a Llama-2-7B shape on A100-80GB (predicted)", "",
        f"{machine_line()}. Command: `PYTHONPATH=. python benchmarks/tensor_parallel_7b.py`. "
        "No GPU here: every figure is the simulator's, analytic costs for the A100s. "
        "*one GPU*: the best single device's makespan; *plan*: the placement's (one device per "
        "op, solved with a time limit of "
        f"{args.time_limit:.0f} s); *tp N*: the tensor-parallel candidate over all N GPUs, "
        "rank 0 simulated with the collectives DTensor inserts (observed on N fake ranks, on "
        "fake tensors) and each op's host dispatch grown by DTensor's, measured on this CPU "
        f"({dispatch_s() * 1e6:.0f} us an op at the end of the run); *faster*: which the plan "
        "predicts faster; *planning*: wall seconds of `autoplace.plan` (trace, cost, solve, "
        "the candidate); load: the 1-minute load average before it.", "",
        "| batch x tokens | GPUs | one GPU (ms) | plan (ms) | plan speed-up | tp N (ms) | "
        "tp speed-up | split (columns / rows) | collectives a pass | tp peak a GPU (GiB) | "
        "faster | planning (s) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---:|---:|",
        *rows,
    ]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    raise SystemExit(main())
