"""Where planned devices run on this machine: the ``device_map`` that emit and load apply.

A plan names the devices it was made for (``cuda:1``); the emitted model may run elsewhere.
``local_device_map`` keeps each planned device that is present here and sends the rest to the
CPU (how the pipeline verifies a GPU plan on a laptop); ``remap`` applies a user's glob mapping
(``{"cuda:*": "cpu"}``); ``check_device`` fails, with the mapping to pass, when a device is
absent. ``intra_op_threads`` is the intra-op thread count of a process (or thread) that runs
only ``cpu-thread`` workers (``is_thread_worker``): one; ``worker_threads`` runs a body on it.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

from autoplace.errors import EmitError

__all__ = ["check_device", "intra_op_threads", "is_thread_worker", "local_device_map", "remap",
           "worker_threads"]


def local_device_map(torch_devices: Sequence[str]) -> dict[str, str]:
    """Where each planned torch device lives on this machine: itself when present, else ``cpu``,
    so a plan made for GPUs runs (and is verified) on a machine without them."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mapping = {}
    for dev in torch_devices:
        parsed = torch.device(dev)
        present = parsed.type == "cpu" or (parsed.type == "cuda" and (parsed.index or 0) < count)
        mapping[dev] = dev if present else "cpu"
    return mapping


def remap(device: str, device_map: Mapping[str, str] | None) -> str:
    """The first ``device_map`` pattern (fnmatch glob, in mapping order) that matches wins."""
    for pattern, target in (device_map or {}).items():
        if fnmatch.fnmatchcase(device, pattern):
            try:
                return str(torch.device(target))
            except RuntimeError as error:
                raise EmitError(f"device_map[{pattern!r}] = {target!r} is not a device") from error
    return device


def check_device(device: str, *, planned: str) -> None:
    """Fail unless ``device`` can hold tensors here; the message names the ``device_map`` that
    would place its segments on the CPU instead."""
    kind = torch.device(device).type
    hint = f'pass device_map={{"{kind}:*": "cpu"}} to place those segments on the CPU'
    where = f"device {device!r}" + (f" (planned {planned!r})" if planned != device else "")
    if kind in ("cpu", "meta"):
        return
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (torch.device(device).index or 0) >= count:
            raise EmitError(
                f"{where} does not exist here: this machine has {count} CUDA device(s); {hint}"
            )
        return
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise EmitError(f"{where} is not usable here ({error}); {hint}") from error


def is_thread_worker(torch_device: str) -> bool:
    """Whether ``torch_device`` is a ``cpu-thread`` worker (``cpu:N``; the host CPU is ``cpu``)."""
    kind, _, index = torch_device.partition(":")
    return kind == "cpu" and bool(index)


def intra_op_threads(torch_devices: Iterable[str]) -> int:
    """The intra-op threads of a thread that runs only ``torch_devices``: one where every one
    is a ``cpu-thread`` worker (``cpu:N``; the host CPU is ``cpu``), as the plan times such a
    worker (``profile.timing.threads_for``, this for one device); else torch's count here."""
    devices = list(torch_devices)
    if devices and all(is_thread_worker(d) for d in devices):
        return 1
    return torch.get_num_threads()


@contextlib.contextmanager
def worker_threads(torch_devices: Iterable[str]) -> Iterator[int]:
    """Run the body on ``intra_op_threads(torch_devices)`` threads, as the runtime runs a
    worker (``emit/runtime.py``); torch's count is restored afterwards, also after an error.
    Yields the count in force. A whole step of such workers (autograd's backward on the
    calling thread, DDP's process) otherwise runs on torch's default of one thread per core,
    over cores the plan gives to the other workers."""
    before = torch.get_num_threads()
    count = intra_op_threads(torch_devices)
    if count != before:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if count != before:
            torch.set_num_threads(before)
