"""Module-granularity plans (Hugging Face device_maps) against accelerate's own maps.

For GPT-2, a Llama-style model and T5 as examples/gpt2.py, llama.py and t5.py build them, and a
BERT and a Mixtral (small transformers configs built here; random weights, nothing downloaded),
on 2xA100-40GB with each device capped at a share of the model's weights, this plans the model
with ``--granularity module`` (``Config(granularity="module")``, analytic costs) and reads, from
the same plan, accelerate's ``infer_auto_device_map`` maps (sequential and balanced, with the same
no-split classes), all scored by the one simulator with activations counted: makespan, peak
memory per device, and whether and where a map overflows. It times planning on the
capped devices (tracing included, imports not: those are timed once, in a fresh interpreter)
and checks a plan's map that uses both GPUs the way a user would load it: the model saved with
``save_pretrained``, loaded with ``from_pretrained(..., device_map=...)`` with every device
remapped to the CPU, and its outputs compared with the original's (``torch.testing.assert_close``).

    PYTHONPATH=. python benchmarks/device_map.py
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import transformers
from common import RESULTS, ROOT, capped, machine_line, mb, peaks, weight_bytes, write_markdown

from autoplace.config import Config, Solve  # noqa: E402
from autoplace.config.defaults import MODULE_TIME_LIMIT_S
from autoplace.emit.files.hf_device_map import remapped
from autoplace.errors import InfeasibleError
from autoplace.ir import Problem
from autoplace.pipeline import plan  # noqa: E402
from autoplace.profile.cost import costs
from autoplace.simulate import simulate
from autoplace.solve.baselines.accelerate import ACCELERATE_STRATEGIES, accelerate_maps, on_graph
from autoplace.trace.modules import trace_modules

SPEC = "2xA100-40GB"
SHARES = (0.6, 0.65, 0.7, 0.8, 0.9)


def _example(path: str):  # noqa: ANN202 - a torch module and its inputs
    return runpy.run_path(str(ROOT / "examples" / path))["build"]()


def _bert():  # noqa: ANN202
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, intermediate_size=1024)
    return (transformers.BertForMaskedLM(config),
            {"input_ids": torch.randint(0, 8000, (2, 128))})


def _mixtral():  # noqa: ANN202
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=256, intermediate_size=512,
                                        num_hidden_layers=4, num_attention_heads=8,
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=8000, use_cache=False)
    return (transformers.MixtralForCausalLM(config),
            {"input_ids": torch.randint(0, 8000, (1, 64))})


MODELS = {
    "gpt2": lambda: _example("gpt2.py"),
    "llama": lambda: _example("llama.py"),
    "t5": lambda: _example("t5.py"),
    "bert": _bert,
    "mixtral": _mixtral,
}
WHERE = {"gpt2": "examples/gpt2.py", "llama": "examples/llama.py", "t5": "examples/t5.py",
         "bert": "BertForMaskedLM, 4 layers, width 256, vocabulary 8,000, 2 x 128 tokens",
         "mixtral": "MixtralForCausalLM, 4 layers, width 256, 4 experts (2 per token) of 512, "
                    "vocabulary 8,000, 1 x 64 tokens"}


def _overflow(peaks: dict[str, int], cap: int) -> str:
    over = [f"{d} by {mb(b - cap)} MB" for d, b in peaks.items() if b > cap]
    return "fits" if not over else "**overflows** " + ", ".join(over)


def _offloads(device_map: dict[str, Any], otherwise: str) -> str:
    """Where an accelerate map puts modules off the two GPUs, or ``otherwise``."""
    places = sorted({str(v) for v in device_map.values()} - {"0", "1"})
    return f"offloads to {', '.join(places)}" if places else otherwise


def _accelerate_cell(planned, strategy: str, cap: int) -> str:  # noqa: ANN001 - a Plan
    found = planned.device_map.accelerate.get(strategy)
    baseline = planned.baselines.get(strategy)
    if baseline is None or baseline.makespan_s is None:
        note = (found.note if found is not None else None) or "absent"
        return _offloads(found.map if found is not None else {}, note)
    ratio = baseline.makespan_s / planned.makespan_s
    return (f"{baseline.makespan_s * 1e3:.3f} ms ({ratio:.2f}x), "
            f"{peaks(dict(baseline.peak_bytes))}, {_overflow(dict(baseline.peak_bytes), cap)}")


def _row(name: str, share: float) -> tuple[str, Any]:
    """The table row of ``name`` at ``share``, and the plan (``None`` where none fits)."""
    model, inputs = MODELS[name]()
    cap = int(share * weight_bytes(model))
    cluster = capped(SPEC, cap)
    head = f"| {name} | {share:.0%} ({mb(cap)}) |"
    began = time.perf_counter()
    try:
        planned = plan(model, inputs, Config(devices=cluster, granularity="module",
                                              solve=Solve(deterministic=True))).plan
    except InfeasibleError:
        return head + f" no plan fits | | {time.perf_counter() - began:.2f} s | " + " | ".join(
            _accelerate_alone(model, inputs, cluster, cap)) + " |", None
    wall_s = time.perf_counter() - began
    cells = [f"{planned.makespan_s * 1e3:.3f} ms", peaks(dict(planned.schedule.peak_bytes)),
             f"{wall_s:.2f} s",
             *(_accelerate_cell(planned, s, cap) for s in ACCELERATE_STRATEGIES)]
    return head + " " + " | ".join(cells) + " |", planned


def _accelerate_alone(model, inputs, cluster, cap: int) -> list[str]:  # noqa: ANN001
    """accelerate's maps scored on the module graph, for a row where no plan fits."""
    traced = trace_modules(model, (), inputs)
    problem = Problem(graph=traced.graph, cluster=cluster, costs=costs(traced.graph, cluster))
    cells = []
    for found in accelerate_maps(model, traced.graph, cluster, no_split=traced.no_split):
        if found.device_of_op is None:
            cells.append(_offloads(found.device_map, "absent"))
            continue
        placement, _ = on_graph(problem, found.device_of_op)
        sim = simulate(problem, placement)
        cells.append(f"{sim.makespan_s * 1e3:.3f} ms, {peaks(dict(sim.peak_bytes))}, "
                     f"{_overflow(dict(sim.peak_bytes), cap)}")
    return cells


