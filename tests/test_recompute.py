"""Recomputation per stage (``train.recompute``): the step graph of a placement whose devices
run each micro-batch's forward again in its backward instead of keeping its activations."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import zoo
from test_microbatch import _small_threads
from test_schedules import _split
from test_train import MLP, WithLoss, _forward_problem
from torch import nn

from autoplace.cli.flags import FLAGS
from autoplace.cli.run import train_plan
from autoplace.config import Config, Emit, Solve, Training
from autoplace.emit.train.microbatch import action_order, split_batch, train_step
from autoplace.errors import ConfigError, InfeasibleError
from autoplace.ir import Placement
from autoplace.pipeline import plan, save
from autoplace.simulate import simulate, validate
from autoplace.simulate.schedules import phase_of
from autoplace.train import step_problem
from autoplace.train.recompute import recompute_all, recomputed_nodes, with_recompute


@pytest.fixture(scope="module")
def gpipe():
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    return step_problem(forward, "adam", microbatches=4, schedule="gpipe")


def _placed(problem):
    return Placement(device_of=_split(problem, 4))


def _held_after_forwards(schedule, device: str) -> int:
    """The bytes ``device`` holds when its last forward node ends."""
    done = max(schedule.end_s[n] for n, d in schedule.placement.device_of.items()
               if d == device and phase_of(n)[1] == "forward")
    return max(b for t, b in schedule.memory_timeline[device] if t <= done)


def test_no_recomputing_device_leaves_the_step_as_it_was(gpipe) -> None:
    placement = _placed(gpipe)
    assert with_recompute(gpipe, placement, ()) == (gpipe, placement)


def test_a_recomputing_device_holds_less_and_takes_one_more_forward(gpipe) -> None:
    placement = _placed(gpipe)
    a, b = gpipe.cluster.names[:2]
    plain = simulate(gpipe, placement)
    problem, extended = with_recompute(gpipe, placement, [a])
    s = simulate(problem, extended)
    assert validate(problem, s) == []
    again = [n for n in recomputed_nodes(gpipe) if placement.device_of[n] == a]
    assert again and all(placement.device_of[n] == a for n in again)
    for name in again:
        base, _, k = phase_of(name)
        twin = f"{base}@recompute#{k}"
        assert extended.device_of[twin] == a
        assert problem.costs.compute_s[twin] == gpipe.costs.compute_s[name]
    # GPipe holds every micro-batch's activations on a once its forwards are done:
    # recomputing keeps only their inputs (the MLP's peak is Adam's step, not these)
    held = [_held_after_forwards(x, a) for x in (plain, s)]
    assert held[1] < held[0]
    assert s.peak_bytes[a] <= plain.peak_bytes[a]
    assert s.peak_bytes[b] == plain.peak_bytes[b]
    busy = {d: sum(s.end_s[n] - s.start_s[n] for n, dev in extended.device_of.items()
                   if dev == d) for d in (a, b)}
    plain_busy = sum(plain.end_s[n] - plain.start_s[n]
                     for n, dev in placement.device_of.items() if dev == a)
    extra = sum(gpipe.costs.compute_s[n][a] for n in again)
    assert busy[a] == pytest.approx(plain_busy + extra)
    assert s.makespan_s >= plain.makespan_s


def test_recomputation_reads_its_own_device_s_recomputed_values_and_keeps_received_ones(
        gpipe) -> None:
    placement = _placed(gpipe)
    a, b = gpipe.cluster.names[:2]
    problem, extended = with_recompute(gpipe, placement, [a, b])
    device_of = extended.device_of
    for e in problem.graph.edges:
        _, phase, _ = phase_of(e.dst)
        if "@recompute" in e.dst and e.src in device_of:
            if device_of[e.src] == device_of[e.dst]:
                # a value made on the same device is recomputed, unless it needs no gradient
                assert "@recompute" in e.src or e.src not in recomputed_nodes(gpipe)
            else:
                assert phase_of(e.src)[1] == "forward"  # the copy received in the forward
    # every backward reads recomputed values from its own device
    again = set(recomputed_nodes(gpipe))
    for e in problem.graph.edges:
        if phase_of(e.dst)[1] == "backward" and "@recompute" not in e.dst:
            assert not (e.src in again and device_of[e.src] == device_of[e.dst])


def test_recompute_all_needs_no_placement_and_every_placement_of_it_simulates(gpipe) -> None:
    problem = recompute_all(gpipe)
    names = {n.name for n in problem.graph.nodes}
    assert all(f"{phase_of(n)[0]}@recompute#{phase_of(n)[2]}" in names
               for n in recomputed_nodes(gpipe))
    device_of = _split(problem, 4)
    s = simulate(problem, Placement(device_of=device_of))
    assert validate(problem, s) == []


class Deep(nn.Module):
    """Activations outweigh the weights: 1024 samples through 4 layers of 128."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(128, 128),
                                                                     nn.Tanh())],
                                    nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _deep_plan(recompute: str, memory_bytes: int | None = 3_000_000, **extra):
    torch.manual_seed(0)
    x, y = torch.randn(1024, 128), torch.randint(0, 10, (1024,))
    devices = _small_threads(memory_bytes) if memory_bytes else "2xcpu-thread"
    config = Config(devices=devices, mode="training",
                    solve=Solve(time_limit_s=1.5, whatif=False, min_gain=0.0,
                                deterministic=True),
                    training=Training(optimizer="adam", microbatches=4, schedule="gpipe",
                                      recompute=recompute),
                    emit=Emit(**extra))
    return plan(Deep(), (x,), config, loss=lambda out, t: F.cross_entropy(out, t),
                example_targets=(y,))


