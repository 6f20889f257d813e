"""More than one process: an inference plan run as one torchrun rank per planned device
(``emit.distributed.ranks``, ``emit.distributed.stages``, ``autoplace run --nproc``), on gloo over
127.0.0.1.

The multi-process tests are few and bounded (each well under a minute here); every process they
start is stopped (``emit.distributed.replicas.launch_replicas``) and the failure test checks that
none is left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import zoo

import autoplace
from autoplace.cli import main
from autoplace.cli.run_ranks import pipelined_makespan_s
from autoplace.cluster.local import free_port
from autoplace.emit import emit_model, load_model, save_model
from autoplace.emit.distributed.ranks import (
    Exchange,
    LaunchDevices,
    crossings,
    flat_inputs,
    launch_devices,
    rank_devices,
    value_specs,
    write_launch_script,
)
from autoplace.emit.distributed.replicas import launch_replicas
from autoplace.emit.distributed.stages import chain_of, gather_outputs
from autoplace.errors import AutoplaceError, EmitError
from autoplace.ir import Placement
from autoplace.simulate import simulate
from autoplace.trace import trace_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# A rank that has run this long has imported torch, met its peer and begun its passes (about
# 5 s here on a loaded machine).
RUNNING_AFTER_S = 12.0


def _two_layer(out: Path, fc1: str, fc2: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """TwoLayer's fc1 on ``fc1`` and fc2 on ``fc2``, saved with ``launch.py`` in ``out``."""
    torch.manual_seed(0)
    model, x = zoo.TwoLayer(), torch.randn(8, 8)
    traced = trace_model(model, (x,), {}, name="two")
    emitted = emit_model(traced.module, zoo.by_module(traced.module, {"fc1": fc1, "fc2": fc2},
                                                      fc1))
    emitted.example_inputs = ((x,), {})
    save_model(emitted, out / "model")
    write_launch_script(out, emitted, torch_devices=["cpu:0", "cpu:1"], names=["a", "b"],
                        example=emitted.example_inputs)
    return model, x


def test_a_rank_loads_only_its_own_segments(tmp_path):
    _two_layer(tmp_path, "cpu:0", "cpu:1")
    mine = load_model(tmp_path / "model", devices=["cpu:1"])
    # fc1's weight and bias stay on the meta device; fc2's (16*4 + 4 floats) are read.
    assert all(t.is_meta for t in mine.seg0.state_dict().values())
    loaded = mine.seg1.state_dict().values()
    assert not any(t.is_meta for t in loaded) and sum(t.numel() for t in loaded) == 68


def test_crossings_name_each_value_once_with_its_readers_and_shape():
    # TwoBranch placed left and head on cpu:0, right on cpu:1: segments A, B, A. right's
    # output (8 x 16 float32) goes from rank 1 to rank 0; the output is made on rank 0.
    model, x = zoo.TwoBranch(), torch.randn(8, 16)
    traced = trace_model(model, (x,), {}, name="branch")
    emitted = emit_model(traced.module, zoo.by_module(
        traced.module, {"left": "cpu:0", "right": "cpu:1", "head": "cpu:0"}, "cpu:0"))
    found = crossings([s.to_dict() for s in emitted.segment_info], ranks=["cpu:0", "cpu:1"],
                      output_names=emitted.output_names,
                      specs=value_specs(emitted, (x,), {}))
    assert [(c.src, c.dsts, c.shape, c.dtype) for c in found] == [(1, (0,), (8, 16), "float32")]


def test_the_pipelined_prediction_overlaps_a_chain_and_not_a_return_trip():
    # a -> b -> c, 1 s each, free transfers. Chain a on d0, b and c on d1: 3 micro-batches
    # pipeline, d1 busy 2 s per micro-batch after d0's first 1 s: 1 + 3 * 2 = 7 s (one: 3 s).
    cl = zoo.cluster(2, bandwidth=1e12)
    problem = zoo.problem([("a", 1, 0), ("b", 1, 0), ("c", 1, 0)],
                          [("a", "b", 10), ("b", "c", 10)], cl)
    chain = simulate(problem, Placement({"a": "d0", "b": "d1", "c": "d1"}))
    assert pipelined_makespan_s(problem, chain, 1) == pytest.approx(3.0)
    assert pipelined_makespan_s(problem, chain, 3) == pytest.approx(7.0, rel=1e-6)
    # a and c on d0, b on d1: d0 runs a and c of one micro-batch before the next a (GPipe's
    # blocks), so nothing overlaps: 3 * 3 s.
    trip = simulate(problem, Placement({"a": "d0", "b": "d1", "c": "d0"}))
    assert pipelined_makespan_s(problem, trip, 3) == pytest.approx(9.0, rel=1e-6)


