"""The typed parts of a plan (``autoplace.formats.records``, ``Verification``): each reads its
``plan.json`` entry and writes it back unchanged, keys and their order included, whether the
pipeline wrote it whole or an older plan (or a hand) left optional keys out."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from test_report import make_plan

from autoplace.emit.check.outputs import verify
from autoplace.formats.plan import Plan, Verification
from autoplace.formats.plan_check import validate_plan_dict
from autoplace.formats.records import (
    Coarsening,
    DeviceMapRecord,
    MinGain,
    PinsRecord,
    ProfileRecord,
    ReplicaOption,
    TrainingCheck,
    TrainingRecord,
    WhatIfRecord,
)

# Each part as the pipeline writes it (from plans it made), on make_plan's devices.
TRAINING = {
    "optimizer": "adam", "dtype": "float32", "layers_mode": "eval", "microbatches": 2,
    "schedule": "gpipe", "replicas": 2, "recompute": [], "microbatch_loss": "mean",
    "replica_groups": [["cuda:0"], ["cuda:1"]],
    "replica_torch_devices": [["cuda:0"], ["cuda:1"]],
    "replica_options": [{"replicas": 1, "devices_per_replica": 2, "step_s": 2.1e-3, "fits": True},
                        {"replicas": 2, "devices_per_replica": 1, "fits": False}],
    "check": {"status": "passed", "optimizer": "adam", "steps": 3, "replicas": 2,
              "losses": [2.34], "original_losses": [2.35], "max_abs_diff_gradients": 1e-8,
              "max_abs_diff_parameters": 4e-8, "ill_conditioned_elements": 164,
              "memory_status": "within", "peak_bytes": {
                  "cuda:0": {"measured_bytes": 5367972, "predicted_bytes": 5470624}},
              "peak_method": "storage"}}
PARTS: dict[str, Any] = {
    "coarsening": {"traced_ops": 9, "plan_nodes": 4, "steps": ["fuse elementwise chains"]},
    "whatif": [
        {"devices": ["cuda:0"], "makespan_s": None, "status": "INFEASIBLE",
         "detail": "needs 41.2 GiB", "wall_s": 0.01},
        {"devices": ["cuda:0", "cuda:1"], "makespan_s": 4.0e-3, "objective_s": 4.0e-3,
         "status": "OPTIMAL", "detail": "the plan", "wall_s": 0.03}],
    "profile": {
        "devices": [{"device": "cuda:0", "device_key": "A100", "sum_of_ops_s": 1e-4,
                     "unmeasured": []}],
        "links": [{"src": "cuda:0", "dst": "cuda:1", "latency_s": 1e-5,
                   "bandwidth_bytes_per_s": 2e10}],
        "calibration": {"A100-40GB": {"samples": 5}}, "comparisons": [{"device": "cuda:0"}],
        "cache": {"path": "/tmp/c.sqlite", "ops": 5}, "wall_s": 1.7},
    "min_gain": {"threshold": 0.05, "single_device_chosen": False, "reason": None,
                 "split_devices": 2, "split_gain": None},
    "training": TRAINING,
    "pins": {"modules": {"a": "cuda:1"}, "ops": 3, "unpinned_makespan_s": 5.8e-3,
             "unpinned_objective_s": 5.8e-3},
    "device_map": {"granularity": "module", "no_split": ["Block"],
                   "map": {"a": 1, "b": 0, "": "cpu"}, "input_device": "cuda:1",
                   "accelerate": {"accelerate-sequential": {"map": {"": 0}, "note": None}}},
}


def _written(data: dict[str, Any]) -> str:
    """``data`` read as a plan and written again, as ``plan.json``'s text."""
    return json.dumps(Plan.from_dict(data).to_dict(), indent=1)


def _plan_with(parts: dict[str, Any]) -> dict[str, Any]:
    data = Plan.from_dict(make_plan()).to_dict() | copy.deepcopy(parts)
    if "pins" in parts:  # derived, and written last in the pins entry
        data["pins"]["cost_s"] = Plan.from_dict(data).pins_cost_s
    return data


