"""README's quick tour runs as shown: every line of the `<!-- tour -->` block, in order, in one folder, ends with
the exit code its comment gives (a command the README shows that no longer works as shown fails here)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tour() -> list[tuple[list[str], int]]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- tour -->"):]
    block = block[block.index("```sh") + len("```sh"):]
    block = block[:block.index("```")]
    out = []
    for line in block.strip().splitlines():
        command, _, comment = line.partition("#")
        code = re.search(r"exit (\d+)", comment)
        assert code is not None, f"README tour line without its exit code: {line}"
        out.append((shlex.split(command), int(code.group(1))))
    return out


def test_the_readme_tour_runs_as_shown(tmp_path: Path) -> None:
    steps = tour()
    assert len(steps) >= 8 and all(argv[0] == "kimi-audit" for argv, _ in steps)
    for argv, want in steps:
        r = subprocess.run([sys.executable, "-m", "kimi_audit", *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "120",
                                           "HF_HUB_OFFLINE": "1"}, timeout=300)
        assert r.returncode == want, (argv, r.returncode, r.stdout[-1500:], r.stderr[-1500:])
        assert "Traceback" not in r.stderr
