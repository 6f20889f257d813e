"""Mixed precision (``--dtype``): the model cast before tracing, the step graph's bytes per
parameter (ZeRO's 16 for Adam), the float32 master weights and float16's loss scale
(``emit.train.optimizer.MasterWeights``), and the training check in a half dtype, which must still
catch a wrong gradient or a missed update."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from test_train import BATCH, PARAMS, WithLoss, _mlp
from zoo import MLP

import autoplace.emit.check.training as training
from autoplace.cli import main
from autoplace.cli.run import train_plan
from autoplace.cluster import resolve_cluster
from autoplace.config import Config, Cost, Emit, Solve, Training
from autoplace.emit.train.optimizer import GROWTH_INTERVAL, INIT_SCALE, MasterWeights
from autoplace.errors import AutoplaceError, VerificationError
from autoplace.fold import fold
from autoplace.ir import Problem
from autoplace.pipeline import plan, save
from autoplace.profile.cost import costs as cost_nodes
from autoplace.simulate.schedules import STEP
from autoplace.trace import trace_model
from autoplace.train import check_dtype, step_problem, training_memory
from autoplace.train.graph import OPTIMIZERS
from autoplace.train.precision import cast, update_of

COUNT = PARAMS // 4  # the MLP's parameters: 235,146


def _half_forward(dtype: str) -> Problem:
    """The MLP and its loss cast to ``dtype`` (its labels left integers), traced on one CPU."""
    torch.manual_seed(0)
    model, args = cast(WithLoss(MLP()), (torch.randn(BATCH, 784),
                                         torch.randint(0, 10, (BATCH,))), dtype)
    assert args[0].dtype == getattr(torch, dtype) and args[1].dtype == torch.int64
    traced = trace_model(model, args, {})
    cluster, _ = resolve_cluster(spec="cpu")
    folded = fold(traced.graph, cost_nodes(traced.graph, cluster))
    return Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)


# bytes per parameter: the half parameter and gradient (2 + 2), the float32 master (4) and the
# optimizer's float32 state (ZeRO, section 3.1: Adam K = 12 of fp32 copy and moments)
@pytest.mark.parametrize(("optimizer", "dtype", "total"), [
    ("adam", "bfloat16", 16), ("adamw", "float16", 16), ("sgd", "bfloat16", 8),
    ("sgd-momentum", "bfloat16", 12), ("adam", "float32", 16), ("sgd", "float32", 8)])
def test_the_step_holds_zero_s_bytes_per_parameter(optimizer: str, dtype: str,
                                                   total: int) -> None:
    forward = _half_forward(dtype)
    size = 4 if dtype == "float32" else 2
    assert sum(n.param_bytes for n in forward.graph.nodes) == COUNT * size
    assert {n.dtype for n in forward.graph.nodes if n.param_bytes} == {dtype}
    step = step_problem(forward, optimizer, dtype=dtype)
    steps = [n for n in step.graph.nodes if n.name.endswith(STEP)]
    held = sum(n.param_bytes for n in step.graph.nodes)
    assert held == pytest.approx(COUNT * total, abs=len(steps))  # int() per node
    grads = sum(n.trainable_bytes for n in forward.graph.nodes)
    state = sum(n.param_bytes for n in steps) - grads
    assert state == pytest.approx(COUNT * (total - 2 * size), abs=len(steps))
    update = update_of(OPTIMIZERS[optimizer], dtype)
    if dtype != "float32":  # one float32 gradient of a tensor at a time, and its traffic
        opt = OPTIMIZERS[optimizer]
        assert update.workspace_bytes_per_param == 4 + opt.workspace_bytes_per_param
        assert update.traffic_bytes_per_param == opt.traffic_bytes_per_param + (
            12 if dtype == "bfloat16" else 22)
    text = training_memory(forward.graph, optimizer, dtype=dtype)
    assert f"{grads} bytes of gradients and {state} bytes of {optimizer} state" in text
    assert ("master weights" in text) == (dtype != "float32")


def test_dtype_names_and_a_bad_one() -> None:
    assert [check_dtype(d) for d in ("fp32", "bf16", "FP16", "torch.bfloat16", "half")] == [
        "float32", "bfloat16", "float16", "bfloat16", "float16"]
    with pytest.raises(AutoplaceError, match="dtype must be one of float32, bfloat16, "
                       "float16, got 'int8'"):
        check_dtype("int8")


def test_a_bad_dtype_on_the_command_line_exits_2(tmp_path, capsys) -> None:
    from test_cli import EXAMPLES

    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--dtype", "fp8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplace: error: --dtype must be one of float32, bfloat16, float16")
    assert not out.exists()


def test_float16_skips_a_step_whose_gradient_overflowed_and_halves_the_scale() -> None:
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float16))
    opt = MasterWeights("sgd", [weight], dtype="float16", lr=0.5)
    assert opt.loss_scale == INIT_SCALE and opt.master(weight).dtype == torch.float32
    weight.grad = torch.tensor([float("inf"), 1.0], dtype=torch.float16)
    assert opt.step() is False
    assert weight.tolist() == [1.0, 2.0] and opt.loss_scale == INIT_SCALE / 2
    assert opt.skipped == 1
    opt.zero_grad()
    opt.backward((weight * torch.tensor([1.0, -1.0], dtype=torch.float16)).sum())
    assert weight.grad.tolist() == [INIT_SCALE / 2, -INIT_SCALE / 2]  # the scaled loss's
    assert opt.step() is True
    assert weight.tolist() == [0.5, 2.5]  # the unscaled gradient times lr
    for _ in range(GROWTH_INTERVAL - 1):  # the scale doubles after 2000 finite steps
        weight.grad = torch.zeros(2, dtype=torch.float16)
        opt.step()
    assert opt.loss_scale == INIT_SCALE


def test_bfloat16_keeps_an_update_smaller_than_its_precision_in_the_master() -> None:
    weight = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.bfloat16))
    opt = MasterWeights("sgd", [weight], dtype="bfloat16", lr=1e-3)
    assert opt.loss_scale == 1.0
    for _ in range(10):  # each 1e-3 step is below bfloat16's 2**-8 near 1: lost without master
        weight.grad = torch.ones(1, dtype=torch.bfloat16)
        opt.step()
    torch.testing.assert_close(opt.master(weight), torch.tensor([0.99]))
    assert weight.item() == torch.tensor(0.99).to(torch.bfloat16).item() != 1.0


def _plan(dtype: str, microbatches: int, devices: Any = "2xcpu-thread", *,
          objective: str = "latency", verify: bool = True, replicas: int | str = "auto"):
    model, args, kwargs, targets = _mlp()
    config = Config(devices=devices, mode="training", dtype=dtype,
                    solve=Solve(time_limit_s=2, whatif=False, min_gain=0.0, objective=objective),
                    training=Training(optimizer="adam", microbatches=microbatches,
                                      replicas=replicas),
                    emit=Emit(verify=verify))
    return plan(model.model, args, config, loss=model.loss, example_targets=targets)


@pytest.mark.parametrize(("dtype", "microbatches"), [
    ("bfloat16", 1), ("bfloat16", 2), ("float16", 1), ("float16", 2)])
def test_a_split_mlp_trains_in_mixed_precision_as_the_original(dtype: str,
                                                               microbatches: int) -> None:
    original = _mlp()[0].model
    # The step needs 6.27 MB on one CPU worker, and two threads' handovers cost more than its
    # halves would overlap: two workers of 6 MB each must split it.
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    small = replace(cluster, devices=tuple(replace(d, memory_bytes=6_000_000)
                                           for d in cluster.devices))
    planned, emitted = _plan(dtype, microbatches, small, objective="throughput")
    assert original.fc1.weight.dtype == torch.float32  # the caller's model is not cast
    training = planned.training
    assert training.dtype == dtype and training.replicas == 1
    check = training.check
    assert check.status == "passed" and check.dtype == dtype
    assert len(check.losses) == 3 + check.skipped_steps
    if (dtype, microbatches) == ("float16", 1):  # the MLP's gradient overflows under 2**16
        assert check.skipped_steps == 1 and check.losses[0] == check.losses[1]
    assert len(set(emitted.planned_devices)) == 2  # the split is real
    assert {p.dtype for p in emitted.parameters()} == {getattr(torch, dtype)}
    assert any("float32 master weights" in n for n in planned.notes)
    holders = [n for n in planned.problem.graph.nodes if n.name.endswith(STEP)]
    assert sum(n.param_bytes for n in holders) == pytest.approx(COUNT * 14, abs=len(holders))


def test_run_train_steps_the_plan_s_precision(tmp_path) -> None:
    planned, emitted = _plan("float16", 2)
    save(planned, tmp_path, emitted)
    trained = train_plan(tmp_path, steps=4)
    check = planned.training.check
    # the same micro-batches, optimizer and loss scale as the check's emitted model
    assert check.skipped_steps == 0 and len(check.losses) == 3
    torch.testing.assert_close(torch.tensor(trained.losses[:3]), torch.tensor(check.losses))
    assert any("float16 mixed precision" in n for n in trained.notes)
    assert trained.to_dict()["dtype"] == "float16"
    assert "adam in float16 mixed precision, 2 micro-batches" in (
        tmp_path / "summary.md").read_text()


def test_the_check_in_half_precision_still_fails_a_wrong_gradient_or_a_missed_update(
        monkeypatch) -> None:
    planned, emitted = _plan("bfloat16", 1, verify=False)
    model, args, kwargs, targets = _mlp()
    model, (args, targets) = cast(model, (args, targets), "bfloat16")
    untrained = {k: v.clone() for k, v in emitted.state_dict().items()}
    last = [p for n, p in emitted.named_parameters() if n.endswith("fc3.bias")][0]

    def check(**extra) -> dict:
        emitted.load_state_dict(untrained)
        return training.verify_training(emitted, model, args, kwargs, targets,
                                        optimizer="adam", dtype="bfloat16", **extra)

    assert check()["status"] == "passed"

    def off(**_: float) -> torch.Tensor:  # one layer's gradient 10% off
        loss = emitted(*args, targets=targets)
        loss.backward()
        last.grad.mul_(1.1)
        return loss

    with pytest.raises(VerificationError, match="gradient of model.fc3.bias at step 1"):
        check(emitted_step=off)

    class Missed(MasterWeights):  # the emitted model's last master is not updated
        made = 0

        def step(self) -> bool:
            Missed.made += 1
            if Missed.made % 2 == 0:
                grad, last.grad = last.grad, None
                stepped = super().step()
                last.grad = grad
                return stepped
            return super().step()

    monkeypatch.setattr(training, "MasterWeights", Missed)
    with pytest.raises(VerificationError, match="model.fc3.bias after step 1"):
        check()


def test_replicas_in_a_half_dtype_are_not_built_yet() -> None:
    with pytest.raises(AutoplaceError, match="replicas in bfloat16 .*training.replicas=1 or "
                       "dtype='float32'"):
        _plan("bfloat16", 1, replicas=2)


def test_an_inference_plan_in_bfloat16_runs_the_cast_model() -> None:
    model, args, _, _ = _mlp()
    planned = plan(
        model.model,
        args,
        Config(
            devices="2xcpu-thread",
            dtype="bf16",
            solve=Solve(time_limit_s=2, whatif=False),
            cost=Cost(profile=False),
        ),
    ).plan
    assert planned.verification.status == "passed"
    assert {n.dtype for n in planned.problem.graph.nodes if n.param_bytes} == {"bfloat16"}
    assert sum(n.param_bytes for n in planned.problem.graph.nodes) == COUNT * 2

