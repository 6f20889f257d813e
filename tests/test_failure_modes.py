"""How autoplace fails: every error class raised from real input through the CLI (exit code 2,
one paragraph, nothing written), a crash in any stage leaving no output directory behind, and
``--deterministic`` giving the same plan twice.

The error table below is the executable form of ``docs/errors.md``; a test checks that the page
names every class in ``autoplace.errors.__all__``.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
import zoo

import autoplace.errors
from autoplace.cli import main
from autoplace.cli.flags import FLAGS
from autoplace.config import Config, Emit, Solve
from autoplace.errors import AutoplaceError, ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MLP = str(EXAMPLES / "mlp.py")
DIAMOND = str(EXAMPLES / "graphs" / "diamond.json")

# A function torch.fx keeps as one call (torch.fx.wrap) in a model that refuses torch.export:
# it plans and runs in memory, but the saved model.py could not import the user's function.
USER_FUNCTION_MODEL = """
    import torch
    from torch import nn

    def halve(x):
        return x * 0.5

    torch.fx.wrap("halve")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            if torch.compiler.is_exporting():
                raise RuntimeError("this model refuses torch.export")
            return halve(self.fc(x))

    def build():
        return Net(), (torch.randn(2, 4),)
"""

# Noise added at inference: the emitted model cannot reproduce the original's outputs.
NOISY_MODEL = """
    import torch
    from torch import nn

    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) + torch.randn_like(x)

    def build():
        return Noisy(), (torch.randn(2, 4),)
