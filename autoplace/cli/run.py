"""``autoplace run OUT/``: run an emitted model and set what it does beside what its plan says.

``run_plan`` loads ``OUT/model`` onto the planned devices (``autoplace.emit.load_model``; those not
here remapped to the CPU) and runs it on the inputs saved at emit time
(``model/inputs.safetensors``) or on a ``--inputs`` file (``emit.files.saving.read_inputs_file``):
``warmup`` passes, ``repeats`` timed ones, and one more measuring each device's peak bytes
(``autoplace.emit.check.memory``: weights and live activations, as the plan counts them). Its
``RunResult`` sets the median time against the plan's makespan where the model ran on the planned
devices (elsewhere the time stands alone), measured against predicted peaks, and each device's
intra-op threads. ``train_plan`` (``--train STEPS``) trains a training plan's model with its
optimizer in its precision (``emit.train.optimizer.MasterWeights``), R > 1 replicas as R processes
on 1/R of the batch each (``OUT/train.py`` under torchrun, ``emit.distributed.replicas``). Every
check of the user's files (not a plan, weights missing or corrupted, inputs unlike the example's)
raises before anything is written; ``save_outputs`` writes its file all at once. Read ``run_plan``,
``save_outputs``, ``train_plan``; for users, ``docs/cli.md`` ("autoplace run").
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch.utils import _pytree as pytree

from autoplace.cluster.local import worker_threads
from autoplace.emit import load_model, local_device_map
from autoplace.emit.check.memory import comparable_peak_bytes, measure
from autoplace.emit.distributed.ddp import batch_size, replicas_of
from autoplace.emit.distributed.replicas import launch_replicas
from autoplace.emit.files.saving import load_inputs, read_inputs_file
from autoplace.emit.train.microbatch import split_batch, stepper
from autoplace.emit.train.optimizer import MasterWeights
from autoplace.errors import AutoplaceError, EmitError, OutputError
from autoplace.formats.plan import Plan, plan_path, read_plan
from cost_models.units import format_bytes

__all__ = ["TRAIN_TIMEOUT_S", "RunResult", "TrainResult", "plan_and_model", "plan_in",
           "read_inputs_file", "run_plan", "save_outputs", "train_plan"]

# ``--train`` of a plan with replicas runs them as processes: a bound on the whole run, for a
# process that neither ends nor fails (each collective already fails after ddp.INIT_TIMEOUT_S).
# --train checks a plan's step, it is not a training run: an hour is far past any such check.
TRAIN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class RunResult:
    """One ``autoplace run``: times in seconds, bytes per plan device name. ``predicted_s`` is
    the plan's makespan, or ``None`` where planned devices ran on others here (``remapped``:
    planned torch device -> where it ran), whose time says nothing of the plan's. ``threads``:
    the intra-op threads each planned device's segments ran on, seen inside them (devices on
    a GPU left out)."""

    measured_s: float
    predicted_s: float | None
    times_s: tuple[float, ...]
    peak_bytes: Mapping[str, int]
    predicted_peak_bytes: Mapping[str, int]
    peak_method: str
    device_map: Mapping[str, str]
    inputs: str
    remapped: Mapping[str, str] = field(default_factory=dict)
    threads: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    outputs: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: the four keys the issue names first, then the context."""
        return {
            "measured_s": self.measured_s,
            "predicted_s": self.predicted_s,
            "peak_bytes": dict(self.peak_bytes),
            "predicted_peak_bytes": dict(self.predicted_peak_bytes),
            "times_s": list(self.times_s),
            "peak_method": self.peak_method,
            "device_map": dict(self.device_map),
            "remapped": dict(self.remapped),
            "threads": dict(self.threads),
            "inputs": self.inputs,
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """The terminal summary; first, where the devices differ from the plan's, that they do."""
        time = (f"time: measured {self.measured_s * 1e3:.3f} ms (median of "
                f"{len(self.times_s)})" + _against(self.measured_s, self.predicted_s,
                                                    what="predicted makespan"))
        out = [*_differ(self.remapped, what="time"), f"inputs: {self.inputs}", time,
               *_threads_line(self.threads, what="its segments" if len(self.threads) == 1
                              else "each device's segments"),
               f"peak memory per {'planned ' if self.remapped else ''}device "
               f"({self.peak_method} measurement, weights + live activations"
               + ("; bytes do not depend on the device's speed, so they compare here too):"
                  if self.remapped else "):")]
        for device, predicted in self.predicted_peak_bytes.items():
            measured = self.peak_bytes.get(device, 0)
            verdict = "within plan" if measured <= predicted else "ABOVE PLAN"
            out.append(f"  {device}: measured {format_bytes(measured)}, predicted "
                       f"{format_bytes(predicted)} ({verdict})")
        out += [f"note: {note}" for note in self.notes]
        return out


def run_plan(
    directory: str | os.PathLike[str],
    *,
    inputs_file: str | os.PathLike[str] | None = None,
    warmup: int = 1,
    repeats: int = 5,
) -> RunResult:
    """Load ``directory``'s emitted model here, time it and measure its peak memory."""
    if warmup < 0 or repeats < 1:
        raise AutoplaceError(f"--warmup must be 0 or more and --repeats 1 or more, got "
                             f"{warmup} and {repeats}")
    plan, model_dir = plan_and_model(directory)
    example = load_inputs(model_dir)
    if inputs_file is not None:
        args, kwargs = read_inputs_file(inputs_file, example=example)
        inputs = str(inputs_file)
    elif example is None:
        raise EmitError(f"{model_dir} holds no example inputs (inputs.safetensors; older "
                        "outputs, or inputs that safetensors cannot hold): pass --inputs "
                        "FILE.safetensors")
    else:
        args, kwargs = example
        inputs = f"the example inputs ({model_dir / 'inputs.safetensors'})"
        replicas = replicas_of(plan.training)
        count = (plan.training.microbatches or 1) if plan.training is not None else 1
        if replicas * count > 1:  # the whole batch is saved; the model takes one part of it
            args, kwargs = split_batch(*split_batch(args, kwargs, replicas)[0], count)[0]
            inputs += (f", the first of {replicas} replicas' shards" if replicas > 1 else "") \
                + (f", its first of {count} micro-batches" if count > 1 else "")

    name_of = {d.torch_device: d.name for d in plan.problem.cluster.devices}
    here = local_device_map(sorted(name_of))
    remapped = _remapped(here)
    notes = []
    if plan.training is not None:
        notes.append("a training plan: this times the forward pass (the loss) alone"
                     + ("" if remapped else " against the whole training step's predicted time")
                     + "; `--train STEPS` times the step")
    model = load_model(model_dir, device_map=here)
    times_s, outputs, threads = _time(model, args, kwargs, warmup=warmup, repeats=repeats)
    measured = measure(model, args, kwargs)
    return RunResult(
        measured_s=statistics.median(times_s),
        # a generation plan's model is the prompt's pass; its makespan sums the decode steps
        predicted_s=None if remapped else (plan.generation.prefill_s if plan.generation
                                           else plan.makespan_s),
        times_s=tuple(times_s),
        peak_bytes={name_of.get(d, d): b for d, b in measured.peak_bytes.items()},
        predicted_peak_bytes=comparable_peak_bytes(plan.problem, plan.schedule),
        peak_method=measured.method,
        device_map=here,
        inputs=inputs,
        remapped=remapped,
        threads=threads,
        notes=tuple(notes),
        outputs=outputs,
    )


@dataclass(frozen=True)
class TrainResult:
    """``autoplace run --train``: the loss after each step, and the step times (seconds).
    ``predicted_s`` and ``remapped`` as ``RunResult``'s. ``threads``, per planned device on a
    CPU: the intra-op threads of the calling thread (a replica's, rank 0's), which runs the
    update, and the backward where no worker thread does (worker threads run on one)."""

    losses: tuple[float, ...]
    times_s: tuple[float, ...]
    measured_s: float
    predicted_s: float | None
    optimizer: str
    lr: float | None
    device_map: Mapping[str, str]
    notes: tuple[str, ...] = ()
    dtype: str = "float32"  # a half one: mixed precision (emit.train.optimizer.MasterWeights)
    remapped: Mapping[str, str] = field(default_factory=dict)
    threads: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "times_s": list(self.times_s),
                "optimizer": self.optimizer, "lr": self.lr, "dtype": self.dtype,
                "device_map": dict(self.device_map), "remapped": dict(self.remapped),
                "threads": dict(self.threads), "notes": list(self.notes)}

    def lines(self) -> list[str]:
        return [*_differ(self.remapped, what="step time"),
                f"trained {len(self.losses)} steps of {self.optimizer}"
                + (f" (lr {self.lr:g})" if self.lr is not None else " (torch's defaults)"),
                "losses: " + ", ".join(f"{v:.6g}" for v in self.losses),
                f"step time: measured {self.measured_s * 1e3:.3f} ms (median of "
                + (f"steps 2-{len(self.times_s)}" if len(self.times_s) > 1 else "1 step")
                + ")" + _against(self.measured_s, self.predicted_s, what="predicted"),
                *_threads_line(self.threads, what="the step"),
                *(f"note: {note}" for note in self.notes)]


