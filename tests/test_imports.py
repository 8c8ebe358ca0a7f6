"""numpy and ml_dtypes load only where tensor values are decoded.

Each case runs the command line in a fresh interpreter (`python -m kimi_audit ...` through runpy, so the
process can report its own `sys.modules` afterwards): `--version`, `--help` and the header audit must
not pay for ml_dtypes' extension (0.5-1 s) or, for `--version` and `--help`, numpy's import; a command
that computes on values (`rmsnorm`) must load both, which keeps the check honest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, os, runpy, sys


def exit_here(code):  # main() ends with os._exit: turned back into SystemExit so the probe can report
    raise SystemExit(code)


os._exit = exit_here
args = json.loads(sys.argv[1])
code = None
if args is None:
    import kimi_audit.cli  # noqa: F401
else:
    sys.argv = ["kimi-audit", *args]
    try:
        runpy.run_module("kimi_audit", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
print("\\nPROBE " + json.dumps({"code": code, "numpy": "numpy" in sys.modules,
                               "ml_dtypes": "ml_dtypes" in sys.modules, "typer": "typer" in sys.modules,
                               "stages": sorted(m for m in sys.modules if m.count(".") == 1
                                                and m.startswith("kimi_audit."))}))
"""

HEADER_ONLY = {
    "import kimi_audit.cli": None,
    "--version": ["--version"],
    "--help": ["--help"],
    "audit --help": ["audit", "--help"],
}

def probe(args: list[str] | None) -> tuple[dict[str, object], str]:
    """Run the command (or just `import kimi_audit.cli` for None); its exit code, what it loaded, and
    the -X importtime log (for the failure message: who imported numpy)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE, json.dumps(args)],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"probe failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}"
    return json.loads(lines[-1][len("PROBE "):]), r.stderr


def importer_of(importtime_log: str, module: str) -> str:
    """The chain of imports that pulled `module` in, innermost first, from -X importtime's output
    (a module's line comes after those of the modules it imported, one indent deeper)."""
    rows = []
    for line in importtime_log.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        name = line.rsplit("|", 1)[1]
        rows.append((len(name) - len(name.lstrip()), name.strip()))
    for i, (depth, name) in enumerate(rows):
        if name == module:
            chain = []
            for d, n in rows[i + 1:]:
                if d < depth:
                    chain.append(n)
                    depth = d
            return " <- ".join(chain) or "<top level>"
    return "<not imported>"


@pytest.mark.parametrize("case", list(HEADER_ONLY), ids=list(HEADER_ONLY))
def test_header_only_commands_do_not_load_ml_dtypes(case: str) -> None:
    got, log = probe(HEADER_ONLY[case])
    assert got["code"] in (None, 0)
    assert not got["ml_dtypes"], f"{case} imported ml_dtypes (via {importer_of(log, 'ml_dtypes')})"


@pytest.mark.parametrize("case", list(HEADER_ONLY), ids=list(HEADER_ONLY))
def test_header_only_commands_do_not_load_numpy(case: str) -> None:
    got, log = probe(HEADER_ONLY[case])
    assert got["code"] in (None, 0)
    assert not got["numpy"], f"{case} imported numpy (via {importer_of(log, 'numpy')})"


def test_header_audit_does_not_load_ml_dtypes(tiny_dir: Path) -> None:
    got, log = probe(["audit", str(tiny_dir), "--json", "--no-progress"])
    assert got["code"] == 0
    assert not got["ml_dtypes"], f"audit imported ml_dtypes (via {importer_of(log, 'ml_dtypes')})"


def test_version_answers_before_loading_the_app() -> None:
    """`--version` prints from the package root: no Typer, no rich, no stage of the pipeline."""
    got, _ = probe(["--version"])
    assert got["code"] == 0 and not got["typer"]
    assert set(got["stages"]) <= {"kimi_audit.cli", "kimi_audit.constants"}, got["stages"]  # constants: the version
    got, _ = probe(["--help"])  # the control: help needs the app
    assert got["typer"] and "kimi_audit.checks" in got["stages"]


def test_rmsnorm_loads_the_numerics_when_it_runs(tiny_dir: Path) -> None:
    got, _ = probe(["rmsnorm", str(tiny_dir), "--layer", "0", "--tokens", "2", "--json"])
    assert got["code"] == 0
    assert got["numpy"] and got["ml_dtypes"]


def test_importer_of_reads_the_importtime_tree() -> None:
    log = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       10 |         10 |       ml_dtypes._ext",
        "import time:       10 |         20 |     ml_dtypes",
        "import time:       10 |         30 |   kimi_audit.numerics.dtypes",
        "import time:       10 |         10 |   kimi_audit.errors",
        "import time:       10 |         40 | kimi_audit.cli",
    ])
    assert importer_of(log, "ml_dtypes") == "kimi_audit.numerics.dtypes <- kimi_audit.cli"
    assert importer_of(log, "kimi_audit.cli") == "<top level>"
    assert importer_of(log, "numpy") == "<not imported>"
