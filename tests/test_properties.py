"""Property tests (hypothesis) on random inputs, beside the hand-worked cases of the other files.

Two families:

1. The solver, on random DAGs whose devices differ in speed *and* memory, with several
   (possibly overlapping) colocation groups and nodes that cannot run on some devices. Whatever
   it returns must pass the simulator's own checks (precedence with transfer delays, no overlap,
   colocation, memory within capacity), put no node where it cannot run, and be no worse than any
   baseline; where it gives up, every placement tried in the simulator must overflow a device.
   ``tests/test_solve.py`` holds the simpler random-DAG properties (uniform memory, one
   colocation pair) and the comparison against enumerating every placement.
2. The emitter, on random small ``nn.Module``s built from common layers: split across devices at
   random (and as planned), the emitted model, and the one saved and loaded back, must equal the
   original (``torch.testing.assert_close``); and, as planned, its measured peak bytes per
   device (``autoplace.emit.check.memory``) stay at or below the plan's peak.

Profiles are derandomized (the same examples on every run), so CI is stable.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch
import zoo
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from torch import nn

import autoplace
from autoplace.config import Config, Emit, Solve
from autoplace.emit import emit_model, load_model, measure_peak_bytes, save_model
from autoplace.errors import InfeasibleError
from autoplace.ir import Costs, HostCosts, Placement
from autoplace.simulate import simulate, validate
from autoplace.solve import solve
from autoplace.solve.bounds import lower_bound_s
from autoplace.solve.cpsat import solve_cpsat
from autoplace.trace import trace_model

SOLVER_PROFILE = settings(max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
# Finding an example that shows a strategy reaches a case: generate only, no shrinking.
FIND = settings(phases=[Phase.generate], max_examples=500, database=None, derandomize=True)
MODEL_PROFILE = settings(max_examples=25, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------------------
# 1. The solver on random DAGs


@st.composite
def mixed_problems(draw):
    """A random DAG on 1-4 devices of different speeds and memories, with colocation groups of
    up to three nodes and some nodes that cannot run on some devices."""
    n = draw(st.integers(2, 10))
    n_devices = draw(st.integers(1, 4))
    durations = draw(st.lists(st.sampled_from([1e-6, 0.01, 0.5, 1.0, 3.0, 10.0]),
                              min_size=n, max_size=n))
    params = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))
    edges = []
    for dst in range(1, n):
        for src in draw(st.sets(st.integers(0, dst - 1), max_size=3)):
            edges.append((f"n{src}", f"n{dst}", draw(st.integers(0, 600))))
    speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=n_devices,
                           max_size=n_devices))
    groups = []
    for _ in range(draw(st.integers(0, 2)) if n >= 3 else 0):
        members = draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=3))
        groups.append(tuple(f"n{i}" for i in sorted(members)))
    cl = zoo.cluster(n_devices, memory_bytes=1, bandwidth=draw(st.sampled_from([50.0, 1e4])),
                     latency=draw(st.sampled_from([0.0, 1e-3, 0.5])))
    memories = draw(st.lists(st.integers(300, 4000), min_size=n_devices, max_size=n_devices))
    devices = tuple(dataclasses.replace(d, memory_bytes=m, type=f"T{i}")
                    for i, (d, m) in enumerate(zip(cl.devices, memories)))
    cl = dataclasses.replace(cl, devices=devices)
    p = zoo.problem([(f"n{i}", durations[i], params[i]) for i in range(n)], edges, cl,
                    speed={f"d{i}": s for i, s in enumerate(speeds)}, colocate=tuple(groups),
                    outputs=(f"n{n - 1}",))
    # Some nodes cannot run on some devices (an unsupported op); each keeps at least one.
    compute = {name: dict(times) for name, times in p.costs.compute_s.items()}
    if n_devices > 1:
        for i in draw(st.sets(st.integers(0, n - 1), max_size=2)):
            banned = draw(st.integers(0, n_devices - 1))
            compute[f"n{i}"][f"d{banned}"] = math.inf
    return dataclasses.replace(p, costs=Costs(compute_s=compute))


def _check_plan(p, r, objective: str) -> None:
    assert validate(p, r.schedule) == []
    for name, dev in r.schedule.placement.device_of.items():
        assert math.isfinite(p.costs.of(name, dev)), f"{name} placed on {dev}, where it cannot run"
    capacity = {d.name: d.memory_bytes for d in p.cluster.devices}
    for dev, peak in r.schedule.peak_bytes.items():
        assert peak <= capacity[dev]
    for group in p.graph.colocate:
        assert len({r.schedule.placement.device_of[n] for n in group}) == 1
    for name, baseline in r.baselines.items():
        if baseline is not None and baseline.feasible:
            assert r.objective_s <= baseline.objective_s(objective) * (1 + 1e-9) + 1e-12, name
    assert r.lower_bound_s <= r.objective_s * (1 + 1e-9) + 1e-12


def _placements_within_parameters(p) -> Iterator[dict[str, str]]:
    """Every placement of ``p``'s nodes on devices where they can run, colocation groups together,
    whose parameters alone fit each device: the others cannot fit once activations are added, so
    leaving them out as the enumeration goes (node by node) changes no answer."""
    allowed = p.allowed
    capacity = {d.name: d.memory_bytes for d in p.cluster.devices}
    params = {n.name: n.param_bytes for n in p.graph.nodes}
    names = [n.name for n in p.graph.nodes]

    def extend(i: int, device_of: dict[str, str], used: dict[str, int]) -> Iterator[dict[str, str]]:
        if i == len(names):
            yield dict(device_of)
            return
        name = names[i]
        # Groups overlap: a node joins the device of every placed member of each of its groups.
        joined = {device_of[m] for g in p.graph.colocate if name in g for m in g if m in device_of}
        for dev in allowed[name]:
            if (joined and joined != {dev}) or used[dev] + params[name] > capacity[dev]:
                continue
            device_of[name] = dev
            used[dev] += params[name]
            yield from extend(i + 1, device_of, used)
            used[dev] -= params[name]
            del device_of[name]

    yield from extend(0, {}, dict.fromkeys(capacity, 0))


def _assert_nothing_fits(p) -> None:
    """The solver gave up: check, by trying every placement in the simulator, that none fits."""
    for device_of in _placements_within_parameters(p):
        schedule = simulate(p, Placement(device_of=device_of))
        assert not schedule.feasible, f"the solver gave up, but {device_of} fits"


@SOLVER_PROFILE
@given(mixed_problems(), st.sampled_from(["latency", "throughput"]))
def test_mixed_devices_give_valid_plans_no_worse_than_any_baseline(p, objective):
    try:
        r = solve(p, objective=objective, time_limit_s=1, workers=1)
    except InfeasibleError:
        _assert_nothing_fits(p)
        return
    _check_plan(p, r, objective)


@st.composite
def launched_problems(draw):
    """A random DAG of 2-8 nodes on 1-2 devices (``mixed_problems``) whose every device is
    launched from one host thread: each node's launches are a random share of its time there,
    and the segment calls and handovers random too."""
    p = draw(mixed_problems().filter(lambda p: len(p.graph.nodes) <= 8
                                     and len(p.cluster.devices) <= 2))
    names = p.cluster.names
    launch_s = {n.name: {d: draw(st.sampled_from([0.3, 1.0])) * p.costs.of(n.name, d)
                         for d in p.allowed[n.name]} for n in p.graph.nodes}
    host = HostCosts(launch_s=launch_s,
                     call_s=dict.fromkeys(names, draw(st.sampled_from([0.0, 0.01, 0.5]))),
                     handover_s=dict.fromkeys(names, draw(st.sampled_from([0.0, 0.02, 1.0]))))
    return dataclasses.replace(p, costs=dataclasses.replace(p.costs, host=host))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(launched_problems())
def test_bounds_under_one_launcher_hold_for_every_placement(p):
    # The analytic bound (with the launcher's release of each node) and CP-SAT's are below
    # the simulated makespan of every placement that fits: a bound that is not one shows here.
    assert p.sole_launcher is not None
    analytic = lower_bound_s(p)
    cp = solve_cpsat(p, time_limit_s=0.5, deterministic=True, workers=1)
    fitting = [simulate(p, Placement(device_of=d)) for d in _placements_within_parameters(p)]
    fitting = [s.makespan_s for s in fitting if s.feasible]
    if not fitting:
        return
    assert analytic <= min(fitting) * (1 + 1e-9) + 1e-12
    if cp.placement is not None:
        assert cp.bound_s <= min(fitting) * (1 + 1e-9) + 1e-12


def test_the_enumeration_sees_what_fits_and_what_does_not():
    # Chain a -> b -> c, 400 parameter bytes each, 100-byte edges, two devices: three nodes never
    # fit one device (1,200 bytes), so a pair shares one: 800 resident plus the pair's live
    # outputs. {a, b}: b starts while a's output is live, 1,000 bytes at the peak; {a, c} or
    # {b, c}: 900 at least (a's or b's output). At 1,000 bytes {a, b} | {c} fits; at 850 nothing
    # does, though all six splits keep their parameters within memory.
    for memory_bytes, fits in ((1000, True), (850, False)):
        p = zoo.chain(zoo.cluster(2, memory_bytes=memory_bytes), params=400)
        placements = list(_placements_within_parameters(p))
        assert len(placements) == 6
        feasible = [d for d in placements if simulate(p, Placement(device_of=d)).feasible]
        assert bool(feasible) == fits, memory_bytes
        if fits:
            solve(p, time_limit_s=2, workers=1)
        else:
            _assert_nothing_fits(p)
            with pytest.raises(InfeasibleError):
                solve(p, time_limit_s=2, workers=1)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(mixed_problems())
def test_deterministic_mode_repeats_itself(p):
    try:
        runs = [solve(p, time_limit_s=1, deterministic=True) for _ in range(2)]
    except InfeasibleError:
        _assert_nothing_fits(p)
        return
    assert runs[0].schedule.placement == runs[1].schedule.placement
    assert runs[0].schedule.makespan_s == runs[1].schedule.makespan_s
    _check_plan(p, runs[0], "latency")


def test_the_strategy_reaches_every_feature():
    # The properties above mean little if the generator never makes the hard cases.
    for wanted in (
        lambda p: len(p.graph.colocate) == 2 and any(len(g) == 3 for g in p.graph.colocate),
        lambda p: len({d.memory_bytes for d in p.cluster.devices}) > 2,
        lambda p: any(math.isinf(t) for times in p.costs.compute_s.values()
                      for t in times.values()),
        lambda p: len(p.cluster.devices) == 4,
    ):
        find(mixed_problems(), wanted, settings=FIND)


# ---------------------------------------------------------------------------------------------
# 2. The emitter on random modules


class RandomNet(nn.Module):
    """Blocks applied in order; each is ``seq`` (x = f(x)), ``residual`` (x = x + f(x)),
    ``concat`` (x = cat(f(x), g(x))) or ``attention`` (x = x + attn(x, x, x))."""

    def __init__(self, blocks: list[tuple[str, nn.Module]], *, cat_dim: int,
                 embed: nn.Module | None = None, head: nn.Module | None = None) -> None:
        super().__init__()
        self.kinds = [kind for kind, _ in blocks]
        self.blocks = nn.ModuleList(module for _, module in blocks)
        self.cat_dim = cat_dim
        self.embed = embed
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for kind, block in zip(self.kinds, self.blocks):
            if kind == "seq":
                x = block(x)
            elif kind == "residual":
                x = x + block(x)
            elif kind == "concat":
                x = torch.cat([block[0](x), block[1](x)], dim=self.cat_dim)
            else:
                x = x + block(x, x, x, need_weights=False)[0]
        return x if self.head is None else self.head(x)


_ACTIVATIONS = (nn.ReLU, nn.GELU, nn.Tanh)


@st.composite
def sequence_models(draw):
    """(batch, tokens, width) models: Embedding, Linear, LayerNorm, activations, residual
    adds, concatenation and multi-head attention."""
    width = draw(st.sampled_from([4, 8, 12]))
    use_embedding = draw(st.booleans())
    blocks: list[tuple[str, nn.Module]] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["linear", "norm", "act", "residual", "concat",
                                     "attention"]))
        if kind == "linear":
            new = draw(st.sampled_from([4, 8, 12]))
            blocks.append(("seq", nn.Linear(width, new, bias=draw(st.booleans()))))
            width = new
        elif kind == "norm":
            blocks.append(("seq", nn.LayerNorm(width)))
        elif kind == "act":
            blocks.append(("seq", draw(st.sampled_from(_ACTIVATIONS))()))
        elif kind == "residual":
            blocks.append(("residual", nn.Sequential(nn.Linear(width, width),
                                                     draw(st.sampled_from(_ACTIVATIONS))())))
        elif kind == "concat":
            a, b = draw(st.sampled_from([2, 4])), draw(st.sampled_from([2, 6]))
            blocks.append(("concat", nn.ModuleList([nn.Linear(width, a), nn.Linear(width, b)])))
            width = a + b
        else:
            heads = draw(st.sampled_from([h for h in (1, 2, 4) if width % h == 0]))
            blocks.append(("attention", nn.MultiheadAttention(width, heads, batch_first=True)))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    head = nn.Linear(width, 3) if draw(st.booleans()) else None
    if use_embedding:
        model = RandomNet(blocks, cat_dim=-1, embed=nn.Embedding(20, _in_width(blocks, width)),
                          head=head)
        x = torch.randint(0, 20, (2, 5))
    else:
        model = RandomNet(blocks, cat_dim=-1, head=head)
        x = torch.randn(2, 5, _in_width(blocks, width))
    _reset(model)
    return model, x


def _in_width(blocks: list[tuple[str, nn.Module]], last: int) -> int:
    """The width the first block reads."""
    for _kind, module in blocks:
        for sub in module.modules():
            if isinstance(sub, nn.Linear):
                return sub.in_features
            if isinstance(sub, nn.LayerNorm):
                return sub.normalized_shape[0]
            if isinstance(sub, nn.MultiheadAttention):
                return sub.embed_dim
    return last


def _reset(model: nn.Module) -> None:
    """Fresh random weights, and batch-norm statistics that are not the identity."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.5, 0.5)
    model.eval()