def _remapped(*device_maps: Mapping[str, str]) -> dict[str, str]:
    """The planned torch devices that ran on another kind of device here (a GPU absent here,
    on the CPU), and where: across ``device_maps`` (a replica's each). A replica's GPUs that
    are other GPUs of the plan's kind (rank 1's ``cuda:0`` on ``cuda:2``) are not."""
    return {planned: ran for m in device_maps for planned, ran in m.items()
            if torch.device(planned).type != torch.device(ran).type}


def _differ(remapped: Mapping[str, str], *, what: str) -> list[str]:
    """The first line of a result whose devices differ from the plan's, else none."""
    if not remapped:
        return []
    where = "; ".join(f"{', '.join(sorted(d for d in remapped if remapped[d] == ran))} ran on "
                      f"{ran}" for ran in sorted(set(remapped.values())))
    return [f"devices differ from the plan: {where} (not on this machine), so the {what} is "
            "this machine's, not the planned devices', and is not compared with the plan's "
            "prediction"]


def _against(measured_s: float, predicted_s: float | None, *, what: str) -> str:
    if predicted_s is None:
        return ""
    ratio = measured_s / predicted_s if predicted_s > 0 else float("nan")
    return f", {what} {predicted_s * 1e3:.3f} ms (measured/predicted {ratio:.2f})"


