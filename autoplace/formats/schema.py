"""The JSON Schema machinery the file formats share: each schema read once from beside this
module, its validator built once, and an error's place in the document written as a path
(``hosts[1].devices[0]``) that a message can name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["json_path", "load_schema", "schema_errors"]

_HERE = Path(__file__).resolve().parent


@functools.cache
def _schema_text(name: str) -> str:
    try:
        # One joinpath per component: a namespace package's MultiplexedPath takes only one.
        path: Any = resources.files("autoplace").joinpath("formats").joinpath(name)
        return path.read_text(encoding="utf-8")
    except (OSError, TypeError):
        # Python 3.11's namespace-package reader rejects the placeholder path entry that an
        # editable install adds (NotADirectoryError); the file sits in the package anyway.
        return (_HERE / name).read_text(encoding="utf-8")


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (``plan.schema.json``, ...) shipped as package data; a fresh
    copy each call, so a caller may change it."""
    return json.loads(_schema_text(name))


@functools.cache
def _validator(name: str) -> Any:
    import jsonschema  # deferred: only reading one of these files needs it

    return jsonschema.Draft202012Validator(load_schema(name))


def schema_errors(data: Any, name: str) -> list[Any]:
    """``data``'s ``jsonschema`` errors against schema ``name``, in document order."""
    return sorted(_validator(name).iter_errors(data),
                  key=lambda e: [str(p) for p in e.absolute_path])


def json_path(path: Iterable[Any], *, root: str = "") -> str:
    """``("hosts", 1, "devices", 0)`` as ``hosts[1].devices[0]``, after ``root`` if given."""
    out = root
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
