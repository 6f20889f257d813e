"""The README's two set-up commands are the ones CI and users run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in (ROOT / "README.md").read_text()


def test_readme_example_command_names_an_existing_example():
    readme = (ROOT / "README.md").read_text()
    examples = [p.name for p in (ROOT / "examples").glob("*.py")]
    assert any(f"autoplace plan examples/{name}" in readme for name in examples)