@st.composite
def image_models(draw):
    """(batch, channels, 8, 8) models: Conv2d, BatchNorm2d, activations, pooling, residual
    adds and channel concatenation, then global pooling and a Linear head."""
    channels = draw(st.sampled_from([2, 3, 4]))
    first, size = channels, 8
    blocks: list[tuple[str, nn.Module]] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["conv", "bn", "act", "pool", "residual", "concat"]))
        if kind == "conv":
            new = draw(st.sampled_from([2, 4, 6]))
            kernel = draw(st.sampled_from([1, 3]))
            blocks.append(("seq", nn.Conv2d(channels, new, kernel, padding=kernel // 2)))
            channels = new
        elif kind == "bn":
            blocks.append(("seq", nn.BatchNorm2d(channels)))
        elif kind == "act":
            blocks.append(("seq", draw(st.sampled_from(_ACTIVATIONS))()))
        elif kind == "pool" and size >= 2:
            pool = draw(st.sampled_from([nn.MaxPool2d, nn.AvgPool2d]))
            blocks.append(("seq", pool(2)))
            size //= 2
        elif kind == "residual":
            blocks.append(("residual", nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1),
                                                     nn.BatchNorm2d(channels), nn.ReLU())))
        elif kind == "concat":
            a, b = draw(st.sampled_from([2, 4])), draw(st.sampled_from([1, 3]))
            blocks.append(("concat", nn.ModuleList([nn.Conv2d(channels, a, 1),
                                                    nn.Conv2d(channels, b, 3, padding=1)])))
            channels = a + b
    torch.manual_seed(draw(st.integers(0, 2**16)))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 5))
    model = RandomNet(blocks, cat_dim=1, head=head)
    _reset(model)
    return model, torch.randn(2, first, 8, 8)


