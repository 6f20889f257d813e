"""Tensor-parallel training (``--tp N --mode training``): the model and its loss emitted on one
device, its matmuls split as Megatron's column and row pairs (``column_row``), its step observed
forward and backward on fake ranks and priced (``solve.tensor_train``), and trained by N gloo
ranks under DTensor (``emit.distributed.tensor_train``): 3 steps give the original's losses,
gradients (gathered whole) and updated parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import zoo
from torch import nn

from autoplace.emit import emit_model
from autoplace.emit.distributed.tensor import column_row, matmuls
from autoplace.errors import VerificationError
from autoplace.trace import trace_model
from autoplace.train import loss_model

EXAMPLES = Path(__file__).parent.parent / "examples"


def _mlp() -> tuple[nn.Module, tuple, tuple]:
    # 32 -> 64 a column (its input is the batch: no input gradient to all-reduce), 64 -> 16 a
    # row (its partial sums all-reduced in the forward), 16 -> 8 a column again, whose input
    # gradient (4 x 16 floats) is all-reduced in the backward.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(),
                          nn.Linear(16, 8))
    return model, (torch.randn(4, 32),), (torch.randint(0, 8, (4,)),)


def _step_model(model: nn.Module, args: tuple, targets: tuple, *, loss=F.cross_entropy,
                kwargs: dict | None = None):
    """The model and its loss, and its one-device emitted model (as the planner makes them),
    and the keywords it takes (``targets`` among them)."""
    wrapped = loss_model(model, loss, args, kwargs or {}, targets)
    kwargs = {**(kwargs or {}), "targets": targets}
    traced = trace_model(wrapped, args, kwargs)
    emitted = emit_model(traced.module, {n.name: "cpu" for n in traced.module.graph.nodes
                                         if n.op == "call_function"})
    return wrapped, emitted, kwargs


def test_the_backward_runs_under_the_observation_and_its_collectives_are_charged() -> None:
    from autoplace.cluster import resolve_cluster
    from autoplace.fold import fold
    from autoplace.ir import Placement, Problem
    from autoplace.profile.cost import costs
    from autoplace.simulate import simulate
    from autoplace.simulate.schedules import BACKWARD, STEP
    from autoplace.solve.tensor import observe
    from autoplace.solve.tensor_train import tensor_step_problem
    from cost_models import ring_allreduce_s

    model, args, targets = _mlp()
    wrapped, emitted, kwargs = _step_model(model, args, targets)
    split = column_row(emitted)
    seen = observe(emitted, split, 2, args, kwargs, optimizer="adamw")
    assert seen.collectives["linear_1"] == (("all_reduce", 4 * 16 * 4),)  # the row's sums
    # the last column's input gradient, all-reduced in its backward (Megatron's f operator)
    assert seen.backward_collectives == {"linear_2": (("all_reduce", 4 * 16 * 4),)}
    assert seen.forward_s > 0 and seen.backward_s > 0 and seen.update_s > 0
    # rank 0 holds half of each split weight (and a column's bias), the row's bias whole
    assert seen.trained_bytes == ((32 * 64 + 64) + 64 * 16 + (16 * 8 + 8)) * 4 // 2 + 16 * 4

    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    traced = trace_model(wrapped, args, kwargs)
    folded = fold(traced.graph, costs(traced.graph, cluster))
    problem = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    step = tensor_step_problem(problem, seen, ("cuda:0", "cuda:1"), optimizer="adamw")
    node = {op: n.name for n in problem.graph.nodes for op in n.ops}["linear_2"]
    link = cluster.link("cuda:0", "cuda:1")
    ring = ring_allreduce_s(256, 2, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                            latency_s=link.latency_s)
    alone = tensor_step_problem(problem, seen.__class__(**{**vars(seen),
                                                           "backward_collectives": {}}),
                                ("cuda:0", "cuda:1"), optimizer="adamw")
    assert step.costs.of(node + BACKWARD, "cuda:0") == pytest.approx(
        alone.costs.of(node + BACKWARD, "cuda:0") + ring)
    updates = [n for n in step.graph.nodes if n.name.endswith(STEP)]
    assert sum(n.trainable_bytes for n in step.graph.nodes) == seen.trained_bytes
    assert updates and step.cluster.names == ("cuda:0",)
    placed = simulate(step, Placement(device_of={n.name: "cuda:0" for n in step.graph.nodes}))
    assert placed.makespan_s > 0


def _in_the_ranks(directory: Path, monkeypatch) -> None:
    """The ``sitecustomize.py`` written in ``directory`` runs in every process started from
    here on (the ranks), as Python imports it at start-up from ``PYTHONPATH``."""
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _plan(tmp_path: Path, example: str, *extra: str) -> Path:
    """``example`` planned for training with ``--tp 2`` on 2 CPU processes; the placement
    beside the candidate kept to one replica (its replicas are ``test_ddp``'s)."""
    from autoplace.cli import main

    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / example), "--mode", "training", "--devices",
                 "2xcpu-process", "--tp", "2", "--replicas", "1", "--time-limit", "2", "--out",
                 str(out), "--quiet", *extra]) == 0
    return out