def _threads_line(threads: Mapping[str, int], *, what: str) -> list[str]:
    if not threads:
        return []
    return ["threads: " + ", ".join(f"{d} {n}" for d, n in threads.items())
            + f" (intra-op threads {what} ran on)"]


def train_plan(directory: str | os.PathLike[str], *, steps: int, lr: float | None = None,
               timeout_s: float = TRAIN_TIMEOUT_S) -> TrainResult:
    """Train ``directory``'s emitted model (a ``--mode training`` plan) for ``steps`` steps on
    its example inputs and targets, with the plan's optimizer (torch's defaults, or ``lr``),
    and time each step (the first, which allocates the optimizer's state, is not counted in
    the median when there are more). A plan of R > 1 data-parallel replicas trains them as R
    processes (``OUT/train.py`` under torchrun, stopped after ``timeout_s``), each on its
    shard of the batch."""
    if steps < 1:
        raise AutoplaceError(f"--train must be 1 or more steps, got {steps}")
    plan, model_dir = plan_and_model(directory)
    if plan.training is None:
        raise AutoplaceError(f"{str(directory)!r} holds an inference plan: --train needs one "
                             "made with `autoplace plan --mode training`")
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no example inputs and targets "
                        "(inputs.safetensors): plan it again")
    if replicas_of(plan.training) > 1:
        return _train_replicas(plan, model_dir, example, steps=steps, lr=lr,
                               timeout_s=timeout_s)
    args, kwargs = example
    here = local_device_map(sorted({d.torch_device for d in plan.problem.cluster.devices}))
    model = load_model(model_dir, device_map=here)
    dtype = plan.training.dtype or "float32"
    optimizer = MasterWeights(plan.training.optimizer, model.parameters(), dtype=dtype, lr=lr)
    devices = [torch.device(d) for d in set(model.devices) if d.startswith("cuda")]
    count = plan.training.microbatches or 1
    # Micro-batches run segment by segment in the plan's order (each CPU worker's actions on
    # its own thread); one batch runs the model's forward and autograd's backward, which
    # measured faster on this machine's CPU workers (GPT-2 on 2xcpu-thread in 59 segments,
    # one intra-op thread: 421 ms a step, against 531-554 segment by segment; docs/training).
    # Autograd runs that backward, and the optimizer its update, on this thread: with CPU
    # workers on one intra-op thread, as the plan times them (torch's default here, one per
    # core, took the other worker's core).
    run = stepper(model, plan.problem, plan.schedule, split_batch(args, kwargs, count),
                  plan.training.microbatch_loss,
                  recompute=plan.training.recompute or ()) if count > 1 else None
    losses, times = [], []
    with worker_threads(here.values()) as threads:
        for _ in range(steps):
            began = time.perf_counter()
            optimizer.zero_grad()
            if run is not None:
                loss = run(loss_scale=optimizer.loss_scale)
            else:
                loss = model(*args, **kwargs)
                optimizer.backward(loss)
            optimizer.step()
            for gpu in devices:
                torch.cuda.synchronize(gpu)
            times.append(time.perf_counter() - began)
            losses.append(float(loss.detach().to("cpu")))
    timed = times[1:] or times
    remapped = _remapped(here)
    notes = []
    if dtype != "float32":
        notes.append(f"{dtype} mixed precision: float32 master weights"
                     + (f", {optimizer.skipped} of {steps} steps skipped for a gradient "
                        f"overflow, loss scale now {optimizer.loss_scale:g}"
                        if dtype == "float16" else ""))
    return TrainResult(losses=tuple(losses), times_s=tuple(times),
                       measured_s=statistics.median(timed),
                       predicted_s=None if remapped else plan.makespan_s,
                       optimizer=plan.training.optimizer, lr=lr, device_map=here,
                       notes=tuple(notes), dtype=dtype, remapped=remapped,
                       threads=_on_cpu(here, threads))


