"""The plan's configuration: what ``autoplace.plan`` is told besides the model and its inputs.

``sections`` holds ``Config`` and its frozen sections (``Devices``, ``Solve``, ``Cost``,
``Training``, ``Emit``), each checked where it is built; ``choices`` the ``StrEnum``s of the
options with fixed values; ``defaults`` the default values the stages share. Reference:
``docs/api.md``.
"""

from autoplace.config.choices import (
    DType,
    Fsdp,
    Granularity,
    Layers,
    Mode,
    Objective,
    PipelineSchedule,
    Recompute,
)
from autoplace.config.sections import Config, Cost, Devices, Emit, Parallel, Solve, Training

__all__ = ["Config", "Cost", "DType", "Devices", "Emit", "Fsdp", "Granularity", "Layers", "Mode",
           "Objective", "Parallel", "PipelineSchedule", "Recompute", "Solve", "Training"]
