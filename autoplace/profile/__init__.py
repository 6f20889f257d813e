"""Measured costs: profile a traced model on the devices that are here, measure the links between
them, and calibrate the roofline for the devices that are not.

Part of the pipeline's cost stage: ``autoplace.pipeline.plan`` calls ``profile_model`` after
tracing when asked to (``--profile``), and ``autoplace.profile.cost.costs`` then takes each node's
measured time where there is one, a calibrated one where a fit exists, and the analytic roofline
otherwise. ``autoplace profile`` runs this stage alone.

What is here (the host, the GPUs, which planned devices can be profiled) comes from
``autoplace.cluster.detect``, the detector device specs use too.

Read in this order: ``timing`` (clocks and the stable-median loop),
``ops`` (one device, op by op), ``links`` (copies between devices), ``cache`` (the SQLite file
that keeps all of it across runs and models), ``calibrate`` (fits), then ``profile_model`` below.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autoplace.cluster import Inventory, device_key, inventory, present_devices
from autoplace.cluster.spec import WORKER_TYPES
from autoplace.ir import Cluster, Device, Link, OpGraph
from autoplace.profile.cache import LinkRecord, ProfileCache, default_cache_path
from autoplace.profile.calibrate import Comparison, compare, fits_for, refit
from autoplace.profile.launcher import measure_launcher, measure_worker
from autoplace.profile.links import measure_handover, measure_link
from autoplace.profile.ops import DeviceProfile, Progress, profile_device
from autoplace.profile.timing import Timer, is_thread_worker, threads_for
from autoplace.progress import paused
from autoplace.trace import TracedModel
from cost_models import get_device_type
from cost_models.calibration import CalibrationFit

__all__ = ["ProfileCache", "ProfileResult", "default_cache_path", "open_cache",
           "profile_model"]


@dataclass(frozen=True, kw_only=True)
class ProfileResult:
    """What profiling found: per-device op times, measured links, the calibration fits that
    apply to the cluster, predictions against measurements, and notes for the user."""

    devices: tuple[DeviceProfile, ...] = ()
    links: tuple[Link, ...] = ()
    fits: Mapping[str, CalibrationFit] = field(default_factory=dict)
    comparisons: tuple[Comparison, ...] = ()
    inventory: Inventory | None = None
    # (segment call, handover) seconds of the launcher thread, measured on a GPU here
    # (``launcher.measure_launcher``); None without one.
    launcher: tuple[float, float] | None = None
    # A CPU worker's (segment call, handover, op dispatch, interpreter switch) seconds
    # (``launcher.measure_worker``); None without one.
    worker: tuple[float, float, float, float] | None = None
    cache: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0

    def measured(self) -> dict[str, dict[str, float]]:
        """``measured[node][device]`` seconds, for ``autoplace.profile.cost.costs``: each op's
        median, on a CPU scaled to the whole forward pass (``DeviceProfile.whole_scale``)."""
        out: dict[str, dict[str, float]] = {}
        for dp in self.devices:
            scale = dp.whole_scale
            for node, op in dp.ops.items():
                out.setdefault(node, {})[dp.device] = op.median_s * scale
        return out

    def with_workspace(self, graph: OpGraph) -> OpGraph:
        """``graph`` with each op's ``workspace_bytes`` raised to the largest workspace measured
        for it on any device (a GPU's allocator peak above inputs and outputs, see
        ``ops._memory``), which the simulator charges while the op runs. Ops measured on the CPU
        only, or not at all, keep what the trace found (``docs/profiling.md``)."""
        most: dict[str, int] = {}
        for dp in self.devices:
            for node, op in dp.ops.items():
                if op.workspace_bytes:
                    most[node] = max(most.get(node, 0), op.workspace_bytes)
        if not most:
            return graph
        return replace(graph, nodes=tuple(
            replace(n, workspace_bytes=max(n.workspace_bytes, most[n.name]))
            if n.name in most else n
            for n in graph.nodes))

    def apply_links(self, cluster: Cluster) -> Cluster:
        """``cluster`` with every link that was measured replaced by the measurement."""
        measured = {(lk.src, lk.dst): lk for lk in self.links}
        if not measured:
            return cluster
        return replace(cluster, links=tuple(measured.get((lk.src, lk.dst), lk)
                                            for lk in cluster.links))

    def to_dict(self) -> dict[str, Any]:
        """The ``profile`` section of ``plan.json``."""
        return {
            "devices": [{
                "device": dp.device, "device_key": dp.device_key, "device_type": dp.device_type,
                "ops_measured": len(dp.ops), "measured_now": dp.measured_now,
                "from_cache": dp.from_cache, "unmeasured": list(dp.unmeasured),
                "sum_of_ops_s": dp.sum_s,
                "whole_forward_s": dp.whole_forward.median_s if dp.whole_forward else None,
                "whole_forward_spread": dp.whole_forward.spread if dp.whole_forward else None,
                "wall_s": dp.wall_s,
            } for dp in self.devices],
            "links": [{"src": lk.src, "dst": lk.dst, "latency_s": lk.latency_s,
                       "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s} for lk in self.links],
            "calibration": {name: f.to_dict() for name, f in self.fits.items()},
            "comparisons": [c.to_dict() for c in self.comparisons],
            "cache": dict(self.cache),
            "wall_s": self.wall_s,
        }

    def lines(self) -> list[str]:
        """The terminal summary of ``autoplace profile``."""
        out = []
        for dp in self.devices:
            out.append(f"{dp.device} ({dp.device_key}): {len(dp.ops)} ops, {dp.measured_now} "
                       f"measured now, {dp.from_cache} from the cache, in {dp.wall_s:.1f} s")
            out.append(f"  ops one by one add up to {dp.sum_s * 1e3:.3f} ms")
            whole = dp.whole_forward
            if whole is not None:
                out.append(f"  whole forward pass: {whole.median_s * 1e3:.3f} ms (median of "
                           f"{whole.samples}, spread {whole.spread:.0%}); the sum is "
                           f"{_signed(dp.sum_s / whole.median_s - 1)} of it")
        for c in self.comparisons:
            out.append(f"calibrated {c.device_type} on {c.device}: predicts "
                       f"{c.calibrated_s * 1e3:.3f} ms for the {c.ops} measured ops "
                       f"({_signed(c.error)}); median error per op {c.op_error:.0%}")
        for lk in self.links:
            out.append(f"link {lk.src} -> {lk.dst}: {lk.latency_s * 1e6:.1f} us + bytes / "
                       f"{lk.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
        return out


def _signed(x: float) -> str:
    return f"{x:+.1%}"


def open_cache(*, use_cache: bool = True, path: str | None = None) -> ProfileCache:
    """The profile cache: at ``path``, the default location, or in memory with
    ``use_cache=False``."""
    where = None if not use_cache else (path or default_cache_path())
    return ProfileCache(where, torch_version=torch.__version__)


@contextlib.contextmanager
def _progress_bar(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    if not console.is_terminal:  # a log or a pipe gets the summary, not a bar's redraws
        yield None
        return
    bar = Progress(TextColumn("[bold]profiling[/] {task.description}"), BarColumn(),
                   MofNCompleteColumn(), console=console, transient=True)
    with paused(), bar:  # rich shows one live display at a time: the CLI's waits
        yield bar


def profile_model(
    traced: TracedModel,
    model: torch.nn.Module | None,
    args: tuple,
    kwargs: Mapping[str, Any],
    cluster: Cluster,
    *,
    cache: ProfileCache,
    links: bool = True,
    progress: bool = False,
    timer: Timer | None = None,
    inv: Inventory | None = None,
    in_situ: bool | None = None,
    engine: Mapping[str, Any] | None = None,
) -> ProfileResult:
    """Profile ``traced`` on every device of ``cluster`` that is here, measure the links among
    them, refit calibration, and choose fits for the devices that are not here.

    Devices that are not here are named in the notes; with none here, only stored calibration
    applies. Models whose parameters are on the meta device cannot run, so nothing is measured.
    Identical devices (two GPUs of one model) are measured once. ``in_situ``: see
    ``ops.profile_device`` (by default ops are timed where they run on the CPU, alone on GPUs).
    ``engine``: the emitted runtime's engine (``emit.codegen.source.runtime_namespace()``), whose
    launcher costs are measured on a GPU here (``launcher.measure_launcher``), and a CPU
    worker's where one is here (``launcher.measure_worker``); without it they are not, and the
    catalog's estimates apply.
    """
    began = time.perf_counter()
    inv = inv or inventory()
    notes = list(cache.notes)
    present, absent = present_devices(cluster, inv)
    notes += [f"not profiled: {why}" for why in absent]
    if traced.has_meta_params and present:
        notes.append("not profiled: the parameters are on the meta device, so no op can run")
        present = []
    profiles: list[DeviceProfile] = []
    measured_keys: dict[str, DeviceProfile] = {}
    with _progress_bar(progress and bool(present)) as bar:
        for device in present:
            key = device_key(device.torch_device, inv)
            twin = measured_keys.get(key)
            if twin is not None:
                profiles.append(DeviceProfile(**{**twin.__dict__, "device": device.name,
                                                 "torch_device": device.torch_device,
                                                 "notes": ()}))
                notes.append(f"{device.name} is the same hardware as {twin.device} "
                             f"({key}): it uses the same measurements")
                continue
            report: Progress | None = None
            if bar is not None:
                task = bar.add_task(device.name, total=None)

                def report(op: str, done: int, total: int, task: Any = task,
                           name: str = device.name) -> None:
                    bar.update(task, description=f"{op} on {name}", completed=done,
                               total=total)

            with threads_for(device.torch_device):
                dp = profile_device(traced, model, args, kwargs, device=device,
                                    device_key=key, cache=cache, timer=timer, progress=report,
                                    in_situ=in_situ)
            profiles.append(dp)
            measured_keys[key] = dp
            notes += list(dp.notes)
            refit(cache, device_type=device.type, device_key=key)
            if dp.whole_forward is not None and dp.ops:
                notes.append(
                    f"on {device.name}, the {len(dp.ops)} ops timed one by one add up to "
                    f"{dp.sum_s * 1e3:.3g} ms; the whole forward pass took "
                    f"{dp.whole_forward.median_s * 1e3:.3g} ms "
                    f"({_signed(dp.sum_s / dp.whole_forward.median_s - 1)})"
                    + (f"; the plan takes each op's time x{dp.whole_scale:.3g}, so that they "
                       "add up to the whole pass" if dp.whole_scale > 1 else ""))
    measured_links = _links(present, inv, cache=cache, notes=notes) if links else ()
    launched = _launcher(present, notes, engine)
    worker = _worker(present, notes, engine)
    fits, fit_notes = fits_for(cluster, cache.get_fits())
    notes += fit_notes
    comparisons = []
    for dp in profiles:
        fitted = fits.get(dp.device_type)
        if fitted is None or dp.device not in cluster.names:
            continue
        c = compare(traced.graph, {n: p.median_s for n, p in dp.ops.items()}, fitted,
                    device=dp.device, device_type=dp.device_type)
        if c is not None:
            comparisons.append(c)
    return ProfileResult(devices=tuple(profiles), links=measured_links, fits=fits,
                         comparisons=tuple(comparisons), inventory=inv, launcher=launched,
                         worker=worker,
                         cache=cache.describe(), notes=tuple(dict.fromkeys(notes)),
                         wall_s=time.perf_counter() - began)


def _launcher(present: Sequence[Device], notes: list[str],
              engine: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """The launcher's segment call and handover, measured by ``engine`` on the first GPU here;
    they are the host's, so they serve every GPU the plan launches from it."""
    gpu = next((d for d in present if d.torch_device.startswith("cuda")), None)
    if gpu is None or engine is None:
        return None
    try:
        call_s, handover_s = measure_launcher(gpu.torch_device, engine=engine)
    except Exception as exc:  # noqa: BLE001 - the catalog's estimates still apply
        notes.append(f"the launcher's costs could not be measured on {gpu.name} "
                     f"({type(exc).__name__}: {exc}); the catalog's estimates apply")
        return None
    notes.append(f"launcher measured on {gpu.name}: a segment call {call_s * 1e6:.1f} us, a "
                 f"handover {handover_s * 1e6:.1f} us")
    return call_s, handover_s


