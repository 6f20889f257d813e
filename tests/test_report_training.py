"""The memory of a training step split into its parts (``train.breakdown``).

The plans come from ``zoo.mlp_training_plan``: Adam on two A100s with 5.5 MB each beside the
runtime's reserve, so the step is split, and SGD unconstrained.
"""

from __future__ import annotations

import pytest
import zoo

from autoplace.formats.plan import Plan, read_plan
from autoplace.pipeline import save
from autoplace.train.breakdown import BREAKDOWN_PARTS, memory_breakdown, phase_of

PARAMS = 940_584  # zoo.MLP's parameters, all trained


@pytest.fixture(scope="module")
def adam() -> Plan:
    return zoo.mlp_training_plan("adam", device_bytes=5_500_000)


@pytest.fixture(scope="module")
def sgd() -> Plan:
    return zoo.mlp_training_plan("sgd")


@pytest.mark.parametrize("name, parsed", [
    ("f", ("f", "forward", 0)),
    ("f@backward", ("f", "backward", 0)),
    ("f@step", ("f", "step", None)),
    ("f#3", ("f", "forward", 3)),
    ("f@backward#3", ("f", "backward", 3)),
    ("f#12@backward#3", ("f#12", "backward", 3)),
    # A graph file may name a node anything: '#' and '@' inside a name are the name's own.
    ("blocks.0#attn@proj", ("blocks.0#attn@proj", "forward", 0)),
    ("x@backwards", ("x@backwards", "forward", 0)),
    ("x#", ("x#", "forward", 0)),
    ("x#1a", ("x#1a", "forward", 0)),
    ("@step", ("@step", "forward", 0)),
])
def test_phase_of_reads_the_suffixes_from_the_right(name: str, parsed: tuple) -> None:
    assert phase_of(name) == parsed


def test_traced_node_names_hold_no_suffix_character(adam: Plan) -> None:
    # torch.export and torch.fx name nodes as Python identifiers, so a traced step graph's
    # names parse without ambiguity.
    forward = [phase_of(n.name)[0] for n in adam.problem.graph.nodes]
    assert all(name.isidentifier() for name in forward), forward


def test_the_parts_add_up_to_the_peak_on_each_device(adam: Plan, tmp_path) -> None:
    schedule = adam.schedule
    assert len(set(schedule.placement.device_of.values())) == 2  # the step is split
    parts = memory_breakdown(adam.problem, schedule)
    for device in adam.problem.cluster.devices:
        row = parts[device.name]
        assert list(row) == list(BREAKDOWN_PARTS)
        assert sum(row.values()) == schedule.peak_bytes[device.name]
        assert row["reserved_bytes"] == device.reserved_bytes > 0
        assert min(row.values()) >= 0 and row["activation_bytes"] > 0
    assert sum(row["parameter_bytes"] for row in parts.values()) == PARAMS
    # plan.json keeps what the split needs (each node's trainable bytes): a report rendered
    # from the file says the same.
    save(adam, tmp_path)
    again = read_plan(tmp_path)
    assert memory_breakdown(again.problem, again.schedule) == parts


def test_optimizer_state_is_none_under_sgd_and_twice_the_gradients_under_adam(
        adam: Plan, sgd: Plan) -> None:
    for plan, state in ((sgd, 0), (adam, 2)):
        parts = memory_breakdown(plan.problem, plan.schedule).values()
        assert sum(row["gradient_bytes"] for row in parts) == PARAMS
        for row in parts:
            assert row["optimizer_state_bytes"] == state * row["gradient_bytes"]
            assert row["gradient_bytes"] == row["parameter_bytes"]  # no buffer, none frozen
