"""Sharded data parallelism in the planner (``train.sharded``): FSDP2's units found in the traced
graph, and one replica's step priced and sized as ``fully_shard`` runs it (ZeRO-3)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import zoo
from test_train import MLP, WithLoss, _forward_problem
from torch import nn

from autoplace.cluster import resolve_cluster
from autoplace.ir import Placement, Problem
from autoplace.profile.cost import costs as cost_nodes
from autoplace.simulate import simulate
from autoplace.solve.whatif import restrict
from autoplace.train import step_problem
from autoplace.train.dataparallel import replica_groups, with_allreduce
from autoplace.train.sharded import fsdp_units, unit_of, with_fsdp
from cost_models import LINK_CATALOG, ring_allgather_s, ring_allreduce_s

FC1 = 784 * 256 * 4 + 256 * 4
FC2 = 256 * 128 * 4 + 128 * 4
FC3 = 128 * 10 * 4 + 10 * 4


def test_a_unit_is_a_block_of_a_list_or_a_leaf_module() -> None:
    assert unit_of("model.transformer.h.3.attn.c_attn") == "model.transformer.h.3"
    assert unit_of("model.0") == "model.0"
    assert unit_of("model.transformer.wte") == "model.transformer.wte"
    assert unit_of("") is None


class Tied(nn.Module):
    """An embedding whose weight the output layer reads again, between two linear blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = torch.relu(block(h))
        return F.cross_entropy(h @ self.embed.weight.t(), y)


def test_units_hold_parameters_and_a_shared_weight_goes_to_the_root() -> None:
    mlp = step_problem(_forward_problem(WithLoss(MLP()), "cpu"), "adam")
    units = fsdp_units(mlp.graph)
    assert {u for u in units.values()} == {"model.fc1", "model.fc2", "model.fc3", None}
    assert units["relu"] is None  # the functional relu's module holds no parameter
    assert not any(name.endswith(("@backward", "@step")) for name in units)

    from autoplace.cluster import resolve_cluster as resolve
    from autoplace.fold import fold
    from autoplace.ir import Problem
    from autoplace.profile.cost import costs
    from autoplace.trace import trace_model

    torch.manual_seed(0)
    traced = trace_model(Tied(), (torch.randint(0, 50, (4,)), torch.randint(0, 50, (4,))), {})
    cluster, _ = resolve(spec="cpu")
    folded = fold(traced.graph, costs(traced.graph, cluster))
    tied = fsdp_units(Problem(graph=folded.graph, cluster=cluster, costs=folded.costs).graph)
    kept = {u for u in tied.values() if u is not None}
    assert kept == {"blocks.0", "blocks.1"}  # the embedding shares its weight: the root's


def test_each_reader_of_a_tied_weight_holds_its_gradient_and_the_owner_autograd_s_sum() -> None:
    from autoplace.cluster import resolve_cluster as resolve
    from autoplace.fold import fold
    from autoplace.ir import Problem
    from autoplace.profile.cost import costs
    from autoplace.trace import trace_model

    torch.manual_seed(0)
    traced = trace_model(Tied(), (torch.randint(0, 50, (4,)), torch.randint(0, 50, (4,))), {})
    cluster, _ = resolve(spec="cpu")
    folded = fold(traced.graph, costs(traced.graph, cluster))
    forward = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    assert forward.graph.colocate == (("embedding", "t"),)
    step = step_problem(forward, "adam").graph
    weight = 50 * 16 * 4
    # t (the output layer's read, first in the backward) makes a gradient of the whole weight;
    # the embedding's backward makes its own and adds it to t's out of place: the sum is new
    assert step.node("t@backward").workspace_bytes == weight
    assert step.node("embedding@backward").workspace_bytes == weight + weight


def _replica_steps(devices: str = "2xA100-40GB"):
    cluster, _ = resolve_cluster(spec=devices)
    forward = _forward_problem(WithLoss(MLP()), devices)
    groups = replica_groups(cluster, 2)
    one = restrict(step_problem(dataclasses.replace(forward, cluster=cluster), "adam"),
                   groups[0])
    return one, with_fsdp(one, cluster, groups), with_allreduce(one, cluster, groups), cluster


