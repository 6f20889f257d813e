"""PipeDream's partitioner (``research.pipedream.partitioner``) and its profile reader
(``research.pipedream.profiles``).

Hand-worked chains first, on a network of 1 byte/s without latency unless a test says otherwise,
so that bytes read as seconds; then the dynamic program against brute force over every split and
replication of small random chains; then the reader, on text made up for the test and on one real
profile of ../shared/benchdata/pipedream (skipped without it, failed under CI=true).
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
from conftest import require
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplace.errors import AutoplaceError, DeviceSpecError, GraphError
from research.pipedream.partitioner import (
    Chain,
    TrainingCluster,
    data_parallel,
    evaluate,
    one_device,
    pipedream,
    stage_s,
    training_chain,
)
from research.pipedream.profiles import parse_profile, read_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchdata  # noqa: E402

PROFILES = benchdata.benchdata_dir() / "pipedream"
SLOW_NET = {"bandwidth_bytes_per_s": 1.0, "latency_s": 0.0}


def _chain(compute_s: list[float], parameter_bytes: list[int],
           boundary_bytes: list[int]) -> Chain:
    return Chain(name="chain", layers=tuple(f"l{k}" for k in range(len(compute_s))),
                 compute_s=tuple(compute_s), parameter_bytes=tuple(parameter_bytes),
                 boundary_bytes=tuple(boundary_bytes))


def _spans(plan) -> list[tuple[int, int, int]]:
    return [(s.first, s.end, s.replicas) for s in plan.stages]


# --- the cost terms ---------------------------------------------------------------------------


def test_a_stage_syncs_its_weights_by_a_ring_allreduce():
    cluster = TrainingCluster(devices=4, bandwidth_bytes_per_s=10.0, latency_s=0.5)
    # W = 2 (R-1)/R * bytes / bandwidth + 2 (R-1) * latency = 2*3/4*100/10 + 2*3*0.5 = 15 + 3;
    # T = max(compute, W) / R: the all-reduce when it is longer, else the compute.
    assert stage_s(2.0, 100, 4, cluster) == pytest.approx(18.0 / 4)
    assert stage_s(40.0, 100, 4, cluster) == pytest.approx(40.0 / 4)
    assert stage_s(2.0, 100, 1, cluster) == 2.0  # one replica syncs nothing


def test_a_cluster_is_checked():
    with pytest.raises(DeviceSpecError, match="at least 1 device"):
        TrainingCluster(devices=0)
    with pytest.raises(DeviceSpecError, match="bandwidth"):
        TrainingCluster(devices=2, bandwidth_bytes_per_s=0.0)
    with pytest.raises(DeviceSpecError, match="latency"):
        TrainingCluster(devices=2, latency_s=-1.0)


def test_evaluate_rejects_stages_that_do_not_cover_the_chain():
    chain = _chain([1, 1, 1], [0, 0, 0], [0, 0])
    cluster = TrainingCluster(devices=2, **SLOW_NET)
    with pytest.raises(ValueError, match="do not cover"):
        evaluate(chain, [(0, 1, 1), (2, 3, 1)], cluster)
    with pytest.raises(ValueError, match="more than the 2 devices"):
        evaluate(chain, [(0, 3, 3)], cluster)


# --- hand-worked chains -----------------------------------------------------------------------


def test_replication_wins_when_the_activation_is_large_and_the_weights_small():
    # Two layers of 4 s, no weights, 100 bytes between them; 2 devices.
    #   one device: 8.  data parallel: max(8, sync 0) / 2 = 4.  split: max(4, 4, 2 * 100) = 200.
    chain = _chain([4, 4], [0, 0], [100])
    cluster = TrainingCluster(devices=2, **SLOW_NET)
    plan = pipedream(chain, cluster)
    assert plan.time_per_sample_s == pytest.approx(4.0)
    assert _spans(plan) == [(0, 2, 2)]
    assert plan.stages[0].devices == (0, 1)
    assert data_parallel(chain, cluster).time_per_sample_s == pytest.approx(4.0)
    assert one_device(chain, cluster).time_per_sample_s == pytest.approx(8.0)


def test_a_pipeline_split_wins_when_the_weights_are_large():
    # Two layers of 4 s with 100 bytes of weights each, 1 byte between them; 2 devices.
    #   data parallel: sync = 2 * 1/2 * 200 = 200, max(8, 200) / 2 = 100.
    #   split: max(4, 4, 2 * 1) = 4.  one device: 8.
    chain = _chain([4, 4], [100, 100], [1])
    cluster = TrainingCluster(devices=2, **SLOW_NET)
    plan = pipedream(chain, cluster)
    assert plan.time_per_sample_s == pytest.approx(4.0)
    assert _spans(plan) == [(0, 1, 1), (1, 2, 1)]
    assert [s.devices for s in plan.stages] == [(0,), (1,)]
    assert plan.boundaries_s == pytest.approx((2.0,))
    assert data_parallel(chain, cluster).time_per_sample_s == pytest.approx(100.0)


def test_a_replicated_stage_feeds_an_unreplicated_one_as_in_vgg():
    # A convolution of 6 s without weights, then two fully connected layers of 1 s with 50
    # bytes of weights each; 1 byte at each boundary; 3 devices.
    #   conv x2, fc x1: max(6/2, 2, 2 * 1) = 3, the optimum:
    #   conv x1, fc x2: 6.  each layer alone: 6.  conv+fc1 x2, fc2 x1: max(7, 50) / 2 = 25.
    #   data parallel x3: sync = 2 * 2/3 * 100 = 133.3, / 3 = 44.4.
    chain = _chain([6, 1, 1], [0, 50, 50], [1, 1])
    cluster = TrainingCluster(devices=3, **SLOW_NET)
    plan = pipedream(chain, cluster)
    assert plan.time_per_sample_s == pytest.approx(3.0)
    assert plan.compact() == "1-1 x2, 2-3 x1"
    assert [s.devices for s in plan.stages] == [(0, 1), (2,)]
    assert data_parallel(chain, cluster).time_per_sample_s == pytest.approx(400 / 9)


def test_a_device_stays_idle_when_replicating_costs_more_than_it_saves():
    # One layer of 1 s without weights on 2 devices, 2 s latency: a second replica pays
    # 2 (R-1) * latency = 4 s of synchronisation, max(1, 4) / 2 = 2 > 1.
    chain = _chain([1], [0], [])
    cluster = TrainingCluster(devices=2, bandwidth_bytes_per_s=1.0, latency_s=2.0)
    plan = pipedream(chain, cluster)
    assert plan.time_per_sample_s == pytest.approx(1.0)
    assert plan.devices_used == 1
    assert data_parallel(chain, cluster).time_per_sample_s == pytest.approx(2.0)


# --- the dynamic program against brute force --------------------------------------------------


def _brute_force(chain: Chain, cluster: TrainingCluster) -> float:
    """The best time per sample over every split into stages and every replication that uses at
    most the cluster's devices."""
    n, best = len(chain.layers), math.inf
    for cuts in itertools.chain.from_iterable(
            itertools.combinations(range(1, n), k) for k in range(min(n, cluster.devices))):
        bounds = [0, *cuts, n]
        for replicas in itertools.product(range(1, cluster.devices + 1), repeat=len(bounds) - 1):
            if sum(replicas) <= cluster.devices:
                spans = [(a, b, r) for a, b, r in zip(bounds, bounds[1:], replicas)]
                best = min(best, evaluate(chain, spans, cluster).time_per_sample_s)
    return best


