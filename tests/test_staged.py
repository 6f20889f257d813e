"""A pp x tp mesh (``--pp P --tp T``): the model cut into pipeline stages, each run by a tensor-
parallel group, planned, emitted and checked on P x T gloo ranks against the original."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autoplace.errors import ConfigError

MLP = str(Path(__file__).parent.parent / "examples" / "mlp.py")


def test_a_pp_by_tp_mesh_plans_runs_and_checks_each_stage_on_its_tp_group(tmp_path, capsys
                                                                           ) -> None:
    """4 CPU processes, pp 2 x tp 2: the plan cuts the MLP into two stages (each stage's
    rank peak recorded), its 4 gloo ranks give the original's outputs, and ``autoplace run``
    refuses a rank count that is not the mesh's, naming it."""
    from autoplace.cli import main

    out = tmp_path / "out"
    assert main(["plan", MLP, "--devices", "4xcpu-process", "--tp", "2", "--pp", "2",
                 "--time-limit", "2", "--no-profile", "--out", str(out)]) == 0
    tp = json.loads((out / "plan.json").read_text())["tensor_parallel"]
    assert (tp["pp"], tp["ranks"], tp["check"]) == (2, 2, "passed")
    assert len(tp["stage_peak_bytes"]) == 2 and all(b > 0 for b in tp["stage_peak_bytes"])
    assert tp["peak_bytes"] == max(tp["stage_peak_bytes"]) and tp["max_abs_diff"] < 1e-5
    stages = json.loads((out / "tensor_parallel" / "stages.json").read_text())
    assert stages["stages"] == ["cpu:0", "cpu:1"] and stages["crossings"]
    assert "PP = 2" in (out / "tensor_parallel" / "launch.py").read_text()
    assert "pp 2 x tp 2 over cpu:0, cpu:1, cpu:2, cpu:3" in (
        (out / "summary.txt").read_text().replace("\n", " "))
    report = (out / "report.html").read_text()
    assert "pp 2 × tp 2" in report and "<tr><th>pp 1</th><td>cpu:2</td><td>cpu:3</td>" in report
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel"]) == 2
    assert "--nproc 2: the tensor-parallel candidate has a pp 2 x tp 2 mesh of 4 ranks" in (
        capsys.readouterr().err)


def test_a_llama_cut_into_two_stages_of_two_tensor_parallel_ranks_gives_its_outputs() -> None:
    """The Llama example's shape cut in the middle of its ops: the rotary tables made once
    cross the stages whole (not cut along the batch), attention split by heads in each stage,
    and the 4 ranks give the original's outputs."""
    from autoplace.emit import emit_model
    from autoplace.emit.distributed.tensor import column_row, verify_tensor_parallel
    from autoplace.emit.distributed.tensor_stages import stage_devices
    from autoplace.trace import trace_model
    from tests.test_tensor_parallel import _llama

    model, kwargs = _llama()
    model.eval()
    traced = trace_model(model, (), kwargs)
    ops = [n.name for n in traced.module.graph.nodes if n.op == "call_function"]
    cut = emit_model(traced.module, {op: f"cpu:{2 * i // len(ops)}" for i, op in enumerate(ops)},
                     device_map={"cpu:*": "cpu"}, runtime="sequential")
    assert stage_devices(cut) == ["cpu:0", "cpu:1"]
    check = verify_tensor_parallel(cut, model, (), kwargs, ranks=2, pp=2, split=column_row(cut))
    assert check["max_abs_diff"] < 1e-4 and check["rows"] >= 2


@pytest.mark.parametrize(("argv", "says"), [
    (["--pp", "2"], "--pp cuts a tensor-parallel mesh into pipeline stages: give --tp too"),
    (["--pp", "2", "--tp", "2", "--dp", "2"], "--pp with --dp (a 3-D mesh) is not built yet"),
    (["--pp", "3", "--tp", "2"], "--pp 3 x --tp 2 make a mesh of 6 ranks, and the cluster has "
     "4 devices: choose degrees whose product is at most the devices' count (--pp 2 --tp 2)"),
    (["--pp", "1", "--tp", "2"], "--pp must be"),
    (["--pp", "auto", "--tp", "4"], "--pp auto with --tp 4: a mesh of 2 stages needs 8 alike "
     "devices"),
])
def test_a_pp_that_cannot_be_is_refused_before_any_work(tmp_path, capsys, argv, says) -> None:
    from autoplace.cli import main

    code = main(["plan", MLP, "--devices", "4xcpu-thread", "--no-profile",
                 "--out", str(tmp_path / "o"), *argv])
    assert code == 2 and says in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "o").exists()


def test_more_stages_than_the_graph_can_cut_says_how_many_it_can() -> None:
    """A single linear layer is one op worth running: two stages of it are refused, naming
    the flag, before any rank starts."""
    from autoplace.config import Config, Cost, Parallel, Solve
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    with pytest.raises(ConfigError, match=r"parallel.pp=2: the model's graph cuts into at "
                       r"most 1 stages worth running \(each with 5% or more of a pass's "
                       r"compute\): plan it without parallel.pp"):
        plan(torch.nn.Linear(8, 4), (torch.randn(2, 8),), Config(
            devices="4xcpu-thread", cost=Cost(profile=False), solve=Solve(time_limit_s=1),
            parallel=Parallel(tp=2, pp=2)))