class SkipChain(torch.nn.Module):
    """Four layers in a row, the first's output added to the last's: placed a layer per rank,
    a chain of 4 stages in which ``a`` passes through stages 1 and 2 to reach stage 3."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.layers[0](x)
        return self.layers[3](self.layers[2](self.layers[1](a))) + a


def test_a_chain_runs_gpipe_through_torch_pipelining_and_matches_the_original(tmp_path):
    # Layer i on rank i: a chain of 4 stages. The batch is the example 3 times (3 micro-batches
    # of 8 rows); ScheduleGPipe over gloo (the path of pytorch#132644's hang) must end within
    # the launch's time limit and give the original's outputs. Of 2 timed passes, the time
    # reported is their mean (the median), not the slower one.
    torch.manual_seed(0)
    model, x = SkipChain(), torch.randn(8, 16)
    traced = trace_model(model, (x,), {}, name="skip")
    devices = [f"cpu:{i}" for i in range(4)]
    emitted = emit_model(traced.module, zoo.by_module(
        traced.module, {f"layers.{i}": devices[i] for i in range(4)}, "cpu:3"))
    emitted.example_inputs = ((x,), {})
    save_model(emitted, tmp_path / "model")
    write_launch_script(tmp_path, emitted, torch_devices=devices, names=list("abcd"),
                        example=emitted.example_inputs)
    out = tmp_path / "outputs.safetensors"
    output = launch_replicas(tmp_path / "launch.py", replicas=4, timeout_s=120, what="rank",
                             argv=["--microbatches", "3", "--pipelining", "torch", "--repeats",
                                   "2", "--timeout", "30", "--outputs", str(out), "--json",
                                   str(tmp_path / "rank0.json")])
    assert "torch.distributed.pipelining ScheduleGPipe" in output
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["measured_s"] == pytest.approx(sum(report["times_s"]) / 2)
    got = safetensors.torch.load_file(str(out))
    with torch.no_grad():
        expected = model(x)
    assert len(got) == 3
    for value in got.values():
        torch.testing.assert_close(value, expected)


def test_a_chains_outputs_reach_rank_0_through_its_exchange(monkeypatch):
    # SkipChain's layers 0-1 on rank 0, 2-3 on rank 1: a chain of 2 stages. The last stage
    # sends the output, 3 micro-batches of 8 x 16 in one tensor, to rank 0, which must receive
    # it where its exchange's backend puts tensors (the rank's GPU under nccl; "meta" stands in
    # for it here), not on the CPU whatever the backend; both ends use one tag.
    torch.manual_seed(0)
    model, x = SkipChain(), torch.randn(8, 16)
    traced = trace_model(model, (x,), {}, name="skip")
    devices = ["cpu:0", "cpu:1"]
    emitted = emit_model(traced.module, zoo.by_module(
        traced.module, {f"layers.{i}": devices[i // 2] for i in range(4)}, "cpu:1"))
    table = crossings([s.to_dict() for s in emitted.segment_info], ranks=devices,
                      output_names=emitted.output_names, specs=value_specs(emitted, (x,), {}))
    calls: list[tuple[str, Any, tuple[int, ...], int, int]] = []

    class Sent:
        def wait(self) -> None:
            pass

    def isend(tensor: torch.Tensor, dst: int, tag: int) -> Sent:
        calls.append(("send", tensor.device, tuple(tensor.shape), dst, tag))
        return Sent()

    def recv(buffer: torch.Tensor, src: int, tag: int) -> None:
        calls.append(("recv", buffer.device, tuple(buffer.shape), src, tag))

    monkeypatch.setattr(torch.distributed, "isend", isend)
    monkeypatch.setattr(torch.distributed, "recv", recv)
    merged = torch.randn(24, 16)
    for rank, device in ((1, "cpu"), (0, "meta")):
        chain = chain_of(emitted, table, rank=rank, ranks=devices,
                         first=flat_inputs(emitted, (x,), {}), rows=8)
        assert chain is not None and chain.order == (0, 1)
        exchange = Exchange(rank, table, 3, device=device)
        got = gather_outputs(emitted, chain, merged if rank == 1 else None, exchange, count=3)
        if rank == 0:
            [values] = got.values()
            assert [(v.device.type, tuple(v.shape)) for v in values] == [("meta", (8, 16))] * 3
    tag = len(table) * 3
    assert calls == [("send", torch.device("cpu"), (24, 16), 0, tag),
                     ("recv", torch.device("meta"), (24, 16), 1, tag)]


def test_a_lost_rank_is_named_and_nothing_is_left_behind(tmp_path):
    # fc1 on rank 1, fc2 on rank 0: rank 0 waits on rank 1 every pass. Rank 1 is killed in
    # the middle of a long run: rank 0 must stop within 30 s naming rank 1, torchrun must
    # fail, and no process of the run may remain.
    _two_layer(tmp_path, "cpu:1", "cpu:0")
    seen: set[int] = set()
    killed: list[float] = []

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            for pid in _run_processes(tmp_path):
                seen.add(pid)
                if _environ(pid).get("RANK") == "1":
                    time.sleep(RUNNING_AFTER_S)  # started, met rank 0, and in its passes
                    os.kill(pid, 9)
                    killed.append(time.monotonic())
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    with pytest.raises(EmitError, match=r"lost rank 1 \(b, pid \d+\)"):
        launch_replicas(tmp_path / "launch.py", replicas=2, timeout_s=120, what="rank",
                        argv=["--repeats", "100000000", "--json", str(tmp_path / "began")])
    ended = time.monotonic()
    killer.join(5)
    assert killed and ended - killed[0] < 30
    assert not [pid for pid in seen if Path(f"/proc/{pid}").exists()
                and _state(pid) not in ("Z", "X")]


def _run_processes(root: Path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(root / "launch.py").encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "X"


def test_a_rank_whose_peer_never_comes_fails_within_its_timeout(tmp_path):
    _two_layer(tmp_path, "cpu:0", "cpu:1")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(tmp_path / "launch.py"), "--timeout", "3"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2
    assert "rank 0 (a) could not reach its peers at 127.0.0.1:" in done.stderr
    assert "within 3 s" in done.stderr and time.monotonic() - began < 60
    assert not (tmp_path / "outputs.safetensors").exists()


def test_autoplace_run_nproc_checks_outputs_and_refuses_a_wrong_count(tmp_path, capsys):
    # The MLP over two cpu-thread workers joined by gloo over 127.0.0.1, planned for
    # throughput (it splits into a chain, rank 1 first: send/recv), run as 2 processes with
    # 2 micro-batches of a batch from --inputs (the example's 64 x 784, twice), which the ranks
    # must read: the outputs are checked against the one-process model's on that batch.
    cluster = tmp_path / "two.toml"
    cluster.write_text('[[hosts]]\nname = "localhost"\ndevices = ["2xcpu-thread"]\n\n'
                       '[[links]]\nsrc = "cpu:0"\ndst = "cpu:1"\nkind = "gloo-loopback"\n')
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--cluster", str(cluster), "--out",
                 str(out), "--objective", "throughput", "--time-limit", "5", "--no-cache"]) == 0
    assert (out / "launch.py").is_file()
    capsys.readouterr()
    assert main(["run", str(out), "--nproc", "3"]) == 2
    assert "--nproc 3: the plan has 2 devices (cpu:0, cpu:1)" in capsys.readouterr().err
    batch = tmp_path / "batch.safetensors"
    safetensors.torch.save_file({"args.0": torch.randn(128, 784)}, str(batch))
    saved = tmp_path / "outputs.safetensors"
    assert main(["run", str(out), "--nproc", "2", "--microbatches", "2", "--repeats", "2",
                 "--inputs", str(batch), "--json", "--save-outputs", str(saved)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["outputs_equal"] and result["nproc"] == 2 and result["microbatches"] == 2
    # The batch's outputs: both micro-batches' rows, one after the other.
    assert [v.shape[0] for v in safetensors.torch.load_file(str(saved)).values()] == [128]
    assert result["inputs"] == str(batch)
    assert result["measured_s"] > 0 and result["predicted_s"] > 0


def test_two_hosts_of_one_torch_device_each_plan_and_run_as_two_ranks(tmp_path, capsys):
    # Two hosts, each one cpu-thread worker, both cpu:0: the emitted model names b's segments
    # cpu:1 (launch_devices), the plan is verified and its memory measured per device under
    # those names, and launch.py runs each rank on its host's cpu:0 (here, one machine: the
    # ranks' names). Each host holds one layer at least (pins), so values cross the ranks.
    cluster = tmp_path / "hosts.toml"
    cluster.write_text('[[hosts]]\nname = "a"\ndevices = ["cpu-thread"]\n\n'
                       '[[hosts]]\nname = "b"\ndevices = ["cpu-thread"]\n')
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--cluster", str(cluster), "--out",
                 str(out), "--time-limit", "2", "--no-cache", "--pin", "0=a/cpu:0",
                 "--pin", "4=b/cpu:0"]) == 0
    text = (out / "launch.py").read_text()
    assert "RANKS = ['cpu:0', 'cpu:1']" in text and "DEVICES = ['cpu:0', 'cpu:0']" in text
    assert "HOSTS = ['a', 'b']" in text
    planned = json.loads((out / "plan.json").read_text())
    assert not any(n.startswith("no launch.py") for n in planned["notes"])
    verification = planned["verification"]
    assert verification["status"] == "passed" and verification["memory_status"] == "within"
    assert set(verification["peak_bytes"]) == {"a/cpu:0", "b/cpu:0"}
    assert all(p["measured_bytes"] > 0 for p in verification["peak_bytes"].values())
    capsys.readouterr()
    assert main(["run", str(out), "--nproc", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["outputs_equal"] and result["ranks"] == ["a/cpu:0", "b/cpu:0"]


def test_hosts_with_their_own_torch_devices_make_one_rank_each(tmp_path):
    cluster = tmp_path / "hosts.toml"
    cluster.write_text('[[hosts]]\nname = "a"\ndevices = ["cpu-thread"]\n\n'
                       '[[hosts]]\nname = "b"\n\n'
                       '[[devices]]\nhost = "b"\ntype = "cpu-thread"\ntorch_device = "cpu:1"\n')
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--cluster", str(cluster), "--out",
                 str(out), "--time-limit", "2", "--no-cache"]) == 0
    text = (out / "launch.py").read_text()
    assert "RANKS = ['cpu:0', 'cpu:1']" in text and "NAMES = ['a/cpu:0', 'b/cpu:1']" in text


def test_a_wrong_rank_count_is_refused_by_launch_py(tmp_path):
    _two_layer(tmp_path, "cpu:0", "cpu:1")
    with pytest.raises(AutoplaceError, match="runs as 2 processes"):
        launch_replicas(tmp_path / "launch.py", replicas=1, timeout_s=60, what="rank",
                        argv=[])


@pytest.mark.parametrize(("text", "message"), [
    # A host left without devices (its worker's [[devices]] names another host): no rank.
    ('[[hosts]]\nname = "a"\ndevices = ["2xcpu-thread"]\n\n[[hosts]]\nname = "b"\n',
     r"host\(s\) 'b' have no devices"),
    # A link to b's worker by the name it would have without its own torch device.
    ('[[hosts]]\nname = "a"\ndevices = ["cpu-thread"]\n\n[[hosts]]\nname = "b"\n\n'
     '[[devices]]\nhost = "b"\ntype = "cpu-thread"\ntorch_device = "cpu:1"\n\n'
     '[[links]]\nsrc = "a/cpu:0"\ndst = "b/cpu:0"\nkind = "gloo-loopback"\n',
     r"links\[0\]: unknown device 'b/cpu:0'; devices: a/cpu:0, b/cpu:1"),
])
def test_a_cluster_file_whose_hosts_or_links_miss_the_devices_is_refused(tmp_path, capsys,
                                                                         text, message):
    cluster = tmp_path / "bad.toml"
    cluster.write_text(text)
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--cluster", str(cluster), "--out",
                 str(out), "--no-cache"]) == 2
    assert re.search(message, capsys.readouterr().err) and not out.exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("through", [True, False])
def test_at_the_last_barrier_a_gone_peer_is_lost_only_if_this_rank_stays(monkeypatch, through):
    # A peer through the last barrier may end before this rank returns from it: not lost when
    # this rank gets through within the grace; lost (named, exit 3) when it does not.
    import autoplace.emit.distributed.ranks as ranks

    said: list[str] = []
    exited = threading.Event()
    monkeypatch.setattr(ranks, "_LOST_GRACE_S", 0.5)
    monkeypatch.setattr(ranks.os, "_exit", lambda code: exited.set())
    watchdog = ranks.Watchdog(rank=0, names=["cpu:0", "cpu:1"], say=said.append,
                              peers=[("here", os.getpid()), (ranks.socket.gethostname(),
                                                             _dead_pid())])
    watchdog.at_barrier.set()
    watchdog.start()
    if through:
        time.sleep(0.3)  # the watchdog has seen the peer gone and waits
        watchdog.finished.set()
    assert exited.wait(2) is not through
    watchdog.finished.set()
    assert bool(said) is not through and all("lost rank 1 (cpu:1" in s for s in said)


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory) -> tuple[Path, torch.nn.Module, torch.Tensor]:
    """Four Linear layers planned for 2xA100-40GB (simulated, analytic costs), the first pinned
    to cuda:0 and the last to cuda:1 so that the plan splits, saved with its launch.py."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).eval()
    x = torch.randn(8, 64)
    out = tmp_path_factory.mktemp("gpu") / "out"
    planned, emitted = autoplace.plan(model, x, autoplace.Config(
        devices="2xA100-40GB", solve=autoplace.Solve(time_limit_s=2),
        pins={"0": "cuda:0", "3": "cuda:1"}))
    autoplace.save(planned, out, emitted)
    assert (out / "launch.py").is_file()
    return out, model, x


