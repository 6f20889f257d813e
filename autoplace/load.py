"""Load a user's model file: ``build()`` returning ``(model, example_inputs)``, or module-level
``model`` and ``example_inputs``; for training plans also ``loss(outputs, *targets)`` and
``example_targets``.

This runs the user's file: it is their code, executed with their privileges, exactly as
``python model.py`` would (the README says so). Everything that can go wrong becomes a
``ModelLoadError`` naming the file and what to change.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autoplace.errors import ModelLoadError

__all__ = ["LoadedModel", "load_model_file", "normalize_inputs"]

_CONTRACT = (
    "define `build()` returning `(model, example_inputs)`, or module-level `model` and "
    "`example_inputs`; example_inputs is a tuple of tensors or a dict of keyword inputs"
)


@dataclass(frozen=True)
class LoadedModel:
    """A model and the example inputs to trace it with, split into positional and keyword;
    for training plans, the file's ``loss(outputs, *targets)`` and ``example_targets`` (a
    tensor or a tuple of them) as it defines them, if it does (``train.training_targets``
    makes the targets a tuple, or says what is wrong with them)."""

    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "model"
    loss: Any = None
    targets: Any = ()


def normalize_inputs(example_inputs: Any, *, where: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Split example inputs into ``(args, kwargs)``: a tensor, a tuple/list, or a dict."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, dict):
        bad = [k for k in example_inputs if not isinstance(k, str)]
        if bad:
            raise ModelLoadError(f"{where}: example_inputs dict keys must be strings, got {bad!r}")
        return (), dict(example_inputs)
    raise ModelLoadError(
        f"{where}: example_inputs is a {type(example_inputs).__name__}; it must be a tensor, a "
        "tuple of tensors, or a dict of keyword inputs"
    )


def _user_frames(exc: BaseException, path: Path) -> str:
    """The traceback lines that point into the user's file, so the error shows their line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if not frames:
        return ""
    last = frames[-1]
    return f" (line {last.lineno}: {last.line})"


def load_model_file(path: str | Path) -> LoadedModel:
    """Import ``path`` as a module and return its model and example inputs."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelLoadError(
            f"model file {str(path)!r} does not exist: pass the path of a Python file that "
            f"{_CONTRACT}"
        )
    if path.suffix != ".py":
        raise ModelLoadError(f"model file {str(path)!r} is not a .py file: {_CONTRACT}")
    module_name = f"autoplace_user_model_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise ModelLoadError(
                f"{path.name} has a syntax error at line {exc.lineno}: {exc.msg}; fix the file "
                "and run again"
            ) from exc
        except Exception as exc:
            raise ModelLoadError(
                f"{path.name} raised {type(exc).__name__} while being imported"
                f"{_user_frames(exc, path)}: {exc}; fix the file and run again"
            ) from exc

        if hasattr(module, "build"):
            try:
                built = module.build()
            except Exception as exc:
                raise ModelLoadError(
                    f"{path.name}: build() raised {type(exc).__name__}{_user_frames(exc, path)}: "
                    f"{exc}; fix build() and run again"
                ) from exc
            if not (isinstance(built, tuple) and len(built) == 2):
                raise ModelLoadError(
                    f"{path.name}: build() returned {type(built).__name__}, not a pair "
                    f"(model, example_inputs): {_CONTRACT}"
                )
            model, example_inputs = built
        elif hasattr(module, "model") and hasattr(module, "example_inputs"):
            model, example_inputs = module.model, module.example_inputs
        else:
            raise ModelLoadError(f"{path.name} defines neither build() nor model/example_inputs: "
                                 f"{_CONTRACT}")
        # For --mode training, which checks them (train.loss_model, train.training_targets);
        # an inference plan ignores them.
        loss, targets = getattr(module, "loss", None), getattr(module, "example_targets", ())
    finally:
        sys.modules.pop(module_name, None)

    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"{path.name}: the model is a {type(model).__name__}, not a torch.nn.Module"
        )
    args, kwargs = normalize_inputs(example_inputs, where=path.name)
    return LoadedModel(model=model, args=args, kwargs=kwargs, name=path.stem, loss=loss,
                       targets=targets)