def test_the_mlp_example_trains_as_two_tensor_parallel_ranks(tmp_path, capsys) -> None:
    from autoplace.cli import main

    out = _plan(tmp_path, "mlp.py")
    plan = json.loads((out / "plan.json").read_text())
    tp = plan["tensor_parallel"]
    assert tp["optimizer"] == plan["training"]["optimizer"] and tp["check"] == "passed"
    # 784 -> 256 a column, 256 -> 128 a row, 128 -> 10 a column; the row's all-reduce and the
    # logits' gather in the forward, the last column's input gradient in the backward
    assert (tp["columns"], tp["rows"], tp["collectives"]) == (2, 1, 3)
    assert tp["makespan_s"] > 0 and tp["measured_s"] > 0
    written = out / "tensor_parallel"
    assert "tensor_train_main" in (written / "train.py").read_text()
    assert not (written / "launch.py").exists()
    assert "tensor parallel  tp 2 over cpu:0, cpu:1: training step" in (
        out / "summary.txt").read_text()
    capsys.readouterr()
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel", "--train", "3",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["predicted_s"] == tp["makespan_s"] and result["measured_s"] > 0
    assert len(result["losses"]) == 3 and result["losses"][2] < result["losses"][0]
    # what the ranks cannot run is refused before any process starts
    for argv, says in [(["--nproc", "2", "--tensor-parallel"], "pass --train STEPS"),
                       (["--nproc", "3", "--tensor-parallel", "--train", "1"], "--nproc 3: "),
                       (["--nproc", "2", "--train", "1"], "it takes no --train")]:
        assert main(["run", str(out), *argv]) == 2
        assert says in capsys.readouterr().err