def test_fsdp_shards_parameters_gradients_and_state_and_holds_a_unit_while_it_runs() -> None:
    one, sharded, _, _ = _replica_steps()
    node = {n.name: n for n in one.graph.nodes}
    shard = {n.name: n for n in sharded.graph.nodes}
    assert shard["linear"].param_bytes == math.ceil(FC1 / 2)
    # its unsharded parameters and the all-gather's buffer they are copied out of
    assert shard["linear"].workspace_bytes == node["linear"].workspace_bytes + 2 * FC1
    # backward: the unit regathered and its unsharded gradients (its own node's counted
    # already), or their reduce-scatter input once the parameters are freed, and the next
    # unit's parameters prefetched
    assert shard["linear_1@backward"].workspace_bytes == (
        node["linear_1@backward"].workspace_bytes + 2 * FC2 - FC2 + FC1)  # fc1 prefetched
    # fc1 is the last unit in the backward, none after it; it reads the input, which needs no
    # gradient, so its post-backward waits for the root's final callback: its parameters and
    # gradients beside the last all-gather's buffer (at most the largest unit's, fc1's)
    assert shard["linear@backward"].workspace_bytes == 3 * FC1
    # Adam: gradients and two moments, 1/2 each
    assert shard["linear@step"].param_bytes == math.ceil(FC1 / 2) + math.ceil(2 * FC1 / 2)
    # everything counted once: the replica's resident bytes are about half DDP's
    resident = sum(n.param_bytes for n in sharded.graph.nodes)
    assert resident == pytest.approx(sum(n.param_bytes for n in one.graph.nodes) / 2, rel=1e-4)


def test_the_root_reduce_scatters_last_and_gloo_reduces_a_copy_of_its_input() -> None:
    # ProcessGroupGloo's reduce_scatter_tensor reduces a copy of its input: measured under
    # FSDPMemTracker, a 31.25 MiB embedding's post-backward held 1.5x it in temporaries (the
    # copy and the shard it returns)
    from autoplace.trace import trace_model

    torch.manual_seed(0)
    traced = trace_model(RootLogits(50, 16), (torch.randint(0, 50, (4,)),
                                              torch.randint(0, 50, (4,))), {})
    weight = 50 * 16 * 4  # the embedding's and the root's output weight's
    ends = {}
    for devices in ("2xA100-40GB", "2xcpu-thread"):
        cluster, _ = resolve_cluster(spec=devices)
        graph = traced.graph
        forward = Problem(graph=graph, cluster=cluster, costs=cost_nodes(graph, cluster))
        groups = replica_groups(cluster, 2)
        one = restrict(step_problem(forward, "adam"), groups[0])
        ends[devices] = with_fsdp(one, cluster, groups).graph.node("embedding@backward")
    # the root's gradients and their reduce-scatter input (and gloo's copy), while the
    # embedding unit (its post-backward waits) holds its parameters and gradients, beside the
    # last all-gather's buffer (at most the largest unit's: the embedding's); less the root's
    # parameters, counted whole through the step and freed as the root reshards
    assert ends["2xA100-40GB"].workspace_bytes == weight + 2 * weight + 2 * weight - weight
    assert ends["2xcpu-thread"].workspace_bytes == weight + 3 * weight + 2 * weight - weight


