"""Tensor parallelism of an emitted model (``emit.distributed.tensor``): Megatron's column and row
pairs found in the traced graph, and the model run split over gloo ranks by DTensor, its outputs
checked against the original's."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from autoplace.emit import emit_model
from autoplace.emit.distributed.tensor import COLUMN, ROW, column_row, verify_tensor_parallel
from autoplace.errors import EmitError
from autoplace.trace import trace_model


def _emitted(model: nn.Module, args: tuple, kwargs: dict | None = None):
    model.eval()
    traced = trace_model(model, args, kwargs or {})
    on_cpu = {n.name: "cpu" for n in traced.module.graph.nodes if n.op == "call_function"}
    return emit_model(traced.module, on_cpu)


def _mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(),
                          nn.Linear(16, 8))
    return model, (torch.randn(4, 32),)


def _llama() -> tuple[nn.Module, dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, use_cache=False)
    return LlamaForCausalLM(config), {"input_ids": torch.randint(0, 128, (2, 8))}


def test_matmuls_pair_up_as_columns_then_rows() -> None:
    model, args = _mlp()
    split = column_row(_emitted(model, args))
    # 32->64 column (its bias too), 64->16 row (its bias whole), 16->8 column again
    assert split == {"seg0.0.weight": (COLUMN, 0), "seg0.0.bias": (COLUMN, 0),
                     "seg0.2.weight": (ROW, 1), "seg0.4.weight": (COLUMN, 0),
                     "seg0.4.bias": (COLUMN, 0)}


def test_a_llama_layer_splits_attention_by_heads_and_the_mlp_by_columns() -> None:
    model, kwargs = _llama()
    split = column_row(_emitted(model, (), kwargs))
    kinds = {name.removeprefix("seg0.model.layers.0.").removesuffix(".weight"): kind
             for name, (kind, _) in split.items() if ".layers.0." in name}
    assert kinds == {"self_attn.q_proj": COLUMN, "self_attn.k_proj": COLUMN,
                     "self_attn.v_proj": COLUMN, "self_attn.o_proj": ROW,
                     "mlp.gate_proj": COLUMN, "mlp.up_proj": COLUMN, "mlp.down_proj": ROW}
    assert split["seg0.lm_head.weight"] == (COLUMN, 0)  # the vocabulary split
    assert not any("norm" in name or "embed" in name for name in split)


def test_an_embedding_tied_to_the_output_layer_stays_whole() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(40, 16)
            self.mix = nn.Linear(16, 16)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.mix(self.embed(ids))) @ self.embed.weight.t()

    torch.manual_seed(0)
    split = column_row(_emitted(Tied(), (torch.randint(0, 40, (3,)),)))
    assert "seg0.embed.weight" not in split and split["seg0.mix.weight"] == (COLUMN, 0)


@pytest.mark.parametrize("build", [_mlp, _llama], ids=["mlp", "llama"])
def test_two_gloo_ranks_give_the_originals_outputs(build) -> None:
    model, inputs = build()
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
    check = verify_tensor_parallel(_emitted(model, args, kwargs), model, args, kwargs, ranks=2)
    assert check["status"] == "passed" and check["rows"] >= 1
    assert check["max_abs_diff"] < 1e-4


def test_a_degree_that_does_not_divide_a_split_dimension_says_which() -> None:
    model, args = _mlp()
    with pytest.raises(EmitError, match=r"seg0.0.weight has 64 along dimension 0, which 3 "):
        verify_tensor_parallel(_emitted(model, args), model, args, {}, ranks=3)


# --- weighed by the planner: observed, simulated, checked, recorded ----------------------------


def test_dtensor_is_observed_on_fake_ranks_and_each_collective_charged_where_it_waits() -> None:
    from autoplace.cluster import resolve_cluster
    from autoplace.fold import fold
    from autoplace.ir import Placement, Problem
    from autoplace.profile.cost import costs
    from autoplace.simulate import simulate
    from autoplace.solve.tensor import OUTPUTS, observe, tensor_problem

    model, args = _mlp()
    split = column_row(_emitted(model, args))
    seen = observe(_emitted(model, args), split, 2, args, {})
    # the row matmul's partial sums are all-reduced at once (4 x 16 floats), as Megatron does,
    # not where DTensor would first need them whole; the last column's output (4 x 8 floats)
    # gathered whole, as run_sharded returns it
    assert seen.collectives == {"linear_1": (("all_reduce", 4 * 16 * 4),),
                                OUTPUTS: (("all_gather_into_tensor", 4 * 8 * 4),)}
    assert seen.param_bytes["linear"] == ((32 * 64 + 64) * 4 // 2, (32 * 64 + 64) * 4)
    assert seen.share["linear"] == seen.share["linear_1"] == 0.5  # a column, a row
    assert seen.share["relu_1"] == 1.0  # on the all-reduced whole
    assert all(t > 0 for t in seen.seconds.values())

    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    model.eval()
    traced = trace_model(model, args, {})
    folded = fold(traced.graph, costs(traced.graph, cluster))
    problem = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    rank0 = tensor_problem(problem, seen, ("cuda:0", "cuda:1"))
    assert rank0.cluster.names == ("cuda:0",)
    node = {n.name: n for n in problem.graph.nodes}
    ops = {op: n.name for n in problem.graph.nodes for op in n.ops}
    row = ops["linear_1"]  # the node that waits for the row's all-reduce
    link = cluster.link("cuda:0", "cuda:1")
    from cost_models import ring_allreduce_s

    ring = ring_allreduce_s(256, 2, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                            latency_s=link.latency_s)
    assert rank0.costs.of(row, "cuda:0") >= ring
    first = ops["linear"]
    assert rank0.graph.node(first).param_bytes == node[first].param_bytes // 2
    # DTensor's dispatch, measured here (split less unsplit), lengthens each GPU launch
    assert set(seen.plain_seconds) == set(seen.seconds)
    dispatch = seen.overhead_s("linear")
    assert dispatch == max(0.0, seen.seconds["linear"] - 0.5 * seen.plain_seconds["linear"])
    assert rank0.costs.host.launch_of(first, "cuda:0") == pytest.approx(
        problem.costs.host.launch_of(first, "cuda:0") + dispatch)
    placed = simulate(rank0, Placement(device_of={n.name: "cuda:0" for n in rank0.graph.nodes}))
    assert placed.makespan_s > 0


def test_the_collectives_measured_here_are_kept_in_the_profile_cache(monkeypatch) -> None:
    """A candidate's collectives are timed on gloo processes once: planned again, their time
    comes from the profile cache (as the gradients' averaging does), and a note says so; other
    collectives, or another rank count, are measured anew."""
    import autoplace.profile.allreduce as allreduce
    from autoplace.pipeline.tensor import measured_collectives_s
    from autoplace.profile import open_cache
    from autoplace.progress.notes import collecting
    from autoplace.solve.tensor import Observed

    runs = []

    def timed(numels, *, replicas, mode, **_):
        runs.append((replicas, mode, [list(n) for n in numels]))
        return 0.001 * len(runs)

    monkeypatch.setattr(allreduce, "measure_allreduce_s", timed)
    cache = open_cache(use_cache=False)
    pass_ = Observed(collectives={"mm": (("all_reduce", 256),),
                                  "cat": (("all_gather_into_tensor", 64),)})
    with collecting() as notes:
        first = measured_collectives_s(pass_, 2, "cpu", cache)
        again = measured_collectives_s(pass_, 2, "cpu", cache)
    assert first == again == 0.001 and runs == [(2, "collectives", [[0, 256], [1, 64]])]
    assert "measured on 2 gloo" in notes[0] and "measured before on 2 gloo" in notes[1]
    assert measured_collectives_s(pass_, 4, "cpu", cache) == 0.002
    assert measured_collectives_s(Observed(collectives={"mm": (("all_reduce", 512),)}), 2, "cpu",
                                  cache) == 0.003
    assert measured_collectives_s(Observed(), 2, "cpu", cache) == 0.0 and len(runs) == 3


@pytest.fixture(scope="module")
def mlp_tp2():
    """``_mlp`` planned with ``--tp 2`` on two CPU threads (its candidate checked on 2 gloo
    ranks): the model, its inputs and the plan, shared by the tests that read them."""
    from autoplace.config import Config, Cost, Parallel
    from autoplace.pipeline import plan

    model, args = _mlp()
    return model, args, plan(model, args, Config(devices="2xcpu-thread",
                                                 cost=Cost(profile=False),
                                                 parallel=Parallel(tp=2)))


def test_the_planner_records_the_candidate_beside_the_placement(tmp_path, mlp_tp2) -> None:
    from autoplace.formats.plan import Plan
    from autoplace.pipeline import save

    _, _, planned = mlp_tp2
    tp = planned.plan.tensor_parallel
    assert tp is not None and tp.ranks == 2 and tp.devices == ("cpu:0", "cpu:1")
    # two column matmuls and a row; the row's all-reduce and the output's gather
    assert (tp.columns, tp.rows, tp.collectives, tp.check) == (2, 1, 2, "passed")
    assert tp.makespan_s > 0 and tp.measured_s > 0 and tp.max_abs_diff < 1e-5
    assert Plan.from_dict(planned.plan.to_dict()).tensor_parallel == tp
    assert any(n.startswith("tensor parallel over 2 ranks") for n in planned.plan.notes)
    # every split weight recorded: the first two layers' weights and biases as columns (the
    # output dimension), the middle one's weight as a row (its input dimension)
    assert tp.split == {"seg0.0.weight": (COLUMN, 0), "seg0.0.bias": (COLUMN, 0),
                        "seg0.2.weight": (ROW, 1), "seg0.4.weight": (COLUMN, 0),
                        "seg0.4.bias": (COLUMN, 0)}
    out = tmp_path / "out"
    save(planned, out)
    summary = (out / "summary.txt").read_text()
    assert "tensor parallel  tp 2 over cpu:0, cpu:1" in summary
    assert "<b>Tensor parallel:</b> tp 2 over cpu:0, cpu:1" in (out / "report.html").read_text()
    # the candidate as the ranks run it: the one-device model, its split, its entry point
    written = out / "tensor_parallel"
    assert json.loads((written / "split.json").read_text()) == {
        k: list(v) for k, v in tp.split.items()}
    assert (written / "model" / "inputs.safetensors").is_file()
    assert "DEVICES = ['cpu:0', 'cpu:1']" in (written / "launch.py").read_text()


def test_autoplace_run_checks_and_times_the_emitted_tensor_parallel_ranks(tmp_path, capsys,
                                                                          mlp_tp2) -> None:
    from safetensors.torch import load_file

    from autoplace.cli import main
    from autoplace.pipeline import save

    model, args, planned = mlp_tp2
    out = tmp_path / "out"
    save(planned, out)
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel", "--repeats", "2",
                 "--json", "--save-outputs", str(tmp_path / "o.safetensors")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["outputs_equal"] and result["max_abs_diff"] < 1e-5
    assert result["predicted_s"] == planned.plan.tensor_parallel.makespan_s
    assert result["nproc"] == 2 and len(result["times_s"]) == 2 and result["backend"] == "gloo"
    assert result["measured_s"] > 0
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(load_file(str(tmp_path / "o.safetensors"))["output"], expected)
    # what the ranks cannot run is refused before any process starts, naming what to pass
    for argv, says in [(["--nproc", "3"], "--nproc 3: the tensor-parallel candidate has 2 ranks"),
                       (["--nproc", "2", "--inputs", "x.safetensors"], "neither --inputs"),
                       ([], "--tensor-parallel goes with --nproc N")]:
        assert main(["run", str(out), "--tensor-parallel", *argv]) == 2
        assert says in capsys.readouterr().err
    (out / "tensor_parallel" / "launch.py").unlink()
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel"]) == 2
    assert "holds no launch.py and model/" in capsys.readouterr().err


def test_a_dp_by_tp_mesh_runs_each_tp_group_on_its_share_of_the_batch(tmp_path, capsys
                                                                      ) -> None:
    """4 ranks, a 2 x 2 mesh: each tp group runs half the batch, and rank 0 joins every
    group's outputs in batch order, as the original computes the whole batch (groups swapped,
    or one group's rows twice, would fail)."""
    from autoplace.cli import main
    from autoplace.config import Config, Cost, Parallel
    from autoplace.emit.distributed.tensor import by_batch
    from autoplace.pipeline import plan, save

    model, args = _mlp()
    planned = plan(model, args, Config(devices="4xcpu-thread", cost=Cost(profile=False),
                                       parallel=Parallel(tp=2, dp=2)))
    tp = planned.plan.tensor_parallel
    assert (tp.ranks, tp.dp, tp.world, tp.check, tp.sharding) == (2, 2, 4, "passed", None)
    out = tmp_path / "out"
    save(planned, out)
    assert "DP = 2" in (out / "tensor_parallel" / "launch.py").read_text()
    report = (out / "report.html").read_text()  # the mesh drawn: rank r at dp r // 2, tp r % 2
    assert 'id="mesh"' in report and "dp 2 × tp 2" in report
    assert "<tr><th>dp 1</th><td>cpu:2</td><td>cpu:3</td></tr>" in report
    assert ("tensor parallel  dp 2 x tp 2 over cpu:0, cpu:1, cpu:2, cpu:3: " in
            (out / "summary.txt").read_text().replace("\n", " "))
    assert "outputs checked on 4 gloo ranks" in (out / "summary.md").read_text()
    # autoplace run starts the same launch.py (as test_autoplace_run_checks_and_times_the_
    # emitted_tensor_parallel_ranks does with 2): only its count of processes is refused here
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel"]) == 2
    assert "a 2 x 2 mesh of 4 ranks" in capsys.readouterr().err
    one, two = torch.zeros(2, 3), torch.ones(2, 3)
    assert by_batch([[one, two], [torch.tensor(5.0), torch.tensor(6.0)]])[0].tolist() == (
        torch.cat([one, two]).tolist())
    assert by_batch([[torch.tensor(5.0), torch.tensor(6.0)]])[0].item() == 5.0


def test_an_inference_plan_where_no_placement_fits_is_the_mesh_checked_on_its_ranks(tmp_path
                                                                                    ) -> None:
    """A 32 -> 1024 -> 8 MLP on 2 CPU processes of 150,000 bytes each: its first layer's
    135,168 bytes and their activations fit no device, so no placement fits; tp 2 holds half of
    each weight on a rank and fits. The plan is the mesh, its outputs checked on 2 gloo ranks,
    and the report claims no bound."""
    import dataclasses

    from autoplace.cluster import resolve_cluster
    from autoplace.config import Config, Parallel, Solve
    from autoplace.pipeline import plan, save

    cluster, _ = resolve_cluster(spec="2xcpu-process")
    cluster = dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=150_000, reserved_bytes=0) for d in cluster.devices))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 8))
    planned = plan(model, (torch.randn(4, 32),), Config(
        devices=cluster, solve=Solve(time_limit_s=1), parallel=Parallel(tp=2)))
    made, tp = planned.plan, planned.plan.tensor_parallel
    assert made.is_mesh and planned.model is None and planned.tensor_model is not None
    assert (tp.dp, tp.ranks, tp.check, tp.over_bytes) == (1, 2, "passed", 0)
    assert made.verification.status == "passed" and made.training is None
    assert made.makespan_s == pytest.approx(tp.makespan_s)
    out = save(planned, tmp_path / "out")
    report = (out / "report.html").read_text()
    assert "none is proven for a tensor-parallel mesh" in report
    assert "no placement can beat the bound" not in report
    assert "(1x cpu-process: rank 0 of the tensor-parallel mesh's 2)" in (
        out / "summary.md").read_text()
    assert "No placement fits: run tp 2 over 2 CPU workers with tensor_parallel/" \
        "launch.py" in (out / "summary.txt").read_text().replace("\n", " ")


