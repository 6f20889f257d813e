"""Tests for autoplace.cluster: device specs, cluster files (read by autoplace.formats.cluster and
checked against its JSON Schema), GPU detection and the catalog table.

Detection is replaced by a stub wherever a test depends on which GPUs exist, so the tests give the
same answers on a laptop and on a GPU server.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

from autoplace.cli import main
from autoplace.cluster import (
    DEFAULT_SIMULATED_SPEC,
    DetectedGPU,
    detect,
    detect_gpus,
    format_catalog,
    inventory,
    load_cluster_file,
    resolve_cluster,
)
from autoplace.errors import DeviceSpecError
from autoplace.ir import Cluster
from cost_models import catalog_names, get_link_kind
from cost_models.devices import GPU_RUNTIME_RESERVE_BYTES

GIB = 2**30
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

A100_SXM = DetectedGPU(
    index=0, name="NVIDIA A100-SXM4-40GB", memory_bytes=40 * GIB, catalog_type="A100-40GB"
)
H100_SXM = DetectedGPU(
    index=1, name="NVIDIA H100 80GB HBM3", memory_bytes=80 * GIB, catalog_type="H100-80GB"
)


@pytest.fixture
def no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "detect_gpus", lambda: [])


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "detect_gpus", lambda: [A100_SXM, H100_SXM])


def parse_device_spec(spec: str) -> Cluster:
    """The cluster of ``spec``, through the one route every caller takes."""
    cluster, _ = resolve_cluster(spec=spec)
    return cluster


def kinds(cluster: Cluster) -> dict[tuple[str, str], str]:
    return {(link.src, link.dst): link.kind for link in cluster.links}


# --- Specs ---------------------------------------------------------------------------------------


def test_heterogeneous_spec() -> None:
    cluster = parse_device_spec("2xA100-40GB,2xV100-16GB")
    assert cluster.names == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")
    assert [d.type for d in cluster.devices] == ["A100-40GB"] * 2 + ["V100-16GB"] * 2
    assert [d.memory_bytes for d in cluster.devices] == [40 * GIB] * 2 + [16 * GIB] * 2
    assert [d.torch_device for d in cluster.devices] == list(cluster.names)
    assert {d.host for d in cluster.devices} == {"localhost"}
    # A link for each of the 4 x 3 ordered pairs, and no self-links.
    assert len(cluster.links) == 12
    assert all(link.src != link.dst for link in cluster.links)
    k = kinds(cluster)
    assert k[("cuda:0", "cuda:1")] == k[("cuda:1", "cuda:0")] == "nvlink3"
    assert k[("cuda:2", "cuda:3")] == "nvlink2"
    # A100 (PCIe 4) <-> V100 (PCIe 3): the slower generation.
    for a in ("cuda:0", "cuda:1"):
        for b in ("cuda:2", "cuda:3"):
            assert k[(a, b)] == k[(b, a)] == "pcie3"
    nvlink3 = get_link_kind("nvlink3")
    link = cluster.link("cuda:0", "cuda:1")
    assert link.bandwidth_bytes_per_s == nvlink3.bandwidth_bytes_per_s
    assert link.latency_s == nvlink3.latency_s


def test_single_type_without_count() -> None:
    cluster = parse_device_spec("A100-40GB")
    assert cluster.names == ("cuda:0",)
    assert cluster.links == ()


def test_four_h100s_are_all_nvlink4() -> None:
    cluster = parse_device_spec("4xH100-80GB")
    assert len(cluster.devices) == 4 and len(cluster.links) == 12
    assert set(kinds(cluster).values()) == {"nvlink4"}


def test_cpu_processes_are_workers_linked_by_gloo(tmp_path: Path) -> None:
    # --devices 2xcpu-process: two one-thread workers as a thread pair is, but priced as the
    # gloo ranks `autoplace run --nproc 2` starts, not as threads handing tensors over
    cluster = parse_device_spec("2xcpu-process")
    assert [(d.name, d.type, d.torch_device) for d in cluster.devices] == [
        ("cpu:0", "cpu-process", "cpu:0"), ("cpu:1", "cpu-process", "cpu:1")]
    assert set(kinds(cluster).values()) == {"gloo-loopback"}
    assert set(kinds(parse_device_spec("2xcpu-thread")).values()) == {"thread"}
    loopback = get_link_kind("gloo-loopback")
    assert cluster.link("cpu:0", "cpu:1").bandwidth_bytes_per_s == loopback.bandwidth_bytes_per_s
    # a cluster file may give one its own cpu:N, as it may a cpu-thread
    path = tmp_path / "c.toml"
    path.write_text('[[hosts]]\nname = "a"\ndevices = ["cpu-process"]\n\n[[hosts]]\n'
                    'name = "b"\n\n[[devices]]\nhost = "b"\ntype = "cpu-process"\n'
                    'torch_device = "cpu:1"\n')
    loaded = load_cluster_file(path)
    assert [d.torch_device for d in loaded.devices] == ["cpu:0", "cpu:1"]


def test_a_profiled_plan_keeps_the_gloo_link_of_cpu_processes(tmp_path: Path) -> None:
    # profiling measures the ops on each worker's one thread, and keeps the catalog's measured
    # gloo link between processes (a thread handover is not what they pay)
    out = tmp_path / "out"
    assert main(["plan", str(Path(__file__).parents[1] / "examples" / "mlp.py"), "--devices",
                 "2xcpu-process", "--out", str(out), "--time-limit", "2", "--no-cache",
                 "--quiet"]) == 0
    planned = json.loads((out / "plan.json").read_text())
    assert {link["kind"] for link in planned["links"]} == {"gloo-loopback"}
    assert (out / "launch.py").is_file()


@pytest.mark.parametrize("spec", ["cpu", "CPU", "1xcpu", " cpu "])
def test_cpu_spec(spec: str) -> None:
    cluster = parse_device_spec(spec)
    (cpu,) = cluster.devices
    assert (cpu.name, cpu.type, cpu.torch_device) == ("cpu", "CPU", "cpu")


def test_gpus_and_cpu_with_loose_spelling() -> None:
    # Case, '_' for '-' and spaces around entries are fine; spaces inside one are not (below).
    cluster = parse_device_spec(" cpu , 2xa100_40gb ,H100")
    assert cluster.names == ("cpu", "cuda:0", "cuda:1", "cuda:2")
    assert [d.type for d in cluster.devices] == ["CPU", "A100-40GB", "A100-40GB", "H100-80GB"]
    k = kinds(cluster)
    assert k[("cpu", "cuda:0")] == k[("cuda:0", "cpu")] == "pcie4"
    assert k[("cpu", "cuda:2")] == "pcie5"
    assert k[("cuda:1", "cuda:2")] == "pcie4"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2x", r"'2x' has a count but no device type"),
        ("0xA100-40GB", r"'0xA100-40GB' asks for 0 devices"),
        ("xA100", r"unknown device type 'xA100'.*count goes before"),
        ("", r"device spec is empty"),
        ("   ", r"device spec is empty"),
        ("2xFOO", r"unknown device type 'FOO' in '2xFOO'"),
        ("A100-40GB,,T4", r"empty entry"),
        ("A100-40GB,", r"empty entry"),
        ("2xA100", r"unknown device type 'A100' in '2xA100'"),
        ("2xcpu", r"'2xcpu': a host has one CPU device"),
        ("cpu,CPU", r"cpu is defined twice \(cpu and CPU\)"),
    ],
)
def test_malformed_specs(spec: str, message: str) -> None:
    with pytest.raises(DeviceSpecError, match=message) as info:
        parse_device_spec(spec)
    if spec.strip() and "," not in spec and "cpu" not in spec:
        # Every malformed typed entry lists the valid types.
        for name in catalog_names():
            assert name in str(info.value)


SPEC_EXAMPLE = "write a count, an 'x' and a type, e.g. '2xA100-40GB'"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "2*A100-40GB",
            r"^device spec: entry 1 of '2\*A100-40GB' \(characters 1-11\): '2\*A100-40GB' joins "
            r"the count and the type with '\*', not 'x': " + SPEC_EXAMPLE + "; valid device types",
        ),
        (
            "cpu,2 x A100-40GB",
            r"entry 2 of 'cpu,2 x A100-40GB' \(characters 5-17\): '2 x A100-40GB' has a space "
            r"in it: " + SPEC_EXAMPLE,
        ),
        ("T4, 2x T4", r"entry 2 of 'T4, 2x T4' \(characters 5-9\): '2x T4' has a space in it: "
                      r"write a count, an 'x' and a type, e.g. '2xT4'"),
        ("2×T4", r"'2×T4' joins the count and the type with '×', not 'x': .* e\.g\. '2xT4'"),
        ("x2A100-40GB", r"'x2A100-40GB' puts the count after the 'x': " + SPEC_EXAMPLE),
        ("x2A100", r"'x2A100' puts the count after the 'x': .* e\.g\. '2xA100-40GB'"),
        ("2A100-40GB", r"'2A100-40GB' has no 'x' between the count and the type: " + SPEC_EXAMPLE),
        ("A100 40GB", r"'A100 40GB' has a space in it: write it without spaces, e\.g\. "
                      r"'A100-40GB'"),
        ("A100.40GB", r"'A100\.40GB' is not a device type: a type name has only letters, "
                      r"digits, '-' and '_', e\.g\. 'A100-40GB'"),
        ("2xA100/40GB", r"'A100/40GB' in '2xA100/40GB' is not a device type: .* 'A100-40GB'"),
        ("cuda: 0", r"'cuda: 0' has a space in it: write it without spaces, e\.g\. 'cuda:0'"),
        ("T4,0xA100-40GB", r"entry 2 of 'T4,0xA100-40GB' \(characters 4-14\): '0xA100-40GB' "
                           r"asks for 0 devices"),
        ("T4,,L4", r"empty entry 2 in device spec 'T4,,L4' \(a stray comma\?\)"),
    ],
)
def test_loose_entries_are_refused_with_their_position(spec: str, message: str) -> None:
    # An entry is exactly NxTYPE, TYPE, cpu or cuda:N: '2*A100-40GB' used to plan two A100s.
    with pytest.raises(DeviceSpecError, match=message):
        parse_device_spec(spec)


def test_a_loose_spec_on_the_command_line_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["plan", str(EXAMPLES / "mlp.py"), "--devices", "2*A100-40GB", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "entry 1 of '2*A100-40GB' (characters 1-11)" in err and "'2xA100-40GB'" in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --- Explicit torch devices ----------------------------------------------------------------------


@pytest.mark.usefixtures("no_gpus")
def test_explicit_cuda_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(DeviceSpecError, match=r"'cuda:0' is not present.*no GPU.*catalog type"):
        parse_device_spec("cuda:0")


@pytest.mark.usefixtures("two_gpus")
def test_explicit_cuda_uses_the_gpus_found() -> None:
    cluster = parse_device_spec("cuda:1,cpu")
    gpu, cpu = cluster.devices
    assert (gpu.name, gpu.type, gpu.memory_bytes) == ("cuda:1", "H100-80GB", 80 * GIB)
    assert cpu.name == "cpu"
    with pytest.raises(DeviceSpecError, match=r"'cuda:2' is not present.*cuda:0 \(NVIDIA A100"):
        parse_device_spec("cuda:0,cuda:2")
    with pytest.raises(DeviceSpecError, match=r"mixes GPUs of this machine"):
        parse_device_spec("cuda:0,2xA100-40GB")
    with pytest.raises(DeviceSpecError, match=r"cuda:0 is defined twice \(cuda:0 and cuda:0\)"):
        parse_device_spec("cuda:0,CUDA:0")


def test_gpu_missing_from_catalog_is_costed_as_the_closest(monkeypatch: pytest.MonkeyPatch) -> None:
    gh200 = DetectedGPU(
        index=0, name="NVIDIA GH200 480GB", memory_bytes=95 * GIB, catalog_type=None
    )
    monkeypatch.setattr(detect, "detect_gpus", lambda: [gh200])
    cluster, notes = resolve_cluster(spec="cuda:0", cluster_file=None)
    assert cluster.devices[0].type == "A100-80GB"  # 80 GiB is the closest to 95 GiB
    assert cluster.devices[0].memory_bytes == 95 * GIB  # but the real memory is kept
    assert any("GH200" in note and "A100-80GB" in note for note in notes)


GH200 = DetectedGPU(index=0, name="NVIDIA GH200 480GB", memory_bytes=95 * GIB, catalog_type=None)


def test_a_spec_note_reaches_plan_json_and_the_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `cuda:0` on a GPU the catalog lacks is the spec that makes a note; plan and solve both
    # used to drop it.
    monkeypatch.setattr(detect, "detect_gpus", lambda: [GH200])
    out = tmp_path / "plan"
    args = ["--devices", "cuda:0,cpu", "--time-limit", "2", "--out"]
    code = main(["plan", str(EXAMPLES / "mlp.py"), *args, str(out), "--no-emit", "--no-profile"])
    assert code == 0, capsys.readouterr().err
    notes = json.loads((out / "plan.json").read_text())["notes"]
    assert any("GH200" in n and "not in the device catalog" in n for n in notes), notes
    assert "is not in the device catalog" in capsys.readouterr().out
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps({
        "name": "pair",
        "devices": [{"name": "d0", "memory_bytes": 10**9}],
        "default_link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-5},
        "nodes": [{"name": n, "compute_s": {"A100-80GB": 0.001, "CPU": 0.01}} for n in "ab"],
        "edges": [{"src": "a", "dst": "b", "bytes": 1000}],
    }))
    solved = tmp_path / "solve"
    assert main(["solve", str(graph), *args, str(solved)]) == 0, capsys.readouterr().err
    notes = json.loads((solved / "plan.json").read_text())["notes"]
    assert notes[0].startswith("GPU cuda:0 (NVIDIA GH200 480GB) is not in the device catalog")


# --- resolve_cluster -----------------------------------------------------------------------------


def test_resolve_takes_a_cluster_or_the_gpus_a_caller_found(tmp_path: Path) -> None:
    ready = parse_device_spec("2xT4")
    assert resolve_cluster(cluster=ready) == (ready, [])
    # The profiler passes the GPUs its inventory found: nothing is detected again.
    cluster, notes = resolve_cluster(spec="cuda:0", gpus=[GH200])
    assert cluster.devices[0].memory_bytes == 95 * GIB and "GH200" in notes[0]
    cluster, notes = resolve_cluster(gpus=[A100_SXM])
    assert cluster.names == ("cuda:0",) and notes[0].startswith("using the GPU found: cuda:0")
    with pytest.raises(DeviceSpecError, match="got both a device spec and a Cluster; give one"):
        resolve_cluster(spec="2xT4", cluster=ready)
    with pytest.raises(DeviceSpecError, match="got both a cluster file and a Cluster"):
        resolve_cluster(cluster_file=str(tmp_path / "c.toml"), cluster=ready)



@pytest.mark.usefixtures("no_gpus")
def test_resolve_with_nothing_and_no_gpu_uses_the_simulated_set() -> None:
    cluster, notes = resolve_cluster(spec=None, cluster_file=None)
    assert cluster == parse_device_spec(DEFAULT_SIMULATED_SPEC)
    assert cluster.names == ("cuda:0", "cuda:1")
    (note,) = notes
    assert "no GPU found" in note and DEFAULT_SIMULATED_SPEC in note and "--devices" in note


@pytest.mark.usefixtures("two_gpus")
def test_resolve_with_nothing_uses_the_gpus_found() -> None:
    cluster, notes = resolve_cluster(spec=None, cluster_file=None)
    assert [(d.name, d.type) for d in cluster.devices] == [
        ("cuda:0", "A100-40GB"),
        ("cuda:1", "H100-80GB"),
    ]
    assert notes[0].startswith("using the 2 GPUs found: cuda:0 NVIDIA A100-SXM4-40GB")


def test_resolve_spec_file_and_both(tmp_path: Path) -> None:
    cluster, notes = resolve_cluster(spec="2xT4", cluster_file=None)
    assert [d.type for d in cluster.devices] == ["T4", "T4"] and notes == []
    path = tmp_path / "c.toml"
    path.write_text('[[hosts]]\nname = "a"\ndevices = ["L4"]\n')
    cluster, _ = resolve_cluster(spec=None, cluster_file=str(path))
    assert cluster.devices[0].type == "L4"
    with pytest.raises(DeviceSpecError, match="both a device spec"):
        resolve_cluster(spec="2xT4", cluster_file=str(path))
    with pytest.raises(DeviceSpecError, match="empty"):
        resolve_cluster(spec="", cluster_file=None)


# --- Detection -----------------------------------------------------------------------------------


def test_detect_gpus_never_raises() -> None:
    found = detect_gpus()
    assert isinstance(found, list)
    assert all(isinstance(g, DetectedGPU) for g in found)


def fake_nvml(names: list[str]) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: names[h].encode()  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=(h + 1) * GIB
    )
    return module


def test_nvml_detection_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["NVIDIA A100-SXM4-40GB"] * 4
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(names))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    found = detect_gpus()
    # torch would call NVML GPUs 2 and 3 cuda:0 and cuda:1.
    assert [(g.index, g.memory_bytes, g.catalog_type) for g in found] == [
        (0, 3 * GIB, "A100-40GB"),
        (1, 4 * GIB, "A100-40GB"),
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == []


def test_nvml_defers_to_torch_when_numbering_may_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["Tesla T4", "NVIDIA A100-SXM4-40GB"]))
    monkeypatch.setattr(detect, "_detect_with_torch", lambda **_: ("asked torch",))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    # Mixed GPUs: CUDA puts the fastest first, NVML orders by PCI bus.
    assert detect_gpus() == ["asked torch"]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [g.catalog_type for g in detect_gpus()] == ["T4", "A100-40GB"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6f4c3e")  # a UUID only CUDA can resolve
    assert detect_gpus() == ["asked torch"]


def test_inventory_follows_the_same_cuda_visible_devices_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One detector: the profiler's inventory numbers GPUs as `autoplace devices` and specs do.
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA A100-SXM4-40GB"] * 4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    inv = inventory()
    assert inv.source == "nvml" and inv.gpus == tuple(detect_gpus())
    assert [(g.index, g.memory_bytes) for g in inv.gpus] == [(0, 4 * GIB), (1, 2 * GIB)]


# --- Cluster files -------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


TWO_HOSTS = """
[[hosts]]
name = "node0"
devices = ["2xA100-40GB"]

