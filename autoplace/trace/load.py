"""Load a user's model file: ``build()`` returning ``(model, example_inputs)``, or module-level
``model`` and ``example_inputs``; for training plans also ``loss(outputs, *targets)`` and
``example_targets``.

This runs the user's file: it is their code, executed with their privileges, exactly as
``python model.py`` would (the README says so). Everything that can go wrong becomes a
``ModelLoadError`` naming the file and what to change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import sysconfig
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autoplace.errors import ModelLoadError

__all__ = ["LoadedModel", "describe_failure", "kept_state", "load_model_file",
           "normalize_inputs", "run_example"]

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



# Frames in these folders are the libraries' (torch, Python's own), not the place to fix.
# ``parents[1]`` is the autoplace package (this module is ``autoplace/trace/load.py``).
_LIBRARY_DIRS = tuple(str(Path(p).resolve()) for p in {
    Path(torch.__file__).parent, Path(__file__).parents[1], sysconfig.get_paths()["stdlib"]})


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The deepest frame of ``exc``'s traceback outside torch, autoplace and the standard
    library: the line of the user's model (or of the library that defines it) that failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARY_DIRS)]
    return outside[-1] if outside else None


_FIX_MODEL = ("The model does not run on its own example inputs, so there is nothing to plan "
              "yet: fix the model or its example inputs (run it once with them: "
              "`model(*example_inputs)`) and run again")


def describe_failure(exc: BaseException, *, what: str, fix: str = _FIX_MODEL) -> str:
    """One paragraph on ``exc`` raised while ``what`` ran: the exception, where it was raised in
    the user's code (file, line, function and the line's text) and what to do (``fix``)."""
    message = (str(exc).strip().splitlines() or [""])[0][:400]
    frame = _user_frame(exc)
    place = "" if frame is None else (
        f" at {frame.filename}, line {frame.lineno}, in {frame.name}"
        + (f" (`{frame.line.strip()}`)" if frame.line else ""))
    return f"{what} raised {type(exc).__name__}{place}: {message}. {fix}"


def run_example(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run ``model`` once on its example inputs, as the user would, before any tracing: a model
    that fails there gets a ``ModelLoadError`` naming the exception and the user's line, not a
    tracer's message about another problem. Nothing changes: without gradients, and with the
    random state and the buffers (batch norm's running statistics) restored afterwards. A model
    on the meta device is not run (tracing checks it on meta tensors)."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        return
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model is theirs to fix
        raise ModelLoadError(describe_failure(exc, what="the model, run on its example inputs,")
                             ) from exc
    finally:
        with torch.no_grad(), contextlib.suppress(AttributeError, RuntimeError):
            for name, saved in buffers.items():
                model.get_buffer(name).copy_(saved)


@contextlib.contextmanager
def kept_state(*modules: torch.nn.Module) -> Iterator[None]:
    """Run inside; afterwards every buffer of ``modules`` holds its value from before, and the
    random generators their state: a batch norm in ``train()`` updates its running statistics
    on every forward, and the runs made to plan or check a step (the loss checked, ops
    profiled, a backward measured) are not steps the user took."""
    buffers = {id(b): (b, b.detach().clone()) for m in modules for b in m.buffers()}
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in buffers.values():
                buffer.copy_(value)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