"""

CYCLIC_GRAPH = {
    "devices": [{"name": "g0", "type": "G", "memory_bytes": 1000}],
    "default_link": {"bandwidth_bytes_per_s": 100.0, "latency_s": 0.0},
    "nodes": [{"name": "a", "compute_s": {"G": 1}}, {"name": "b", "compute_s": {"G": 1}}],
    "edges": [{"src": "a", "dst": "b", "bytes": 1}, {"src": "b", "dst": "a", "bytes": 1}],
}

TOO_BIG_GRAPH = {
    "devices": [{"name": "g0", "type": "G", "memory_bytes": 1000},
                {"name": "g1", "type": "G", "memory_bytes": 1000}],
    "default_link": {"bandwidth_bytes_per_s": 100.0, "latency_s": 0.0},
    "nodes": [{"name": f"n{i}", "compute_s": {"G": 1}, "memory_bytes": 800} for i in range(3)],
    "edges": [],
}

# error class -> (argv, pattern the message must match). "{x}" fields are filled per test.
ERROR_CASES = {
    "AutoplaceError": (["plan", MLP, "--mode", "training", "--microbatches", "3"],
                       r"does not divide into 3 micro-batches"),
    "ConfigError": (["plan", MLP, "--time-limit", "0"],
                    r"--time-limit must be a positive number of seconds, got 0"),
    "ModelLoadError": (["plan", "{tmp}/missing.py"], r"does not exist.*define `build\(\)`"),
    "TraceError": (["plan", str(EXAMPLES / "corpus" / "early_exit.py")],
                   r"torch\.export failed.*torch\.fx\.symbolic_trace failed too.*torch\.cond"),
    "DeviceSpecError": (["plan", MLP, "--devices", "2xB200-1TB"],
                        r"unknown device type 'B200-1TB'.*A100-40GB"),
    "GraphError": (["solve", "{cyclic}"], r"the graph has a cycle: (a -> b -> a|b -> a -> b)"),
    "InfeasibleError": (["solve", "{too_big}"], r"bytes\) short"),
    "EmitError": (["plan", "{user_function}"],
                  r"generated code needs halve\(\) from .*user_function\.py, "
                  r".*cannot import.*--no-emit"),
    "VerificationError": (["plan", "{noisy}"],
                          r"outputs differ from the original's \(max abs diff.*--no-verify"),
    "OutputError": (["report", "{tmp}/nowhere/plan.json"], r"no plan file|does not exist"),
    "PinError": (["plan", MLP, "--devices", "2xA100-40GB", "--pin", "0=cuda:7"],
                 r"pin to unknown device 'cuda:7': the planned devices are cuda:0, cuda:1"),
}


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def raised(monkeypatch):
    """Every AutoplaceError constructed during the test, as (class name, message)."""
    seen: list[tuple[str, str]] = []
    original = AutoplaceError.__init__

    def record(self, *args):
        original(self, *args)
        # a ConfigError is printed with the flags' names (cli.flags)
        shown = self.render(FLAGS) if isinstance(self, ConfigError) else str(self)
        seen.append((type(self).__name__, shown))

    monkeypatch.setattr(AutoplaceError, "__init__", record)
    return seen


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_every_error_class_exits_2_with_its_message(name, tmp_path, capsys, raised):
    argv, pattern = ERROR_CASES[name]
    fields = {
        "tmp": tmp_path,
        "cyclic": _write(tmp_path, "cyclic.json", json.dumps(CYCLIC_GRAPH)),
        "too_big": _write(tmp_path, "big.json", json.dumps(TOO_BIG_GRAPH)),
        "user_function": _write(tmp_path, "user_function.py", USER_FUNCTION_MODEL),
        "noisy": _write(tmp_path, "noisy.py", NOISY_MODEL),
    }
    argv = [a.format(**fields) for a in argv]
    out = tmp_path / "out"
    if argv[0] != "report":
        argv += ["--out", str(out), "--time-limit", "1"] if "--time-limit" not in argv else [
            "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    message = err.strip().removeprefix("autoplace: error: ")
    assert err.strip().startswith("autoplace: error: ") and "Traceback" not in err
    assert re.search(pattern, message, re.S), message
    # The message printed is the one the expected class carried.
    assert (name, message) in raised, raised
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_the_error_table_covers_every_class():
    assert set(ERROR_CASES) == set(autoplace.errors.__all__)


def test_docs_page_lists_every_error_class():
    page = (ROOT / "docs" / "errors.md").read_text()
    for name in autoplace.errors.__all__:
        assert re.search(rf"^## `{name}`", page, re.M), f"docs/errors.md has no section on {name}"


# A branch on a value inside a function torch.fx keeps as one call: traced, but it cannot run on
# fake tensors to be costed.
VALUE_BRANCH_IN_WRAPPED_FUNCTION = """
    import torch
    from torch import nn

    def center_if_negative(x):
        if x.mean() < 0:
            return x - x.mean()
        return x

    torch.fx.wrap("center_if_negative")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return center_if_negative(self.fc(x))

    def build():
        return Net(), (torch.randn(2, 4),)
"""


@pytest.mark.parametrize("model", ["early_exit", "wrapped"])
def test_a_trace_error_is_one_paragraph(model, tmp_path, capsys):
    # torch.export prints the partial graph of a failed export to stderr, and a fake-tensor
    # error spans many lines; autoplace's own message must not be buried under either.
    path = (str(EXAMPLES / "corpus" / "early_exit.py") if model == "early_exit"
            else _write(tmp_path, "wrapped.py", VALUE_BRANCH_IN_WRAPPED_FUNCTION))
    assert main(["plan", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.strip().startswith("autoplace: error: "), err[:500]
    assert "\n" not in err.strip(), err[:2000]
    assert err.strip().endswith(("that traces", "torch.fx.wrap)"))


# A plain bug: fc1 gives 8 features, fc2 takes 16. The model fails on its own inputs, eagerly.
SHAPE_BUG = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.fc2 = nn.Linear(16, 2)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.fc2(h)

    def build():
        return Net(), (torch.randn(3, 4),)
"""