def test_dp_auto_weighs_tp_on_the_leading_devices_and_the_mesh_of_every_device() -> None:
    """--tp 2 --dp auto on 4 devices: tp 2 over the first two (dp 1) and a 2 x 2 mesh, each
    predicted, the faster kept and checked; a batch of 3 leaves no mesh but dp 1."""
    from autoplace.config import Config, Cost, Emit, Parallel
    from autoplace.pipeline import plan

    model, args = _mlp()
    planned = plan(model, args, Config(devices="4xcpu-thread", cost=Cost(profile=False),
                                       parallel=Parallel(tp=2, dp="auto")))
    tp = planned.plan.tensor_parallel
    assert set(tp.meshes) == {"1x2", "2x2"} and tp.check == "passed"
    assert tp.makespan_s == min(tp.meshes.values())
    assert tp.meshes[f"{tp.dp}x{tp.ranks}"] == tp.makespan_s
    assert any("meshes weighed (--dp auto)" in n for n in planned.plan.notes)
    odd = plan(model, (torch.randn(3, 32),), Config(
        devices="4xcpu-thread", cost=Cost(profile=False), emit=Emit(verify=False),
        parallel=Parallel(tp=2, dp="auto")))
    assert (odd.plan.tensor_parallel.dp, odd.plan.tensor_parallel.meshes) == (1, {})
    assert any("dp 2 x tp 2 not weighed (--dp auto)" in n for n in odd.plan.notes)


