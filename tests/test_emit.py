"""Tests for the emit stage: segments, transfers, device rewrites, save/load and verify.

Every emitted model is compared with ``torch.testing.assert_close`` against the original. Plans
name "cuda:0"/"cuda:1" and are materialized on the CPU through ``device_map``, which is how a plan
made for GPUs runs on a machine without them; remapping to "meta" instead catches any op that
still creates tensors on a hard-coded device.
"""

from __future__ import annotations

import ast
import collections
import copy
import json
import logging
import math
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import safetensors.torch
import torch
from zoo import TwoBranch, by_module

import autoplace.emit
import autoplace.emit.runtime.engine
from autoplace.emit import (
    PartitionedModel,
    emit_model,
    load_model,
    local_device_map,
    save_model,
    verify,
)
from autoplace.errors import EmitError, VerificationError

CPU = {"cuda:*": "cpu"}
GPU0, GPU1 = "cuda:0", "cuda:1"


def export(model: torch.nn.Module, *args: object, **kwargs: object) -> torch.fx.GraphModule:
    return torch.export.export(model, args, kwargs, strict=False).module()


def compute_nodes(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op in ("call_function", "call_method")]



def params_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in module.named_parameters()}


# ---------------------------------------------------------------------------------------------
# Models. Each comment gives the hand-worked segmentation the tests expect.


class MLP(torch.nn.Module):
    # fc1 + relu on cuda:0 | fc2, relu, fc3 on cuda:1 -> 2 segments, one transfer (4x256 floats)
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 128)
        self.fc3 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))



class Positional(torch.nn.Module):
    # torch.export records arange(..., device=cpu); emit must make that the segment's device
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)
        return self.proj(x + positions) * torch.ones(1, device=x.device)


class TiedLM(torch.nn.Module):
    # the embedding and the output projection share one 50x12 weight
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 12)
        self.body = torch.nn.Linear(12, 12)
        self.out = torch.nn.Linear(12, 50, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.body(self.embed(ids))))


class Keywords(torch.nn.Module):
    # called as model(x, extra={"scale": ..., "shift": ...}); the dict arrives flattened
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, *, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.b(self.a(x) * extra["scale"] + extra["shift"])


Pair = collections.namedtuple("Pair", "first second")


class PairOut(torch.nn.Module):
    # a namedtuple with no serialized pytree name: saved with flat outputs
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> Pair:
        y = self.a(x)
        return Pair(y.relu(), y.sigmoid())


class Branchy(torch.nn.Module):
    # torch.cond: a higher-order op whose branches are fx subgraphs held by the segment
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).sin() + torch.arange(4, device=x.device)

        def negative(x: torch.Tensor) -> torch.Tensor:
            return x.cos()

        return torch.cond(x.sum() > 0, positive, negative, (x,)) * 2


@pytest.fixture(scope="module")
def mlp() -> tuple[MLP, torch.Tensor, torch.fx.GraphModule, dict[str, str]]:
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 784)
    gm = export(model, x)
    device_of = by_module(gm, {"fc1": GPU0, "fc2": GPU1, "fc3": GPU1}, default=GPU1)
    device_of["relu"] = GPU0  # the relu after fc1 runs in MLP.forward itself
    return model, x, gm, device_of


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor, torch.fx.GraphModule]:
    import transformers  # deferred: a heavy import, for the tests that use it

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32, use_cache=False
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (2, 8))
    return model, ids, export(model, ids)


# ---------------------------------------------------------------------------------------------
# Segments and transfers


def test_mlp_splits_into_two_segments_holding_their_layers_params(mlp):
    model, x, gm, device_of = mlp
    emitted = emit_model(gm, device_of, device_map=CPU)
    assert [device for device, _ in emitted.segments] == [GPU0, GPU1]
    assert emitted.planned_devices == [GPU0, GPU1] and emitted.devices == ["cpu", "cpu"]
    original = params_of(model)
    for segment, layers in ((emitted.seg0, ["fc1"]), (emitted.seg1, ["fc2", "fc3"])):
        own = params_of(segment)
        assert sorted(own) == sorted(
            f"{layer}.{kind}" for layer in layers for kind in "weight bias".split()
        )
        for name, tensor in own.items():
            torch.testing.assert_close(tensor, original[name], rtol=0, atol=0)
            # planned on cuda:*, materialized on the cpu the weights are on: shared, not copied
            assert tensor.data_ptr() == original[name].data_ptr()
    assert "relu, = self.seg0(x_cuda_0)" in emitted.forward_source
    assert "relu_cuda_1 = relu.to(self.seg1.device, non_blocking=False)" in emitted.forward_source
    torch.testing.assert_close(emitted(x), model(x))


