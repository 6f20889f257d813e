"""Shared links (``Cluster.shared``): the simulator's fair sharing on cases worked out by hand,
the cluster file's shared links and their errors, CP-SAT's relaxation against the simulator,
and results unchanged without shared links."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import zoo

from autoplace.cli import main
from autoplace.cluster.file import load_cluster_file
from autoplace.errors import DeviceSpecError
from autoplace.formats.plan import Plan
from autoplace.ir import (
    Cluster,
    Costs,
    Device,
    Edge,
    HostCosts,
    Link,
    OpGraph,
    OpNode,
    Placement,
    Problem,
    SharedLink,
)
from autoplace.simulate import simulate, validate
from autoplace.simulate.contention import fair_rates
from autoplace.solve import solve
from autoplace.solve.cpsat import solve_cpsat

# Devices a, b, c; every link 100 B/s with 0.5 s latency. Nodes p (on a) and q (on b) each send
# their output to a reader on c: r reads p's, s reads q's. A shared "nic" of 100 B/s carries
# whatever enters c (a -> c and b -> c).
NAMES = ("a", "b", "c", "d")


def _problem(shared: tuple[SharedLink, ...], *, bytes_pq: tuple[int, int] = (100, 100),
             cost_q: float = 1.0) -> Problem:
    devices = tuple(Device(name=n, type="cpu", memory_bytes=10**12) for n in NAMES)
    links = tuple(Link(src=x, dst=y, bandwidth_bytes_per_s=100.0, latency_s=0.5)
                  for x in NAMES for y in NAMES if x != y)
    nodes = (OpNode(name="p", output_bytes=bytes_pq[0]), OpNode(name="q", output_bytes=bytes_pq[1]),
             OpNode(name="r"), OpNode(name="s"))
    graph = OpGraph(nodes=nodes, edges=(Edge("p", "r", bytes_pq[0]), Edge("q", "s", bytes_pq[1])))
    costs = {n.name: dict.fromkeys(NAMES, cost_q if n.name == "q" else 1.0) for n in nodes}
    return Problem(graph=graph, cluster=Cluster(devices=devices, links=links, shared=shared),
                   costs=Costs(compute_s=costs))


NIC_IN_C = SharedLink(name="nic", bandwidth_bytes_per_s=100.0, pairs=(("a", "c"), ("b", "c")))
TO_C = {"p": "a", "q": "b", "r": "c", "s": "c"}


def test_two_equal_copies_on_one_nic_take_twice_as_long():
    # p and q end at 1. Alone each copy moves 100 B at 100 B/s: arrives 1 + 1 + 0.5 = 2.5.
    alone = simulate(_problem(()), Placement(device_of=TO_C))
    assert [alone.start_s[n] for n in "rs"] == pytest.approx([2.5, 3.5])  # c runs r, then s
    # Sharing the NIC, each moves at 50 B/s: 2 s of bytes, arriving at 1 + 2 + 0.5 = 3.5.
    shared = simulate(_problem((NIC_IN_C,)), Placement(device_of=TO_C))
    assert [t.end_s for t in shared.transfers] == pytest.approx([3.5, 3.5])
    assert [shared.start_s[n] for n in "rs"] == pytest.approx([3.5, 4.5])
    assert shared.makespan_s == pytest.approx(5.5)
    assert validate(_problem((NIC_IN_C,)), shared) == []


def test_a_copy_starting_halfway_shares_from_then_on():
    # 200 B each; q ends at 2. p's copy moves alone 1..2 (100 B), then both at 50 B/s: p's last
    # 100 B take 2 s (ends 4, arrives 4.5); q has 100 B moved by 4 and the rest alone at
    # 100 B/s by 5 (arrives 5.5).
    problem = _problem((NIC_IN_C,), bytes_pq=(200, 200), cost_q=2.0)
    s = simulate(problem, Placement(device_of=TO_C))
    ends = {t.src: t.end_s for t in s.transfers}
    assert ends == pytest.approx({"p": 4.5, "q": 5.5})
    assert (s.start_s["r"], s.start_s["s"]) == pytest.approx((4.5, 5.5))
    assert validate(problem, s) == []


def test_a_copy_across_two_resources_gets_the_smaller_share():
    # p: a -> c crosses "out_a" and "in_c"; q: b -> c crosses "in_c"; a second reader t of
    # p's sibling on d: u: a -> d crosses "out_a". All three start at 1 with 100 B.
    # Max-min: out_a (100) has p and u, in_c (100) has p and q: each resource gives 50, so all
    # three move at 50 B/s and arrive at 1 + 2 + 0.5 = 3.5.
    assert fair_rates({"out_a": 100.0, "in_c": 100.0},
                      {"p": (100.0, ("out_a", "in_c")), "q": (100.0, ("in_c",)),
                       "u": (100.0, ("out_a",))}) == pytest.approx({"p": 50, "q": 50, "u": 50})
    # With in_c shared by two more copies, p gets in_c's third; u takes what p leaves of out_a.
    rates = fair_rates({"out_a": 120.0, "in_c": 120.0},
                       {"p": (200.0, ("out_a", "in_c")), "q": (200.0, ("in_c",)),
                        "q2": (200.0, ("in_c",)), "u": (200.0, ("out_a",))})
    assert rates == pytest.approx({"p": 40, "q": 40, "q2": 40, "u": 80})
    # A link slower than its share caps the copy, and the others take the rest.
    assert fair_rates({"r": 100.0}, {"x": (10.0, ("r",)), "y": (500.0, ("r",))}) == \
        pytest.approx({"x": 10, "y": 90})

    out_a = SharedLink(name="out_a", bandwidth_bytes_per_s=100.0, pairs=(("a", "c"),
                                                                         ("a", "d")))
    devices = tuple(Device(name=n, type="cpu", memory_bytes=10**12) for n in NAMES)
    links = tuple(Link(src=x, dst=y, bandwidth_bytes_per_s=100.0, latency_s=0.5)
                  for x in NAMES for y in NAMES if x != y)
    nodes = (OpNode(name="p", output_bytes=100), OpNode(name="q", output_bytes=100),
             OpNode(name="u", output_bytes=100), OpNode(name="r"), OpNode(name="s"),
             OpNode(name="t"))
    graph = OpGraph(nodes=nodes, edges=(Edge("p", "r", 100), Edge("q", "s", 100),
                                        Edge("u", "t", 100)))
    # p and u both on a: u runs 1..2, so its copy starts at 2 while p's (from 1) is half done.
    problem = Problem(graph=graph, cluster=Cluster(devices=devices, links=links,
                                                   shared=(out_a, NIC_IN_C)),
                      costs=Costs(compute_s={n.name: dict.fromkeys(NAMES, 1.0) for n in nodes}))
    s = simulate(problem, Placement(device_of={"p": "a", "u": "a", "q": "b", "r": "c",
                                               "s": "c", "t": "d"},
                                    order={"a": ("p", "u"), "b": ("q",), "c": ("r", "s"),
                                           "d": ("t",)}))
    # 1..2: p and q share in_c at 50 each (p has 50 B). 2..: u joins out_a: p (out_a, in_c),
    # q (in_c), u (out_a) all at 50: p and q finish at 3 (arrive 3.5); u has 50 B, then alone
    # at 100 B/s: done at 3.5, arrives 4.0.
    ends = {t.src: t.end_s for t in s.transfers}
    assert ends == pytest.approx({"p": 3.5, "q": 3.5, "u": 4.0})
    assert validate(problem, s) == []


def test_validate_catches_a_reader_that_starts_before_its_shared_copy_arrives():
    problem = _problem((NIC_IN_C,))
    s = simulate(problem, Placement(device_of=TO_C))
    # Uncontended, r's input would be there at 2.5; sharing the NIC it arrives at 3.5.
    early = dataclasses.replace(s, start_s={**s.start_s, "r": 2.5},
                                end_s={**s.end_s, "r": 3.5})
    assert any("before its input from p" in v for v in validate(problem, early))


def test_no_shared_links_or_ample_ones_change_nothing():
    # A shared link as wide as all links together never binds: the same schedule as without.
    for p in (zoo.fork_join(zoo.cluster(3)), zoo.chain(zoo.cluster(3))):
        names = p.cluster.names
        wide = SharedLink(name="wide", bandwidth_bytes_per_s=1e30,
                          pairs=tuple((a, b) for a in names for b in names if a != b))
        q = dataclasses.replace(p, cluster=dataclasses.replace(p.cluster, shared=(wide,)))
        for device_of in ({n.name: names[i % len(names)] for i, n in enumerate(p.graph.nodes)},
                          {n.name: names[-1 - i % 2] for i, n in enumerate(p.graph.nodes)}):
            before, after = simulate(p, Placement(device_of=device_of)), simulate(
                q, Placement(device_of=device_of))
            assert after.makespan_s == pytest.approx(before.makespan_s, rel=1e-12)
            assert after.start_s == pytest.approx(before.start_s, rel=1e-12)
            assert validate(q, after) == []


def test_a_launched_schedule_with_shared_links_is_consistent():
    # GPUs with launcher costs go through launch.timed: the copies' fair-share times and the
    # launcher's pass agree, and validate re-checks both.
    problem = _problem((NIC_IN_C,), bytes_pq=(200, 200), cost_q=2.0)
    host = HostCosts(launch_s={n: dict.fromkeys(NAMES, 0.1) for n in "pqrs"},
                     call_s=dict.fromkeys(NAMES, 0.05), handover_s=dict.fromkeys(NAMES, 0.01))
    devices = tuple(dataclasses.replace(d, host="h") for d in problem.cluster.devices)
    problem = dataclasses.replace(
        problem, costs=dataclasses.replace(problem.costs, host=host),
        cluster=dataclasses.replace(problem.cluster, devices=devices))
    s = simulate(problem, Placement(device_of=TO_C))
    assert s.launch_order
    free = simulate(dataclasses.replace(problem, cluster=dataclasses.replace(
        problem.cluster, shared=())), Placement(device_of=TO_C))
    assert s.makespan_s > free.makespan_s + 0.5  # p's and q's copies overlap on the NIC
    assert validate(problem, s) == []
    # validate plays the copies once from the recorded starts; a copy recorded later than the
    # launcher issues it no longer matches the launched pass, nor its readers' starts.
    late = [dataclasses.replace(t, start_s=t.start_s + 0.5, end_s=t.end_s + 0.5)
            if t.src == "p" else t for t in s.transfers]
    problems = validate(problem, dataclasses.replace(s, transfers=tuple(late)))
    assert any("the copy of p to c starts at" in v for v in problems), problems


def _cluster_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return path


TWO_HOSTS = """
    [[hosts]]
    name = "h0"
    devices = ["2xA100-40GB"]
    nic_bandwidth_bytes_per_s = 25e9
    [[hosts]]
    name = "h1"
    devices = ["2xA100-40GB"]
