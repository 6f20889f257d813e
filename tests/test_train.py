"""The training step as a graph (``autoplace.train``): backward and optimizer-step nodes beside
each forward node, their costs and memory, checked against a real step of the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from zoo import MLP  # the seed tutorial's MLP: 784-256-128-10

from autoplace.cli.run import train_plan
from autoplace.cluster import resolve_cluster
from autoplace.config import Config, Cost, Emit, Solve, Training
from autoplace.emit.check.training import verify_training
from autoplace.errors import GraphError, VerificationError
from autoplace.fold import fold
from autoplace.ir import Placement, Problem
from autoplace.profile.cost import costs as cost_nodes
from autoplace.simulate import simulate, validate
from autoplace.simulate.schedules import phase_of
from autoplace.solve import solve
from autoplace.trace import trace_model
from autoplace.train import OPTIMIZERS, LossModel, step_problem


class WithLoss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(x), y)


BATCH = 64


def _forward_problem(model: nn.Module, devices: str, *, targets: bool = True,
                     batch: int = BATCH) -> Problem:
    torch.manual_seed(0)
    args = (torch.randn(batch, 784), torch.randint(0, 10, (batch,)))[:2 if targets else 1]
    traced = trace_model(model, args, {})
    cluster, _ = resolve_cluster(spec=devices)
    folded = fold(traced.graph, cost_nodes(traced.graph, cluster))
    return Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)


PARAMS = (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10) * 4


@pytest.mark.parametrize("optimizer, state", [("sgd", 0), ("sgd-momentum", 4), ("adam", 8)])
def test_each_layer_gets_a_colocated_backward_and_step(optimizer: str, state: int) -> None:
    forward = _forward_problem(WithLoss(MLP()), "cpu")
    step = step_problem(forward, optimizer)
    graph = step.graph
    holders = [n.name for n in forward.graph.nodes if n.param_bytes]
    assert len(holders) == 3 and sum(n.param_bytes for n in forward.graph.nodes) == PARAMS
    for name in holders:
        assert graph.colocation_of[name] == (name, f"{name}@backward", f"{name}@step")
        # The step holds the parameters' gradients (4 bytes each) and the optimizer's state.
        params = forward.graph.node(name).param_bytes
        assert graph.node(f"{name}@step").param_bytes == params + params // 4 * state
    assert sum(n.param_bytes for n in graph.nodes) == PARAMS * (2 + state // 4)
    for n in forward.graph.nodes:
        if f"{n.name}@backward" in graph.index:
            assert step.costs.of(f"{n.name}@backward", "cpu") == pytest.approx(
                2 * forward.costs.of(n.name, "cpu"))
    # Inputs and the loss's own constants need no gradient; the loss's backward starts the chain.
    assert not any(n.is_input and f"{n.name}@backward" in graph.index for n in graph.nodes)
    loss = forward.graph.outputs[0]
    assert not graph.in_edges(f"{loss}@backward") or all(
        e.src in forward.graph.index for e in graph.in_edges(f"{loss}@backward"))


def test_one_device_runs_the_whole_step_one_node_after_another() -> None:
    step = step_problem(_forward_problem(WithLoss(MLP()), "cpu"), "adam")
    schedule = simulate(step, Placement(device_of=dict.fromkeys(
        (n.name for n in step.graph.nodes), "cpu")))
    total = sum(step.costs.of(n.name, "cpu") for n in step.graph.nodes)
    assert schedule.makespan_s == pytest.approx(total)
    ends = schedule.end_s
    for n in step.graph.nodes:  # every backward after its forward, every step after both
        if n.name.endswith("@backward"):
            assert schedule.start_s[n.name] >= ends[n.name.removesuffix("@backward")] - 1e-12
        if n.name.endswith("@step"):
            base = n.name.removesuffix("@step")
            assert schedule.start_s[n.name] >= ends[f"{base}@backward"] - 1e-12


class _LiveBytes(TorchDispatchMode):
    """The peak of live tensor storage while the mode is on, on top of ``base`` bytes: every
    new storage an op allocates counts until it is freed (polled before each op)."""

    def __init__(self, base: int, known: list[torch.Tensor]) -> None:
        super().__init__()
        self.live: dict[StorageWeakRef, int] = {}
        self.known = {StorageWeakRef(t.untyped_storage()) for t in known}
        self.base = self.peak = base

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.live = {ref: n for ref, n in self.live.items() if not ref.expired()}
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                ref = StorageWeakRef(t.untyped_storage())
                if ref not in self.known:  # an in-place op's output is no new storage
                    self.live.setdefault(ref, t.untyped_storage().nbytes())
        self.peak = max(self.peak, self.base + sum(self.live.values()))
        return out


def _square_pair() -> nn.Module:
    """Two weights of one size, updated one after the other."""
    return nn.Sequential(nn.Linear(784, 784, bias=False), nn.Linear(784, 784, bias=False),
                         nn.Linear(784, 10))


@pytest.mark.parametrize("build", [MLP, _square_pair])
def test_the_step_s_memory_bounds_a_real_adam_step_from_above(build) -> None:
    # Parameters, gradients, Adam's two moments and the activations saved for backward: the
    # simulated peak of the step graph on one device is at least what a real step holds at its
    # peak (every storage an op allocates, tracked), and not far above it. The pair's second
    # update makes its two temporaries while the first's division lives on (the plan said
    # 2 x 784 x 784 x 4 bytes under the real step before it counted that).
    model = WithLoss(build())
    params = sum(p.numel() for p in model.parameters()) * 4
    step = step_problem(_forward_problem(model, "cpu"), "adam")
    predicted = simulate(step, Placement(device_of=dict.fromkeys(
        (n.name for n in step.graph.nodes), "cpu"))).peak_bytes["cpu"]
    torch.manual_seed(0)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)  # see Optimizer
    for _ in range(2):  # the second step starts with gradients and moments in memory
        optimizer.zero_grad(set_to_none=False)
        held = [*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
                *(t for st in optimizer.state.values() for t in st.values()), x, y]
        tracker = _LiveBytes(base=params * 4, known=held)  # parameters, gradients, two moments
        with tracker:
            model(x, y).backward()
            optimizer.step()
    assert tracker.peak <= predicted
    assert predicted <= 1.3 * tracker.peak


def test_a_split_step_keeps_each_layer_s_three_nodes_together() -> None:
    step = step_problem(_forward_problem(WithLoss(MLP()), "2xcpu-thread"), "adamw")
    result = solve(step, time_limit_s=2, workers=1, deterministic=True)
    device_of = result.schedule.placement.device_of
    for group in step.graph.colocate:
        assert len({device_of[n] for n in group}) == 1
    assert validate(step, result.schedule) == []


def test_a_model_that_returns_no_scalar_loss_is_refused() -> None:
    with pytest.raises(GraphError, match="not a scalar"):
        step_problem(_forward_problem(MLP(), "cpu", targets=False))
    with pytest.raises(GraphError, match="unknown optimizer 'lamb'"):
        step_problem(_forward_problem(WithLoss(MLP()), "cpu"), "lamb")
    assert set(OPTIMIZERS) == {"sgd", "sgd-momentum", "adam", "adamw"}


# The emitted model of a training plan, trained beside the original.


def _lenet() -> tuple[nn.Module, tuple, dict, tuple]:
    from autoplace.trace.load import load_model_file

    loaded = load_model_file(Path(__file__).parent.parent / "examples" / "lenet.py")
    targets = (torch.randint(0, 10, (loaded.args[0].shape[0],)),)
    return LossModel(loaded.model, F.cross_entropy), loaded.args, {}, targets


def _gpt2() -> tuple[nn.Module, tuple, dict, tuple]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                        use_cache=False, tie_word_embeddings=True, bos_token_id=0,
                        eos_token_id=0, loss_type="ForCausalLM")
    ids = torch.randint(0, 64, (2, 16))
    # transformers computes the loss itself from labels: no loss function.
    return LossModel(GPT2LMHeadModel(config).eval(), None), (), {"input_ids": ids,
                                                                 "labels": ids}, ()


def _mlp() -> tuple[nn.Module, tuple, dict, tuple]:
    torch.manual_seed(0)
    return (LossModel(MLP(), F.cross_entropy), (torch.randn(BATCH, 784),), {},
            (torch.randint(0, 10, (BATCH,)),))


def _split(model: nn.Module, args: tuple, kwargs: dict, targets: tuple):
    """The loss model traced and emitted with its ops alternating between two CPU workers in
    halves of the graph: every plan's split, forced."""
    from autoplace.emit import emit_model

    traced = trace_model(model, args, {**kwargs, "targets": targets})
    ops = [n.name for n in traced.module.graph.nodes if n.op == "call_function"]
    device_of = {op: "cpu:0" if i < len(ops) // 2 else "cpu:1" for i, op in enumerate(ops)}
    return emit_model(traced.module, device_of)


@pytest.mark.parametrize("build", [_mlp, _lenet, _gpt2], ids=["mlp", "lenet", "gpt2"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd-momentum"])
def test_a_split_model_trains_as_the_original_does(build, optimizer: str) -> None:
    model, args, kwargs, targets = build()
    emitted = _split(model, args, kwargs, targets)
    assert len(set(emitted.planned_devices)) == 2
    record = verify_training(emitted, model, args, kwargs, targets, optimizer=optimizer)
    assert record["status"] == "passed" and len(record["losses"]) == 3
    assert record["losses"][-1] < record["losses"][0]  # it does train
    # The original was trained on a copy: its weights are untouched.
    assert not any(p.grad is not None for p in model.parameters())


def test_the_training_check_fails_on_a_model_that_trains_differently() -> None:
    model, args, kwargs, targets = _mlp()
    emitted = _split(model, args, kwargs, targets)
    with torch.no_grad():  # one weight off by a little: the first loss already differs
        next(emitted.parameters())[0, 0] += 1.0
    with pytest.raises(VerificationError, match="step 1"):
        verify_training(emitted, model, args, kwargs, targets, optimizer="adam")


def test_every_step_is_compared_from_the_original_s_weights() -> None:
    """Gradients a rounding apart (here shifted by 1e-5 of their largest element, well within
    the tolerance) step the emitted weights a little apart; the check then sets them to the
    original's, so each step starts from the weights the original has then. Left apart, Adam
    grows such noise past the tolerance within 3 steps (T5's tied embedding over 4 workers)."""
    import copy

    from autoplace.train.graph import make_optimizer

    model, args, kwargs, targets = _mlp()
    emitted = _split(model, args, kwargs, targets)
    seen: list[dict[tuple[int, ...], torch.Tensor]] = []  # by shape: the MLP's are distinct

    def shifted_step() -> torch.Tensor:
        seen.append({tuple(p.shape): p.detach().clone() for p in emitted.parameters()})
        loss = emitted(*args, **kwargs, targets=targets)
        loss.backward()
        with torch.no_grad():
            for p in emitted.parameters():
                p.grad.add_(1e-5 * float(p.grad.abs().max()))
        return loss

    record = verify_training(emitted, model, args, kwargs, targets, optimizer="sgd-momentum",
                             emitted_step=shifted_step)
    assert record["status"] == "passed" and record["max_abs_diff_gradients"] > 0
    reference = copy.deepcopy(model)
    opt = make_optimizer("sgd-momentum", reference.parameters())
    for step in range(3):
        for p in reference.parameters():
            torch.testing.assert_close(seen[step][tuple(p.shape)], p.detach(), rtol=0, atol=0)
        opt.zero_grad()
        reference(*args, **kwargs, targets=targets).backward()
        opt.step()


def test_a_training_plan_end_to_end(tmp_path, monkeypatch) -> None:
    from autoplace.emit import load_model
    from autoplace.formats.plan import read_plan
    from autoplace.pipeline import plan, save

    torch.manual_seed(0)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    mlp = MLP()
    planned, emitted = plan(
        mlp,
        (x,),
        Config(
            devices="2xcpu-thread",
            mode="training",
            solve=Solve(time_limit_s=2, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
            training=Training(optimizer="adamw", replicas=1),
        ),
        loss=F.cross_entropy,
        example_targets=(y,),
    )
    assert planned.training.optimizer == "adamw"
    check = planned.training.check
    assert check.status == "passed" and check.losses == pytest.approx(
        check.original_losses)
    assert sum(n.name.endswith("@backward") for n in planned.problem.graph.nodes) == 6
    assert validate(planned.problem, planned.schedule) == []
    save(planned, tmp_path, emitted)
    again = read_plan(tmp_path)  # checked against the schema
    assert again.training == planned.training
    # The saved weights are the untrained ones: the check trained the emitted model, then
    # put its weights back.
    loaded = load_model(tmp_path / "model")
    saved = {name.split(".", 1)[1]: p for name, p in loaded.named_parameters()}
    for name, p in mlp.named_parameters():
        torch.testing.assert_close(saved[f"model.{name}"], p.detach())
    # autoplace run --train: the saved model trains as the check trained the original, its
    # backward and update on this thread run as the plan's CPU workers, on one thread.
    threads, step = [], torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *args, **kwargs: (
        threads.append(torch.get_num_threads()), step(self, *args, **kwargs))[1])
    before = torch.get_num_threads()
    trained = train_plan(tmp_path, steps=3)
    assert threads == [1, 1, 1] and torch.get_num_threads() == before
    assert trained.optimizer == "adamw" and trained.predicted_s == planned.makespan_s
    torch.testing.assert_close(torch.tensor(trained.losses),
                               torch.tensor(check.original_losses))
    assert len(trained.times_s) == 3 and trained.measured_s > 0


def test_run_train_refuses_an_inference_plan_and_no_steps(tmp_path, capsys) -> None:
    from autoplace.cli import main

    out = tmp_path / "out"
    model = Path(__file__).parent.parent / "examples" / "mlp.py"
    assert main(["plan", str(model), "--devices", "cpu", "--out", str(out), "--no-profile",
                 "--time-limit", "1"]) == 0
    assert main(["run", str(out), "--train", "3"]) == 2
    assert "holds an inference plan: --train needs one made with `autoplace plan --mode " \
           "training`" in capsys.readouterr().err
    assert main(["run", str(out), "--train", "0"]) == 2
    assert "--train must be 1 or more steps, got 0" in capsys.readouterr().err
    assert main(["run", str(out), "--lr", "0.1"]) == 2
    assert "--lr goes with --train" in capsys.readouterr().err
    assert main(["run", str(out), "--train", "2", "--save-outputs", str(tmp_path / "o.st")]) == 2
    assert not (tmp_path / "o.st").exists()


class WithUnusedHead(nn.Module):
    """A model with a parameter its forward never reads (a head for another task)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.unused = MLP(), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class TiedTwice(nn.Module):
    """One embedding read twice (as encoder-decoder models share one): the second read's
    backward must be planned too."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.emb(a).mean() + F.embedding(b, self.emb.weight).pow(2).mean()


def test_an_unused_parameter_does_not_fail_the_training_check() -> None:
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    planned, emitted = plan(
        WithUnusedHead(),
        (x,),
        Config(
            devices="2xcpu-thread",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
        ),
        loss=F.cross_entropy,
        example_targets=(y,),
    )
    assert planned.training.check.status == "passed"


def test_a_tied_weight_s_second_reader_gets_a_backward() -> None:
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    a, b = torch.randint(0, 50, (4, 8)), torch.randint(0, 50, (4, 8))
    planned, emitted = plan(
        TiedTwice(),
        (a, b),
        Config(
            devices="cpu",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False),
            cost=Cost(profile=False),
        ),
    )
    graph = planned.problem.graph
    embeddings = [n.name for n in graph.nodes if n.targets and "embedding" in n.targets[0]]
    assert len(embeddings) == 2
    (step,) = [n.name for n in graph.nodes if n.name.endswith("@step")]
    for name in embeddings:  # both readers' gradients, before the one update
        assert f"{name}@backward" in graph.index
        assert any(e.src == f"{name}@backward" for e in graph.in_edges(step))


def test_a_measured_backward_factor_replaces_the_analytic_one() -> None:
    from autoplace.profile.backward import measure_backward_factor

    model, args, kwargs, targets = _mlp()
    factor = measure_backward_factor(model, args, {**kwargs, "targets": targets}, "cpu:0")
    assert 0.3 < factor < 6.0  # a backward pass, measured: neither free nor a runaway
    forward = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    step = step_problem(forward, "adam", backward_factor={"cpu:0": factor})
    node = next(n.name for n in forward.graph.nodes if n.param_bytes)
    assert step.costs.of(f"{node}@backward", "cpu:0") == pytest.approx(
        factor * forward.costs.of(node, "cpu:0"))
    assert step.costs.of(f"{node}@backward", "cpu:1") == pytest.approx(
        2 * forward.costs.of(node, "cpu:1"))
    assert step.costs.source_of(f"{node}@backward", "cpu:0") == "calibrated"


def test_frozen_parameters_and_buffers_get_no_gradient_or_optimizer_state() -> None:
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    mlp = MLP()
    mlp.fc1.requires_grad_(False)  # fine-tuning the last two layers
    mlp.register_buffer("scale", torch.ones(10))
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))
    planned, emitted = plan(
        mlp,
        (x,),
        Config(
            devices="cpu",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False),
            cost=Cost(profile=False),
            training=Training(optimizer="adam"),
        ),
        loss=F.cross_entropy,
        example_targets=(y,),
    )
    graph = planned.problem.graph
    steps = [n for n in graph.nodes if n.name.endswith("@step")]
    trained = (256 * 128 + 128 + 128 * 10 + 10) * 4
    assert sum(n.param_bytes for n in steps) == 3 * trained  # gradients and two moments
    # fc1 needs no gradient at all: nothing before it is trained, so it has no backward.
    assert sum(n.name.endswith("@backward") for n in graph.nodes) < 6
    frozen = (784 * 256 + 256) * 4
    assert any(note.startswith(f"{frozen} bytes of parameters and buffers are not trained")
               for note in planned.notes)
    assert planned.training.check.status == "passed"


