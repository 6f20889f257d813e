"""``autoplace run OUT --generate N``: a generation plan's emitted model generates N tokens after
its saved prompt (``emit.generate.load_generator``, ``greedy``), timed: the prompt's pass and
each decode step, the median step against the plan's time per token
(``plan.json``'s ``generation.step_s``). With ``--nproc K`` the ranks generate
(``generate_ranks``: ``OUT/launch.py --generate``), checked against the one-process tokens.
``--save-outputs FILE`` writes the token ids as ``sequences``. N may not exceed the planned
new tokens: the cache is sized for them."""

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
                        "sequences); with --nproc K, as K ranks (OUT/launch.py --generate), "
                        "their tokens checked against the emitted model's")


@dataclass(frozen=True)
class GenerateResult:
    """One generation: ``sequences`` (prompt and new tokens), the prompt's pass and the
    median decode step measured and predicted (``None`` where planned devices ran elsewhere:
    ``remapped``)."""

    sequences: torch.Tensor
    prefill_s: float | None  # not timed on ranks
    step_s: float
    steps_s: tuple[float, ...]
    predicted_prefill_s: float | None
    predicted_step_s: float | None
    remapped: Mapping[str, str] = field(default_factory=dict)
    ranks: int = 1  # processes that generated (``--nproc``; their prompt's pass is not timed)

    def to_dict(self) -> dict[str, Any]:
        predicted = self.predicted_step_s
        return {"new_tokens": len(self.steps_s) + 1,
                "ms_per_token": self.step_s * 1e3,
                "predicted_ms_per_token": None if predicted is None else predicted * 1e3,
                "prefill_ms": None if self.prefill_s is None else self.prefill_s * 1e3,
                "predicted_prefill_ms": (None if self.predicted_prefill_s is None
                                         else self.predicted_prefill_s * 1e3),
                "steps_ms": [s * 1e3 for s in self.steps_s], "remapped": dict(self.remapped),
                "ranks": self.ranks}

    def lines(self) -> list[str]:
        batch = self.sequences.shape[0]
        said = [f"generated {len(self.steps_s) + 1} token(s) for {batch} prompt(s) of "
                f"{self.sequences.shape[1] - len(self.steps_s) - 1}"]
        if self.remapped:
            said.append("planned devices ran elsewhere here ("
                        + ", ".join(f"{k} on {v}" for k, v in self.remapped.items())
                        + "): the times stand alone")
        if self.ranks > 1:
            said.append(f"{self.ranks} ranks generated the emitted model's tokens")
        if self.prefill_s is not None:
            said.append(f"prompt's pass: {self.prefill_s * 1e3:.2f} ms" + _against(
                self.prefill_s, self.predicted_prefill_s))
        if not self.steps_s:
            return [*said, "one token: the prompt's pass made it, no decode step ran"]
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
    record = _checked(plan, directory, new_tokens)
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


def generate_ranks(directory: str, *, new_tokens: int, nproc: int,
                   device_map: str | None = None) -> GenerateResult:
    """Generate ``new_tokens`` with ``directory``'s plan as ``nproc`` ranks (``OUT/launch.py
    --generate``, ``emit.distributed.generate``), the tokens checked against the emitted model
    generating in this process."""
    import tempfile
    from pathlib import Path

    import safetensors.torch
    import torch

    from autoplace.cli.run import _remapped, plan_and_model
    from autoplace.cli.run_ranks import where_ranks_run
    from autoplace.emit.device_map import parse_device_map
    from autoplace.emit.distributed.replicas import launch_replicas
    from autoplace.emit.files.saving import load_inputs
    from autoplace.emit.generate import greedy, load_generator
    from autoplace.errors import VerificationError

    plan, model_dir = plan_and_model(directory)
    record = _checked(plan, directory, new_tokens)
    script = model_dir.parent / "launch.py"
    if not script.is_file() or len(plan.problem.cluster.devices) != nproc:
        raise AutoplaceError(f"--nproc {nproc}: {directory} has no launch.py for "
                             f"{nproc} ranks (one per planned device; the plan has "
                             f"{len(plan.problem.cluster.devices)})")
    here = where_ranks_run(sorted({d.torch_device for d in plan.problem.cluster.devices}),
                           parse_device_map(device_map) if device_map else None)
    with tempfile.TemporaryDirectory(prefix="autoplace-generate-") as tmp:
        tokens_file, report_file = Path(tmp) / "tokens.safetensors", Path(tmp) / "rank0.json"
        launch_replicas(script, replicas=nproc, what="rank", timeout_s=600.0, argv=[
            "--generate", str(new_tokens), "--device-map", json.dumps(here),
            "--outputs", str(tokens_file), "--json", str(report_file)])
        report = json.loads(report_file.read_text())
        got = safetensors.torch.load_file(str(tokens_file))["sequences.0"]
    prompt = load_inputs(model_dir)[0][0]
    expected = greedy(*load_generator(model_dir, device_map=here), prompt, new_tokens=new_tokens)
    if not torch.equal(got, expected):
        raise VerificationError(f"the {nproc} ranks generated other tokens than the emitted "
                                "model in one process")
    remapped = _remapped(here)
    steps = tuple(report["times_s"])
    return GenerateResult(
        sequences=got, prefill_s=None, step_s=statistics.median(steps) if steps else 0.0,
        steps_s=steps, predicted_prefill_s=None,
        predicted_step_s=None if remapped else record.step_s, remapped=remapped, ranks=nproc)


def _checked(plan: Any, directory: str, new_tokens: int) -> Any:
    """``plan``'s generation record, where it has one for ``new_tokens``."""
    record = plan.generation
    if record is None:
        raise AutoplaceError(f"{directory} holds a plan made without --generate: plan it with "
                             "--generate N to generate with it")
    if not 1 <= new_tokens <= record.new_tokens:
        raise AutoplaceError(f"--generate {new_tokens}: the plan's cache holds "
                             f"{record.new_tokens} new tokens after the prompt; generate 1 to "
                             f"{record.new_tokens}, or plan again with --generate {new_tokens}")
    return record


def command(args: argparse.Namespace) -> int:
    """``autoplace run OUT --generate N``, its flags checked."""
    from autoplace.cli.run import save_outputs

    refused = [flag for flag, given in (("--inputs", args.inputs), ("--train", args.train),
                                        ("--tensor-parallel", args.tensor_parallel),
                                        ("--microbatches", args.microbatches != 1)) if given]
    if refused:
        raise AutoplaceError(f"--generate generates after the saved prompt: it takes no "
                             f"{refused[0]}")
    if args.nproc is None and args.device_map is not None:
        raise AutoplaceError("--device-map goes with --nproc N (the ranks' devices)")
    result = (generate_plan(args.out, new_tokens=args.generate, warmup=args.warmup)
              if args.nproc is None else generate_ranks(
                  args.out, new_tokens=args.generate, nproc=args.nproc,
                  device_map=args.device_map))
    written = (save_outputs({"sequences": result.sequences}, args.save_outputs, root="")
               if args.save_outputs else [])
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print("\n".join(result.lines()))
    if written:
        print(f"wrote the token ids (sequences) to {args.save_outputs}")
    return 0
