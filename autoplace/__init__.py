"""autoplace: automatic device placement for PyTorch models.

``plan(model, example_inputs, Config(...))`` returns ``Planned(plan, model)``; ``save`` writes
them. The pipeline, one module or package per stage: ``trace`` -> ``profile``
(``profile.cost``) -> ``fold`` -> ``solve`` (scored by ``simulate``) -> ``emit`` -> ``report``;
``ir`` holds the data every stage shares, ``config`` what a plan is told, ``pipeline`` wires
the stages together and ``cli`` is the command line.
"""

from __future__ import annotations

from autoplace._version import __version__
from autoplace.config import (
    Config,
    Cost,
    Devices,
    DType,
    Emit,
    Fsdp,
    Granularity,
    Mode,
    Objective,
    Parallel,
    PipelineSchedule,
    Recompute,
    Solve,
    Training,
)
from autoplace.errors import (
    AutoplaceError,
    ConfigError,
    DeviceSpecError,
    EmitError,
    GraphError,
    InfeasibleError,
    ModelLoadError,
    OutputError,
    PinError,
    TraceError,
    VerificationError,
)
from autoplace.formats.plan import Plan
from autoplace.ir import (
    Cluster,
    Costs,
    Device,
    Edge,
    Link,
    OpGraph,
    OpNode,
    Placement,
    Problem,
    Schedule,
    SharedLink,
)
from autoplace.pipeline import Planned, plan, save, solve_graph
from autoplace.simulate import simulate, validate

__all__ = [
    "AutoplaceError",
    "Cluster",
    "Config",
    "ConfigError",
    "Cost",
    "Costs",
    "DType",
    "Device",
    "DeviceSpecError",
    "Devices",
    "Edge",
    "Emit",
    "EmitError",
    "Fsdp",
    "Granularity",
    "GraphError",
    "InfeasibleError",
    "Link",
    "Mode",
    "ModelLoadError",
    "Objective",
    "OpGraph",
    "OpNode",
    "OutputError",
    "PinError",
    "Parallel",
    "PipelineSchedule",
    "Placement",
    "Plan",
    "Planned",
    "Problem",
    "Recompute",
    "Schedule",
    "SharedLink",
    "Solve",
    "TraceError",
    "Training",
    "VerificationError",
    "__version__",
    "plan",
    "save",
    "simulate",
    "solve_graph",
    "validate",
]