def test_optimizer_state_that_fits_nowhere_says_what_a_step_holds() -> None:
    import dataclasses

    from autoplace.errors import InfeasibleError
    from autoplace.pipeline import plan

    torch.manual_seed(0)
    x, y = torch.randn(8, 784), torch.randint(0, 10, (8,))
    cluster, _ = resolve_cluster(spec="2xcpu-thread")
    # 1.5 MB a device: the 0.94 MB of weights fit (inference plans), but not with Adam's 2.8 MB
    # of gradients and moments on top.
    small = dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=1_500_000, reserved_bytes=0)
        for d in cluster.devices))
    plan(
        MLP(),
        (x,),
        Config(
            devices=small,
            solve=Solve(time_limit_s=1, whatif=False),
            cost=Cost(profile=False),
            emit=Emit(model=False),
        ),
    )
    with pytest.raises(InfeasibleError) as error:
        plan(
            MLP(),
            (x,),
            Config(
                devices=small,
                mode="training",
                solve=Solve(time_limit_s=1, whatif=False),
                cost=Cost(profile=False),
                training=Training(optimizer="adam"),
                emit=Emit(model=False),
            ),
            loss=F.cross_entropy,
            example_targets=(y,),
        )
    message = str(error.value)
    assert f"{PARAMS} bytes of gradients and {2 * PARAMS} bytes of adam state" in message
    assert "optimizer with less state (sgd, sgd-momentum)" in message
    assert f"{4 * PARAMS - 3_000_000} bytes more than all the devices hold together" in message
    assert "--microbatches" in message


