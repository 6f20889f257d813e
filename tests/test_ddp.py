"""Data-parallel replicas of a training plan (``autoplace.emit.distributed.ddp``,
``autoplace.emit.distributed.replicas``): R processes under torchrun on 127.0.0.1 (gloo), each on
its shard of the batch (under DDP, or in micro-batches with the gradients averaged after them),
checked against the original model trained on the whole batch in one process.

The plans are the examples' (``examples/mlp.py``, ``examples/lenet.py``) planned for one
training step on two CPU workers, with ``training.replicas = 2`` set on the plan before saving
(as the planner will set it). Each test that starts processes starts one torchrun (a few
seconds: three processes import torch).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autoplace.cli import main
from autoplace.cluster.local import worker_threads
from autoplace.config import Config, Cost, Solve, Training
from autoplace.emit.distributed.ddp import (
    batch_size,
    replica_backend,
    replica_device_map,
    replica_main,
    shard,
    write_train_script,
)
from autoplace.emit.distributed.replicas import launch_replicas, verify_replicas
from autoplace.errors import AutoplaceError, EmitError, VerificationError
from autoplace.formats.plan import read_plan
from autoplace.pipeline import plan, save
from autoplace.trace.load import load_model_file
from autoplace.train import LossModel, training_targets
from autoplace.train.dataparallel import BUCKET_BYTES, _buckets

EXAMPLES = Path(__file__).parent.parent / "examples"


def _plan(name: str) -> tuple[Any, LossModel, tuple, tuple]:
    """``examples/NAME.py`` planned for one Adam step as 2 data-parallel replicas on two CPU
    workers: the plan, the original loss model, the example batch and its targets."""
    loaded = load_model_file(EXAMPLES / f"{name}.py")
    targets = training_targets(loaded.targets)
    # Two replicas of one device each, checked by the plan (verify_replicas) as by the tests.
    planned = plan(
        loaded.model,
        loaded.args,
        Config(
            devices="2xcpu-thread",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
            training=Training(optimizer="adam", replicas=2),
        ),
        loss=loaded.loss,
        example_targets=targets,
    )
    assert planned.plan.training.replicas == 2
    return planned, LossModel(loaded.model, loaded.loss), loaded.args, targets


@pytest.fixture(scope="module")
def mlp() -> tuple[Any, LossModel, tuple, tuple]:
    return _plan("mlp")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory, mlp: tuple) -> Path:
    """The MLP's plan saved with 2 replicas: ``save`` writes ``train.py`` beside ``model/``."""
    planned = mlp[0]
    directory = tmp_path_factory.mktemp("mlp") / "out"
    save(planned, directory)
    return directory


def _copy(out: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(out, tmp_path / "out"))


# The sharding rule and the devices of each rank: no process started.


def test_every_tensor_with_the_batch_s_rows_is_split_and_the_rest_passed_whole() -> None:
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    mask, scale = torch.ones(784), torch.tensor(0.5)
    inputs = ((x,), {"mask": mask, "scale": scale, "targets": (y,)})
    assert batch_size(inputs, replicas=2) == 64
    shards = [shard(inputs, rank=r, replicas=2) for r in range(2)]
    torch.testing.assert_close(torch.cat([s[0][0] for s in shards]), x)
    torch.testing.assert_close(torch.cat([s[1]["targets"][0] for s in shards]), y)
    for args, kwargs in shards:
        assert args[0].shape == (32, 784) and kwargs["mask"] is mask and kwargs["scale"] is scale
    # The batch is the first tensor input's dimension 0: a tensor of another length is whole.
    table = torch.randn(5, 3)
    (_, whole), kwargs = shard(((torch.randn(6, 3), table), {}), rank=1, replicas=3)
    assert whole is table


def test_a_batch_that_does_not_divide_is_refused_with_its_numbers() -> None:
    inputs = ((torch.tensor(1.0), torch.randn(63, 8)), {})
    with pytest.raises(AutoplaceError, match=r"the batch of 63 \(dimension 0 of args\.1, the "
                       r"first tensor input\) does not divide into 2 data-parallel replicas"):
        shard(inputs, rank=0, replicas=2)
    with pytest.raises(AutoplaceError, match="no tensor with a batch dimension"):
        batch_size(((torch.tensor(1.0),), {}), replicas=2)


