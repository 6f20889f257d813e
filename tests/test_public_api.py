"""The public surface is explicit: adding or removing a name is a deliberate change."""

import autoplace
import autoplace.errors


def test_exported_members():
    assert set(autoplace.__all__) == {
        "SharedLink",
        "AutoplaceError", "Cluster", "Costs", "Device", "DeviceSpecError", "Edge", "EmitError",
        "GraphError", "InfeasibleError", "Link", "ModelLoadError", "OpGraph", "OpNode",
        "OutputError", "PinError", "Placement", "Plan", "Problem", "Schedule", "TraceError",
        "VerificationError", "__version__", "plan", "save", "simulate", "validate",
        "solve_graph", "Planned", "ConfigError",
        # the configuration: its sections and the choices of its fixed-valued options
        "Config", "Devices", "Solve", "Cost", "Training", "Emit", "Parallel",
        "Mode", "Objective", "Granularity", "PipelineSchedule", "Recompute", "DType", "Fsdp",
    }
    for name in autoplace.__all__:
        assert hasattr(autoplace, name), name


def test_plan_takes_the_model_its_inputs_and_one_configuration():
    import inspect

    parameters = inspect.signature(autoplace.plan).parameters
    assert list(parameters) == ["model", "example_inputs", "config", "loss", "example_targets"]


def test_errors_form_one_hierarchy():
    for name in autoplace.__all__:
        obj = getattr(autoplace, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, autoplace.AutoplaceError)


def test_every_error_is_exported():
    # A new error class in autoplace.errors is part of the API: catching it must not need the
    # submodule.
    assert set(autoplace.errors.__all__) <= set(autoplace.__all__)
    for name in autoplace.errors.__all__:
        assert getattr(autoplace, name) is getattr(autoplace.errors, name)


def test_a_rank_loads_the_modules_it_runs_and_not_the_planner():
    """``import autoplace`` loads its names on first use: a torchrun rank of an emitted model,
    or a process timing the gradients' averaging, imports one module and starts in the time
    torch takes, not the solver's, the report's and the pipeline's too."""
    import subprocess
    import sys

    planner = ("autoplace.pipeline", "autoplace.solve", "autoplace.report", "ortools")
    ranks = ("autoplace.emit.distributed.tensor_train", "autoplace.emit.distributed.ddp",
             "autoplace.emit.distributed.ranks", "autoplace.profile.allreduce")
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {', '.join(ranks)}; print(*sorted(m for m in "
         f"{planner!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"{', '.join(ranks)} load {loaded}"
    assert autoplace.plan is autoplace.pipeline.plan and callable(autoplace.simulate)
    assert "Planned" in dir(autoplace)
