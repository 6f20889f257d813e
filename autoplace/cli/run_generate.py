"""``autoplace run OUT --generate N``: a generation plan's emitted model generates N tokens after
its saved prompt (``emit.generate.load_generator``, ``greedy``), timed: the prompt's pass and
each decode step, the median step against the plan's time per token
(``plan.json``'s ``generation.step_s``). ``--save-outputs FILE`` writes the token ids as
``sequences``. N may not exceed the planned new tokens: the cache is sized for them."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoplace.errors import AutoplaceError, EmitError

if TYPE_CHECKING:  # torch and the emitter load when a generation runs, not with the parser
    import torch

__all__ = ["GenerateResult", "add_arguments", "command", "generate_plan"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generate", type=int, metavar="N",
                        help="for a plan made with --generate: generate N tokens (at most the "
                        "planned number) greedily after the saved prompt and print the time "
                        "per token against the plan's (--json: ms_per_token, "
                        "predicted_ms_per_token; --save-outputs writes the token ids as "
                        "sequences)")


@dataclass(frozen=True)
class GenerateResult:
    """One generation: ``sequences`` (prompt and new tokens), the prompt's pass and the
    median decode step measured and predicted (``None`` where planned devices ran elsewhere:
    ``remapped``)."""

    sequences: torch.Tensor
    prefill_s: float
    step_s: float
    steps_s: tuple[float, ...]
    predicted_prefill_s: float | None
    predicted_step_s: float | None
    remapped: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        predicted = self.predicted_step_s
        return {"new_tokens": len(self.steps_s) + 1,
                "ms_per_token": self.step_s * 1e3,
                "predicted_ms_per_token": None if predicted is None else predicted * 1e3,
                "prefill_ms": self.prefill_s * 1e3,
                "predicted_prefill_ms": (None if self.predicted_prefill_s is None
                                         else self.predicted_prefill_s * 1e3),
                "steps_ms": [s * 1e3 for s in self.steps_s], "remapped": dict(self.remapped)}

    def lines(self) -> list[str]:
        batch = self.sequences.shape[0]
        said = [f"generated {len(self.steps_s) + 1} token(s) for {batch} prompt(s) of "
                f"{self.sequences.shape[1] - len(self.steps_s) - 1}"]
        if self.remapped:
            said.append("planned devices ran elsewhere here ("
                        + ", ".join(f"{k} on {v}" for k, v in self.remapped.items())
                        + "): the times stand alone")
        said.append(f"prompt's pass: {self.prefill_s * 1e3:.2f} ms" + _against(
            self.prefill_s, self.predicted_prefill_s))
        said.append(f"time per token: {self.step_s * 1e3:.2f} ms (median of "
                    f"{len(self.steps_s)} decode steps)" + _against(self.step_s,
                                                                   self.predicted_step_s)
                    + f"; {batch / self.step_s:.1f} tokens/s over the batch")
        return said


def _against(measured: float, predicted: float | None) -> str:
    if predicted is None or predicted <= 0:
        return ""
    return (f", predicted {predicted * 1e3:.2f} ms (measured/predicted "
            f"{measured / predicted:.2f})")


def generate_plan(directory: str, *, new_tokens: int, warmup: int = 1) -> GenerateResult:
    """Generate ``new_tokens`` with ``directory``'s emitted model, after ``warmup`` untimed
    generations."""
    import torch

    from autoplace.cli.run import _remapped, plan_and_model
    from autoplace.emit import local_device_map
    from autoplace.emit.files.saving import load_inputs
    from autoplace.emit.generate import greedy, load_generator

    plan, model_dir = plan_and_model(directory)
    record = plan.generation
    if record is None:
        raise AutoplaceError(f"{directory} holds a plan made without --generate: plan it with "
                             "--generate N to generate with it")
    if not 1 <= new_tokens <= record.new_tokens:
        raise AutoplaceError(f"--generate {new_tokens}: the plan's cache holds "
                             f"{record.new_tokens} new tokens after the prompt; generate 1 to "
                             f"{record.new_tokens}, or plan again with --generate {new_tokens}")
    if warmup < 0:
        raise AutoplaceError(f"--warmup must be 0 or more, got {warmup}")
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no saved prompt (inputs.safetensors): plan again")
    prompt = example[0][0]
    here = local_device_map(sorted(d.torch_device for d in plan.problem.cluster.devices))
    remapped = _remapped(here)
    prefill, decode = load_generator(model_dir, device_map=here)
    for _ in range(warmup):
        greedy(prefill, decode, prompt, new_tokens=new_tokens)
    steps: list[float] = []
    start = time.perf_counter()
    with torch.no_grad():
        prefill(prompt, torch.arange(prompt.shape[1]))
    first = time.perf_counter() - start
    sequences = greedy(prefill, decode, prompt, new_tokens=new_tokens, step_times=steps)
    return GenerateResult(
        sequences=sequences, prefill_s=first,
        step_s=statistics.median(steps) if steps else 0.0, steps_s=tuple(steps),
        predicted_prefill_s=None if remapped else record.prefill_s,
        predicted_step_s=None if remapped else record.step_s, remapped=remapped)


def command(args: argparse.Namespace) -> int:
    """``autoplace run OUT --generate N``, its flags checked."""
    from autoplace.cli.run import save_outputs

    refused = [flag for flag, given in (("--inputs", args.inputs), ("--train", args.train),
                                        ("--nproc", args.nproc),
                                        ("--tensor-parallel", args.tensor_parallel)) if given]
    if refused:
        raise AutoplaceError(f"--generate generates after the saved prompt in one process: "
                             f"it takes no {refused[0]}")
    result = generate_plan(args.out, new_tokens=args.generate, warmup=args.warmup)
    written = (save_outputs({"sequences": result.sequences}, args.save_outputs, root="")
               if args.save_outputs else [])
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print("\n".join(result.lines()))
    if written:
        print(f"wrote the token ids (sequences) to {args.save_outputs}")
    return 0
