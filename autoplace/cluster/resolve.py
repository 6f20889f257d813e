"""The one route from what a user gave (a ``--devices`` spec, a ``--cluster`` file, a ``Cluster``
or nothing) to the ``Cluster`` a plan is for, with notes for the user; and the catalog table of
``autoplace devices``.

Every caller (``pipeline.plan``, ``autoplace plan``/``solve``/``profile``) goes through
``resolve_cluster``, so every note (a GPU costed as a catalog type it is not, the simulated
devices chosen for lack of GPUs, a cluster file's link that took its kind's catalog figures)
reaches the plan and the terminal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from autoplace.cluster import detect
from autoplace.cluster.build import LOCAL_HOST, build_cluster
from autoplace.cluster.detect import DetectedGPU
from autoplace.cluster.file import load_cluster_file
from autoplace.cluster.spec import CHOOSE_HINT, DEFAULT_SIMULATED_SPEC, detected_entry, parse_tokens
from autoplace.errors import DeviceSpecError
from autoplace.ir import Cluster
from cost_models import catalog_table
from cost_models.units import format_bytes

__all__ = ["format_catalog", "resolve_cluster"]


def resolve_cluster(
    *,
    spec: str | None = None,
    cluster_file: str | os.PathLike[str] | None = None,
    cluster: Cluster | None = None,
    gpus: Sequence[DetectedGPU] | None = None,
) -> tuple[Cluster, list[str]]:
    """The devices to plan for, and notes telling the user where they came from.

    A spec (``2xA100-40GB,cpu``, ``cuda:0``), a cluster file or a ready ``Cluster`` (at most one)
    wins; with none, the GPUs found here; with none found, the simulated
    ``DEFAULT_SIMULATED_SPEC``. ``gpus`` are the GPUs found here when the caller has asked
    already (the profiler's inventory); otherwise ``detect.detect_gpus`` is asked, only if a
    spec names ``cuda:N`` or nothing is given.
    """
    given = [what for what, value in (("a device spec", spec), ("a cluster file", cluster_file),
                                      ("a Cluster", cluster)) if value is not None]
    if spec is not None and cluster_file is not None:
        raise DeviceSpecError(
            f"got both a device spec ({spec!r}) and a cluster file ({os.fspath(cluster_file)}); "
            "give one"
        )
    if len(given) > 1:
        raise DeviceSpecError(f"got both {given[0]} and {given[1]}; give one")
    if cluster is not None:
        return cluster, []
    if cluster_file is not None:
        notes: list[str] = []
        return load_cluster_file(cluster_file, notes=notes), notes
    found: Callable[[], Sequence[DetectedGPU]] = (
        detect.detect_gpus if gpus is None else (lambda: gpus)
    )
    if spec is not None:
        return _from_spec(spec, detected=found)
    return _from_this_machine(found())


def _from_spec(
    spec: str, *, detected: Callable[[], Sequence[DetectedGPU]]
) -> tuple[Cluster, list[str]]:
    notes: list[str] = []
    entries = parse_tokens(spec, where="device spec", detected=detected, notes=notes)
    return build_cluster([(LOCAL_HOST, entries)], where="device spec"), notes


def _from_this_machine(gpus: Sequence[DetectedGPU]) -> tuple[Cluster, list[str]]:
    """The GPUs found here, or the simulated default set when there are none."""
    if not gpus:
        cluster, _ = _from_spec(DEFAULT_SIMULATED_SPEC, detected=lambda: gpus)
        return cluster, [
            f"no GPU found: planning for the simulated devices {DEFAULT_SIMULATED_SPEC} "
            f"({', '.join(cluster.names)}); {CHOOSE_HINT}"
        ]
    notes: list[str] = []
    entries = [detected_entry(g.index, gpus, where="GPUs found", notes=notes) for g in gpus]
    cluster = build_cluster([(LOCAL_HOST, entries)], where="GPUs found")
    found = ", ".join(
        f"cuda:{g.index} {g.name} ({entry.type.name})"
        for g, entry in zip(gpus, entries, strict=True)
    )
    plural = "GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"
    return cluster, [f"using the {plural} found: {found}", *notes]


def format_catalog(detected: Sequence[DetectedGPU]) -> str:
    """A plain-text table of the device catalog and the GPUs found, for ``autoplace devices``."""
    lines = ["Device types:", catalog_table(indent="  "), ""]
    if not detected:
        lines.append(f"GPUs found: no GPU found (plans default to {DEFAULT_SIMULATED_SPEC}).")
    else:
        lines.append("GPUs found:")
        for gpu in detected:
            matched = gpu.catalog_type or "not in the catalog"
            lines.append(
                f"  cuda:{gpu.index}  {gpu.name}  {format_bytes(gpu.memory_bytes)}  -> {matched}"
            )
    return "\n".join(lines) + "\n"
