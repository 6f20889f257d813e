"""The emitted model measured: ``autoplace.emit.check.memory`` (peak bytes per planned device,
worked out by hand on tiny models), the memory check in verification, and ``autoplace run OUT/``
with its bad inputs (exit code 2, one paragraph naming the file and the tensor, nothing written), on
devices other than planned (no time against the plan's), and with ``cpu-thread`` workers (each
on one intra-op thread, as planned, whoever calls the emitted model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
import zoo

import autoplace
from autoplace.cli import main
from autoplace.cli.run import run_plan
from autoplace.cluster import resolve_cluster
from autoplace.cluster.local import intra_op_threads
from autoplace.config import Config, Emit, Solve
from autoplace.emit import (
    emit_and_verify,
    emit_model,
    load_model,
    local_device_map,
    save_model,
)
from autoplace.emit.check.memory import measure, measure_peak_bytes
from autoplace.emit.check.outputs import check_peak
from autoplace.emit.codegen.source import runtime_namespace
from autoplace.emit.files.saving import load_inputs
from autoplace.errors import VerificationError
from autoplace.fold import fold
from autoplace.formats.plan import read_plan
from autoplace.ir import Cluster, Costs, Device, Link, Placement, Problem
from autoplace.simulate import simulate
from autoplace.trace import trace_model
from autoplace.trace.load import load_model_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Chain(torch.nn.Module):
    """x -> a = 2x -> b = a + 1 -> c = 3b, 256 float32 each: 1024 bytes per value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        b = a + 1
        return b * 3


def _chain(device_of: dict[str, str]):
    x = torch.randn(256)
    traced = trace_model(Chain(), (x,), {}, name="chain")
    return emit_model(traced.module, device_of, device_map={"cuda:*": "cpu"}), x


def test_a_chain_split_in_two_is_counted_by_hand():
    # seg0 on cuda:0: the copy of x (1024, held by forward to its end), a (1024), b (1024;
    # a is freed only after add ran): 3072. seg1 on cuda:1: the copy of b (1024) and c (1024).
    emitted, x = _chain({"mul": "cuda:0", "add": "cuda:0", "mul_1": "cuda:1"})
    assert measure_peak_bytes(emitted, (x,)) == {"cuda:0": 3072, "cuda:1": 2048}


def test_a_cpu_segment_reading_a_cpu_input_makes_no_copy():
    # On one CPU device, x is read where it is: a and b (2048) at the peak, then b and c.
    emitted, x = _chain({"mul": "cpu", "add": "cpu", "mul_1": "cpu"})
    assert measure_peak_bytes(emitted, (x,)) == {"cpu": 2048}


def test_weights_count_on_their_planned_device():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 64)
    traced = trace_model(model, (x,), {}, name="mlp")
    ops = [op for n in traced.graph.nodes if not n.is_input for op in n.ops]
    first = {op: "cuda:0" for op in ops}
    first[ops[-1]] = "cuda:1"
    emitted = emit_model(traced.module, first, device_map={"cuda:*": "cpu"})
    found = measure(emitted, (x,))
    # Linear(64, 32): (64*32 + 32) * 4 bytes; Linear(32, 8): (32*8 + 8) * 4 bytes.
    assert found.weights_bytes == {"cuda:0": (64 * 32 + 32) * 4, "cuda:1": (32 * 8 + 8) * 4}
    assert found.method == "storage"
    assert found.peak_bytes["cuda:1"] > found.weights_bytes["cuda:1"]


def test_the_same_model_measures_the_same_after_save_and_load(tmp_path):
    emitted, x = _chain({"mul": "cuda:0", "add": "cuda:1", "mul_1": "cuda:1"})
    save_model(emitted, tmp_path)
    loaded = load_model(tmp_path, device_map={"cuda:*": "cpu"})
    assert measure_peak_bytes(loaded, (x,)) == measure_peak_bytes(emitted, (x,))


def test_check_peak_fails_above_the_plan_and_records_when_not_enforced():
    with pytest.raises(VerificationError, match=r"d1 measured 2048 B > planned 1000 B"):
        check_peak({"d0": 10, "d1": 2048}, {"d0": 10, "d1": 1000}, method="storage",
                   enforce=True)
    kept = check_peak({"d0": 10, "d1": 2048}, {"d0": 10, "d1": 1000}, method="storage",
                      enforce=False)
    assert kept.status == "exceeded" and kept.method == "storage"
    assert kept.peak_bytes["d1"] == {"measured_bytes": 2048, "predicted_bytes": 1000}
    assert check_peak({"d0": 10}, {"d0": 10}, method="storage", enforce=True).status == "within"


