"""Tiny graphs and models whose right placement is worked out by hand in the comments.

Graph builders return ``Problem`` objects on simple clusters with round numbers, so the tests can
state exact makespans. Times in seconds, bytes in bytes.
"""

from __future__ import annotations

import torch
from torch import nn

from autoplace.config import Config, Cost, Emit, Solve, Training
from autoplace.ir import Cluster, Costs, Device, Edge, Link, OpGraph, OpNode, Problem


def cluster(
    n: int = 2,
    *,
    memory_bytes: int = 1000,
    bandwidth: float = 100.0,
    latency: float = 0.0,
    types: list[str] | None = None,
) -> Cluster:
    """``n`` devices ``d0..``; moving b bytes takes ``latency + b / bandwidth`` seconds."""
    devices = tuple(
        Device(
            name=f"d{i}",
            type=(types[i] if types else "T"),
            memory_bytes=memory_bytes,
            torch_device="cpu",
        )
        for i in range(n)
    )
    links = tuple(
        Link(src=a.name, dst=b.name, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
        for a in devices
        for b in devices
        if a is not b
    )
    return Cluster(devices=devices, links=links)


def problem(
    nodes: list[tuple[str, float, int]],
    edges: list[tuple[str, str, int]],
    cl: Cluster,
    *,
    colocate: tuple[tuple[str, ...], ...] = (),
    speed: dict[str, float] | None = None,
    outputs: tuple[str, ...] = (),
    output_bytes: dict[str, int] | None = None,
) -> Problem:
    """``nodes``: (name, seconds on a unit-speed device, param bytes); ``speed[d]`` divides
    the time on device ``d``. Every node outputs 10 bytes unless ``output_bytes`` or an edge
    says otherwise."""
    speed = speed or {}
    out_bytes = {n: 10 for n, _, _ in nodes} | (output_bytes or {})
    for src, _, b in edges:
        out_bytes[src] = max(out_bytes[src], b)
    graph = OpGraph(
        nodes=tuple(OpNode(name=n, param_bytes=p, output_bytes=out_bytes[n]) for n, _, p in nodes),
        edges=tuple(Edge(src=s, dst=d, bytes=b) for s, d, b in edges),
        colocate=colocate,
        outputs=outputs,
    )
    costs = Costs(
        compute_s={n: {d.name: t / speed.get(d.name, 1.0) for d in cl.devices} for n, t, _ in nodes}
    )
    return Problem(graph=graph, cluster=cl, costs=costs)


def fork_join(cl: Cluster) -> Problem:
    # a -> {b, c} -> d; b and c take 10 s each, a and d 1 s; edges carry 100 bytes = 1 s.
    # One device: 1 + 10 + 10 + 1 = 22 s. Two devices: a, b on d0 and c, d on d1: b runs 1..11
    # and its output reaches d1 at 12; c waits for a's output (arrives at 2) and runs 2..12;
    # d runs 12..13. Optimum 13 s: whichever branch is away from a starts at 2 and ends at 12,
    # and d needs the other branch's output too, which ends at 11 at best and then moves (12).
    return problem(
        [("a", 1, 0), ("b", 10, 0), ("c", 10, 0), ("d", 1, 0)],
        [("a", "b", 100), ("a", "c", 100), ("b", "d", 100), ("c", "d", 100)],
        cl,
        outputs=("d",),
    )


def chain(cl: Cluster, *, params: int = 0) -> Problem:
    # a -> b -> c, 1 s each: one device is optimal (3 s); any split only adds transfers.
    return problem(
        [("a", 1, params), ("b", 1, params), ("c", 1, params)],
        [("a", "b", 100), ("b", "c", 100)],
        cl,
        outputs=("c",),
    )


class TwoLayer(nn.Module):
    # Parameters: fc1 8*16+16 = 144 floats (576 bytes); fc2 16*4+4 = 68 floats (272 bytes).
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class TwoBranch(nn.Module):
    # Two branches off the input and a head that joins them: placed left and head on one
    # device and right on another, it runs in graph order (left, right, head) as three
    # segments, A, B, A, with right's output handed back to A once.
    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(16, 16)
        self.right = nn.Sequential(nn.Linear(16, 16), nn.GELU())
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.left(x)) + self.right(x))


def by_module(gm: torch.fx.GraphModule, devices: dict[str, str], default: str) -> dict[str, str]:
    """Device per exported op from the module that ran it (longest matching path prefix)."""
    placement = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stack = list(node.meta.get("nn_module_stack", {}).values())
        path = stack[-1][0] if stack else ""
        matches = [p for p in devices if path == p or path.startswith(p + ".")]
        placement[node.name] = devices[max(matches, key=len)] if matches else default
    return placement