"""


def test_a_host_nic_is_crossed_by_every_transfer_leaving_or_entering_it(tmp_path: Path):
    cluster = load_cluster_file(_cluster_file(tmp_path, TWO_HOSTS))
    assert [r.name for r in cluster.shared] == ["nic-out:h0", "nic-in:h0"]
    assert [r.name for r in cluster.shared_on("h0/cuda:1", "h1/cuda:0")] == ["nic-out:h0"]
    assert [r.name for r in cluster.shared_on("h1/cuda:0", "h0/cuda:0")] == ["nic-in:h0"]
    assert cluster.shared_on("h0/cuda:0", "h0/cuda:1") == ()
    assert cluster.shared_on("h1/cuda:0", "h1/cuda:1") == ()


@pytest.mark.parametrize(("extra", "message"), [
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 1e9\ndevices = ["h2/cuda:0"]\n',
     r"shared\[0\]\.devices: unknown device 'h2/cuda:0'; devices: h0/cuda:0"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 1e9\nhosts = ["h9"]\n',
     r"shared\[0\]\.hosts: unknown host 'h9'; hosts: h0, h1"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 1e9\npairs = [["h0/cuda:0", "h0/cuda:0"]]\n',
     r"pairs\[0\]: both ends are 'h0/cuda:0'"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 1e9\n',
     r"shared\[0\]: say which transfers cross it: devices, hosts or pairs"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 1e9\nhosts = ["h0", "h1"]\n',
     r"lists every device"),
    ('[[shared]]\nname = "nic-out:h0"\nbandwidth_bytes_per_s = 1e9\nhosts = ["h1"]\n',
     r"cluster.toml: shared link name 'nic-out:h0' is used twice \(a host's NIC is named "
     r"nic-in:HOST and nic-out:HOST\)"),
    # A NIC on a host without devices: the loader refuses the host before any link is made.
    ('[[hosts]]\nname = "h2"\nnic_bandwidth_bytes_per_s = 1e9\n',
     r"host\(s\) 'h2' have no devices"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = 0\nhosts = ["h1"]\n',
     r"shared\[0\]\.bandwidth_bytes_per_s: 0 is less than or equal to"),
    ('[[shared]]\nname = "sw"\nbandwidth_bytes_per_s = inf\nhosts = ["h1"]\n',
     r"shared\[0\]\.bandwidth_bytes_per_s: inf is not a finite number"),
])
def test_shared_links_that_do_not_match_the_devices_are_errors(tmp_path: Path, extra: str,
                                                                message: str):
    path = _cluster_file(tmp_path, TWO_HOSTS)
    path.write_text(path.read_text() + extra)
    with pytest.raises(DeviceSpecError, match=message):
        load_cluster_file(path)


# A fork-join task graph timed by device type: s feeds two branches t joins (10 MB each).
GRAPH = """{"name": "fork", "nodes": [
  {"name": "s", "compute_s": {"A100-40GB": 0.001}, "output_bytes": 10000000},
  {"name": "b0", "compute_s": {"A100-40GB": 0.01}, "output_bytes": 10000000},
  {"name": "b1", "compute_s": {"A100-40GB": 0.01}, "output_bytes": 10000000},
  {"name": "t", "compute_s": {"A100-40GB": 0.001}}],
 "edges": [{"src": "s", "dst": "b0", "bytes": 10000000},
           {"src": "s", "dst": "b1", "bytes": 10000000},
           {"src": "b0", "dst": "t", "bytes": 10000000},
           {"src": "b1", "dst": "t", "bytes": 10000000}]}"""


def test_a_nic_on_the_only_host_is_an_error_and_the_cli_exits_2(tmp_path: Path, capsys):
    path = _cluster_file(tmp_path, """
        [[hosts]]
        name = "solo"
        devices = ["2xA100-40GB"]
        nic_bandwidth_bytes_per_s = 25e9
    """)
    with pytest.raises(DeviceSpecError, match="no transfer leaves host 'solo'.*only host"):
        load_cluster_file(path)
    graph = tmp_path / "g.json"
    graph.write_text(GRAPH)
    assert main(["solve", str(graph), "--cluster", str(path), "--out",
                 str(tmp_path / "out")]) == 2
    assert "only host" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_plan_keeps_the_cluster_files_shared_links(tmp_path: Path):
    graph = tmp_path / "g.json"
    graph.write_text(GRAPH)
    cluster = _cluster_file(tmp_path, TWO_HOSTS)
    assert main(["solve", str(graph), "--cluster", str(cluster), "--out", str(tmp_path / "out"),
                 "--time-limit", "5"]) == 0
    plan = Plan.load(tmp_path / "out" / "plan.json")
    assert plan.problem.cluster.shared == load_cluster_file(cluster).shared
    assert validate(plan.problem, plan.schedule) == []


def _fork_join_on_two_hosts(shared: bool) -> Problem:
    # s feeds four branches of 3 s that t joins; 100 B per edge; links 100 B/s between hosts,
    # 1000 B/s within one, each host's NIC 100 B/s each way.
    devices = tuple(Device(name=f"h{h}/d{i}", type="cpu", memory_bytes=10**12, host=f"h{h}")
                    for h in range(2) for i in range(2))
    links = tuple(Link(src=x.name, dst=y.name, latency_s=0.01,
                       bandwidth_bytes_per_s=1000.0 if x.host == y.host else 100.0)
                  for x in devices for y in devices if x is not y)
    out = tuple((a.name, b.name) for a in devices for b in devices if a.host != b.host)
    nics = tuple(SharedLink(name=f"nic-{way}:h{h}", bandwidth_bytes_per_s=100.0,
                            pairs=tuple(p for p in out if p[0 if way == "out" else 1]
                                        .startswith(f"h{h}/")))
                 for h in range(2) for way in ("out", "in"))
    nodes = (OpNode(name="s", output_bytes=100),
             *(OpNode(name=f"b{i}", output_bytes=100) for i in range(4)), OpNode(name="t"))
    edges = (*(Edge("s", f"b{i}", 100) for i in range(4)),
             *(Edge(f"b{i}", "t", 100) for i in range(4)))
    costs = {n.name: {d.name: 0.1 if n.name in "st" else 3.0 for d in devices} for n in nodes}
    return Problem(graph=OpGraph(nodes=nodes, edges=edges),
                   cluster=Cluster(devices=devices, links=links, shared=nics if shared else ()),
                   costs=Costs(compute_s=costs))


def test_cpsat_bound_holds_under_contention_and_agrees_with_the_simulator():
    free, shared = _fork_join_on_two_hosts(False), _fork_join_on_two_hosts(True)
    ignored = solve_cpsat(free, time_limit_s=20, workers=1, seed=0, deterministic=True)
    aware = solve_cpsat(shared, time_limit_s=20, workers=1, seed=0, deterministic=True)
    assert (ignored.status, aware.status) == ("OPTIMAL", "OPTIMAL")
    # Ignoring contention: two branches per host, 0.1 + 1.01 + 3 + 1.01 + 0.1 + ... = 4.32.
    assert ignored.objective_s == pytest.approx(4.32)
    # That plan's two copies out of s's host share one NIC, and so do the two back to t.
    replayed = simulate(shared, ignored.placement)
    assert replayed.makespan_s == pytest.approx(ignored.objective_s + 1.0)  # s sends 2 s, not 1
    # The aware model sees the shared NIC (s's two copies out take 2 s: 0.1 + 2 + 3 + 0.1),
    # and its optimum stays below what the simulator makes of its plan: a valid bound.
    assert aware.objective_s == pytest.approx(5.2)
    schedule = simulate(shared, aware.placement)
    assert validate(shared, schedule) == []
    assert aware.bound_s <= schedule.makespan_s + 1e-9
    assert schedule.makespan_s <= replayed.makespan_s + 1e-9
    # What the model leaves out: the latencies and a copy within the host (0.01 + 0.11).
    assert schedule.makespan_s == pytest.approx(5.32)
    result = solve(shared, time_limit_s=20, seed=0, workers=1)
    assert result.lower_bound_s <= result.schedule.makespan_s + 1e-9
    assert validate(shared, result.schedule) == []


def test_cpsat_bound_is_below_every_simulated_plan_on_random_graphs():
    # The relaxation's claim, checked where it could fail: on small random DAGs whose copies
    # meet on the NICs, CP-SAT's proven bound is below the simulated makespan of its own plan
    # and of random placements (each at least the optimum under contention).
    import random

    base = _fork_join_on_two_hosts(True)
    names = base.cluster.names
    for seed in range(4):
        rng = random.Random(seed)
        nodes = tuple(OpNode(name=f"n{i}", output_bytes=200) for i in range(7))
        edges = tuple(Edge(f"n{i}", f"n{j}", rng.choice((50, 100, 200)))
                      for i in range(7) for j in range(i + 1, 7) if rng.random() < 0.4)
        costs = {n.name: dict.fromkeys(names, rng.choice((0.5, 1.0, 2.0))) for n in nodes}
        problem = Problem(graph=OpGraph(nodes=nodes, edges=edges), cluster=base.cluster,
                          costs=Costs(compute_s=costs))
        result = solve_cpsat(problem, time_limit_s=20, workers=1, seed=0, deterministic=True)
        plans = [result.placement] + [
            Placement(device_of={n.name: rng.choice(names) for n in nodes}) for _ in range(30)]
        for placement in plans:
            schedule = simulate(problem, placement)
            assert validate(problem, schedule) == []
            assert result.bound_s <= schedule.makespan_s + 1e-9, (seed, placement)


def test_whatif_keeps_the_shared_links_among_the_devices_it_keeps():
    from autoplace.solve.whatif import restrict

    problem = _fork_join_on_two_hosts(True)
    sub = restrict(problem, ("h0/d0", "h1/d0", "h1/d1"))
    shared = {r.name: set(r.pairs) for r in sub.cluster.shared}
    assert shared["nic-out:h0"] == {("h0/d0", "h1/d0"), ("h0/d0", "h1/d1")}
    assert shared["nic-in:h0"] == {("h1/d0", "h0/d0"), ("h1/d1", "h0/d0")}
    assert restrict(problem, ("h1/d0", "h1/d1")).cluster.shared == ()


def test_placement_independent_dps_charge_the_slowest_shared_resource():
    # A lone copy into c crosses a 25 B/s switch, slower than every link (100 B/s): the copy
    # time the contiguous-split and ideal DPs charge before they know the ends is that one's.
    from autoplace.solve.baselines.partition import slowest_delay_s

    slow = SharedLink(name="switch", bandwidth_bytes_per_s=25.0, pairs=(("a", "c"),))
    problem = _problem((slow,))
    edge = problem.graph.edges[0]  # 100 B
    assert problem.delay_s(edge, "a", "c") == pytest.approx(0.5 + 100 / 25)
    assert slowest_delay_s(problem, edge) == pytest.approx(0.5 + 100 / 25)
    assert slowest_delay_s(_problem(()), edge) == pytest.approx(0.5 + 100 / 100)


def _swappable(problem: Problem, a: str, b: str) -> bool:
    """The definition: swapping devices ``a`` and ``b`` keeps every cost, memory, link and
    shared resource (each pair set mapped onto itself)."""
    cluster, swap = problem.cluster, {a: b, b: a}
    da, db = cluster.device(a), cluster.device(b)
    if (da.type, da.memory_bytes) != (db.type, db.memory_bytes) or any(
            problem.costs.of(n.name, a) != problem.costs.of(n.name, b)
            for n in problem.graph.nodes):
        return False
    if any({(swap.get(p, p), swap.get(q, q)) for p, q in r.pairs} != set(r.pairs)
           for r in cluster.shared):
        return False
    speed = {(k.src, k.dst): (k.bandwidth_bytes_per_s, k.latency_s) for k in cluster.links}
    return all(speed[p, q] == speed[swap.get(p, p), swap.get(q, q)] for p, q in speed)


@pytest.mark.parametrize("shared", [(), (NIC_IN_C,), (NIC_IN_C, dataclasses.replace(
    NIC_IN_C, name="out", pairs=(("c", "a"), ("d", "a"))))], ids=["none", "nic-in", "two"])
def test_identical_devices_are_those_a_swap_cannot_tell_apart(shared) -> None:
    from autoplace.solve.cpsat import _identical_classes

    problem = _problem(shared)
    classes = _identical_classes(problem)
    found = {d: tuple(c) for c in classes for d in c}
    for a in NAMES:
        for b in NAMES:
            if a < b:
                assert (found.get(a, (a,)) == found.get(b, (b,))) == _swappable(problem, a, b)


def test_identical_devices_of_many_hosts_are_found_fast(tmp_path: Path) -> None:
    # 64 hosts of 8 A100s, each host's NIC a shared resource of its own: 64 classes of 8
    # (1.6 s here)
    import time

    from autoplace.solve.cpsat import _identical_classes

    text = "".join(f'[[hosts]]\nname = "h{i}"\ndevices = ["8xA100-80GB"]\n'
                   "nic_bandwidth_bytes_per_s = 25e9\n" for i in range(64))
    cluster = load_cluster_file(_cluster_file(tmp_path, text))
    graph = OpGraph(nodes=(OpNode(name="x"),), edges=())
    problem = Problem(graph=graph, cluster=cluster, costs=Costs(compute_s={
        "x": dict.fromkeys(cluster.names, 1.0)}))
    began = time.perf_counter()
    classes = _identical_classes(problem)
    seconds = time.perf_counter() - began
    assert sorted(len(c) for c in classes) == [8] * 64
    assert all(len({d.split("/")[0] for d in c}) == 1 for c in classes)  # one host each
    assert _swappable(problem, "h0/cuda:0", "h0/cuda:7")
    assert not _swappable(problem, "h0/cuda:0", "h1/cuda:0")
    assert seconds < 30, seconds
