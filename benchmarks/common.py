"""What every benchmark script shares: where results go, and the line that says where and when
they were measured."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def cli_json(*argv: str) -> dict:
    """``autoplace ARGV --json`` in a child process (this checkout's autoplace), its report;
    ``CalledProcessError`` where it fails."""
    done = subprocess.run([sys.executable, "-m", "autoplace.cli", *argv, "--json"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout)


def machine_line() -> str:
    return (f"Measured {datetime.date.today().isoformat()} on {platform.machine()} "
            f"({os.cpu_count()} cores), Python {platform.python_version()}")


def write_markdown(out: str | os.PathLike[str], lines: list[str] | str) -> int:
    """Write the table (lines, or the whole text) to ``out``, print it, return the exit code."""
    text = lines if isinstance(lines, str) else "\n".join(lines) + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text)
    return 0


# --- the device-map tables (accelerate_compare.py, device_map.py)
def mb(nbytes: float) -> str:
    """Bytes as MB (10**6), one decimal."""
    return f"{nbytes / 1e6:.1f}"


def peaks(peak_bytes: dict[str, int]) -> str:
    """Each device's peak, in MB, ``" / "`` between them."""
    return " / ".join(mb(b) for b in peak_bytes.values())


def weight_bytes(model: Any) -> int:
    """The bytes of a torch module's parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def capped(spec: str, cap: int) -> Any:
    """The cluster ``spec`` names, each device holding ``cap`` bytes of tensors (no runtime
    reserve, the CUDA context, on top): a ``Cluster``."""
    from autoplace.cluster import resolve_cluster

    cluster, _ = resolve_cluster(spec=spec)
    return dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=cap, reserved_bytes=0) for d in cluster.devices))


# Llama's and T5's examples run a batch of one; two data-parallel groups (DDP, FSDP or a mesh's
# dp) need two. Each file builds the example's model with a batch of 2 and keeps its loss.
_BATCH_OF_2 = {
    "llama": '''
import sys
sys.path.insert(0, {root!r})
import torch
from examples.llama import build as _build, loss  # noqa: F401


def build():
    model, _ = _build()
    return model, {{"input_ids": torch.randint(0, 16000, (2, 64),
                                              generator=torch.Generator().manual_seed(2))}}


example_targets = (torch.randint(0, 16000, (2, 64), generator=torch.Generator().manual_seed(1)),)
''',
    "t5": '''
import sys
sys.path.insert(0, {root!r})
import torch
from examples.t5 import build as _build, loss  # noqa: F401


def build():
    model, _ = _build()
    g = torch.Generator().manual_seed(2)
    return model, {{"input_ids": torch.randint(0, 16000, (2, 64), generator=g),
                   "decoder_input_ids": torch.randint(0, 16000, (2, 16), generator=g)}}


example_targets = (torch.randint(0, 16000, (2, 16), generator=torch.Generator().manual_seed(1)),)
'''}


def batch_of_2(example: str, tmp: Path) -> Path:
    """The model file of ``example`` for two data-parallel groups: ``examples/EXAMPLE.py``, or
    for Llama and T5 a file in ``tmp`` that builds it with a batch of 2."""
    if example not in _BATCH_OF_2:
        return ROOT / "examples" / f"{example}.py"
    path = tmp / f"{example}_batch2.py"
    path.write_text(_BATCH_OF_2[example].format(root=str(ROOT)))
    return path
