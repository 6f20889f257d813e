"""What a training step is priced at where it was measured (``train.updates``): the optimizer's
update through torch.optim (``profile.update``), in place of the roofline, and the whole
forward pass with autograd recording (``profile.backward``), which the forward nodes are scaled
to.

The model is the seed tutorial's MLP (784-256-128-10, 235,146 float32 parameters: 940,584
trainable bytes in three linear layers) with a cross-entropy loss, on a batch of 64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from zoo import MLP

from autoplace.cluster import resolve_cluster
from autoplace.config import Config, Cost, Emit, Solve, Training
from autoplace.fold import fold
from autoplace.ir import Problem
from autoplace.profile.cost import costs as cost_nodes
from autoplace.profile.update import measure_update_s_per_byte
from autoplace.solve.whatif import restrict
from autoplace.trace import trace_model
from autoplace.train import LossModel, step_problem
from autoplace.train.dataparallel import with_allreduce
from autoplace.train.updates import with_measured_forward, with_measured_updates

BATCH = 64
TRAINED_BYTES = (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10) * 4


def _loss_model() -> tuple[LossModel, tuple, dict]:
    torch.manual_seed(0)
    return (LossModel(MLP(), F.cross_entropy), (torch.randn(BATCH, 784),),
            {"targets": (torch.randint(0, 10, (BATCH,)),)})


def _forward() -> Problem:
    model, args, kwargs = _loss_model()
    traced = trace_model(model, args, kwargs)
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    folded = fold(traced.graph, cost_nodes(traced.graph, cluster))
    return Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)


def test_the_forward_nodes_add_up_to_the_whole_forward_measured_and_the_backward_follows(
        ) -> None:
    from autoplace.profile.backward import measure_training_passes

    model, args, kwargs = _loss_model()
    passes = measure_training_passes(model, args, kwargs, "cpu:0")
    assert 0 < passes.forward_s < 1.0 and 0.25 <= passes.backward_factor < 6.0
    forward = _forward()
    names = [n.name for n in forward.graph.nodes]
    sum_s = sum(forward.costs.of(n, "cpu:0") for n in names)
    scaled = with_measured_forward(forward, {"cpu:0": 2 * sum_s})
    for name in names:
        assert scaled.costs.of(name, "cpu:0") == pytest.approx(2 * forward.costs.of(name, "cpu:0"))
        assert scaled.costs.of(name, "cpu:1") == forward.costs.of(name, "cpu:1")
    busy = next(n for n in names if forward.costs.of(n, "cpu:0") > 0)
    assert scaled.costs.source_of(busy, "cpu:0") == "calibrated"
    step, plain = (step_problem(p, "adam", backward_factor={"cpu:0": 1.5})
                   for p in (scaled, forward))
    assert step.costs.of(f"{busy}@backward", "cpu:0") == pytest.approx(
        2 * plain.costs.of(f"{busy}@backward", "cpu:0"))
    assert with_measured_forward(forward, {}) is forward
    quick = with_measured_forward(forward, {"cpu:0": 1e-12})  # under the launches: within
    assert all(per["cpu:0"] <= quick.costs.of(name, "cpu:0")
               for name, per in quick.costs.host.launch_s.items())


def _step(*, on: tuple[str, ...] | None = None) -> Problem:
    """The MLP's Adam step on two CPU workers (``on``: restricted to those, as a replica's)."""
    model, args, kwargs = _loss_model()
    traced = trace_model(model, args, kwargs)
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    folded = fold(traced.graph, cost_nodes(traced.graph, cluster))
    forward = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    return step_problem(forward if on is None else restrict(forward, on), "adam")


def test_the_update_is_measured_after_a_forward_and_backward_per_trainable_byte() -> None:
    model, args, kwargs = _loss_model()
    before = [p.detach().clone() for p in model.parameters()]
    rate = measure_update_s_per_byte(model, args, kwargs, optimizer="adam",
                                     torch_device="cpu:0")
    # Adam moves at least 28 bytes a parameter, 7 a trainable byte: well under 1 TB/s here,
    # and more than a second for 1 MB would be a runaway.
    assert 7 / 1e12 < rate < 1.0 / TRAINED_BYTES
    for a, b in zip(before, model.parameters()):  # a copy was trained, not the model
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
    for p in model.parameters():
        p.requires_grad_(False)
    assert measure_update_s_per_byte(model, args, kwargs, optimizer="adam",
                                     torch_device="cpu:0") is None


def test_a_measured_update_replaces_the_roofline_where_measured() -> None:
    step = _step()
    updates = [n.name for n in step.graph.nodes if n.name.endswith("@step")]
    assert len(updates) == 3
    measured = with_measured_updates(step, {"cpu:0": 1e-9})
    trained = {n.name: n.trainable_bytes for n in step.graph.nodes}
    assert sum(trained[u.removesuffix("@step")] for u in updates) == TRAINED_BYTES
    for name in updates:
        assert measured.costs.of(name, "cpu:0") == pytest.approx(
            1e-9 * trained[name.removesuffix("@step")])
        assert measured.costs.of(name, "cpu:1") == step.costs.of(name, "cpu:1")
        assert measured.costs.source_of(name, "cpu:0") == "calibrated"
        assert measured.costs.source_of(name, "cpu:1") == step.costs.source_of(name, "cpu:1")
    others = [n.name for n in step.graph.nodes if not n.name.endswith("@step")]
    assert all(measured.costs.compute_s[n] == step.costs.compute_s[n] for n in others)
    assert with_measured_updates(step, {}) is step


def test_an_update_measured_faster_than_its_launches_launches_within_its_time() -> None:
    """A tensor too small for its share of the measured update (T5's norms: bytes x the rate
    under the launches the roofline priced) launches within its time, as a backward node does:
    the problem is valid, and elsewhere the launches stay as priced."""
    step = _step()
    host = step.costs.host
    assert host is not None and any(n.endswith("@step") for n in host.launch_s)
    measured = with_measured_updates(step, {"cpu:0": 1e-18})  # a Problem checks its costs
    for name, per in measured.costs.host.launch_s.items():
        if name.endswith("@step"):
            assert per["cpu:0"] == measured.costs.of(name, "cpu:0") < host.launch_s[name]["cpu:0"]
            assert per["cpu:1"] == host.launch_s[name]["cpu:1"]


def test_the_all_reduce_is_added_to_the_measured_update() -> None:
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    groups = [("cpu:0",), ("cpu:1",)]
    restricted = _step(on=groups[0])
    measured = with_measured_updates(restricted, {"cpu:0": 1e-9})
    both = with_allreduce(measured, cluster, groups)
    alone = with_allreduce(restricted, cluster, groups)
    name = next(n.name for n in restricted.graph.nodes if n.name.endswith("@step"))
    # The same all-reduce on top of either price of the update.
    assert both.costs.of(name, "cpu:0") - measured.costs.of(name, "cpu:0") == pytest.approx(
        alone.costs.of(name, "cpu:0") - restricted.costs.of(name, "cpu:0"))


def test_a_profiled_plan_charges_the_update_measured_and_says_so(tmp_path) -> None:
    from autoplace.pipeline import plan
    from autoplace.profile import open_cache

    model, args, kwargs = _loss_model()
    planned = plan(
        model.model,
        args,
        Config(
            devices="2xcpu-thread",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False, min_gain=0.0),
            cost=Cost(profile=True, cache=open_cache(path=str(tmp_path / "c.sqlite3"))),
            training=Training(optimizer="adam", replicas=2),
            emit=Emit(model=False),
        ),
        loss=F.cross_entropy,
        example_targets=kwargs["targets"],
    ).plan
    (note,) = [n for n in planned.notes if n.startswith("adam update measured")]
    assert any(n.startswith("forward measured whole, with autograd recording: ")
               for n in planned.notes)
    assert f"for all {TRAINED_BYTES} trainable bytes on cpu:0" in note
    graph, costs = planned.problem.graph, planned.problem.costs
    updates = [n.name for n in graph.nodes if n.name.endswith("@step")]
    assert updates and all(costs.source_of(u, "cpu:0") == "calibrated" for u in updates)
    # The replicas' averaging measured as two gloo processes of this host (profile.allreduce),
    # and kept in the cache: asked again, it is read back.
    from autoplace.profile.allreduce import allreduce_s

    (said,) = [n for n in planned.notes if n.startswith("gradients averaged across 2 replicas")]
    numels = [p.numel() for p in model.parameters()]
    cache = open_cache(path=str(tmp_path / "c.sqlite3"))
    key = planned.profile.devices[0]["device_key"]
    seconds, cached = allreduce_s(numels, replicas=2, mode="ddp", cache=cache, device_key=key)
    assert cached and 0 < seconds < 1.0 and f"{seconds * 1e3:.3f} ms a step" in said


def test_a_measured_averaging_is_shared_among_the_updates_by_bytes() -> None:
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    groups = [("cpu:0",), ("cpu:1",)]
    one = _step(on=groups[0])
    two = with_allreduce(one, cluster, groups, measured_s=3e-3)
    updates = [n.name for n in one.graph.nodes if n.name.endswith("@step")]
    added = {u: two.costs.of(u, "cpu:0") - one.costs.of(u, "cpu:0") for u in updates}
    assert sum(added.values()) == pytest.approx(3e-3)  # the whole step's averaging, once
    first = "linear@step"  # 784 x 256 + 256 of the 235,146 parameters
    assert added[first] == pytest.approx(3e-3 * (784 * 256 + 256) * 4 / TRAINED_BYTES)
    for node in one.graph.nodes:  # nothing else pays
        if node.name not in added:
            assert two.costs.of(node.name, "cpu:0") == one.costs.of(node.name, "cpu:0")


def test_the_updates_follow_the_whole_backward_one_after_another() -> None:
    from autoplace.ir import Placement
    from autoplace.simulate import simulate
    from autoplace.simulate.schedules import phase_of
    from autoplace.train.updates import after_backward

    step = _step()
    # the first layer (and its backward and update) on cpu:0, the rest on cpu:1: without the
    # ordering, cpu:1's updates run beside cpu:0's backward
    first = {n.name for n in step.graph.nodes if phase_of(n.name)[0] == "linear"}
    placement = Placement(device_of={n.name: "cpu:0" if n.name in first else "cpu:1"
                                     for n in step.graph.nodes})
    loose, ordered = (simulate(p, placement) for p in (step, after_backward(step)))
    updates = [n.name for n in step.graph.nodes if phase_of(n.name)[1] == "step"]
    backward = [n.name for n in step.graph.nodes if phase_of(n.name)[1] == "backward"]
    assert len(updates) == 3
    done = max(ordered.end_s[b] for b in backward)
    assert min(loose.start_s[u] for u in updates) < max(loose.end_s[b] for b in backward)
    assert all(ordered.start_s[u] >= done for u in updates)
    spans = sorted((ordered.start_s[u], ordered.end_s[u]) for u in updates)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never two at once
    assert ordered.makespan_s >= done + sum(step.costs.of(u, placement.device_of[u])
                                            for u in updates)
    assert ordered.makespan_s > loose.makespan_s
