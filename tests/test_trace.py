"""Tracing into the IR: shapes, bytes, parameter attribution, colocation, fallbacks."""

from __future__ import annotations

import pytest
import torch
import zoo

import autoplace.trace as trace_mod
import autoplace.trace.count as trace_count
from autoplace.errors import TraceError
from autoplace.trace import trace_model


def test_two_layer_mlp_graph_has_shapes_bytes_and_params():
    model = zoo.TwoLayer().eval()
    traced = trace_model(model, (torch.randn(3, 8),))
    g = traced.graph
    assert traced.tracer == "export"
    assert g.total_param_bytes == 576 + 272
    by_module = {}
    for node in g.nodes:
        by_module[node.module] = by_module.get(node.module, 0) + node.param_bytes
    assert by_module["fc1"] == 576 and by_module["fc2"] == 272
    inputs = [n for n in g.nodes if n.is_input]
    assert len(inputs) == 1 and inputs[0].output_shapes == ((3, 8),)
    assert inputs[0].output_bytes == 3 * 8 * 4
    out = g.node(g.outputs[0])
    assert out.output_shapes == ((3, 4),) and out.output_bytes == 48
    # fc1 is a 3x8 @ 8x16 matmul: 2 * 3 * 8 * 16 FLOPs.
    fc1_flops = sum(n.flops for n in g.nodes if n.module == "fc1")
    assert fc1_flops == 2 * 3 * 8 * 16
    # Every edge joins known nodes and carries the producer's bytes.
    for e in g.edges:
        assert e.bytes == g.node(e.src).output_bytes


def test_tied_weights_are_counted_once_and_colocated():
    model = zoo.TiedLM().eval()
    traced = trace_model(model, (torch.randint(0, 50, (2, 5)),))
    g = traced.graph
    assert g.total_param_bytes == 50 * 16 * 4 + (16 * 16 + 16) * 4
    groups = [set(grp) for grp in g.colocate]
    assert len(groups) == 1
    modules = {g.node(n).module for n in groups[0]}
    assert modules == {"embed", "out"}


def test_meta_device_model_traces_without_weights_and_same_flops():
    real = zoo.TwoLayer().eval()
    with torch.device("meta"):
        meta = zoo.TwoLayer().eval()
    x = torch.randn(3, 8)
    a, b = trace_model(real, (x,)), trace_model(meta, (x,))
    assert b.has_meta_params
    assert sum(n.flops for n in a.graph.nodes) == sum(n.flops for n in b.graph.nodes)
    assert a.graph.total_param_bytes == b.graph.total_param_bytes


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(2, 128, 4, 16).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_attention_is_counted_as_its_fused_kernel_runs_with_weights_or_on_meta():
    """scaled_dot_product_attention on CPU runs a fused kernel the FLOP counter does not know:
    its FLOPs are the two matmuls' (2 x 2 x B x H x L x L x E), and it holds no L x L scores.
    On the meta device ATen takes the math path, which holds them (B x H x L x L floats, twice):
    a meta model is counted as a real one runs, not as that."""
    x = torch.randn(2, 128, 64)
    real = _Attention()
    with torch.device("meta"):
        meta = _Attention()
    scores = 2 * 4 * 128 * 128 * 4  # B x H x L x L float32
    for model in (real, meta):
        (node,) = [n for n in trace_model(model, (x,)).graph.nodes
                   if n.name == "scaled_dot_product_attention"]
        assert node.flops == 4 * (2 * 4 * 128 * 16) * 128
        assert node.workspace_bytes < scores / 4


def test_falls_back_to_fx_when_export_fails(monkeypatch):
    def broken_export(*args, **kwargs):
        raise RuntimeError("export is unhappy")

    monkeypatch.setattr(trace_mod, "_export", broken_export)
    traced = trace_model(zoo.TwoLayer().eval(), (torch.randn(3, 8),))
    assert traced.tracer == "fx"
    assert any("export is unhappy" in note for note in traced.notes)
    assert traced.graph.total_param_bytes == 576 + 272
    assert {n.module for n in traced.graph.nodes if n.param_bytes} == {"fc1", "fc2"}


def test_untraceable_model_gives_both_reasons():
    with pytest.raises(TraceError, match=r"torch.export failed .*symbolic_trace failed too"):
        trace_model(zoo.DataDependent().eval(), (torch.randn(2, 4),))


def test_keyword_inputs_are_traced():
    class KW(torch.nn.Module):
        def forward(self, x, *, scale):
            return x * scale

    traced = trace_model(KW(), (), {"x": torch.randn(2, 2), "scale": torch.randn(2, 2)})
    assert sum(n.is_input for n in traced.graph.nodes) == 2


