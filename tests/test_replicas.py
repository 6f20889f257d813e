"""Training plans with data-parallel replicas (``research.pipedream.replicas``) on the step graphs
of profiled models (``research.pipedream.step_graph``).

Hand-worked cases first, on a network of 1 byte/s without latency unless a test says otherwise,
so that bytes read as seconds (and profile times, in milliseconds, read as thousandths); then the
rule against PipeDream's ``evaluate`` on random chains and the replica allocation against brute
force; then the planner on a model whose best plan is worked out by hand, and on AlexNet's
profile against PipeDream's dynamic program (../shared/benchdata; skipped without it, failed
under CI=true).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from conftest import require
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplace.solve import SolveOptions
from research.pipedream.partitioner import TrainingCluster, evaluate, pipedream, training_chain
from research.pipedream.profiles import parse_profile, read_profile
from research.pipedream.replicas import allocate_replicas, plan_replicas, time_per_sample
from research.pipedream.step_graph import UNLIMITED_BYTES, profile_step_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchdata  # noqa: E402

PROFILES = benchdata.benchdata_dir() / "pipedream"
SLOW_NET = {"bandwidth_bytes_per_s": 1.0, "latency_s": 0.0}
B = "@backward"


def _profile(layers: list[tuple[float, float, int, int]],
             edges: list[tuple[int, int]] | None = None, *, name: str = "m") -> str:
    """Profile text of layers ``node1``, ``node2``, ... (forward ms, backward ms, activation
    bytes, weight bytes), a chain unless ``edges`` (1-based pairs) say otherwise."""
    lines = [f"node{k} -- Layer{k} -- forward_compute_time={f}, backward_compute_time={b}, "
             f"activation_size={a}, parameter_size={w}"
             for k, (f, b, a, w) in enumerate(layers, start=1)]
    pairs = edges if edges is not None else [(k, k + 1) for k in range(1, len(layers))]
    return "\n".join([*lines, *(f"\tnode{a} -- node{b}" for a, b in pairs)]) + "\n"


def _problem(text: str, devices: int = 2, **net: float):
    cluster = TrainingCluster(devices=devices, **(net or SLOW_NET))
    return profile_step_problem(parse_profile(text, name="m"), cluster), cluster


def _groups(**groups: tuple[int, ...]) -> dict[str, str]:
    """node -> group for layers given by number: ``_groups(a=(1, 2), b=(3,))``; backward nodes
    with their forward."""
    return {f"node{k}{end}": g for g, layers in groups.items() for k in layers
            for end in ("", B)}


# --- the training graph of a profile ----------------------------------------------------------


def test_a_profile_becomes_a_forward_and_a_backward_node_per_layer_colocated():
    # node1 is the input (dropped, as PipeDream's optimizer drops it); node2 -> node3 -> node4,
    # and node2 also feeds node4 (a skip connection).
    text = """\
