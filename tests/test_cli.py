"""`autoplace` end to end, in-process: every example on homogeneous and heterogeneous devices,
and every kind of bad input (exit code 2, one clear paragraph, nothing written)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import zoo

from autoplace.cli import main
from autoplace.emit import load_model
from autoplace.formats.plan import Plan
from autoplace.formats.plan_check import validate_plan_dict
from autoplace.simulate import validate
from autoplace.trace.load import load_model_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("example", ["mlp", "lenet", "inception", "gpt2"])
@pytest.mark.parametrize("devices", ["2xA100-40GB", "2xA100-40GB,2xT4-16GB"])
def test_every_example_plans_emits_and_verifies(example, devices, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["plan", str(EXAMPLES / f"{example}.py"), "--devices", devices,
                 "--out", str(out), "--time-limit", "5"])
    assert code == 0, capsys.readouterr().err
    assert "makespan" in capsys.readouterr().out
    data = json.loads((out / "plan.json").read_text())
    validate_plan_dict(data)
    assert data["verification"]["status"] == "passed"
    expected = sum(int(part.split("x")[0]) for part in devices.split(","))
    assert len(data["devices"]) == expected and data["devices"][0]["type"] == "A100-40GB"
    n = len(data["devices"])
    assert len(data["links"]) == n * (n - 1)
    # Never worse than a baseline, except by less than --min-gain where one device was chosen.
    slack = 1 + data["min_gain"]["threshold"] * data["min_gain"]["single_device_chosen"]
    for name, baseline in data["baselines"].items():
        if baseline["feasible"]:
            assert data["makespan_s"] <= baseline["makespan_s"] * slack + 1e-12, name
    assert data["lower_bound_s"] <= data["makespan_s"] + 1e-12
    html = (out / "report.html").read_text()
    assert 'id="timeline"' in html and 'id="memory"' in html

    # The plan re-checks from the file alone, and the saved model runs equal to the original.
    plan = Plan.load(out)
    assert validate(plan.problem, plan.schedule) == []
    loaded = load_model_file(EXAMPLES / f"{example}.py")
    original = loaded.model.eval()
    emitted = load_model(out / "model", device_map={"cuda:*": "cpu"})
    with torch.no_grad():
        torch.testing.assert_close(emitted(*loaded.args, **loaded.kwargs),
                                   original(*loaded.args, **loaded.kwargs))


def test_branches_run_side_by_side_and_beat_one_device(tmp_path):
    out = tmp_path / "out"
    model = _model_file(tmp_path, zoo.branches_source(2))
    assert main(["plan", model, "--devices", "2xA100-40GB", "--out", str(out),
                 "--time-limit", "5"]) == 0
    data = json.loads((out / "plan.json").read_text())
    assert data["makespan_s"] < data["best_single_device"]["makespan_s"]
    # Some node on cuda:0 and some node on cuda:1 run at the same time.
    spans = {d: [(n["start_s"], n["end_s"]) for n in data["nodes"]
                 if n["device"] == d and n["end_s"] > n["start_s"]] for d in ("cuda:0", "cuda:1")}
    assert any(s0 < e1 and s1 < e0 for s0, e0 in spans["cuda:0"] for s1, e1 in spans["cuda:1"])


def test_devices_lists_the_catalog(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in ("A100-40GB", "H100-80GB", "T4", "RTX4090"):
        assert name in out


def test_report_rerenders_from_plan_json(tmp_path):
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "mlp.py"), "--devices", "2xA100-40GB", "--out",
                 str(out), "--no-emit"]) == 0
    (out / "report.html").unlink()
    assert main(["report", str(out / "plan.json")]) == 0
    assert 'id="timeline"' in (out / "report.html").read_text()


def _model_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


BIG_META_MODEL = """
    import torch
    def build():
        with torch.device("meta"):
            # Three 60,000 x 60,000 float32 layers: 3 x 14.4e9 = 43.2e9 bytes of weights.
            model = torch.nn.Sequential(*[torch.nn.Linear(60000, 60000, bias=False)
                                          for _ in range(3)])
        return model, (torch.randn(1, 60000),)
