"""The package reads as the data flow: no stage imports a later one, and no module passes 400 lines.

sources/ -> format/ -> numerics/ -> model/ -> checks/ -> verify/ -> download/ -> report/ -> cli/; the shared
modules at the package root (errors, findings, constants, gcpause, outputs) come before them all. Every import
counts, those inside functions included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_audit"
SHARED = {"errors", "findings", "constants", "gcpause", "outputs"}
STAGES = ["sources", "format", "numerics", "model", "checks", "verify", "download", "report", "cli"]
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


def imported(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            pkg_dir = PACKAGE / node.module.replace("kimi_audit", "").strip(".").replace(".", "/")
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names if (pkg_dir / a.name).exists())
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
