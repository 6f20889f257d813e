"""The cluster file: a TOML description of hosts, devices and links, read and checked against
``cluster.schema.json`` (JSON Schema, draft 2020-12) before anything is built from it.

Read ``read_cluster_file``; ``autoplace.cluster.file`` turns what it returns into a ``Cluster``
and makes the checks a schema cannot (device types and link kinds from the catalog, link ends
that name devices). The format::

    [[hosts]]
    name = "node0"
    devices = ["2xA100-40GB", "cpu"]     # the spec syntax of --devices ('2xTYPE', no spaces
                                         # inside an entry), catalog types only
    reserve_bytes = 0                    # optional: what each device's runtime holds (below)

    [[hosts]]
    name = "node1"
    devices = ["A100-40GB"]
    nic_bandwidth_bytes_per_s = 25e9     # optional: its NIC. Transfers leaving node1 share
                                         # nic-out:node1, those entering it nic-in:node1

    [[devices]]                          # optional: one device with overrides
    host = "node1"                       # a [[hosts]] name; omit it when there are no [[hosts]]
    type = "A100-80GB"
    torch_device = "cuda:1"              # optional: default is the host's next free cuda:N
    memory_bytes = 75_000_000_000        # optional: default is the catalog's
    reserve_bytes = 1_000_000_000        # optional: default is the type's, see below

    [[links]]                            # optional: override the default link of a pair
    src = "node0/cuda:0"
    dst = "node1/cuda:0"
    kind = "network"                     # a kind (its catalog figures, and its label),
    bandwidth_bytes_per_s = 25e9         # or a bandwidth, or both: this wins over the kind's
    latency_s = 5e-6                     # optional: default the kind's, else the pair's link's
    symmetric = true                     # the default: dst -> src gets the same figures

    [[shared]]                           # optional: any other shared resource
    name = "pcie-switch0"
    bandwidth_bytes_per_s = 16e9
    devices = ["node0/cuda:0", "node0/cuda:1"]  # transfers between these and other devices
    # hosts = ["node0"]                  # or a host's devices; or pairs, both ways unless
    # pairs = [["node0/cuda:0", "node1/cuda:0"]]  # symmetric = false

With one host, devices are named as in a spec (``cuda:0``, ``cpu``); with several,
``host/cuda:0`` (``torch_device`` stays ``cuda:0``). Devices on different hosts default to a
``network`` link. Two GPUs of one NVLink-capable type on one host are assumed to share an NVLink
board (as in HGX/DGX systems): override the links of PCIe-only machines.

A ``[[links]]`` table gives ``bandwidth_bytes_per_s``, or a ``kind`` from the link catalog
(``cost_models.links``) whose bandwidth (and, unless given, latency) it then takes, with a note
in the plan and on the terminal saying so; one with neither (a ``latency_s`` alone) is an error
that lists the kinds. Without a kind the link is labelled ``custom``.

Links are independent unless a NIC or ``[[shared]]`` says otherwise: transfers that cross one
shared link at the same time divide its bandwidth, max-min fair (``autoplace.cluster.shared``,
``simulate.contention``). A name that is not a device or host of the file is an error.

``reserve_bytes`` is memory the runtime holds before any tensor (the CUDA context, cuBLAS's
workspace), charged as resident: by default ``cost_models.devices.GPU_RUNTIME_RESERVE_BYTES``
(about 668 MiB) on a GPU, 0 on a CPU; a host's value applies to the devices of its spec list.
To plan for tensors alone in a capped ``memory_bytes``, set it to 0.
"""

from __future__ import annotations

import math
import os
import tomllib
from typing import Any

from autoplace.errors import DeviceSpecError
from autoplace.formats.schema import json_path, load_schema, schema_errors

__all__ = ["cluster_schema", "read_cluster_file", "schema_problems"]

_SHOWN_PROBLEMS = 3  # a file with more is usually wrong throughout; the first few say how


def cluster_schema() -> dict[str, Any]:
    """The cluster file's JSON Schema (it ships next to this module)."""
    return load_schema("cluster.schema.json")


def read_cluster_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML at ``path``, parsed and checked against the schema.

    Every problem raises ``DeviceSpecError`` starting ``cluster file PATH:``; a schema problem
    names the field's path and what was expected (``hosts[1].devices[0]: 5 is not of type
    'string'``).
    """
    where = f"cluster file {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise DeviceSpecError(f"{where}: no such file") from None
    except OSError as exc:
        raise DeviceSpecError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DeviceSpecError(f"{where}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DeviceSpecError(f"{where}: not UTF-8 text ({exc.reason})") from None
    problems = schema_problems(data) or _non_finite(data)
    if problems:
        more = len(problems) - _SHOWN_PROBLEMS
        raise DeviceSpecError(
            f"{where}: " + "; ".join(problems[:_SHOWN_PROBLEMS])
            + (f"; and {more} more" if more > 0 else "")
        )
    return data


def schema_problems(data: Any) -> list[str]:
    """Each way ``data`` breaks the schema, as ``path: what was expected``, in file order."""
    problems = []
    for error in schema_errors(data, "cluster.schema.json"):
        message = error.message
        if error.validator in ("type", "pattern") and "description" in error.schema:
            # The schema's own words ("an array of tables, written [[hosts]]") beat a regex.
            message = f"{error.instance!r} is not {error.schema['description']}"
        elif error.validator == "additionalProperties":
            message += f"; allowed keys: {', '.join(error.schema['properties'])}"
        path = json_path(error.absolute_path)
        problems.append(f"{path}: {message}" if path else message)
    return problems


def _non_finite(data: dict[str, Any]) -> list[str]:
    """TOML has ``inf`` and ``nan``, which JSON (and so JSON Schema) has no words for: a bound
    such as ``exclusiveMinimum`` lets both through, so they are caught here."""
    return [
        f"{section}[{i}].{key}: {value!r} is not a finite number"
        for section in ("links", "shared", "hosts")
        for i, table in enumerate(data.get(section, ()))
        for key, value in table.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]