def test_two_branches_on_alternating_devices_make_three_segments():
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(3, 16)
    gm = export(model, x)
    device_of = by_module(gm, {"left": GPU0, "right": GPU1, "head": GPU0}, default=GPU0)
    emitted = emit_model(gm, device_of, device_map=CPU)
    assert [device for device, _ in emitted.segments] == [GPU0, GPU1, GPU0]
    assert sorted(params_of(emitted.seg1)) == ["right.0.bias", "right.0.weight"]
    # the input goes to both devices; the right branch's result comes back to cuda:0
    assert emitted.forward_source.count("x.to(") == 2
    assert "gelu.to(self.seg2.device" in emitted.forward_source
    torch.testing.assert_close(emitted(x), model(x))


def test_order_decides_the_segments_and_must_be_topological():
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(3, 16)
    gm = export(model, x)
    device_of = by_module(gm, {"left": GPU0, "right": GPU1, "head": GPU0}, default=GPU0)
    right = [n for n in compute_nodes(gm) if device_of[n] == GPU1]
    rest = [n for n in compute_nodes(gm) if n not in right]
    # right branch first: cuda:1, then the left branch on cuda:0, then (a new segment, since it
    # reads the right branch's value, which the runtime hands over between segments) the head
    emitted = emit_model(gm, device_of, order=right + rest, device_map=CPU)
    assert [device for device, _ in emitted.segments] == [GPU1, GPU0, GPU0]
    assert emitted.segments[1][1] == [n for n in rest if device_of[n] == GPU0][
        :len(emitted.segments[1][1])]
    torch.testing.assert_close(emitted(x), model(x))
    with pytest.raises(EmitError, match="topological"):
        emit_model(gm, device_of, order=list(reversed(compute_nodes(gm))), device_map=CPU)


class Chain(torch.nn.Module):
    # six linear layers alternating cuda:0 / cuda:1 -> 6 segments; each reads only the last one's
    # output, so between calls exactly one activation (and the input) needs to be alive
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Outputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Keeps a weak reference to every tensor an op makes, to count those still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref[torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.made.append(weakref.ref(t))
        return out

    def alive(self) -> int:
        return len({r().untyped_storage().data_ptr() for r in self.made if r() is not None})


def test_generated_forward_frees_each_value_after_its_last_use():
    torch.manual_seed(0)
    model, x = Chain().eval(), torch.randn(4, 32)
    gm = export(model, x)
    device_of = by_module(gm, {f"layers.{i}": (GPU0, GPU1)[i % 2] for i in range(6)},
                          default=GPU0)
    # The sequential forward (the threaded runtime's frees are tested in test_runtime.py; a
    # dispatch mode sees only this thread's ops).
    emitted = emit_model(gm, device_of, device_map=CPU, runtime="sequential")
    assert [d for d, _ in emitted.segments] == [GPU0, GPU1] * 3
    mode = _Outputs()
    alive_at_call = []
    for index in range(6):
        getattr(emitted, f"seg{index}").register_forward_pre_hook(
            lambda *_: alive_at_call.append(mode.alive()))
    with mode, torch.no_grad():
        out = emitted(x)
    # before segment k > 0 only segment k-1's output is alive (on cpu its copy is itself); kept
    # until forward returns, the count would grow 1, 2, ..., 5
    assert alive_at_call == [0, 1, 1, 1, 1, 1]
    torch.testing.assert_close(out, model(x))


def test_nodes_missing_from_device_of_follow_their_producer_or_consumer(mlp):
    model, x, gm, _ = mlp
    nodes = compute_nodes(gm)
    first_fc2 = next(n for n in nodes if n.startswith("linear_1"))
    # only two ops placed: the unplaced ones follow their producer
    emitted = emit_model(gm, {nodes[0]: GPU0, first_fc2: GPU1}, device_map=CPU)
    assert [device for device, _ in emitted.segments] == [GPU0, GPU1]
    assert emitted.segments[1][1][0] == first_fc2
    torch.testing.assert_close(emitted(x), model(x))


def test_ops_without_inputs_run_just_before_their_consumer():
    torch.manual_seed(0)
    model, x = Positional().eval(), torch.randn(2, 8)
    gm = export(model, x)
    # arange and ones are neither placed nor ordered: each takes its consumer's device and runs
    # right before it, so neither opens a segment of its own
    placed = {"add": GPU0, "linear": GPU0, "mul": GPU1}
    emitted = emit_model(gm, placed, order=list(placed), device_map=CPU)
    assert emitted.segments == [(GPU0, ["arange", "add", "linear"]), (GPU1, ["ones", "mul"])]
    torch.testing.assert_close(emitted(x), model(x))


def test_device_arguments_follow_the_segment_device():
    torch.manual_seed(0)
    model, x = Positional().eval(), torch.randn(2, 8)
    gm = export(model, x)
    assert any(isinstance(v, torch.device) for n in gm.graph.nodes for v in n.kwargs.values()), (
        "the export no longer hard-codes a device; this test lost its point"
    )
    device_of = dict.fromkeys(compute_nodes(gm), GPU0)
    emitted = emit_model(gm, device_of, device_map=CPU)
    torch.testing.assert_close(emitted(x), model(x))
    for node in emitted.seg0.graph.nodes:
        assert not any(isinstance(v, torch.device) for v in [*node.args, *node.kwargs.values()])
    # On "meta" every op must run on meta: a leftover device=cpu would raise a device mismatch,
    # and the CPU input only gets there through the explicit transfer.
    dry = emit_model(gm, device_of, device_map={"cuda:*": "meta"})
    assert dry(x).device.type == "meta"


class Hardcoded(torch.nn.Module):
    # symbolic_trace keeps a factory without a device (CPU by default), a .to("cpu"), and a
    # call to math.sqrt that the generated file must import
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + torch.zeros(x.shape[-1])).to("cpu") * math.sqrt(x.shape[-1])


