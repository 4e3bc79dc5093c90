"""The modules of src/ import one another without a circle: every import counts, at the top, inside a function or
under TYPE_CHECKING, so that each module can be read with only what it names below it in mind."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every project module `path` imports anywhere in the file (a `from package import module` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    known = set(files)
    return {name: imported_modules(path, known) - {name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_src_has_no_import_circle():
    graph = import_graph()
    assert "vla_scale.trainer" in graph and "vla_scale.config" in graph["vla_scale.trainer"]
    assert circles(graph) == []


ROOT = SRC.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def mapped_paths(text: str) -> set[str]:
    """The file and folder paths the module map (the first ``` block under "## Layout") names, nesting resolved by
    indentation (`  envs/` then `    types.py` is src/vla_scale/envs/types.py)."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths, stack = set(), []  # stack: (indent, folder)
    for line in block.splitlines():
        entry = line.split("  ", 1)[0] if not line.startswith(" ") else line.strip().split(" ", 1)[0]
        if not entry or not line.strip() or line.startswith(" " * 30):  # blank, or a continued description
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(folder for _, folder in stack) + entry
        paths.add(path.rstrip("/"))
        if entry.endswith("/"):
            stack.append((indent, entry))
    return paths


def test_the_module_map_names_every_module_and_nothing_else():
    named = mapped_paths(ARCHITECTURE.read_text())
    modules = {str(p.relative_to(ROOT)) for d in ("src", "benchmarks", "launch") for p in (ROOT / d).rglob("*.py")
               if p.name != "__init__.py"}
    packages = {str(p.parent.relative_to(ROOT)) for p in (SRC / "vla_scale").rglob("__init__.py")
                if p.parent != SRC / "vla_scale"}
    listed = {p for p in named if p.startswith(("src/", "benchmarks/", "launch/"))}
    assert modules - listed == set(), "modules missing from docs/ARCHITECTURE.md's map"
    assert packages - listed == set(), "packages missing from docs/ARCHITECTURE.md's map"
    assert {p for p in listed if not (ROOT / p).exists()} == set(), "the map names paths that do not exist"


def test_every_package_says_its_idea():
    for init in (SRC / "vla_scale").rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{init.relative_to(ROOT)} has no docstring saying its one idea"


def test_tests_are_laid_out_as_the_packages_are():
    """Every test folder is a package of src/vla_scale (same path), launch/ (the entry scripts, end to end) or
    benchmarks/ (each script's dry run, one file a script); only the checks of the whole repository (this file) and of
    top-level modules sit at the top; tests/fixtures/ holds reference data, no tests."""
    tests = ROOT / "tests"
    folders = {str(p.relative_to(tests)) for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    folders = {f for f in folders if f.split("/")[0] != "fixtures"}
    assert not list((tests / "fixtures").rglob("test_*.py"))
    packages = {str(p.parent.relative_to(SRC / "vla_scale")) for p in (SRC / "vla_scale").rglob("__init__.py")}
    assert folders - packages - {"launch", "benchmarks"} == set(), "test folders with no package of the same path"
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    for test in (tests / "benchmarks").glob("test_*.py"):
        assert test.stem.removeprefix("test_") in scripts, f"{test.name}: no benchmarks/ script of that name"
    top_modules = {p.stem for p in (SRC / "vla_scale").glob("*.py")}
    for test in tests.glob("test_*.py"):
        subject = test.stem.removeprefix("test_")
        assert subject in top_modules | {"import_layout"}, test.name


def test_the_model_layer_imports_nothing_of_the_run_configuration():
    """`models/` takes specs and folders; the run's `model.*` keys become a policy in `run_policy.py`, above it, and
    in each family's own translation (its record's `run` module), the one module of a family folder that reads
    them."""
    from vla_scale.models.registry import FAMILIES

    graph = import_graph()
    above = {"vla_scale.config", "vla_scale.run_policy", "vla_scale.trainer", "vla_scale.run_setup"}
    translations = {record.run for record in FAMILIES.values()}
    reaching_up = {name: sorted(m for m in deps if m.split(".")[:2] == ["vla_scale", "config"] or m in above)
                   for name, deps in graph.items() if name.startswith("vla_scale.models") and name not in translations}
    assert {name: deps for name, deps in reaching_up.items() if deps} == {}
    assert "vla_scale.models.oft.spec" in graph["vla_scale.run_policy"]
