"""Loading a plan or an emitted model never runs code other than the generated ``model.py`` (and
the engine saved beside it, ``_runtime.py``) the user asked to run: plan files are JSON, weights
are safetensors, and nothing is unpickled.

Each test plants a payload that would create a marker file if it ever ran (a pickle's
``__reduce__``, a module's import) and checks that autoplace refuses the input and the marker
never appears. ``autoplace plan model.py`` does run ``model.py``: the README and the CLI help
say so, and a test pins that too.
"""

from __future__ import annotations

import ast
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch
import zoo

import autoplace
from autoplace.cli import main
from autoplace.emit import emit_model, load_model, save_model
from autoplace.errors import EmitError, OutputError
from autoplace.trace import trace_model

ROOT = Path(__file__).resolve().parents[1]
CPU = {"cuda:*": "cpu"}


class Payload:
    """Unpickling this creates ``marker``: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps({"weights": Payload(marker)})


@pytest.fixture
def saved_model(tmp_path):
    """A two-segment model written by save_model, and its input."""
    torch.manual_seed(0)
    model, x = zoo.TwoLayer().eval(), torch.randn(2, 8)
    traced = trace_model(model, (x,), {}, name="two")
    ops = [op for node in traced.graph.nodes if not node.is_input for op in node.ops]
    device_of = {op: ("cuda:0" if i < len(ops) // 2 else "cuda:1") for i, op in enumerate(ops)}
    directory = tmp_path / "model"
    save_model(emit_model(traced.module, device_of, device_map=CPU), directory)
    return directory, model, x


def test_the_fixture_round_trips(saved_model):
    directory, model, x = saved_model
    with torch.no_grad():
        torch.testing.assert_close(load_model(directory, device_map=CPU)(x), model(x))


def test_pickled_weights_are_refused_and_never_unpickled(saved_model, tmp_path):
    directory, _, _ = saved_model
    marker = tmp_path / "pwned"
    # What torch.save would write: a pickle (zip) in place of the safetensors file.
    torch.save({"seg0.fc1.weight": Payload(marker)}, directory / "weights.safetensors")
    with pytest.raises(EmitError, match="cannot read .*weights.safetensors"):
        load_model(directory, device_map=CPU)
    assert not marker.exists()
    (directory / "weights.safetensors").write_bytes(_pickle_bytes(marker))
    with pytest.raises(EmitError, match="cannot read .*weights.safetensors"):
        load_model(directory, device_map=CPU)
    assert not marker.exists()


def test_a_module_named_in_meta_json_outside_the_allow_list_is_never_imported(
        saved_model, tmp_path, monkeypatch):
    directory, _, _ = saved_model
    marker = tmp_path / "imported"
    (tmp_path / "evil_autoplace_mod.py").write_text(f"open({str(marker)!r}, 'w')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    meta = json.loads((directory / "meta.json").read_text())
    meta["pytree_modules"] = ["evil_autoplace_mod"]
    (directory / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(EmitError, match="'evil_autoplace_mod', which is not allow-listed"):
        load_model(directory, device_map=CPU)
    assert not marker.exists() and "evil_autoplace_mod" not in sys.modules

    # A type named only inside the pytree spec is not imported either: the spec is refused.
    meta["pytree_modules"] = []
    meta["in_spec"] = json.dumps([1, {"type": "evil_autoplace_mod.Thing", "context": "null",
                                      "children_spec": []}])
    (directory / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(EmitError, match="unreadable pytree spec"):
        load_model(directory, device_map=CPU)
    assert not marker.exists() and "evil_autoplace_mod" not in sys.modules


def test_a_pickle_in_place_of_plan_json_is_refused_and_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "pwned"
    (tmp_path / "plan.json").write_bytes(_pickle_bytes(marker))
    (tmp_path / "plan.pkl").write_bytes(_pickle_bytes(marker))  # beside it: never opened
    with pytest.raises(OutputError):
        autoplace.Plan.load(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    assert "autoplace: error: " in capsys.readouterr().err
    assert not marker.exists()


def test_a_plan_file_cannot_inject_script_into_the_report(tmp_path):
    # Names in plan.json are data: the report must escape them, not run them in the browser.
    out = tmp_path / "out"
    assert main(["solve", str(ROOT / "examples" / "graphs" / "diamond.json"), "--out", str(out),
                 "--time-limit", "1"]) == 0
    data = json.loads((out / "plan.json").read_text())
    evil = "</script><script>alert('pwned')</script><!--"
    data["model"] = evil
    for node in data["nodes"]:
        node["module"] = evil
    data["notes"] = [evil]
    (out / "plan.json").write_text(json.dumps(data))
    assert main(["report", str(out / "plan.json")]) == 0
    html = (out / "report.html").read_text()
    assert "<script>alert(" not in html
    assert "alert(" in html  # the text is there, escaped


# ---------------------------------------------------------------------------------------------
# The source itself: nothing unpickles, nothing evaluates strings


_FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}


def _sources() -> list[Path]:
    return sorted(p for pkg in ("autoplace", "cost_models") for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_unpickles_or_evaluates_strings(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            names = set()
        assert not names & _FORBIDDEN_MODULES, f"{where}:{node.lineno} imports {names}"
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func == "torch.load":
            weights_only = [k for k in node.keywords if k.arg == "weights_only"]
            assert weights_only and ast.unparse(weights_only[0].value) == "True", (
                f"{where}:{node.lineno}: torch.load without weights_only=True")
        assert func != "eval", f"{where}:{node.lineno} calls eval"
        if func == "exec":
            # The one exception: the top-level forward autoplace itself generated.
            assert where == "autoplace/emit/codegen/source.py", f"{where}:{node.lineno} calls exec"


def test_the_docs_say_plan_runs_the_model_file(capsys):
    readme = (ROOT / "README.md").read_text()
    assert "**autoplace runs this file**" in readme
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "MODEL_FILE is run as Python" in " ".join(capsys.readouterr().out.split())
