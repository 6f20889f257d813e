"""The profiler on the CPU: tiny zoo models give positive medians and a cost source per node;
identical ops are measured once; CPU ops are timed where they run (in situ), so an op whose state
the op before it sets up just works there, and timed alone it is timed with its neighbour; the
timing loops and the CUDA timer's choice; the NVML inventory with pynvml absent, failing, or
answering; `autoplace profile` and `plan --profile` in-process, and their bad input. No timing
assertions: only that times are positive and the bookkeeping is right."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch
import zoo
from torch import nn

from autoplace.cli import main
from autoplace.cluster import HostInfo, Inventory, inventory, present_devices, resolve_cluster
from autoplace.config import Config, Cost, Devices, Emit, Solve
from autoplace.formats.plan_check import validate_plan_dict
from autoplace.ir import Cluster
from autoplace.pipeline import plan
from autoplace.profile import open_cache, profile_model
from autoplace.profile.cache import ProfileCache
from autoplace.profile.ops import _time_in_situ, op_signature
from autoplace.profile.timing import ClockTimer, CudaEventTimer, measure, timer_for
from autoplace.trace import trace_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CPU_HERE = Inventory(host=HostInfo(cpu_model="test CPU", logical_cpus=2, torch_threads=1))


def parse_device_spec(spec: str) -> Cluster:
    cluster, _ = resolve_cluster(spec=spec)
    return cluster


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path / "cache"))


def _profile(model, args, spec="cpu", cache=None, **kw):
    model.eval()
    traced = trace_model(model, args, {})
    cache = cache or ProfileCache(None, torch_version=torch.__version__)
    return traced, profile_model(traced, model, args, {}, parse_device_spec(spec), cache=cache,
                                 inv=CPU_HERE, **kw)


def test_profiling_a_tiny_model_gives_positive_medians_for_every_op():
    # TwoLayer traces to addmm, relu, addmm (plus views): three ops that launch work.
    traced, result = _profile(zoo.TwoLayer(), (torch.randn(4, 8),))
    (dp,) = result.devices
    launched = {n.name for n in traced.graph.nodes if n.launches}
    assert set(dp.ops) == launched and len(launched) == 3
    assert all(p.median_s > 0 and p.samples >= 3 and p.method == "in-situ"
               for p in dp.ops.values())
    assert dp.whole_forward is not None and dp.whole_forward.median_s > 0
    assert dp.ops[next(iter(launched))].workspace_bytes is None  # the CPU keeps no peak
    assert result.measured().keys() == launched
    assert any("add up to" in note for note in result.notes)
    assert "CPU" in result.fits and result.comparisons[0].ops == 3


def test_identical_ops_are_measured_once_and_the_cache_serves_the_next_run(tmp_path):
    class Twice(nn.Module):
        # Two Linear(8, 8) layers on the same shapes: one signature, measured once.
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(self.a(x))

    cache = ProfileCache(tmp_path / "c.sqlite3", torch_version=torch.__version__)
    _, first = _profile(Twice(), (torch.randn(2, 8),), cache=cache)
    (dp,) = first.devices
    assert dp.measured_now == 1 and sorted(p.method for p in dp.ops.values()) == [
        "cached", "in-situ"]
    _, again = _profile(Twice(), (torch.randn(2, 8),), cache=cache)
    assert again.devices[0].measured_now == 0 and again.devices[0].from_cache == 1
    assert again.devices[0].ops.keys() == dp.ops.keys()


# Two custom ops: `arm` sets up state that `fire` consumes, so `fire` fails when run again on
# its own, as ops whose state the op before them sets up do, but works right after `arm`.
_ARMED = [False]


@torch.library.custom_op("autoplace_test::arm", mutates_args=())
def _arm(x: torch.Tensor) -> torch.Tensor:
    _ARMED[0] = True
    return x.clone()


@torch.library.custom_op("autoplace_test::fire", mutates_args=())
def _fire(x: torch.Tensor) -> torch.Tensor:
    if not _ARMED[0]:
        raise RuntimeError("fire called without arm")
    _ARMED[0] = False
    return x.relu()


for _op in (_arm, _fire):
    _op.register_fake(lambda x: torch.empty_like(x))


class ArmFire(nn.Module):
    def forward(self, x):
        return torch.ops.autoplace_test.fire(torch.ops.autoplace_test.arm(x * 2)) + 1


def test_in_situ_an_op_whose_state_the_op_before_it_sets_up_is_timed_where_it_runs():
    traced, result = _profile(ArmFire(), (torch.randn(16),))
    (dp,) = result.devices
    assert {p.method for p in dp.ops.values()} == {"in-situ"} and dp.unmeasured == ()
    assert not any("failed" in n for n in result.notes)


def test_an_op_that_fails_alone_is_timed_with_its_neighbour_and_the_note_says_so():
    # How GPUs are profiled (each op alone, with CUDA events); on the CPU with in_situ=False.
    traced, result = _profile(ArmFire(), (torch.randn(16),), in_situ=False)
    (dp,) = result.devices
    fire = next(n.name for n in traced.graph.nodes if "fire" in "".join(n.targets))
    arm = next(n.name for n in traced.graph.nodes if "arm" in "".join(n.targets))
    assert dp.ops[arm].method == "isolated"
    assert dp.ops[fire].method == "with-neighbour" and dp.ops[fire].median_s >= 0
    note = next(n for n in result.notes if fire in n and "failed when timed alone" in n)
    assert "fire called without arm" in note and f"together with the op before it, {arm}" in note
    assert dp.unmeasured == ()


def test_an_op_that_cannot_run_at_all_stops_profiling_and_the_rest_stay_unmeasured(monkeypatch):
    class Broken(nn.Module):
        def forward(self, x):
            return torch.ops.autoplace_test.fire(x.relu()) * 3  # never armed

    # Tracing runs a model once on its inputs first and refuses one that fails there; this
    # model fails by design, to reach profiling's own guard, which an op that runs in the
    # model but not when profiled (state, a device's quirk) meets.
    monkeypatch.setattr("autoplace.trace.run_example", lambda *args: None)
    _ARMED[0] = False
    model = Broken().eval()
    traced = trace_model(model, (torch.randn(4),), {})
    _ARMED[0] = False
    result = profile_model(traced, model, (torch.randn(4),), {}, parse_device_spec("cpu"),
                           cache=ProfileCache(None, torch_version="t"), inv=CPU_HERE)
    (dp,) = result.devices
    assert len(dp.ops) == 1 and len(dp.unmeasured) == 2
    assert any("stopped at" in n and "fire called without arm" in n for n in result.notes)
    assert dp.whole_forward is None


def test_signatures_key_on_target_shapes_dtypes_and_arguments():
    a = op_signature("aten.sum.dim_IntList", (torch.ones(2, 3), [1]), {})
    assert a == op_signature("aten.sum.dim_IntList", (torch.zeros(2, 3), [1]), {})
    assert a != op_signature("aten.sum.dim_IntList", (torch.ones(2, 3), [0]), {})
    assert a != op_signature("aten.sum.dim_IntList", (torch.ones(2, 4), [1]), {})
    assert a != op_signature("aten.sum.dim_IntList", (torch.ones(2, 3).half(), [1]), {})
    assert op_signature("x", (), {"device": torch.device("cpu")}) == op_signature(
        "x", (), {"device": torch.device("meta")})


class FakeTimer:
    """Seconds per call from a list, one per sample: the loop's arithmetic without a clock."""

    def __init__(self, values):
        self.values = list(values)
        self.calls = []

    def per_call_s(self, fn, calls):
        fn()
        self.calls.append(calls)
        return self.values.pop(0) if self.values else 1.0


