"""Training as users train (``--layers train``, ``autoplace.train.layers``): the emitted step runs
dropout and batch norm in ``train()``, checked against the original with dropout's probabilities
at zero and the running statistics compared; ``--layers eval`` keeps the ``eval()`` step."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autoplace.cli.run import train_plan
from autoplace.config import Config, Cost, Solve, Training
from autoplace.emit import emit_model
from autoplace.emit.check.training import verify_training
from autoplace.errors import ConfigError, VerificationError
from autoplace.formats.records import TrainingRecord
from autoplace.trace import trace_model
from autoplace.train import LossModel
from autoplace.train.graph import make_optimizer
from autoplace.train.layers import (
    dropout_ops,
    kept_state,
    no_dropout,
    updates_statistics,
    zero_dropout,
)

EXAMPLES = Path(__file__).parent.parent / "examples"


class ConvBnDrop(nn.Module):
    """conv 3->8 (3x3, same size), batch norm, ReLU, dropout 0.3, then 512 -> 10 on 8x8."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _tiny(*, train: bool = True):
    torch.manual_seed(0)
    model = LossModel(ConvBnDrop(), F.cross_entropy).train(train)
    return model, (torch.randn(8, 3, 8, 8),), {}, (torch.randint(0, 10, (8,)),)


def _split(model, args, kwargs, targets):
    """Traced as the model is (its mode), its ops in two halves on two CPU workers."""
    traced = trace_model(model, args, {**kwargs, "targets": targets})
    ops = [n.name for n in traced.module.graph.nodes if n.op == "call_function"]
    device_of = {op: "cpu:0" if i < len(ops) // 2 else "cpu:1" for i, op in enumerate(ops)}
    emitted = emit_model(traced.module, device_of)
    assert len(set(emitted.planned_devices)) == 2
    return emitted


def test_a_train_trace_drops_out_and_updates_statistics_an_eval_trace_does_not() -> None:
    model, args, kwargs, targets = _tiny()
    trained = trace_model(model, args, {"targets": targets}).module
    assert dropout_ops(trained) == 1 and updates_statistics(trained)
    model.eval()
    frozen = trace_model(model, args, {"targets": targets}).module
    assert dropout_ops(frozen) == 0 and not updates_statistics(frozen)


def test_dropout_at_zero_and_kept_state_leave_a_train_model_as_it_was() -> None:
    model, args, _, targets = _tiny()
    bn, start = model.model.bn, torch.get_rng_state()
    with kept_state(model):
        gm = trace_model(model, args, {"targets": targets}).module
        assert model(*args, targets=targets) != model(*args, targets=targets)  # dropout on
        with no_dropout() as mode:
            assert model(*args, targets=targets) == model(*args, targets=targets)
        assert mode.dropped == 2  # one dropout, two forwards
        with zero_dropout(gm):
            assert gm(*args, targets=targets) == gm(*args, targets=targets)
        assert gm(*args, targets=targets) != gm(*args, targets=targets)  # the graph restored
        # 8 forwards, of the model and of its graph, which shares the model's buffers
        assert int(bn.num_batches_tracked) == 8 and bn.running_mean.abs().sum() > 0
    assert int(bn.num_batches_tracked) == 0 and bn.running_mean.abs().sum() == 0
    assert torch.equal(start, torch.get_rng_state())  # the random state as before, too


def test_a_split_model_in_train_mode_trains_as_the_original_does() -> None:
    model, args, kwargs, targets = _tiny()
    emitted = _split(model, args, kwargs, targets)
    record = verify_training(emitted, model, args, kwargs, targets, optimizer="adam")
    assert record["status"] == "passed" and len(record["losses"]) == 3
    # running mean, variance and count, compared after every step; here equal to the bit
    assert record["buffers_compared"] == 3 and record["max_abs_diff_buffers"] == 0.0
    # The emitted graphs' batch norm updated its statistics (the emitted model shares the
    # original's buffers on the CPU: the original's are the emitted model's).
    buffers = {n.split(".", 1)[1]: b for n, b in emitted.named_buffers()}
    assert int(buffers["model.bn.num_batches_tracked"]) == 3
    assert buffers["model.bn.running_mean"].abs().sum() > 0
    # Dropout active: the step with it on lost other than the compared one (at zero).
    assert record["dropout_ops"] == 1
    assert record["loss_with_dropout"] != pytest.approx(record["losses"][0], abs=1e-4)


def test_the_check_fails_where_the_split_loses_the_running_statistics() -> None:
    model, args, kwargs, targets = _tiny()
    emitted = _split(model, args, kwargs, targets)
    for gm in emitted.children():  # momentum 0: the running statistics never move
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.batch_norm.default:
                node.args = (*node.args[:6], 0.0, *node.args[7:])
        gm.recompile()
    with pytest.raises(VerificationError, match=r"buffer model\.bn\.running_mean .* step 1"):
        verify_training(emitted, model, args, kwargs, targets, optimizer="adam")


class MlpDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(16, 32), nn.Dropout(0.2), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def test_the_check_fails_where_the_emitted_graph_does_not_drop_out() -> None:
    # Traced in eval(), the graph has no dropout: at probability zero it computes what the
    # original in train() computes, and only the count of dropouts tells them apart.
    torch.manual_seed(0)
    model = LossModel(MlpDrop(), F.cross_entropy)
    args, targets = (torch.randn(8, 16),), (torch.randint(0, 4, (8,)),)
    emitted = _split(model.eval(), args, {}, targets)
    model.train()
    with pytest.raises(VerificationError, match="drops out at 1 place.* the emitted graphs at 0"):
        verify_training(emitted, model, args, {}, targets, optimizer="adam")


def _plan(model, example, config, **kwargs):
    from autoplace.pipeline import plan

    return plan(model, example, config, **kwargs)


def _config(*, deterministic: bool = False, **training) -> Config:
    return Config(devices="2xcpu-thread", mode="training",
                  solve=Solve(time_limit_s=3, whatif=False, min_gain=0.0,
                              deterministic=deterministic),
                  cost=Cost(profile=False), training=Training(replicas=1, **training))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                        use_cache=False, tie_word_embeddings=True, bos_token_id=0,
                        eos_token_id=0, loss_type="ForCausalLM")
    ids = torch.randint(0, 64, (4, 16))
    return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def _losses(model: nn.Module, example: dict, *, train: bool, steps: int = 3) -> list[float]:
    """``steps`` AdamW steps of a copy of ``model``, in train() or eval()."""
    model = copy.deepcopy(model).train(train)
    opt = torch.optim.AdamW(model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(**example).loss
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_gpt2_trains_with_dropout_on_and_layers_eval_keeps_the_eval_step() -> None:
    model, example = _gpt2()
    assert model.training  # built, not loaded: in train(), as users train it
    eval_losses = _losses(model, example, train=False)
    planned, emitted = _plan(model, example, _config(optimizer="adamw"))
    training = planned.training
    assert training.layers_mode == "train" and model.training
    check = training.check
    # embeddings' dropout, then each layer's attention (sdpa's dropout_p) and two residuals
    assert check.dropout_ops == 1 + 2 * 3 and dropout_ops(emitted) == 7
    # GPT-2 has no batch norm: at probability zero, train() computes what eval() does
    assert check.losses == pytest.approx(eval_losses, rel=1e-5)
    assert check.loss_with_dropout != pytest.approx(check.losses[0], rel=1e-4)
    assert not any("eval() behaviour" in n for n in planned.notes)

    planned, emitted = _plan(model, example, _config(optimizer="adamw", layers="eval"))
    assert planned.training.layers_mode == "eval" and not model.training
    assert dropout_ops(emitted) == 0 and planned.training.check.dropout_ops is None
    assert planned.training.check.losses == pytest.approx(eval_losses, rel=1e-5)
    assert any("eval() behaviour" in n for n in planned.notes)


def _resnet():
    from autoplace.trace.load import load_model_file

    loaded = load_model_file(EXAMPLES / "resnet.py")
    return loaded.model, loaded.args, loaded.loss, loaded.targets


def test_the_resnet_example_trains_in_train_mode_split_over_two_devices(tmp_path) -> None:
    from autoplace.pipeline import save

    model, _, loss, _ = _resnet()
    # At the example's 16 images two CPU threads do not pay (their hand-offs and wake-ups cost
    # more than the shortcut convolutions they would overlap): at 64 they do. The solve counts
    # work, not seconds, so that two busy test workers do not cut it short of the split.
    args = (torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)
    targets = (torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(1)),)
    before = {n: b.clone() for n, b in model.state_dict().items()}
    planned, emitted = _plan(model, args, _config(optimizer="adam", deterministic=True),
                             loss=loss, example_targets=targets)
    assert len(set(emitted.planned_devices)) == 2
    check = planned.training.check
    assert check.status == "passed" and planned.training.layers_mode == "train"
    # 7 batch norms of 3 buffers each (the stem, 2 per block, 2 shortcuts), all compared
    assert check.buffers_compared == 27 and check.max_abs_diff_buffers < 1e-6
    assert check.dropout_ops is None  # none in a ResNet
    # Planning and checking ran the model many times: its weights and statistics are the
    # user's still.
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    # The saved model, trained by `autoplace run --train` (train.py's step, in one process),
    # loses as the original trained in train() does, not as in eval().
    save(planned, tmp_path, emitted)
    assert json.loads((tmp_path / "plan.json").read_text())["training"]["layers_mode"] == "train"
    trained = train_plan(tmp_path, steps=3)

    def losses(train: bool) -> list[float]:
        original = LossModel(copy.deepcopy(model), loss).train(train)
        opt = make_optimizer("adam", original.parameters())
        out = []
        for _ in range(3):
            opt.zero_grad()
            value = original(*args, targets=targets)
            value.backward()
            opt.step()
            out.append(float(value.detach()))
        stats = original.model.bn.running_mean
        return out, stats

    (in_train, stats), (in_eval, _) = losses(True), losses(False)
    assert trained.losses == pytest.approx(in_train, rel=1e-5)
    assert trained.losses != pytest.approx(in_eval, rel=1e-3)
    assert stats.abs().sum() > 0


