"""Planning a Llama-2-70B-wide training step on 64 A100-80GB (8 hosts of 8, NVLink inside, a
200 GB/s NIC a host) with a dp 8 x tp 8 candidate, and a Llama-3.1-405B-wide one on 512
H100-80GB (64 hosts) with dp 64 x tp 8: wall seconds, peak memory, what each plan predicts.

    PYTHONPATH=. python benchmarks/mesh_llama70b.py   # -> benchmarks/results/mesh-llama70b.md

The 70B model is ``examples/llama70b_meta.py``'s shape (width 8192, 64 query heads over 8
key/value heads, MLP 28,672, vocabulary 32,000), batch 8 x 2,048 tokens, at 8 layers and the
whole 80; the 405B one (``SHAPES``) batch 64 x 2,048; both on the meta device with a next-token
loss. Each row is one ``autoplace plan MODEL --mode training --cluster CLUSTER --tp 8 --dp DP
--time-limit 10`` in a child process (its max RSS from ``os.wait4``): the plan's own step
(replicas of a placement) and the candidate (observed on 8 fake ranks, priced with averaged
gradients and with FSDP2 over dp), both analytic; where no placement fits or can beat it
(the mesh is weighed first), the mesh that fits is the plan; a row that stops gives the
error. Issue 28's targets: 60 s and 2 GiB for 70B at 80 layers, 5 minutes for 405B.
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

from autoplace.formats.plan import MESH_SOLVER, SolverRecord, unplaced  # noqa: E402
from benchmarks.common import RESULTS, machine_line, write_markdown  # noqa: E402

# (label, layers, width, MLP width, heads, key/value heads, vocabulary, batch, hosts, GPU, NIC
# bytes/s, dp): the 70B shape at 8 and 80 layers on 64 A100s, and a Llama-3.1-405B shape on
# 512 H100s (issue 28's second planning-time target: 5 minutes).
SHAPES = (
    ("70B", 8, 8192, 28672, 64, 8, 32000, 8, 8, "A100-80GB", 200e9, 8),
    ("70B", 80, 8192, 28672, 64, 8, 32000, 8, 8, "A100-80GB", 200e9, 8),
    ("405B", 126, 16384, 53248, 128, 8, 128256, 64, 64, "H100-80GB", 400e9, 64),
)
MODEL = '''
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    config = LlamaConfig(vocab_size={vocab}, hidden_size={width}, intermediate_size={mlp},
                         num_hidden_layers={layers}, num_attention_heads={heads},
                         num_key_value_heads={kv}, max_position_embeddings=4096, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model, {{"input_ids": torch.randint(0, {vocab}, ({batch}, 2048))}}


def loss(outputs, labels):
    logits = outputs.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


example_targets = (torch.randint(0, {vocab}, ({batch}, 2048)),)
'''
HOST = '''
[[hosts]]
name = "node{index}"
devices = ["8x{gpu}"]
nic_bandwidth_bytes_per_s = {nic}
'''


def _row(shape: tuple, tmp: Path) -> str:
    label, layers, width, mlp, heads, kv, vocab, batch, hosts, gpu, nic, dp = shape
    model = tmp / f"llama{label}_{layers}.py"
    model.write_text(MODEL.format(layers=layers, width=width, mlp=mlp, heads=heads, kv=kv,
                                  vocab=vocab, batch=batch))
    cluster = tmp / f"cluster{hosts}.toml"
    cluster.write_text("".join(HOST.format(index=i, gpu=gpu, nic=nic) for i in range(hosts)))
    out = tmp / f"out{label}{layers}"
    load = os.getloadavg()[0]
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "autoplace.cli", "plan", str(model), "--mode", "training",
         "--cluster", str(cluster), "--tp", "8", "--dp", str(dp), "--time-limit", "10", "--out",
         str(out), "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = child.stderr.read().decode() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    rss = usage.ru_maxrss * 1024 / 2**30  # Linux reports KiB
    head = f"| {label}, {layers} | {hosts * 8} {gpu} | {wall:.1f} | {rss:.2f} | {load:.2f} | "
    if os.waitstatus_to_exitcode(status):
        error = next((line for line in stderr.splitlines() if "error:" in line), "?")
        error = error[error.find("The tensor-parallel candidate"):] if (
            "The tensor-parallel candidate" in error) else error  # the mesh's diagnosis
        return head + f"stopped (exit {os.waitstatus_to_exitcode(status)}): {error} | | | |"
    plan = json.loads((out / "plan.json").read_text())
    tp = plan["tensor_parallel"]
    weighed = ", ".join(f"{k} {v:.3f}" for k, v in tp["weighed_sharding"].items())
    own = (f"{unplaced(SolverRecord.from_dict(plan['solver']))}: the plan is the mesh"
           if plan["solver"]["name"] == MESH_SOLVER
           else f"{plan['training']['replicas']} replicas: {plan['makespan_s']:.3f}")
    return head + (f"{own} | "
                   f"dp {tp['dp']} x tp {tp['ranks']}, {tp['sharding']}"
                   + (", each block recomputed" if tp.get("recompute") else "") + ": "
                   f"{tp['makespan_s']:.3f} ({weighed}) | {tp['peak_bytes'] / 2**30:.1f} | "
                   f"{tp['collectives']} |")


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in SHAPES:
            rows.append(_row(shape, Path(tmp)))
            print(rows[-1], flush=True)
    return write_markdown(RESULTS / "mesh-llama70b.md", [
        "# Llama-2-70B- and Llama-3.1-405B-wide training steps on 64 A100s and 512 H100s: the "
        "plan and a dp x tp 8 mesh",
        "",
        f"{machine_line()}. Command: `PYTHONPATH=. python benchmarks/mesh_llama70b.py`: "
        "`autoplace plan MODEL --mode training --cluster CLUSTER --tp 8 --dp DP --time-limit 10` "
        "(hosts of 8 GPUs, NVLink inside; 70B: 8 hosts of A100-80GB, a 200 GB/s NIC a host, "
        "batch 8 x 2,048 tokens, dp 8; 405B (width 16,384, MLP 53,248, 128 heads over 8 "
        "key/value heads, vocabulary 128,256): 64 hosts of H100-80GB, a 400 GB/s NIC a host, "
        "batch 64 x 2,048, dp 64; the model on the meta device, Adam in float32; analytic "
        "costs). A row that stops gives the error (for the mesh, its diagnosis). *wall s* and *RSS "
        "GiB*: the planning process's; *load*: the 1-minute load average before it; *plan*: "
        "the plan's own step (replicas of a placement), seconds, or where none fits (or none "
        "can beat the mesh: each replica count's lower bound is no less than its step) the plan "
        "is the mesh; *candidate*: the dp x tp mesh kept, its step in seconds and each sharding's "
        "(`ddp`: averaged gradients; recomputing each block where none fits without); *rank 0 "
        "peak*: the candidate's simulated memory on rank 0; *collectives*: DTensor's in a step, "
        "observed on 8 fake ranks. Targets (issue 28): 70B at 80 layers in 60 s and 2 GiB, 405B "
        "in 5 minutes.",
        "",
        "| shape, layers | GPUs | wall s | RSS GiB | load | plan | candidate | rank 0 peak GiB "
        "| collectives |",
        "|---|---|---:|---:|---:|---|---|---:|---:|",
        *rows,
    ])


if __name__ == "__main__":
    raise SystemExit(main())
