"""What the stages tell a person: the notes a plan carries (``notes.py``) and, here, progress at
a terminal: the pipeline's stage running and, while solving, the best plan and bound so far.

The stages say where they are with plain calls: ``stage`` (load, trace, profile, cost, fold,
solve, emit, verify, report), ``phase`` (a part of a stage: a what-if row, the plan's own solve),
``solving`` (a solve starts, with its time limit) and ``solver`` (a better plan or bound). They go
to the ``Reporter`` installed for the current context by ``reporting``; by default none is, and
each call returns at once, so the Python API and the tests print nothing. The CLI installs a
``LiveReporter`` (rich's live display, on stderr) when stderr is a terminal and ``--quiet`` is
not given: stdout, the summary, is untouched, and the display is gone before the summary prints.
CP-SAT reports from its own threads, where this context's reporter is not visible: a caller
there takes ``current_reporter()`` first. rich allows one live display at a time, so another
(the profiling bar) runs inside ``paused()``. Read ``Reporter``, then ``LiveReporter``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["LiveReporter", "Reporter", "Status", "current_reporter", "live_reporter", "paused",
           "phase", "reporting", "solver", "solving", "stage"]

# Redraws a second: enough for the spinner and a countdown in tenths, cheap beside CP-SAT.
REFRESH_PER_S = 8


@dataclass(frozen=True)
class Status:
    """What a display shows: the stage, how long it has run, the phase within it, and while
    solving the best objective and bound so far (seconds; ``None`` before there is one) and the
    seconds left to the solve (``None`` where its limit is not wall time: ``--deterministic``)."""

    stage: str | None
    stage_s: float
    phase: str | None = None
    best_s: float | None = None
    bound_s: float | None = None
    left_s: float | None = None


class Reporter:
    """Keeps the ``Status`` as the pipeline reports it; a subclass shows it (``changed``).
    Thread-safe: CP-SAT reports from its worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stage: str | None = None
        self._began = time.perf_counter()
        self._phase: str | None = None
        self._best_s: float | None = None
        self._bound_s: float | None = None
        self._deadline: float | None = None

    def stage(self, name: str) -> None:
        with self._lock:
            self._stage, self._began = name, time.perf_counter()
            self._phase = self._best_s = self._bound_s = self._deadline = None
        self.changed(now=True)

    def phase(self, name: str) -> None:
        with self._lock:
            self._phase = name
            self._best_s = self._bound_s = self._deadline = None
        self.changed(now=True)

    def solving(self, left_s: float | None) -> None:
        with self._lock:
            self._best_s = self._bound_s = None
            self._deadline = None if left_s is None else time.perf_counter() + left_s
        self.changed(now=False)

    def solver(self, best_s: float | None, bound_s: float) -> None:
        """The solve's best so far is the least objective reported since ``solving``, and its
        bound the greatest bound, but never above that best: a bound above a plan found is no
        bound of the problem (a coarsened graph's, say), as ``solve`` also finds."""
        with self._lock:
            if best_s is not None:
                self._best_s = best_s if self._best_s is None else min(self._best_s, best_s)
            bound_s = bound_s if self._bound_s is None else max(self._bound_s, bound_s)
            self._bound_s = bound_s if self._best_s is None else min(bound_s, self._best_s)
        self.changed(now=False)

    def status(self) -> Status:
        with self._lock:
            now = time.perf_counter()
            left = None if self._deadline is None else max(0.0, self._deadline - now)
            return Status(stage=self._stage, stage_s=now - self._began, phase=self._phase,
                          best_s=self._best_s, bound_s=self._bound_s, left_s=left)

    # --- what a display does
    def changed(self, *, now: bool) -> None:
        """The status changed: a stage or phase began (``now``: show it at once), or a solve
        reported (a display may wait for its next redraw)."""

    def start(self) -> None:
        """Begin showing (``reporting`` calls it)."""

    def stop(self) -> None:
        """Stop showing and leave nothing behind (``reporting`` calls it)."""


