"""README runs as shown: every command block after the two set-up commands (the quick tour and each task's
block), line by line and in order, in one folder, ends with the exit code its comment gives; then README's
Python block runs in that folder. A command the README shows that no longer works as shown fails here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "120", "HF_HUB_OFFLINE": "1"}


def blocks(lang: str) -> list[str]:
    """README's ```lang blocks after the `<!-- tour -->` marker (the set-up commands come before it)."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index("<!-- tour -->"):]
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def steps() -> list[tuple[list[str], int]]:
    out = []
    for block in blocks("sh"):
        for line in block.strip().splitlines():
            command, _, comment = line.partition("#")
            code = re.search(r"exit (\d+)", comment)
            assert code is not None, f"README command without its exit code: {line}"
            out.append((shlex.split(command), int(code.group(1))))
    return out


def test_every_readme_command_runs_as_shown(tmp_path: Path) -> None:
    todo = steps()
    assert len(todo) >= 25 and all(argv[0] == "kimi-audit" for argv, _ in todo)
    for argv, want in todo:
        r = subprocess.run([sys.executable, "-m", "kimi_audit", *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, env=ENV, timeout=300)
        assert r.returncode == want, (argv, r.returncode, r.stdout[-1500:], r.stderr[-1500:])
        assert "Traceback" not in r.stderr
    (python,) = blocks("python")
    r = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert r.returncode == 0 and "PASS 6,212,056" in r.stdout, (r.stdout[-1500:], r.stderr[-1500:])