def test_a_step_that_fits_only_with_recomputation_is_planned_so_and_trains_as_the_original(
        tmp_path) -> None:
    # 3 MB a device: every placement overflows with GPipe's four micro-batches held
    with pytest.raises(InfeasibleError, match="--recompute all"):
        _deep_plan("off", verify=False)
    planned, emitted = _deep_plan("auto")
    assert planned.training.recompute  # some device recomputes
    assert planned.schedule.feasible and validate(planned.problem, planned.schedule) == []
    assert any("@recompute" in n.name for n in planned.problem.graph.nodes)
    assert planned.training.check.status == "passed"
    # never worse than a baseline, each simulated with recomputation where it overflows
    for name, base in planned.baselines.items():
        if base.feasible:
            assert planned.makespan_s <= base.makespan_s * (1 + 1e-9), name
    # the lower bound is the analytic one of the graph without recomputation: below the plan
    assert planned.lower_bound_s <= planned.makespan_s
    save(planned, tmp_path, emitted)
    assert json.loads((tmp_path / "plan.json").read_text())["training"]["recompute"] == list(
        planned.training.recompute)
    assert "recomputing on " + planned.training.recompute[0] in (
        tmp_path / "summary.txt").read_text()
    trained = train_plan(tmp_path, steps=2)
    torch.testing.assert_close(torch.tensor(trained.losses),
                               torch.tensor(planned.training.check.original_losses[:2]))


def test_recompute_auto_keeps_the_plain_step_where_it_fits_and_all_costs_time() -> None:
    plain, _ = _deep_plan("auto", None, verify=False)
    assert plain.training.recompute == ()
    assert not any("@recompute" in n.name for n in plain.problem.graph.nodes)
    every, _ = _deep_plan("all", None, verify=False)
    assert sorted(every.training.recompute) == sorted(set(
        every.schedule.placement.device_of.values()))
    assert every.makespan_s > plain.makespan_s


def test_recompute_needs_micro_batches_and_a_known_choice() -> None:
    with pytest.raises(ConfigError, match=r"training\.microbatches=") as raised:
        Training(microbatches=1, recompute="all")
    assert "--microbatches M" in raised.value.render(FLAGS)  # the command line names its flag
    with pytest.raises(ConfigError, match="auto, off, all"):
        Training(microbatches=2, recompute="sometimes")