def test_a_llama_trains_as_two_tensor_parallel_ranks() -> None:
    """Attention split by heads (its backward too), the MLP by columns, the vocabulary by the
    head's columns; 3 AdamW steps on 2 gloo ranks equal the original's. A small Llama of the
    example's kind (the example itself, 4 layers of width 512 and 16,000 words, is
    benchmarks/mesh_cpu.py's); the planner's way to this check, with the MLP: the tests above."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from autoplace.emit.distributed.tensor_train import verify_tensor_training

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        use_cache=False))
    model.train()
    kwargs = {"input_ids": torch.randint(0, 256, (2, 16))}
    targets = (torch.randint(0, 256, (2, 16)),)

    def loss(out, labels):
        return F.cross_entropy(out.logits.reshape(-1, 256), labels.reshape(-1))

    wrapped, emitted, kwargs = _step_model(model, (), targets, loss=loss, kwargs=kwargs)
    split = column_row(emitted)
    # per layer q, k, v, gate and up columns, o and down rows; the head a column
    assert matmuls(split) == (11, 4)
    check = verify_tensor_training(emitted, wrapped, (), kwargs, targets, ranks=2,
                                   optimizer="adamw", split=split)
    assert (check["status"], check["steps"]) == ("passed", 3)


def test_a_gradient_left_unreduced_fails_the_check(tmp_path, monkeypatch) -> None:
    """The ranks' backward sabotaged (in their processes, by a sitecustomize): a matmul's
    partial sums taken as whole where autograd runs it, so a column's input gradient is not
    all-reduced and each rank keeps its own part. The forward is untouched, so the first loss
    is the original's; the gradients are not, and the check names the first that differs.
    Honest ranks of an MLP pass: ``test_the_mlp_example_trains_as_two_tensor_parallel_ranks``."""

    from autoplace.emit.distributed.tensor_train import verify_tensor_training

    (tmp_path / "sitecustomize.py").write_text(
        "import torch\n"
        "import autoplace.emit.distributed.dtensor as tensor\n"
        "honest = tensor._reduced_matmul\n"
        "def sabotaged(op, args, kwargs):\n"
        "    if torch.is_grad_enabled():\n"
        "        return honest(op, args, kwargs)\n"
        "    from torch.distributed.tensor import DTensor\n"
        "    table = DTensor._op_dispatcher._custom_op_handlers\n"
        "    mine = table.pop(op)\n"
        "    try:\n"
        "        out = op(*args, **kwargs)\n"
        "    finally:\n"
        "        table[op] = mine\n"
        "    if isinstance(out, DTensor) and out.placements[0].is_partial():\n"
        "        from torch.distributed.tensor import Replicate\n"
        "        return DTensor.from_local(out.to_local(), out.device_mesh, [Replicate()],\n"
        "                                  run_check=False)\n"
        "    return out\n"
        "tensor._reduced_matmul = sabotaged\n")
    _in_the_ranks(tmp_path, monkeypatch)
    model, args, targets = _mlp()
    wrapped, emitted, _ = _step_model(model, args, targets)
    with pytest.raises(VerificationError, match=r"the gradient of model\.0\.weight of the 2 "
                       r"tensor-parallel ranks' \(gathered whole\) at step 1 differs"):
        verify_tensor_training(emitted, wrapped, args, {}, targets, ranks=2,
                               optimizer="adamw", split=column_row(emitted))


def test_the_mlp_example_trains_on_a_dp_by_tp_mesh(tmp_path, capsys) -> None:
    """4 ranks, a 2 x 2 mesh: each tp group on half the batch, FSDP2 over dp on top of
    DTensor's split (torchtitan's FSDP + TP); 3 Adam steps equal the original's. ``autoplace
    run`` starts the same train.py (as test_the_mlp_example_trains_as_two_tensor_parallel_ranks
    does with 2): here, only its count of processes is refused."""
    from autoplace.cli import main
    from autoplace.formats.plan import read_plan

    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--mode", "training", "--devices",
                 "4xcpu-process", "--tp", "2", "--dp", "2", "--fsdp", "on", "--replicas", "1",
                 "--time-limit", "2", "--out", str(out), "--quiet"]) == 0
    tp = read_plan(out / "plan.json").tensor_parallel  # passes its schema and reads back
    assert (tp.ranks, tp.dp, tp.world, tp.sharding, tp.check) == (2, 2, 4, "fsdp", "passed")
    assert tp.devices == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
    # the split is found on the whole graph, though FSDP2's units cut the model in segments
    assert (tp.columns, tp.rows) == (2, 1) and len({k.split(".")[0] for k in tp.split}) == 3
    assert "dp 2 x tp 2 (FSDP2 over dp) over cpu:0, cpu:1, cpu:2, cpu:3" in (
        out / "summary.txt").read_text()
    assert "DP = 2" in (out / "tensor_parallel" / "train.py").read_text()
    capsys.readouterr()
    assert main(["run", str(out), "--nproc", "2", "--tensor-parallel", "--train", "1"]) == 2
    assert "a 2 x 2 mesh of 4 ranks" in capsys.readouterr().err


def test_the_data_parallel_collectives_are_priced_on_rank_0s_shards() -> None:
    """Over dp, rank 0 averages (or FSDP2 gathers and reduce-scatters) its tp shards, not the
    whole parameters: each update grows by the all-reduce of its shard's bytes over the dp
    group's ring, and FSDP2's gathers go on the forward and the backward."""
    from autoplace.cluster import resolve_cluster
    from autoplace.fold import fold
    from autoplace.ir import Placement, Problem
    from autoplace.profile.cost import costs
    from autoplace.simulate import simulate
    from autoplace.simulate.schedules import STEP
    from autoplace.solve.tensor import observe
    from autoplace.solve.tensor_train import tensor_step_problem
    from autoplace.train.dataparallel import allreduce_s, ring_link, with_allreduce
    from autoplace.train.sharded import with_fsdp

    model, args, targets = _mlp()
    wrapped, emitted, kwargs = _step_model(model, args, targets)
    seen = observe(emitted, column_row(emitted), 2, args, kwargs, optimizer="adamw")
    cluster, _ = resolve_cluster(spec="4xA100-40GB")
    traced = trace_model(wrapped, args, kwargs)
    folded = fold(traced.graph, costs(traced.graph, cluster))
    problem = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    groups = [("cuda:0",), ("cuda:2",)]
    alone, ddp, fsdp = (tensor_step_problem(
        problem, seen, ("cuda:0", "cuda:1"), optimizer="adamw", data_parallel=over)
        for over in (None, lambda p: with_allreduce(p, cluster, groups),
                     lambda p: with_fsdp(p, cluster, groups)))
    ring = ring_link(cluster, ["cuda:0", "cuda:2"])
    updates = [n for n in alone.graph.nodes if n.name.endswith(STEP)]
    assert sum(n.trainable_bytes for n in alone.graph.nodes) == seen.trained_bytes
    for node in updates:
        shard = alone.graph.node(node.name.removesuffix(STEP)).trainable_bytes
        assert ddp.costs.of(node.name, "cuda:0") == pytest.approx(
            alone.costs.of(node.name, "cuda:0") + allreduce_s(shard, 2, *ring))

    def step_s(p: Problem) -> float:
        return simulate(p, Placement(device_of={n.name: "cuda:0"
                                                for n in p.graph.nodes})).makespan_s

    assert step_s(alone) < step_s(ddp) and step_s(alone) < step_s(fsdp)
    # FSDP2 keeps half of rank 0's shards: its gradients and Adam's state halve (rounded up)
    held = [sum(n.param_bytes for n in p.graph.nodes if n.name.endswith(STEP))
            for p in (alone, fsdp)]
    assert held[1] == pytest.approx(held[0] / 2, abs=4 * len(updates))


def test_ranks_that_outnumber_the_cores_are_priced_sharing_them(monkeypatch) -> None:
    """4 single-threaded ranks on 2 cores each get half a core: every node of rank 0's step
    takes twice its time alone; 2 ranks on 2 cores keep theirs."""
    import autoplace.cluster.local as local
    from autoplace.cluster import resolve_cluster
    from autoplace.ir import Problem
    from autoplace.pipeline.mesh import stretch, stretched
    from autoplace.profile.cost import costs
    from autoplace.progress.notes import collecting

    monkeypatch.setattr(local, "cores_here", lambda: 2)
    with collecting() as notes:
        assert (stretch(2), stretch(4), stretch(6)) == (1.0, 2.0, 3.0)
    assert sum("which has 2 cores: they share them" in n for n in notes) == 2

    cluster, _ = resolve_cluster(spec="1xcpu-process")
    model, args, _ = _mlp()
    traced = trace_model(model, args, {})
    problem = Problem(graph=traced.graph, cluster=cluster, costs=costs(traced.graph, cluster))
    twice = stretched(problem, 2.0)
    for node in problem.graph.nodes:
        assert twice.costs.of(node.name, "cpu:0") == pytest.approx(
            2 * problem.costs.of(node.name, "cpu:0"))
    assert stretched(problem, 1.0) is problem


def test_a_model_on_the_meta_device_gets_a_planned_training_candidate(tmp_path) -> None:
    """A Llama shape on the meta device, --tp 2 --dp 2 --mode training on 4 A100s: observed
    forward and backward on fake tensors, priced with FSDP2 over dp, recorded, not emitted
    (no weights), and a note says why."""
    from autoplace.cli import main
    from autoplace.formats.plan import read_plan

    (tmp_path / "meta_llama.py").write_text(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "def build():\n"
        "    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,\n"
        "                         num_hidden_layers=2, num_attention_heads=8,\n"
        "                         num_key_value_heads=4, use_cache=False)\n"
        "    with torch.device('meta'):\n"
        "        model = LlamaForCausalLM(config)\n"
        "    return model, {'input_ids': torch.randint(0, 512, (2, 32))}\n"
        "def loss(outputs, labels):\n"
        "    logits = outputs.logits\n"
        "    return F.cross_entropy(logits.reshape(-1, 512), labels.reshape(-1))\n"
        "example_targets = (torch.randint(0, 512, (2, 32)),)\n")
    out = tmp_path / "out"
    assert main(["plan", str(tmp_path / "meta_llama.py"), "--mode", "training", "--devices",
                 "4xA100-80GB", "--tp", "2", "--dp", "2", "--time-limit", "1", "--out",
                 str(out), "--quiet"]) == 0
    plan = read_plan(out / "plan.json")
    tp = plan.tensor_parallel
    assert (tp.ranks, tp.dp, tp.check, tp.optimizer) == (2, 2, "skipped", "adam")
    assert (tp.columns, tp.rows) == (11, 4) and tp.makespan_s > 0
    assert set(tp.weighed_sharding) == {"fsdp", "ddp"}
    assert any("planned on fake tensors" in n and "not emitted" in n for n in plan.notes)
    assert not (out / "tensor_parallel").exists()


def _wide() -> tuple[nn.Module, tuple, tuple]:
    # The first layer's weight, gradient and Adam state take 540,672 bytes, all on one device
    # in any placement; a tp rank holds half of it, and FSDP2 over dp half of that again.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 8))
    return model, (torch.randn(4, 32),), (torch.randint(0, 8, (4,)),)


def _of_memory(spec: str, memory_bytes: int):
    import dataclasses

    from autoplace.cluster import resolve_cluster

    cluster, _ = resolve_cluster(spec=spec)
    return dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=memory_bytes, reserved_bytes=0)
        for d in cluster.devices))


def test_where_no_placement_fits_the_mesh_that_fits_is_the_plan(tmp_path) -> None:
    """No placement of the step fits devices of 420,000 bytes (its first layer's state needs
    540,672 on one). The dp 2 x tp 2 mesh fits with FSDP2 over dp and not with the gradients
    averaged, though that is faster: the one that fits is kept, and it is the plan, rank 0's
    step its schedule, no bound claimed; saved with its ranks' train.py, and `autoplace run`
    says how to run it."""
    from autoplace.cli.run import plan_and_model
    from autoplace.config import Config, Cost, Emit, Parallel, Solve
    from autoplace.errors import EmitError
    from autoplace.formats.plan import read_plan
    from autoplace.pipeline import plan, save

    model, args, targets = _wide()
    planned = plan(model, args, Config(
        devices=_of_memory("4xA100-40GB", 420_000), mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(tp=2, dp=2), emit=Emit(verify=False)),
        loss=F.cross_entropy, example_targets=targets)
    made, tp = planned.plan, planned.plan.tensor_parallel
    assert made.is_mesh and made.gap is None and planned.model is None
    assert made.solver.wall_s > 0  # the mesh's weighing
    assert (tp.dp, tp.ranks, tp.sharding, tp.over_bytes) == (2, 2, "fsdp", 0)
    assert tp.weighed_sharding["ddp"] < tp.weighed_sharding["fsdp"]  # faster, and over memory
    assert any("gradients averaged over dp: rank 0 peaks" in n for n in made.notes)
    assert made.makespan_s == pytest.approx(tp.makespan_s)
    assert made.schedule.peak_bytes[tp.devices[0]] == tp.peak_bytes <= 420_000
    assert made.training is not None and made.training.optimizer == "adam"
    out = save(planned, tmp_path / "out")
    assert (out / "tensor_parallel" / "train.py").is_file() and not (out / "model").exists()
    again = read_plan(out / "plan.json")
    assert again.is_mesh and again.tensor_parallel == tp
    summary = (out / "summary.md").read_text()
    assert ("No placement fits: run dp 2 x tp 2 (FSDP2 over dp) over 4 GPUs with "
            "tensor_parallel/train.py") in summary
    assert "| lower bound | none proven for a tensor-parallel mesh |" in summary
    assert made.verification.status == "skipped"  # verify=False: the mesh did not run
    with pytest.raises(EmitError, match="--tensor-parallel --nproc 4 --train K"):
        plan_and_model(out)


def test_the_mesh_where_no_placement_fits_reuses_the_replicas_trace(monkeypatch) -> None:
    """The mesh's dp 2 shard is the shard 2 replicas traced: the plan traces the model and
    its loss once (an 80-layer 70B-wide shape takes about 25 s a trace here)."""
    import autoplace.pipeline.forward as forward
    from autoplace.config import Config, Cost, Emit, Parallel, Solve, Training
    from autoplace.pipeline import plan

    traced = []
    real = forward._traced_problem
    monkeypatch.setattr(forward, "_traced_problem",
                        lambda *args: traced.append(args[1]) or real(*args))
    model, args, targets = _wide()
    made = plan(model, args, Config(
        devices=_of_memory("4xA100-40GB", 420_000), mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(tp=2, dp=2),
        training=Training(replicas=2), emit=Emit(verify=False)),
        loss=F.cross_entropy, example_targets=targets).plan
    assert made.is_mesh and made.tensor_parallel.dp == 2
    assert [a[0].shape[0] for a in traced] == [2]


def test_a_step_that_cannot_beat_the_mesh_is_not_solved(monkeypatch) -> None:
    """A chain of three 4096-wide layers on the meta device, a batch of 2,048, on 2 A100s:
    one replica's step runs the chain one op after another (its lower bound, 21.7 ms), and
    tp 2 halves the matmuls (about 12 ms, DTensor's dispatch measured here). With one replica
    only, the mesh is weighed first and that step is not solved: the plan is the mesh, and its
    status and notes say why. With a time to beat between the two counts' bounds (15 ms, two
    replicas taking 11.7 ms: too close to the measured mesh to compare with it), two
    replicas are solved and one is not, and the plan says so."""
    import autoplace.pipeline as pipeline
    import autoplace.solve as solving
    from autoplace.config import Config, Cost, Emit, Parallel, Solve, Training
    from autoplace.formats.plan import NO_FASTER_PLACEMENT, PLACEMENT_SLOWER
    from autoplace.formats.records import ReplicaOption
    from autoplace.pipeline import plan
    from autoplace.report.advice import advice

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                              nn.ReLU(), nn.Linear(4096, 8))
    solved = []
    real = solving.run_within
    monkeypatch.setattr(solving, "run_within", lambda p, *a, **k: solved.append(
        len(p.cluster.devices)) or real(p, *a, **k))

    def planned(replicas: int | str):
        return plan(model, (torch.randn(2048, 4096),), Config(
            devices="2xA100-80GB", mode="training", cost=Cost(profile=False),
            solve=Solve(time_limit_s=1), parallel=Parallel(tp=2),
            training=Training(replicas=replicas), emit=Emit(verify=False)),
            loss=F.cross_entropy, example_targets=(torch.randint(0, 8, (2048,)),)).plan

    made = planned(1)
    assert made.is_mesh and made.solver.status == NO_FASTER_PLACEMENT and not solved
    said = next(n for n in made.notes if n.startswith("no placement can beat"))
    bound_s = float(said.split("R=1's step takes at least ")[1].split(" s (lower bounds)")[0])
    assert bound_s >= made.tensor_parallel.makespan_s == made.makespan_s
    assert "no placement can beat it, and this is the plan" in " ".join(made.notes)
    assert advice(made).startswith("No placement can beat it: run tp 2 over 2 GPUs with ")
    monkeypatch.setattr(pipeline, "fastest_fit_s", lambda found: 0.015)
    made = planned("auto")
    assert solved == [1]  # R=2's replicas of one device each, bounded below 15 ms
    # solved, and slower than the mesh itself: the plan is the mesh, the placement a baseline
    placed = made.baselines["placement (2 replicas)"]
    assert made.is_mesh and made.solver.status == PLACEMENT_SLOWER
    assert made.makespan_s == made.tensor_parallel.makespan_s < placed.makespan_s < 0.015
    assert advice(made).startswith("The placement solved is slower: run tp 2 over 2 GPUs")
    said = next(n for n in made.notes if n.startswith("data-parallel replicas: R=1"))
    bound_ms = float(said.split("at least ")[1].split(" ms, not solved")[0])
    assert bound_ms / 1e3 == pytest.approx(bound_s, abs=1e-6)
    one, two = sorted(made.training.replica_options, key=lambda o: o.replicas)
    assert one.bound_s == pytest.approx(bound_s, abs=1e-6) and one.step_s is None
    assert two.bound_s is None and two.fits and "bound_s" not in two.to_dict()
    assert ReplicaOption.from_dict(one.to_dict()) == one


def test_where_neither_a_placement_nor_the_mesh_fits_the_error_names_both() -> None:
    from autoplace.config import Config, Cost, Parallel, Solve
    from autoplace.errors import InfeasibleError
    from autoplace.pipeline import plan

    model, args, targets = _wide()
    with pytest.raises(InfeasibleError, match=r"271872 bytes\)? short.*The tensor-parallel "
                       r"candidate \(--tp\) does not fit either: tp 2 peaks at \d+ bytes on "
                       r"rank 0, \d+ bytes over cuda:0's memory \(the least of those "
                       r"weighed\): add devices, or shard the model over a dp dimension"):
        plan(model, args, Config(devices=_of_memory("2xA100-40GB", 200_000), mode="training",
                                 cost=Cost(profile=False), solve=Solve(time_limit_s=1),
                                 parallel=Parallel(tp=2)),
             loss=F.cross_entropy, example_targets=targets)


def _blocks_plan(tmp_path: Path):
    """4 blocks on a batch of 512 over 4 devices of 300,000 bytes, --tp 2 --dp 2: rank 0 of
    the mesh peaks 224,352 bytes over with FSDP2 and none of its activations recomputed."""
    from autoplace.config import Config, Cost, Parallel, Solve
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    model = nn.Sequential(*[zoo.Block() for _ in range(4)])
    args, targets = (torch.randn(512, 16),), (torch.randint(0, 16, (512,)),)
    return plan(model, args, Config(
        devices=_of_memory("4xA100-40GB", 300_000), mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(tp=2, dp=2)),
        loss=F.cross_entropy, example_targets=targets)


def test_a_mesh_that_fits_only_recomputing_each_block_does_and_is_checked(tmp_path) -> None:
    """Where no sharding of the mesh fits, each block's forward runs again in its backward
    (torch.utils.checkpoint per FSDP2 unit): rank 0 fits, the 3 steps on 4 gloo ranks give the
    original's losses, gradients and parameters with every block run twice a step, and the
    ranks' train.py recomputes."""
    from autoplace.pipeline import save

    planned = _blocks_plan(tmp_path)
    tp = planned.plan.tensor_parallel
    assert (tp.recompute, tp.sharding, tp.over_bytes, tp.check) == (True, "fsdp", 0, "passed")
    assert any("rank 0 peaks 224352 bytes over" in n and "FSDP2" in n
               for n in planned.plan.notes)
    assert any("each unit's forward recomputed in the backward" in n
               for n in planned.plan.notes)
    out = save(planned, tmp_path / "out")
    assert "RECOMPUTE = True" in (out / "tensor_parallel" / "train.py").read_text()