def test_default_and_string_devices_are_rewritten_too(tmp_path):
    model, x = Hardcoded(), torch.randn(2, 3)
    gm = torch.fx.symbolic_trace(model)
    device_of = dict.fromkeys(compute_nodes(gm), GPU0)
    emitted = emit_model(gm, device_of, device_map=CPU)
    torch.testing.assert_close(emitted(x), model(x))
    assert emit_model(gm, device_of, device_map={"cuda:*": "meta"})(x).device.type == "meta"
    save_model(emitted, tmp_path)
    assert "from math import sqrt as math_sqrt" in (tmp_path / "model.py").read_text()
    torch.testing.assert_close(load_model(tmp_path, device_map=CPU)(x), model(x))


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x / 2


torch.fx.wrap("_halve")


def test_save_names_a_global_it_cannot_import(tmp_path):
    class Halving(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _halve(x) + 1

    model, x = Halving(), torch.randn(3)
    gm = torch.fx.symbolic_trace(model)
    emitted = emit_model(gm, dict.fromkeys(compute_nodes(gm), GPU0), device_map=CPU)
    torch.testing.assert_close(emitted(x), model(x))  # in memory it runs
    with pytest.raises(EmitError, match=r"needs test_emit\._halve"):
        save_model(emitted, tmp_path)


def test_dict_keyword_input(tmp_path):
    torch.manual_seed(0)
    model, x = Keywords().eval(), torch.randn(2, 6)
    extra = {"scale": torch.randn(6), "shift": torch.randn(6)}
    gm = export(model, x, extra=extra)
    emitted = emit_model(gm, by_module(gm, {"a": GPU0, "b": GPU1}, default=GPU1), device_map=CPU)
    assert len(emitted.segments) == 2
    swapped = {"shift": extra["shift"], "scale": extra["scale"]}
    torch.testing.assert_close(emitted(x, extra=swapped), model(x, extra=extra))
    save_model(emitted, tmp_path)
    loaded = load_model(tmp_path, device_map=CPU)
    torch.testing.assert_close(loaded(x, extra=extra), model(x, extra=extra))


def test_symbolic_trace_graph_is_inlined_and_split():
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(4, 784)
    gm = torch.fx.symbolic_trace(model)
    device_of = {"fc1": GPU0, "relu": GPU0, "fc2": GPU1, "relu_1": GPU1, "fc3": GPU0}
    emitted = emit_model(gm, device_of, device_map=CPU)
    assert emitted.segments == [(GPU0, ["fc1", "relu"]), (GPU1, ["fc2", "relu_1"]), (GPU0, ["fc3"])]
    assert not any(n.op == "call_module" for n in emitted.seg0.graph.nodes)
    assert sorted(params_of(emitted.seg2)) == ["fc3.bias", "fc3.weight"]
    torch.testing.assert_close(emitted(x), model(x))


def test_higher_order_op_subgraphs_are_copied_into_the_segment(tmp_path):
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(2, 4)
    gm = export(model, x)
    nodes = compute_nodes(gm)
    cond = next(n for n in nodes if n.startswith("cond"))
    emitted = emit_model(gm, {n: GPU0 if n <= cond else GPU1 for n in nodes}, device_map=CPU)
    save_model(emitted, tmp_path)
    loaded = load_model(tmp_path, device_map=CPU)
    for inputs in (x.abs(), -x.abs()):  # both branches
        torch.testing.assert_close(emitted(inputs), model(inputs))
        torch.testing.assert_close(loaded(inputs), model(inputs))


# ---------------------------------------------------------------------------------------------
# Save and load


def test_save_load_round_trip_equals_in_memory_model(mlp, tmp_path):
    model, x, gm, device_of = mlp
    emitted = emit_model(gm, device_of, device_map=CPU)
    save_model(emitted, tmp_path)
    loaded = load_model(tmp_path, device_map=CPU)
    assert not isinstance(loaded, PartitionedModel)  # rebuilt from model.py, not unpickled
    torch.testing.assert_close(loaded(x), emitted(x), rtol=0, atol=0)
    assert loaded.segments == emitted.segments and loaded.devices == ["cpu", "cpu"]
    assert loaded.seg1.device == torch.device("cpu")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert [s["device"] for s in meta["segments"]] == [GPU0, GPU1]
    keys = safetensors.torch.load_file(tmp_path / "weights.safetensors").keys()
    assert sorted(keys) == sorted(
        f"seg{i}.{name}"
        for i, seg in enumerate([emitted.seg0, emitted.seg1])
        for name in params_of(seg)
    )


def _import_roots(source: str) -> tuple[set[str], set[str]]:
    """The top-level packages ``source`` imports absolutely, and the modules it imports
    relatively (``from ._runtime import ...``), function-local imports included."""
    roots: set[str] = set()
    relative: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            relative.add(node.module or "")
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    return roots, relative


def test_generated_source_imports_only_torch_the_stdlib_and_the_engine_beside_it(mlp, tmp_path):
    _, _, gm, device_of = mlp
    save_model(emit_model(gm, device_of, device_map=CPU), tmp_path)
    source = (tmp_path / "model.py").read_text()
    assert source.startswith("# Generated by autoplace")
    assert "pickle" not in source and "torch.load" not in source
    assert (
        "class Segment0(torch.nn.Module)" in source and "class Segment1(torch.nn.Module)" in source
    )
    allowed = {"torch"} | set(sys.stdlib_module_names)
    roots, relative = _import_roots(source)
    assert roots <= allowed and relative == {"_runtime"}, (roots, relative)
    # The one file beside it is autoplace's engine, as it is, importing torch and the stdlib only
    # (never autoplace): a saved model/ runs where autoplace is not installed.
    engine = (tmp_path / "_runtime.py").read_text()
    assert engine == Path(autoplace.emit.runtime.engine.__file__).read_text()
    roots, relative = _import_roots(engine)
    assert roots <= allowed and not relative, (roots, relative)
    assert "autoplace" not in roots


def test_a_saved_model_is_a_package_that_runs_without_autoplace(mlp, tmp_path):
    model, x, gm, device_of = mlp
    save_model(emit_model(gm, device_of, device_map=CPU), tmp_path / "model")
    safetensors.torch.save_file({"x": x}, str(tmp_path / "x.safetensors"))
    script = """
import json, sys
sys.modules["autoplace"] = None  # any import of autoplace fails
import safetensors.torch, torch
from torch.utils import _pytree as pytree
from model.model import AutoplacedModel
meta = json.loads(open("model/meta.json").read())
built = AutoplacedModel(["cpu", "cpu"], in_spec=pytree.treespec_loads(meta["in_spec"]),
                        out_spec=pytree.treespec_loads(meta["out_spec"]))
built.load_state_dict(safetensors.torch.load_file("model/weights.safetensors"), assign=True)
x = safetensors.torch.load_file("x.safetensors")["x"]
with torch.no_grad():
    safetensors.torch.save_file({"y": built(x)}, "y.safetensors")
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(safetensors.torch.load_file(tmp_path / "y.safetensors")["y"],
                               expected)


def test_a_model_missing_its_engine_file_says_so(mlp, tmp_path):
    _, _, gm, device_of = mlp
    save_model(emit_model(gm, device_of, device_map=CPU), tmp_path)
    (tmp_path / "_runtime.py").unlink()
    with pytest.raises(EmitError, match="missing _runtime.py"):
        load_model(tmp_path, device_map=CPU)


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path):
    torch.manual_seed(0)
    model, ids = TiedLM().eval(), torch.randint(0, 50, (2, 5))
    for gm in (torch.fx.symbolic_trace(model), export(model, ids)):
        nodes = compute_nodes(gm)
        emitted = emit_model(gm, dict.fromkeys(nodes, GPU0), device_map=CPU)
        assert len(params_of(emitted.seg0)) == 3  # shared weight, body.weight, body.bias
        save_model(emitted, tmp_path)
        weights = safetensors.torch.load_file(tmp_path / "weights.safetensors")
        assert sum(t.shape == (50, 12) for t in weights.values()) == 1
        loaded = load_model(tmp_path, device_map=CPU)
        torch.testing.assert_close(loaded(ids), model(ids))
        # Tied means one tensor: scaling it must change both the lookup and the projection.
        (shared,) = [p for p in loaded.parameters() if p.shape == (50, 12)]
        twin = copy.deepcopy(model)  # deepcopy keeps the tie
        with torch.no_grad():
            shared.mul_(2)
            twin.embed.weight.mul_(2)
        torch.testing.assert_close(loaded(ids), twin(ids))
    # Split across devices, the weight stays in the first segment and is copied to the second.
    gm = torch.fx.symbolic_trace(model)
    emitted = emit_model(
        gm, {"embed": GPU0, "body": GPU1, "relu": GPU1, "out": GPU1}, device_map=CPU
    )
    assert "embed.weight" in params_of(emitted.seg0) and params_of(emitted.seg1).keys() == {
        "body.weight",
        "body.bias",
    }
    torch.testing.assert_close(emitted(ids), model(ids))


def test_gpt2_split_round_trip(gpt2, tmp_path):
    model, ids, gm = gpt2
    nodes = compute_nodes(gm)
    cut = next(i for i, n in enumerate(nodes) if n.startswith("layer_norm_2"))  # block 1's ln_1
    device_of = {n: GPU0 if i < cut else GPU1 for i, n in enumerate(nodes)}
    emitted = emit_model(gm, device_of, device_map=CPU)
    # Runs of one device, not single segments: a value computed early on cuda:0 and read on
    # cuda:1 (the mask) ends a segment there, so the runtime can hand it over at once.
    devices = [d for d, _ in emitted.segments]
    runs = [d for i, d in enumerate(devices) if i == 0 or devices[i - 1] != d]
    assert runs == [GPU0, GPU1]
    on_gpu1 = {name for i, (d, _) in enumerate(emitted.segments) if d == GPU1
               for name in params_of(getattr(emitted, f"seg{i}"))}
    on_gpu0 = {name for i, (d, _) in enumerate(emitted.segments) if d == GPU0
               for name in params_of(getattr(emitted, f"seg{i}"))}
    assert any(name.startswith("transformer.h.1.") for name in on_gpu1)
    assert not any(name.startswith("transformer.h.1.") for name in on_gpu0)
    save_model(emitted, tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["output_structure"] == "pytree"
    assert meta["pytree_modules"] == ["transformers.modeling_outputs"]
    loaded = load_model(tmp_path, device_map=CPU)
    expected = model(ids)
    out = loaded(ids)
    assert type(out) is type(expected)
    torch.testing.assert_close(out.logits, expected.logits)
    assert verify(model, loaded, (ids,), {}).status == "passed"


def test_unserializable_output_structure_falls_back_to_flat(tmp_path):
    torch.manual_seed(0)
    model, x = PairOut().eval(), torch.randn(3, 5)
    gm = export(model, x)
    emitted = emit_model(gm, dict.fromkeys(compute_nodes(gm), GPU0), device_map=CPU)
    assert isinstance(emitted(x), Pair)  # in memory the structure is kept
    save_model(emitted, tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["output_structure"] == "flat"
    loaded = load_model(tmp_path, device_map=CPU)
    out = loaded(x)
    assert type(out) is tuple and len(out) == 2
    torch.testing.assert_close(out, tuple(model(x)))
    assert verify(model, loaded, (x,), {}).status == "passed"  # compared leaf by leaf


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs a machine without 2 GPUs")
def test_absent_devices_need_a_device_map(mlp, tmp_path):
    _, _, gm, device_of = mlp
    with pytest.raises(EmitError, match="device_map"):
        emit_model(gm, device_of)
    save_model(emit_model(gm, device_of, device_map=CPU), tmp_path)
    with pytest.raises(EmitError, match=r'device_map=\{"cuda:\*": "cpu"\}'):
        load_model(tmp_path)


def test_load_reports_missing_or_corrupt_directories(mlp, tmp_path):
    with pytest.raises(EmitError, match="missing"):
        load_model(tmp_path / "nowhere", device_map=CPU)
    _, _, gm, device_of = mlp
    save_model(emit_model(gm, device_of, device_map=CPU), tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(EmitError, match="corrupt"):
        load_model(tmp_path, device_map=CPU)


# ---------------------------------------------------------------------------------------------
# Verification and refusals


def test_verify_passes_and_catches_a_perturbed_weight(mlp):
    model, x, gm, device_of = mlp
    emitted = emit_model(gm, device_of, device_map=CPU)
    result = verify(model, emitted, (x,), {})
    assert result.status == "passed" and result.max_abs_diff < 1e-5
    with torch.no_grad():
        # the emitted model shares the original's storage, so perturb a copy of its own
        emitted.seg1.fc3.bias = torch.nn.Parameter(emitted.seg1.fc3.bias.clone())
        emitted.seg1.fc3.bias[0] += 0.5
    with pytest.raises(VerificationError, match="Mismatched elements"):
        verify(model, emitted, (x,), {})


def test_meta_parameters_are_refused():
    with torch.device("meta"):
        model = MLP()
    gm = torch.fx.symbolic_trace(model)
    with pytest.raises(EmitError, match="meta device; emit needs real weights"):
        emit_model(gm, {"fc1": GPU0}, device_map=CPU)


def test_unknown_node_names_are_refused(mlp):
    _, _, gm, _ = mlp
    with pytest.raises(EmitError, match="not in the fx graph"):
        emit_model(gm, {"no_such_node": GPU0}, device_map=CPU)


def test_untraceable_module_is_named():
    class Branching(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Branching()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) + 1

    class LeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, module: torch.nn.Module, name: str) -> bool:
            return isinstance(module, Branching) or super().is_leaf_module(module, name)

    outer = Outer()
    graph = LeafTracer().trace(outer)
    gm = torch.fx.GraphModule(outer, graph)
    with pytest.raises(EmitError, match="'inner'.*Branching"):
        emit_model(gm, {"inner": GPU0}, device_map=CPU)


def test_saved_files_live_where_asked(mlp, tmp_path):
    _, _, gm, device_of = mlp
    target = tmp_path / "nested" / "model"
    save_model(emit_model(gm, device_of, device_map=CPU), target)
    assert {p.name for p in Path(target).iterdir()} == {
        "model.py",
        "_runtime.py",
        "weights.safetensors",
        "meta.json",
    }


def test_local_device_map_keeps_present_devices_and_sends_absent_ones_to_the_cpu():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    present = [f"cuda:{i}" for i in range(count)]
    absent = f"cuda:{count}"  # one past the last GPU here, so never present
    assert local_device_map(["cpu", *present, absent]) == {
        "cpu": "cpu",
        **{device: device for device in present},
        absent: "cpu",
    }


def test_the_generated_file_still_names_the_loader():
    # Notes and model.py tell users to call autoplace.emit.load_model: that name must resolve.
    assert autoplace.emit.load_model is load_model


def test_verification_runs_without_tf32_and_restores_it():
    from autoplace.emit.check import outputs as verification

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
            return x * 2

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        verification.verify(Probe(), Probe(), (torch.ones(2),), {})
        assert seen == [(False, False), (False, False)]
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (
            True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
