"""The shape of the code, checked: modules a person reads in one sitting (at most 600 lines), no
import cycle between modules (function-local imports included), `cost_models` never importing
`autoplace`, neither importing `research`, `autoplace.profile` never importing `autoplace.emit`,
and ruff clean with C90 (no function above complexity 15).

Read ``_modules`` and ``_imports`` first: they turn the source tree into the import graph the
cycle and direction tests look at. Each failure names every offender, with its line numbers.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autoplace", "cost_models")
MAX_MODULE_LINES = 600
MAX_COMPLEXITY = 15
MAX_CYCLES_SHOWN = 50  # a tangle has exponentially many; the first few name its modules
MAX_LOOSE_MODULES = 5
MAX_FOLDER_LINES = 3500
MAX_DOCSTRING_LINES = 15


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of a module on another of ours."""

    target: str
    line: int
    local: bool  # inside a function: deferred, but still a dependency when it runs


def _modules() -> dict[str, Path]:
    """Every module of the two packages by dotted name; ``pkg/__init__.py`` is ``pkg``."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that an import of ``name`` loads: ``name`` itself, or the longest
    prefix that is a module (``autoplace.x.y`` for a name defined there); None outside."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _walk(tree: ast.AST, *, local: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement, with whether it sits inside a function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, local
        inner = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(node, local=inner)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """What module ``name`` imports of ours, anywhere in its file. ``import a.b.c`` depends on
    ``a.b.c`` (not on its parents); ``from a.b import c`` on ``a.b.c`` when that is a module,
    else on ``a.b``; relative imports are resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []
    for node, local in _walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        for target in targets:
            ours = _ours(target, modules)
            if ours is not None and ours != name:
                found.append(Import(target=ours, line=node.lineno, local=local))
    return found


def _import_graph(modules: dict[str, Path]) -> nx.DiGraph:
    """Modules as nodes; an edge for each module another imports, with where it does."""
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for imp in _imports(name, path, modules):
            if not graph.has_edge(name, imp.target):
                graph.add_edge(name, imp.target, at=[])
            where = f"{name}:{imp.line}{' (in a function)' if imp.local else ''}"
            if where not in graph.edges[name, imp.target]["at"]:
                graph.edges[name, imp.target]["at"].append(where)
    return graph


def _describe(graph: nx.DiGraph, cycle: list[str]) -> str:
    """``a -> b -> a`` and, below it, the import lines that make each step."""
    edges = list(zip(cycle, [*cycle[1:], cycle[0]]))
    where = ", ".join(", ".join(graph.edges[edge]["at"]) for edge in edges)
    return f"{' -> '.join([*cycle, cycle[0]])}\n      imported at {where}"


