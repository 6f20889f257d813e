"""This machine as the processes and threads that run or measure a plan here use it: the
``cpu-thread`` worker rule and its intra-op threads, a free port for a rendezvous, torchrun.

A ``cpu-thread`` worker (torch device ``cpu:N``; the host CPU is ``cpu``) runs on one intra-op
thread, as the plan times it: ``is_thread_worker`` tells one, ``intra_op_threads`` is the count of a
thread that runs only such workers, ``worker_threads`` runs a body on it. The emitter (``emit``),
``autoplace run`` and the profiler (``profile.timing``) all apply this one rule; the generated
model's ``WorkerThreads`` (``emit/runtime/engine.py``) keeps a copy, as it imports nothing of
autoplace. ``free_port`` is a port for processes of this host to meet on (torchrun's, or the
profiler's all-reduce ranks'). ``torchrun`` starts torchrun's own ``main`` in a copy of this
process, which has imported torch already: milliseconds, not the seconds of ``python -m
torch.distributed.run``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from multiprocessing.process import BaseProcess

import torch

__all__ = [
    "cores_here", "free_port", "intra_op_threads", "is_thread_worker", "torchrun",
    "worker_threads",
]


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
    worker (``emit/runtime/engine.py``); torch's count is restored afterwards, also after an error.
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


def cores_here() -> int:
    """The cores this process may run on (its affinity; ``os.cpu_count`` where that is not
    known)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick), for a rendezvous there
    (torchrun's, or the benchmarks' processes')."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def torchrun(argv: Sequence[str], *, env: Mapping[str, str], log: str | os.PathLike[str]
             ) -> BaseProcess:
    """torchrun with ``argv`` (``torch.distributed.run.main``, what ``torchrun`` and ``python
    -m torch.distributed.run`` run), started in a copy of this process (``fork``: nothing to
    import, nothing of ``__main__`` run again, as the ``spawn`` and ``forkserver`` ways do):
    it leads a session of its own (so its process group is its own to stop), runs in this
    directory with ``env`` as its environment (its workers' too), and writes its output and
    its workers' to the file ``log``. Its exit code is torchrun's: 1 when a worker failed."""
    process = multiprocessing.get_context("fork").Process(
        target=_torchrun, name="torchrun", args=(list(argv), dict(env), os.fspath(log)))
    with warnings.catch_warnings():  # Python 3.12's, for a process with threads: see _torchrun
        warnings.simplefilter("ignore", DeprecationWarning)
        process.start()
    return process


def _torchrun(argv: list[str], env: dict[str, str], log: str) -> None:
    """The body of ``torchrun``'s process. It leaves what the copied process held (its
    threads' locks, as on the streams of ``sys``, and its signal handlers) unused: fresh
    streams on the log, logging's handlers moved to them, the default handlers."""
    os.setsid()
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    old = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
                handler.setStream(sys.stderr)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    from torch.distributed.run import main

    main(argv)