def test_a_gpu_plan_rehearses_on_cpu_ranks_and_saves_their_outputs(gpu_plan, tmp_path, capsys):
    # --nproc 2 with --device-map runs both cuda ranks on the CPU (gloo); rank 0's outputs,
    # written by --save-outputs, are the one-process run's file, tensor for tensor, and the
    # original's outputs.
    out, model, x = gpu_plan
    ranks, one = tmp_path / "ranks.safetensors", tmp_path / "one.safetensors"
    assert main(["run", str(out), "--nproc", "2", "--device-map", '{"cuda:*": "cpu"}',
                 "--repeats", "1", "--save-outputs", str(ranks)]) == 0
    text = capsys.readouterr().out
    assert "devices differ from the plan: cuda:0, cuda:1 ran on cpu (--device-map)" in text
    assert f"wrote 1 output tensor(s) to {ranks}" in text
    assert main(["run", str(out), "--repeats", "1", "--save-outputs", str(one)]) == 0
    got, expected = (safetensors.torch.load_file(str(f)) for f in (ranks, one))
    assert list(got) == list(expected) == ["output"]
    torch.testing.assert_close(got, expected)
    with torch.no_grad():
        torch.testing.assert_close(got["output"], model(x))


def test_launch_py_takes_a_device_map_under_torchrun(gpu_plan, tmp_path):
    out, model, x = gpu_plan
    with pytest.raises(EmitError, match=r"rank \d \(cuda:\d\): device 'cuda:\d' does not exist "
                       r"here: .*pass --device-map '\{\"cuda:\*\": \"cpu\"\}'"):
        launch_replicas(out / "launch.py", replicas=2, timeout_s=120, what="rank",
                        argv=["--repeats", "1"])
    _cpu_ranks_give_the_originals(out, model, x, tmp_path)


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc", "2", "--device-map", "cuda=cpu"], r"--device-map 'cuda=cpu' is not JSON"),
    (["--nproc", "2", "--device-map", '{"cuda:*": "gpu"}'], r"'gpu', which is not a device"),
    (["--nproc", "2", "--device-map", '{"cuda:0": "cpu"}'],
     r"device 'cuda:1' does not exist here.*--device-map"),
    (["--device-map", '{"cuda:*": "cpu"}'], r"--device-map goes with --nproc N"),
    (["--nproc", "2", "--train", "1"], r"it takes no --train"),
])
def test_autoplace_run_nproc_refuses_a_bad_device_map_before_starting(gpu_plan, capsys, argv,
                                                                      message):
    out, _, _ = gpu_plan
    assert main(["run", str(out), *argv]) == 2
    assert re.search(message, capsys.readouterr().err)