def _check(name: str, planned: Any) -> str:
    """The plan's map loaded as a user would: ``from_pretrained`` with every device remapped
    to the CPU, its logits against the original's."""
    model, inputs = MODELS[name]()
    mapping = planned.device_map.map
    with torch.no_grad():
        expected = model.eval()(**inputs).logits
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        loaded = type(model).from_pretrained(tmp, device_map=remapped(mapping)).eval()
        with torch.no_grad():
            got = loaded(**inputs).logits
    torch.testing.assert_close(got, expected)
    diff = (got - expected).abs().max().item()
    per_device = {d: sum(v == d for v in mapping.values()) for d in sorted(
        set(mapping.values()), key=str)}
    return (f"| {name} | {len(planned.problem.graph.nodes) - 1} | "
            + ", ".join(f"{n} on {d}" for d, n in per_device.items())
            + f" | equal (max abs diff {diff:.1e}) |")


def _import_s() -> float:
    """Seconds a fresh interpreter takes to import what planning needs (torch, transformers,
    autoplace's pipeline)."""
    code = ("import time; t = time.perf_counter(); import transformers, "
            "autoplace.pipeline.modules; print(time.perf_counter() - t)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "device-map.md"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rows, checks = [], []
    load_before = os.getloadavg()
    for name in MODELS:
        split = None
        for share in SHARES:
            row, planned = _row(name, share)
            rows.append(row)
            print(row, file=sys.stderr)
            if planned is not None and len(set(planned.device_map.map.values())) > 1:
                split = split or planned
        checks.append(_check(name, split) if split is not None
                      else f"| {name} | | no plan splits the model | |")
    load_after = os.getloadavg()
    import_s = _import_s()
    lines = [
        "# Module-granularity device_maps against accelerate's", "",
        machine_line() + f"; torch {torch.__version__}, transformers {transformers.__version__}"
        "; analytic costs, deterministic CP-SAT, the module default --time-limit.", "",
        "The models (random weights):", "",
        *(f"- {name}: {WHERE[name]}; {mb(weight_bytes(MODELS[name]()[0]))} MB of weights."
          for name in MODELS), "",
        f"## Makespan and peak memory on {SPEC}, each device capped", "",
        "Each device capped at the share of the model's weights shown (MB), no runtime "
        "reserve. Makespan and peak memory per device (MB, cuda:0 / cuda:1) as the one "
        "simulator scores them, activations (logits included) counted; the accelerate "
        "columns give the map's makespan (its ratio to the plan's), its peaks, and whether it "
        "fits or which device it overflows by how much. accelerate sizes its maps by weights "
        "alone (and keeps its largest layer's size free on GPU 0 for offloading), so its map "
        "can fit its own accounting and still overflow here; \"offloads to cpu/disk\": its "
        "map is not a placement on these two GPUs.", "",
        "| model | cap | plan makespan | plan peak MB | plan wall time | "
        + " | ".join(ACCELERATE_STRATEGIES) + " |", "|---|---|---:|---|---:|---|---|", *rows,
        "", "\"plan wall time\": `autoplace.plan` at module granularity after the model is "
        "built: the module trace "
        "(one forward pass with hooks), costs, accelerate's maps, the solve (CP-SAT's time limit "
        f"{MODULE_TIME_LIMIT_S:g} s) and the map; imports not included: importing torch, "
        f"transformers and autoplace's pipeline in a fresh interpreter took {import_s:.1f} s. "
        f"Load average (1 min) {load_before[0]:.1f} before and {load_after[0]:.1f} after "
        f"these runs on {os.cpu_count()} cores shared with other work: times are noisy.", "",
        "## The map loaded with from_pretrained", "",
        "The first plan of each model above that uses both GPUs: the model saved with "
        "`save_pretrained`, loaded with `from_pretrained(saved, device_map=map with every "
        "device remapped to \"cpu\")`; \"equal\": its logits equal the original's under "
        "`torch.testing.assert_close`.", "",
        "| model | modules placed | device_map keys per device | from_pretrained |",
        "|---|---:|---|---|", *checks, "",
        f"Reproduce: `PYTHONPATH=. python benchmarks/device_map.py` "
        f"({time.perf_counter() - began:.0f} s here)."]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