def test_a_plan_without_a_candidate_says_to_plan_with_tp(tmp_path, capsys) -> None:
    from autoplace.cli import main
    from autoplace.config import Config, Cost
    from autoplace.pipeline import plan, save

    model, args = _mlp()
    save(plan(model, args, Config(devices="2xcpu-thread", cost=Cost(profile=False))),
         tmp_path / "out")
    assert main(["run", str(tmp_path / "out"), "--nproc", "2", "--tensor-parallel"]) == 2
    assert "has no tensor-parallel candidate" in capsys.readouterr().err


def test_a_gpu_candidate_is_rehearsed_on_cpu_ranks(tmp_path, capsys) -> None:
    """Planned for two A100s: its launch.py puts the ranks on cuda:0 and cuda:1 (nccl), and
    this machine, which has none, runs them on CPU ranks (gloo) with --device-map."""
    import subprocess
    import sys

    from autoplace.cli import main
    from autoplace.config import Config, Cost, Parallel
    from autoplace.pipeline import plan, save

    model, args = _mlp()
    planned = plan(model, args, Config(devices="2xA100-40GB", cost=Cost(profile=False),
                                       parallel=Parallel(tp=2)))
    out = tmp_path / "out"
    save(planned, out)
    script = out / "tensor_parallel" / "launch.py"
    assert "DEVICES = ['cuda:0', 'cuda:1']" in script.read_text()
    if not torch.cuda.is_available():  # torchrun as a user starts it: a clear refusal
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                               "--nproc-per-node", "2", "--master-port", "0", str(script)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert """pass --device-map '{"cuda:*": "cpu"}'""" in done.stderr
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel", "--repeats", "1",
                 "--device-map", '{"cuda:*": "cpu"}']) == 0
    printed = capsys.readouterr().out
    assert "outputs: equal to the one-process model's" in printed
    assert "cuda:0 ran on cpu" in printed and "(--device-map)" in printed