TWO_HOSTS = ('[[hosts]]\nname = "node0"\ndevices = ["A100-40GB"]\n\n'
             '[[hosts]]\nname = "node1"\ndevices = ["A100-40GB"]\n')


def _two_hosts(tmp_path: Path) -> LaunchDevices:
    cluster = tmp_path / "hosts.toml"
    cluster.write_text(TWO_HOSTS)
    launch = launch_devices(autoplace.Devices(file=cluster).resolve()[0].devices)
    assert isinstance(launch, LaunchDevices)
    return launch


def test_two_hosts_of_one_gpu_each_run_a_rank_each_on_its_own_cuda_0(tmp_path):
    # node0/cuda:0 and node1/cuda:0: in the emitted model node1's segments need a name of their
    # own (cuda:1, the next free index); each rank runs on its host's cuda:0 under
    # torchrun --nnodes 2 (one process a node: LOCAL_RANK 0 on each), on cuda:0 and cuda:1 where
    # one machine runs both.
    launch = _two_hosts(tmp_path)
    assert launch == LaunchDevices(ranks=("cuda:0", "cuda:1"), devices=("cuda:0", "cuda:0"),
                                   names=("node0/cuda:0", "node1/cuda:0"),
                                   hosts=("node0", "node1"))
    where = dict(ranks=launch.ranks, devices=launch.devices, hosts=launch.hosts,
                 names=launch.names)
    for rank in (0, 1):
        assert rank_devices(rank, **where, local_rank=0, local_world=1) == ["cuda:0", "cuda:0"]
        assert rank_devices(rank, **where, local_rank=rank, local_world=2) == ["cuda:0", "cuda:1"]
    with pytest.raises(EmitError, match=r"rank 1 \(node1/cuda:0\) is device 0 of the 1 of host "
                       r"node1 in the plan, but torchrun gave it LOCAL_RANK 1"):
        rank_devices(1, **where, local_rank=1, local_world=1)


