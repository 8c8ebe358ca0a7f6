"""The package reads as the data flow: no stage imports a later one, no import cycle, and no module
passes 400 lines.

sources/ -> format/ -> numerics/ -> model/ -> checks/ -> verify/ -> download/ -> replica/ -> report/ -> cli/;
the shared modules at the package root (errors, findings, constants, text, outputs) come before them all. Every import
counts, those inside functions and under TYPE_CHECKING included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_audit"
SHARED = {"errors", "findings", "constants", "text", "outputs"}
STAGES = ["sources", "format", "numerics", "model", "checks", "verify", "download", "replica", "report", "cli"]
MAX_LINES = 400


def stage_of(module: str) -> int | None:
    """Rank of a dotted kimi_audit module: -1 shared, 0.. a stage, None the package root API."""
    parts = module.split(".")
    if parts[0] != "kimi_audit":
        return None
    if len(parts) == 1 or parts[1] in ("__init__", "__main__", "api"):
        return None
    if parts[1] in SHARED:
        return -1
    return STAGES.index(parts[1])


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every kimi_audit import in the file; `from P import M` names the module P.M too
    when M is a module or package of `package` (the kimi_audit directory)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            pkg_dir = package / node.module.replace("kimi_audit", "").strip(".").replace(".", "/")
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names
                       if (pkg_dir / a.name).is_dir() or (pkg_dir / f"{a.name}.py").is_file())
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return [(line, m) for line, m in out if m.split(".")[0] == "kimi_audit"]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_stage() -> None:
    for path in MODULES:
        name = module_name(path)
        parts = name.split(".")
        if len(parts) == 1 or parts[1] in ("__main__", "api"):
            continue
        assert parts[1] in SHARED or parts[1] in STAGES, f"{name} is in no stage"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_stage_imports_a_later_one(path: Path) -> None:
    own = stage_of(module_name(path))
    if own is None:
        return
    late = [(line, m) for line, m in imported(path) if (s := stage_of(m)) is not None and s > own]
    assert not late, f"{module_name(path)} ({STAGES[own] if own >= 0 else 'shared'}) imports later stages: {late}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_over_400_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module_name(path)} has {lines} lines"


def test_the_check_recognises_a_backward_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from kimi_audit.cli.application import app\n")
    assert stage_of(imported(bad)[0][1]) == STAGES.index("cli")


def import_graph(paths: list[Path], package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of `paths` it imports (read by `imported`: every import statement)."""
    def name(path: Path) -> str:
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    names = {name(p) for p in paths}
    return {name(p): {m for _, m in imported(p, package) if m in names and m != name(p)} for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle: one path that leads back to its start (A -> B -> A), per set of modules that
    import each other (Tarjan's strongly connected components, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(_path_back(graph, component))
    return found


def _path_back(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for child in sorted(graph[node] & component):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover: a component of 2+ has one


def test_no_import_cycle() -> None:
    found = cycles(import_graph(MODULES))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_recognises_a_planted_cycle(tmp_path: Path) -> None:
    """Three modules of a package, a -> b at module level, b -> c and c -> a inside functions (the shape of
    the old checks.audit -> checks.report_dict -> checks.ignore circle), d importing a off the cycle."""
    pkg = tmp_path / "kimi_audit" / "stage"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from kimi_audit.stage.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from kimi_audit.stage import c\n")
    (pkg / "c.py").write_text("def g():\n    import kimi_audit.stage.a\n")
    (pkg / "d.py").write_text("from kimi_audit.stage.a import A\n")
    graph = import_graph(sorted(pkg.glob("*.py")), tmp_path / "kimi_audit")
    assert cycles(graph) == [["kimi_audit.stage.a", "kimi_audit.stage.b", "kimi_audit.stage.c", "kimi_audit.stage.a"]]
    graph["kimi_audit.stage.c"] = set()  # the function-level import gone: no cycle left
    assert cycles(graph) == []