def _train_replicas(plan: Plan, model_dir: Path,
                    example: tuple[tuple[Any, ...], dict[str, Any]], *, steps: int,
                    lr: float | None, timeout_s: float) -> TrainResult:
    """``train_plan`` of a plan with data-parallel replicas: its ``train.py`` under torchrun,
    which reports (``--json``) the losses and rank 0's step times."""
    replicas = replicas_of(plan.training)
    script = model_dir.parent / "train.py"
    if not script.is_file():
        raise EmitError(f"{model_dir.parent} plans {replicas} data-parallel replicas but holds "
                        "no train.py, their entry point: plan it again")
    batch = batch_size(example, replicas=replicas)  # a clear error before any process starts
    with tempfile.TemporaryDirectory(prefix="autoplace-train-") as tmp:
        report_file = Path(tmp) / "train.json"
        launch_replicas(script, replicas=replicas, timeout_s=timeout_s,
                        argv=["--steps", str(steps), "--json", str(report_file),
                              *(["--lr", repr(lr)] if lr is not None else [])])
        report = json.loads(report_file.read_text())
    here = report["device_maps"][0]
    remapped = _remapped(*report["device_maps"])
    count = report.get("microbatches", 1)
    notes = [f"{replicas} processes ran (torchrun, {report['backend']}), one per data-parallel "
             f"replica, each on {batch // replicas} of the batch of {batch}"
             + (f" in {count} micro-batches (the plan's {plan.training.schedule} order), "
                "the gradients all-reduced after them" if count > 1 else "")
             + ": the losses are their mean, the step times rank 0's; device_map is rank 0's"]
    return TrainResult(losses=tuple(report["losses"]), times_s=tuple(report["times_s"]),
                       measured_s=report["measured_s"],
                       predicted_s=None if remapped else plan.makespan_s,
                       optimizer=plan.training.optimizer, lr=lr, device_map=here,
                       notes=tuple(notes), remapped=remapped,
                       threads=_on_cpu(here, report["threads"]))


def _on_cpu(device_map: Mapping[str, str], threads: int) -> dict[str, int]:
    """``threads`` for each planned device of ``device_map`` that ran on a CPU."""
    return {planned: threads for planned, ran in device_map.items()
            if torch.device(ran).type != "cuda"}


def plan_in(directory: str | os.PathLike[str]) -> Plan:
    """``directory``'s plan, checked against the schema, or a clear error."""
    root = Path(directory)
    if not root.is_dir():
        raise OutputError(f"{str(root)!r} is not a directory: pass the output directory of "
                          "`autoplace plan` (holding plan.json and model/)")
    return read_plan(plan_path(root))