def test_a_recomputing_segment_gives_the_gradients_a_keeping_one_does() -> None:
    planned, emitted = _deep_plan("off", None, verify=False)
    model, problem, schedule = emitted, planned.problem, planned.schedule
    torch.manual_seed(0)
    x, y = torch.randn(1024, 128), torch.randint(0, 10, (1024,))
    batches = split_batch((x,), {"targets": (y,)}, 4)
    order = action_order(model, problem, schedule, 4)
    grads = []
    for again in ((), tuple(set(schedule.placement.device_of.values()))):
        model.zero_grad()
        loss = train_step(model, batches, order, "mean", recompute=again)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_emitted_step_holds_less_when_it_recomputes_and_within_the_plan_either_way(
) -> None:
    measured = {}
    for recompute in ("off", "all"):
        check = _deep_plan(recompute, None).plan.training.check
        assert check.memory_status == "within"
        peaks = check.peak_bytes
        assert all(v["measured_bytes"] <= v["predicted_bytes"] for v in peaks.values())
        measured[recompute] = {d: v["measured_bytes"] for d, v in peaks.items()}
    # GPipe's four micro-batches: about 40% less on each device, measured
    assert all(measured["all"][d] < 0.8 * measured["off"][d] for d in measured["off"])


def test_replicas_of_a_recomputing_step_recompute_in_their_processes_too(tmp_path) -> None:
    from test_microbatch import _plan
    from test_train import _mlp

    planned, emitted = _plan(_mlp, 2, "gpipe", replicas=2, recompute="all")
    training = planned.training
    assert training.replicas == 2 and training.recompute
    assert training.check.status == "passed"  # 2 gloo processes against the original
    save(planned, tmp_path, emitted)
    assert f"'recompute': {list(training.recompute)!r}" in (tmp_path / "train.py").read_text()