def test_devices_sharing_a_torch_device_on_one_host_get_no_ranks():
    a = autoplace.Device(name="a", type="cpu-thread", memory_bytes=1 << 30, host="h",
                         torch_device="cpu:0")
    b = autoplace.Device(name="b", type="cpu-thread", memory_bytes=1 << 30, host="h",
                         torch_device="cpu:0")
    assert launch_devices([a, b]) == ("a and b are both cpu:0 on host h: give each its own "
                                      "torch_device in the cluster file ([[devices]])")
    assert launch_devices([a]) == "1 device(s): one process runs the plan"


def _two_host_launch(tmp_path: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    """TwoLayer's fc1 on node0/cuda:0 and fc2 on node1/cuda:0, emitted under the ranks' names
    (cuda:0, cuda:1: what the pipeline's emit would give them), saved with launch.py."""
    launch = _two_hosts(tmp_path)
    torch.manual_seed(0)
    model, x = zoo.TwoLayer(), torch.randn(8, 8)
    traced = trace_model(model, (x,), {}, name="two")
    emitted = emit_model(traced.module, zoo.by_module(
        traced.module, {"fc1": launch.ranks[0], "fc2": launch.ranks[1]}, launch.ranks[0]),
        device_map={"cuda:*": "cpu"})
    emitted.example_inputs = ((x,), {})
    save_model(emitted, tmp_path / "model")
    write_launch_script(tmp_path, emitted, torch_devices=launch.ranks, names=launch.names,
                        hosts=launch.hosts, local_devices=launch.devices,
                        example=emitted.example_inputs)
    text = (tmp_path / "launch.py").read_text()
    assert "DEVICES = ['cuda:0', 'cuda:0']" in text and "HOSTS = ['node0', 'node1']" in text
    return model, x


def test_a_two_host_plan_rehearses_on_one_host_with_cpu_ranks(tmp_path):
    model, x = _two_host_launch(tmp_path)
    _cpu_ranks_give_the_originals(tmp_path, model, x, tmp_path)


def test_a_two_host_plan_runs_under_torchrun_nnodes_2(tmp_path):
    # Two torchrun agents on this machine stand for the two hosts (--nnodes 2, one process
    # each): each rank is LOCAL_RANK 0 and runs its host's cuda:0, here on the CPU.
    model, x = _two_host_launch(tmp_path)
    outputs, port = tmp_path / "outputs.safetensors", free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
         "1", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(tmp_path / "launch.py"), "--repeats", "1", "--timeout", "30",
         "--device-map", '{"cuda:*": "cpu"}', "--outputs", str(outputs)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True) for n in (0, 1)]
    try:
        logs = [agent.communicate(timeout=120)[0] for agent in agents]
    finally:
        for agent in agents:  # each agent and its rank: a session of their own
            if agent.poll() is None:
                os.killpg(agent.pid, 9)
                agent.wait()
    assert [a.returncode for a in agents] == [0, 0], logs
    [got] = safetensors.torch.load_file(str(outputs)).values()
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


def _cpu_ranks_give_the_originals(out, model, x, tmp_path):
    """OUT/launch.py's two ranks, remapped to the CPU, give ``model``'s output on ``x``."""
    outputs = tmp_path / "outputs.safetensors"
    launch_replicas(out / "launch.py", replicas=2, timeout_s=120, what="rank",
                    argv=["--repeats", "1", "--device-map", '{"cuda:*": "cpu"}',
                          "--outputs", str(outputs)])
    [got] = safetensors.torch.load_file(str(outputs)).values()
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