def _cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Up to ``MAX_CYCLES_SHOWN`` cycles, shortest first, each from its smallest name so the
    report reads the same on every run."""
    found = [cycle[cycle.index(min(cycle)):] + cycle[:cycle.index(min(cycle))]
             for cycle in itertools.islice(nx.simple_cycles(graph), MAX_CYCLES_SHOWN)]
    return sorted(found, key=lambda cycle: (len(cycle), cycle))


def test_no_module_is_over_600_lines() -> None:
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in _modules().values()}
    over = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not over, (
        f"modules over {MAX_MODULE_LINES} lines (split them into pieces a person reads in one "
        "sitting): " + ", ".join(f"{path} ({lines} lines)" for path, lines in sorted(over.items())))


def test_no_import_cycle_between_modules() -> None:
    graph = _import_graph(_modules())
    cycles = _cycles(graph)
    many = f" (the first {MAX_CYCLES_SHOWN})" if len(cycles) == MAX_CYCLES_SHOWN else ""
    assert not cycles, (
        f"{len(cycles)} import cycles{many}; function-local imports count, they run too:\n"
        + "\n".join(f"  {_describe(graph, cycle)}" for cycle in cycles))


def _imports_of(top: str, *, within: str = "") -> list[str]:
    """Every absolute import of package ``top`` in our modules whose dotted name starts with
    ``within``, function-local ones included, as ``path:line imports name``."""
    offenders: list[str] = []
    for name, path in _modules().items():
        if not name.startswith(within):
            continue
        for node, _ in _walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if node.level == 0 else [])
            offenders += [f"{path.relative_to(ROOT).as_posix()}:{node.lineno} imports {imported}"
                          for imported in names if imported.split(".")[0] == top]
    return offenders


def test_cost_models_never_imports_autoplace() -> None:
    offenders = _imports_of("autoplace", within="cost_models")
    assert not offenders, ("cost_models must not import autoplace (the dependency goes one way):"
                           "\n  " + "\n  ".join(offenders))


def test_neither_package_imports_research() -> None:
    assert (ROOT / "research" / "__init__.py").is_file()
    offenders = _imports_of("research")
    assert not offenders, ("research/ is outside the wheel: autoplace and cost_models must not "
                           "import it (it imports them):\n  " + "\n  ".join(offenders))


def test_the_tree_reads_as_its_stages() -> None:
    # At most five loose modules at autoplace's top (the rest are stages, packages named for
    # their verb), and no package folder over 3,500 lines of its own modules.
    loose = sorted(p.name for p in (ROOT / "autoplace").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, f"loose modules at autoplace/'s top: {loose}"
    folders: dict[str, int] = {}
    for path in _modules().values():
        folder = path.parent.relative_to(ROOT).as_posix()
        folders[folder] = folders.get(folder, 0) + len(path.read_text().splitlines())
    over = {f: n for f, n in folders.items() if n > MAX_FOLDER_LINES}
    assert not over, f"package folders over {MAX_FOLDER_LINES} lines of their own modules: {over}"


def test_module_docstrings_say_what_in_at_most_15_lines() -> None:
    # What the module does, in what order to read it, its sources; history goes to
    # docs/design-notes.md or the commit log.
    long = {path.relative_to(ROOT).as_posix(): len(doc.splitlines())
            for path in _modules().values()
            if (doc := ast.get_docstring(ast.parse(path.read_text()), clean=False))
            and len(doc.splitlines()) > MAX_DOCSTRING_LINES}
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {long}"


def test_ruff_with_complexity_at_most_15_passes() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"] and lint["mccabe"]["max-complexity"] == MAX_COMPLEXITY
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                           "autoplace", "cost_models"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, f"ruff check autoplace cost_models:\n{proc.stdout}{proc.stderr}"


def test_profile_never_imports_the_emitter() -> None:
    # The profiler measures; the emitter (the runtime library) is measured. What both need is
    # in lower packages (cluster.local, train), and the runtime's engine is handed in.
    graph = _import_graph(_modules())
    offenders = [f"{' and '.join(graph.edges[name, target]['at'])} imports {target}"
                 for name, target in graph.edges
                 if name.split(".")[:2] == ["autoplace", "profile"]
                 and target.split(".")[:2] == ["autoplace", "emit"]]
    assert not offenders, ("autoplace.profile must not import autoplace.emit (move what both "
                           "need below them, or hand it in):\n  " + "\n  ".join(offenders))


# --- the graph builder itself, on a package made up for the test -----------------------------


def test_imports_resolve_relative_submodule_and_function_local_forms(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "import os\nfrom . import b\nfrom .sub import c as c_module\n"
                    "def f():\n    from pkg import g\n",
        "pkg/b.py": "import pkg.sub.c\nfrom pkg.sub.c import thing\n",
        "pkg/g.py": "",
        "pkg/sub/__init__.py": "from ..b import x\n",
        "pkg/sub/c.py": "from .. import a\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    modules = {"pkg": tmp_path / "pkg/__init__.py", "pkg.a": tmp_path / "pkg/a.py",
               "pkg.b": tmp_path / "pkg/b.py", "pkg.g": tmp_path / "pkg/g.py",
               "pkg.sub": tmp_path / "pkg/sub/__init__.py", "pkg.sub.c": tmp_path / "pkg/sub/c.py"}

    def deps(name: str) -> list[tuple[str, int, bool]]:
        return [(i.target, i.line, i.local) for i in _imports(name, modules[name], modules)]

    assert deps("pkg") == [("pkg.a", 1, False)]
    assert deps("pkg.a") == [("pkg.b", 2, False), ("pkg.sub.c", 3, False), ("pkg.g", 5, True)]
    assert deps("pkg.b") == [("pkg.sub.c", 1, False), ("pkg.sub.c", 2, False)]  # not pkg.sub
    assert deps("pkg.sub") == [("pkg.b", 1, False)]
    assert deps("pkg.sub.c") == [("pkg.a", 1, False)]

    graph = _import_graph(modules)
    assert [_describe(graph, cycle) for cycle in _cycles(graph)] == [
        "pkg.a -> pkg.sub.c -> pkg.a\n      imported at pkg.a:3, pkg.sub.c:1",
        "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a\n      imported at pkg.a:2, pkg.b:1, pkg.b:2, "
        "pkg.sub.c:1",
    ]