random_models = st.one_of(sequence_models(), image_models())


def _compute_ops(traced) -> list[str]:
    return [op for node in traced.graph.nodes if not node.is_input for op in node.ops]


@MODEL_PROFILE
@given(model_x=random_models, data=st.data())
def test_random_modules_split_at_random_emit_a_model_equal_to_the_original(tmp_path_factory,
                                                                           model_x, data):
    model, x = model_x
    traced = trace_model(model, (x,), {}, name="random")
    ops = _compute_ops(traced)
    devices = data.draw(st.lists(st.sampled_from(["cuda:0", "cuda:1"]), min_size=len(ops),
                                 max_size=len(ops)), label="devices")
    device_of = dict(zip(ops, devices))
    emitted = emit_model(traced.module, device_of, device_map={"cuda:*": "cpu"})
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(emitted(x), expected)
    out = tmp_path_factory.mktemp("emitted")
    save_model(emitted, out)
    loaded = load_model(out, device_map={"cuda:*": "cpu"})
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected)


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_models)
def test_random_modules_planned_end_to_end_verify(model_x):
    model, x = model_x
    plan, emitted = autoplace.plan(
        model,
        (x,),
        Config(
            devices="2xA100-40GB,1xT4-16GB",
            solve=Solve(time_limit_s=1, whatif=False, deterministic=True),
        ),
    )
    assert plan.verification.status == "passed"
    assert validate(plan.problem, plan.schedule) == []
    with torch.no_grad():
        torch.testing.assert_close(emitted(x), model(x))


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_models)
def test_random_modules_measured_peak_within_the_plan(model_x):
    model, x = model_x
    plan, emitted = autoplace.plan(
        model,
        (x,),
        Config(
            devices="2xA100-40GB,1xT4-16GB",
            solve=Solve(time_limit_s=1, whatif=False, deterministic=True),
            emit=Emit(check_memory=False),
        ),
    )
    measured = measure_peak_bytes(emitted, (x,))
    name_of = {d.torch_device: d.name for d in plan.problem.cluster.devices}
    for device, nbytes in measured.items():
        name = name_of[device]
        # The plan's peak less the runtime's reserve (the CUDA context), which no measurement of
        # tensors sees.
        planned = plan.schedule.peak_bytes[name] - plan.problem.cluster.device(name).reserved_bytes
        assert nbytes <= planned, (device, nbytes, planned)
    # The verification record holds the same measurement.
    assert {name_of[d]: b for d, b in measured.items()} == {
        d: e["measured_bytes"] for d, e in plan.verification.peak_bytes.items()
        if d in {name_of[k] for k in measured}}


def test_the_random_splits_really_cross_devices():
    # Guard against a strategy that never splits: a random model with two devices drawn
    # alternately makes several segments.
    model, x = find(sequence_models(), lambda mx: len(list(mx[0].modules())) > 6,
                    settings=FIND)
    traced = trace_model(model, (x,), {}, name="random")
    ops = _compute_ops(traced)
    device_of = {op: f"cuda:{i % 2}" for i, op in enumerate(ops)}
    emitted = emit_model(traced.module, device_of, device_map={"cuda:*": "cpu"})
    assert len(emitted.segments) > 2
    with torch.no_grad():
        torch.testing.assert_close(emitted(x), model(x))


@pytest.mark.parametrize("strategy", [sequence_models(), image_models()])
def test_model_strategies_build_runnable_models(strategy):
    model, x = find(strategy, lambda mx: len(mx[0].kinds) >= 3, settings=FIND)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
