"""Data-parallel replicas in the planner (``train.dataparallel``): alike device groups, the
gradients' all-reduce charged to the updates, and the replica count chosen by step time."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_train import MLP, WithLoss, _forward_problem

from autoplace.cluster import resolve_cluster
from autoplace.config import Config, Cost, Emit, Solve, Training
from autoplace.errors import ConfigError
from autoplace.ir import Cluster, Device, Link
from autoplace.pipeline import plan
from autoplace.simulate.schedules import STEP
from autoplace.train import step_problem
from autoplace.train.dataparallel import (
    BUCKET_BYTES,
    allreduce_s,
    replica_groups,
    with_allreduce,
)
from cost_models import LINK_CATALOG, ring_allreduce_s


def test_groups_are_alike_and_dealt_by_type() -> None:
    cluster, _ = resolve_cluster(spec="2xA100-40GB,2xT4-16GB")
    assert replica_groups(cluster, 2) == [("cuda:0", "cuda:2"), ("cuda:1", "cuda:3")]
    assert replica_groups(cluster, 1) == [cluster.names]
    assert replica_groups(cluster, 4) is None  # an A100 replica and a T4 one differ
    assert replica_groups(cluster, 3) is None  # 3 does not divide 4
    odd, _ = resolve_cluster(spec="3xA100-40GB,1xT4-16GB")
    assert replica_groups(odd, 2) is None


@pytest.mark.parametrize("microbatches", [1, 2])
def test_each_update_pays_its_share_of_the_ring_all_reduce(microbatches: int) -> None:
    # With micro-batches, once a step: the update follows every micro-batch's backward.
    cluster, _ = resolve_cluster(spec="4xA100-40GB")
    forward = _forward_problem(WithLoss(MLP()), "4xA100-40GB")
    groups = replica_groups(cluster, 2)
    one = step_problem(dataclasses.replace(forward, cluster=cluster), "adam",
                       microbatches=microbatches, schedule="gpipe")
    from autoplace.solve.whatif import restrict

    one = restrict(one, groups[0])
    two = with_allreduce(one, cluster, groups)
    link = cluster.link("cuda:0", "cuda:1")
    fc1 = 784 * 256 * 4 + 256 * 4  # the first layer's gradient bytes
    added = two.costs.of("linear@step", "cuda:0") - one.costs.of("linear@step", "cuda:0")
    # 2 (R-1)/R * bytes / bandwidth, and the ring's 2 latencies in the share of a
    # 25 MiB bucket that the gradient fills
    expected = (fc1 / link.bandwidth_bytes_per_s
                + 2 * link.latency_s * fc1 / BUCKET_BYTES)
    assert added == pytest.approx(expected)
    assert allreduce_s(2 * BUCKET_BYTES, 2, 1e9, 1e-3) == pytest.approx(
        ring_allreduce_s(2 * BUCKET_BYTES, 2, bandwidth_bytes_per_s=1e9, latency_s=1e-3))
    # only updates pay; one replica pays nothing
    for node in one.graph.nodes:
        if not node.name.endswith(STEP):
            assert two.costs.of(node.name, "cuda:0") == one.costs.of(node.name, "cuda:0")
    assert with_allreduce(one, cluster, [cluster.names]) is one


def _mlp_plan(devices: str, *, emit: bool = True, **training):
    torch.manual_seed(0)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    config = Config(devices=devices, mode="training",
                    solve=Solve(time_limit_s=2, whatif=False, min_gain=0.0),
                    training=Training(optimizer="adam", **training), emit=Emit(model=emit))
    return plan(MLP(), (x,), config, loss=F.cross_entropy, example_targets=(y,)).plan


def test_the_planner_times_every_replica_count_and_keeps_the_fastest() -> None:
    planned = _mlp_plan(devices="4xA100-40GB", emit=False)
    options = planned.training.replica_options
    assert [o.replicas for o in options] == [1, 2, 4]
    best = min(options, key=lambda o: o.step_s)
    assert planned.training.replicas == best.replicas
    assert planned.makespan_s == pytest.approx(best.step_s)
    # the plan is one replica's: its devices are the first group's
    r = planned.training.replicas
    assert len(planned.problem.cluster.devices) == 4 // r
    assert any("data-parallel replicas: R=1" in n and f"R={r} kept" in n
               for n in planned.notes)
    if r > 1:  # the report and the notes say the plan is one replica's
        from autoplace.report.analysis import overview

        assert f"per replica; {r} data-parallel replicas, 4 devices in all" in \
            overview(planned).devices_text
        assert any("One device on the whole batch takes" in n for n in planned.notes)


def test_replicas_that_cannot_be_are_said_or_refused() -> None:
    # a batch of 64 does not divide into 3 replicas; the devices into 3 groups of alike ones
    planned = _mlp_plan(devices="2xA100-40GB,1xT4-16GB", emit=False)
    assert [o.replicas for o in planned.training.replica_options] == [1]
    assert any("3 data-parallel replicas not considered" in n for n in planned.notes)
    with pytest.raises(ConfigError, match="training.replicas=3: the 3 devices do not form 3 alike"):
        _mlp_plan(devices="2xA100-40GB,1xT4-16GB", emit=False, replicas=3)
    # each replica's shard of 32 does not divide into 3 micro-batches
    with pytest.raises(ConfigError, match=r"training.replicas=2 training.microbatches=3: each "
                       r"replica's shard: the batch of 32 .* does not divide into 3 micro-batches"):
        _mlp_plan(devices="2xA100-40GB", emit=False, replicas=2, microbatches=3)
    with pytest.raises(ConfigError, match="training.replicas must be auto or a whole number"):
        _mlp_plan(devices="2xA100-40GB", emit=False, replicas=0)


def test_auto_keeps_the_replica_counts_whose_shards_divide_into_the_micro_batches() -> None:
    # a batch of 12 in 4 micro-batches: R=1 (3 each); R=2's shards of 6 and R=4's of 3 do not
    torch.manual_seed(0)
    x, y = torch.randn(12, 784), torch.randint(0, 10, (12,))
    planned = plan(
        MLP(),
        (x,),
        Config(
            devices="4xA100-40GB",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False),
            cost=Cost(profile=False),
            training=Training(optimizer="adam", microbatches=4),
            emit=Emit(model=False),
        ),
        loss=F.cross_entropy,
        example_targets=(y,),
    ).plan
    assert [o.replicas for o in planned.training.replica_options] == [1]
    for r, rows in ((2, 6), (4, 3)):
        assert any(n.startswith(f"{r} data-parallel replicas not considered: each replica's "
                                f"shard: the batch of {rows} ") for n in planned.notes)
    # a batch of 64 in 2 micro-batches: every R, the micro-batched replicas among them
    planned = _mlp_plan(devices="4xA100-40GB", emit=False, microbatches=2, schedule="gpipe")
    assert [o.replicas for o in planned.training.replica_options] == [1, 2, 4]
    assert planned.training.microbatches == 2


def test_a_summed_loss_is_not_replicated_because_ddp_averages_gradients() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    planned = plan(
        MLP(),
        (x,),
        Config(
            devices="2xA100-40GB",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False),
            cost=Cost(profile=False),
            training=Training(optimizer="sgd"),
            emit=Emit(model=False),
        ),
        loss=lambda out, t: F.cross_entropy(out, t, reduction="sum"),
        example_targets=(y,),
    ).plan
    assert planned.training.replicas == 1
    assert any("2 data-parallel replicas not considered: the loss is the sum" in n
               for n in planned.notes)


def _hosts(*hosts: int) -> Cluster:
    """A100s on hosts (``hosts[i]`` devices on host i): NVLink inside a host, 10 Gb/s between."""
    devices = [Device(name=f"h{h}/cuda:{i}", type="A100-40GB", memory_bytes=40 * 2**30,
                      host=f"h{h}") for h, count in enumerate(hosts) for i in range(count)]
    links = [Link(src=a.name, dst=b.name, latency_s=2e-6 if a.host == b.host else 1e-5,
                  bandwidth_bytes_per_s=3e11 if a.host == b.host else 1.25e9)
             for a in devices for b in devices if a is not b]
    return Cluster(devices=tuple(devices), links=tuple(links))


def test_a_replica_keeps_to_its_host_and_groups_with_other_links_are_not_alike() -> None:
    assert replica_groups(_hosts(2, 2), 2) == [("h0/cuda:0", "h0/cuda:1"),
                                               ("h1/cuda:0", "h1/cuda:1")]
    # 3 + 1: any two groups of two differ in their inside links (NVLink against the network)
    assert replica_groups(_hosts(3, 1), 2) is None
    assert replica_groups(_hosts(3, 1), 4) is not None  # one device each: nothing inside


def test_cpu_workers_replicas_all_reduce_through_gloo_not_their_thread_link() -> None:
    # The replicas are processes: two worker threads' hand-over by reference is not theirs.
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    from autoplace.solve.whatif import restrict

    one = restrict(step_problem(forward, "sgd"), ("cpu:0",))
    two = with_allreduce(one, cluster, replica_groups(cluster, 2))
    loopback = LINK_CATALOG["gloo-loopback"]
    fc1 = 784 * 256 * 4 + 256 * 4
    added = two.costs.of("linear@step", "cpu:0") - one.costs.of("linear@step", "cpu:0")
    assert added == pytest.approx(allreduce_s(fc1, 2, loopback.bandwidth_bytes_per_s,
                                              loopback.latency_s))
    assert cluster.link("cpu:0", "cpu:1").bandwidth_bytes_per_s > 5 * loopback.bandwidth_bytes_per_s
    # measured links (profiling) are no different: the replicas are still processes
    measured = dataclasses.replace(cluster, links=tuple(
        dataclasses.replace(lk, kind="measured", bandwidth_bytes_per_s=4e10)
        for lk in cluster.links))
    again = with_allreduce(one, measured, replica_groups(measured, 2))
    assert again.costs.of("linear@step", "cpu:0") == two.costs.of("linear@step", "cpu:0")
