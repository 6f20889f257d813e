"""Progress on a terminal (``autoplace.progress``): the stages of a plan in order and the
solver's best and bound with the time left while solving, on stderr; nothing at all when stderr
is not a terminal or with ``--quiet``, and stdout (the summary) the same either way."""

from __future__ import annotations

import io
import re
import sys
import textwrap
from pathlib import Path

import pytest
import zoo

from autoplace import progress
from autoplace.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PLAN_STAGES = ["load", "trace", "profile", "cost", "fold", "solve", "emit", "verify", "report"]


class Recorder(progress.Reporter):
    """Every status the pipeline reports, as a display would see it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[progress.Status] = []
        self.shown: list[str] = []

    def changed(self, *, now: bool) -> None:
        self.seen.append(self.status())

    def start(self) -> None:
        self.shown.append("start")

    def stop(self) -> None:
        self.shown.append("stop")

    def stages(self) -> list[str]:
        names = [s.stage for s in self.seen if s.stage is not None]
        return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    """The CLI's display replaced by a ``Recorder``, as if stderr were a terminal."""
    found = Recorder()
    monkeypatch.setattr(progress, "live_reporter", lambda: found)
    return found


def _model_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_plan_reports_its_stages_in_order_and_the_solver_as_it_goes(recorder, tmp_path):
    model = _model_file(tmp_path, zoo.branches_source(2))
    assert main(["plan", model, "--devices", "2xA100-40GB", "--out", str(tmp_path / "o"),
                 "--time-limit", "2"]) == 0
    assert recorder.stages() == PLAN_STAGES
    assert recorder.shown == ["start", "stop"]  # installed for the command, gone after it
    updates = [s for s in recorder.seen if s.bound_s is not None]
    assert updates and all(s.stage == "solve" for s in updates)
    assert all(s.best_s >= s.bound_s * (1 - 1e-9) for s in updates if s.best_s is not None)
    assert any(s.best_s is not None for s in updates)
    # The what-if row on one device is solved first, then the plan on both, each counting
    # down its own share of the time limit.
    phases = [s.phase for s in recorder.seen if s.stage == "solve" and s.phase]
    assert phases.index("what-if on 1 of 2 devices") < phases.index("the plan on 2 devices")
    for name in ("what-if on 1 of 2 devices", "the plan on 2 devices"):
        left = [s.left_s for s in recorder.seen if s.phase == name and s.left_s is not None]
        assert len(left) >= 2, name
        assert left == sorted(left, reverse=True) and left[-1] < left[0] <= 2, name


def test_solve_reports_load_solve_and_report(recorder, tmp_path):
    graph = str(EXAMPLES / "graphs" / "diamond.json")
    assert main(["solve", graph, "--out", str(tmp_path / "o"), "--time-limit", "1"]) == 0
    assert recorder.stages() == ["load", "solve", "report"]
    assert any(s.bound_s is not None and s.left_s is not None for s in recorder.seen)


def test_deterministic_solve_shows_no_wall_clock_countdown(recorder, tmp_path):
    graph = str(EXAMPLES / "graphs" / "diamond.json")
    assert main(["solve", graph, "--out", str(tmp_path / "o"), "--time-limit", "1",
                 "--deterministic"]) == 0
    assert any(s.bound_s is not None for s in recorder.seen)
    assert all(s.left_s is None for s in recorder.seen)


def _summary(text: str) -> str:
    """The command's stdout less its wall times (the solver's, the command's)."""
    return re.sub(r"\bin \d+(\.\d+)? (µs|ms|s)\b", "in T", text)


@pytest.fixture
def terminal(monkeypatch):
    """stderr taken for a terminal (pytest's capture of it, so what is drawn can be read)."""
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: stream is sys.stderr)


def test_on_a_terminal_the_display_is_on_stderr_and_stdout_is_unchanged(terminal, tmp_path,
                                                                        capsys):
    graph = str(EXAMPLES / "graphs" / "diamond.json")
    assert main(["solve", graph, "--out", str(tmp_path / "a"), "--time-limit", "1"]) == 0
    shown = capsys.readouterr()
    assert "solve" in shown.err and "\x1b[" in shown.err  # drawn and redrawn in place
    assert main(["solve", graph, "--out", str(tmp_path / "b"), "--time-limit", "1",
                 "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert "\x1b" not in shown.out
    assert _summary(shown.out.replace(str(tmp_path / "a"), "OUT")) == _summary(
        quiet.out.replace(str(tmp_path / "b"), "OUT"))


@pytest.mark.parametrize("command", ["plan", "solve"])
@pytest.mark.parametrize("how", ["not a terminal", "--quiet on a terminal"])
def test_nothing_extra_without_a_terminal_or_with_quiet(command, how, tmp_path, capsys,
                                                        monkeypatch):
    started = []
    monkeypatch.setattr(progress.LiveReporter, "start", lambda self: started.append(self))
    if how != "not a terminal":
        monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    target = EXAMPLES / ("mlp.py" if command == "plan" else "graphs/diamond.json")
    argv = [command, str(target), "--out", str(tmp_path / "o"), "--time-limit", "0.5"]
    argv += ["--devices", "2xA100-40GB", "--no-verify"] if command == "plan" else []
    argv += ["--quiet"] if how != "not a terminal" else []
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert started == [] and progress.current_reporter() is None
    assert printed.err == ""
    assert "\x1b" not in printed.out
    assert printed.out.splitlines()[-1].startswith(f"wrote {tmp_path / 'o'}/plan.json")


def test_the_live_line_says_stage_phase_best_bound_and_time_left():
    shown = progress.LiveReporter(io.StringIO())
    shown.stage("solve")
    shown.phase("the plan on 4 devices")
    shown.solving(5.0)
    shown.solver(1.66e-3, 1.52e-3)
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(shown._render())
    line = out.getvalue()
    assert re.search(r"solve \d+\.\d s · the plan on 4 devices · best 1\.66 ms · "
                     r"bound 1\.52 ms · [45]\.\d s left", line), line


def test_best_is_the_least_so_far_and_the_bound_never_above_it():
    shown = Recorder()
    shown.solving(2.0)
    shown.solver(1.7e-3, 1.5e-3)  # the best baseline and the analytic bound
    shown.solver(None, 1.6e-3)  # CP-SAT's bound before its first solution
    assert (shown.status().best_s, shown.status().bound_s) == (1.7e-3, 1.6e-3)
    shown.solver(1.66e-3, 1.72e-3)  # a coarsened graph's: above the plan, so no bound
    assert (shown.status().best_s, shown.status().bound_s) == (1.66e-3, 1.66e-3)
    shown.solving(1.0)  # the next solve starts afresh
    assert (shown.status().best_s, shown.status().bound_s) == (None, None)
    assert 0.9 < shown.status().left_s <= 1.0


def test_without_a_reporter_the_calls_do_nothing():
    assert progress.current_reporter() is None
    progress.stage("solve")
    progress.phase("x")
    progress.solving(1.0)
    progress.solver(None, 0.0)
    with progress.paused(), progress.reporting(None) as none:
        assert none is None and progress.current_reporter() is None


def test_paused_takes_the_display_down_for_another_one():
    recorder = Recorder()
    with progress.reporting(recorder):
        assert progress.current_reporter() is recorder
        with progress.paused():
            assert recorder.shown == ["start", "stop"]
        assert recorder.shown == ["start", "stop", "start"]
    assert recorder.shown == ["start", "stop", "start", "stop"]
    assert progress.current_reporter() is None
