"""Repeated blocks observed once (``solve.repeats``): on fake tensors, a segment whose code and
inputs repeat one already run gives that one's records, and the observation is the one that
runs every segment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoplace.emit.distributed.tensor import column_row
from autoplace.pipeline.tensor import one_device_copy
from autoplace.solve.tensor import observe
from autoplace.trace import trace_model
from autoplace.train import loss_model
from autoplace.train.sharded import fsdp_op_units


def _meta_llama_step(layers: int):
    """A Llama of ``layers`` decoder layers on the meta device and its next-token loss, traced
    for training as a plan traces it, and FSDP2's units of its folded graph (as the mesh
    candidate cuts its segments: several a layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from autoplace.cluster import resolve_cluster
    from autoplace.config import Config, Cost
    from autoplace.pipeline.forward import Tracing, traced_problem

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.train()
    kwargs = {"input_ids": torch.randint(0, 128, (2, 8)).to("meta")}
    targets = (torch.randint(0, 128, (2, 8)).to("meta"),)

    def loss(out, labels):
        return F.cross_entropy(out.logits.reshape(-1, 128), labels.reshape(-1))

    wrapped = loss_model(model, loss, (), kwargs, targets)
    kwargs = {**kwargs, "targets": targets}
    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    forward = traced_problem(wrapped, (), kwargs, cluster, Tracing.of(
        Config(mode="training", cost=Cost(profile=False)), checked=True))
    return forward.traced, fsdp_op_units(forward.problem.graph), kwargs


def test_the_split_of_the_lowered_graph_is_the_one_segment_emission_s() -> None:
    """``column_row`` of the graph segments are cut from names each weight as the one segment
    of the model emitted on one device holds it, with the same splits; renamed, as the
    FSDP2 units' segments hold them."""
    from autoplace.emit.codegen.lower import lower
    from autoplace.pipeline.mesh import renamed

    traced, units, _ = _meta_llama_step(5)
    whole = column_row(one_device_copy(traced))
    assert len(whole) > 30
    assert column_row(lower(traced.module, meta_weights=True)) == whole
    one = one_device_copy(traced, units)
    held = dict(one.named_parameters())
    cut = renamed(whole, one)
    assert len(cut) == len(whole) and set(cut) <= set(held)
    assert len({name.split(".", 1)[0] for name in cut}) > 5  # over the units' segments


def test_each_fsdp2_unit_of_a_llama_is_one_segment() -> None:
    """A unit called twice in a step is gathered twice by FSDP2. The dtype checks export puts
    between blocks (folded into the block before, left to the root) and the rotary ops the
    layers share cut no unit in two."""
    traced, units, _ = _meta_llama_step(4)
    one = one_device_copy(traced, units)
    seen = [info.unit for info in one.segment_info if info.unit is not None]
    assert len(seen) == len(set(seen)), seen
    assert {f"model.model.layers.{i}" for i in range(4)} <= set(seen)


def test_alike_layers_are_observed_once_and_give_what_running_each_gives() -> None:
    from autoplace.pipeline.mesh import renamed

    traced, units, kwargs = _meta_llama_step(6)
    pairs = column_row(one_device_copy(traced))
    seen = {}
    for repeated in (True, False):
        one = one_device_copy(traced, units)
        seen[repeated] = observe(one, renamed(pairs, one), 2, (), kwargs, optimizer="adamw",
                                 repeated=repeated)
        segments = len(one.segment_info)
    once, every = seen[True], seen[False]
    # of 6 layers' segments (one a layer; the last holds the final norm too), those of the
    # periods between the second and the last repeat
    assert every.repeated_segments == 0 and 2 <= once.repeated_segments < segments // 2
    for table in ("share", "param_share", "param_bytes", "output_share", "collectives",
                  "backward_collectives", "on_dtensors"):
        assert getattr(once, table) == getattr(every, table), table
    assert once.trained_bytes == every.trained_bytes
    # every layer's attention all-reduces its rows' sums, in the forward and in the backward
    assert len(every.collectives) >= 10 and len(every.backward_collectives) >= 10


def test_the_repeats_are_the_periods_between_the_second_and_the_last() -> None:
    from autoplace.solve.repeats import periodic

    # a head, 5 layers of 2 segments, a tail: periods 3 and 4 repeat period 2
    assert periodic(["h", "a", "b", "a", "b", "a", "b", "a", "b", "a", "b", "t"]) == {
        5: 3, 6: 4, 7: 3, 8: 4}
    assert periodic(["x"] * 6) == {2: 1, 3: 1, 4: 1}  # one segment a layer
    # fewer than 4 periods, or none: every segment runs
    assert periodic(["h", "a", "b", "a", "b", "a", "b", "t"]) == {}
    assert periodic(["a", "b", "c", "d"]) == {}
    # the longest run wins: 4 x "a" skip 1, 6 x ("b", "c") skip 6
    assert len(periodic(["a"] * 4 + ["b", "c"] * 6)) == 6


def test_real_tensors_run_every_segment() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                                      torch.nn.Linear(64, 16))
                                  for _ in range(3)])
    args, targets = (torch.randn(4, 16),), (torch.randint(0, 16, (4,)),)
    wrapped = loss_model(model, F.cross_entropy, args, {}, targets)
    traced = trace_model(wrapped, args, {"targets": targets})
    one = one_device_copy(traced, fsdp_op_units(traced.graph))
    seen = observe(one, column_row(one), 2, args, {"targets": targets}, optimizer="adamw")
    assert seen.repeated_segments == 0 and seen.seconds


def test_a_repeat_given_other_inputs_than_its_period_says_so() -> None:
    from autoplace.solve.repeats import Repeats, Unlike

    segments = [torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4)))
                for _ in range(5)]
    repeats = Repeats(segments, {})
    assert repeats.template == {2: 1, 3: 1}  # five alike segments: the 3rd and 4th repeat
    runs = [repeats.forward(i, segments[i]) for i in range(5)]
    x = runs[1](runs[0](torch.zeros(2, 4)))
    assert runs[2](x) is x  # the second's outputs, as it was given the same
    assert repeats.repeated == [(1, 2)]
    with pytest.raises(Unlike, match="seg3 repeats seg1"):
        runs[3](torch.zeros(3, 4))  # another batch: not what the second was given