@pytest.mark.parametrize("force_fx", [False, True])
def test_pooling_counts_the_inputs_each_output_reads_as_flops(monkeypatch, force_fx):
    # The FLOP counter leaves pooling at zero; the roofline and the calibration's pooling
    # family need the window: kernel area per output element, the whole input when adaptive.
    if force_fx:
        def refuse(*args, **kwargs):
            raise RuntimeError("export refused for the test")

        monkeypatch.setattr(trace_mod, "_export", refuse)
    model = torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1), torch.nn.AvgPool2d(2),
                                torch.nn.AdaptiveAvgPool2d(1))
    traced = trace_model(model, (torch.randn(2, 4, 8, 8),))
    assert traced.tracer == ("fx" if force_fx else "export")
    flops = [n.flops for n in traced.graph.nodes if not n.is_input and n.flops]
    assert flops == [2 * 4 * 8 * 8 * 9, 2 * 4 * 4 * 4 * 4, 2 * 4 * 4 * 4]


class _PoolUnpool(torch.nn.Module):
    def forward(self, x):
        y, indices = torch.nn.functional.max_pool2d(x, [2], return_indices=True)
        return torch.nn.functional.max_unpool2d(y, indices, 2), torch.nn.functional.lp_pool2d(
            x, 2.0, 2)


@pytest.mark.parametrize("force_fx", [False, True])
def test_ops_named_like_pools_that_are_not_windows_count_nothing_and_still_trace(monkeypatch,
                                                                                 force_fx):
    # max_unpool2d's second argument is the indices, lp_pool2d's the norm: neither is a kernel.
    # A one-element kernel list stands for every spatial dimension.
    if force_fx:
        def refuse(*args, **kwargs):
            raise RuntimeError("export refused for the test")

        monkeypatch.setattr(trace_mod, "_export", refuse)
        model = torch.nn.Sequential(torch.nn.LPPool2d(2.0, 2), torch.nn.MaxPool2d([2]))
    else:
        model = _PoolUnpool()
    traced = trace_model(model, (torch.randn(1, 2, 8, 8),))
    flops = {n.targets[0].split(".")[-2] if "." in n.targets[0] else n.name: n.flops
             for n in traced.graph.nodes if not n.is_input}
    if force_fx:
        assert traced.tracer == "fx"
        assert sorted(flops.values()) == [0.0, 2 * 2 * 2 * 4.0]
    else:
        assert flops["max_pool2d_with_indices"] == 1 * 2 * 4 * 4 * 4
        assert flops["max_unpool2d"] == 0


def test_an_op_that_holds_more_than_its_output_records_the_excess_as_workspace():
    # max_pool2d runs as max_pool2d_with_indices and drops the int64 indices: on a 2x8x16x16
    # float input with stride 1 and padding 1 the output is 16 KiB and the indices 32 KiB, held
    # while the op runs. A view (flatten) and a plain relu hold nothing beyond their output.
    class Pool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.max_pool2d(x.relu(), 3, 1, 1).flatten(1)

    traced = trace_model(Pool(), (torch.randn(2, 8, 16, 16),))
    workspace = {n.name: n.workspace_bytes for n in traced.graph.nodes if not n.is_input}
    assert workspace["max_pool2d"] == 2 * 8 * 16 * 16 * 8
    assert workspace["relu"] == workspace["flatten"] == 0


def test_export_records_no_stack_traces_and_restores_the_switch() -> None:
    # A stack trace per node is about a fifth of exporting a large model, and nothing reads them.
    before = torch.fx.config.do_not_emit_stack_traces
    gm = trace_mod._export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()),
                 (torch.randn(2, 4),), {})
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert ops and all(not n.meta.get("stack_trace") for n in ops)
    assert torch.fx.config.do_not_emit_stack_traces == before


def test_repeated_ops_are_counted_once_and_as_if_counted_afresh(monkeypatch) -> None:
    # Two identical blocks share their counts; two convolutions that differ only in stride (a
    # non-tensor argument) and an add of a tensor to itself (shared storage) do not.
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Conv2d(3, 3, 3, padding=1)
            self.b = torch.nn.Conv2d(3, 3, 3, padding=1)
            self.c = torch.nn.Conv2d(3, 3, 3, stride=2, padding=1)

        def forward(self, x):
            y = self.b(self.a(x))
            return self.c(y) + 1, y + y, y + x

    gm = trace_mod._export(Net(), (torch.randn(1, 3, 8, 8),), {})
    inputs = (torch.randn(1, 3, 8, 8),)
    memo = trace_count.count_ops(gm, inputs, {}, device="cpu")
    monkeypatch.setattr(trace_count.CountingInterpreter, "signature", lambda self, n: None)
    fresh = trace_count.count_ops(gm, inputs, {}, device="cpu")
    assert memo.flops == fresh.flops and memo.transient_bytes == fresh.transient_bytes
    convs = [n for n in gm.graph.nodes if "conv" in str(n.target)]
    assert len({memo.flops[n.name] for n in convs}) == 2  # stride 2 does a quarter of the work
    assert len(memo.seen) < sum(1 for n in gm.graph.nodes if n.op == "call_function")