@pytest.mark.parametrize(("argv", "says"), [
    (["--tp", "3"], "--tp 3 asks for more ranks than the 2 devices"),
    (["--tp", "2", "--granularity", "module"], "--tp is weighed for plans of ops"),
    (["--tp", "1"], "--tp must be"),
])
def test_a_tp_that_cannot_be_is_refused_before_any_work(tmp_path, capsys, argv, says) -> None:
    from pathlib import Path

    from autoplace.cli import main

    code = main(["plan", str(Path(__file__).parent.parent / "examples" / "mlp.py"),
                 "--devices", "2xcpu-thread", "--no-profile", "--out", str(tmp_path / "o"),
                 *argv])
    assert code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_split_dimension_the_ranks_do_not_divide_stays_whole_in_the_candidate() -> None:
    from autoplace.emit.distributed.tensor import divisible, matmuls

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(),
                          nn.Linear(16, 7))  # 7 classes: not a multiple of 2
    args = (torch.randn(4, 32),)
    emitted = _emitted(model, args)
    split, whole = divisible(emitted, column_row(emitted), 2)
    assert whole == ["seg0.4.bias", "seg0.4.weight"]
    assert matmuls(split) == (1, 1)
    check = verify_tensor_parallel(emitted, model, args, {}, ranks=2, split=split)
    assert check["status"] == "passed" and (check["columns"], check["rows"]) == (1, 1)


