"""autoplace: automatic device placement for PyTorch models.

``plan(model, example_inputs, Config(...))`` returns ``Planned(plan, model)``; ``save`` writes
them. The pipeline, one module or package per stage: ``trace`` -> ``profile``
(``profile.cost``) -> ``fold`` -> ``solve`` (scored by ``simulate``) -> ``emit`` -> ``report``;
``ir`` holds the data every stage shares, ``config`` what a plan is told, ``pipeline`` wires
the stages together and ``cli`` is the command line.

Names load on first use (``__getattr__``), so a process that imports one module of the package
(a torchrun rank of an emitted model) does not load the planner.
"""

from __future__ import annotations

import importlib
from typing import Any

from autoplace._version import __version__ as __version__

# the functions, not their package (which ``autoplace.simulate`` would name once loaded)
from autoplace.simulate import simulate as simulate
from autoplace.simulate import validate as validate

_HOMES = {
    "autoplace.config": ("Config", "Cost", "Devices", "DType", "Emit", "Fsdp", "Granularity",
                         "Mode", "Objective", "Parallel", "PipelineSchedule", "Recompute",
                         "Solve", "Training"),
    "autoplace.errors": ("AutoplaceError", "ConfigError", "DeviceSpecError", "EmitError",
                         "GraphError", "InfeasibleError", "ModelLoadError", "OutputError",
                         "PinError", "TraceError", "VerificationError"),
    "autoplace.formats.plan": ("Plan",),
    "autoplace.ir": ("Cluster", "Costs", "Device", "Edge", "Link", "OpGraph", "OpNode",
                     "Placement", "Problem", "Schedule", "SharedLink"),
    "autoplace.pipeline": ("Planned", "plan", "save", "solve_graph"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted([*_HOME, "__version__", "simulate", "validate"])


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'autoplace' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