_installed: ContextVar[Reporter | None] = ContextVar("autoplace_progress", default=None)


def current_reporter() -> Reporter | None:
    """The reporter installed here, or ``None``: for code that reports from other threads."""
    return _installed.get()


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[Reporter | None]:
    """Install ``reporter`` (``None``: none) for the block, shown from its start to its end."""
    token = _installed.set(reporter)
    try:
        if reporter is not None:
            reporter.start()
        yield reporter
    finally:
        if reporter is not None:
            reporter.stop()
        _installed.reset(token)


def stage(name: str) -> None:
    """The pipeline's next stage begins (the one before it ends)."""
    if (reporter := _installed.get()) is not None:
        reporter.stage(name)


def phase(name: str) -> None:
    """A part of the stage begins: what is being solved, say."""
    if (reporter := _installed.get()) is not None:
        reporter.phase(name)


def solving(left_s: float | None) -> None:
    """A solve begins with ``left_s`` seconds (``None``: a limit not in wall seconds)."""
    if (reporter := _installed.get()) is not None:
        reporter.solving(left_s)


def solver(best_s: float | None, bound_s: float) -> None:
    """The solve's best objective (``None`` before a plan) and lower bound so far, in seconds."""
    if (reporter := _installed.get()) is not None:
        reporter.solver(best_s, bound_s)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Take the display down for the block, for another live display (rich shows one at a
    time)."""
    reporter = _installed.get()
    if reporter is None:
        yield
        return
    reporter.stop()
    try:
        yield
    finally:
        reporter.start()


def _is_terminal(stream: TextIO) -> bool:
    """A terminal that redraws in place; a pipe, a file, a CI log or pytest's capture is not."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def live_reporter(stream: TextIO | None = None) -> LiveReporter | None:
    """A ``LiveReporter`` on ``stream`` (default: stderr) when it is a terminal, else ``None``."""
    stream = sys.stderr if stream is None else stream
    return LiveReporter(stream) if _is_terminal(stream) else None


class LiveReporter(Reporter):
    """One line, redrawn in place on ``stream`` while the pipeline runs and erased at the end:
    ``⠹ solve 3.1 s · the plan on 4 devices · best 1.66 ms · bound 1.52 ms · 4.2 s left``.
    Text printed meanwhile (warnings on stderr; stdout where it is the same terminal) goes above
    it; stdout to a file or a pipe is left alone."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        from rich.console import Console
        from rich.spinner import Spinner

        # The stream itself, not sys.stderr looked up at each write: tracing swaps sys.stderr
        # for a buffer while torch.export runs, and a frame drawn there would be lost.
        self._console = Console(file=stream, force_terminal=True)
        self._spinner = Spinner("dots", style="cyan")
        self._live: Any = None

    def start(self) -> None:
        from rich.live import Live

        # A new Live each time: one stopped for ``paused`` keeps the height of its last frame.
        self._live = Live(get_renderable=self._render, console=self._console, transient=True,
                          refresh_per_second=REFRESH_PER_S,
                          redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=True)
        self._live.start(refresh=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def changed(self, *, now: bool) -> None:
        live = self._live
        if now and live is not None:
            live.refresh()

    def _render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        from autoplace.report.units import format_seconds

        status = self.status()
        line = Text()
        line.append(status.stage or "starting", style="bold")
        line.append(f" {status.stage_s:.1f} s", style="dim")
        parts = [status.phase] if status.phase else []
        if status.best_s is not None or status.bound_s is not None:
            parts.append(f"best {format_seconds(status.best_s)}")
            parts.append(f"bound {format_seconds(status.bound_s)}")
        if status.left_s is not None:
            parts.append(f"{status.left_s:.1f} s left")
        for part in parts:
            line.append(" · ", style="dim")
            line.append(part)
        grid = Table.grid(padding=(0, 1))
        grid.add_row(self._spinner, line)
        return grid