def test_measure_warms_up_batches_short_calls_and_stops_when_the_median_is_stable():
    timer = FakeTimer([1e-5, 2e-5] + [1.0] * 10)
    m = measure(lambda: None, timer=timer, warmup=2, min_samples=5, sample_s=1e-3)
    assert timer.calls[:2] == [1, 1]  # warm-up, one call each
    assert m.calls == 100  # 1 ms / 10 us, the faster warm-up
    assert m.median_s == 1.0 and m.samples == 5 and m.spread == 0.0
    drifting = FakeTimer([1.0, 1.0] + [float(i) for i in range(1, 40)])
    assert measure(lambda: None, timer=drifting, max_samples=12).samples == 12


def test_in_situ_walks_time_every_op_in_order_and_stop_when_the_total_is_stable():
    model = zoo.TwoLayer().eval()
    traced = trace_model(model, (torch.randn(4, 8),), {})
    gm = traced.module
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    names = {n.name for n in traced.graph.nodes if n.launches}
    timer = FakeTimer([])  # every call 1.0 s: stable at once
    samples = _time_in_situ(gm, nodes, (torch.randn(4, 8),), {}, dev=torch.device("cpu"),
                            timer=timer, free_at={}, names=names, min_passes=4, min_s=0.0)
    assert samples.keys() == names and {len(v) for v in samples.values()} == {4}
    assert timer.calls == [1] * (5 * len(names))  # one warm-up walk, then four, one call each


