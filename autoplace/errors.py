"""The errors autoplace raises on bad input, in one small hierarchy (``docs/errors.md`` says what
to do about each). Every one is an ``AutoplaceError``: the CLI prints its message as one
paragraph and exits with code 2. A message says what was wrong, the numbers, and what to do.

    AutoplaceError
    ├── ConfigError         an option autoplace cannot use (named by its field, or its flag)
    ├── ModelLoadError      the model file is missing, malformed, or raised while running
    ├── TraceError          neither torch.export nor torch.fx could trace the model
    ├── DeviceSpecError     a bad device type, --devices spec or cluster file; nothing to profile
    ├── GraphError          a task graph that is not a DAG, or names unknown nodes
    ├── PinError            a pin names an unknown module or device, or contradicts another
    ├── InfeasibleError     the model does not fit the devices (says how many bytes are missing)
    ├── EmitError           the partitioned model could not be generated, saved or loaded
    ├── VerificationError   the emitted model's outputs differ from the original's
    └── OutputError         the output directory cannot be written
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AutoplaceError",
    "ConfigError",
    "DeviceSpecError",
    "EmitError",
    "GraphError",
    "InfeasibleError",
    "ModelLoadError",
    "OutputError",
    "PinError",
    "TraceError",
    "VerificationError",
]


class AutoplaceError(Exception):
    """Base class of every error autoplace raises on bad input."""


class ConfigError(AutoplaceError):
    """An option autoplace cannot use. ``template`` names options by their configuration field
    in braces, ``{solve.min_gain}``, or with a value, ``{mode=training}``; the message renders
    them for the Python API (``solve.min_gain``, ``mode='training'``) and, given the flags,
    for the command line (``--min-gain``, ``--mode training``): each says what the user wrote."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.render())

    def render(self, flags: Mapping[str, str] | None = None) -> str:
        """The message with each field named as the API spells it, or (``flags``: field ->
        flag) as the command line does; a field without a flag keeps its API name."""
        def name(match: re.Match[str]) -> str:
            field, value = match.group(1), match.group(2)
            flag = (flags or {}).get(field)
            if flag is None:
                if value is None or value.isupper() or value.replace(".", "").isdigit():
                    return field if value is None else f"{field}={value}"
                return f"{field}={value!r}"
            return flag if value is None else f"{flag} {value}".rstrip()
        return _FIELD.sub(name, self.template)


_FIELD = re.compile(r"\{([a-z_.]+)(?:=([^}]*))?\}")


class ModelLoadError(AutoplaceError):
    """The model file could not be loaded or did not define what autoplace needs."""


class TraceError(AutoplaceError):
    """Neither torch.export nor torch.fx.symbolic_trace could trace the model."""


class DeviceSpecError(AutoplaceError):
    """A device spec, device type or cluster file is malformed or unknown."""


class GraphError(AutoplaceError):
    """A graph is malformed: a cycle, an edge to an unknown node, a bad duration."""


class InfeasibleError(AutoplaceError):
    """No placement fits the devices' memory. ``options``: where a training plan's replica
    counts all failed, each one's record (``formats.records.ReplicaOption``), which its
    recipes read (``solve.baselines.recipes``)."""

    options: tuple[Any, ...] = ()


class EmitError(AutoplaceError):
    """The partitioned model could not be generated, saved or loaded."""


class VerificationError(AutoplaceError):
    """The emitted model does not reproduce the original model's outputs."""


class OutputError(AutoplaceError):
    """The output directory cannot be created or written."""


class PinError(AutoplaceError):
    """A pin names an unknown module or device, or contradicts another pin."""
