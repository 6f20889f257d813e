"""Cost models: device types, link kinds, and how long an op or a transfer takes.

A lower layer than ``autoplace``: it never imports it (nor the solver, nor torch), so it can be
used and tested on its own. Start with ``devices`` (the catalog of device types), then ``links``
(link kinds and the default link between two device types), then ``roofline`` (the formulas).
``units`` writes bytes and seconds for people, the one way every stage of ``autoplace`` does.
"""

from __future__ import annotations

from cost_models.devices import (
    DEVICE_CATALOG,
    DeviceType,
    UnknownDeviceTypeError,
    UnknownNameError,
    canonical_dtype,
    catalog_names,
    catalog_table,
    get_device_type,
    match_gpu_name,
)
from cost_models.links import (
    LINK_CATALOG,
    LinkSpec,
    UnknownLinkKindError,
    default_link,
    get_link_kind,
    link_kind_names,
)
from cost_models.roofline import (
    arithmetic_intensity,
    op_time_s,
    ring_allgather_s,
    ring_allreduce_s,
    transfer_time_s,
)

__all__ = [
    "DEVICE_CATALOG",
    "LINK_CATALOG",
    "DeviceType",
    "LinkSpec",
    "UnknownDeviceTypeError",
    "UnknownLinkKindError",
    "UnknownNameError",
    "arithmetic_intensity",
    "canonical_dtype",
    "catalog_names",
    "catalog_table",
    "default_link",
    "get_device_type",
    "get_link_kind",
    "link_kind_names",
    "match_gpu_name",
    "op_time_s",
    "ring_allgather_s",
    "ring_allreduce_s",
    "transfer_time_s",
]
