"""Decode time per token on ``2xcpu-thread``: predicted by the plan against measured.

    PYTHONPATH=. python benchmarks/decode_fidelity.py  # benchmarks/results/decode-fidelity.md

The models of ``benchmarks/generation.py`` (batch 4, a 64-token prompt, 64 new tokens, float32)
planned with ``--generate 64`` over two ``cpu-thread`` workers that each hold 75% of the weights
and cache, so both hold part of the model; profiled now, with a fresh profile cache (a cached
op time may come from another hour of this shared machine). Then ``autoplace run OUT
--generate 64`` runs the emitted model ``RUNS`` times, one after another: each run's median
decode step against the plan's time per token. The emitted model's own check, made right after
the plan, is the first of the measured times. Each model is planned ``TRIALS`` times.

This machine's speed drifts: the same decode step of one model on one thread took 11 ms in one
half minute and 23 ms in the next, with nothing else running (in CPU time as in wall time), so
a plan profiled in one minute and run in the next is off by that much. So each trial also
times, in this process, the emitted decode step and the traced decode graph's whole pass on
one thread (what the profile scaled its op times to), in turns: the drift is the whole pass
now against the profile's, and the corrected ratio divides it out. The table keeps every run;
the summary gives the median ratios and how many were within 20% of the plan.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import autoplace  # noqa: E402
from autoplace.emit.generate import load_generator  # noqa: E402
from autoplace.profile import ProfileCache  # noqa: E402
from autoplace.trace.generate import (  # noqa: E402
    CachedLM,
    generation_inputs,
    layer_cache_bytes,
)
from benchmarks.common import (  # noqa: E402
    capped,
    cli_json,
    machine_line,
    weight_bytes,
    write_markdown,
)
from benchmarks.generation import BATCH, NEW, PROMPT, models  # noqa: E402

RUNS = 3
TRIALS = 3
TURNS = 10


def _whole_profiled_ms(notes: tuple[str, ...]) -> float:
    """The decode graph's whole pass as the profile timed it: its note is the last such."""
    said = [n for n in notes if "the whole forward pass took" in n][-1]
    return float(said.split("the whole forward pass took ")[1].split(" ms")[0])


def _in_turns(model: torch.nn.Module, prompt: torch.Tensor, out: Path) -> tuple[float, float]:
    """The emitted model's median decode step and the traced decode graph's whole pass on one
    thread, timed in turns (ms)."""
    prefill, decode = load_generator(out / "model")
    wrapper = CachedLM(model, batch=BATCH, max_len=PROMPT + NEW)
    first, step = generation_inputs(prompt)
    with torch.no_grad():
        graph = torch.export.export(wrapper, step).module()
        prefill(*first)
        wrapper(*first)
        before = torch.get_num_threads()
        emitted, whole = [], []
        for _ in range(TURNS):
            for i in range(8):
                began = time.perf_counter()
                decode(prompt[:, -1:], torch.tensor([PROMPT + i]))
                emitted.append(time.perf_counter() - began)
            torch.set_num_threads(1)
            for _ in range(8):
                began = time.perf_counter()
                graph(*step)
                whole.append(time.perf_counter() - began)
            torch.set_num_threads(before)
    return statistics.median(emitted) * 1e3, statistics.median(whole) * 1e3


def trial(name: str, model: torch.nn.Module, tmp: Path) -> tuple[str, list[float], float]:
    """One plan of ``model`` and its runs: the table's row, each run's ratio, and the ratio
    corrected for the drift."""
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT),
                           generator=torch.Generator().manual_seed(1))
    cache = sum(layer_cache_bytes(model, batch=BATCH, max_len=PROMPT + NEW).values())
    room = int(0.75 * (weight_bytes(model) + cache))
    planned = autoplace.plan(model, {"input_ids": prompt}, autoplace.Config(
        devices=capped("2xcpu-thread", room), generate=NEW, cost=autoplace.Cost(
            profile=True, cache=ProfileCache(None, torch_version=torch.__version__))))
    autoplace.save(planned, tmp / "out")
    gen = planned.plan.generation
    predicted = gen.step_s * 1e3
    measured = [gen.measured_step_s * 1e3] + [
        cli_json("run", str(tmp / "out"), "--generate", str(NEW))["ms_per_token"]
        for _ in range(RUNS)]
    ratios = [m / predicted for m in measured]
    step_ms, whole_ms = _in_turns(model, prompt, tmp / "out")
    profiled = _whole_profiled_ms(planned.plan.notes)
    drift = whole_ms / profiled
    corrected = step_ms / (predicted * drift)
    segments = len(planned.model.decode.segment_info)
    return (f"| {name} | {segments} | {predicted:.2f} | "
            f"{', '.join(f'{m:.2f}' for m in measured)} | "
            f"{', '.join(f'{r:.2f}' for r in ratios)} | {step_ms:.2f} | "
            f"{profiled:.3g} / {whole_ms:.2f} | {drift:.2f} | {corrected:.2f} |"), ratios, corrected


def main() -> int:
    lines = [
        "# Decode time per token on 2xcpu-thread: predicted against measured", "",
        f"`PYTHONPATH=. python benchmarks/decode_fidelity.py`; {machine_line()}; load average "
        f"{os.getloadavg()[0]:.1f} at the start.", "",
        f"Batch {BATCH}, a {PROMPT}-token prompt, {NEW} new tokens, float32, over two "
        "cpu-thread workers that each hold 75% of the weights and cache, profiled now with a "
        "fresh cache. Segments: the emitted decode pass's. Measured: the plan's own check, "
        f"then {RUNS} runs of `autoplace run OUT --generate {NEW}` (each the median decode "
        "step). In turns: the emitted decode step and the traced decode graph's whole pass on "
        "one thread, timed by turns in one process; drift: that whole pass now over the "
        "profile's; corrected ratio: the step in turns over the prediction times the drift.",
        "", "| model | segments | predicted ms/token | measured ms/token (check, runs) | "
        "measured/predicted | in turns: step ms | whole pass ms, profiled / now | drift | "
        "corrected ratio |", "|---|---:|---:|---|---|---:|---|---:|---:|"]
    summary = ["", "| model | runs | median measured/predicted | runs within 20% | "
               "corrected ratios | corrected within 20% |", "|---|---:|---:|---:|---|---:|"]
    for name, model in models().items():
        model.eval()
        ratios: list[float] = []
        corrected: list[float] = []
        for _ in range(TRIALS):
            with tempfile.TemporaryDirectory() as tmp:
                line, got, fixed = trial(name, model, Path(tmp))
            lines.append(line)
            ratios += got
            corrected.append(fixed)
            print(line, flush=True)
        within = sum(0.8 <= r <= 1.2 for r in ratios)
        summary.append(f"| {name} | {len(ratios)} | {statistics.median(ratios):.2f} | "
                       f"{within} of {len(ratios)} | "
                       f"{', '.join(f'{r:.2f}' for r in corrected)} | "
                       f"{sum(0.8 <= r <= 1.2 for r in corrected)} of {len(corrected)} |")
        print(summary[-1], flush=True)
    lines += summary
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f}."]
    write_markdown(ROOT / "benchmarks" / "results" / "decode-fidelity.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
