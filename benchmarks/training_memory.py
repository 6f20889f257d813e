"""A training step's memory: the plan's peak per device against the emitted step's, measured.

    python benchmarks/training_memory.py    # writes benchmarks/results/training-memory.md

For MLP, LeNet and GPT-2 (``examples/``) and a 4-layer MLP whose activations outweigh its
weights (``tests/test_recompute.py``'s, 1024 samples), each planned for one Adam step on
``2xcpu-thread`` (analytic costs, ``--min-gain 0``, one replica) with one micro-batch, with 4
under GPipe, and with 4 under GPipe recomputing on every device (``--recompute all``): the
plan's training check measures the emitted model's second step per planned device
(``autoplace.emit.check.memory.measure_step``: weights and optimizer state resident; gradients,
activations, temporaries) and fails the plan where it exceeds the plan's peak less the
runtime's reserve; this table gives both figures. A row that is written passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

EXAMPLES = ("mlp", "lenet", "gpt2", "deep")
CASES = ((1, "off"), (4, "off"), (4, "all"))  # (micro-batches, recompute), GPipe


def _model(example: str):
    """The model, its example inputs, loss and targets."""
    if example == "deep":
        import torch
        import torch.nn.functional as F
        from test_recompute import Deep

        torch.manual_seed(0)
        return (Deep(), (torch.randn(1024, 128),), lambda out, t: F.cross_entropy(out, t),
                (torch.randint(0, 10, (1024,)),))
    from autoplace.trace.load import load_model_file

    loaded = load_model_file(ROOT / "examples" / f"{example}.py")
    return loaded.model, loaded.kwargs or loaded.args, loaded.loss, loaded.targets


def measure(example: str, microbatches: int, recompute: str, *, time_limit_s: float) -> dict:
    from autoplace.config import Config, Cost, Solve, Training
    from autoplace.pipeline import plan

    model, inputs, loss, targets = _model(example)
    began = time.perf_counter()
    planned = plan(
        model,
        inputs,
        Config(
            devices="2xcpu-thread",
            mode="training",
            name=example,
            solve=Solve(time_limit_s=time_limit_s, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
            training=Training(
                optimizer="adam",
                microbatches=microbatches,
                schedule="gpipe" if microbatches > 1 else "auto",
                replicas=1,
                recompute=recompute if microbatches > 1 else "auto",
            ),
        ),
        loss=loss,
        example_targets=targets,
    ).plan
    check = planned.training.check
    return {"example": example, "microbatches": microbatches,
            "recompute": list(planned.training.recompute or ()),
            "status": check.memory_status, "peaks": check.peak_bytes,
            "wall_s": time.perf_counter() - began}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=4.0)
    parser.add_argument("--only", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--out", default=str(RESULTS / "training-memory.md"))
    args = parser.parse_args(argv)
    rows = []
    for example in args.only:
        for m, recompute in CASES:
            rows.append(measure(example, m, recompute, time_limit_s=args.time_limit))
            print(rows[-1], flush=True)
    lines = [
        "# A training step's memory: planned against measured on the emitted model", "",
        f"{machine_line()}. Command: `python benchmarks/training_memory.py --time-limit "
        f"{args.time_limit:g}`. Each row: `autoplace.plan(EXAMPLE, Config(devices="
        "'2xcpu-thread', mode='training', solve=Solve(min_gain=0), training=Training("
        "optimizer='adam', replicas=1, microbatches=M, schedule='gpipe', recompute=...)))`; "
        "its training check measures the emitted model's "
        "second step per planned device (`emit.check.memory.measure_step`: weights and Adam's "
        "state "
        "resident, then the tensor storages of gradients, activations and temporaries, the "
        "backward's charged to the device whose segment made the autograd node) and fails the "
        "plan above the plan's peak "
        "less the runtime's reserve. *deep*: 4 layers of 128 on 1024 samples "
        "(`tests/test_recompute.py`), whose activations outweigh its weights.", "",
        "| example | M | recomputing on | device | planned (bytes) | measured (bytes) | "
        "measured / planned | plan + check (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for device, v in sorted(r["peaks"].items()):
            ratio = (v["measured_bytes"] / v["predicted_bytes"] if v["predicted_bytes"]
                     else float("nan"))
            lines.append(
                f"| {r['example']} | {r['microbatches']} | {', '.join(r['recompute']) or '-'} "
                f"| {device} | {v['predicted_bytes']} | {v['measured_bytes']} | {ratio:.2f} | "
                f"{r['wall_s']:.1f} |")
    return write_markdown(Path(args.out), lines)


if __name__ == "__main__":
    raise SystemExit(main())