def _blocks_in_units(block: type[nn.Module]) -> tuple[Any, Any, tuple, tuple]:
    """Two ``block``s and a cross-entropy loss on a batch of 8, emitted on the CPU with each
    block a segment of its own FSDP2 unit: the emitted model, the original with its loss, the
    inputs and the targets."""
    from autoplace.train.sharded import fsdp_op_units

    torch.manual_seed(0)
    model = nn.Sequential(*[block() for _ in range(2)])
    args, targets = (torch.randn(8, 16),), (torch.randint(0, 16, (8,)),)
    wrapped = loss_model(model, F.cross_entropy, args, {}, targets)
    traced = trace_model(wrapped, args, {"targets": targets})
    one = emit_model(traced.module, {n.name: "cpu" for n in traced.module.graph.nodes
                                     if n.op == "call_function"},
                     units=fsdp_op_units(traced.graph))
    return one, wrapped, args, targets


class _DroppingBlock(zoo.Block):
    # zoo.Block with a dropout on its branch: a unit that drops out in train()
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.b(torch.relu(self.a(x))))


def test_checkpointed_ranks_of_a_model_that_drops_out_pass_the_exact_check() -> None:
    """The check runs every dropout at probability zero (``--no-dropout``, a mode of the
    rank's thread); a checkpointed unit's forward runs again in the backward, outside that
    mode, and was recomputed with dropout on (torch's CheckpointError: other tensors saved).
    The recomputation runs under the mode too (``ddp.checkpointed``'s contexts), and the 3
    steps equal the original's."""
    from autoplace.emit.distributed.tensor_train import verify_tensor_training

    one, wrapped, args, targets = _blocks_in_units(_DroppingBlock)
    check = verify_tensor_training(one, wrapped, args, {}, targets, ranks=2,
                                   optimizer="adamw", split=column_row(one), recompute=True)
    assert check["max_abs_diff_gradients"] < 1e-5 and check["max_abs_diff_parameters"] < 1e-5