def test_micro_batches_in_train_mode_compare_with_the_original_on_the_same_micro_batches(
) -> None:
    model, args, loss, targets = _resnet()
    planned, emitted = _plan(model, args, _config(microbatches=2, schedule="gpipe",
                                                  recompute="off"),
                             loss=loss, example_targets=targets)
    check = planned.training.check
    assert planned.training.microbatches == 2 and check.status == "passed"
    assert check.buffers_compared == 27
    # Batch norm normalizes by the micro-batch: the whole batch's first loss is another.
    whole = LossModel(copy.deepcopy(model), loss).train()
    with torch.no_grad():
        assert float(whole(*args, targets=targets)) != pytest.approx(check.losses[0],
                                                                      rel=1e-4)


def test_recomputation_is_refused_in_train_mode_with_batch_norm() -> None:
    model, args, loss, targets = _resnet()
    with pytest.raises(ConfigError, match=r"recompute='all'.*dropout masks.*layers='eval'"):
        _plan(model, args, _config(microbatches=2, recompute="all"), loss=loss,
              example_targets=targets)


def test_layers_is_a_training_option_with_two_values(tmp_path, capsys) -> None:
    from autoplace.cli import main

    with pytest.raises(ConfigError, match="training.layers.* must be one of train, eval"):
        Training(layers="frozen")
    with pytest.raises(ConfigError, match="training.layers.* is for training plans"):
        Config(training=Training(layers="eval"))
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--layers", "eval", "--no-profile",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--layers is for training plans" in capsys.readouterr().err
    # A plan made before --layers says nothing: it ran in eval().
    old = {"optimizer": "adam", "check": {"status": "skipped"}}
    assert TrainingRecord.from_dict(old).layers_mode is None


