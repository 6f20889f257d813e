"""The recipes written by hand (DDP, FSDP, Megatron-style, FSDP + TP), scored by the plan's
simulator and kept among a training plan's baselines (``solve.baselines.recipes``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


def _cluster(tmp_path, hosts: int, per_host: int, memory: str = "A100-80GB"):
    from autoplace.config import Devices

    (tmp_path / "cluster.toml").write_text("".join(
        f'[[hosts]]\nname = "node{i}"\ndevices = ["{per_host}x{memory}"]\n'
        + ("nic_bandwidth_bytes_per_s = 25e9\n" if hosts > 1 else "") for i in range(hosts)))
    return Devices(file=tmp_path / "cluster.toml")


def _planned(tmp_path, **parallel):
    from autoplace.config import Config, Cost, Emit, Parallel, Solve

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024),
                              nn.ReLU(), nn.Linear(1024, 8))
    from autoplace.pipeline import plan

    return plan(model, (torch.randn(64, 1024),), Config(
        devices=_cluster(tmp_path, 2, 2), mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(**parallel), emit=Emit(verify=False)),
        loss=F.cross_entropy, example_targets=(torch.randint(0, 8, (64,)),)).plan


def test_a_two_host_training_plan_scores_each_recipe_and_loses_to_none(tmp_path) -> None:
    from autoplace.formats.plan import Plan
    from autoplace.solve.baselines.recipes import RECIPE

    made = _planned(tmp_path, tp="auto", dp="auto")
    recipes = {k[len(RECIPE):]: v for k, v in made.baselines.items() if k.startswith(RECIPE)}
    assert set(recipes) == {"DDP (4 replicas)", "FSDP (4 replicas)",
                            "Megatron-style (dp 2 x tp 2, DDP)", "FSDP + TP (dp 2 x tp 2)",
                            "FSDP + TP + PP"}
    assert "not built yet" in recipes["FSDP + TP + PP"].not_run
    tp = made.tensor_parallel
    assert tp.meshes.keys() == {"1x2", "2x2"}  # tp stays in a host: no tp 4 over the NIC
    # the mesh recipes are the 2 x 2 mesh's two shardings, priced once by the same simulator:
    # the faster that fits is the mesh's own prediction
    megatron, titan = (recipes["Megatron-style (dp 2 x tp 2, DDP)"],
                       recipes["FSDP + TP (dp 2 x tp 2)"])
    assert megatron.feasible and titan.feasible
    assert tp.meshes["2x2"] == min(megatron.makespan_s, titan.makespan_s)
    # the DDP replicas are the plan's own R=4: bounded no faster than the mesh, not solved
    four = next(o for o in made.training.replica_options
                if o.replicas == 4 and o.sharding == "ddp")
    assert four.bound_s >= tp.makespan_s and four.step_s is None
    assert f"at least {four.bound_s * 1e3:.3f} ms" in recipes["DDP (4 replicas)"].not_run
    # what the user runs (the plan, or the candidate where it fits and is faster) loses to none
    ran = min([made.makespan_s] + ([tp.makespan_s] if tp.fits else []))
    for name, result in recipes.items():
        if result.feasible and result.makespan_s is not None:
            assert ran <= result.makespan_s * (1 + 1e-9), name
    assert any(n.startswith("recipes written by hand") for n in made.notes)
    assert Plan.from_dict(made.to_dict()).baselines == made.baselines


def test_a_recipe_that_was_not_weighed_says_which_flags_weigh_it(tmp_path) -> None:
    from autoplace.solve.baselines.recipes import RECIPE

    made = _planned(tmp_path, tp=2)  # dp 1: the 2 x 2 mesh is not weighed
    megatron = made.baselines[f"{RECIPE}Megatron-style (dp 2 x tp 2, DDP)"]
    assert megatron.makespan_s is None and megatron.fits_text == "not run"
    assert "--tp 2 --dp 2 (or --tp auto --dp auto) weighs it" in megatron.not_run


def test_one_host_has_no_mesh_over_hosts_to_weigh(tmp_path) -> None:
    from autoplace.formats.plan import BaselineResult
    from autoplace.solve.baselines.recipes import RECIPE, recipe_baselines

    cluster = _cluster(tmp_path, 1, 4).resolve()[0]
    got = recipe_baselines([], (), cluster)
    assert set(got) == {f"{RECIPE}DDP (4 replicas)", f"{RECIPE}FSDP (4 replicas)",
                        f"{RECIPE}Megatron-style (tp 4)"}
    assert all(isinstance(r, BaselineResult) and r.not_run for r in got.values())


@pytest.mark.parametrize("bound", [None, 2.5])
def test_a_replica_count_bounded_below_the_mesh_is_not_run_with_its_bound(bound) -> None:
    from autoplace.formats.records import ReplicaOption
    from autoplace.solve.baselines.recipes import _replicas

    option = ReplicaOption(replicas=4, devices_per_replica=1, fits=bound is None,
                           step_s=None if bound else 1.5, bound_s=bound)
    got = _replicas((option,), 4, "ddp")
    if bound:
        assert got.makespan_s is None and "at least 2500.000 ms" in got.not_run
    else:
        assert got.makespan_s == 1.5 and got.feasible
    assert "where its whole ones do not fit" in _replicas((option,), 4, "fsdp").not_run


def test_a_mesh_faster_than_the_placement_solved_is_the_plan_and_nothing_else_is_saved(
        tmp_path, monkeypatch) -> None:
    # The placement is solved (its bound is below the mesh's step) and turns out slower: the
    # plan is the mesh; the placement's emitted model is not saved as the plan's.
    from dataclasses import replace

    import autoplace.pipeline as pipeline
    import autoplace.pipeline.tensor as tensor
    from autoplace.config import Config, Cost, Emit, Parallel, Solve, Training
    from autoplace.formats.plan import PLACEMENT_SLOWER
    from autoplace.pipeline import plan, save

    real = tensor.keep_fastest

    def quicker(planned, *args, **kwargs):  # the mesh predicted at a tenth of the placement
        made, one = real(planned, *args, **kwargs)
        record = replace(made.tensor_parallel, makespan_s=made.makespan_s / 10)
        return replace(made, tensor_parallel=record), one

    monkeypatch.setattr(pipeline, "fastest_fit_s", lambda found: 1.0)  # nothing outpaced
    monkeypatch.setattr(tensor, "keep_fastest", quicker)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    got = plan(model, (torch.randn(32, 64),), Config(
        devices="2xA100-80GB", mode="training", cost=Cost(profile=False),
        solve=Solve(time_limit_s=1), parallel=Parallel(tp=2), training=Training(replicas=1),
        emit=Emit(verify=False)), loss=F.cross_entropy,
        example_targets=(torch.randint(0, 8, (32,)),))
    made = got.plan
    assert made.is_mesh and made.solver.status == PLACEMENT_SLOWER
    assert made.baselines["placement (1 replica)"].feasible
    assert made.solver.wall_s > 0  # the placement's solve, which found it slower
    assert got.model is None and got.tensor_model is not None
    save(got, tmp_path / "out")
    assert not (tmp_path / "out" / "model").exists()
    assert (tmp_path / "out" / "tensor_parallel" / "train.py").exists()
    assert "The placement solved is slower: run tp 2" in (
        tmp_path / "out" / "summary.txt").read_text()
