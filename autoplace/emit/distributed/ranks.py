"""Emit: an inference plan run as one process per planned device (``OUT/launch.py``).

``pipeline.save`` writes ``OUT/launch.py`` for an inference plan of two or more devices
(``write_launch_script``), run as ``torchrun --nproc-per-node N OUT/launch.py``, rank r playing
the plan's r-th device (``ranks_of``). Each rank (``rank_main``) meets the others (gloo on CPUs,
nccl where every rank is a GPU, with a timeout) and starts a ``Watchdog`` that ends it once a
peer's process is gone; loads only its own segments' weights; and runs each pass (``run_pass``):
per micro-batch its segments in the emitted order, each cross-rank input received into a buffer
shaped as the plan's example gave it (``Crossing``), each value another rank reads sent as soon
as it is made, the outputs to rank 0. Every rank walks the same order and never waits on a send,
so passes cannot deadlock. Where the ranks form a chain and M > 1, ``stages`` runs GPipe through
``torch.distributed.pipelining`` instead. ``run_ranks.py`` starts the ranks and checks them.

Read ``Crossing``, ``crossings``, ``value_specs``, then ``rank_main``, ``run_pass`` and
``Watchdog``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pprint
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from string import Template
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist
from torch.fx import _pytree as fx_pytree

from autoplace.cluster.local import worker_threads
from autoplace.emit.device_map import check_device, parse_device_map, remap
from autoplace.emit.distributed.ddp import check_world, print_error
from autoplace.emit.distributed.devices import LaunchDevices, launch_devices, rank_devices
from autoplace.emit.distributed.generate import run_generation
from autoplace.emit.distributed.stages import chain_of, run_stages
from autoplace.emit.files.saving import load_inputs, load_model, read_inputs_file
from autoplace.emit.train.microbatch import batch_size, split_batch
from autoplace.errors import AutoplaceError, EmitError

__all__ = ["INIT_TIMEOUT_S", "Crossing", "LaunchDevices", "Watchdog", "crossings", "flat_inputs",
           "launch_devices", "rank_devices", "rank_main", "run_pass", "shared_torch_device",
           "value_specs",
           "write_launch_script"]

# The rendezvous and every send and receive after it: a peer that never comes, or stops
# answering, makes a rank fail within this rather than wait for ever (``--timeout``).
INIT_TIMEOUT_S = 60.0
# How often the watchdog looks at the peers' processes: a lost rank is named within this.
WATCH_INTERVAL_S = 0.2
# An error raised from a send or receive waits this long for the watchdog to find which peer
# is gone before it names the operation's own peer.
_LOST_GRACE_S = 2.0
# ``launch.py``'s text, its $-placeholders filled by ``write_launch_script``.
_LAUNCH_TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "launch.py.tmpl"


@dataclass(frozen=True)
class Crossing:
    """Value ``value``, made on rank ``src``, read on ranks ``dsts``: a tensor of ``shape`` and
    ``dtype`` (for one micro-batch of the planned example), or a ``constant`` that is the same
    on every pass (a size), which the readers take from here and nobody sends."""

    value: str
    src: int
    dsts: tuple[int, ...]
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    constant: Any = None

    def to_list(self) -> list[Any]:
        return [self.value, self.src, list(self.dsts),
                None if self.shape is None else list(self.shape), self.dtype, self.constant]

    @classmethod
    def of(cls, row: Sequence[Any]) -> Crossing:
        value, src, dsts, shape, dtype, constant = row
        return cls(str(value), int(src), tuple(int(d) for d in dsts),
                   None if shape is None else tuple(int(s) for s in shape), dtype, constant)


def shared_torch_device(torch_devices: Sequence[str], names: Sequence[str]
                        ) -> tuple[str, str, str] | None:
    """The first two devices (of ``names``) whose ``torch_devices`` are one, and that torch
    device; ``None`` where each has its own. The emitted model tells its segments' devices
    apart by torch device only."""
    seen: dict[str, str] = {}
    for device, name in zip(torch_devices, names, strict=True):
        if device in seen:
            return seen[device], name, device
        seen[device] = name
    return None


def ranks_of(torch_devices: Sequence[str], names: Sequence[str]) -> list[str]:
    """The planned torch device of each rank (the cluster's devices in order), checked
    (``shared_torch_device``)."""
    shared = shared_torch_device(torch_devices, names)
    if shared is not None:
        first, second, device = shared
        raise EmitError(f"{first} and {second} are both {device}: one process per device needs "
                        "each device's segments told apart; give them distinct torch_device "
                        "values in the cluster file ([[devices]])")
    return list(torch_devices)


def crossings(segments: Sequence[Mapping[str, Any]], *, ranks: Sequence[str],
              output_names: Sequence[str],
              specs: Mapping[str, Any]) -> list[Crossing]:
    """Every value that crosses ranks, in the order the segments make them: a segment output
    read by a segment of another rank, and each model output made off rank 0 (rank 0 gathers
    the outputs). The model's inputs cross nothing: every rank reads them itself.
    ``specs[value]`` is ``value_specs``'."""
    rank = {device: r for r, device in enumerate(ranks)}
    missing = sorted({str(s["device"]) for s in segments} - set(rank))
    if missing:
        raise EmitError(f"segments are planned on {', '.join(missing)}, which is not one of the "
                        f"ranks' devices ({', '.join(ranks)})")
    made = {name: rank[str(s["device"])] for s in segments for name in s["outputs"]}
    readers: dict[str, set[int]] = {}
    for s in segments:
        for name in s["inputs"]:
            if name in made and made[name] != rank[str(s["device"])]:
                readers.setdefault(name, set()).add(rank[str(s["device"])])
    for name in output_names:
        if name in made and made[name] != 0:
            readers.setdefault(name, set()).add(0)
    found = []
    for s in segments:
        for name in s["outputs"]:
            if name in readers:
                shape, dtype, constant = specs[name]
                if shape is None and not _literal(constant):
                    raise EmitError(f"value {name!r} crosses devices as a "
                                    f"{type(constant).__name__}, which launch.py cannot carry")
                found.append(Crossing(name, made[name], tuple(sorted(readers[name])),
                                      None if shape is None else tuple(shape), dtype,
                                      constant))
    return found


def value_specs(model: torch.nn.Module, args: tuple[Any, ...],
                kwargs: Mapping[str, Any]) -> dict[str, tuple[Any, Any, Any]]:
    """Each segment output of ``model`` (a ``PartitionedModel``) on the example
    ``args``/``kwargs``, run segment by segment: ``(shape, dtype, None)`` for a tensor,
    ``(None, None, value)`` for a constant (a size)."""
    values = dict(zip(model.input_names, flat_inputs(model, args, kwargs)))
    specs: dict[str, tuple[Any, Any, Any]] = {}
    with torch.no_grad():
        for seg in model.segment_info:
            for name, out in zip(seg.outputs, _run_segment(model, seg, values)):
                if isinstance(out, torch.Tensor):
                    specs[name] = (list(out.shape), str(out.dtype).removeprefix("torch."), None)
                else:
                    specs[name] = (None, None, out)
    return specs


def _run_segment(model: torch.nn.Module, seg: Any, values: dict[str, Any]) -> Sequence[Any]:
    """Segment ``seg`` (a ``SegmentInfo``) of ``model`` run on its inputs from ``values``,
    moved to its device; its outputs, which also go into ``values`` by name."""
    segment = getattr(model, f"seg{seg.index}")
    outs = segment(*(_on(values[n], segment.device) for n in seg.inputs))
    values.update(zip(seg.outputs, outs))
    return outs


def _literal(value: Any) -> bool:
    """Whether ``launch.py`` can hold ``value`` as a Python literal."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, list)) and all(_literal(v) for v in value)


def _on(value: Any, device: Any) -> Any:
    """A tensor on the segment's device (the caller's inputs, a value received on the CPU)."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


