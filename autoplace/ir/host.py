"""The host threads' costs (``HostCosts``): what the threads that call a device's segments pay
beside the device's own time, which ``simulate.launch`` charges and ``Problem.launchers`` names.
Kept apart from the rest of the IR, which holds it in ``Costs.host``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["HostCosts"]


@dataclass(frozen=True)
class HostCosts:
    """What the host thread that launches a device's work pays, for devices whose work is
    launched asynchronously (GPUs): the emitted runtime issues every GPU's segments from one
    thread per host, so these times add up across devices where the devices' own times overlap.

    ``launch_s[node][device]``: the node's kernel launches (dispatch and ``cudaLaunchKernel``),
    at most its ``compute_s`` there; ``call_s[device]``: one segment call (the generated Python
    around it); ``handover_s[device]``: issuing one copy of a value to another device (stream
    wait, copy, event). A device absent from ``call_s`` has no launcher: its own thread does all
    of its work, and ``compute_s`` is all there is (the host CPU).

    The devices of ``own_thread`` (CPU workers, ``cpu-thread`` and ``cpu-process``) run on a
    thread of their own, which waits for a segment's inputs, calls it, runs its ops and hands
    its values over (``emit.runtime.engine._work``): their calls and handovers are paid between
    their own ops. ``own_thread[device]`` names what those calls, handovers and each op's
    dispatch (``launch_s``, within its ``compute_s``) hold: the Python interpreter of the
    worker's process, which the ``cpu-thread`` workers of one process share (its lock), while
    a ``cpu-process`` worker has one to itself (named as the device). ``switch_s[device]``:
    what the device's thread pays to take that interpreter over from another thread that
    holds it when it wants it (the lock's hand-off: a wake-up and a thread switch).
    """

    launch_s: Mapping[str, Mapping[str, float]]
    call_s: Mapping[str, float]
    handover_s: Mapping[str, float]
    own_thread: Mapping[str, str] = field(default_factory=dict)
    switch_s: Mapping[str, float] = field(default_factory=dict)

    def launch_of(self, node: str, device: str) -> float:
        return self.launch_s.get(node, {}).get(device, 0.0)

    def grouped(self, members: Mapping[str, Sequence[str]]) -> HostCosts:
        """The launches of groups of nodes (``members[group]``, as coarsening folds them)."""
        launch_s: dict[str, dict[str, float]] = {}
        for group, names in members.items():
            per_device: dict[str, float] = {}
            for name in names:
                for device, secs in self.launch_s.get(name, {}).items():
                    per_device[device] = per_device.get(device, 0.0) + secs
            if per_device:
                launch_s[group] = per_device
        return HostCosts(launch_s=launch_s, call_s=self.call_s, handover_s=self.handover_s,
                         own_thread=self.own_thread, switch_s=self.switch_s)

    def restricted(self, devices: Iterable[str]) -> HostCosts | None:
        """The same on ``devices`` only; ``None`` when none of them has a launcher."""
        keep = set(devices) & set(self.call_s)
        if not keep:
            return None
        return HostCosts(
            launch_s={n: {d: t for d, t in per.items() if d in keep}
                      for n, per in self.launch_s.items()},
            call_s={d: t for d, t in self.call_s.items() if d in keep},
            handover_s={d: t for d, t in self.handover_s.items() if d in keep},
            own_thread={d: t for d, t in self.own_thread.items() if d in keep},
            switch_s={d: t for d, t in self.switch_s.items() if d in keep})