class TiedLM(nn.Module):
    # The embedding and the output projection share one 50x16 weight (3,200 bytes): they must be
    # colocated, and the weight counted once.
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(self.embed(ids))))


class DataDependent(nn.Module):
    # Python control flow on a tensor's value: neither torch.export nor torch.fx can trace it.
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -x


class CrossRead(nn.Module):
    # h = x + 1 (64 bytes); b = 2h (64) on another device; a = outer(h, h) (1,024); c = a + b
    # (1,024); out = c repeated 8 times (8,192). With a, c and out on one device and b on the
    # other, c reads b from afar, so the emitted model cuts a segment before c: a is an input
    # of the segment [c, out] and stays referenced until it returns, while out is allocated.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + 1
        b = h * 2
        a = torch.outer(h, h)
        return (a + b).repeat(8, 1)


def branches_source(branches: int) -> str:
    """A model file: ``branches`` independent 256-1024-256 MLP branches of one 4096-row input,
    summed. Long matmul kernels and few launches, so spreading the branches over GPUs pays for
    the launcher's segment calls and handovers."""
    return f"""
import torch
from torch import nn

class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
            for _ in range({branches}))

    def forward(self, x):
        return torch.stack([b(x) for b in self.branches]).sum(0)

def build():
    torch.manual_seed(0)
    return Branches(), (torch.randn(4096, 256),)
"""


class SlicedRead(nn.Module):
    # p = 2x (256 bytes for 64 floats); its halves a and b are views of p, so tracing folds
    # them into p's node: one plan node with two outputs. With p, c = sin(x) (256), o =
    # outer(c, x) (16,384) and s = o.sum() on one device and u = a + 1, w = b * s on the other,
    # the emitted model copies a when u starts and b when w starts, after o is made: b keeps
    # all of p's storage alive meanwhile. A plan that freed p once its first reader elsewhere
    # started would miss it.
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = x * 2
        a, b = p[:32], p[32:]
        u = a + 1
        o = torch.outer(x.sin(), x)
        w = b * o.sum()
        return u, o, w


class ExpertMatmul(nn.Module):
    # Mixture-of-experts style: each expert's weight (4 x 64 x 32 floats, 32,768 bytes) is
    # transposed for a batched matmul. The transpose is a view of the parameter, which is
    # resident: it allocates nothing, though tracing cannot fold it (it reads no computed value).
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.w.transpose(1, 2)).relu()


class LastRow(nn.Module):
    # a(x) is 4 x 32 x 256 floats (131,072 bytes); b reads only its last row, h[:, -1] (4,096
    # bytes), a view that tracing folds into a's node. The view keeps all of a's output alive
    # until b is done: the node's output is the 131,072 bytes, not the 4,096 read outside it.
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 256)
        self.b = nn.Linear(256, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)[:, -1])


class Block(nn.Module):
    # A residual block, 16 -> 64 -> 16: the unit of activation checkpointing per block
    # (``train.recompute.recompute_units``) and of FSDP2 (its own parameters).
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class MLP(nn.Module):
    # The seed tutorial's 784-256-128-10 MLP. Parameters: fc1 784*256+256 = 200,960 floats
    # (803,840 bytes), fc2 32,896 (131,584 bytes), fc3 1,290 (5,160 bytes): 940,584 bytes.
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def mlp_training_plan(optimizer: str = "adam", *, device_bytes: int | None = None):
    """One training step of ``MLP`` (batch 64, cross-entropy) planned on two A100s, with no
    profiling, emitting or what-if. ``device_bytes``: each GPU's memory beside its runtime
    reserve. With 5,500,000 under Adam the step must be split: fc1's layer alone holds 4 x
    803,840 = 3.2 MB (parameters, gradients, two moments) and 1.6 MB of the update's
    temporaries (8 bytes a parameter), and the whole step 4 x 940,584 = 3.8 MB and the same
    1.6 MB, with the activations saved for the backward on top: about 5.9 MB."""
    import dataclasses

    import torch.nn.functional as F

    from autoplace.cluster import resolve_cluster
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    devices, _ = resolve_cluster(spec="2xA100-40GB")
    if device_bytes is not None:
        devices = dataclasses.replace(devices, devices=tuple(
            dataclasses.replace(d, memory_bytes=d.reserved_bytes + device_bytes)
            for d in devices.devices))
    return plan(
        MLP(),
        (x,),
        Config(
            devices=devices,
            mode="training",
            solve=Solve(time_limit_s=2, deterministic=True, whatif=False),
            cost=Cost(profile=False),
            training=Training(optimizer=optimizer, replicas=1),
            emit=Emit(model=False),
        ),
        loss=F.cross_entropy,
        example_targets=(y,),
    ).plan