def _meta_llama() -> tuple[nn.Module, nn.Module, dict]:
    """The tiny Llama twice: with weights, and on the meta device (no weights)."""
    from transformers import LlamaForCausalLM

    real, inputs = _llama()
    with torch.device("meta"):
        meta = LlamaForCausalLM(real.config)
    return real.eval(), meta.eval(), inputs


def test_a_model_on_the_meta_device_is_observed_on_fake_tensors_as_on_real_ones() -> None:
    from autoplace.solve.tensor import OUTPUTS, observe

    real, meta, inputs = _meta_llama()
    seen = {}
    for name, model, kwargs in [("real", real, inputs),
                                ("meta", meta, {"input_ids": inputs["input_ids"].to("meta")})]:
        traced = trace_model(model, (), kwargs)
        emitted = emit_model(traced.module, {n.name: "cpu" for n in traced.module.graph.nodes
                                             if n.op == "call_function"},
                             meta_weights=name == "meta")
        seen[name] = observe(emitted, column_row(emitted), 2, (), kwargs)
    real_seen, fake_seen = seen["real"], seen["meta"]
    # the same collectives at the same ops, the same shares of work, weights and outputs (the
    # meta trace has two `contiguous` copies more, which move no data here)
    assert fake_seen.collectives == real_seen.collectives and OUTPUTS in fake_seen.collectives
    common = real_seen.share.keys() & fake_seen.share.keys()
    assert {op.split("_")[0] for op in fake_seen.share.keys() - common} <= {"contiguous"}
    assert real_seen.share.keys() <= fake_seen.share.keys() and len(common) > 100
    for table in ("share", "param_bytes", "output_share"):
        assert {op: getattr(fake_seen, table)[op] for op in common} == {
            op: getattr(real_seen, table)[op] for op in common}, table
    # nothing timed on fake tensors: DTensor's dispatch is the one measured figure, charged to
    # the ops that ran on DTensors
    assert not fake_seen.seconds and real_seen.seconds
    assert fake_seen.dispatch_s is not None and fake_seen.dispatch_s > 0
    linear = next(op for op in fake_seen.collectives if op.startswith("linear"))
    assert fake_seen.overhead_s(linear) == fake_seen.dispatch_s
    assert "arange" not in fake_seen.on_dtensors  # made from nothing: a plain op
    assert fake_seen.overhead_s("arange") == 0.0