class Residual(nn.Module):
    """``h`` feeds the last layer directly: split A, B, A, the last segment reads a value its
    own device made."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(64, 64) for _ in range(3))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.head(torch.tanh(self.c(torch.tanh(self.b(h)))) + h)


def test_a_value_from_the_same_device_is_made_again_not_kept_and_the_gradients_agree() -> None:
    from autoplace.emit import emit_model
    from autoplace.emit.check.memory import measure_step
    from autoplace.emit.train.microbatch import Action
    from autoplace.trace import trace_model
    from autoplace.train import LossModel

    torch.manual_seed(0)
    model = LossModel(Residual(), F.cross_entropy)
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
    traced = trace_model(model, (x,), {"targets": (y,)})
    ops = [n.name for n in traced.module.graph.nodes if n.op == "call_function"]
    b = [i for i, op in enumerate(ops) if "linear" in op]
    # a on cpu:0, b on cpu:1, c and the head on cpu:0 again
    device_of = {op: "cpu:1" if b[1] <= i < b[2] else "cpu:0" for i, op in enumerate(ops)}
    emitted = emit_model(traced.module, device_of)
    segments = emitted.segment_info
    assert [s.planned_device for s in segments] == ["cpu:0", "cpu:1", "cpu:0"]
    assert set(segments[0].outputs) & set(segments[2].inputs)  # the residual
    batches = split_batch((x,), {"targets": (y,)}, 4)
    order = ([Action(s, k, "forward") for k in range(4) for s in range(3)]
             + [Action(s, k, "backward") for k in range(4) for s in (2, 1, 0)])
    grads, peaks = [], []
    for again in ((), ("cpu:0", "cpu:1")):
        emitted.zero_grad(set_to_none=True)
        loss = train_step(emitted, batches, order, "mean", threads=False, recompute=again)
        grads.append((loss, [p.grad.clone() for p in emitted.parameters()]))
    for again in ((), ("cpu:0", "cpu:1")):  # (measuring updates the weights)
        peaks.append(measure_step(emitted, lambda charge, again=again: train_step(
            emitted, batches, order, "mean", threads=False, recompute=again, charge=charge),
            optimizer="sgd").activation_peak_bytes)
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    for p, q in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    # GPipe holds four micro-batches; recomputing, cpu:0 keeps neither h nor the activations
    assert peaks[1]["cpu:0"] < peaks[0]["cpu:0"]


def test_each_unit_recomputes_once_its_gradients_have_come() -> None:
    """Activation checkpointing per block on one device (a tensor-parallel rank's step): every
    forward node of a block runs again (``@recompute``) after the gradient of the block's output
    and before the block's backward; the step holds less at its peak and takes longer by a
    forward of the blocks."""
    from autoplace.cluster import resolve_cluster
    from autoplace.ir import Problem
    from autoplace.profile.cost import costs
    from autoplace.trace import trace_model
    from autoplace.train import loss_model
    from autoplace.train.recompute import recompute_units

    torch.manual_seed(0)
    model = nn.Sequential(*[zoo.Block() for _ in range(3)])
    args, targets = (torch.randn(4096, 16),), (torch.randint(0, 16, (4096,)),)
    traced = trace_model(loss_model(model, F.cross_entropy, args, {}, targets), args,
                         {"targets": targets})
    cluster, _ = resolve_cluster(spec="1xA100-40GB")
    step = step_problem(Problem(graph=traced.graph, cluster=cluster,
                                costs=costs(traced.graph, cluster)), "adam")
    again = recompute_units(step)
    names = {n.name for n in again.graph.nodes}
    recomputed = sorted(n.removesuffix("@recompute") for n in names if n.endswith("@recompute"))
    block_of = {n.name: ".".join(n.module.split(".")[:2]) for n in step.graph.nodes
                if n.module.startswith("model.")}  # model.k: the loss wrapper's k-th block
    assert recomputed == sorted(n for n in block_of if n + "@backward" in names)
    on = {n: "cuda:0" for n in names}
    plain = simulate(step, Placement(device_of={n.name: "cuda:0" for n in step.graph.nodes}))
    ran = simulate(again, Placement(device_of=on))
    for name in recomputed:
        block = [n for n, b in block_of.items() if b == block_of[name]]
        waits = [e.src for e in step.graph.edges if e.dst.removesuffix("@backward") in block
                 and e.src.endswith("@backward") and e.src.removesuffix("@backward") not in block]
        assert waits and ran.start_s[name + "@recompute"] >= max(ran.end_s[w] for w in waits)
        assert ran.end_s[name + "@recompute"] <= ran.start_s[name + "@backward"]
    reserve = cluster.devices[0].reserved_bytes
    assert ran.peak_bytes["cuda:0"] - reserve < 0.75 * (plain.peak_bytes["cuda:0"] - reserve)
    forward = sum(step.costs.of(n, "cuda:0") for n in recomputed)
    assert ran.makespan_s == pytest.approx(plain.makespan_s + forward, rel=0.05)


class _Scaled(nn.Module):
    """Blocks between two scalings that belong to the outer module: one unit (its own
    parameters) at both ends of the model, as a language model's embedding and final norm."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Parameter(torch.ones(16)), nn.Parameter(torch.ones(16))
        self.blocks = nn.Sequential(*[zoo.Block() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x * self.first) * self.last


def test_a_unit_at_both_ends_recomputes_each_end_when_its_own_gradients_come() -> None:
    """The outer unit's last scaling is recomputed once the loss's gradient has come, its first
    once the first block's has: waiting for every gradient of the unit would wait for the
    first block's backward before the last scaling's, a cycle."""
    from autoplace.cluster import resolve_cluster
    from autoplace.ir import Problem
    from autoplace.profile.cost import costs
    from autoplace.trace import trace_model
    from autoplace.train import loss_model
    from autoplace.train.recompute import recompute_units

    torch.manual_seed(0)
    args, targets = (torch.randn(64, 16),), (torch.randint(0, 16, (64,)),)
    traced = trace_model(loss_model(_Scaled(), F.cross_entropy, args, {}, targets), args,
                         {"targets": targets})
    cluster, _ = resolve_cluster(spec="1xA100-40GB")
    step = step_problem(Problem(graph=traced.graph, cluster=cluster,
                                costs=costs(traced.graph, cluster)), "adam")
    outer = [n.name for n in step.graph.nodes if n.module == "model" and n.trainable_bytes]
    assert len(outer) == 2  # the two scalings
    again = recompute_units(step)  # no cycle
    ran = simulate(again, Placement(device_of={n.name: "cuda:0" for n in again.graph.nodes}))
    first, last = sorted(outer, key=lambda n: ran.start_s[n])
    block_backward = [n for n in ran.start_s if n.endswith("@backward")
                      and n.removesuffix("@backward") in {m.name for m in step.graph.nodes
                                                          if m.module.startswith("model.blocks")}]
    assert ran.start_s[last + "@recompute"] < min(ran.start_s[n] for n in block_backward)
    assert ran.start_s[first + "@recompute"] >= max(ran.end_s[n] for n in block_backward
                                                    if n.startswith(("linear", "add")))
