"""Emit: a generation plan's model generates (``--generate N``, ``pipeline.generation``).

The emitted model (``OUT/model``) is the prompt's pass (prefill) of ``trace.generate.CachedLM``;
``emit_decode`` emits one token's pass of the same ops with the same placement and segments,
its weights and key-value cache the prefill's own tensors (``tie``), so each layer's cache lives
once, on that layer's device. ``greedy`` generates with the pair: the prompt at positions
``0..L-1``, then one token per step at the next position, each the argmax of the last logits.
``check_generation`` compares its tokens with the original's ``generate(do_sample=False)``, and
the cache each device holds with the plan's. ``save_decode`` writes the decode pass to
``OUT/model/decode`` without weights (they are the model's), ``load_generator`` reads both back.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import autoplace.emit as emit
from autoplace.emit.codegen.model import PartitionedModel
from autoplace.emit.device_map import local_device_map
from autoplace.emit.distributed.devices import emitted_devices
from autoplace.errors import EmitError, VerificationError
from autoplace.ir import Cluster, Problem, Schedule
from autoplace.trace.generate import CACHE_BUFFER_PREFIXES

__all__ = ["DECODE_DIR", "Generated", "check_generation", "emit_decode", "greedy",
           "load_generator", "save_decode", "tie"]

DECODE_DIR = "decode"  # beside the emitted model's files: OUT/model/decode


def emit_decode(prefill: PartitionedModel, module: torch.fx.GraphModule, *, problem: Problem,
                schedule: Schedule, device_of_op: Mapping[str, str]) -> PartitionedModel:
    """The decode pass ``module`` emitted as ``prefill`` was (the plan's ``device_of_op``, ops in
    the launch order of the prefill's ``problem`` and ``schedule``, so the same segments), on
    ``prefill``'s tensors."""
    torch_device = emitted_devices(problem.cluster.devices)
    device_of = {op: torch_device[dev] for op, dev in device_of_op.items()}
    order = emit.op_order(module, problem, schedule)
    decode = emit.emit_model(module, device_of, order=order,
                             device_map=local_device_map(sorted(set(device_of.values()))))
    tie(prefill, decode)
    return decode


def tie(prefill: torch.nn.Module, decode: torch.nn.Module) -> None:
    """Make ``decode``'s segments hold ``prefill``'s very tensors (weights and cache): the
    cache the prompt's pass writes is the one each step reads and extends."""
    prefill_segments = [s.nodes for s in prefill.segment_info]
    if prefill_segments != [s.nodes for s in decode.segment_info]:
        raise EmitError("the decode pass was cut into other segments than the prompt's, so "
                        "they cannot share weights: plan it without --generate")
    for seg in prefill.segment_info:
        state = getattr(prefill, f"seg{seg.index}").state_dict(keep_vars=True)
        getattr(decode, f"seg{seg.index}").load_state_dict(state, strict=True, assign=True)


def greedy(prefill: Callable[..., Any], decode: Callable[..., Any], prompt: torch.Tensor, *,
           new_tokens: int, step_times: list[float] | None = None,
           pick: Callable[[Any], torch.Tensor] | None = None) -> torch.Tensor:
    """The prompt and ``new_tokens`` tokens generated greedily after it (batch x (L + N)); each
    decode step's seconds appended to ``step_times``. ``prefill`` and ``decode`` are called
    with the tokens and their positions; ``pick`` takes what they return to the next token of
    each sequence (default: the argmax of the last logits; ranks broadcast rank 0's,
    ``distributed.generate``)."""
    pick = pick or (lambda logits: logits[:, -1].argmax(-1, keepdim=True))
    length = prompt.shape[1]
    with torch.no_grad():
        tokens = [prompt, pick(prefill(prompt, torch.arange(length, device=prompt.device)))
                  .to(prompt.device)]
        for i in range(new_tokens - 1):
            start = time.perf_counter()
            position = torch.tensor([length + i], device=prompt.device)
            tokens.append(pick(decode(tokens[-1], position)).to(prompt.device))
            if step_times is not None:
                step_times.append(time.perf_counter() - start)
    return torch.cat(tokens, dim=1)


def reference(model: torch.nn.Module, prompt: torch.Tensor, *, new_tokens: int) -> torch.Tensor:
    """The original's greedy generation: ``generate(do_sample=False)`` with its cache on, for
    exactly ``new_tokens`` tokens (no end-of-sequence stop)."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.pad_token_id = 0 if config.pad_token_id is None else config.pad_token_id
    config.max_new_tokens, config.min_new_tokens = new_tokens, None
    config.max_length, config.do_sample, config.use_cache = None, False, True
    with torch.no_grad():
        return model.generate(prompt, generation_config=config,
                              attention_mask=torch.ones_like(prompt))


@dataclass(frozen=True)
class Generated:
    """A checked generation: the tokens, the cache bytes each planned device held and the
    median decode step."""

    sequences: torch.Tensor
    cache_bytes: dict[str, int]
    step_s: float


def held_cache(model: PartitionedModel, cluster: Cluster) -> dict[str, int]:
    """The key-value cache bytes each of ``cluster``'s devices holds in ``model``."""
    name_of = {torch_device: name for name, torch_device in
               emitted_devices(cluster.devices).items()}
    held = dict.fromkeys(cluster.names, 0)
    for seg in model.segment_info:
        for name, buffer in getattr(model, f"seg{seg.index}").named_buffers():
            if any(prefix in name for prefix in CACHE_BUFFER_PREFIXES):
                held[name_of.get(seg.planned_device, seg.planned_device)] += (
                    buffer.numel() * buffer.element_size())
    return held


def check_generation(original: torch.nn.Module, prefill: PartitionedModel,
                     decode: PartitionedModel, prompt: torch.Tensor, *, new_tokens: int,
                     planned: Mapping[str, int], cluster: Cluster) -> Generated:
    """Generate ``new_tokens`` with the emitted pair and with ``original``; a
    ``VerificationError`` where a token differs or a device holds more cache than
    ``planned``."""
    expected = reference(original, prompt, new_tokens=new_tokens)
    steps: list[float] = []
    got = greedy(prefill, decode, prompt, new_tokens=new_tokens, step_times=steps)
    if got.shape != expected.shape or not torch.equal(got, expected):
        differ = (got[:, :expected.shape[1]] != expected).nonzero() if (
            got.shape == expected.shape) else None
        where = (f"first at sequence {int(differ[0, 0])}, position {int(differ[0, 1])}"
                 if differ is not None and len(differ) else f"shapes {tuple(got.shape)} "
                 f"against {tuple(expected.shape)}")
        raise VerificationError(f"the emitted model generated other tokens than the "
                                f"original's generate(do_sample=False) ({where})")
    held = held_cache(prefill, cluster)
    over = {d: b for d, b in held.items() if b > planned.get(d, 0)}
    if over:
        device, size = next(iter(over.items()))
        raise VerificationError(f"the emitted model holds {size} bytes of key-value cache on "
                                f"{device}, above the plan's {planned.get(device, 0)}")
    return Generated(sequences=got, cache_bytes=held,
                     step_s=statistics.median(steps) if steps else 0.0)


def save_decode(decode: PartitionedModel, directory: str | Path) -> None:
    """The decode pass's program in ``directory`` (``OUT/model/decode``), its tensors left to
    the model one directory up (``load_generator`` ties them)."""
    emit.save_model(decode, directory, weights=False)


def load_generator(directory: str | Path, *, device_map: Mapping[str, str] | None = None
                   ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The emitted model in ``directory`` and its decode pass (``directory/decode``), tied."""
    path = Path(directory)
    if not (path / DECODE_DIR / "meta.json").is_file():
        raise EmitError(f"{path} holds no decode pass ({DECODE_DIR}/): it was not planned "
                        "with --generate; plan it with --generate N")
    prefill = emit.load_model(path, device_map=device_map)
    decode = emit.load_model(path / DECODE_DIR, device_map=device_map, segments=())
    tie(prefill, decode)
    return prefill, decode
