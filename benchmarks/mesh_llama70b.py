"""Planning a Llama-2-70B-wide training step on 64 A100-80GB (8 hosts of 8, NVLink inside, a
200 GB/s NIC a host) with a dp 8 x tp 8 tensor-parallel candidate: wall seconds, peak memory
and what each plan predicts.

    PYTHONPATH=. python benchmarks/mesh_llama70b.py   # -> benchmarks/results/mesh-llama70b.md

The model is ``examples/llama70b_meta.py``'s shape (width 8192, 64 query heads over 8 key/value
heads, MLP 28,672, vocabulary 32,000) on the meta device, with a batch of 8 sequences of 2,048
tokens and a next-token loss, at 8 layers and at the whole 80. Each row is one ``autoplace plan
MODEL --mode training --cluster CLUSTER --tp 8 --dp 8 --time-limit 10`` in a child process
(its max RSS from ``os.wait4``): the plan's own step (replicas of a placement) and the
candidate (observed on 8 fake ranks, priced with averaged gradients and with FSDP2 over dp),
both analytic; where no placement fits, the mesh that fits is the plan. A row that stops gives
the error. Issue 28's targets for the 80-layer shape: 60 s and 2 GiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoplace.formats.plan import MESH_SOLVER  # noqa: E402
from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

LAYERS = (8, 80)
MODEL = '''
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    config = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers={layers}, num_attention_heads=64,
                         num_key_value_heads=8, max_position_embeddings=4096, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model, {{"input_ids": torch.randint(0, 32000, (8, 2048))}}


def loss(outputs, labels):
    logits = outputs.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


example_targets = (torch.randint(0, 32000, (8, 2048)),)
'''
HOST = '''
[[hosts]]
name = "node{index}"
devices = ["8xA100-80GB"]
nic_bandwidth_bytes_per_s = 200e9
'''


def _row(layers: int, tmp: Path) -> str:
    model = tmp / f"llama70b_{layers}.py"
    model.write_text(MODEL.format(layers=layers))
    cluster = tmp / "cluster.toml"
    cluster.write_text("".join(HOST.format(index=i) for i in range(8)))
    out = tmp / f"out{layers}"
    load = os.getloadavg()[0]
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "autoplace.cli", "plan", str(model), "--mode", "training",
         "--cluster", str(cluster), "--tp", "8", "--dp", "8", "--time-limit", "10", "--out",
         str(out), "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = child.stderr.read().decode() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    rss = usage.ru_maxrss * 1024 / 2**30  # Linux reports KiB
    head = f"| {layers} | {wall:.1f} | {rss:.2f} | {load:.2f} | "
    if os.waitstatus_to_exitcode(status):
        error = next((line for line in stderr.splitlines() if "error:" in line), "?")
        return head + f"stopped (exit {os.waitstatus_to_exitcode(status)}): {error} | | | |"
    plan = json.loads((out / "plan.json").read_text())
    tp = plan["tensor_parallel"]
    weighed = ", ".join(f"{k} {v:.3f}" for k, v in tp["weighed_sharding"].items())
    own = ("no placement fits: the plan is the mesh" if plan["solver"]["name"] == MESH_SOLVER
           else f"{plan['training']['replicas']} replicas: {plan['makespan_s']:.3f}")
    return head + (f"{own} | "
                   f"dp {tp['dp']} x tp {tp['ranks']}, {tp['sharding']}"
                   + (", each block recomputed" if tp.get("recompute") else "") + ": "
                   f"{tp['makespan_s']:.3f} ({weighed}) | {tp['peak_bytes'] / 2**30:.1f} | "
                   f"{tp['collectives']} |")


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in LAYERS:
            rows.append(_row(layers, Path(tmp)))
            print(rows[-1], flush=True)
    return write_markdown(RESULTS / "mesh-llama70b.md", [
        "# A Llama-2-70B-wide training step on 64 A100-80GB: the plan and a dp 8 x tp 8 mesh",
        "",
        f"{machine_line()}. Command: `PYTHONPATH=. python benchmarks/mesh_llama70b.py`: "
        "`autoplace plan MODEL --mode training --cluster CLUSTER --tp 8 --dp 8 --time-limit 10` "
        "(8 hosts of 8 A100-80GB, NVLink inside, a 200 GB/s NIC a host; the model on the meta "
        "device, batch 8 x 2,048 tokens, Adam in float32; analytic costs). *wall s* and *RSS "
        "GiB*: the planning process's; *load*: the 1-minute load average before it; *plan*: "
        "the plan's own step (replicas of a placement), seconds, or where none fits the plan is "
        "the mesh; *candidate*: the dp x tp mesh kept, its step in seconds and each sharding's "
        "(`ddp`: averaged gradients; recomputing each block where none fits without); *rank 0 "
        "peak*: the candidate's simulated memory on rank 0; *collectives*: DTensor's in a step, "
        "observed on 8 fake ranks. Targets for 80 layers (issue 28): 60 s and 2 GiB.",
        "",
        "| layers | wall s | RSS GiB | load | plan | candidate | rank 0 peak GiB | collectives |",
        "|---:|---:|---:|---:|---|---|---:|---:|",
        *rows,
    ])


if __name__ == "__main__":
    raise SystemExit(main())
