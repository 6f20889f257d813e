"""The typed configuration: each section checked where it is built, errors naming the field in
Python and the flag on the command line, defaults resolved once, and every flag of
``autoplace plan`` mapped to a field."""

from __future__ import annotations

import dataclasses

import pytest

from autoplace.cli import _parser
from autoplace.cli.flags import FLAGS, config_of
from autoplace.config import (
    Config,
    Devices,
    DType,
    Granularity,
    Mode,
    Objective,
    PipelineSchedule,
    Solve,
    Training,
)
from autoplace.errors import ConfigError
from autoplace.ir import Cluster


def test_strings_become_choices_and_compare_as_before() -> None:
    config = Config(mode="training", dtype="bf16", solve=Solve(objective="throughput"),
                    training=Training(microbatches=2, schedule="1f1b"))
    assert config.mode is Mode.TRAINING and config.mode == "training"
    assert config.dtype is DType.BFLOAT16
    assert config.solve.objective is Objective.THROUGHPUT
    assert config.training.schedule is PipelineSchedule.ONE_F_ONE_B
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mode = Mode.INFERENCE  # type: ignore[misc]


def test_devices_take_a_spec_or_a_cluster_and_only_one_source() -> None:
    assert Config(devices="2xA100-40GB").devices == Devices(spec="2xA100-40GB")
    cluster, _ = Devices(spec="2xcpu-thread").resolve()
    assert isinstance(cluster, Cluster)
    assert Config(devices=cluster).devices.cluster is cluster
    with pytest.raises(ConfigError, match="devices.spec and devices.file both name the "
                       "devices"):
        Devices(spec="cpu", file="cluster.toml")


def test_defaults_depend_on_the_granularity() -> None:
    op, module = Config(), Config(granularity="module")
    assert (op.solving.time_limit_s, op.solving.max_nodes) == (10.0, 120)
    assert (module.solving.time_limit_s, module.solving.max_nodes) == (1.0, None)
    given = Config(solve=Solve(time_limit_s=3, max_nodes=40))
    assert (given.solving.time_limit_s, given.solving.max_nodes) == (3, 40)
    # read, not stored: a copy at another granularity gets that one's defaults
    assert dataclasses.replace(module, granularity="op").solving.time_limit_s == 10.0
    assert dataclasses.replace(op, granularity="module").solving.max_nodes is None
    assert module.granularity is Granularity.MODULE


@pytest.mark.parametrize(("build", "api", "cli"), [
    (lambda: Solve(min_gain=1.5), "solve.min_gain must be a fraction", "--min-gain must be"),
    (lambda: Solve(time_limit_s=0), "solve.time_limit_s must be a positive",
     "--time-limit must be a positive"),
    (lambda: Solve(solver="magic"), "solve.solver must be one of cpsat", "--solver must be"),
    (lambda: Config(mode="train"), "mode must be one of inference, training, got 'train'",
     "--mode must be one of"),
    (lambda: Config(training=Training(microbatches=2)),
     "training.microbatches is for training plans: set mode='training'",
     "--microbatches is for training plans: set --mode training"),
    (lambda: Config(mode="training", pins={"0": "cuda:0"}), "pins apply to inference plans",
     "--pin/--pin-map apply to inference plans"),
    (lambda: Config(granularity="module", mode="training"),
     "granularity='module' plans inference", "--granularity module plans inference"),
    (lambda: Config(no_split=["Block"]), "no_split goes with granularity='module'",
     "--no-split goes with --granularity module"),
    (lambda: Training(optimizer="adagrad"), "training.optimizer must be one of",
     "--optimizer must be one of"),
    (lambda: Training(replicas=0), "training.replicas must be auto or a whole number",
     "--replicas must be auto"),
    (lambda: Config(granularity="module", no_split="Block"), "no_split is a list of module "
     "class names", "--no-split is a list"),
    (lambda: Config(granularity="module", dtype="bf16"), "dtype is not applied at "
     "granularity='module'", "--dtype is not applied at --granularity module"),
    (lambda: Config(emit=False), "emit must be the Emit(...) section, got False",
     "emit must be"),  # no flag sets a whole section
])
def test_an_error_names_the_field_in_python_and_the_flag_on_the_command_line(
        build, api: str, cli: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build()
    assert api in str(raised.value)
    assert raised.value.render(FLAGS).startswith(cli), raised.value.render(FLAGS)


def test_every_plan_flag_is_a_field_and_the_defaults_agree() -> None:
    args = _parser().parse_args(["plan", "model.py"])
    config = config_of(args)
    # the command line profiles by default; the rest are the configuration's own defaults
    assert config == dataclasses.replace(Config(), cost=dataclasses.replace(
        config.cost, profile=True, progress=True))
    default = Config()
    fields = {f.name for f in dataclasses.fields(Config)} | {
        f"{section.name}.{f.name}" for section in dataclasses.fields(Config)
        if dataclasses.is_dataclass(getattr(default, section.name))
        for f in dataclasses.fields(getattr(default, section.name))}
    flags = {a.option_strings[0] for a in _parser()._subparsers._group_actions[0]
             .choices["plan"]._actions if a.option_strings}
    for field, flag in FLAGS.items():
        assert field in fields, field
        assert all(part in flags for part in flag.split("/")), flag