def plan_and_model(directory: str | os.PathLike[str]) -> tuple[Plan, Path]:
    """``directory``'s plan (checked against the schema) and its ``model/`` folder, or a clear
    error naming what is missing."""
    root, plan = Path(directory), plan_in(directory)
    model_dir = root / "model"
    if not model_dir.is_dir() and plan.device_map is not None:
        raise EmitError(f"{str(root)!r} holds a --granularity module plan: its artefact is "
                        f"{root / 'device_map.json'}, not an emitted model. Load the model with "
                        "from_pretrained(..., device_map=<that file's map>) or accelerate's "
                        "dispatch_model, or plan at op granularity to emit and run one")
    if not model_dir.is_dir() and plan.is_mesh and plan.tensor_parallel is not None:
        tp = plan.tensor_parallel
        raise EmitError(f"{str(root)!r} holds the plan of a tensor-parallel mesh (no placement "
                        f"fit): run it with --tensor-parallel --nproc {tp.world}"
                        + (" --train K" if tp.optimizer is not None else ""))
    if not model_dir.is_dir():
        raise EmitError(f"{str(root)!r} holds a plan but no emitted model ({model_dir} is "
                        "missing): plan it again without --no-emit")
    return plan, model_dir


def _time(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, warmup: int,
    repeats: int,
) -> tuple[list[float], Any, dict[str, int]]:
    """The ``repeats`` timed passes' seconds after ``warmup`` untimed ones, the last outputs,
    and the intra-op threads each planned device's segments ran on in the first pass."""
    devices = {torch.device(d) for d in model.devices}
    gpus = [d for d in devices if d.type == "cuda"]

    def once() -> tuple[float, Any]:
        for gpu in gpus:  # queued work must not be timed as this pass's
            torch.cuda.synchronize(gpu)
        began = time.perf_counter()
        out = model(*args, **kwargs)
        for gpu in gpus:
            torch.cuda.synchronize(gpu)
        return time.perf_counter() - began, out

    with torch.no_grad():
        try:
            with _threads_seen(model) as threads:
                runs = [once()]
            runs += [once() for _ in range(warmup + repeats - 1)]
        except (RuntimeError, TypeError, ValueError, IndexError) as error:
            raise EmitError(f"the emitted model failed on these inputs: {type(error).__name__}: "
                            f"{error}") from error
    return [t for t, _ in runs[warmup:]], runs[-1][1], threads


@contextlib.contextmanager
def _threads_seen(model: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Over the body, the intra-op threads that each planned device's segments run on, as
    each sees them (``torch.get_num_threads()`` on the thread that runs it), segments on a GPU
    left out: what the model did, whichever forward ran and however it was emitted."""
    seen: dict[str, int] = {}
    hooks = []
    for seg in model.segment_info:
        if torch.device(seg.device).type != "cuda":
            def record(module: torch.nn.Module, inputs: Any, device: str = seg.planned_device
                       ) -> None:
                seen[device] = torch.get_num_threads()
            hooks.append(getattr(model, f"seg{seg.index}").register_forward_pre_hook(record))
    found: dict[str, int] = {}
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()
        found.update(sorted(seen.items()))


def save_outputs(outputs: Any, path: str | os.PathLike[str], *, root: str = "output"
                 ) -> list[str]:
    """Write the output tensors to ``path`` (safetensors, named ``output``, ``output.0``,
    ``output.logits``, ...; ``root`` is the first part) through a temporary file renamed into
    place; the names written."""
    where = Path(path)
    found, _ = pytree.tree_flatten_with_path(outputs)
    tensors = {}
    for key_path, leaf in found:
        if isinstance(leaf, torch.Tensor):
            parts = [str(getattr(k, "idx", getattr(k, "key", getattr(k, "name", k))))
                     for k in key_path]
            # clone: safetensors refuses tensors that share memory (an output and its view)
            name = ".".join([root, *parts] if root else parts)
            tensors[name] = leaf.detach().to("cpu").clone()
    if not tensors:
        raise AutoplaceError("the model returned no tensors: nothing to write to "
                             f"{str(where)!r}")
    if not where.parent.is_dir():
        raise OutputError(f"cannot write {str(where)!r}: {str(where.parent)!r} is not a "
                          "directory")
    handle, tmp = tempfile.mkstemp(prefix=f".{where.name}.", dir=where.parent)
    os.close(handle)
    try:
        safetensors.torch.save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, where)
    except OSError as error:
        raise OutputError(f"cannot write {str(where)!r}: {error}") from error
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return list(tensors)