def test_an_in_place_op_timed_in_situ_writes_a_copy_of_the_input_each_walk():
    class AddInPlace(nn.Module):
        def forward(self, x):
            return x.add_(1.0).relu()

    x = torch.zeros(8)
    gm = torch.fx.symbolic_trace(AddInPlace())
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    names = {n.name for n in nodes if n.op == "call_method"}
    samples = _time_in_situ(gm, nodes, (x,), {}, dev=torch.device("cpu"), timer=ClockTimer(),
                            free_at={}, names=names, min_passes=5, min_s=0.0)
    assert all(len(v) >= 5 for v in samples.values()) and torch.equal(x, torch.zeros(8))


def test_a_cpu_time_taken_in_isolation_is_not_reused_in_situ_but_measured_again(tmp_path):
    cache = ProfileCache(tmp_path / "c.sqlite3", torch_version=torch.__version__)
    _, alone = _profile(zoo.TwoLayer(), (torch.randn(4, 8),), cache=cache, in_situ=False)
    assert alone.devices[0].measured_now == 3
    _, situ = _profile(zoo.TwoLayer(), (torch.randn(4, 8),), cache=cache)
    assert situ.devices[0].measured_now == 3 and situ.devices[0].from_cache == 0
    _, again = _profile(zoo.TwoLayer(), (torch.randn(4, 8),), cache=cache)
    assert again.devices[0].measured_now == 0 and again.devices[0].from_cache == 3


def test_gpus_are_timed_with_cuda_events_and_the_cpu_with_the_clock():
    assert isinstance(timer_for("cpu"), ClockTimer)
    assert isinstance(timer_for("cuda:1"), CudaEventTimer)
    assert ClockTimer().per_call_s(lambda: sum(range(100)), 10) > 0


def _fake_nvml(*, fail_init=False):
    nvml = types.ModuleType("pynvml")
    info = types.SimpleNamespace
    buses = ["0000:01:00.0", "0000:02:00.0"]

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvlink_state(h, link):
        if link >= 2:
            raise RuntimeError("not supported")
        return 1

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetPciInfo = lambda h: info(busId=buses[h].encode())
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA A100-SXM4-40GB"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: info(total=40 * 2**30, free=39 * 2**30)
    nvml.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    nvml.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nvml.nvmlDeviceGetNvLinkState = nvlink_state
    nvml.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: info(busId=buses[1 - h])
    return nvml