def test_a_plan_records_measured_and_predicted_peak_per_device():
    loaded = load_model_file(EXAMPLES / "lenet.py")
    plan, emitted = autoplace.plan(
        loaded.model,
        loaded.args,
        Config(
            devices="2xA100-40GB",
            solve=Solve(time_limit_s=1, whatif=False),
            emit=Emit(check_memory=False),
        ),
    )
    recorded = plan.verification.peak_bytes
    assert set(recorded) == {d.name for d in plan.problem.cluster.devices}
    for device, entry in recorded.items():
        reserved = plan.problem.cluster.device(device).reserved_bytes
        assert entry["predicted_bytes"] == plan.schedule.peak_bytes[device] - reserved
    used = [d for d, e in recorded.items() if e["predicted_bytes"] > 0]
    assert used and all(recorded[d]["measured_bytes"] > 0 for d in used)
    assert plan.verification.memory_status in ("within", "exceeded")
    assert plan.verification.peak_method == "storage"


def test_a_value_read_across_a_cut_made_for_a_remote_input_is_within_the_plan():
    # zoo.CrossRead placed by hand: b on cuda:1, the rest on cuda:0, timed so that b ends
    # before a (as tests/test_simulate.py's hand-worked graph): the emitted model cuts before
    # a + b, which reads b from cuda:1, and so holds a (1,024 bytes) while the output (8,192)
    # is made. The plan must count a there too, or the measurement exceeds it.
    x = torch.randn(16)
    traced = trace_model(zoo.CrossRead(), (x,), {}, name="cross")
    seconds = {"add": 1.0, "mul": 1.0, "outer": 2.0, "add_1": 1.0, "repeat": 1.0}
    devices = tuple(Device(name=f"cuda:{i}", type="T", memory_bytes=10**6) for i in range(2))
    cluster = Cluster(devices=devices, links=tuple(
        Link(src=a.name, dst=b.name, bandwidth_bytes_per_s=1e30, latency_s=0.0)
        for a in devices for b in devices if a is not b))
    costs = Costs(compute_s={n.name: dict.fromkeys(("cuda:0", "cuda:1"), seconds.get(n.name, 0.0))
                             for n in traced.graph.nodes})
    problem = Problem(graph=traced.graph, cluster=cluster, costs=costs)
    device_of = {n.name: "cuda:1" if n.name == "mul" else "cuda:0" for n in traced.graph.nodes}
    schedule = simulate(problem, Placement(device_of=device_of))
    assert schedule.end_s["mul"] < schedule.end_s["outer"]
    emitted, record = emit_and_verify(traced, zoo.CrossRead(), (x,), {}, problem=problem,
                                         schedule=schedule, device_of_op=device_of,
                                         check_outputs=True, check_memory=True)
    assert [seg.nodes for seg in emitted.segment_info if "add_1" in seg.nodes] == [
        ("add_1", "repeat")]
    measured = record.peak_bytes["cuda:0"]
    assert measured["measured_bytes"] <= measured["predicted_bytes"]


def test_a_node_whose_outputs_are_copied_at_different_times_is_within_the_plan():
    # zoo.SlicedRead on 2xcpu-thread, placed by hand: u and w on cpu:1, the rest (p with its
    # halves a and b folded in, c, o, s) on cpu:0 in that order. p runs 0..1, c 1..2, u from
    # just after 1 (the handover's latency), o 2..4, s 4..5, w 5..6. The emitted model hands a
    # over when u starts and b when w starts; b, a view of p, keeps p's 256 bytes alive on
    # cpu:0 while o (16,384) is made. The plan must hold p until w's segment has started (it
    # freed it when u's did, and measured 256 bytes above the plan).
    x = torch.randn(64)
    traced = trace_model(zoo.SlicedRead(), (x,), {}, name="sliced")
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    seconds = {"mul": 1.0, "add": 1.0, "sin": 1.0, "outer": 2.0, "sum_1": 1.0, "mul_1": 1.0}
    costs = Costs(compute_s={n.name: dict.fromkeys(cluster.names, seconds.get(n.name, 0.0))
                             for n in traced.graph.nodes})
    folded = fold(traced.graph, costs)
    problem = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    assert len(folded.graph.node("mul").output_shapes) == 2  # a and b
    remote = ("add", "mul_1")
    device_of = {n.name: "cpu:1" if n.name in remote else "cpu:0" for n in folded.graph.nodes}
    order = {"cpu:0": ("x", "_guards_fn", "mul", "sin", "outer", "sum_1"), "cpu:1": remote}
    schedule = simulate(problem, Placement(device_of=device_of, order=order))
    assert schedule.start_s["add"] < schedule.start_s["outer"] < schedule.start_s["mul_1"]
    device_of_op = {op: device_of[n.name] for n in folded.graph.nodes for op in n.ops}
    _, record = emit_and_verify(traced, zoo.SlicedRead(), (x,), {}, problem=problem,
                                   schedule=schedule, device_of_op=device_of_op,
                                   check_outputs=True, check_memory=True)
    measured = record.peak_bytes["cpu:0"]
    assert measured["measured_bytes"] <= measured["predicted_bytes"]


