"""Which devices a plan is for: a ``--devices`` spec, a cluster file, a ``Cluster``, or the GPUs
found here, always through ``resolve_cluster``.

Read in this order: ``resolve`` (the one route, ``resolve_cluster``, and the catalog table),
``spec`` (the spec grammar: ``2xA100-40GB,cpu``, ``cuda:0``), ``build`` (naming devices and
their default links), ``file`` (a cluster file into a ``Cluster``; the format itself is
``autoplace.formats.cluster``) and ``detect`` (the one GPU detector, with the
``CUDA_VISIBLE_DEVICES`` rule, and the inventory the profiler uses). Device figures come from
``cost_models``. ``local`` is how the emitted model and the profiler run on this machine's
devices (a ``cpu-thread`` worker's one intra-op thread, a free port for a rendezvous).
"""

from __future__ import annotations

from autoplace.cluster.detect import (
    DetectedGPU,
    HostInfo,
    Inventory,
    describe_present,
    detect_gpus,
    device_key,
    inventory,
    present_devices,
)
from autoplace.cluster.file import load_cluster_file
from autoplace.cluster.resolve import format_catalog, resolve_cluster
from autoplace.cluster.spec import DEFAULT_SIMULATED_SPEC

__all__ = [
    "DEFAULT_SIMULATED_SPEC",
    "DetectedGPU",
    "HostInfo",
    "Inventory",
    "describe_present",
    "detect_gpus",
    "device_key",
    "format_catalog",
    "inventory",
    "load_cluster_file",
    "present_devices",
    "resolve_cluster",
]
