"""Tests for the threaded runtime (``autoplace.emit.runtime``, ``autoplace.emit.codegen.threaded``)
and the ``cpu-thread`` devices.

The emitted model's ``program`` is checked by hand on a two-branch model, run on worker threads
(one per planned device, each on one torch thread) against the original with
``torch.testing.assert_close``, saved and loaded, made to fail, and replayed against the
simulator.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from zoo import TwoBranch, by_module

from autoplace.cluster import resolve_cluster
from autoplace.cluster.detect import device_key, inventory
from autoplace.config import Config, Solve
from autoplace.emit import emit_model, load_model, save_model
from autoplace.emit.check.replay import replay
from autoplace.emit.runtime.program import Handover, Program, Run, build_program
from autoplace.ir import Costs, Edge, OpGraph, OpNode, Placement, Problem
from autoplace.pipeline import plan
from autoplace.profile.links import measure_handover
from autoplace.profile.timing import threads_for, timer_for
from autoplace.simulate import simulate

CPU0, CPU1 = "cpu:0", "cpu:1"




@pytest.fixture(scope="module")
def two_branch() -> tuple[torch.nn.Module, torch.Tensor, torch.fx.GraphModule, dict[str, str]]:
    # left on cpu:0, right on cpu:1, head on cpu:0: segments 0 (cpu:0: left), 1 (cpu:1: right),
    # 2 (cpu:0: head). Each worker takes the input x from the caller; right's output is handed
    # from cpu:1 to cpu:0 once, for the head.
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(3, 16)
    gm = torch.export.export(model, (x,), strict=False).module()
    return model, x, gm, by_module(gm, {"left": CPU0, "right": CPU1, "head": CPU0},
                                    default=CPU0)


def test_two_cpu_threads_are_two_devices_with_a_thread_link() -> None:
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    assert [(d.name, d.type, d.torch_device) for d in cluster.devices] == [
        (CPU0, "cpu-thread", CPU0), (CPU1, "cpu-thread", CPU1)]
    assert cluster.link(CPU0, CPU1).kind == "thread"
    # cpu-thread workers are profiled on one torch thread, and cached apart from the host CPU
    inv = inventory()
    assert device_key(CPU0, inv) == device_key(CPU1, inv)
    assert device_key(CPU0, inv).endswith(":1t-cputime")
    assert timer_for(CPU0).clock is time.thread_time and timer_for("cpu").clock is time.perf_counter


def test_profiling_a_thread_worker_uses_one_torch_thread() -> None:
    before = torch.get_num_threads()
    with threads_for(CPU1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with threads_for("cpu"):
        assert torch.get_num_threads() == before
    assert 0 < measure_handover(rounds=20) < 0.05


def test_program_hands_each_value_over_once_right_after_its_producer(two_branch) -> None:
    model, x, gm, device_of = two_branch
    emitted = emit_model(gm, device_of)
    assert emitted.runtime == "threaded"
    program = emitted.program
    devices = [d for d, _ in emitted.segments]
    assert devices == [CPU0, CPU1, CPU0]  # left | right | head, hand-worked above
    # right's output (segment 1) goes to cpu:0 once, issued right after segment 1 on cpu:1
    assert program.workers[CPU1] == (
        Run(segment=1, waits=(), inputs_from_caller=("x",)),
        Handover(id=0, value=program.handovers[0].value, after=1, src_device=CPU1,
                 dst_device=CPU0))
    first, last = program.workers[CPU0]
    assert first == Run(segment=0, waits=(), inputs_from_caller=("x",))
    assert last.segment == 2 and last.waits == (0,)
    torch.testing.assert_close(emitted(x), model(x))


def test_each_worker_runs_its_segments_on_its_own_single_threaded_thread(two_branch) -> None:
    model, x, gm, device_of = two_branch
    emitted = emit_model(gm, device_of)
    seen: dict[int, tuple[str, int]] = {}
    for index in range(len(emitted.segments)):
        def hook(module, args, index=index):
            seen[index] = (threading.current_thread().name, torch.get_num_threads())
        getattr(emitted, f"seg{index}").register_forward_pre_hook(hook)
    torch.testing.assert_close(emitted(x), model(x))
    assert seen[0][0] == seen[2][0] == f"autoplace-{CPU0}"
    assert seen[1][0] == f"autoplace-{CPU1}"
    assert all(threads == 1 for _, threads in seen.values())
    torch.testing.assert_close(emitted(x * 2), model(x * 2))  # the workers are reused


def test_sequential_and_threaded_runtimes_agree_and_save(two_branch, tmp_path) -> None:
    model, x, gm, device_of = two_branch
    sequential = emit_model(gm, device_of, runtime="sequential")
    threaded = emit_model(gm, device_of, runtime="threaded")
    torch.testing.assert_close(sequential(x), threaded(x))
    save_model(threaded, tmp_path)
    assert "_run_program(self, _program" in (tmp_path / "model.py").read_text()
    torch.testing.assert_close(load_model(tmp_path)(x), model(x))


def test_a_failing_worker_raises_in_the_caller_and_does_not_hang(two_branch) -> None:
    _, _, gm, device_of = two_branch
    emitted = emit_model(gm, device_of)
    with pytest.raises(RuntimeError):
        emitted(torch.randn(3, 5))  # wrong width: the first segment of each worker fails
    emitted(torch.randn(3, 16))  # and the workers still serve the next call


def test_build_program_rejects_a_segment_order_that_is_not_topological() -> None:
    from autoplace.errors import EmitError

    with pytest.raises(EmitError, match="topological"):
        build_program([CPU0, CPU1], [["b"], ["a"]], {"a": 0, "b": 1})


def _chain_problem() -> Problem:
    """a (cpu:0, 3 s) -> b (cpu:1, 2 s) and a -> c (cpu:0, 4 s) -> d (cpu:0, 1 s) <- b."""
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    nodes = tuple(OpNode(name=n, output_bytes=8) for n in "abcd")
    edges = (Edge("a", "b", 8), Edge("a", "c", 8), Edge("b", "d", 8), Edge("c", "d", 8))
    cost = {"a": 3.0, "b": 2.0, "c": 4.0, "d": 1.0}
    costs = Costs({n: {CPU0: cost[n], CPU1: cost[n]} for n in cost})
    return Problem(graph=OpGraph(nodes=nodes, edges=edges, outputs=("d",)), cluster=cluster,
                   costs=costs)


def test_replay_matches_the_simulator_and_can_fail() -> None:
    problem = _chain_problem()
    placement = Placement(device_of={"a": CPU0, "b": CPU1, "c": CPU0, "d": CPU0})
    schedule = simulate(problem, placement)
    program = build_program([CPU0, CPU1, CPU0, CPU0], [[], ["a"], ["a"], ["b", "c"]],
                            {"a": 0, "b": 1, "c": 2})
    ops = [["a"], ["b"], ["c"], ["d"]]
    played = replay(program, ops, problem=problem, schedule=schedule)
    assert played.makespan_s == pytest.approx(schedule.makespan_s)  # 3 + 4 + 1, b overlaps c
    # measured durations instead of the plan's: a 1 s each, b 5 s now ends after c
    timed = replay(program, ops, problem=problem, schedule=schedule, segment_s=[1, 5, 1, 1])
    link = problem.cluster.transfer_s(CPU0, CPU1, 8)
    assert timed.makespan_s == pytest.approx(1 + link + 5 + link + 1)
    # The same segments all on one worker (what a sequential host thread does) lose the overlap
    serial = Program(workers={CPU0: tuple(Run(segment=i, waits=()) for i in range(4))},
                     handovers=())
    slow = replay(serial, ops, problem=problem, schedule=schedule)
    assert slow.makespan_s == pytest.approx(10.0) and slow.error(schedule.makespan_s) > 0.05


def test_replay_takes_a_shared_links_copies_from_the_schedule() -> None:
    # a (cpu:0) -> b (cpu:1) and x (cpu:1) -> y (cpu:0) copy at once over one shared resource
    # of 8 bytes/s: each 8-byte copy takes 2 s (1 s alone), as the simulator scheduled it.
    import dataclasses

    from autoplace.ir import SharedLink

    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    cluster = dataclasses.replace(cluster, shared=(SharedLink(
        name="sw", bandwidth_bytes_per_s=8.0, pairs=((CPU0, CPU1), (CPU1, CPU0))),))
    nodes = tuple(OpNode(name=n, output_bytes=8) for n in "axby")
    costs = Costs({n: {CPU0: 1.0, CPU1: 1.0} for n in "axby"})
    problem = Problem(graph=OpGraph(nodes=nodes, edges=(Edge("a", "b", 8), Edge("x", "y", 8)),
                                    outputs=("b", "y")), cluster=cluster, costs=costs)
    schedule = simulate(problem, Placement(device_of={"a": CPU0, "x": CPU1, "b": CPU1,
                                                      "y": CPU0}))
    assert schedule.makespan_s == pytest.approx(1 + 2 + 1, rel=1e-3)
    program = build_program([CPU0, CPU1, CPU1, CPU0], [[], [], ["a"], ["x"]], {"a": 0, "x": 1})
    played = replay(program, [["a"], ["x"], ["b"], ["y"]], problem=problem, schedule=schedule)
    assert played.makespan_s == pytest.approx(schedule.makespan_s)


@pytest.mark.parametrize("example", ["mlp", "inception"])
def test_replay_of_an_example_is_within_five_percent(example: str) -> None:
    from pathlib import Path

    from autoplace.trace.load import load_model_file

    loaded = load_model_file(Path(__file__).parents[1] / "examples" / f"{example}.py")
    planned, emitted = plan(
        loaded.model,
        loaded.kwargs or loaded.args,
        Config(devices="2xA100-40GB", name=example, solve=Solve(time_limit_s=2, whatif=False)),
    )
    played = replay(emitted.program, [s.nodes for s in emitted.segment_info],
                    problem=planned.problem, schedule=planned.schedule)
    assert played.error(planned.makespan_s) <= 0.05
    assert planned.verification.status == "passed"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_devices_launched_from_one_thread_match_the_original(two_branch) -> None:
    # Planned on cuda:0 and cuda:1; with one GPU here both run on cuda:0, still a stream per
    # planned device, launched from the caller's thread, and a copy stream for the handover.
    model, x, gm, device_of = two_branch
    gpus = {CPU0: "cuda:0", CPU1: "cuda:1"}
    count = torch.cuda.device_count()
    emitted = emit_model(gm, {op: gpus[d] for op, d in device_of.items()},
                         device_map=None if count > 1 else {"cuda:1": "cuda:0"})
    assert emitted.runtime == "threaded"
    for _ in range(3):
        out = emitted(x.to("cuda:0"))
    torch.testing.assert_close(out.cpu(), model(x))


def test_a_value_is_dropped_after_its_last_reader(two_branch) -> None:
    import weakref

    model, x, gm, device_of = two_branch
    emitted = emit_model(gm, device_of)
    moved: list[weakref.ref] = []
    alive_at_head: list[bool] = []
    # seg0 (left, cpu:0) reads its own copy of x, which nothing after it reads
    emitted.seg0.register_forward_pre_hook(lambda m, args: moved.append(weakref.ref(args[-1])))
    emitted.seg2.register_forward_pre_hook(
        lambda m, args: alive_at_head.append(moved[-1]() is not None))
    with torch.no_grad():  # with autograd, the left branch's graph would keep its input
        torch.testing.assert_close(emitted(x), model(x))
    assert alive_at_head == [False]


class Branches(torch.nn.Module):
    # four branches of two layers each and a head: many ways to interleave three workers
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(8, 8)
        self.branches = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
            for _ in range(4))
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.stem(x))
        return self.head(torch.cat([b(h) + h for b in self.branches], dim=-1))


@pytest.mark.parametrize("seed", range(6))
def test_random_placements_and_orders_run_threaded_and_match(seed: int) -> None:
    import random

    rng = random.Random(seed)
    torch.manual_seed(seed)
    model, x = Branches().eval(), torch.randn(2, 8)
    gm = torch.export.export(model, (x,), strict=False).module()
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    device_of = {n.name: f"cpu:{rng.randrange(3)}" for n in ops}
    # a random topological order: any ready op may go next
    waiting = {n: sum(p in ops for p in n.all_input_nodes) for n in ops}
    ready, order = [n for n, k in waiting.items() if k == 0], []
    while ready:
        n = ready.pop(rng.randrange(len(ready)))
        order.append(n.name)
        for user in n.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    ready.append(user)
    emitted = emit_model(gm, device_of, order=order, runtime="threaded")
    with torch.no_grad():
        torch.testing.assert_close(emitted(x), model(x))
    # every handover is issued on its producer's worker right after the producer's run
    for h in emitted.program.handovers:
        steps = emitted.program.workers[h.src_device]
        at = steps.index(h)
        previous = [s for s in steps[:at] if isinstance(s, Run)]
        assert previous[-1].segment == h.after


def test_cli_plans_inception_on_two_cpu_threads_and_runs_it_threaded(tmp_path) -> None:
    import json
    from pathlib import Path

    from autoplace.cli import main

    root = Path(__file__).parents[1]
    out = tmp_path / "out"
    code = main(["plan", str(root / "examples" / "inception.py"), "--devices", "2xcpu-thread",
                 "--time-limit", "2", "--out", str(out)])
    assert code == 0
    planned = json.loads((out / "plan.json").read_text())
    assert {d["type"] for d in planned["devices"]} == {"cpu-thread"}
    assert planned["verification"]["status"] == "passed"
    assert planned["profile"]["devices"][0]["device_key"].endswith(":1t-cputime")
    used = {n["device"] for n in planned["nodes"] if not n["is_input"]}
    meta = json.loads((out / "model" / "meta.json").read_text())
    assert meta["runtime"] == ("threaded" if len(used) > 1 else "sequential")
