"""A red run keeps the failed test's folder, not the session's replicas (README: "It removes the temporary folders
it writes, except a failed test's")."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER = '''
def test_passes(tiny_dir, tmp_path):
    (tmp_path / "scratch").write_text("gone")


def test_fails(tiny_dir, tmp_path, tmp_path_factory):
    (tmp_path / "evidence").write_text("kept")
    (tmp_path_factory.mktemp("own") / "evidence").write_text("kept")
    assert False, "a red run"
'''


def test_a_red_run_keeps_the_failed_tests_folders_not_the_session_fixtures(tmp_path: Path) -> None:
    """pytest's `tmp_path_retention_policy = "failed"` kept the whole base folder of a red run: every session
    fixture's folder (the full-scale replicas: 2.7 GB) beside the failed test's. A session of this suite's own
    conftest (the tiny checkpoint, a session fixture, stands for the replicas) with one passing and one failing
    test leaves the failing test's tmp_path and the folder its call made, nothing else."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "test_inner.py").write_text(INNER)
    root = tmp_path / "temproot"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
           "PYTEST_DEBUG_TEMPROOT": str(root)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                        "-o", "tmp_path_retention_policy=failed", "--rootdir", str(inner), str(inner)],
                       cwd=inner, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 1 and "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
    basetemp = root / f"pytest-of-{getpass.getuser()}" / "pytest-0"
    assert sorted(p.name for p in basetemp.iterdir() if not p.is_symlink()) == ["own0", "test_fails0"]
    assert (basetemp / "test_fails0" / "evidence").read_text() == "kept"
    assert (basetemp / "own0" / "evidence").read_text() == "kept"