node1 -- Input0 -- forward_compute_time=5.0, backward_compute_time=0.0, activation_size=100.0, parameter_size=0.0
node2 -- Conv2d -- forward_compute_time=2.0, backward_compute_time=4.0, activation_size=200.0, parameter_size=40.0
node3 -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=300.0, parameter_size=0.0
node4 -- Linear -- forward_compute_time=3.0, backward_compute_time=6.0, activation_size=10.0, parameter_size=80.0
\tnode1 -- node2
\tnode2 -- node3
\tnode3 -- node4
\tnode2 -- node4
"""  # noqa: E501
    problem, _ = _problem(text, devices=3)
    graph = problem.graph
    assert [n.name for n in graph.nodes] == ["node2", "node3", "node4", "node4" + B,
                                             "node3" + B, "node2" + B]
    assert sorted(graph.colocate) == [(f"node{k}", f"node{k}{B}") for k in (2, 3, 4)]
    assert problem.cluster.names == ("d0", "d1", "d2")
    assert all(d.memory_bytes == UNLIMITED_BYTES for d in problem.cluster.devices)
    assert problem.cluster.link("d0", "d2").bandwidth_bytes_per_s == 1.0
    # Times in seconds from the profile's milliseconds, the same on every device.
    assert problem.costs.of("node2", "d1") == pytest.approx(2e-3)
    assert problem.costs.of("node2" + B, "d2") == pytest.approx(4e-3)
    # Weights on the forward node, all trained; outputs: activations forward, gradients back.
    conv = graph.node("node2")
    assert (conv.param_bytes, conv.trainable_bytes, conv.output_bytes) == (40, 40, 200)
    assert graph.node("node4" + B).output_bytes == 200 + 300  # gradients of both its inputs
    assert graph.node("node2" + B).output_bytes == 0  # its input was the dropped data
    edges = {(e.src, e.dst): e.bytes for e in graph.edges}
    assert edges == {
        ("node2", "node3"): 200, ("node3", "node4"): 300, ("node2", "node4"): 200,  # forward
        ("node2", "node2" + B): 200, ("node3", "node3" + B): 300,  # saved, colocated
        ("node4", "node4" + B): 10,
        ("node3" + B, "node2" + B): 200, ("node4" + B, "node3" + B): 300,  # gradients back
        ("node4" + B, "node2" + B): 200,
    }
    assert graph.outputs == ("node4",)


# --- the rule ---------------------------------------------------------------------------------


def test_the_rule_on_a_hand_worked_plan():
    # Layers 1-3 (compute 3+3, 2+2, 1+1 ms; weights 0, 0, 9 bytes; activations 1, 2, 0 bytes)
    # on groups a = {1, 2} x2 and b = {3} x1, 1 byte/s, no latency:
    #   a: max(6 + 4 ms, all-reduce of 0 bytes) / 2 = 5 ms;  b: max(2 ms, 0) / 1 = 2 ms;
    #   a-b: layer 2's 2 bytes forward and its gradient back, 2 s + 2 s = 4 s.
    problem, cluster = _problem(_profile([(3, 3, 1, 0), (2, 2, 2, 0), (1, 1, 0, 9)]), devices=3)
    plan = time_per_sample(problem, _groups(a=(1, 2), b=(3,)), {"a": 2, "b": 1}, cluster)
    assert plan.group_s == pytest.approx({"a": 5e-3, "b": 2e-3})
    assert plan.link_s == pytest.approx({("a", "b"): 4.0})
    assert plan.time_per_sample_s == pytest.approx(4.0) and plan.bottleneck == "a-b"
    assert plan.devices_used == 3
    # Layer 3 replicated on 2 devices instead: its 9 bytes all-reduced take 2 * 1/2 * 9 = 9 s,
    # which its 2 ms of compute do not hide, over 2 replicas: 4.5 s.
    plan = time_per_sample(problem, _groups(a=(1, 2), b=(3,)), {"a": 1, "b": 2}, cluster)
    assert plan.group_s["b"] == pytest.approx(4.5) and plan.bottleneck == "b"


def test_a_value_read_by_two_layers_of_another_group_crosses_once_each_way():
    # 1 -> 2 -> 3 and 1 -> 3: layer 1's 5 bytes go to group b (layers 2 and 3) once, and its
    # gradient comes back once; with 10 us of latency per message.
    text = _profile([(1, 1, 5, 0), (1, 1, 7, 0), (1, 1, 0, 0)], [(1, 2), (2, 3), (1, 3)])
    problem, cluster = _problem(text, devices=2, bandwidth_bytes_per_s=1.0, latency_s=1e-5)
    plan = time_per_sample(problem, _groups(a=(1,), b=(2, 3)), {"a": 1, "b": 1}, cluster)
    assert plan.link_s == pytest.approx({("a", "b"): 2 * (1e-5 + 5.0)})
    # Activations crossing both ways (a holds 1 and 3, b holds 2): four messages.
    plan = time_per_sample(problem, _groups(a=(1, 3), b=(2,)), {"a": 1, "b": 1}, cluster)
    assert plan.link_s == pytest.approx({("a", "b"): 2 * (1e-5 + 5.0) + 2 * (1e-5 + 7.0)})


def test_data_parallelism_of_heavy_weights_waits_for_the_allreduce():
    # One group of 4 devices holding 100 bytes of weights: the ring moves 2 * 3/4 * 100 = 150
    # bytes per device, 150 s on 1 byte/s, against 2 ms of compute: 150 / 4 per sample.
    problem, cluster = _problem(_profile([(1, 1, 0, 100)]), devices=4)
    plan = time_per_sample(problem, _groups(all=(1,)), {"all": 4}, cluster)
    assert plan.time_per_sample_s == pytest.approx(150 / 4)
    assert plan.link_s == {}


def test_the_rule_refuses_a_split_layer_and_a_group_without_devices():
    problem, cluster = _problem(_profile([(1, 1, 1, 0), (1, 1, 0, 0)]))
    split = {**_groups(a=(1, 2)), "node2" + B: "b"}
    with pytest.raises(ValueError, match="colocated nodes"):
        time_per_sample(problem, split, {"a": 1, "b": 1}, cluster)
    with pytest.raises(ValueError, match=r"groups \['b'\] hold nodes but have no replicas"):
        time_per_sample(problem, _groups(a=(1,), b=(2,)), {"a": 2}, cluster)


layer = st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 50),
                  st.integers(0, 50))


@st.composite
def chains_and_stages(draw):
    layers = draw(st.lists(layer, min_size=1, max_size=6))
    devices = draw(st.integers(1, 4))
    cuts = sorted(draw(st.sets(st.integers(1, len(layers) - 1), max_size=devices - 1))
                  if len(layers) > 1 else set())
    ends = [*cuts, len(layers)]
    firsts = [0, *cuts]
    spare = devices - len(ends)
    extra = draw(st.lists(st.integers(0, spare), min_size=len(ends), max_size=len(ends)))
    replicas, left = [], spare
    for e in extra:
        replicas.append(1 + min(e, left))
        left -= min(e, left)
    latency = draw(st.sampled_from([0.0, 1e-3, 0.5]))
    return layers, devices, list(zip(firsts, ends, replicas)), latency


@settings(max_examples=200, deadline=None)
@given(chains_and_stages())
def test_the_rule_is_pipedreams_cost_model_on_a_chain_of_stages(case):
    # Two implementations of the paper's model: the DP's evaluate over a chain, and the rule
    # over any grouping of the step graph. On stages of a chain they must agree, term by term.
    layers, devices, spans, latency = case
    text = _profile([(f, b, a, w) for f, b, a, w in layers])
    cluster = TrainingCluster(devices=devices, bandwidth_bytes_per_s=10.0, latency_s=latency)
    problem = profile_step_problem(parse_profile(text, name="m"), cluster)
    chain = training_chain(parse_profile(text, name="m"))
    theirs = evaluate(chain, spans, cluster)
    device_of = {f"node{k + 1}{end}": f"s{i}" for i, (first, last, _) in enumerate(spans)
                 for k in range(first, last) for end in ("", B)}
    ours = time_per_sample(problem, device_of, {f"s{i}": r for i, (_, _, r) in enumerate(spans)},
                           cluster)
    assert ours.time_per_sample_s == pytest.approx(theirs.time_per_sample_s, rel=1e-9, abs=1e-12)
    assert [ours.group_s[f"s{i}"] for i in range(len(spans))] == \
        pytest.approx([s.time_s for s in theirs.stages], rel=1e-9, abs=1e-12)
    links = [ours.link_s[f"s{i}", f"s{i + 1}"] for i in range(len(spans) - 1)]
    assert links == pytest.approx(list(theirs.boundaries_s), rel=1e-9, abs=1e-12)


# --- replicas for given groups ----------------------------------------------------------------


def test_replicas_go_to_the_slowest_group_until_the_weights_stop_paying():
    cluster = TrainingCluster(devices=6, **SLOW_NET)
    # Group 1 computes 8 s with no weights, group 2 computes 1 s with 30 bytes (an all-reduce of
    # 2 (R-1)/R * 30 s): group 2 stays alone, group 1 takes 4 (2 s) and a fifth helps it (1.6
    # s) while group 2 keeps 1 s; the sixth device would only make group 1 1.33 s, still the
    # slowest and faster: all 6 (5, 1).
    assert allocate_replicas([8.0, 1.0], [0, 30], 6, cluster) == (5, 1)
    # Within 2 s, the fewest devices: 4 and 1.
    assert allocate_replicas([8.0, 1.0], [0, 30], 6, cluster, within_s=2.0) == (4, 1)
    assert allocate_replicas([8.0, 1.0], [0, 30], 6, cluster, within_s=0.5) is None
    assert allocate_replicas([1.0, 1.0, 1.0], [0, 0, 0], 2, cluster) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 40)), min_size=1, max_size=3),
       st.integers(1, 6))
def test_the_allocation_is_the_best_of_every_allocation(groups, devices):
    cluster = TrainingCluster(devices=devices, bandwidth_bytes_per_s=4.0, latency_s=0.25)
    compute, weights = [float(c) for c, _ in groups], [w for _, w in groups]
    found = allocate_replicas(compute, weights, devices, cluster)
    if len(groups) > devices:
        assert found is None
        return
    assert found is not None and min(found) >= 1 and sum(found) <= devices

    def slowest(counts):
        return max(max(c, 2 * (r - 1) / r * w / 4.0 + 2 * (r - 1) * 0.25) / r
                   for c, w, r in zip(compute, weights, counts))

    best = min((slowest(counts), sum(counts))
               for counts in itertools.product(range(1, devices + 1), repeat=len(groups))
               if sum(counts) <= devices)
    assert (slowest(found), sum(found)) == pytest.approx(best)


# --- the planner ------------------------------------------------------------------------------


def test_the_planner_replicates_the_compute_and_not_the_weights():
    # Layer 1 computes 8 s and holds nothing, layer 2 computes 1 s and holds 30 bytes, 1 byte
    # between them, 3 devices on 1 byte/s (profile times are milliseconds):
    #   one device: 9 s; data parallel: max(9 s, all-reduce 2 * 2/3 * 30 = 40 s) / 3 = 13.3 s;
    #   layer 1 on 2 devices, layer 2 on 1: max(8 / 2, 1, link 1 s + 1 s back) = 4 s;
    #   any other split is slower (layer 2 replicated pays its all-reduce, layer 1 alone 8 s),
    #   and 9 s / 3 = 3 s, the work bound, is out of reach: the plan is 4 s.
    problem, cluster = _problem(_profile([(4000, 4000, 1, 0), (500, 500, 0, 30)]), devices=3)
    planning = plan_replicas(problem, cluster,
                             options=SolveOptions(time_limit_s=2, deterministic=True))
    assert planning.data_parallel.time_per_sample_s == pytest.approx(9.0)  # on one device
    plan = planning.plan
    assert plan.time_per_sample_s == pytest.approx(4.0)
    assert {plan.device_of["node1"]: 2, plan.device_of["node2"]: 1} == plan.replicas
    assert plan.bottleneck == plan.device_of["node1"]
    assert planning.attempts and not planning.at_bound


def test_the_planner_stops_at_data_parallelism_when_it_reaches_the_work_bound():
    problem, cluster = _problem(_profile([(4, 4, 100, 1), (3, 3, 0, 1)]), devices=4,
                                bandwidth_bytes_per_s=1e9, latency_s=0.0)
    planning = plan_replicas(problem, cluster, options=SolveOptions(time_limit_s=1))
    assert planning.at_bound and planning.attempts == ()
    assert planning.plan.replicas == {"g0": 4}
    assert planning.plan.time_per_sample_s == pytest.approx(14e-3 / 4)


def test_on_alexnet_the_plan_is_no_worse_than_pipedreams():
    require(PROFILES.is_dir(), f"no PipeDream profiles at {PROFILES} (put the data at "
                               f"../shared/benchdata or set ${benchdata.BENCHDATA_ENV})")
    profile = read_profile(PROFILES / "alexnet.graph.txt")
    cluster = TrainingCluster(devices=4)
    theirs = pipedream(training_chain(profile), cluster)  # 1-13 x3, 14-22 x1: 25.44 ms
    planning = plan_replicas(profile_step_problem(profile, cluster), cluster,
                             options=SolveOptions(time_limit_s=5, deterministic=True))
    assert planning.plan.time_per_sample_s <= theirs.time_per_sample_s * (1 + 1e-9)
    assert sorted(planning.plan.replicas.values()) == [1, 3]  # the convolutions replicated
    assert planning.plan.time_per_sample_s < planning.data_parallel.time_per_sample_s / 2