def test_fsdp_pays_two_all_gathers_and_a_reduce_scatter_and_updates_a_shard() -> None:
    one, sharded, ddp, cluster = _replica_steps()
    link = cluster.link("cuda:0", "cuda:1")

    def gather(nbytes: int) -> float:
        return ring_allgather_s(nbytes, 2, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                                latency_s=link.latency_s)

    def added(name: str) -> float:
        return sharded.costs.of(name, "cuda:0") - one.costs.of(name, "cuda:0")

    units = fsdp_units(one.graph)
    fc1 = [name for name, unit in units.items() if unit == "model.fc1"]
    assert "linear" in fc1  # with torch.export's guard node, which runs first
    assert sum(added(name) for name in fc1) == pytest.approx(gather(FC1))
    assert added("linear@backward") == pytest.approx(gather(FC1))
    step = one.costs.of("linear@step", "cuda:0")
    launch = one.costs.host.launch_of("linear@step", "cuda:0")
    assert launch > 0  # a GPU's kernel launch, which sharding does not shorten
    assert sharded.costs.of("linear@step", "cuda:0") == pytest.approx(
        launch + (step - launch) / 2 + gather(FC1))
    assert gather(FC1) == pytest.approx(ring_allreduce_s(
        FC1, 2, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s) / 2)
    # Moved in all: 1.5x DDP's all-reduce (ZeRO, section 7.2), bar latencies.
    moved = sum(sharded.costs.of(n.name, "cuda:0") - one.costs.of(n.name, "cuda:0")
                for n in one.graph.nodes if not n.name.endswith("@step"))
    assert moved == pytest.approx(2 * (gather(FC1) + gather(FC2) + gather(FC3)))


def test_on_cpu_processes_the_collectives_go_through_gloo_over_loopback() -> None:
    one, sharded, _, _ = _replica_steps("2xcpu-thread")
    loopback = LINK_CATALOG["gloo-loopback"]
    expected = ring_allgather_s(FC1, 2, bandwidth_bytes_per_s=loopback.bandwidth_bytes_per_s,
                                latency_s=loopback.latency_s)
    added = sum(sharded.costs.of(n.name, "cpu:0") - one.costs.of(n.name, "cpu:0")
                for n in one.graph.nodes if not n.name.endswith(("@backward", "@step")))
    assert added == pytest.approx(expected + sum(
        ring_allgather_s(b, 2, bandwidth_bytes_per_s=loopback.bandwidth_bytes_per_s,
                         latency_s=loopback.latency_s) for b in (FC2, FC3)))


def test_the_simulated_peak_drops_by_what_is_sharded() -> None:
    one, sharded, ddp, _ = _replica_steps()
    device = one.cluster.names[0]

    def peak(problem) -> int:
        placed = Placement(device_of={n.name: device for n in problem.graph.nodes})
        return simulate(problem, placed).peak_bytes[device]

    total = FC1 + FC2 + FC3
    # DDP holds parameters, gradients and two moments whole (16 bytes a parameter)...
    assert peak(ddp) >= 4 * total
    # ...FSDP a quarter of them resident, with at most two units and their gradients unsharded
    assert peak(sharded) < peak(ddp) - total
    with pytest.raises(ValueError, match="one device each"):
        cluster, _ = resolve_cluster(spec="4xA100-40GB")
        with_fsdp(one, cluster, replica_groups(cluster, 2))


# --- emitted: a segment per unit, trained under FSDP2 by torchrun ------------------------------


def _traced_mlp():
    from autoplace.trace import trace_model
    from autoplace.train import LossModel

    torch.manual_seed(0)
    batch = torch.randn(8, 784), torch.randint(0, 10, (8,))
    model = LossModel(MLP(), lambda out, t: F.cross_entropy(out, t))
    return model, trace_model(model, (batch[0],), {"targets": (batch[1],)}), batch


def _op_units(traced) -> dict[str, str]:
    units = fsdp_units(traced.graph)
    return {op: u for n in traced.graph.nodes if (u := units.get(n.name)) for op in n.ops}


def _on_cpu(traced) -> dict[str, str]:
    return {n.name: "cpu" for n in traced.module.graph.nodes if n.op == "call_function"}


def test_the_emitter_cuts_a_segment_per_unit_and_saves_it(tmp_path) -> None:
    from autoplace.emit import emit_model, load_model, save_model

    _, traced, _ = _traced_mlp()
    whole = emit_model(traced.module, _on_cpu(traced))
    assert len(whole.segment_info) == 1 and whole.segment_info[0].unit is None
    cut = emit_model(traced.module, _on_cpu(traced), units=_op_units(traced))
    assert [s.unit for s in cut.segment_info] == ["model.fc1", "model.fc2", "model.fc3"]
    assert [name for name, _ in cut.seg1.named_parameters()] == ["model.fc2.weight",
                                                                  "model.fc2.bias"]
    save_model(cut, tmp_path)
    assert [s.unit for s in load_model(tmp_path).segment_info] == [s.unit for s in
                                                                   cut.segment_info]


