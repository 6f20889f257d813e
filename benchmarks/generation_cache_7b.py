"""The key-value cache in a plan: a Llama-2-7B shape on 2 x A100-40GB (sizes, predicted).

    PYTHONPATH=. python benchmarks/generation_cache_7b.py
    # writes benchmarks/results/generation-cache-7b.md

The model is built on the meta device in float16 (nothing allocated). For each batch and total
length (a 128-token prompt, the rest generated), ``autoplace.plan(..., generate=N)`` places the
ops with each layer's static cache (2 x 32 layers x batch x length x 4096 x 2 bytes) counted
on its device, or says by how much the model does not fit. Beside it, accelerate's own maps,
made as ``device_map="sequential"`` and ``"auto"`` (balanced) make them, from the weights
alone (``infer_auto_device_map``, ``get_balanced_memory``), with the cache of each layer added
on the GPU the map gives it: by how much a GPU overflows before any activation. At module
granularity the cache is counted the same way, but transformers' masks read a value
(``.item()``) and a model on the meta device cannot be traced module by module, so this table
uses op granularity. No GPU is used: these are sizes, not measurements.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import autoplace  # noqa: E402
from autoplace.cluster import resolve_cluster  # noqa: E402
from autoplace.errors import InfeasibleError  # noqa: E402
from autoplace.trace.generate import layer_cache_bytes  # noqa: E402
from benchmarks.common import machine_line, write_markdown  # noqa: E402
from cost_models.units import format_bytes  # noqa: E402

PROMPT = 128


def model() -> torch.nn.Module:
    config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                         max_position_embeddings=4096, torch_dtype=torch.float16)
    with torch.device("meta"):
        built = LlamaForCausalLM(config).to(torch.float16)
    return built


def accelerate_overflow(llama: torch.nn.Module, cache: dict[str, int], *, balanced: bool,
                        room: int) -> str:
    """accelerate's map of ``llama`` over two GPUs of ``room`` bytes, and by how much each GPU
    overflows with each layer's ``cache`` added where the map puts that layer."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    from autoplace.solve.baselines.accelerate import covering_key

    limits = {0: room, 1: room}
    no_split = llama._no_split_modules
    if balanced:
        limits = get_balanced_memory(llama, max_memory=limits, no_split_module_classes=no_split,
                                     dtype=torch.float16)
    mapping = infer_auto_device_map(llama, max_memory=limits, no_split_module_classes=no_split,
                                    dtype=torch.float16)
    held: dict[object, int] = {}
    for name, tensor in [*llama.named_parameters(), *llama.named_buffers()]:
        device = mapping[covering_key(name, mapping)]
        held[device] = held.get(device, 0) + tensor.numel() * tensor.element_size()
    for path, size in cache.items():
        device = mapping[covering_key(path, mapping)]
        held[device] = held.get(device, 0) + size
    over = {d: b - room for d, b in held.items() if isinstance(d, int) and b > room}
    elsewhere = sorted({str(d) for d in held if not isinstance(d, int)})
    return (", ".join(f"GPU {d} over by {format_bytes(b)}" for d, b in over.items())
            or "fits") + (f" (offloads to {', '.join(elsewhere)})" if elsewhere else "")


def row(batch: int, length: int, room: int) -> str:
    llama = model()
    prompt = torch.zeros((batch, PROMPT), dtype=torch.long, device="meta")
    cache = layer_cache_bytes(llama, batch=batch, max_len=length)
    start = time.perf_counter()
    try:
        planned = autoplace.plan(llama, {"input_ids": prompt}, autoplace.Config(
            devices="2xA100-40GB", generate=length - PROMPT,
            emit=autoplace.Emit(model=False)))
        plan = planned.plan
        resident: dict[str, int] = {}
        for node in plan.problem.graph.nodes:
            device = plan.schedule.placement.device_of[node.name]
            resident[device] = resident.get(device, 0) + node.param_bytes
        ours = ", ".join(f"{d} {format_bytes(b)}" for d, b in resident.items() if b)
    except InfeasibleError as error:
        ours = "does not fit: " + str(error).split(":")[0][:140]
    took = time.perf_counter() - start
    return (f"| {batch} | {length} | {format_bytes(sum(cache.values()))} | {ours} | "
            f"{accelerate_overflow(llama, cache, balanced=False, room=room)} | "
            f"{accelerate_overflow(llama, cache, balanced=True, room=room)} | {took:.0f} |")


def main() -> int:
    lines = ["# The key-value cache in a plan: Llama-2-7B shape, 2 x A100-40GB", "",
             "`PYTHONPATH=. python benchmarks/generation_cache_7b.py`; " + machine_line(), "",
             f"float16, a {PROMPT}-token prompt, the rest of the length generated. Sizes from "
             "the plan, not measurements (no GPU here).", "",
             "Each GPU holds 40 GiB (the catalog's A100-40GB) less the runtime reserve "
             "autoplace's catalog gives it; accelerate's maps are given the same room. "
             "autoplace counts the prompt's pass's activations too; accelerate's columns count "
             "weights and cache only, before any activation. autoplace's prompt pass "
             "attends over every position of the static cache (the emitted program's), whose "
             "scores are large at batch 32 and 4,096 positions.", "",
             "| batch | tokens | cache | autoplace: weights + cache per GPU | accelerate "
             "sequential, cache counted | accelerate auto (balanced), cache counted | "
             "planning s |", "|---:|---:|---:|---|---|---|---:|"]
    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    room = cluster.devices[0].memory_bytes - cluster.devices[0].reserved_bytes
    for batch in (1, 8, 32):
        for length in (2048, 4096):
            lines.append(row(batch, length, room))
            print(lines[-1], flush=True)
    write_markdown(ROOT / "benchmarks" / "results" / "generation-cache-7b.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