@pytest.mark.parametrize("example", ["mlp", "lenet", "inception"])
def test_examples_verify_with_the_memory_check_on(example):
    loaded = load_model_file(EXAMPLES / f"{example}.py")
    plan, emitted = autoplace.plan(
        loaded.model,
        loaded.args,
        Config(
            devices="2xA100-40GB",
            solve=Solve(time_limit_s=2, whatif=False),
            emit=Emit(check_memory=True),
        ),
    )
    assert plan.verification.memory_status == "within"


# ---------------------------------------------------------------------------------------------
# autoplace run


def _plan(tmp_path_factory, example: str, devices: str) -> Path:
    """``autoplace plan examples/EXAMPLE --devices DEVICES`` into a fresh folder, quickly."""
    out = tmp_path_factory.mktemp(example) / "out"
    assert main(["plan", str(EXAMPLES / f"{example}.py"), "--devices", devices, "--out",
                 str(out), "--time-limit", "1", "--no-profile"]) == 0
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory, "lenet", "2xA100-40GB")


def test_run_on_other_devices_says_so_first_and_sets_no_time_against_the_plan(planned, capsys):
    # An A100 plan run on this machine's CPU: the time is the CPU's, so no ratio to the A100s'
    # prediction; the bytes per planned device still compare.
    remapped = local_device_map(["cuda:0", "cuda:1"])
    if remapped == {"cuda:0": "cuda:0", "cuda:1": "cuda:1"}:
        pytest.skip("the planned GPUs are here: nothing is remapped")
    moved = ", ".join(d for d, to in remapped.items() if to != d)
    assert main(["run", str(planned), "--warmup", "0", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"devices differ from the plan: {moved} ran on cpu")
    assert "median of 2" in "\n".join(lines) and "cuda:0: measured" in "\n".join(lines)
    assert not any("measured/predicted" in line or "predicted makespan" in line
                   for line in lines)
    assert any(line.startswith("peak memory per planned device") for line in lines)


def test_run_json_has_the_four_keys_and_they_match_the_plan(planned, capsys):
    assert main(["run", str(planned), "--json", "--repeats", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = read_plan(planned)
    # predicted_s is null where the model ran on other devices than planned (``remapped``)
    moved = {d: to for d, to in data["device_map"].items() if to != d}
    assert data["remapped"] == moved
    assert data["predicted_s"] == (None if moved else pytest.approx(plan.makespan_s))
    assert data["measured_s"] > 0 and len(data["times_s"]) == 3
    # The plan's peak less the runtime reserve, as verification compares it: neither
    # measurement sees the CUDA context.
    assert data["predicted_peak_bytes"] == {
        d.name: plan.schedule.peak_bytes[d.name] - d.reserved_bytes
        for d in plan.problem.cluster.devices}
    assert set(data["peak_bytes"]) <= set(data["predicted_peak_bytes"])
    # The same measurement as at plan time: same model, same inputs.
    recorded = plan.verification.peak_bytes
    assert {d: recorded[d]["measured_bytes"] for d in data["peak_bytes"]} == data["peak_bytes"]


def test_run_saves_outputs_equal_to_the_original_model(planned, tmp_path, capsys):
    target = tmp_path / "outputs.safetensors"
    assert main(["run", str(planned), "--repeats", "1", "--save-outputs", str(target)]) == 0
    loaded = load_model_file(EXAMPLES / "lenet.py")
    with torch.no_grad():
        expected = loaded.model.eval()(*loaded.args)
    saved = safetensors.torch.load_file(str(target))
    torch.testing.assert_close(saved["output"], expected)


def test_run_on_other_inputs_of_the_same_shape(planned, tmp_path, capsys):
    loaded = load_model_file(EXAMPLES / "lenet.py")
    other = torch.randn_like(loaded.args[0])
    inputs, target = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.torch.save_file({"args.0": other}, str(inputs))
    assert main(["run", str(planned), "--inputs", str(inputs), "--repeats", "1",
                 "--save-outputs", str(target)]) == 0
    with torch.no_grad():
        expected = loaded.model.eval()(other)
    torch.testing.assert_close(safetensors.torch.load_file(str(target))["output"], expected)


def _fails(argv: list[str], capsys, *, match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplace: error: ") and "Traceback" not in err
    assert match in err, err


def test_run_on_a_folder_that_is_not_a_plan(tmp_path, capsys):
    _fails(["run", str(tmp_path)], capsys, match=f"no plan file at '{tmp_path / 'plan.json'}'")
    _fails(["run", str(tmp_path / "absent")], capsys, match="is not a directory")


def _copy(planned: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(planned, tmp_path / "copy"))


def test_run_with_weights_missing_or_corrupted(planned, tmp_path, capsys):
    copy = _copy(planned, tmp_path)
    weights = copy / "model" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of the last tensor: only the hash can tell
    weights.write_bytes(bytes(data))
    _fails(["run", str(copy)], capsys, match="weights.safetensors is corrupted")
    weights.unlink()
    _fails(["run", str(copy)], capsys, match="missing weights.safetensors")
    import shutil

    shutil.rmtree(copy / "model")
    _fails(["run", str(copy)], capsys, match="holds a plan but no emitted model")


def test_run_with_inputs_of_another_shape_writes_nothing(planned, tmp_path, capsys):
    inputs, target = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.torch.save_file({"args.0": torch.randn(3, 1, 28, 28)}, str(inputs))
    expected = load_model_file(EXAMPLES / "lenet.py").args[0]
    _fails(["run", str(planned), "--inputs", str(inputs), "--save-outputs", str(target)],
           capsys, match=f"inputs file '{inputs}': tensor 'args.0' is shape [3, 1, 28, 28] "
           f"float32, but the example the plan was made for has shape {list(expected.shape)}")
    assert not target.exists()
    safetensors.torch.save_file({"x": torch.randn(3)}, str(inputs))
    _fails(["run", str(planned), "--inputs", str(inputs)], capsys,
           match="missing args.0; unexpected x")
    inputs.write_text("not safetensors")
    _fails(["run", str(planned), "--inputs", str(inputs)], capsys,
           match="cannot read the inputs file")


def test_run_rejects_zero_repeats(planned, capsys):
    _fails(["run", str(planned), "--repeats", "0"], capsys, match="--repeats 1 or more")


def test_a_model_with_torch_cond_is_measured_through_its_branch():
    loaded = load_model_file(EXAMPLES / "corpus" / "cond_branch.py")
    plan, emitted = autoplace.plan(
        loaded.model,
        loaded.kwargs or loaded.args,
        Config(
            devices="2xA100-40GB",
            solve=Solve(time_limit_s=1, whatif=False),
            emit=Emit(check_memory=False),
        ),
    )
    found = measure(emitted, loaded.args, loaded.kwargs)
    assert sum(found.activation_peak_bytes.values()) > 0


def test_plan_with_check_memory_fails_above_the_plan_and_writes_nothing(
        tmp_path, capsys, monkeypatch):
    # A measurement far above every device's figure (1 TiB of activations), whatever the plan
    # says today: the check fails the plan, exit 2, nothing written.
    import autoplace.emit as emit
    from autoplace.emit.check.memory import PeakMeasurement

    real = emit.measure

    def inflated(model, args, kwargs):
        found = real(model, args, kwargs)
        return PeakMeasurement(weights_bytes=found.weights_bytes,
                               activation_peak_bytes={d: 2**40 for d in found.weights_bytes},
                               method=found.method)

    monkeypatch.setattr(emit, "measure", inflated)
    out = tmp_path / "out"
    _fails(["plan", str(EXAMPLES / "mlp.py"), "--devices", "2xA100-40GB", "--out", str(out),
            "--time-limit", "1", "--no-profile", "--check-memory"], capsys,
           match="the emitted model needs more memory than the plan says")
    assert not out.exists()
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--devices", "2xA100-40GB", "--out",
                 str(out), "--time-limit", "1", "--no-profile", "--no-check-memory"]) == 0
    verification = json.loads((out / "plan.json").read_text())["verification"]
    assert verification["status"] == "passed"
    assert verification["memory_status"] == "exceeded"
    assert "memory exceeds the plan (not enforced)" in verification["detail"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_allocator_sees_at_least_the_tracked_storages():
    x = torch.randn(256)
    traced = trace_model(Chain(), (x,), {}, name="chain")
    emitted = emit_model(traced.module, {"mul": "cuda:0", "add": "cuda:0", "mul_1": "cuda:0"})
    storage = measure(emitted, (x,), method="storage")
    allocator = measure(emitted, (x,), method="allocator")
    assert measure(emitted, (x,)).method == "allocator"
    # The allocator rounds each block up to 512 bytes; it never sees less than the storages.
    assert allocator.peak_bytes["cuda:0"] >= storage.peak_bytes["cuda:0"] == 3072


# ---------------------------------------------------------------------------------------------
# cpu-thread workers run on one intra-op thread, as the plan profiled them, in every path


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> Path:
    return _plan(tmp_path_factory, "mlp", "1xcpu-thread")


@pytest.fixture
def two_threads():
    """torch on two intra-op threads for the test (restored after): more than a worker's one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def test_a_loaded_one_worker_model_runs_its_segments_on_one_thread(one_worker, two_threads):
    # A user's own call, not `autoplace run`: the sequential forward of a plan of one
    # cpu-thread worker (cpu:0) runs it on one intra-op thread, then gives torch's count back.
    model = load_model(one_worker / "model")
    assert model.runtime == "sequential" and set(model.devices) == {"cpu:0"}
    seen: list[int] = []
    for index in range(len(model.segment_info)):
        getattr(model, f"seg{index}").register_forward_pre_hook(
            lambda module, args: seen.append(torch.get_num_threads()))
    args, kwargs = load_inputs(one_worker / "model")
    with torch.no_grad():
        model(*args, **kwargs)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == two_threads
    with pytest.raises(RuntimeError):  # a failing forward gives the count back too
        model(torch.randn(3, 5))
    assert torch.get_num_threads() == two_threads


def test_run_on_the_planned_workers_compares_and_says_the_threads(one_worker, two_threads,
                                                                    capsys):
    result = run_plan(one_worker, warmup=0, repeats=2)
    assert result.threads == {"cpu:0": 1} and result.remapped == {}
    assert result.predicted_s == pytest.approx(read_plan(one_worker).makespan_s)
    lines = result.lines()
    assert lines[0].startswith("inputs: ")
    assert any("measured/predicted" in line for line in lines)
    assert "threads: cpu:0 1 (intra-op threads its segments ran on)" in lines
    assert main(["run", str(one_worker), "--json", "--repeats", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threads"] == {"cpu:0": 1} and data["remapped"] == {}
    assert data["predicted_s"] == pytest.approx(read_plan(one_worker).makespan_s)
    assert torch.get_num_threads() == two_threads


def test_the_host_cpu_runs_on_torch_s_count(two_threads):
    # The host CPU (`cpu`, not a cpu-thread worker) is timed on torch's threads: left as it is.
    emitted, x = _chain({"mul": "cpu", "add": "cpu", "mul_1": "cpu"})
    seen: list[int] = []
    emitted.seg0.register_forward_pre_hook(lambda m, a: seen.append(torch.get_num_threads()))
    emitted(x)
    assert seen == [two_threads]


@pytest.mark.parametrize("devices", [["cpu:0"], ["cpu:0", "cpu:1"], ["cpu:0", "cuda:0"], ["cpu"],
                                     ["cpu", "cpu:0"], ["cuda:0"]])
def test_the_generated_forward_counts_threads_as_worker_threads_does(devices, two_threads):
    # model.py cannot import autoplace: its _WorkerThreads keeps cluster.local's rule, GPUs aside
    inside = runtime_namespace()["_WorkerThreads"]
    with inside(*devices):
        generated = torch.get_num_threads()
    assert torch.get_num_threads() == two_threads
    assert generated == intra_op_threads([d for d in devices if not d.startswith("cuda")])


def test_run_train_on_other_devices_says_so_first_and_sets_no_time_against_the_plan(
        tmp_path, capsys):
    moved = {d: to for d, to in local_device_map(["cuda:0", "cuda:1"]).items() if to != d}
    if not moved:
        pytest.skip("the planned GPUs are here: nothing is remapped")
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--mode", "training", "--devices",
                 "2xA100-40GB", "--out", str(out), "--time-limit", "1", "--no-profile"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--train", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"devices differ from the plan: {', '.join(moved)} ran on cpu")
    assert "the step time is this machine's" in lines[0]
    assert not any("measured/predicted" in line for line in lines)
    assert main(["run", str(out), "--train", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_s"] is None and data["remapped"] == moved
    assert set(data["threads"]) == {d for d, to in data["device_map"].items() if to == "cpu"}
