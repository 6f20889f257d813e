"""Emit: a generation plan's ranks generate (``launch.py --generate N``, ``emit.generate``).

Each rank holds its own segments of the prompt's pass and of the decode pass, tied so that its
layers' key-value cache is one tensor on its device (``load_decode``). ``generate_on_ranks``
runs the prompt's pass as ``ranks.run_pass`` runs any pass (values crossing ranks sent and
received, shaped as ``crossings`` says), rank 0 takes the greedy token from the logits it
gathers and broadcasts it, and every rank runs the decode pass on it, N - 1 times, with the
decode's own crossing shapes (``ranks.crossings_of``: ``launch.py``'s ``DECODE_CROSSINGS``).
Rank 0 keeps the tokens and times each step from its start to the next token on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autoplace.emit.files.saving import load_model
from autoplace.emit.generate import DECODE_DIR, greedy, tie
from autoplace.errors import EmitError

__all__ = ["generate_on_ranks", "load_decode", "run_generation"]


def load_decode(model_dir: Path, prefill: torch.nn.Module, *, device_map: Any
                ) -> torch.nn.Module:
    """The decode pass saved beside ``prefill`` (``model/decode``), its segments holding
    ``prefill``'s tensors (on meta where another rank's)."""
    decode = load_model(model_dir / DECODE_DIR, device_map=device_map, segments=())
    tie(prefill, decode)
    return decode


def generate_on_ranks(prefill: torch.nn.Module, decode: torch.nn.Module, prompt: torch.Tensor,
                      *, new_tokens: int, run: Callable[[torch.nn.Module, Any, int], Any],
                      rank: int, device: str) -> tuple[torch.Tensor | None, list[float]]:
    """``new_tokens`` generated greedily by the ranks after ``prompt`` (``emit.generate.greedy``
    over this rank's segments): on rank 0 the sequences and each decode step's seconds
    (elsewhere ``None`` and the same times, unread). ``run(model, (input_ids, positions), k)``:
    pass ``k`` (0 the prompt's, 1 a step) of this rank's segments (``ranks.run_pass`` with that
    pass's exchange); ``device``: where the token is broadcast (nccl's are CUDA tensors)."""
    steps: list[float] = []

    def pick(outputs: dict[str, Any]) -> torch.Tensor:
        """The next token of each sequence, the argmax of the last logits on rank 0 (where
        ``run_pass`` gathers the outputs by name), on every rank (broadcast from rank 0)."""
        token = torch.empty((prompt.shape[0], 1), dtype=torch.long, device=device)
        if rank == 0:
            logits = next(iter(outputs.values()))[0]  # the pass's first output, its logits
            token = logits[:, -1].argmax(-1, keepdim=True).to(device)
        dist.broadcast(token, src=0)
        return token

    sequences = greedy(lambda ids, positions: run(prefill, (ids, positions), 0),
                       lambda ids, positions: run(decode, (ids, positions), 1), prompt,
                       new_tokens=new_tokens, step_times=steps, pick=pick)
    return (sequences if rank == 0 else None), steps


def run_generation(model: torch.nn.Module, model_dir: Path, *, new_tokens: int,
                   run: Callable[[torch.nn.Module, Any, int], Any], rank: int, device: str,
                   device_map: Any) -> tuple[list[float], dict[str, list[torch.Tensor]]]:
    """``launch.py --generate N`` on one rank: the decode pass loaded and tied, the example
    inputs' prompt generated after (``run``, ``device``: ``generate_on_ranks``'); each
    step's seconds and, on rank 0, ``sequences``."""
    from autoplace.emit.files.saving import load_inputs

    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no saved prompt (inputs.safetensors): plan again")
    decode = load_decode(model_dir, model, device_map=device_map)
    sequences, steps = generate_on_ranks(model, decode, example[0][0], new_tokens=new_tokens,
                                         run=run, rank=rank, device=device)
    return steps, ({"sequences": [sequences]} if sequences is not None else {})