@pytest.mark.parametrize("granularity", ["op", "module"])
def test_a_model_that_fails_on_its_own_inputs_is_named_with_its_line(granularity, tmp_path,
                                                                      capfd):
    # Before: 38 lines of torch's fake-tensor log (written to the terminal's file descriptor,
    # which capsys does not see), then advice about .item() and branches on values.
    path = _write(tmp_path, "shape_bug.py", SHAPE_BUG)
    out = tmp_path / "o"
    assert main(["plan", path, "--out", str(out), "--granularity", granularity]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("autoplace: error: the model, run on its example inputs"), err[:2000]
    assert "\n" not in err, err[:2000]
    assert f"{path}, line 13, in forward (`return self.fc2(h)`)" in err
    assert "mat1 and mat2 shapes cannot be multiplied" in err
    assert ".item()" not in err and "fake" not in err
    assert not out.exists()


def test_running_the_example_changes_no_state():
    # run_example runs the model once before tracing: batch norm's running statistics and the
    # random state must be as they were, or the plan's check compares another model.
    from autoplace.trace.load import run_example

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 4) + 3.0
    rng = torch.get_rng_state()
    run_example(model, (x,), {})
    assert torch.equal(torch.get_rng_state(), rng)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_example_runs_once_before_tracing_and_not_again_after_the_loss_check(monkeypatch):
    # Inference: tracing runs the model on its inputs first. Training: the loss check has run
    # it already, so tracing (once per replica count) does not run it again.
    import autoplace.trace
    from autoplace.pipeline import plan

    calls = []
    real = autoplace.trace.run_example
    monkeypatch.setattr("autoplace.trace.run_example",
                        lambda *args: calls.append(1) or real(*args))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    plan(
        model,
        (torch.randn(4, 8),),
        Config(devices="2xA100-40GB", solve=Solve(time_limit_s=0.5), emit=Emit(model=False)),
    )
    assert len(calls) == 1
    plan(
        model,
        (torch.randn(4, 8),),
        Config(
            devices="2xA100-40GB",
            mode="training",
            solve=Solve(time_limit_s=0.5),
            emit=Emit(model=False),
        ),
        loss=torch.nn.functional.cross_entropy,
        example_targets=(torch.tensor([0, 1, 0, 1]),),
    )
    assert len(calls) == 1


def test_torch_logs_while_tracing_become_one_note(capfd):
    # What torch logs while tracing is kept off the terminal, and a note says it had something
    # to say.
    import logging

    from autoplace.trace import _quiet_torch, _TorchLogs

    logs = _TorchLogs()
    with _quiet_torch(logs):
        logging.getLogger("torch._subclasses.fake_tensor").error("fake tensor dispatch failed")
        logging.getLogger("autoplace.elsewhere").debug("not torch's")
    assert "fake tensor dispatch failed" not in capfd.readouterr().err
    assert "torch logged 1 warning(s) or error(s) while tracing" in logs.note()
    assert "torch._subclasses.fake_tensor" in logs.note()
    assert _TorchLogs().note() is None


# ---------------------------------------------------------------------------------------------
# A crash in a stage leaves nothing half-written


class Crash(RuntimeError):
    pass


def _raise(exc: type[BaseException]):
    def crash(*args, **kwargs):
        raise exc("injected")

    return crash


# (command, what crashes): stages that run before anything is written, and the writers.
CRASHES = [
    ("plan", "autoplace.pipeline.forward.trace_model"),
    ("plan", "autoplace.pipeline.inference.solve_after_whatif"),
    ("plan", "autoplace.emit.verify"),
    ("plan", "autoplace.report.write_report"),
    ("plan", "autoplace.emit.save_model"),
    ("solve", "autoplace.report.write_report"),
    ("solve", "autoplace.pipeline.solve"),
]


def _argv(command: str, out: Path) -> list[str]:
    source = MLP if command == "plan" else DIAMOND
    return [command, source, "--out", str(out), "--time-limit", "1"]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".out"))