def test_the_first_step_s_memory_is_measured_per_device_and_checked_against_the_plan() -> None:
    from autoplace.emit import check_step_memory
    from autoplace.emit.check.memory import measure_step, weight_bytes

    model, args, kwargs, targets = _mlp()
    emitted = _split(model, args, kwargs, targets)

    def run(_charge):
        loss = emitted(*args, targets=targets, **kwargs)
        loss.backward()
        return loss.detach()

    weights = weight_bytes(emitted)
    measured = measure_step(emitted, run, optimizer="adam")
    # each device holds its weights and Adam's two moments (resident) and their gradients:
    # the backward's allocations are charged where the weights are
    for device, held in weights.items():
        assert measured.weights_bytes[device] == 3 * held
        assert measured.activation_peak_bytes[device] >= held
    # the check fails a plan that says less, and leaves the weights as they were
    before = [p.detach().clone() for p in emitted.parameters()]
    problem = _forward_problem(WithLoss(MLP()), "2xcpu-thread")
    schedule = simulate(problem, Placement(device_of=dict.fromkeys(
        (n.name for n in problem.graph.nodes), "cpu:0")))
    with pytest.raises(VerificationError, match="more memory than the plan"):
        check_step_memory(emitted, run, optimizer="adam", problem=problem, schedule=schedule)
    for p, q in zip(emitted.parameters(), before):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)
        assert p.grad is None