def test_a_meta_model_gets_a_planned_candidate_that_is_not_emitted() -> None:
    from autoplace.config import Config, Cost, Parallel
    from autoplace.pipeline import plan

    _, meta, inputs = _meta_llama()
    planned = plan(meta, {"input_ids": inputs["input_ids"].to("meta")},
                   Config(devices="2xA100-40GB", cost=Cost(profile=False),
                          parallel=Parallel(tp=2)))
    tp = planned.plan.tensor_parallel
    assert tp is not None and tp.check == "skipped" and tp.measured_s is None
    assert (tp.columns, tp.rows) == (11, 4) and tp.collectives > 0 and tp.makespan_s > 0
    assert planned.tensor_model is None and planned.model is None
    said = next(n for n in planned.plan.notes if n.startswith("tensor parallel over 2"))
    assert "planned on fake tensors" in said and "not emitted" in said


def test_a_degree_that_does_not_divide_the_key_value_heads_is_refused(tmp_path, capsys) -> None:
    """examples/llama.py has 4 key/value heads: over 8 ranks DTensor cannot split them. The
    plan stops with the flag, the op, its module and what would fit; nothing is written."""
    from pathlib import Path

    from autoplace.cli import main

    out = tmp_path / "o"
    code = main(["plan", str(Path(__file__).parent.parent / "examples" / "llama.py"),
                 "--devices", "8xcpu-thread", "--no-profile", "--no-verify", "--time-limit",
                 "1", "--out", str(out), "--tp", "8", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--tp 8: DTensor cannot run" in err, err
    assert "(model.layers.0.self_attn) split over 8 ranks" in err
    assert "divides the model's attention heads (key/value heads included)" in err
    assert not out.exists()


def test_tp_auto_weighs_each_degree_of_the_alike_devices_and_keeps_the_fastest() -> None:
    from autoplace.config import Config, Cost, Emit, Parallel
    from autoplace.formats.plan import Plan
    from autoplace.pipeline import plan

    model, args = _mlp()
    planned = plan(model, args, Config(devices="4xA100-40GB", cost=Cost(profile=False),
                                       parallel=Parallel(tp="auto"), emit=Emit(verify=False)))
    tp = planned.plan.tensor_parallel
    assert set(tp.weighed) == {2, 4}  # the divisors of the 4 alike devices
    assert tp.makespan_s == min(tp.weighed.values()) and tp.weighed[tp.ranks] == tp.makespan_s
    assert tp.devices == tuple(f"cuda:{i}" for i in range(tp.ranks))
    assert Plan.from_dict(planned.plan.to_dict()).tensor_parallel == tp
    said = next(n for n in planned.plan.notes if n.startswith("weighed (--tp auto) tp 2"))
    assert f"kept tensor parallel over {tp.ranks} ranks" in said
    # leading devices that are not alike: nothing to weigh, said so
    unlike = plan(model, args, Config(devices="T4,A100-40GB", cost=Cost(profile=False),
                                      parallel=Parallel(tp="auto"), emit=Emit(verify=False)))
    assert unlike.plan.tensor_parallel is None
    assert any("tensor parallelism not weighed (--tp auto)" in n for n in unlike.plan.notes)


def test_tp_auto_keeps_each_tp_group_inside_a_host(tmp_path) -> None:
    # Tensor parallelism's collectives sit on the critical path: practitioners keep a tp group
    # inside a host's NVLink domain, and auto weighs no degree that would leave it.
    from autoplace.cluster.file import load_cluster_file
    from autoplace.pipeline.mesh import tensor_degrees

    hosts = "".join(f'[[hosts]]\nname = "node{i}"\ndevices = ["4xA100-80GB"]\n'
                    "nic_bandwidth_bytes_per_s = 25e9\n" for i in range(4))
    (tmp_path / "cluster.toml").write_text(hosts)
    cluster = load_cluster_file(tmp_path / "cluster.toml")
    assert tensor_degrees(cluster, "auto") == [2, 4]  # not 8 or 16: those cross a NIC
    assert tensor_degrees(cluster, "auto", dp=4) == [4]  # each group one host
    assert tensor_degrees(cluster, "auto", dp=8) == [2]  # two groups a host
    assert tensor_degrees(cluster, "auto", dp=2) == []  # 8 ranks a group: two hosts each
    assert tensor_degrees(cluster, 8, dp=2) == [8]  # asked for: weighed all the same


def test_a_tp_that_is_neither_a_number_nor_auto_is_refused(tmp_path, capsys) -> None:
    from pathlib import Path

    from autoplace.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["plan", str(Path(__file__).parent.parent / "examples" / "mlp.py"),
              "--out", str(tmp_path / "o"), "--tp", "two"])
    assert exited.value.code == 2
    assert "'two' is neither a whole number nor auto" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