@pytest.mark.parametrize(("build", "training"), [
    ("resnet", {"microbatches": 2}), ("resnet", {"fsdp": "on"}), ("gpt2", {}),
], ids=["resnet-ddp-2-microbatches", "resnet-fsdp", "gpt2-ddp"])
def test_replicas_train_in_train_mode_as_the_original_on_their_shards(build, training) -> None:
    # Two processes (train.py --record --no-dropout), each on its shard: batch norm normalizes
    # by the shard (or its micro-batch), and rank 0's running statistics are compared.
    config = replace(_config(), training=Training(replicas=2, optimizer="adamw", **training))
    if build == "resnet":
        model, args, loss, targets = _resnet()
        planned, _ = _plan(model, args, config, loss=loss, example_targets=targets)
        one, _ = _plan(model, args, _config(optimizer="adamw"), loss=loss,
                       example_targets=targets)
        # the shards' statistics are not the batch's: the losses are another step's
        assert planned.training.check.losses[0] != pytest.approx(one.training.check.losses[0],
                                                                 rel=1e-4)
    else:
        model, example = _gpt2()
        planned, _ = _plan(model, example, config)
    check = planned.training.check
    assert planned.training.replicas == 2 and check.status == "passed"
    assert planned.training.sharding == ("fsdp" if "fsdp" in training else "ddp")
    assert check.losses == pytest.approx(check.original_losses, rel=1e-5)
    if build == "resnet":
        assert check.buffers_compared == 27 and check.max_abs_diff_buffers < 1e-6
    else:  # dropout active in the graphs the ranks run
        assert check.dropout_ops == 7
        assert check.loss_with_dropout != pytest.approx(check.losses[0], rel=1e-4)
