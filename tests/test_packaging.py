"""Packaging: `python -m build` makes a wheel and an sdist that carry the package data (plan
schema, report and script templates, vendored plotly.js) and the licence
(`License-Expression: Apache-2.0`, the LICENSE file), and the wheel, installed into a fresh
virtual environment, gives a working `autoplace --help` and `autoplace plan` on an example.

The fresh environment sees the site-packages of the environment running the tests (a `.pth` file
lists them), so torch and the other dependencies are there without a download (the wheel is
installed with --no-deps, from the file alone). Those are not the *system's* site-packages: run
from a virtual environment, `--system-site-packages` would reach past it to the base Python,
where torch need not be. The test checks that `autoplace` is imported from the new environment,
not from this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import build  # noqa: F401  (the dev extra installs it; the fixture runs `python -m build`)
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_FILES = (
    "autoplace/formats/plan.schema.json",
    "autoplace/formats/graph.schema.json",
    "autoplace/formats/cluster.schema.json",
    "autoplace/templates/report.html.j2",
    "autoplace/templates/report.css",
    "autoplace/templates/report.js",
    "autoplace/templates/summary.md.j2",
    "autoplace/templates/launch.py.tmpl",
    "autoplace/templates/train.py.tmpl",
    "autoplace/templates/vendor/plotly-basic.min.js",
    "autoplace/templates/vendor/plotly.js-LICENSE.txt",
)
# What a copy of the checkout to build from leaves out: VCS data, caches, build outputs.
_NOT_SOURCES = shutil.ignore_patterns(".git", ".hypothesis", ".pytest_cache", ".ruff_cache",
                                      ".benchmarks", "__pycache__", "*.egg-info", "build",
                                      "dist", "autoplace-out")


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          **kwargs)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)  # build never writes into the checkout
    # --no-isolation: build with the setuptools installed here, nothing downloaded. build makes
    # the sdist first and the wheel from the sdist, so the wheel also proves the sdist complete.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"),
          str(source)])
    return tmp / "dist"


def test_build_makes_a_wheel_and_an_sdist_with_the_package_data(dist):
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "autoplace = autoplace.cli:main" in wheel.read(entry_points).decode()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(licence) == 1, sorted(n for n in names if ".dist-info/" in n)
        assert wheel.read(licence[0]) == (ROOT / "LICENSE").read_bytes()
    headers = metadata.decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers, headers
    assert "License-File: LICENSE" in headers, headers
    assert set(DATA_FILES) <= names
    assert {"autoplace/__init__.py", "autoplace/solve/__init__.py",
            "cost_models/__init__.py"} <= names
    with tarfile.open(sdists[0]) as sdist:
        top = sdists[0].name.removesuffix(".tar.gz")
        members = {m.name.removeprefix(f"{top}/") for m in sdist.getmembers()}
    assert set(DATA_FILES) | {"pyproject.toml", "README.md", "LICENSE"} <= members


def _see_this_environment(python: Path) -> None:
    """Let the venv of ``python`` import what the running interpreter's environment has, after
    its own packages: a `.pth` file in its site-packages lists ours (a plain venv's, or the
    system's where the tests run on the system Python)."""
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    ours = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        ours.append(site.getusersitepackages())
    Path(purelib.stdout.strip(), "_autoplace_test_outer_env.pth").write_text(
        "".join(f"{path}\n" for path in ours if Path(path).is_dir()))


def test_the_wheel_installs_into_a_fresh_venv_and_plans(dist, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    _see_this_environment(python)
    wheel = next(dist.glob("*.whl"))
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])

    # Outside the checkout, so neither the current directory nor the editable install can
    # stand in for the installed wheel.
    where = _run([str(python), "-c", "import autoplace, cost_models; "
                  "print(autoplace.__file__); print(cost_models.__file__)"], cwd=tmp_path)
    for path in where.stdout.split():
        assert Path(path).resolve().is_relative_to(env_dir.resolve()), where.stdout

    assert "usage: autoplace" in _run([str(bindir / "autoplace"), "--help"],
                                      cwd=tmp_path).stdout
    out = tmp_path / "out"
    _run([str(bindir / "autoplace"), "plan", str(ROOT / "examples" / "mlp.py"), "--devices",
          "2xA100-40GB", "--out", str(out), "--time-limit", "2"], cwd=tmp_path)
    data = json.loads((out / "plan.json").read_text())
    assert data["verification"]["status"] == "passed"
    assert data["makespan_s"] > 0
    assert "Plotly" in (out / "report.html").read_text()  # the vendored plotly.js came along
    assert (out / "model" / "weights.safetensors").is_file()
    assert (out / "model" / "_runtime.py").is_file()  # the engine, copied from the wheel