def test_ranks_that_do_not_recompute_fail_the_check(tmp_path, monkeypatch) -> None:
    """Two tp ranks of blocks emitted in FSDP2's units, to recompute each: ranks that leave the
    blocks unchecked (in their processes, by a sitecustomize) train the same numbers, but not as
    priced, and the check says the blocks did not run twice a step (honest ranks pass:
    ``test_a_mesh_that_fits_only_recomputing_each_block_does_and_is_checked``)."""
    from autoplace.emit.distributed.tensor_train import verify_tensor_training

    one, wrapped, args, targets = _blocks_in_units(zoo.Block)
    assert sum(seg.unit is not None for seg in one.segment_info) == 2
    (tmp_path / "sitecustomize.py").write_text(
        "import autoplace.emit.distributed.ddp as ddp\n"
        "ddp.checkpointed = lambda model: []\n")
    _in_the_ranks(tmp_path, monkeypatch)
    with pytest.raises(VerificationError, match="were to recompute each unit's forward in the "
                       "backward: 0 segments checkpointed ran 0 forwards in 3 steps"):
        verify_tensor_training(one, wrapped, args, {}, targets, ranks=2, optimizer="adamw",
                               split=column_row(one), recompute=True)


def test_gradients_left_unaveraged_over_dp_fail_the_check(tmp_path, monkeypatch) -> None:
    """On a 2 x 2 mesh whose ranks skip the gradients' averaging over dp (in their processes,
    by a sitecustomize), each tp group steps on its half of the batch's gradient: the first
    loss is the original's, the gradients are not, and the check names the first."""

    from autoplace.emit.distributed.tensor_train import verify_tensor_training

    (tmp_path / "sitecustomize.py").write_text(
        "import autoplace.train.dataparallel as dataparallel\n"
        "dataparallel.average_gradients = lambda params, group=None: None\n")
    _in_the_ranks(tmp_path, monkeypatch)
    model, args, targets = _mlp()
    wrapped, emitted, _ = _step_model(model, args, targets)
    with pytest.raises(VerificationError, match=r"the gradient of model\.\d\.\w+ of the 4 "
                       r"tensor-parallel ranks' \(gathered whole\) at step 1 differs"):
        verify_tensor_training(emitted, wrapped, args, {}, targets, ranks=2, dp=2,
                               sharding="ddp", optimizer="adamw", split=column_row(emitted))
    monkeypatch.delenv("PYTHONPATH")  # the same model, honest ranks: it passes
    check = verify_tensor_training(emitted, wrapped, args, {}, targets, ranks=2, dp=2,
                                   sharding="ddp", optimizer="adamw", split=column_row(emitted))
    assert (check["status"], check["steps"], check["replicas"]) == ("passed", 3, 2)