class _Scaled(nn.Module):
    """The MLP on ``x * 2 + 1``: the product needs no gradient, so it is freed once the sum
    is made, long before the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x * 2.0 + 1.0)


def test_the_values_kept_across_the_loss_bound_every_placement_s_memory() -> None:
    import dataclasses

    from autoplace.errors import InfeasibleError
    from autoplace.solve.bounds import check_memory, kept_across

    batch = 2048  # the activations outweigh the parameters, gradients and moments
    forward = _forward_problem(WithLoss(_Scaled()), "2xcpu-thread", batch=batch)
    step = step_problem(forward, "adam")
    loss = forward.graph.outputs[0]
    kept = kept_across(step, loss)
    # The sum fc1 reads and the two hidden layers' outputs wait for the backward; the product
    # before the sum does not.
    assert kept >= batch * (784 + 256 + 128) * 4
    product = next(n for n in step.graph.nodes if n.name.startswith("mul"))
    everything = sum(n.output_bytes - n.view_bytes for n in step.graph.nodes
                     if phase_of(n.name)[1] == "forward" and n.name != loss)
    assert kept <= everything - product.output_bytes
    held = step.graph.total_param_bytes + sum(d.reserved_bytes for d in step.cluster.devices)
    cpu0, cpu1 = step.cluster.names
    half = len(step.graph.nodes) // 2
    for device_of in ({n.name: cpu0 for n in step.graph.nodes},
                      {n.name: cpu1 for n in step.graph.nodes},
                      {n.name: cpu0 if i < half else cpu1 for i, n in enumerate(step.graph.nodes)}):
        schedule = simulate(step, Placement(device_of=device_of))
        turn = schedule.start_s[loss]  # the devices' levels once the loss has started
        level = sum(max((p for p in points if p[0] <= turn), default=(0.0, 0))[1]
                    for points in schedule.memory_timeline.values())
        assert level >= held + kept
    # Devices that hold the parameters, gradients and Adam's moments, but not those and the
    # values kept across the loss: no placement fits, said before any is tried.
    each = (held + kept) // 2 - 1
    small = dataclasses.replace(step, cluster=dataclasses.replace(step.cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=each) for d in step.cluster.devices)))
    with pytest.raises(InfeasibleError, match=f"keeps .*{kept} bytes.* of activations for its "
                                              f"backward when its loss \\({loss!r}\\) starts"):
        check_memory(small)
    roomy = dataclasses.replace(small, cluster=dataclasses.replace(small.cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=each + 2) for d in small.cluster.devices)))
    check_memory(roomy)