def test_a_tensor_two_units_read_is_refused_as_a_units_bug() -> None:
    from autoplace.emit import emit_model
    from autoplace.errors import EmitError
    from autoplace.trace import trace_model

    torch.manual_seed(0)
    traced = trace_model(Tied(), (torch.randint(0, 50, (4,)), torch.randint(0, 50, (4,))), {})
    wrong = {op: unit_of(n.module) for n in traced.graph.nodes if unit_of(n.module)
             for op in n.ops}  # the embedding kept as a unit although the output reads it
    with pytest.raises(EmitError, match="embed.weight is held by FSDP unit .* two units share"):
        emit_model(traced.module, _on_cpu(traced), units=wrong)
    right = {op: u for n in traced.graph.nodes if (u := fsdp_units(traced.graph).get(n.name))
             for op in n.ops}
    units = [s.unit for s in emit_model(traced.module, _on_cpu(traced),
                                        units=right).segment_info]
    assert set(units) == {None, "blocks.0", "blocks.1"}


def test_fsdp_replicas_train_as_the_original_does() -> None:
    from autoplace.emit import emit_model
    from autoplace.emit.distributed.replicas import verify_replicas

    model, traced, (x, y) = _traced_mlp()
    emitted = emit_model(traced.module, _on_cpu(traced), units=_op_units(traced))
    check = verify_replicas(emitted, model, (x,), {}, (y,), optimizer="adam", replicas=2,
                            sharding="fsdp")
    assert check["status"] == "passed" and check["steps"] == 3
    assert check["losses"] == pytest.approx(check["original_losses"], rel=1e-5)
    assert check["losses"][2] < check["losses"][0]


# --- planned: auto shards for memory, on always; checked and saved -----------------------------


def _mlp_plan(memory_bytes: int | None = None, **training):
    import sys
    from pathlib import Path

    from autoplace.config import Config, Cost, Training
    from autoplace.pipeline import plan

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import mlp

    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    if memory_bytes is not None:
        cluster = dataclasses.replace(cluster, devices=tuple(
            dataclasses.replace(d, memory_bytes=memory_bytes) for d in cluster.devices))
    model, inputs = mlp.build()
    return plan(model, inputs, Config(devices=cluster, mode="training",
                                      cost=Cost(profile=False), training=Training(**training)),
                loss=mlp.loss, example_targets=mlp.example_targets)


def test_auto_shards_where_whole_replicas_do_not_fit_and_the_shards_train_as_the_original(
        tmp_path) -> None:
    from autoplace.pipeline import save

    planned = _mlp_plan(4_600_000)  # whole, a replica needs 16 bytes a parameter and more
    training = planned.plan.training
    assert (training.replicas, training.sharding) == (2, "fsdp")
    options = {(o.replicas, o.sharding): o for o in training.replica_options}
    assert not options[1, "ddp"].fits and not options[2, "ddp"].fits
    assert options[2, "fsdp"].fits and planned.plan.schedule.feasible
    assert max(planned.plan.schedule.peak_bytes.values()) <= 4_600_000
    assert training.check.status == "passed" and training.check.replicas == 2
    assert training.check.memory_status == "within"  # rank 0, by FSDPMemTracker
    assert training.check.peak_method == "FSDPMemTracker"
    measured = training.check.peak_bytes["cpu:0"]
    assert 0 < measured["measured_bytes"] <= measured["predicted_bytes"]
    assert [s.unit for s in planned.model.segment_info] == ["model.0", "model.2", "model.4"]
    assert planned.plan.to_dict()["training"]["sharding"] == "fsdp"
    save(planned, tmp_path / "out")
    assert "SHARDING = 'fsdp'" in (tmp_path / "out" / "train.py").read_text()
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.startswith("Train 2 sharded (FSDP2, ZeRO-3) data-parallel replicas")
    assert "2 replicas (FSDP2, ZeRO-3), layers in train(); training" in summary