@pytest.mark.parametrize("command, target", CRASHES)
def test_a_crash_in_a_stage_leaves_no_output_directory(command, target, tmp_path, monkeypatch):
    monkeypatch.setattr(target, _raise(Crash))
    out = tmp_path / "deep" / "out"
    with pytest.raises(Crash):
        main(_argv(command, out))
    assert not (tmp_path / "deep").exists()  # not even the parent it would have created
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exc, code", [(Crash, None), (KeyboardInterrupt, 130)])
def test_a_crash_while_writing_keeps_the_previous_output(exc, code, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(_argv("solve", out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr("autoplace.report.write_report", _raise(exc))
    if code is None:
        with pytest.raises(exc):
            main(_argv("solve", out))
    else:
        assert main(_argv("solve", out)) == code  # Ctrl-C: exit 130, as the CLI documents
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path) == []


def test_an_interrupted_report_rerender_keeps_the_old_files(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(_argv("solve", out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import autoplace.report.page as page

    monkeypatch.setattr(page, "render_markdown", _raise(KeyboardInterrupt))
    assert main(["report", str(out / "plan.json")]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------------------------------------
# --deterministic


def _plan_only(data: dict) -> dict:
    """plan.json without what legitimately differs between two runs: clocks and timestamps."""
    data = dict(data)
    # The time stamp, and what profiling measured about itself (wall times), differ by design.
    for key in ("created", "profile"):
        data.pop(key, None)
    data["solver"] = {k: v for k, v in data["solver"].items()
                      if k not in ("wall_s", "progress", "time_s")}
    data.pop("whatif", None)
    return data




@pytest.mark.parametrize("command", ["plan", "solve"])
def test_deterministic_runs_write_the_same_plan(command, tmp_path):
    source = (_write(tmp_path, "branches.py", zoo.branches_source(4)) if command == "plan"
              else DIAMOND)
    plans = []
    for run in ("a", "b"):
        out = tmp_path / run
        argv = [command, source, "--out", str(out), "--time-limit", "1", "--deterministic"]
        if command == "plan":
            argv += ["--devices", "4xA100-40GB", "--no-verify"]
        assert main(argv) == 0
        plans.append(json.loads((out / "plan.json").read_text()))
    assert [n["device"] for n in plans[0]["nodes"]] == [n["device"] for n in plans[1]["nodes"]]
    assert _plan_only(plans[0]) == _plan_only(plans[1])
    if command == "plan":
        assert len({n["device"] for n in plans[0]["nodes"]}) > 1  # a real split, not a trivial one


# ---------------------------------------------------------------------------------------------
# Ctrl-C while solving (the solver's own tests are in tests/test_interrupt.py)


@pytest.mark.parametrize("command", ["plan", "solve"])
def test_ctrl_c_while_solving_writes_the_best_plan_so_far_marked_as_such(command, tmp_path,
                                                                         monkeypatch):
    from autoplace.formats.plan import Plan
    from autoplace.formats.plan_check import validate_plan_dict
    from autoplace.simulate import validate
    from autoplace.solve import HEURISTICS

    def pressed(problem, objective):
        raise KeyboardInterrupt

    names = list(HEURISTICS)
    monkeypatch.setitem(HEURISTICS, names[1], pressed)
    out = tmp_path / "out"
    argv = _argv(command, out)
    if command == "plan":
        # Four branches on four devices: the first baselines cannot meet the lower bound, so
        # the plan cannot be proven optimal before the interruption.
        argv[1] = _write(tmp_path, "branches.py", zoo.branches_source(4))
        argv += ["--devices", "4xA100-40GB"]
    assert main(argv) == 0
    data = json.loads((out / "plan.json").read_text())
    validate_plan_dict(data)
    assert data["solver"]["status"] == "INTERRUPTED"
    assert any("interrupted (Ctrl-C)" in note for note in data["notes"])
    assert "whatif" not in data  # no more solving after Ctrl-C
    assert "INTERRUPTED" in (out / "summary.md").read_text()
    plan = Plan.load(out)
    assert validate(plan.problem, plan.schedule) == []
    for name, baseline in data["baselines"].items():
        if baseline["feasible"]:
            assert data["makespan_s"] <= baseline["makespan_s"] * (1 + 1e-9), name
    if command == "plan":
        assert data["verification"]["status"] == "passed"  # still emitted and checked
