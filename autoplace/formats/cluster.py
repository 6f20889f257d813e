"""The cluster file: a TOML description of hosts, devices and links, read and checked against
``cluster.schema.json`` (JSON Schema, draft 2020-12) before anything is built from it.

The format, every table with what each field defaults to, how devices are named and linked by
default, ``reserve_bytes`` and shared links, is documented in ``docs/cli.md`` ("Cluster files",
"Shared links"); the schema beside this module states every field.

Read ``read_cluster_file`` (the TOML parsed, then ``schema_problems``: each problem named by its
path, the first ``_SHOWN_PROBLEMS`` shown; then what JSON Schema cannot say, ``_non_finite``).
``autoplace.cluster.file`` turns what it returns into a ``Cluster`` and makes the checks a schema
cannot (device types and link kinds from the catalog, link ends that name devices);
``autoplace.cluster.shared`` builds its NICs and ``[[shared]]`` tables.
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

