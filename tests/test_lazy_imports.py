"""What the command line's header paths do not import: counted in sys.modules of a fresh process, not timed.

Each case runs the command in a fresh interpreter (test_imports.probe: `python -m kimi_audit ...` through runpy,
the process reporting its own sys.modules). `--help`, `audit --help` and the header audits of a GGUF split set and
of a safetensors checkpoint read no tensor values, so they load none of numpy, ml_dtypes, safetensors or gguf-py;
typer 0.29's pydantic coercion is replaced for their str/bool/Path parameters and the defaults of their int ones
(cli/coercion.py), the TLS modules
load only when a Hub connection fails (sources/hub_network.py), and rich's progress bars only on a terminal. The
controls keep each check honest: a command that computes on values loads numpy, and an int option given on the
command line still goes through typer's own (pydantic) coercion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_imports import importer_of

GGUF_SET = Path(__file__).parent / "data" / "gguf" / "Q8_0"

NOT_ON_THE_HEADER_PATH = ("numpy", "ml_dtypes", "safetensors", "gguf", "pydantic", "ssl",
                          "kimi_audit.numerics.ggml", "kimi_audit.numerics.fp4", "kimi_audit.verify")
NOT_IN_A_HEADER_AUDIT = (*NOT_ON_THE_HEADER_PATH, "rich.progress")  # (--help's renderer, typer's, loads it)

PROBE = """
import json, os, runpy, sys


def exit_here(code):  # main() ends with os._exit: turned back into SystemExit so the probe can report
    raise SystemExit(code)


os._exit = exit_here
sys.argv = ["kimi-audit", *json.loads(sys.argv[1])]
code = None
try:
    runpy.run_module("kimi_audit", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print("\\nPROBE " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded(args: list[str]) -> tuple[int | None, set[str], str]:
    """The command's exit code, every module it loaded, and its -X importtime log (who imported what)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE, json.dumps(args)],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"probe failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    got = json.loads(lines[-1][len("PROBE "):])
    return got["code"], set(got["modules"]), r.stderr


def _case(name: str, tiny_dir: Path) -> list[str]:
    return {"--help": ["--help"], "audit --help": ["audit", "--help"],
            "audit GGUF set": ["audit", str(GGUF_SET), "--json"],
            "audit safetensors": ["audit", str(tiny_dir), "--json"]}[name]


@pytest.mark.parametrize("name", ["--help", "audit --help", "audit GGUF set", "audit safetensors"])
def test_header_paths_do_not_load_the_value_machinery(name: str, tiny_dir: Path) -> None:
    code, modules, log = loaded(_case(name, tiny_dir))
    assert code in (None, 0)
    audit = name in ("audit GGUF set", "audit safetensors")
    extra = [m for m in (NOT_IN_A_HEADER_AUDIT if audit else NOT_ON_THE_HEADER_PATH) if m in modules]
    assert not extra, "; ".join(f"{m} (via {importer_of(log, m)})" for m in extra)


def test_the_gguf_audit_reads_its_options_without_pydantic(tmp_path: Path) -> None:
    """Every str, list and Path option given (--include, --output twice, --fail-on, --ignore): still no pydantic,
    and the values arrive as typer would make them (the reports written where --output says)."""
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    code, modules, log = loaded(["audit", str(GGUF_SET), "--include", "*.gguf", "-o", str(out_json), "-o",
                                 str(out_md), "--fail-on", "warning", "--ignore", "HEADER_TOO_SHORT:*.gguf",
                                 "--no-progress"])
    assert code == 0
    assert "pydantic" not in modules, importer_of(log, "pydantic")
    assert json.loads(out_json.read_text())["result"]["verdict"] == "PASS" and out_md.read_text()


def test_controls_values_and_int_options_still_load_their_machinery(tiny_dir: Path) -> None:
    code, modules, _ = loaded(["rmsnorm", str(tiny_dir), "--layer", "0", "--tokens", "2", "--json"])
    assert code == 0
    assert {"numpy", "pydantic"} <= modules  # values computed; --layer/--tokens are ints: typer's own coercion


def test_an_int_options_default_needs_no_pydantic(tiny_dir: Path) -> None:
    """`verify` without `-j`: its int option's default (None) is kept as typer's adapter keeps it, without pydantic;
    given (`-j 1`), the str goes through typer's own coercion, its range and messages pydantic's."""
    code, modules, log = loaded(["verify", str(tiny_dir), "--json", "--no-progress"])
    assert code == 0
    assert "pydantic" not in modules, importer_of(log, "pydantic")
    code, modules, _ = loaded(["verify", str(tiny_dir), "--json", "--no-progress", "-j", "1"])
    assert code == 0 and "pydantic" in modules
    code, _, _ = loaded(["verify", str(tiny_dir), "--json", "--no-progress", "-j", "0"])
    assert code == 2  # `Input should be greater than or equal to 1`: typer's (pydantic's) refusal