def _worker(present: Sequence[Device], notes: list[str],
            engine: Mapping[str, Any] | None) -> tuple[float, float, float, float] | None:
    """A CPU worker's segment call, handover, op dispatch and interpreter switch, measured by
    ``engine`` on this thread, where a CPU worker is here."""
    if engine is None or not any(get_device_type(d.type).name in WORKER_TYPES for d in present):
        return None
    measured = measure_worker(engine=engine)
    notes.append("a CPU worker measured: a segment call {:.1f} us, a handover {:.1f} us, an "
                 "op's dispatch {:.1f} us, taking the interpreter from another thread "
                 "{:.1f} us".format(*(t * 1e6 for t in measured)))
    return measured


def _links(present: Sequence[Device], inv: Inventory, *, cache: ProfileCache,
           notes: list[str]) -> tuple[Link, ...]:
    """Measure (or read from the cache) the link of every ordered pair of present devices."""
    out = []
    for src in present:
        for dst in present:
            if src.name == dst.name or src.torch_device == dst.torch_device:
                continue
            if src.type == dst.type == "cpu-process":  # gloo ranks: the catalog's measured link
                continue
            threads = is_thread_worker(src.torch_device) and is_thread_worker(dst.torch_device)
            # Threads taking turns (``measure_handover``), not a record of an older rule.
            woken = "+turns" if threads else ""
            src_key = f"{device_key(src.torch_device, inv)}@{src.torch_device}{woken}"
            dst_key = f"{device_key(dst.torch_device, inv)}@{dst.torch_device}{woken}"
            record = cache.get_link(src_key, dst_key)
            if record is None:
                try:
                    with threads_for(src.torch_device):
                        latency, bandwidth, points = measure_link(src.torch_device,
                                                                  dst.torch_device)
                    if threads:
                        # No bytes move between worker threads; the handover's wake-up is the
                        # latency, the copy's bandwidth stays as an upper bound.
                        latency = measure_handover()
                except Exception as exc:
                    notes.append(f"the link {src.name} -> {dst.name} could not be measured "
                                 f"({type(exc).__name__}: {exc}); it keeps the catalog figures")
                    continue
                record = LinkRecord(src_key=src_key, dst_key=dst_key, latency_s=latency,
                                    bandwidth_bytes_per_s=bandwidth, points=points)
                cache.put_link(record)
            out.append(Link(src=src.name, dst=dst.name,
                            bandwidth_bytes_per_s=record.bandwidth_bytes_per_s,
                            latency_s=record.latency_s, kind="measured"))
    return tuple(out)