@st.composite
def _chains(draw) -> tuple[Chain, TrainingCluster]:
    n = draw(st.integers(1, 7))
    compute = draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    params = draw(st.lists(st.sampled_from([0, 1, 5, 20, 100]), min_size=n, max_size=n))
    boundary = draw(st.lists(st.integers(0, 10), min_size=n - 1, max_size=n - 1))
    cluster = TrainingCluster(devices=draw(st.integers(1, 4)), bandwidth_bytes_per_s=1.0,
                              latency_s=draw(st.sampled_from([0.0, 0.1, 1.0])))
    return _chain(compute, params, boundary), cluster


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_chains())
def test_the_dynamic_program_equals_brute_force(case):
    chain, cluster = case
    plan = pipedream(chain, cluster)
    assert plan.devices_used <= cluster.devices
    assert plan.time_per_sample_s == pytest.approx(_brute_force(chain, cluster), rel=1e-9)
    assert plan.time_per_sample_s <= data_parallel(chain, cluster).time_per_sample_s + 1e-12
    assert plan.time_per_sample_s <= one_device(chain, cluster).time_per_sample_s + 1e-12


# --- the reader -------------------------------------------------------------------------------

# Input -> a -> b -> c with a skip a -> c and an unused output d of b; lines out of order.
PROFILE = """\
node4 -- Linear(in_features=4, out_features=4) -- forward_compute_time=3.000, \
backward_compute_time=4.000, activation_size=30.0, parameter_size=80.000
node1 -- Input -- forward_compute_time=500.000, backward_compute_time=0.000, \
activation_size=5.0, parameter_size=0.000
node2 -- Conv2d(1, 1, kernel_size=(1, 1)) -- forward_compute_time=1.000, \
backward_compute_time=2.000, activation_size=10.0, parameter_size=8.000
node3 -- LSTM(4, 4) -- forward_compute_time=1.500, backward_compute_time=0.500, \
activation_size=[16.0; 4.0], parameter_size=0.000
node5 -- __getitem__(1) -- forward_compute_time=0.000, backward_compute_time=0.000, \
activation_size=4.0, parameter_size=0.000
\tnode1 -- node2
\tnode2 -- node3
\tnode3 -- node4
\tnode2 -- node4
\tnode3 -- node5
"""