def test_a_replica_whose_devices_cannot_hold_the_state_is_not_traced(monkeypatch) -> None:
    # 2 devices of 800 kB: four 128 x 128 layers' parameters, gradients and Adam state
    # (1.06 MB) fit the two together (R=1), never one (R=2): that replica is refused untraced
    import autoplace.pipeline.step as step
    from autoplace.config import Config, Cost, Training
    from autoplace.pipeline import plan

    traced = []

    def counting(model, args, kwargs, cluster, how):
        traced.append(args[0].shape[0])
        return real(model, args, kwargs, cluster, how)

    real = step.traced_problem
    monkeypatch.setattr(step, "traced_problem", counting)
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    cluster = dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=800_000) for d in cluster.devices))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(128, 128) for _ in range(4)))
    x, y = torch.randn(8, 128), torch.randint(0, 128, (8,))
    planned = plan(model, (x,), Config(devices=cluster, mode="training", cost=Cost(
        profile=False), training=Training(fsdp="off")), loss=F.cross_entropy,
        example_targets=(y,))
    assert traced == [8]  # R=1's whole batch only
    options = {o.replicas: o for o in planned.plan.training.replica_options}
    assert options[1].fits and not options[2].fits and options[2].step_s is None
    assert any("R=2 (up to 1 device each) fits no device" in n for n in planned.plan.notes)


def test_auto_does_not_weigh_sharding_where_whole_replicas_fit() -> None:
    from autoplace.errors import InfeasibleError

    planned = _mlp_plan()
    options = planned.plan.training.replica_options
    assert {o.sharding for o in options} == {"ddp"}
    assert "sharding" not in planned.plan.to_dict()["training"]["replica_options"][0]
    with pytest.raises(InfeasibleError):  # what auto found above, refused
        _mlp_plan(4_600_000, fsdp="off")


@pytest.mark.parametrize(("training", "flag_says"), [
    ({"fsdp": "on", "replicas": 1}, "--fsdp on shards the model over data-parallel replicas"),
    ({"fsdp": "on", "microbatches": 2}, "--fsdp on with micro-batches is not built yet"),
])
def test_fsdp_asked_where_it_cannot_be_is_a_config_error(training, flag_says) -> None:
    """Refused for the plan's replicas; with a mesh's dp (``--tp N --dp D``) ``--fsdp on`` is
    the mesh's sharding over dp, and the replicas and micro-batches are the placement's."""
    from autoplace.cli.flags import FLAGS
    from autoplace.config import Config, Parallel, Training
    from autoplace.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        Config(mode="training", training=Training(**training))
    assert caught.value.render(FLAGS).startswith(flag_says)
    Config(mode="training", training=Training(**training), parallel=Parallel(tp=2, dp=2))


def test_fsdp_on_with_replicas_of_several_devices_says_what_would_shard(tmp_path) -> None:
    from autoplace.cli import main

    code = main(["plan", str(Path(__file__).parent.parent / "examples" / "mlp.py"),
                 "--devices", "4xcpu-thread", "--mode", "training", "--fsdp", "on",
                 "--replicas", "2", "--no-profile", "--out", str(tmp_path / "out")])
    assert code == 2
    assert not (tmp_path / "out").exists()


def test_a_model_on_the_meta_device_plans_for_training_sharded_and_is_not_emitted() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from autoplace.config import Config, Training
    from autoplace.pipeline import plan

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (2, 16), device="meta")
    planned = plan(model, {"input_ids": ids, "labels": ids},
                   Config(devices="2xA100-40GB", mode="training", training=Training(fsdp="on")))
    training = planned.plan.training
    assert (training.replicas, training.sharding) == (2, "fsdp")
    assert planned.model is None and training.check.status == "skipped"
    notes = " ".join(planned.plan.notes)
    assert "not checked: the model is on the meta device" in notes
    assert "not emitted: the parameters are on the meta device" in notes
    whole = sum(p.numel() * 4 for p in model.parameters())
    resident = sum(n.param_bytes for n in planned.plan.problem.graph.nodes
                   if "@" not in n.name)
    assert resident == pytest.approx(whole / 2, rel=0.01)  # every unit's parameters, halved