def test_pp_auto_weighs_each_pipeline_degree_the_devices_hold_and_keeps_the_fastest() -> None:
    """Six alike devices with tp 2: pp 2 and pp 3 are each cut, priced and simulated from one
    observation under DTensor; the fastest is the candidate, both predictions recorded. A
    degree the model cannot cut into is noted, not fatal."""
    from autoplace.config import Config, Cost, Emit, Parallel, Solve
    from autoplace.formats.plan import Plan
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    made = plan(model, (torch.randn(512, 256),), Config(
        devices="6xA100-40GB", cost=Cost(profile=False), solve=Solve(time_limit_s=1),
        parallel=Parallel(tp=2, pp="auto"), emit=Emit(verify=False))).plan
    tp = made.tensor_parallel
    assert set(tp.meshes) == {"pp2x2", "pp3x2"} and tp.pp in (2, 3)
    assert tp.makespan_s == min(tp.meshes.values()) == tp.meshes[f"pp{tp.pp}x2"]
    assert len(tp.stage_peak_bytes) == tp.pp
    assert Plan.from_dict(made.to_dict()).tensor_parallel == tp
    said = next(n for n in made.notes if n.startswith("meshes weighed (--pp auto)"))
    assert "pp 2 x tp 2" in said and "pp 3 x tp 2" in said
    one = plan(torch.nn.Linear(8, 4), (torch.randn(2, 8),), Config(
        devices="4xcpu-thread", cost=Cost(profile=False), solve=Solve(time_limit_s=1),
        parallel=Parallel(tp=2, pp="auto"), emit=Emit(verify=False))).plan
    assert one.tensor_parallel is None
    assert any(n.startswith("pp 2 x tp 2 not weighed (--pp auto): parallel.pp=2: the "
                            "model's graph cuts into at most 1 stages") for n in one.notes)
    assert not any("not weighed (--tp auto)" in n for n in one.notes)


class _Tied(torch.nn.Module):
    """An embedding tied to the output layer (GPT-2's and T5's pattern), with a layer between
    to cut at."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(40, 16)
        self.mix = torch.nn.Linear(16, 16)
        self.more = torch.nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.more(torch.relu(self.mix(self.embed(ids))))) @ (
            self.embed.weight.t())


def test_a_tied_weight_read_in_two_training_stages_has_its_gradients_summed(tmp_path) -> None:
    """The tied embedding is read in both stages: stage 1 holds a copy of its own (no weight
    crosses the stages; the copy's bytes count in its memory), and the copy's gradient and the
    weight's are summed across the stages (an all-reduce per tp rank, priced on the updates),
    so both take the same step: the 3 Adam steps with 2 micro-batches (GPipe and 1F1B weighed:
    the step's micro-batch copies keep the updates' order edges once) give the original's
    losses, gradients (the tied weight's is both readers') and parameters; ``save`` writes
    the ranks' train.py with the mesh and its schedule. Planned for A100s (analytic costs,
    the ranks still checked on gloo): on CPU workers DTensor's op times are measured here, and
    under load the 5% stage rule once refused the cut."""
    import torch.nn.functional as F

    from autoplace.config import Config, Cost, Parallel, Solve, Training
    from autoplace.pipeline import plan, save

    torch.manual_seed(0)
    planned = plan(_Tied(), (torch.randint(0, 40, (4, 6)),), Config(
        mode="training", devices="4xA100-40GB", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), training=Training(replicas=1, microbatches=2),
        parallel=Parallel(tp=2, pp=2)),
        loss=lambda out, y: F.cross_entropy(out.reshape(-1, 40), y.reshape(-1)),
        example_targets=(torch.randint(0, 40, (4, 6)),))
    tp = planned.plan.tensor_parallel
    assert (tp.pp, tp.microbatches, tp.check) == (2, 2, "passed") and tp.max_abs_diff < 1e-5
    cut = planned.tensor_model
    assert list(cut.tied.values()) == ["model.embed.weight"]
    later = [s for s in cut.segment_info if s.planned_device == "cpu:1"]
    copies = [n for s in later for n, _ in getattr(cut, f"seg{s.index}").named_parameters()
              if "_stage1" in n]
    assert len(copies) == 1 and not any("embed" in n for s in later for n in s.inputs)
    assert tp.stage_peak_bytes[1] >= 40 * 16 * 4 * 4  # the copy, its gradient, Adam's two
    assert tp.schedule in ("gpipe", "1f1b")
    save(planned, tmp_path / "out")
    train = (tmp_path / "out" / "tensor_parallel" / "train.py").read_text()
    assert "PP = 2" in train and "MICROBATCHES = 2" in train
    tied = json.loads((tmp_path / "out" / "tensor_parallel" / "stages.json").read_text())["tied"]
    assert list(tied.values()) == ["model.embed.weight"]
