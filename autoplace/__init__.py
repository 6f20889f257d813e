"""autoplace: automatic device placement for PyTorch models.

The pipeline, one module or package per stage: ``trace`` -> ``profile`` (``profile.cost``) ->
``fold`` -> ``solve`` (scored by ``simulate``) -> ``emit`` -> ``report``; ``ir`` holds the data
every stage shares, ``pipeline.plan`` wires them together and ``cli`` is the command line.
"""

from __future__ import annotations

from autoplace._version import __version__
from autoplace.errors import (
    AutoplaceError,
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
from autoplace.pipeline import plan, save
from autoplace.pipeline.modules import plan_modules
from autoplace.simulate import simulate, validate

__all__ = [
    "AutoplaceError",
    "Cluster",
    "Costs",
    "Device",
    "DeviceSpecError",
    "Edge",
    "EmitError",
    "GraphError",
    "InfeasibleError",
    "Link",
    "ModelLoadError",
    "OpGraph",
    "OpNode",
    "OutputError",
    "PinError",
    "Placement",
    "Plan",
    "Problem",
    "Schedule",
    "SharedLink",
    "TraceError",
    "VerificationError",
    "__version__",
    "plan",
    "plan_modules",
    "save",
    "simulate",
    "validate",
]