def test_sharded_replicas_that_do_not_fit_say_what_each_holds() -> None:
    from autoplace.errors import InfeasibleError

    with pytest.raises(InfeasibleError) as caught:
        _mlp_plan(1_500_000, fsdp="on")
    said = str(caught.value)
    assert "Each of 2 sharded replicas (FSDP) holds 1/2" in said
    # 1/2 of the MLP's 940584 bytes of parameters, of gradients, and twice that of Adam state
    assert "beside the 470292 bytes of parameters" in said
    assert "940584 bytes of adam state" in said and "--microbatches" not in said


@pytest.mark.parametrize("fits", [{}, {2: True, 4: True}, {2: False, 4: True},
                                  {2: False, 4: False}])
def test_fsdp_auto_candidates_share_the_time_limit_with_the_whole_replicas(fits) -> None:
    """--fsdp auto solves the whole replicas first, and a sharded step only for a count whose
    whole replicas do not fit: whatever runs, the solves together stay within the limit."""
    from types import SimpleNamespace

    from autoplace.pipeline.replicas import replica_variants, time_share

    counts = [(1, [("a", "b", "c", "d")]), (2, [("a",), ("b",)]), (4, [("a",)] * 4)]
    variants = replica_variants(counts, "auto", 1)
    assert [(r, s) for r, _, s in variants] == [(1, "ddp"), (2, "ddp"), (4, "ddp"),
                                               (2, "fsdp"), (4, "fsdp")]
    found = {(r, "ddp"): (SimpleNamespace(solved=SimpleNamespace(
        schedule=SimpleNamespace(feasible=ok))), []) for r, ok in fits.items()}
    ran = [(r, s) for r, _, s in variants if s == "ddp" or not fits.get(r, False)]
    given = sum(time_share(12.0, variants, s, fsdp="auto", found=found) for _, s in ran)
    assert given <= 12.0 + 1e-9
    assert time_share(12.0, variants, "ddp", fsdp="auto", found=found) == 3.0
    # off and on share evenly among what they solve
    off, on = replica_variants(counts, "off", 1), replica_variants(counts, "on", 1)
    assert time_share(12.0, off, "ddp", fsdp="off", found={}) == 4.0
    assert time_share(12.0, on, "fsdp", fsdp="on", found={}) == 6.0


class TiedLogits(nn.Module):
    """T5's pattern: the logits read the embedding's weight again (the root's, under FSDP);
    with targets, the loss."""

    def __init__(self, vocab: int = 4000, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(2))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.t()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = torch.relu(block(h))
        logits = self.logits(h)
        return logits if y is None else _loss(logits, y)


class RootLogits(TiedLogits):
    """Llama's pattern: an embedding unit, whose post-backward waits for the root's final
    callback (it reads token ids), and an output weight of the root's."""

    def __init__(self, vocab: int = 4000, width: int = 64) -> None:
        super().__init__(vocab, width)
        self.out = nn.Parameter(torch.randn(width, vocab) / 8)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.out


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), y.flatten())


@pytest.mark.parametrize("model", [TiedLogits, RootLogits])
def test_a_sharded_step_s_memory_holds_what_fsdp2_keeps_to_the_end_of_the_backward(
        model) -> None:
    # Both were planned under FSDPMemTracker's measurement before: TiedLogits 4.35 MiB against
    # 5.45 measured, RootLogits 7.88 against 8.36 (T5 and Llama likewise)
    from autoplace.config import Config, Cost, Training
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    x, y = torch.randint(0, 4000, (2, 8)), torch.randint(0, 4000, (2, 8))
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    planned = plan(model(), (x,), Config(devices=cluster, mode="training", cost=Cost(
        profile=False), training=Training(fsdp="on")), example_targets=(y,), loss=_loss)
    check = planned.plan.training.check
    assert check.status == "passed" and check.memory_status == "within"
    peak = check.peak_bytes["cpu:0"]
    # an upper bound, and not a loose one (1.09x and 1.18x when written)
    assert peak["measured_bytes"] <= peak["predicted_bytes"] <= 1.3 * peak["measured_bytes"]