def test_each_rank_runs_on_the_next_gpus_and_absent_ones_on_the_cpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    planned = ["cuda:0", "cuda:1"]
    assert replica_device_map(planned, rank=0) == {"cuda:0": "cuda:0", "cuda:1": "cuda:1"}
    # Rank 1's replica is on cuda:2 and cuda:3; this machine has no cuda:3.
    assert replica_device_map(planned, rank=1) == {"cuda:0": "cuda:2", "cuda:1": "cpu"}
    assert replica_backend(planned, replicas=2) == "gloo"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert replica_backend(planned, replicas=2) == "nccl"
    assert replica_backend(["cuda:0", "cpu:0"], replicas=2) == "gloo"
    assert replica_device_map(["cpu:0", "cpu:1"], rank=1) == {"cpu:0": "cpu:0", "cpu:1": "cpu:1"}


def test_micro_batched_gradients_go_in_ddp_sized_buckets_per_device_and_dtype() -> None:
    # 3 float32 gradients of 10 MiB on one device, a small one on another, one float64
    big = [torch.empty(10 * 2**20 // 4) for _ in range(3)]
    other = torch.zeros(4, device="meta")
    double = torch.zeros(4, dtype=torch.float64)
    buckets = _buckets([*big[:2], other, double, big[2]])
    # last first, as the backward makes them; a third 10 MiB would pass 25 MiB
    assert [[id(g) for g in b] for b in buckets] == [
        [id(big[2]), id(big[1])], [id(big[0])], [id(double)], [id(other)]]
    # a tensor larger than a bucket is a bucket of its own
    large = torch.empty(BUCKET_BYTES // 4 + 1)
    assert [len(b) for b in _buckets([torch.zeros(4), large])] == [1, 1]


def test_cpu_workers_run_on_one_intra_op_thread_and_other_devices_as_torch_has_them() -> None:
    before = torch.get_num_threads()
    with worker_threads(["cpu:0", "cpu:1"]) as threads:
        assert threads == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    for devices in (["cpu"], ["cpu:0", "cuda:0"], []):
        with worker_threads(devices) as threads:
            assert threads == before


# The replicas trained, against the original on the whole batch.


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_replicas_train_as_the_original_does_on_the_whole_batch(name: str, mlp: tuple) -> None:
    """2 replicas, each on its half of the batch, train as the original does on the whole:
    the plan's own check (``verify_replicas``), and for the MLP ``verify_replicas`` called
    again here, which leaves the model's example and the original's gradients as they were."""
    planned, original, args, targets = mlp if name == "mlp" else _plan(name)
    check = planned.plan.training.check
    assert (check.status, check.replicas, check.steps) == ("passed", 2, 3)
    torch.testing.assert_close(torch.tensor(check.losses), torch.tensor(check.original_losses))
    assert check.losses[-1] < check.losses[0]
    if name != "mlp":
        return
    before = planned.model.example_inputs
    record = verify_replicas(planned.model, original, args, {}, targets, optimizer="adam",
                             replicas=2)
    assert record["status"] == "passed" and record["replicas"] == 2 and record["steps"] == 3
    # The original's losses here are the plan's check's: the same whole-batch training.
    assert record["original_losses"] == pytest.approx(
        planned.plan.training.check.original_losses, rel=1e-6)
    torch.testing.assert_close(torch.tensor(record["losses"]),
                               torch.tensor(record["original_losses"]))
    assert record["losses"][-1] < record["losses"][0]
    assert planned.model.example_inputs is before  # saved with the batch, then put back
    assert not any(p.grad is not None for p in original.parameters())


def test_run_train_runs_the_replicas_and_gives_the_whole_batch_s_losses(out, mlp,
                                                                         capsys) -> None:
    assert (out / "train.py").is_file()
    assert main(["run", str(out), "--train", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    torch.testing.assert_close(torch.tensor(result["losses"]),
                               torch.tensor(mlp[0].plan.training.check.original_losses))
    assert len(result["times_s"]) == 3 and result["measured_s"] > 0
    assert result["predicted_s"] == mlp[0].plan.makespan_s and result["optimizer"] == "adam"
    assert any("2 processes ran (torchrun, gloo)" in note for note in result["notes"])


def test_each_replica_of_a_cpu_worker_trains_on_one_thread_whatever_the_environment(
        out, tmp_path, monkeypatch) -> None:
    # torchrun sets OMP_NUM_THREADS=1 only where it is not set: the plan's one thread a
    # worker is train.py's own.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    report = tmp_path / "report.json"
    launch_replicas(out / "train.py", replicas=2, timeout_s=120,
                    argv=["--steps", "2", "--json", str(report)])
    assert json.loads(report.read_text())["threads"] == 1


# A script whose ranks all take rank 0's half: the replicas train on half the batch twice.
_SAME_HALF = '''
import sys
from pathlib import Path

import autoplace.emit.distributed.ddp as ddp

right = ddp.shard
ddp.shard = lambda inputs, *, rank, replicas: right(inputs, rank=0, replicas=replicas)
sys.exit(ddp.replica_main(Path(__file__).resolve().parent / "model", sys.argv[1:],
                          optimizer="adam", replicas=2))
'''


@pytest.mark.parametrize("wrong", [False, True], ids=["its-train.py", "same-half"])
def test_the_check_of_a_saved_plan_fails_when_the_ranks_share_one_half(out, mlp, tmp_path,
                                                                       wrong: bool) -> None:
    directory = _copy(out, tmp_path)
    if wrong:
        (directory / "train.py").write_text(_SAME_HALF)
    _, original, args, targets = mlp
    if not wrong:
        assert verify_replicas(directory, original, args, {}, targets, optimizer="adam",
                               replicas=2)["status"] == "passed"
        return
    with pytest.raises(VerificationError, match=r"the loss at step 1 \(the mean of the 2 "
                       r"replicas' against the whole batch's\) differs"):
        verify_replicas(directory, original, args, {}, targets, optimizer="adam", replicas=2)


def test_a_batch_that_does_not_divide_into_the_replicas_is_a_clear_error(out, mlp, tmp_path,
                                                                        capsys,
                                                                        monkeypatch) -> None:
    directory = _copy(out, tmp_path)
    data = json.loads((directory / "plan.json").read_text())
    data["training"]["replicas"] = 3  # the batch is 64
    (directory / "plan.json").write_text(json.dumps(data))
    script = write_train_script(directory, optimizer="adam", replicas=3)
    message = r"the batch of 64 \(dimension 0 of args\.0, the first tensor input\) does not " \
              r"divide into 3 data-parallel replicas"
    # Through the CLI: exit code 2 before any process starts.
    assert main(["run", str(directory), "--train", "3"]) == 2
    assert "does not divide into 3 data-parallel replicas" in capsys.readouterr().err
    _, original, args, targets = mlp
    with pytest.raises(AutoplaceError, match=message):
        verify_replicas(directory, original, args, {}, targets, optimizer="adam", replicas=3)
    # train.py run by hand: each rank says so, and the launcher raises the ranks' own error.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert replica_main(directory / "model", ["--steps", "1"], optimizer="adam",
                        replicas=3) == 2
    assert "autoplace: error: AutoplaceError: the batch of 64" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert replica_main(directory / "model", ["--steps", "1"], optimizer="adam",
                        replicas=3) == 2
    assert "run `torchrun --nproc-per-node 3 train.py`, not 2 process(es)" in \
        capsys.readouterr().err
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(AutoplaceError, match=message):
        launch_replicas(script, replicas=3, argv=["--steps", "1"], timeout_s=120)


# No process outlives a run that fails or runs too long.

_HANGS = "import time\ntime.sleep(600)\n"
_RANK_1_FAILS = ("import os, sys, time\n"
                 "if os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(600)\n")


def _running(marker: str) -> set[int]:
    """The processes whose command line holds ``marker`` (a script's unique path: torchrun's
    workers) and their parents (torchrun, forked from the test's process, holds it not)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in text:
                stat = (cmdline.parent / "stat").read_text()
                found |= {int(cmdline.parent.name), int(stat.rpartition(")")[2].split()[1])}
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("script, error, match, alive", [
    (_HANGS, AutoplaceError, r"ran past 8 s: stopped them", 3),
    (_RANK_1_FAILS, EmitError, r"failed \(torchrun exited with 1\)", 2),
], ids=["timeout", "a-rank-fails"])
def test_no_process_is_left_behind(tmp_path, script: str, error: type, match: str,
                                   alive: int) -> None:
    path = tmp_path / "train.py"
    path.write_text(script)
    seen: list[int] = []
    everyone: set[int] = set()
    done = threading.Event()

    def watch() -> None:  # how many processes (torchrun and its workers) ran at once
        while not done.is_set():
            running = _running(str(path))
            seen.append(len(running))
            everyone.update(running)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(error, match=match):
            launch_replicas(path, replicas=2, argv=[], timeout_s=8)
    finally:
        done.set()
        watcher.join()
    assert max(seen) >= alive  # torchrun and its workers did run (rank 1 may end at once)
    deadline = time.monotonic() + 1  # a process just killed may not have ended yet
    while [pid for pid in everyone if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in everyone if _alive(pid)] == []


# Replicas of a micro-batched step: no DDP; each runs its micro-batches in the plan's order and
# then averages the gradients (train.dataparallel.average_gradients, called through
# emit.distributed.ddp). Each plan's own check starts a torchrun.


def _micro_plan(schedule: str) -> Any:
    """The MLP planned as 2 replicas on two CPU workers, each on 32 rows in 2 micro-batches
    of 16 run in ``schedule``'s order; the plan's check has trained them (verify_replicas)."""
    loaded = load_model_file(EXAMPLES / "mlp.py")
    return plan(
        loaded.model,
        loaded.args,
        Config(
            devices="2xcpu-thread",
            mode="training",
            solve=Solve(time_limit_s=1, whatif=False, min_gain=0.0),
            cost=Cost(profile=False),
            training=Training(optimizer="adam", replicas=2, microbatches=2, schedule=schedule),
        ),
        loss=loaded.loss,
        example_targets=training_targets(loaded.targets),
    )


@pytest.fixture(scope="module")
def micro_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gpipe plan of ``_micro_plan``, saved."""
    directory = tmp_path_factory.mktemp("micro") / "out"
    save(_micro_plan("gpipe"), directory)
    return directory


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_micro_batched_replicas_pass_the_plan_s_check(schedule: str, micro_out: Path,
                                                      mlp: tuple) -> None:
    if schedule == "gpipe":  # the saved plan's record
        training = read_plan(micro_out).training
        script = (micro_out / "train.py").read_text()
        assert "MICROBATCHES = {'count': 2," in script and "'loss': 'mean'" in script
    else:
        training = _micro_plan(schedule).plan.training
    assert (training.replicas, training.microbatches, training.schedule,
            training.microbatch_loss) == (2, 2, schedule, "mean")
    check = training.check
    assert check.status == "passed" and check.replicas == 2 and check.steps == 3
    # the whole batch's losses: those of the one-process DDP plan's check (M=1)
    torch.testing.assert_close(torch.tensor(check.losses),
                               torch.tensor(mlp[0].plan.training.check.original_losses))


def test_run_train_runs_the_micro_batched_replicas(micro_out: Path, mlp: tuple,
                                                   capsys) -> None:
    assert main(["run", str(micro_out), "--train", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    torch.testing.assert_close(torch.tensor(result["losses"]),
                               torch.tensor(mlp[0].plan.training.check.original_losses[:2]))
    assert len(result["times_s"]) == 2 and result["measured_s"] > 0 and result["predicted_s"] > 0
    assert any("in 2 micro-batches (the plan's gpipe order)" in n for n in result["notes"])


# train.py with each replica's gradients summed over the replicas, not averaged.
_SUMMED = '''
import autoplace.emit.distributed.ddp as ddp

average = ddp.average_gradients


def summed(params):
    average(params)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(2)  # R = 2: the sum


ddp.average_gradients = summed
'''


def test_the_check_fails_when_the_replicas_gradients_are_summed(micro_out: Path, mlp: tuple,
                                                                tmp_path: Path) -> None:
    directory = _copy(micro_out, tmp_path)
    script = directory / "train.py"
    line = "from autoplace.emit.distributed.ddp import replica_exit, replica_main\n"
    assert line in script.read_text()
    script.write_text(script.read_text().replace(line, line + _SUMMED))
    _, original, args, targets = mlp
    with pytest.raises(VerificationError, match=r"the gradient of \S+ averaged over the "
                       r"replicas at step 1 differs"):
        verify_replicas(directory, original, args, {}, targets, optimizer="adam", replicas=2)


def test_replicas_whose_shards_do_not_divide_into_the_micro_batches_are_refused(
        tmp_path: Path, capsys) -> None:
    # the batch of 64 in 2 shards of 32, which do not divide into 3 micro-batches
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--mode", "training", "--devices",
                 "2xcpu-thread", "--replicas", "2", "--microbatches", "3", "--no-profile",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--replicas 2 --microbatches 3: each replica's shard: the batch of 32 " in err
    assert "does not divide into 3 micro-batches" in err
    assert not (tmp_path / "out").exists()