def test_every_part_reads_back_to_the_same_json_and_the_schema_holds() -> None:
    data = _plan_with(PARTS)
    validate_plan_dict(data)
    assert _written(data) == json.dumps(data, indent=1)
    plan = Plan.from_dict(data)
    assert plan.coarsening == Coarsening(traced_ops=9, plan_nodes=4,
                                         steps=("fuse elementwise chains",))
    assert plan.whatif is not None and plan.whatif[1].value_s("throughput") == 4.0e-3
    assert plan.whatif[0] == WhatIfRecord(devices=("cuda:0",), makespan_s=None,
                                          status="INFEASIBLE", detail="needs 41.2 GiB",
                                          wall_s=0.01)
    assert isinstance(plan.profile, ProfileRecord) and plan.profile.device_names == ("cuda:0",)
    assert plan.min_gain == MinGain(threshold=0.05, single_device_chosen=False,
                                    split_devices=2)
    training = plan.training
    assert isinstance(training, TrainingRecord) and training.replicas == 2
    assert training.replica_options == (
        ReplicaOption(replicas=1, devices_per_replica=2, fits=True, step_s=2.1e-3),
        ReplicaOption(replicas=2, devices_per_replica=1, fits=False))
    assert training.check.losses == (2.34,) and training.check.peak_method == "storage"
    assert plan.pins == PinsRecord(modules={"a": "cuda:1"}, ops=3, unpinned_makespan_s=5.8e-3,
                                   unpinned_objective_s=5.8e-3)
    assert isinstance(plan.device_map, DeviceMapRecord)
    assert plan.device_map.map == {"a": 1, "b": 0, "": "cpu"}
    assert plan.device_map.accelerate["accelerate-sequential"].note is None


@pytest.mark.parametrize("part, older", [
    # plans from before the split's figures, micro-batches, replicas or precision
    ("min_gain", {"threshold": 0.05, "single_device_chosen": True, "reason": "gains 1%"}),
    ("training", {"optimizer": "sgd", "check": {"status": "skipped"}}),
    ("training", {"optimizer": "adam", "microbatches": 2, "schedule": "gpipe",
                  "check": {"status": "passed", "steps": 3, "memory_status": "not measured"}}),
    ("whatif", [{"devices": ["cuda:0"], "makespan_s": 5.8e-3, "status": "OPTIMAL",
                 "detail": ""}]),
    ("profile", {}),
    ("profile", {"devices": [{"device": "cuda:0", "sum_of_ops_s": 1e-4}]}),
    ("device_map", {"granularity": "module", "no_split": [], "map": {"": 0},
                    "accelerate": {}}),
])
def test_a_part_without_its_optional_keys_is_written_as_it_was_read(part: str,
                                                                    older: Any) -> None:
    data = _plan_with({part: older})
    validate_plan_dict(data)
    assert _written(data) == json.dumps(data, indent=1)


def test_an_older_training_record_means_the_documented_defaults() -> None:
    record = TrainingRecord.from_dict({"optimizer": "adam", "check": {"status": "skipped"}})
    assert (record.microbatches, record.replicas, record.dtype, record.recompute) == (
        None, None, None, None)
    assert record.check == TrainingCheck(status="skipped")
    plan = Plan.from_dict(_plan_with({"training": record.to_dict()}))
    from autoplace.report.analysis import training_facts

    facts = training_facts(plan)
    assert facts is not None
    assert (facts.microbatches, facts.schedule, facts.replicas, facts.dtype) == (
        1, "gpipe", 1, "float32")


def test_a_plan_without_coarsening_writes_an_empty_entry() -> None:
    data = make_plan()
    del data["coarsening"]
    plan = Plan.from_dict(data)
    assert plan.coarsening is None and plan.to_dict()["coarsening"] == {}


def test_verify_returns_the_plan_s_verification_record() -> None:
    model = torch.nn.Linear(4, 2)
    found = verify(model, model, (torch.ones(3, 4),), {})
    assert isinstance(found, Verification)
    assert (found.status, found.max_abs_diff, found.memory_status) == (
        "passed", 0.0, "not measured")
    assert found.detail.startswith("1 tensor output(s) match")