"""

HUGE_LAYER_MODEL = """
    import torch
    def build():
        with torch.device("meta"):
            model = torch.nn.Linear(100000, 100000, bias=False)  # 4e10 bytes in one node
        return model, (torch.randn(1, 100000),)
"""


NO_LOSS_MODEL = """
    import torch
    def build():
        return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
"""

FROZEN_MODEL = """
    import torch
    def build():
        model = torch.nn.Linear(4, 2)
        model.requires_grad_(False)
        return model, (torch.randn(3, 4),)
    def loss(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs, labels)
    example_targets = (torch.tensor([0, 1, 0]),)
"""

LOSS_WITHOUT_TARGETS = """
    import torch
    def build():
        return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
    def loss(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs, labels)
"""

PER_SAMPLE_LOSS = """
    import torch
    def build():
        return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
    def loss(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs, labels, reduction="none")
    example_targets = (torch.tensor([0, 1, 0]),)
"""

MAX_LOSS = """
    import torch
    def build():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 2), (torch.randn(4, 4),)
    def loss(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs, labels, reduction="none").max()
    example_targets = (torch.tensor([0, 1, 0, 1]),)
"""


@pytest.mark.parametrize("args, pattern", [
    (["plan", "{tmp}/missing.py"], "does not exist"),
    (["plan", "{file:" + NO_LOSS_MODEL + "}", "--mode", "training"],
     r"needs a scalar loss, but the model returns a tensor of shape \[3, 2\].*loss\(outputs"),
    (["plan", "{file:" + FROZEN_MODEL + "}", "--mode", "training"], "carries no gradient"),
    (["plan", "{file:" + LOSS_WITHOUT_TARGETS + "}", "--mode", "training"],
     "defines loss\\(\\) but no example_targets"),
    (["plan", "{file:" + PER_SAMPLE_LOSS + "}", "--mode", "training"],
     r"the loss has shape \[3\], not a scalar: reduce it"),
    (["plan", "{mlp}", "--mode", "training", "--microbatches", "3"],
     r"the batch of 64 \(dimension 0 of args\.0, the first tensor input\) does not divide "
     "into 3 micro-batches"),
    (["plan", "{mlp}", "--mode", "training", "--microbatches", "0"],
     "--microbatches must be a whole number, 1 or more"),
    (["plan", "{mlp}", "--microbatches", "2"], "--microbatches is for training plans"),
    (["plan", "{mlp}", "--replicas", "2"], "--replicas is for training plans"),
    (["plan", "{mlp}", "--mode", "training", "--replicas", "two"],
     "--replicas must be auto or a whole number, 1 or more, got 'two'"),
    (["plan", "{mlp}", "--mode", "training", "--schedule", "1f1b"],
     "--schedule 1f1b orders micro-batches: add --microbatches"),
    (["plan", "{mlp}", "--mode", "training", "--devices", "3xA100-40GB", "--replicas", "2"],
     "--replicas 2: 2 does not divide the 3 devices"),
    (["plan", "{file:" + MAX_LOSS + "}", "--mode", "training", "--microbatches", "2"],
     "the loss does not split over 2 micro-batches"),
    (["plan", "{file:x = 1}"], "defines neither build"),
    (["plan", "{file:raise RuntimeError('kaput')}"], "RuntimeError.*kaput"),
    (["plan", "{mlp}", "--devices", "2xB200-1TB"], "B200-1TB.*A100-40GB"),
    (["plan", "{mlp}", "--devices", "2x"], "2x"),
    (["plan", "{mlp}", "--devices", "0xA100-40GB"], "0xA100-40GB"),
    (["plan", "{file:" + BIG_META_MODEL + "}", "--devices", "1xT4-16GB,1xL4"],
     "short"),
    (["plan", "{mlp}", "--cluster", "{bad_toml}"], "cluster.toml"),
    (["plan", "{mlp}", "--out", "{file_as_dir}/out"], "not a directory"),
    (["plan", "{mlp}", "--devices", "2xA100-40GB", "--cluster", "{bad_toml}"], "not both"),
    (["plan", "{mlp}", "--min-gain", "1"], r"--min-gain must be a fraction in \[0, 1\), got 1"),
    (["plan", "{mlp}", "--min-gain", "-0.1"], r"--min-gain .* got -0.1"),
    (["solve", "{diamond}", "--min-gain", "2.5"], r"--min-gain .* got 2.5"),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(args, pattern, tmp_path,
                                                                     capsys):
    (tmp_path / "cluster.toml").write_text("[[hosts]\nname = 'x'\n")
    (tmp_path / "afile").write_text("")
    argv = []
    for a in args:
        if a.startswith("{file:"):
            a = _model_file(tmp_path, a[len("{file:"):-1])
        a = a.format(tmp=tmp_path, mlp=EXAMPLES / "mlp.py", bad_toml=tmp_path / "cluster.toml",
                     diamond=EXAMPLES / "graphs" / "diamond.json",
                     file_as_dir=tmp_path / "afile")
        argv.append(a)
    out = tmp_path / "never"
    if "--out" not in argv:
        argv += ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoplace: error: ")
    assert "Traceback" not in err
    import re
    assert re.search(pattern, err, re.S), err
    assert not out.exists()
    assert not any(p.name.startswith(".never") for p in tmp_path.iterdir())


def test_infeasible_model_says_how_many_bytes_are_missing(tmp_path, capsys):
    # T4 (16 GiB) + L4 (24 GiB) = 42,949,672,960 bytes; the model needs 43,200,000,000.
    path = _model_file(tmp_path, BIG_META_MODEL)
    assert main(["plan", path, "--devices", "1xT4-16GB,1xL4", "--out", str(tmp_path / "o")]) == 2
    assert "(250327040 bytes) short" in capsys.readouterr().err
    # With a third device it fits, split across devices within capacity.
    assert main(["plan", path, "--devices", "1xT4-16GB,2xL4", "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "plan.json").read_text())
    used = {n["device"] for n in data["nodes"] if n["memory_bytes"]}
    assert len(used) >= 2
    for mem in data["memory"].values():
        assert mem["peak_bytes"] <= mem["capacity_bytes"]


def test_one_layer_larger_than_any_device_names_it(tmp_path, capsys):
    path = _model_file(tmp_path, HUGE_LAYER_MODEL)
    assert main(["plan", path, "--devices", "2xL4", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "node 'linear' needs" in err and "short" in err and "cuda:0 (L4)" in err
    assert not (tmp_path / "o").exists()


def test_min_gain_keeps_one_device_when_splitting_gains_too_little(tmp_path, capsys):
    # diamond.json on its own devices: the split's gain over one device, measured by a first
    # run with --min-gain 0, decides the threshold of the second run (just above the gain).
    first, second = tmp_path / "a", tmp_path / "b"
    graph = str(EXAMPLES / "graphs" / "diamond.json")
    assert main(["solve", graph, "--out", str(first), "--min-gain", "0"]) == 0
    split = json.loads((first / "plan.json").read_text())
    gain = split["speedup_over_single"] - 1
    assert gain > 0 and not split["min_gain"]["single_device_chosen"]
    assert main(["solve", graph, "--out", str(second), "--min-gain", f"{gain * 1.01:.6f}"]) == 0
    data = json.loads((second / "plan.json").read_text())
    validate_plan_dict(data)
    assert data["min_gain"]["single_device_chosen"]
    assert "less than --min-gain" in data["min_gain"]["reason"]
    assert len({n["device"] for n in data["nodes"]}) == 1
    assert data["makespan_s"] == pytest.approx(data["best_single_device"]["makespan_s"])
    assert data["min_gain"]["reason"] in data["notes"]
    assert "less than --min-gain" in capsys.readouterr().out