def flat_inputs(model: torch.nn.Module, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> list[Any]:
    """``args``/``kwargs`` as the graph's inputs, in ``model.input_names``' order."""
    return list(fx_pytree.tree_flatten_spec((list(args), dict(kwargs)), model._in_spec))


def write_launch_script(directory: str | os.PathLike[str], model: torch.nn.Module, *,
                        torch_devices: Sequence[str], names: Sequence[str],
                        example: tuple[tuple[Any, ...], Mapping[str, Any]],
                        hosts: Sequence[str] | None = None,
                        local_devices: Sequence[str] | None = None) -> Path:
    """Write ``directory/launch.py`` (``templates/launch.py.tmpl`` filled in) for ``model``
    (the plan's ``PartitionedModel``, run once on ``example`` for the crossing values' shapes)
    over the plan's devices (``torch_devices``: as the model names them, ``LaunchDevices.ranks``;
    ``hosts`` and ``local_devices``, each rank's host and torch device there, default one host
    and ``torch_devices``); its path."""
    ranks = ranks_of(torch_devices, names)
    hosts = list(hosts) if hosts is not None else ["localhost"] * len(ranks)
    local_devices = list(local_devices) if local_devices is not None else list(ranks)
    literal = pprint.pformat([c.to_list() for c in crossings_of(model, *example, ranks=ranks)],
                             width=90, compact=True)
    prompt = example[0][0] if example[0] else None  # a --generate plan's decode pass's too
    decode = None if getattr(model, "decode", None) is None else pprint.pformat([
        c.to_list() for c in crossings_of(model.decode, (prompt[:, -1:], torch.tensor(
            [prompt.shape[1]])), {}, ranks=ranks)], width=90, compact=True)
    path = Path(directory) / "launch.py"
    path.write_text(Template(_LAUNCH_TEMPLATE.read_text()).substitute(
        world=len(ranks), ranks=repr(list(ranks)), names=repr(list(names)),
        devices=repr(local_devices), hosts=repr(hosts),
        crossings=literal.replace("\n", "\n" + " " * len("CROSSINGS = ")),
        decode=repr(None) if decode is None else decode.replace(
            "\n", "\n" + " " * len("DECODE_CROSSINGS = "))))
    return path


def crossings_of(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                 ranks: Sequence[str]) -> list[Crossing]:
    """``crossings`` of ``model`` over ``ranks``, shaped by one pass on ``args``/``kwargs``."""
    return crossings([s.to_dict() for s in model.segment_info], ranks=ranks,
                     output_names=model.output_names, specs=value_specs(model, args, kwargs))


class Watchdog:
    """Ends this rank, naming the lost one, once a peer's process on this host is gone (or a
    zombie): every ``WATCH_INTERVAL_S`` it reads ``/proc/PID/stat`` of each peer on this host.
    Peers on other hosts are not watched: an operation with them fails after the timeout."""

    def __init__(self, *, rank: int, names: Sequence[str], peers: Sequence[tuple[str, int]],
                 say: Callable[[str], None]) -> None:
        self.rank, self.names, self.say = rank, names, say
        here = socket.gethostname()
        self.watched = {r: pid for r, (host, pid) in enumerate(peers) if host == here and r != rank}
        self.at_barrier = threading.Event()  # this rank waits at the barrier after its last pass
        self.finished = threading.Event()  # ... and is through it
        self._thread = threading.Thread(target=self._watch, daemon=True, name="autoplace-watch")

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def lost(self) -> tuple[int, int] | None:
        """``(rank, pid)`` of a peer whose process is gone, or ``None``."""
        for r, pid in self.watched.items():
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                return r, pid
            if state in ("Z", "X"):
                return r, pid
        return None

    def message(self, gone: tuple[int, int]) -> str:
        r, pid = gone
        return (f"rank {self.rank} ({self.names[self.rank]}) stops: lost rank {r} "
                f"({self.names[r]}, pid {pid}), whose process ended during the run")

    def _watch(self) -> None:
        while not self.finished.wait(WATCH_INTERVAL_S):
            gone = self.lost()
            if gone is None:
                continue
            # At the last barrier a peer through it may end before this rank returns from it:
            # lost only if this rank is not through within the grace.
            if self.at_barrier.is_set() and self.finished.wait(_LOST_GRACE_S):
                return
            if not self.finished.is_set():
                self.say(self.message(gone))
                os._exit(3)

    def explain(self, error: BaseException, peer: int | None) -> AutoplaceError:
        """The error of a failed send or receive: the lost rank where the watchdog finds one
        within ``_LOST_GRACE_S``, else the operation's own peer."""
        deadline = time.monotonic() + _LOST_GRACE_S
        while time.monotonic() < deadline:
            gone = self.lost()
            if gone is not None:
                return EmitError(self.message(gone))
            time.sleep(WATCH_INTERVAL_S / 2)
        who = "" if peer is None else f" with rank {peer} ({self.names[peer]})"
        return EmitError(f"rank {self.rank} ({self.names[self.rank]}): an exchange{who} failed: "
                         f"{type(error).__name__}: {str(error).strip().splitlines()[0]}")


@dataclass
class Exchange:
    """This rank's sends and receives of one pass: ``pending`` sends are waited for at the end
    (a send never blocks the rank), receives block until their value is in."""

    rank: int
    table: Sequence[Crossing]  # every value that crosses ranks (``crossings``)
    microbatches: int
    watchdog: Watchdog | None = None
    device: str = "cpu"  # where receives land (nccl moves CUDA tensors only)

    def __post_init__(self) -> None:
        self.pending: list[tuple[Any, int]] = []
        self.crossings = {c.value: c for c in self.table}
        self.index = {c.value: i for i, c in enumerate(self.table)}  # a value's tags follow it

    def tag(self, value: str, k: int) -> int:
        return self.index[value] * self.microbatches + k

    def send(self, value: str, k: int, tensor: Any) -> None:
        c = self.crossings[value]
        if c.constant is not None or not isinstance(tensor, torch.Tensor):
            return
        self.send_tensor(tensor, dsts=c.dsts, tag=self.tag(value, k))

    def receive(self, value: str, k: int) -> Any:
        c = self.crossings[value]
        if c.shape is None:
            return c.constant
        return self.receive_tensor(src=c.src, tag=self.tag(value, k), shape=c.shape,
                                   dtype=c.dtype or "float32")

    def send_tensor(self, tensor: torch.Tensor, *, dsts: Sequence[int], tag: int) -> None:
        """Send ``tensor`` to each of ``dsts`` without waiting (``finish`` waits), from where the
        backend takes it."""
        data = tensor.detach().contiguous()
        if self.device == "cpu":  # gloo sends from the CPU (a rank's GPU tensor goes via it)
            data = data.to("cpu")
        for dst in dsts:
            with self.named(dst):
                self.pending.append((dist.isend(data, dst, tag=tag), dst))

    def receive_tensor(self, *, src: int, tag: int, shape: Sequence[int],
                       dtype: str) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` from rank ``src``, received on ``device`` (the
        backend's: nccl moves CUDA tensors only)."""
        buffer = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=self.device)
        with self.named(src):
            dist.recv(buffer, src, tag=tag)
        return buffer

    def gathered_tag(self, position: int) -> int:
        """The tag of the model's output ``position`` sent whole (every micro-batch in one
        tensor) to rank 0 by the last of a chain of stages: after every value's ``tag``."""
        return len(self.index) * self.microbatches + position

    def finish(self) -> None:
        for work, dst in self.pending:
            with self.named(dst):
                work.wait()
        self.pending.clear()

    @contextlib.contextmanager
    def named(self, peer: int | None) -> Iterator[None]:
        try:
            yield
        except (RuntimeError, dist.DistError) as error:
            if self.watchdog is None:
                raise
            raise self.watchdog.explain(error, peer) from error


def run_pass(model: torch.nn.Module, batches: Sequence[list[Any]], exchange: Exchange, *,
             mine: str | None) -> dict[str, Any]:
    """One pass of ``batches`` (each micro-batch's inputs, ``flat_inputs``'), GPipe's order: per
    micro-batch, this rank's segments (those planned on ``mine``; every segment where ``mine``
    is ``None``) in the emitted order. Returns, on rank 0, each micro-batch's outputs by name
    (a list per output name)."""
    info = model.segment_info
    outputs: dict[str, list[Any]] = {name: [] for name in model.output_names}
    for k, flat in enumerate(batches):
        values = dict(zip(model.input_names, flat))
        for seg in info:
            if mine is not None and seg.planned_device != mine:
                continue
            for n in seg.inputs:
                if n not in values:  # from another rank: received once, read by every segment
                    values[n] = exchange.receive(n, k)
            for name, out in zip(seg.outputs, _run_segment(model, seg, values)):
                if name in exchange.crossings:
                    exchange.send(name, k, out)
        if exchange.rank == 0:
            for name in model.output_names:
                outputs[name].append(values[name] if name in values
                                     else exchange.receive(name, k))
    exchange.finish()
    return outputs


def rank_main(model_dir: str | os.PathLike[str], argv: Sequence[str], *, ranks: Sequence[str],
              names: Sequence[str], crossings: Sequence[Sequence[Any]],
              devices: Sequence[str] | None = None, hosts: Sequence[str] | None = None,
              decode_crossings: Sequence[Sequence[Any]] | None = None) -> int:
    """One process of ``torchrun --nproc-per-node N launch.py``: the exit code. An
    ``AutoplaceError`` is printed as one line, ``autoplace: error: KIND: message`` (the line
    ``replicas.launch_replicas`` looks for), and exits with 2."""
    world = len(ranks)
    parser = argparse.ArgumentParser(
        prog="launch.py", description=f"Run {model_dir} as {world} processes, one per planned "
        f"device; under torchrun --nproc-per-node {world}.")
    parser.add_argument("--warmup", type=int, default=1, metavar="N")
    parser.add_argument("--repeats", type=int, default=5, metavar="N")
    parser.add_argument("--microbatches", type=int, default=1, metavar="M",
                        help="run a batch of M micro-batches, each of the planned example's "
                        "shape, pipelined (GPipe); the batch is --inputs or the example M times")
    parser.add_argument("--pipelining", choices=("auto", "torch", "sendrecv"), default="auto",
                        help="with M > 1: torch.distributed.pipelining's ScheduleGPipe where "
                        "the ranks form a chain of stages (auto, torch), or this module's "
                        "send/recv (sendrecv)")
    parser.add_argument("--inputs", metavar="FILE.safetensors",
                        help="the batch (input_names' names, dimension 0 M times the example's)")
    parser.add_argument("--timeout", type=float, default=INIT_TIMEOUT_S, metavar="SECONDS",
                        help="the rendezvous and each exchange fail after this")
    parser.add_argument("--device-map", metavar="JSON",
                        help="where each planned torch device runs here, as load_model's "
                        "device_map: globs, the first match wins, e.g. '{\"cuda:*\": \"cpu\"}' "
                        "to rehearse a GPU plan on CPU ranks (default: the planned devices)")
    parser.add_argument("--generate", type=int, metavar="N", help="a --generate plan: "
                        "generate N tokens after the saved prompt, timed per token")
    parser.add_argument("--outputs", metavar="FILE", help="rank 0 writes the outputs here")
    parser.add_argument("--json", metavar="FILE", help="rank 0 writes its times here")
    options = parser.parse_args(list(argv))
    rank = int(os.environ.get("RANK", "-1"))

    def say(message: str) -> None:
        print_error("EmitError", message)

    try:
        check_world(rank, world, what=f"runs as {world} processes", script="launch.py")
        if options.repeats < 1 or options.warmup < 0 or options.microbatches < 1:
            raise AutoplaceError("--repeats and --microbatches must be 1 or more, --warmup 0 or "
                                 "more")
        placed = rank_devices(rank, ranks=ranks, devices=devices or ranks,
                              hosts=hosts or ["localhost"] * world, names=names,
                              local_rank=int(os.environ.get("LOCAL_RANK", rank)),
                              local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        options.decode_table = [Crossing.of(row) for row in decode_crossings or ()]
        report = _run(Path(model_dir), options, rank=rank, ranks=ranks, names=names,
                      table=[Crossing.of(row) for row in crossings], say=say, placed=placed)
    except AutoplaceError as error:
        print_error(type(error).__name__, error)
        return 2
    if rank == 0:
        if options.json:
            Path(f"{options.json}.partial").write_text(json.dumps(report) + "\n")
            os.replace(f"{options.json}.partial", options.json)
        print(f"ran {world} processes ({report['backend']}, {report['pipelining']}), "
              f"{options.microbatches} micro-batch(es) a batch: "
              f"{report['measured_s'] * 1e3:.3f} ms a batch (median of {options.repeats})",
              flush=True)
    return 0


def _run(model_dir: Path, options: argparse.Namespace, *, rank: int, ranks: Sequence[str],
         names: Sequence[str], table: Sequence[Crossing], say: Callable[[str], None],
         placed: Sequence[str]) -> dict[str, Any]:
    """This rank's part (each rank on its ``placed`` device, ``rank_devices``', remapped):
    meet, watch, load, run the passes, report (rank 0)."""
    mine = ranks[rank]
    device_map = parse_device_map(options.device_map) if options.device_map else None
    on = [remap(device, device_map) for device in placed]  # every rank's, to agree on nccl
    try:
        check_device(on[rank], planned=mine, option="--device-map")
    except EmitError as error:
        raise EmitError(f"rank {rank} ({names[rank]}): {error}") from None
    backend = "nccl" if all(torch.device(d).type == "cuda" for d in on) else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(on[rank]))
    # torchrun stops the ranks with SIGTERM when one fails: say so, naming the lost rank once
    # the watchdog knows the peers.
    watching: list[Watchdog] = []
    signal.signal(signal.SIGTERM, lambda *_: _stopped(watching, say, rank=rank, names=names))
    timeout = datetime.timedelta(seconds=options.timeout)
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        dist.init_process_group(backend, timeout=timeout)
    except (RuntimeError, dist.DistError) as error:
        raise EmitError(f"rank {rank} ({names[rank]}) could not reach its peers at {where} "
                        f"within {options.timeout:g} s: {str(error).strip().splitlines()[0]}; "
                        f"start all {len(ranks)} ranks, or raise --timeout") from error
    peers: list[Any] = [None] * len(ranks)
    dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
    watchdog = Watchdog(rank=rank, names=names, peers=peers, say=say).start()
    watching.append(watchdog)
    try:
        # The other ranks' segments stay on meta (``devices``), their device never touched.
        load_map = {device: on[rank] if device == mine else "cpu" for device in ranks}
        model = load_model(model_dir, devices=[mine], device_map=load_map)
        batches, rows = _batches(model, model_dir, options)
        stages = chain_of(model, table, rank=rank, ranks=ranks, first=batches[0], rows=rows) \
            if options.microbatches > 1 and options.pipelining != "sendrecv" else None
        if options.pipelining == "torch" and stages is None:
            raise EmitError("--pipelining torch needs ranks that form a chain of stages, M > 1 "
                            "and tensors cut along the batch; this plan's do not")
        exchange = Exchange(rank, table, options.microbatches, watchdog,
                            on[rank] if backend == "nccl" else "cpu")
        with worker_threads([on[rank]]):
            if options.generate:  # emit.distributed.generate
                passes = (exchange, replace(exchange, table=options.decode_table))
                times, outputs = run_generation(
                    model, model_dir, new_tokens=options.generate, rank=rank,
                    device=exchange.device, device_map=load_map,
                    run=lambda m, inputs, k: run_pass(m, [flat_inputs(m, inputs, {})],
                                                      passes[k], mine=mine))
            else:
                times, outputs = _passes(
                (lambda: run_stages(model, batches, stages, exchange)) if stages is not None
                else (lambda: run_pass(model, batches, exchange, mine=mine)),
                exchange, warmup=options.warmup, repeats=options.repeats)
        # A peer through the last barrier may end before this rank returns from it: the
        # watchdog, told this rank is there, gives it ``_LOST_GRACE_S`` to get through before
        # naming that peer lost.
        watchdog.at_barrier.set()
        with exchange.named(None):
            dist.barrier()
    finally:
        watchdog.finished.set()
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0 and options.outputs:
        flat = {f"{name}.{k}": v.detach().to("cpu").contiguous() for name, vs in outputs.items()
                for k, v in enumerate(vs) if isinstance(v, torch.Tensor)}
        partial = f"{options.outputs}.partial"  # renamed into place: never half-written
        safetensors.torch.save_file(flat, partial)
        os.replace(partial, options.outputs)
    return {"times_s": times, "measured_s": statistics.median(times), "backend": backend,
            "world": len(ranks), "microbatches": options.microbatches,
            "pipelining": "torch.distributed.pipelining ScheduleGPipe" if stages is not None
            else "send/recv", "ranks": list(ranks), "names": list(names), "devices": on}


def _stopped(watching: Sequence[Watchdog], say: Callable[[str], None], *, rank: int,
             names: Sequence[str]) -> None:
    """SIGTERM (torchrun stopping the ranks after one failed): say which rank was lost, where
    the watchdog (started once the ranks have met) can tell."""
    gone, deadline = None, time.monotonic() + 0.5  # torchrun may signal before it reaps
    while watching and gone is None and time.monotonic() < deadline:
        gone = watching[0].lost() or time.sleep(WATCH_INTERVAL_S / 4)
    if not (watching and watching[0].finished.is_set()):
        say(watching[0].message(gone) if gone is not None else
            f"rank {rank} ({names[rank]}) stopped by torchrun (SIGTERM): another rank failed")
    os._exit(3)


def _batches(model: torch.nn.Module, model_dir: Path,
             options: argparse.Namespace) -> tuple[list[list[Any]], int]:
    """The micro-batches' flat inputs, and the rows of one (the planned example's batch)."""
    example = load_inputs(model_dir)
    if example is None:
        raise EmitError(f"{model_dir} holds no example inputs (inputs.safetensors): plan again")
    count = options.microbatches
    args, kwargs = repeated(example, count)
    if options.inputs:
        # Checked against the batch here too (``run_ranks`` did, before any rank started):
        # launch.py may be run by hand.
        args, kwargs = read_inputs_file(options.inputs, example=(args, kwargs))
    parts = split_batch(args, kwargs, count)
    rows = _rows(example)
    return [flat_inputs(model, a, kw) for a, kw in parts], rows


def repeated(example: tuple[tuple[Any, ...], dict[str, Any]],
             count: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example`` with every batched tensor (``microbatch.batch_size``'s rule) ``count`` times
    along dimension 0: the shape of a batch of ``count`` micro-batches."""
    if count == 1:
        return example
    rows = _rows(example)
    args, kwargs = torch.utils._pytree.tree_map(
        lambda x: torch.cat([x] * count) if isinstance(x, torch.Tensor) and x.dim()
        and x.shape[0] == rows else x, example)
    return tuple(args), dict(kwargs)


def _rows(example: tuple[tuple[Any, ...], dict[str, Any]]) -> int:
    return batch_size(example, parts=1)


def _passes(once: Callable[[], dict[str, Any]], exchange: Exchange, *, warmup: int,
            repeats: int) -> tuple[list[float], dict[str, Any]]:
    """``warmup`` then ``repeats`` passes, the ranks meeting (a barrier) before each; a pass is
    timed from the barrier to its outputs on rank 0 and its sends done elsewhere (on a GPU,
    its queued work finished)."""
    times, outputs = [], {}
    with torch.no_grad():
        for i in range(warmup + repeats):
            with exchange.named(None):
                dist.barrier()
            began = time.perf_counter()
            outputs = once()
            if exchange.device.startswith("cuda"):  # nccl queues the receives on the GPU
                torch.cuda.synchronize(exchange.device)
            if i >= warmup:
                times.append(time.perf_counter() - began)
    return times, outputs