def test_a_profile_is_read_in_topological_order_in_seconds_and_bytes():
    profile = parse_profile(PROFILE, where="p.txt", name="p")
    assert [layer.name for layer in profile.layers] == ["node1", "node2", "node3", "node4",
                                                        "node5"]
    lstm = profile.layers[2]
    assert (lstm.forward_s, lstm.backward_s) == pytest.approx((1.5e-3, 0.5e-3))
    assert lstm.activation_bytes == 20  # the two outputs summed
    assert ("node2", "node4") in profile.edges


def test_the_chain_drops_the_input_and_unused_outputs_and_charges_every_crossing():
    chain = training_chain(parse_profile(PROFILE, where="p.txt", name="p"))
    assert chain.layers == ("node2", "node3", "node4")
    assert chain.compute_s == pytest.approx((3e-3, 2e-3, 7e-3))
    assert chain.parameter_bytes == (8, 0, 80)
    # after node2: its 10 bytes (read by node3 and node4); after node3: node2's 10 still
    # travelling to node4, and node3's 20.
    assert chain.boundary_bytes == (10, 30)
    assert chain.input_s == pytest.approx(0.5)


@pytest.mark.parametrize(("text", "message"), [
    ("node1 -- Input -- forward_compute_time=x, backward_compute_time=0, activation_size=0, "
     "parameter_size=0\n", r"p\.txt:1: forward_compute_time='x' is not a number"),
    ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, activation_size=0\n",
     r"p\.txt:1: layer 'node1' lacks parameter_size"),
    ("node1 -- Input -- forward_compute_time=-1, backward_compute_time=0, activation_size=0, "
     "parameter_size=0\n", r"p\.txt:1: forward_compute_time=-1 must be a finite number >= 0"),
    ("node1 -- Input\n", r"p\.txt:1: expected a layer line of the form"),
    ("node1 -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=0, "
     "parameter_size=0\n\tnode1 -- node9\n", r"p\.txt:2: edge node1 -- node9 names 'node9'"),
    ("node1 -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=0, "
     "parameter_size=0\n" * 2, r"p\.txt:2: layer 'node1' appears twice"),
    ("node1 -- A -- forward_compute_time=1, backward_compute_time=0, activation_size=0, "
     "parameter_size=0\nnode2 -- B -- forward_compute_time=1, backward_compute_time=0, "
     "activation_size=0, parameter_size=0\n\tnode1 -- node2\n\tnode2 -- node1\n",
     r"p\.txt: the graph has a cycle: node2 -> node1 -> node2"),
    ("\n", r"p\.txt: no layer lines"),
])
def test_a_malformed_profile_names_the_file_and_the_line(text, message):
    with pytest.raises(GraphError, match=message):
        parse_profile(text, where="p.txt")


def test_a_missing_profile_says_so(tmp_path):
    with pytest.raises(AutoplaceError, match="does not exist"):
        read_profile(tmp_path / "nothing.graph.txt")


def test_vgg16_profile_partitions_as_the_paper_reports():
    require(PROFILES.is_dir(), f"no PipeDream profiles at {PROFILES} (put the data at "
                               f"../shared/benchdata or set ${benchdata.BENCHDATA_ENV})")
    profile = read_profile(PROFILES / "vgg16.graph.txt")
    assert profile.name == "vgg16" and len(profile.layers) == 41
    chain = training_chain(profile)
    assert len(chain.layers) == 40
    assert chain.input_s == pytest.approx(17.972e-3)  # data loading, not charged
    assert sum(chain.parameter_bytes) == 4 * 138_357_544  # VGG-16's float32 weights
    # 16 devices on PipeDream's Cluster-A network: 15 replicas of the convolutions, the fully
    # connected layers alone (the "15-1" configuration of the paper's Table 1).
    plan = pipedream(chain, TrainingCluster(devices=16))
    assert [s.replicas for s in plan.stages] == [15, 1]
    assert plan.time_per_sample_s < data_parallel(chain, TrainingCluster(devices=16)) \
        .time_per_sample_s
