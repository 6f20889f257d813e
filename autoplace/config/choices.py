"""The options with a fixed set of values, as ``enum.StrEnum``s: each member is its own string
(``Objective.THROUGHPUT == "throughput"``), so plan.json and the command line spell them as
before. Imports only ``autoplace.errors``, so that every stage may use them."""

from __future__ import annotations

import enum
from typing import TypeVar

from autoplace.errors import ConfigError

__all__ = ["DType", "Fsdp", "Granularity", "Layers", "Mode", "Objective", "PipelineSchedule",
           "Recompute", "choice"]


class Mode(enum.StrEnum):
    """What is planned: one forward pass, or one training step (forward, backward, update)."""

    INFERENCE = "inference"
    TRAINING = "training"


class Objective(enum.StrEnum):
    """What the solver minimises: one pass's makespan, or the busiest device's load (the time
    between passes when they are pipelined)."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


class Granularity(enum.StrEnum):
    """What is placed: every traced op (a partitioned model is emitted), or whole modules (a
    Hugging Face ``device_map``)."""

    OP = "op"
    MODULE = "module"


class PipelineSchedule(enum.StrEnum):
    """The order each device runs a training step's micro-batches in: GPipe's (every forward,
    then every backward), 1F1B's, or both solved and the faster kept."""

    AUTO = "auto"
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


class Recompute(enum.StrEnum):
    """Where a training step recomputes activations in its backward: where a placement
    overflows without it, on every device, or nowhere (``train.recompute``)."""

    AUTO = "auto"
    OFF = "off"
    ALL = "all"


class Fsdp(enum.StrEnum):
    """Whether data-parallel replicas shard the model (FSDP2's ``fully_shard``, ZeRO-3:
    ``train.sharded``): where a replica count's DDP step does not fit, the faster step that
    fits kept (auto); always; or never."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Layers(enum.StrEnum):
    """How a training step runs the layers: as users train (``train()``: dropout on, batch norm
    on the batch's statistics, updating its running ones), or in ``eval()`` behaviour
    (``train.layers``)."""

    TRAIN = "train"
    EVAL = "eval"


class DType(enum.StrEnum):
    """The floating dtype the model is planned and run in; ``fp32``, ``bf16``, ``fp16``,
    ``half`` and ``torch.bfloat16`` name members too."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @classmethod
    def _missing_(cls, value: object) -> DType | None:
        name = str(value).strip().lower().removeprefix("torch.")
        name = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                "half": "float16"}.get(name, name)
        return next((m for m in cls if m.value == name), None)


E = TypeVar("E", bound=enum.StrEnum)


def choice(kind: type[E], value: object, name: str) -> E:
    """``value`` as a member of ``kind``, or a ``ConfigError`` naming field ``name`` and the
    values it takes."""
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{{{name}}} must be one of {', '.join(kind)}, got {value!r}") from None