[[hosts]]
name = "node1"
devices = ["2xA100-40GB"]
"""


def test_two_hosts_talk_over_the_network(tmp_path: Path) -> None:
    cluster = load_cluster_file(write(tmp_path, TWO_HOSTS))
    assert cluster.names == ("node0/cuda:0", "node0/cuda:1", "node1/cuda:0", "node1/cuda:1")
    assert [d.torch_device for d in cluster.devices] == ["cuda:0", "cuda:1"] * 2
    assert [d.host for d in cluster.devices] == ["node0", "node0", "node1", "node1"]
    k = kinds(cluster)
    assert k[("node0/cuda:0", "node0/cuda:1")] == "nvlink3"
    assert k[("node1/cuda:1", "node1/cuda:0")] == "nvlink3"
    for a in ("node0/cuda:0", "node0/cuda:1"):
        for b in ("node1/cuda:0", "node1/cuda:1"):
            assert k[(a, b)] == k[(b, a)] == "network"


def test_link_override_applies_in_both_directions(tmp_path: Path) -> None:
    text = TWO_HOSTS + (
        '[[links]]\nsrc = "node0/cuda:0"\ndst = "node1/cuda:0"\n'
        "bandwidth_bytes_per_s = 25e9\nlatency_s = 5e-6\nsymmetric = true\n"
        '[[links]]\nsrc = "node0/cuda:1"\ndst = "node1/cuda:1"\nkind = "pcie4"\n'
        "symmetric = false\n"
    )
    cluster = load_cluster_file(write(tmp_path, text))
    for a, b in [("node0/cuda:0", "node1/cuda:0"), ("node1/cuda:0", "node0/cuda:0")]:
        link = cluster.link(a, b)
        assert (link.bandwidth_bytes_per_s, link.latency_s, link.kind) == (25e9, 5e-6, "custom")
    assert cluster.link("node0/cuda:1", "node1/cuda:1").kind == "pcie4"
    assert cluster.link("node1/cuda:1", "node0/cuda:1").kind == "network"  # not symmetric
    assert cluster.link("node0/cuda:0", "node1/cuda:1").kind == "network"  # untouched


def test_single_host_file_with_device_overrides(tmp_path: Path) -> None:
    text = """
