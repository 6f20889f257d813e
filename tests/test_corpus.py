"""A few models of the corpus (`examples/corpus/`), planned end to end as the benchmark does
(`benchmarks/corpus.py` runs all of them and writes `benchmarks/results/corpus.md`): one per
family that CI can afford, plus the data-dependent models whose outcome is known."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import transformers  # noqa: F401  (the corpus models import it; the dev extra installs it)

from autoplace.cli import main

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus"
sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus  # noqa: E402


@pytest.mark.parametrize("model", ["bert", "llama", "resnet", "mixtral", "cond_branch"])
def test_corpus_model_plans_and_verifies(model, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["plan", str(CORPUS / f"{model}.py"), "--devices", corpus.DEVICES,
                 "--out", str(out), "--time-limit", "2"])
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "plan.json").read_text())
    assert data["tracer"] == "export"
    assert data["verification"]["status"] == "passed"
    for name, baseline in data["baselines"].items():
        if baseline["feasible"]:
            assert data["makespan_s"] <= baseline["makespan_s"] * (1 + 1e-9), name


@pytest.mark.parametrize("model", ["early_exit", "dynamic_loop"])
def test_value_dependent_python_control_flow_is_a_clear_trace_error(model, tmp_path, capsys):
    assert main(["plan", str(CORPUS / f"{model}.py"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "torch.export failed" in err and "torch.fx.symbolic_trace failed too" in err
    assert "torch.cond" in err  # says how to fix it
    assert not (tmp_path / "o").exists()


def test_every_corpus_file_has_a_family_and_every_family_a_file():
    on_disk = {p.stem for p in CORPUS.glob("*.py")}
    assert on_disk == set(corpus.FAMILIES)


def test_the_table_counts_and_explains_failures():
    rows = [
        corpus.Row("a", "encoder", ok=True, tracer="export", detail="", traced_ops=10,
                   plan_nodes=5, verification="passed", makespan_s=2e-6, best_baseline="heft",
                   best_baseline_s=2e-6, status="OPTIMAL", wall_s=1.0),
        corpus.Row("b", "decoder", ok=True, tracer="fx", detail="torch.export failed, fell back",
                   traced_ops=10, plan_nodes=5, verification="passed", makespan_s=1e-6,
                   best_baseline="m-etf", best_baseline_s=2e-6, status="FEASIBLE", wall_s=1.0),
        corpus.Row("c", "control flow", ok=False, tracer="failed",
                   detail="exit 2: torch.export failed (x | y)", wall_s=1.0),
    ]
    text = corpus.table(rows, devices="2xA100-40GB", time_limit_s=5)
    assert "**2 of 3 models (67%) planned and verified end to end**" in text
    assert "1 traced with torch.export, 1 fell back to torch.fx, 1 failed" in text
    assert "| b | decoder | fx | 10 / 5 | passed | 1.0 | m-etf 2.0 | 0.500 |" in text
    assert "torch.export failed (x \\| y)" in text  # a pipe in a message cannot break the table