def _blocks_replicas(memory_bytes: int, *, verify: bool = True, dropout: bool = False):
    """4 residual blocks (16 -> 64 -> 16; ``dropout``: each followed by a dropout) on a batch
    of 512 as 2 sharded replicas of one CPU worker each, every worker holding
    ``memory_bytes``: the activations outweigh the parameters, so checkpointing each block is
    what a tight worker needs."""
    from autoplace.config import Config, Cost, Emit, Solve, Training
    from autoplace.pipeline import plan
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    cluster = dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=memory_bytes) for d in cluster.devices))
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (
        (zoo.Block(), nn.Dropout(0.1)) if dropout else (zoo.Block(),))])
    return plan(model, (torch.randn(512, 16),), Config(
        devices=cluster, mode="training", cost=Cost(profile=False), solve=Solve(time_limit_s=1),
        training=Training(fsdp="on", replicas=2), emit=Emit(verify=verify)),
        loss=F.cross_entropy, example_targets=(torch.randint(0, 16, (512,)),))


def test_sharded_replicas_that_fit_only_checkpointing_each_block_do_and_train_so(
        tmp_path) -> None:
    """700 kB a worker: the plain sharded step peaks near 900 kB; with each FSDP2 unit
    checkpointed (torchtitan's per-block activation checkpointing, priced as the mesh's ranks
    are) it fits, and the 2 replicas' 3 steps, every block run twice a step, give the
    original's losses, gradients and parameters."""
    from autoplace.pipeline import save

    roomy = _blocks_replicas(1_000_000, verify=False).plan
    assert roomy.training.recompute == () and max(roomy.schedule.peak_bytes.values()) > 700_000
    planned = _blocks_replicas(700_000)
    training = planned.plan.training
    assert (training.replicas, training.sharding, training.recompute) == (2, "fsdp", ("cpu:0",))
    assert any("@recompute" in n.name for n in planned.plan.problem.graph.nodes)
    assert max(planned.plan.schedule.peak_bytes.values()) <= 700_000
    assert planned.plan.makespan_s > roomy.makespan_s  # the forwards run twice
    assert training.check.status == "passed" and training.check.replicas == 2
    assert any("each FSDP2 unit of the sharded replica is checkpointed" in n
               for n in planned.plan.notes)
    save(planned, tmp_path / "out")
    assert "RECOMPUTE = True" in (tmp_path / "out" / "train.py").read_text()


def test_checkpointed_replicas_recompute_dropout_too_since_checkpoint_replays_its_masks(
        ) -> None:
    """torch.utils.checkpoint restores the generator before it runs a block again, so the
    masks are the forward's: a step with dropout in train() checkpoints its units all the same
    (the placement's micro-batch recomputation does not), and trains as the original."""
    planned = _blocks_replicas(700_000, dropout=True)
    training = planned.plan.training
    assert training.recompute == ("cpu:0",) and training.sharding == "fsdp"
    assert training.layers_mode == "train" and training.check.status == "passed"
    assert not any("no recomputation in train()" in n for n in planned.plan.notes)


def test_sharded_replicas_that_skip_their_checkpoints_fail_the_check(tmp_path,
                                                                     monkeypatch) -> None:
    import os

    from autoplace.emit.distributed.replicas import verify_replicas
    from autoplace.errors import VerificationError

    planned = _blocks_replicas(700_000, verify=False)
    (tmp_path / "sitecustomize.py").write_text(
        "import autoplace.emit.distributed.ddp as ddp\n"
        "ddp.checkpointed = lambda model: []\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    from autoplace.train import loss_model

    torch.manual_seed(0)
    model = nn.Sequential(*[zoo.Block() for _ in range(4)])
    args, targets = (torch.randn(512, 16),), (torch.randint(0, 16, (512,)),)
    wrapped = loss_model(model, F.cross_entropy, args, {}, targets)
    with pytest.raises(VerificationError, match="sharded replicas were to recompute each "
                       "unit's forward in the backward: 0 segments checkpointed ran 0 "
                       "forwards in 3 steps"):
        verify_replicas(planned.model, wrapped, args, {}, targets, optimizer="adam",
                        replicas=2, sharding="fsdp", recompute=True)
