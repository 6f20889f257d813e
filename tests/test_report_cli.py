"""`autoplace report` in-process: re-rendering from plan.json alone, and bad plan files (exit
code 2, one paragraph, nothing written)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from autoplace.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REPORT = ("report.html", "summary.md", "summary.txt")


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("planned") / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--devices", "2xA100-40GB", "--out",
                 str(out), "--no-emit", "--time-limit", "2"]) == 0
    return out


def test_plan_writes_the_report_files_and_prints_the_summary(planned, capsys) -> None:
    for name in ("plan.json", *REPORT):
        assert (planned / name).stat().st_size > 0, name
    assert main(["report", str(planned / "plan.json")]) == 0
    out = capsys.readouterr().out
    for fact in ("makespan", "speed-up", "lower bound", "baselines", "what-if"):
        assert fact in out
    assert "summary.md" in out


@pytest.mark.parametrize("how", ["file", "directory"])
def test_report_rerenders_the_same_files_from_plan_json_alone(planned, tmp_path, how) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(planned / "plan.json", copy / "plan.json")
    target = copy / "plan.json" if how == "file" else copy
    assert main(["report", str(target)]) == 0
    for name in REPORT:
        assert (copy / name).read_bytes() == (planned / name).read_bytes(), name


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = json.loads((tmp / "good.json").read_text())
    cases: dict[str, tuple[Path, str]] = {"missing": (tmp / "nothere" / "plan.json",
                                                      "no plan file at")}
    (tmp / "notjson.json").write_text("{not json")
    cases["not json"] = (tmp / "notjson.json", "is not valid JSON")
    (tmp / "list.json").write_text("[1, 2]")
    cases["a list"] = (tmp / "list.json", "not a plan object")
    no_makespan = dict(good)
    del no_makespan["makespan_s"]
    (tmp / "nomakespan.json").write_text(json.dumps(no_makespan))
    cases["no makespan"] = (tmp / "nomakespan.json",
                            "not a valid plan .1 problem: plan: 'makespan_s' is a required")
    wrong_device = json.loads(json.dumps(good))
    wrong_device["nodes"][0]["device"] = "cuda:9"
    wrong_device["nodes"][0]["compute_s"]["cuda:9"] = 1.0
    (tmp / "device.json").write_text(json.dumps(wrong_device))
    cases["unknown device"] = (tmp / "device.json", r"plan\.nodes\[0\]\.device: 'cuda:9'")
    return cases


@pytest.mark.parametrize("case", ["missing", "not json", "a list", "no makespan",
                                  "unknown device"])
def test_bad_plan_file_exits_2_with_one_paragraph_and_writes_nothing(planned, tmp_path, capsys,
                                                                     case) -> None:
    shutil.copy(planned / "plan.json", tmp_path / "good.json")
    path, pattern = _bad_files(tmp_path)[case]
    (tmp_path / "report.html").write_text("old report")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplace: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert re.search(pattern, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "report.html").read_text() == "old report"