def test_inventory_reads_nvml_names_memory_pcie_and_nvlink(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = inventory()
    assert inv.source == "nvml" and [g.index for g in inv.gpus] == [0, 1]
    g0 = inv.gpus[0]
    assert g0.catalog_type == "A100-40GB" and g0.memory_free_bytes == 39 * 2**30
    assert (g0.pcie_gen, g0.pcie_width, g0.nvlink_peers) == (4, 16, (1,))
    assert "NVLink to cuda:1" in inv.lines()[1]
    present, absent = present_devices(parse_device_spec("2xA100-40GB,T4"), inv)
    assert [d.name for d in present] == ["cuda:0", "cuda:1"]
    assert absent == ["cuda:2 (T4) is simulated: no cuda:2 here"]
    present, absent = present_devices(parse_device_spec("T4,A100-40GB"), inv)
    assert [d.name for d in present] == ["cuda:1"]
    assert "cuda:0 is planned as T4 but cuda:0 here is NVIDIA A100-SXM4-40GB" in absent[0]


def test_nvml_topology_follows_cuda_visible_devices(monkeypatch):
    # torch renumbers the visible GPUs from 0 in the listed order; NVLink peers follow, and a
    # hidden peer is no peer.
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    inv = inventory()
    assert inv.source == "nvml" and [g.nvlink_peers for g in inv.gpus] == [(1,), (0,)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (only,) = inventory().gpus
    assert (only.index, only.nvlink_peers, only.pcie_gen) == (0, (), 4)


@pytest.mark.parametrize("pynvml", [None, "failing"])
def test_inventory_without_a_driver_is_silent(monkeypatch, capsys, pynvml):
    # None: not installed (import fails); "failing": installed, but nvmlInit raises.
    monkeypatch.setitem(sys.modules, "pynvml",
                        None if pynvml is None else _fake_nvml(fail_init=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    inv = inventory()
    assert inv.gpus == () and inv.source == "none" and inv.host.logical_cpus >= 1
    assert capsys.readouterr() == ("", "")
    assert inv.lines()[-1] == "no GPU found"


def test_cli_profile_runs_in_process_and_reuses_the_cache(capsys):
    assert main(["profile", str(EXAMPLES / "mlp.py"), "--devices", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "5 ops, 5 measured now, 0 from the cache" in out and "whole forward pass" in out
    assert "calibrated CPU on cpu" in out and "profile.sqlite3" in out
    assert main(["profile", str(EXAMPLES / "mlp.py"), "--devices", "cpu"]) == 0
    assert "0 measured now, 5 from the cache" in capsys.readouterr().out
    assert main(["profile", str(EXAMPLES / "mlp.py"), "--devices", "cpu", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "5 measured now" in out and "memory only (--no-cache)" in out


def test_cli_profile_of_a_device_that_is_not_here_is_a_clear_error(capsys):
    code = main(["profile", str(EXAMPLES / "mlp.py"), "--devices", "A100-40GB"])
    assert code == 2
    err = capsys.readouterr().err
    assert "nothing to profile: cuda:0 (A100-40GB) is simulated" in err
    assert "Devices here: cpu (CPU)" in err and "--devices cpu" in err
    assert main(["profile", str(EXAMPLES / "mlp.py"), "--devices", "cuda:3"]) == 2
    assert "'cuda:3' is not present" in capsys.readouterr().err


def test_plan_profiles_the_cpu_and_records_each_nodes_cost_source(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["plan", str(EXAMPLES / "mlp.py"), "--devices", "A100-40GB,cpu",
                 "--out", str(out), "--time-limit", "2"])
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "plan.json").read_text())
    validate_plan_dict(data)
    compute = [n for n in data["nodes"] if n["launches"]]
    assert len(compute) == 5
    assert all(n["cost_sources"] == {"cuda:0": "analytic", "cpu": "measured"} for n in compute)
    assert all(n["cost_source"] == n["cost_sources"][n["device"]] for n in compute)
    assert data["profile"]["devices"][0]["device"] == "cpu"
    assert data["profile"]["calibration"]["CPU"]["samples"] >= 3
    assert any("not profiled: cuda:0 (A100-40GB) is simulated" in n for n in data["notes"])
    # Every node sits on the simulated A100 (analytic there); the card still says the CPU was
    # measured.
    summary = (out / "summary.md").read_text()
    assert "(measured on cpu)" in summary


def test_plan_for_devices_not_here_completes_with_analytic_costs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--devices", "2xA100-40GB", "--out",
                 str(out), "--time-limit", "2", "--no-emit"]) == 0
    data = json.loads((out / "plan.json").read_text())
    assert {n["cost_source"] for n in data["nodes"]} == {"analytic"}
    assert any("not profiled: cuda:1 (A100-40GB) is simulated" in n for n in data["notes"])
    assert data["profile"]["devices"] == []


def test_a_measured_cpu_calibrates_the_cpu_when_it_is_not_profiled(tmp_path):
    cache = open_cache(path=str(tmp_path / "c.sqlite3"))
    model, x = zoo.TwoLayer(), torch.randn(4, 8)
    plan(
        model,
        (x,),
        Config(
            devices="cpu",
            solve=Solve(whatif=False, time_limit_s=1),
            cost=Cost(profile=True, cache=cache),
            emit=Emit(model=False),
        ),
    )
    # The same CPU, planned remotely (another host): not profiled, calibrated from the fit.
    cluster_file = tmp_path / "c.toml"
    cluster_file.write_text('[[hosts]]\nname = "a"\ndevices = ["cpu"]\n'
                            '[[hosts]]\nname = "b"\ndevices = ["T4"]\n')
    result = plan(
        zoo.TwoLayer(),
        (x,),
        Config(
            devices=Devices(file=str(cluster_file)),
            solve=Solve(whatif=False, time_limit_s=1),
            cost=Cost(profile=True, cache=cache),
            emit=Emit(model=False),
        ),
    ).plan
    data = result.to_dict()
    sources = {s for n in data["nodes"] if n["launches"] for s in n["cost_sources"].values()}
    assert sources == {"calibrated", "analytic"}
    assert any("only this machine's devices are profiled" in n for n in data["notes"])


def test_links_are_measured_by_copying_and_replace_the_catalog_defaults():
    from autoplace.profile import ProfileResult, _links
    from autoplace.profile.cache import LinkRecord
    from autoplace.profile.links import measure_link

    latency, bandwidth, points = measure_link("cpu", "cpu", sizes=(4096, 65536, 1 << 20))
    assert latency >= 0 and bandwidth > 0 and [n for n, _ in points] == [4096, 65536, 1 << 20]

    # A GPU and the host, with the copies already in the cache (no GPU here to copy to).
    cluster = parse_device_spec("A100-40GB,cpu")
    gpu, cpu = cluster.devices
    cache = ProfileCache(None, torch_version="t")
    inv = Inventory(host=CPU_HERE.host)
    for src, dst, gbps in (("cuda:0", "cpu", 20e9), ("cpu", "cuda:0", 10e9)):
        keys = [f"{'gpu:unknown' if d == 'cuda:0' else 'cpu:test CPU:1t'}@{d}"
                for d in (src, dst)]
        cache.put_link(LinkRecord(src_key=keys[0], dst_key=keys[1], latency_s=3e-6,
                                  bandwidth_bytes_per_s=gbps, points=((1, 1.0),)))
    links = _links([gpu, cpu], inv, cache=cache, notes=[])
    assert {(lk.src, lk.dst, lk.bandwidth_bytes_per_s) for lk in links} == {
        ("cuda:0", "cpu", 20e9), ("cpu", "cuda:0", 10e9)}
    measured = ProfileResult(links=links).apply_links(cluster)
    assert measured.link("cpu", "cuda:0").kind == "measured"
    assert measured.transfer_s("cpu", "cuda:0", 10_000) == pytest.approx(3e-6 + 1e-6)
    assert cluster.link("cpu", "cuda:0").kind == "pcie4"


def test_cpu_op_times_add_up_to_the_whole_pass_they_were_timed_in() -> None:
    # Ops timed one by one in situ leave out the work between them; on a CPU the plan scales
    # them to the whole forward pass where that took longer, never down, and never on a GPU.
    from autoplace.profile import ProfileResult
    from autoplace.profile.ops import DeviceProfile, OpProfile
    from autoplace.profile.timing import Measurement

    def device(torch_device: str, whole_s: float | None) -> DeviceProfile:
        ops = {name: OpProfile(node=name, signature=name, median_s=secs, spread=0.0,
                               samples=3, param_bytes=0, output_bytes=0, workspace_bytes=None,
                               method="in-situ")
               for name, secs in (("a", 1e-3), ("b", 3e-3))}
        whole = None if whole_s is None else Measurement(median_s=whole_s, spread=0.0,
                                                         samples=3, calls=1)
        return DeviceProfile(device=torch_device, torch_device=torch_device, device_key="k",
                             device_type="cpu-thread", ops=ops, whole_forward=whole)

    assert device("cpu:0", 5e-3).whole_scale == pytest.approx(1.25)
    assert device("cpu:0", 3e-3).whole_scale == 1.0  # faster whole: the ops stand
    assert device("cpu:0", None).whole_scale == 1.0
    assert device("cuda:0", 5e-3).whole_scale == 1.0
    measured = ProfileResult(devices=(device("cpu:0", 5e-3),)).measured()
    assert measured["a"]["cpu:0"] == pytest.approx(1.25e-3)
    assert sum(m["cpu:0"] for m in measured.values()) == pytest.approx(5e-3)