[[hosts]]
name = "box"
devices = ["2xA100-40GB", "cpu"]

[[devices]]
type = "A100-80GB"
memory_bytes = 75_000_000_000

[[devices]]
host = "box"
type = "T4"
torch_device = "cuda:7"

[[links]]
src = "box/cuda:0"
dst = "cuda:2"
kind = "pcie4"
latency_s = 0
"""
    cluster = load_cluster_file(write(tmp_path, text))
    # One host: names are as in a spec; [[devices]] GPUs take the next free cuda:N.
    assert cluster.names == ("cuda:0", "cuda:1", "cpu", "cuda:2", "cuda:7")
    assert cluster.device("cuda:2").memory_bytes == 75_000_000_000
    assert cluster.device("cuda:2").type == "A100-80GB"
    assert cluster.device("cuda:7").type == "T4"
    link = cluster.link("cuda:2", "cuda:0")
    assert link.latency_s == 0
    assert link.bandwidth_bytes_per_s == get_link_kind("pcie4").bandwidth_bytes_per_s


def test_the_documented_example_loads(tmp_path: Path) -> None:
    # The cluster file's documented example (docs/cli.md), loaded as written there.
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    example = doc.split("### Cluster files\n", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    cluster = load_cluster_file(write(tmp_path, textwrap.dedent(example)))
    assert cluster.names == (
        "node0/cuda:0",
        "node0/cuda:1",
        "node0/cpu",
        "node1/cuda:0",
        "node1/cuda:1",
    )
    assert cluster.device("node1/cuda:1").memory_bytes == 75_000_000_000
    # reserve_bytes: node0's for its spec list, node1/cuda:1's own, node1/cuda:0 the GPU default
    assert {d.name: d.reserved_bytes for d in cluster.devices} == {
        "node0/cuda:0": 0, "node0/cuda:1": 0, "node0/cpu": 0,
        "node1/cuda:0": GPU_RUNTIME_RESERVE_BYTES, "node1/cuda:1": 1_000_000_000}
    link = cluster.link("node1/cuda:0", "node0/cuda:0")
    assert (link.bandwidth_bytes_per_s, link.latency_s, link.kind) == (25e9, 5e-6, "network")
    assert cluster.link("node1/cuda:0", "node1/cuda:1").kind == "pcie4"  # A100-40GB <-> A100-80GB
    # node1's NIC: the 2 x 3 pairs leaving it, and the same reversed entering it
    shared = {r.name: r for r in cluster.shared}
    assert set(shared) == {"nic-out:node1", "nic-in:node1", "pcie-switch0"}
    assert set(shared["nic-out:node1"].pairs) == {
        (a, b) for a in ("node1/cuda:0", "node1/cuda:1")
        for b in ("node0/cuda:0", "node0/cuda:1", "node0/cpu")}
    assert [r.name for r in cluster.shared_on("node1/cuda:0", "node0/cuda:0")] == [
        "nic-out:node1", "pcie-switch0"]
    assert cluster.shared_on("node0/cuda:1", "node0/cuda:0") == ()  # both under the switch


def test_devices_alone_make_one_machine(tmp_path: Path) -> None:
    cluster = load_cluster_file(write(tmp_path, '[[devices]]\ntype = "L4"\n'))
    assert cluster.names == ("cuda:0",) and cluster.devices[0].host == "localhost"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[hosts]\nname = 'a'\n", r"not valid TOML: .*line 1"),
        (
            "hostz = []\n",
            r"cluster\.toml: Additional properties are not allowed \('hostz' was unexpected\); "
            r"allowed keys: hosts, devices, links",
        ),
        (
            "[[hosts]]\nname = 'a'\ndevice = ['T4']\n",
            r"hosts\[0\]: Additional properties .*'device' was unexpected.*keys: name, devices",
        ),
        ("[[hosts]]\nname = 3\n", r"hosts\[0\]\.name: 3 is not a host name"),
        ("[[hosts]]\ndevices = ['T4']\n", r"hosts\[0\]: 'name' is a required property"),
        (
            "[[hosts]]\nname = 'a'\ndevices = 'T4'\n",
            r"hosts\[0\]\.devices: 'T4' is not a list of device spec strings",
        ),
        (
            "[[hosts]]\nname = 'a'\n[[hosts]]\nname = 'b'\ndevices = ['T4', 5]\n",
            r"hosts\[1\]\.devices\[1\]: 5 is not of type 'string'",
        ),
        ("[[hosts]]\nname = 'a/b'\ndevices = ['T4']\n", r"hosts\[0\]\.name: 'a/b' is not .*no '/'"),
        ("[[hosts]]\nname = '  '\n", r"hosts\[0\]\.name: '  ' is not a host name: not blank"),
        ("[[hosts]]\nname = 'a'\n[[hosts]]\nname = 'a'\n", r"'a' is used twice"),
        ("[hosts]\nname = 'a'\n", r"hosts: \{'name': 'a'\} is not an array of tables, written \["),
        ("[[hosts]]\nname = 'a'\ndevices = ['2xFOO']\n", r"unknown device type 'FOO'.*A100-40GB"),
        ("[[hosts]]\nname = 'a'\ndevices = ['cuda:0']\n", r"'cuda:0' names a GPU of this machine"),
        (
            "[[hosts]]\nname = 'a'\ndevices = ['T4', 'L4,2*T4']\n",
            r"hosts\[0\]\.devices\[1\]: entry 2 of 'L4,2\*T4' \(characters 4-7\): '2\*T4' "
            r"joins the count and the type with '\*', not 'x': write a count, an 'x' and a type, "
            r"e\.g\. '2xT4'",
        ),
        (
            "[[devices]]\ntype = 'A100 40GB'\n",
            r"devices\[0\]: 'A100 40GB' is not a device type: a type name has only letters, .*"
            r"e\.g\. 'A100-40GB'",
        ),
        ("[[hosts]]\nname = 'a'\ndevices = []\n", r"defines no devices"),
        (
            "[[devices]]\ntype = 'T4'\nmemory_bytes = -1\n",
            r"devices\[0\]\.memory_bytes: -1 is less than or equal to the minimum of 0",
        ),
        ("[[devices]]\ntype = 'T4'\nmemory_bytes = 1.5\n", r"1\.5 is not of type 'integer'"),
        ("[[devices]]\ntype = ' '\n", r"devices\[0\]\.type: ' ' is not a non-blank string"),
        ("[[devices]]\ntype = 'T4'\nmemory_bytes = true\n", r"True is not of type 'integer'"),
        ("[[devices]]\ntype = 'T4'\ntorch_device = 'cpu'\n", r"'cpu' does not fit a gpu"),
        ("[[devices]]\ntype = 'T4'\nhost = 'x'\n", r"host 'x' is not one of"),
        (
            "[[hosts]]\nname = 'a'\ndevices = ['T4']\n[[devices]]\ntype = 'T4'\n"
            "torch_device = 'cuda:0'\n",
            r"cuda:0 is defined twice \(T4 and devices\[0\]\)",
        ),
    ],
)
def test_malformed_cluster_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(DeviceSpecError, match=message) as info:
        load_cluster_file(path)
    assert str(info.value).startswith(f"cluster file {path}")


PAIR = 'src = "node0/cuda:0"\ndst = "node1/cuda:0"\n'
BACK = '[[links]]\nsrc = "node1/cuda:0"\ndst = "node0/cuda:0"\n'


@pytest.mark.parametrize(
    ("link", "message"),
    [
        (
            'src = "node9/cuda:0"\ndst = "node1/cuda:0"\nlatency_s = 1e-6',
            r"unknown device 'node9/cuda:0'; devices: node0/cuda:0",
        ),
        ('src = "node0/cuda:0"\ndst = "node0/cuda:0"\nlatency_s = 1e-6', r"the same device"),
        (
            PAIR,
            r"links\[0\] \(node0/cuda:0 - node1/cuda:0\) overrides nothing: add "
            r"bandwidth_bytes_per_s, or a kind to take the link catalog's figures",
        ),
        (
            # A latency alone used to keep the default link's bandwidth, relabelled 'custom'.
            PAIR + "latency_s = 1e-6",
            r"^cluster file .*cluster\.toml: links\[0\] \(node0/cuda:0 - node1/cuda:0\) gives no "
            r"bandwidth_bytes_per_s and no kind, so its bandwidth is unknown: add "
            r"bandwidth_bytes_per_s, or a kind to take the link catalog's figures \(this pair's "
            r"default is kind = 'network', 12\.5 GB/s\); valid kinds: nvlink2, nvlink3, .*network",
        ),
        (PAIR + 'kind = "nvlink9"', r"unknown link kind 'nvlink9'; valid kinds: nvlink2"),
        (
            PAIR + 'bandwidth_bytes_per_s = "fast"',
            r"links\[0\]\.bandwidth_bytes_per_s: 'fast' is not of type 'number'",
        ),
        (PAIR + "bandwidth_bytes_per_s = 0", r"0 is less than or equal to the minimum of 0"),
        (PAIR + "latency_s = -1e-6", r"latency_s: -1e-06 is less than the minimum of 0"),
        (PAIR + "latency_s = nan", r"links\[0\]\.latency_s: nan is not a finite number"),
        (PAIR + "bandwidth_bytes_per_s = inf", r"bandwidth_bytes_per_s: inf is not a finite"),
        (PAIR + 'latency_s = 1e-6\nsymmetric = "yes"', r"symmetric: 'yes' is not of type 'bool"),
        (
            PAIR + "latency_s = 1e-6\nspeed = 1",
            r"links\[0\]: Additional properties .*'speed' was unexpected.*allowed keys: src, dst",
        ),
        (
            PAIR + "bandwidth_bytes_per_s = 1e9\n" + BACK + "bandwidth_bytes_per_s = 2e9",
            r"links\[1\]: the link node1/cuda:0 -> node0/cuda:0 is already overridden by links\[0",
        ),
    ],
)
def test_malformed_link_overrides(tmp_path: Path, link: str, message: str) -> None:
    path = write(tmp_path, TWO_HOSTS + "[[links]]\n" + link + "\n")
    with pytest.raises(DeviceSpecError, match=message):
        load_cluster_file(path)


def test_a_link_with_a_kind_and_no_bandwidth_takes_the_kinds_figures_and_says_so(
    tmp_path: Path,
) -> None:
    text = TWO_HOSTS + (
        '[[links]]\nsrc = "node0/cuda:0"\ndst = "node1/cuda:0"\nkind = "pcie4"\n'
        '[[links]]\nsrc = "node0/cuda:1"\ndst = "node1/cuda:1"\nkind = "pcie4"\n'
        '[[links]]\nsrc = "node0/cuda:0"\ndst = "node0/cuda:1"\nkind = "pcie4"\nlatency_s = 3e-6\n'
        '[[links]]\nsrc = "node1/cuda:0"\ndst = "node1/cuda:1"\nkind = "pcie3"\n'
        "bandwidth_bytes_per_s = 9e9\n"
    )
    path = write(tmp_path, text)
    cluster, notes = resolve_cluster(cluster_file=path)
    pcie4 = get_link_kind("pcie4")
    for a, b in [("node1/cuda:0", "node0/cuda:0"), ("node0/cuda:1", "node1/cuda:1")]:
        link = cluster.link(a, b)
        assert (link.bandwidth_bytes_per_s, link.latency_s, link.kind) == (
            pcie4.bandwidth_bytes_per_s, pcie4.latency_s, "pcie4")
    link = cluster.link("node0/cuda:1", "node0/cuda:0")
    assert (link.bandwidth_bytes_per_s, link.latency_s) == (pcie4.bandwidth_bytes_per_s, 3e-6)
    link = cluster.link("node1/cuda:0", "node1/cuda:1")  # a bandwidth given: no note
    assert (link.bandwidth_bytes_per_s, link.latency_s, link.kind) == (9e9, 1e-5, "pcie3")
    # One note per kind, naming each table that took the catalog's figures.
    assert notes == [
        f"cluster file {path}: links[0] (node0/cuda:0 - node1/cuda:0), links[1] "
        "(node0/cuda:1 - node1/cuda:1) give no bandwidth_bytes_per_s: they take the link "
        "catalog's figures for kind 'pcie4', 31.5 GB/s and 10 us latency; give "
        "bandwidth_bytes_per_s (and latency_s) to use measured figures",
        f"cluster file {path}: links[2] (node0/cuda:0 - node0/cuda:1) gives no "
        "bandwidth_bytes_per_s: it takes the link catalog's bandwidth for kind 'pcie4', "
        "31.5 GB/s, with its own latency_s; give bandwidth_bytes_per_s to use a measured figure",
    ]
    assert load_cluster_file(path) == cluster  # the Python API takes a list for the notes
    mine: list[str] = []
    load_cluster_file(path, notes=mine)
    assert mine == notes


def test_missing_cluster_file(tmp_path: Path) -> None:
    with pytest.raises(DeviceSpecError, match=r"cluster file .*nope\.toml: no such file"):
        load_cluster_file(tmp_path / "nope.toml")
    with pytest.raises(DeviceSpecError, match=r"cannot be read"):
        load_cluster_file(tmp_path)


# --- Catalog table -------------------------------------------------------------------------------


def test_format_catalog_without_gpus() -> None:
    text = format_catalog([])
    for name in catalog_names():
        assert name in text
    assert "no GPU found" in text
    (a100,) = [line for line in text.splitlines() if line.strip().startswith("A100-40GB")]
    assert a100.split()[:7] == ["A100-40GB", "gpu", "40.0", "19.5", "312.0", "1555", "5"]
    (v100,) = [line for line in text.splitlines() if line.strip().startswith("V100-16GB")]
    assert "15.7*" in v100  # no bf16 on Volta: flagged as the float32 fallback


def test_format_catalog_with_gpus() -> None:
    unknown = DetectedGPU(index=1, name="NVIDIA L40S", memory_bytes=48 * GIB, catalog_type=None)
    text = format_catalog([A100_SXM, unknown])
    assert "no GPU found" not in text
    assert "cuda:0  NVIDIA A100-SXM4-40GB  40.0 GiB  -> A100-40GB" in text
    assert "NVIDIA L40S" in text and "not in the catalog" in text


def test_a_capped_gpu_below_its_runtime_reserve_is_refused_unless_the_reserve_is_set(
    tmp_path: Path,
) -> None:
    text = '[[devices]]\ntype = "A100-40GB"\nmemory_bytes = 300_000_000\n'
    with pytest.raises(DeviceSpecError, match=r"devices\[0\].*reserves.*set reserve_bytes"):
        load_cluster_file(write(tmp_path, text))
    cluster = load_cluster_file(write(tmp_path, text + "reserve_bytes = 0\n"))
    assert cluster.devices[0].reserved_bytes == 0
    with pytest.raises(DeviceSpecError, match="reserve_bytes"):
        load_cluster_file(write(tmp_path, text + "reserve_bytes = -1\n"))