@pytest.mark.parametrize(("argv", "says"), [
    (["--tp", "3"], "--tp 3 asks for more ranks than the 2 devices"),
    (["--tp", "2", "--dtype", "bfloat16"], "--tp in training in bfloat16"),
    (["--dp", "2"], "--dp is the data-parallel degree of a tensor-parallel mesh: give --tp"),
    (["--dp", "auto"], "--dp is the data-parallel degree of a tensor-parallel mesh: give --tp"),
    (["--tp", "auto", "--dp", "2"], "give --tp too, a whole number"),
    (["--tp", "2", "--dp", "2"], "--dp 2 x --tp 2 make a mesh of 4 ranks, and the cluster "
     "has 2 devices"),
    (["--tp", "2", "--dp", "3", "--devices", "6xcpu-thread"],
     "--dp 3: the batch of 64 (dimension 0 of args.0, the first tensor input) does not "
     "divide into 3 data-parallel groups"),
])
def test_a_tp_that_cannot_train_is_refused_before_any_work(tmp_path, capsys, argv, says) -> None:
    from autoplace.cli import main

    code = main(["plan", str(EXAMPLES / "mlp.py"), "--mode", "training", "--devices",
                 "2xcpu-thread", "--no-profile", "--out", str(tmp_path / "o"), *argv])
    assert code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_degree_that_does_not_divide_the_key_value_heads_is_refused_for_training(
        tmp_path, capsys) -> None:
    from autoplace.cli import main

    out = tmp_path / "o"
    code = main(["plan", str(EXAMPLES / "llama.py"), "--mode", "training", "--devices",
                 "8xcpu-thread", "--replicas", "1", "--no-profile", "--no-verify",
                 "--time-limit", "1", "--out", str(out), "--tp", "8", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--tp 8: DTensor cannot run" in err, err
    assert "divides the model's attention heads (key/value heads included)" in err
    assert not out.exists()


def test_a_meta_model_with_dropout_is_weighed_for_training_on_fake_ranks() -> None:
    # dropout on DTensors in train(), on fake tensors: observed, DTensor's random state as it was
    from autoplace.config import Config, Cost, Parallel, Solve
    from autoplace.pipeline import plan

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Dropout(0.1),
                              nn.Linear(1024, 256), nn.Dropout(0.1), nn.Linear(256, 8))
    made = plan(model, (torch.randn(64, 256),), Config(
        devices="2xA100-80GB", mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(tp=2)),
        loss=F.cross_entropy, example_targets=(torch.randint(0, 8, (64,)),)).plan
    tp = made.tensor_parallel
    assert tp.ranks == 2 and tp.columns == 2 and tp.rows == 1 and tp.check == "skipped"
    from torch.distributed.tensor import _random

    assert _random._rng_tracker is None  # DTensor's own state as it was


def test_a_meta_gpt2_is_weighed_for_training_on_fake_ranks_as_with_its_weights() -> None:
    # GPT-2's fused c_attn split into q, k and v makes a strided shard, which DTensor's
    # backward gathers by reading index values: fake tensors carry them as symbols (the fake
    # mode has a ShapeEnv), and the collectives are those the model with weights runs.
    from transformers import GPT2Config, GPT2LMHeadModel

    from autoplace.config import Config, Cost, Emit, Parallel, Solve
    from autoplace.pipeline import plan

    config = GPT2Config(vocab_size=128, n_embd=64, n_layer=1, n_head=4, n_positions=32,
                        use_cache=False)
    ids = torch.randint(0, 128, (2, 16))
    records = []
    for device in ("meta", "cpu"):
        torch.manual_seed(0)
        with torch.device(device):
            model = GPT2LMHeadModel(config)
        records.append(plan(model, {"input_ids": ids}, Config(
            devices="2xA100-80GB", mode="training", cost=Cost(profile=False),
            solve=Solve(time_limit_s=1), parallel=Parallel(tp=2), emit=Emit(verify=False)),
            loss=lambda out, t: F.cross_entropy(out.logits.reshape(-1, 128), t.reshape(-1)),
            example_targets=(ids,)).plan.tensor_parallel)
    fake, real = records
    assert (fake.columns, fake.rows) == (real.columns, real.rows) == (2, 2)
    assert (fake.collectives, fake.collective_bytes) == (real.collectives, real.collective_bytes)
    assert fake.collectives > 0 and fake.check == "skipped"


def test_a_backward_that_needs_a_value_fake_tensors_lack_is_a_clear_error(monkeypatch) -> None:
    # Where DTensor's backward still asks fake tensors for a value: a ConfigError (exit 2)
    # naming the op and what to do, not a traceback; --tp auto notes it and plans without.
    from torch._subclasses.fake_tensor import DataDependentOutputException

    from autoplace.config import Config, Cost, Parallel, Solve
    from autoplace.errors import ConfigError
    from autoplace.pipeline import plan

    def needs_a_value(self, *args, **kwargs):
        raise DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)

    monkeypatch.setattr(torch.Tensor, "backward", needs_a_value)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

    def planned(tp):
        return plan(model, (torch.randn(16, 64),), Config(
            devices="2xA100-80GB", mode="training", cost=Cost(profile=False),
            solve=Solve(time_limit_s=1), parallel=Parallel(tp=tp)),
            loss=F.cross_entropy, example_targets=(torch.randint(0, 8, (16,)),)).plan

    with pytest.raises(ConfigError, match=r"parallel\.tp=2.*@backward.*fake tensors.*plan "
                       r"the model with its weights"):
        planned(2)
    made = planned("auto")
    assert made.tensor_parallel is None and not made.is_mesh
    assert any("tensor parallel over 2 ranks not weighed (--tp auto)" in n and "fake tensors"
               in n for n in made.notes)
