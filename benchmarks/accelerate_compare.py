"""autoplace against accelerate's own device maps, on the same simulator.

For GPT-2, a Llama-style model and T5 (examples/gpt2.py, llama.py, t5.py: small transformers
configs, random weights, nothing downloaded; GPT-2 twice, as the example builds it and at GPT-2
small's depth and width, see MODELS), on 2xA100-40GB and A100-40GB + T4-16GB with every device
capped at 60% and 70% of the model's weights, this plans the model (analytic costs, a short
time limit) and reads, from the same plan, accelerate's
``infer_auto_device_map`` maps (sequential and balanced, ``solve/accelerate.py``) as the
simulator scored them: makespan and per-device peak memory, activations included. A map that
overflows a device once activations count is named as such; one that offloads to disk is not a
placement on these devices at all.

    PYTHONPATH=. python benchmarks/accelerate_compare.py [--time-limit 3]
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time

from common import RESULTS, ROOT, capped, machine_line, mb, peaks, weight_bytes, write_markdown

from autoplace.config import Config, Emit, Solve
from autoplace.errors import InfeasibleError
from autoplace.ir import Placement, Problem
from autoplace.pipeline import plan
from autoplace.profile.cost import costs
from autoplace.simulate import simulate
from autoplace.solve.baselines.accelerate import ACCELERATE_STRATEGIES, accelerate_maps
from autoplace.trace import trace_model

# name -> (example file, keyword arguments to its build()). examples/gpt2.py as it stands is
# activation-bound (4 x 128 tokens of 8,000-way logits against 55 MB of weights), so at 60-70%
# caps no placement fits: its rows show accelerate's maps overflowing. gpt2-12x768 is the same
# model at GPT-2 small's depth and width with one 64-token sequence, the weight-bound way GPT-2 is
# split for memory, where both tools place it.
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "gpt2": ("gpt2.py", {}),
    "gpt2-12x768": ("gpt2.py", {"n_layer": 12, "n_embd": 768, "n_head": 12, "batch": 1,
                                "seq": 64}),
    "llama": ("llama.py", {}),
    "t5": ("t5.py", {}),
}
SPECS = ("2xA100-40GB", "A100-40GB,T4-16GB")
SHARES = (0.6, 0.7)


def _build(name: str):  # noqa: ANN202 - a torch module and its inputs
    path, kwargs = MODELS[name]
    return runpy.run_path(str(ROOT / "examples" / path))["build"](**kwargs)


def _describe(name: str) -> str:
    """One line for the results text: the config each row of ``name`` plans."""
    model, inputs = _build(name)
    config = model.config
    layers = str(config.num_hidden_layers)
    if getattr(config, "num_decoder_layers", None):
        layers += f" + {config.num_decoder_layers}"
    path, kwargs = MODELS[name]
    call = f"build({', '.join(f'{k}={v}' for k, v in kwargs.items())})" if kwargs else "as is"
    shapes = ", ".join(f"{k} {' x '.join(map(str, v.shape))}" for k, v in inputs.items())
    return (f"- {name}: examples/{path} {call}; {layers} layers, width {config.hidden_size}, "
            f"vocabulary {config.vocab_size:,}; inputs {shapes} (batch x sequence); "
            f"{mb(weight_bytes(model))} MB of weights.")


def _row(name: str, spec: str, share: float, time_limit_s: float) -> str:
    model, inputs = _build(name)
    cap = int(share * weight_bytes(model))
    cluster = capped(spec, cap)
    head = f"| {name} | {spec} | {share:.0%} ({mb(cap)}) |"
    try:
        planned = plan(
            model,
            inputs,
            Config(
                devices=cluster,
                solve=Solve(time_limit_s=time_limit_s, whatif=False, deterministic=True, seed=0),
                emit=Emit(model=False),
            ),
        ).plan
    except InfeasibleError:
        return head + " no plan fits | | " + " | ".join(
            _accelerate_alone(model, inputs, cluster)) + " |"
    cells = [f"{planned.makespan_s * 1e3:.3f} ms", peaks(planned.schedule.peak_bytes)]
    for strategy in ACCELERATE_STRATEGIES:
        b = planned.baselines.get(strategy)
        if b is None:
            offload = next((n for n in planned.notes if n.startswith(strategy)), "absent")
            cells.append("offloads to disk" if "disk" in offload else offload)
            continue
        verdict = "fits" if b.feasible else "**overflows**"
        ratio = b.makespan_s / planned.makespan_s
        cells.append(f"{b.makespan_s * 1e3:.3f} ms ({ratio:.2f}x), "
                     f"{peaks(dict(b.peak_bytes))}, {verdict}")
    return head + " " + " | ".join(cells) + " |"


def _accelerate_alone(model, inputs, cluster) -> list[str]:  # noqa: ANN001 - torch objects
    """accelerate's maps scored on the traced graph, for a row where no plan fits."""
    traced = trace_model(model.eval(), (), inputs)
    problem = Problem(graph=traced.graph, cluster=cluster, costs=costs(traced.graph, cluster))
    cells = []
    for found in accelerate_maps(model, traced.graph, cluster):
        if found.device_of_op is None:
            cells.append("offloads to disk")
            continue
        s = simulate(problem, Placement(device_of=dict(found.device_of_op)))
        cells.append(f"{s.makespan_s * 1e3:.3f} ms, {peaks(dict(s.peak_bytes))}, "
                     + ("fits" if s.feasible else "**overflows**"))
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=3.0)
    parser.add_argument("--out", default=str(RESULTS / "accelerate.md"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    lines = ["# autoplace against accelerate's infer_auto_device_map", "",
             machine_line() + f"; analytic costs, deterministic CP-SAT, --time-limit "
             f"{args.time_limit:g}.", "",
             "Every device capped at the share of the model's weights shown (MB). Makespan "
             "and peak memory per device (MB, devices in order) as the one simulator scores "
             "them, activations included; the accelerate columns give the map's makespan "
             "(its ratio to the plan's), its peaks, and whether it fits. \"overflows\": the "
             "map fits accelerate's weight-only accounting but not once activations count. "
             "\"offloads to disk\": accelerate's map puts modules on disk, not a placement on "
             "these devices. Where a plan exists, accelerate's maps are scored on the plan's "
             "graph (the folded graph: zero-cost ops folded into their producer), each folded "
             "node that straddles accelerate's split placed "
             "where most of its ops are (the plan's notes count them); in \"no plan fits\" "
             "rows, on the traced graph.", "", "The models (random weights):", "",
             *(_describe(name) for name in MODELS), "",
             "| model | devices | cap | plan makespan | plan peak MB | "
             + " | ".join(ACCELERATE_STRATEGIES) + " |",
             "|---|---|---|---:|---|" + "---|" * len(ACCELERATE_STRATEGIES)]
    for name in MODELS:
        for spec in SPECS:
            for share in SHARES:
                lines.append(_row(name, spec, share, args.time_limit))
                print(lines[-1], file=sys.stderr)
    lines += ["", f"Reproduce: `PYTHONPATH=. python benchmarks/accelerate_compare.py --time-limit "
              f"{args.time_limit:g}` ({time.perf_counter() - began:.0f} s here)."]
    return write_markdown(args.out, lines)


if __name__ == "__main__":
    sys.exit(main())
