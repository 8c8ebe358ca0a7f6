"""The pre-commit hook (.pre-commit-hooks.yaml, `kimi-audit precommit`), run by pre-commit itself.

`pre-commit try-repo` clones the hook's repository at HEAD (a local one with uncommitted changes: its tracked
changes, in a shadow commit; never an untracked file). The hook is `language: system`, so all pre-commit takes from
its repository is the manifest: the test gives try-repo a git repository holding this working tree's
.pre-commit-hooks.yaml, whatever is committed, and the `kimi-audit` on PATH is this test's virtualenv's. Nothing is
installed, nothing fetched: it runs offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_audit.cli.precommit import checkpoints_of
from kimi_audit.replica.tiny import build_tiny

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PRE_COMMIT = shutil.which("pre-commit", path=str(BIN))
GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(PRE_COMMIT is None or GIT is None, reason="pre-commit (the test extra) and git")


def env(home: Path) -> dict[str, str]:
    return {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
            "PRE_COMMIT_HOME": str(home / "pre-commit"), "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "LANG": "C.UTF-8", "NO_COLOR": "1", "TERM": "dumb"}


def sh(argv: list[str], where: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=where, env=env(home), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the hook's repository, a model repository with `clean/` and `broken/` committed, HOME)."""
    home = tmp_path_factory.mktemp("home")
    (home / "gitconfig").write_text("[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n")
    hooks = tmp_path_factory.mktemp("hook-repo")
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks / ".pre-commit-hooks.yaml")
    models = tmp_path_factory.mktemp("model-repo")
    build_tiny(models / "clean")
    build_tiny(models / "broken", fault="missing-scale")
    (models / "README.md").write_text("a model\n")
    for where in (hooks, models):
        for argv in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "init"]):
            r = sh(argv, where, home)
            assert r.returncode == 0, r.stderr
    return hooks, models, home


def try_repo(repos: tuple[Path, Path, Path], *args: str) -> subprocess.CompletedProcess[str]:
    hooks, models, home = repos
    return sh([str(PRE_COMMIT), "try-repo", str(hooks), "kimi-audit", "--verbose", *args], models, home)


def test_the_manifest_is_valid() -> None:
    r = subprocess.run([str(PRE_COMMIT), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_config_docs_ci_md_shows_is_valid(tmp_path: Path) -> None:
    import re

    import yaml

    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "ci.md").read_text(), re.S)
                if b.startswith("repos:")]
    (tmp_path / ".pre-commit-config.yaml").write_text(block)
    r = subprocess.run([str(PRE_COMMIT), "validate-config", str(tmp_path / ".pre-commit-config.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (repo,) = yaml.safe_load(block)["repos"]
    assert [h["id"] for h in repo["hooks"]] == [h["id"] for h in manifest]


def test_a_clean_checkpoint_passes_the_hook(repos: tuple[Path, Path, Path]) -> None:
    r = try_repo(repos, "--files", "clean/config.json", "clean/model-1-of-3.safetensors",
                 "clean/model.safetensors.index.json", "README.md")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("kimi-audit PASS") == 1 and "clean" in r.stdout  # three files, one checkpoint, one audit


def test_a_broken_checkpoint_fails_the_hook(repos: tuple[Path, Path, Path]) -> None:
    r = try_repo(repos, "--files", "broken/model-2-of-3.safetensors")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "SCALE_MISSING" in r.stdout and "kimi-audit FAIL" in r.stdout
    r = try_repo(repos, "--all-files")
    assert r.returncode == 1 and r.stdout.count("kimi-audit PASS") == 1 and r.stdout.count("kimi-audit FAIL") == 1


def test_a_staged_change_is_what_the_hook_sees(repos: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`git commit` runs the hook on the staged files: a shard replaced by a broken one fails the commit."""
    hooks, models, home = repos
    work = tmp_path / "work"
    assert sh(["git", "clone", "-q", str(models), str(work)], tmp_path, home).returncode == 0
    shutil.copy(work / "broken" / "model-2-of-3.safetensors", work / "clean" / "model-2-of-3.safetensors")
    assert sh(["git", "add", "clean"], work, home).returncode == 0
    r = sh([str(PRE_COMMIT), "try-repo", str(hooks), "kimi-audit"], work, home)
    assert r.returncode == 1, r.stdout + r.stderr


def test_changed_files_map_to_each_checkpoint_once(tmp_path: Path) -> None:
    a, b = build_tiny(tmp_path / "a"), build_tiny(tmp_path / "b")
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "config.json").write_text("{}")
    gguf = tmp_path / "g"
    gguf.mkdir()
    files = [a / "config.json", b / "model-1-of-3.safetensors", a / "model-2-of-3.safetensors",
             tmp_path / "tool" / "config.json", gguf / "K-00001-of-00002.gguf", gguf / "K-00002-of-00002.gguf",
             gguf / "other.gguf", a / "README.md"]
    assert list(checkpoints_of(files).values()) == [a, b, gguf / "K-00001-of-00002.gguf", gguf / "other.gguf"]
