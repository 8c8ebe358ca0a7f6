"""The release gate in CI (docs/ci.md): one run writes every report (`-o` repeatable), a Hub pull request is a
revision (`OWNER/NAME@refs/pr/N`), `--expect-revision` holds a local git clone to its HEAD, and docs/ci.md's JUnit
testcase list is the one the report emits. Each test failed before its change."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_server import FakeHub
from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.replica.tiny import build_tiny
from kimi_audit.report.junit import CHECKS, render_junit
from kimi_audit.report.markdown import render_markdown
from kimi_audit.sources.git import git_head
from kimi_audit.sources.local import LocalSource

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def run(argv: list[str], where: Path) -> tuple[int, str, str]:
    import os

    here = Path.cwd()
    os.chdir(where)
    try:
        r = runner.invoke(app, argv)
    finally:
        os.chdir(here)
    assert r.exception is None or isinstance(r.exception, SystemExit), (argv, r.exception)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    return build_tiny(tmp_path / "broken", fault="missing-scale")


# --- one run, every report ----------------------------------------------------------------------------------------


def test_every_output_is_written_and_the_verdict_goes_to_stderr(tiny_copy: Path, broken: Path) -> None:
    where = tiny_copy.parent
    code, out, err = run(["audit", "ckpt", "-o", "a.xml", "-o", "a.sarif", "-o", "a.html", "-o", "a.md",
                          "-o", "a.json", "--no-progress"], where)
    assert code == 0 and out == ""
    assert ET.parse(where / "a.xml").getroot().tag == "testsuites"
    assert json.loads((where / "a.sarif").read_text())["version"] == "2.1.0"
    assert (where / "a.html").read_text().startswith("<!DOCTYPE html>")
    assert (where / "a.md").read_text().startswith("## kimi-audit: ✅ PASS")
    assert json.loads((where / "a.json").read_text())["result"]["verdict"] == "PASS"
    (line,) = err.strip().splitlines()
    assert line.startswith("PASS  0 errors, 0 warnings: ckpt") and "a.xml (junit)" in line and "a.html (html)" in line
    code, out, err = run(["audit", "broken", "-o", "b.xml", "-o", "b.sarif", "--no-progress"], broken.parent)
    assert code == 1 and out == "" and err.strip().splitlines()[-1].startswith("FAIL  1 error, 0 warnings: broken")
    assert ET.parse(broken.parent / "b.xml").getroot().get("failures") == "1"
    assert json.loads((broken.parent / "b.sarif").read_text())["runs"][0]["results"]


@pytest.mark.parametrize("argv", [["-o", "out.yaml"], ["-o", "a.xml", "-o", "out.yaml"], ["-o", "a.xml", "-o", "a.xml"],
                                  ["--format", "sarif", "-o", "a.sarif", "-o", "a.html"],
                                  ["--json", "-o", "a.json", "-o", "a.xml"]])
def test_a_bad_output_list_is_exit_2_and_writes_nothing(tiny_copy: Path, argv: list[str]) -> None:
    where = tiny_copy.parent
    before = sorted(p.name for p in where.iterdir())
    code, out, err = run(["audit", "ckpt", *argv, "--no-progress"], where)
    assert code == 2, err
    assert out == "" if "--json" not in argv else json.loads(out)["exit_code"] == 2  # --json: the error as JSON
    assert sorted(p.name for p in where.iterdir()) == before


def test_format_names_the_files_without_an_extension(tiny_copy: Path) -> None:
    where = tiny_copy.parent
    code, _, _ = run(["audit", "ckpt", "--format", "sarif", "-o", "a.sarif", "-o", "report", "--no-progress"], where)
    assert code == 0 and json.loads((where / "report").read_text())["version"] == "2.1.0"
    code, _, _ = run(["audit", "ckpt", "--format", "junit", "-o", "results.junit", "--no-progress"], where)
    assert code == 0 and ET.parse(where / "results.junit").getroot().tag == "testsuites"


def test_unusable_input_leaves_an_error_document_in_every_machine_format(tmp_path: Path) -> None:
    code, _, _ = run(["audit", "no-such-dir", "-o", "e.sarif", "-o", "e.xml", "-o", "e.json", "-o", "e.html"],
                     tmp_path)
    assert code == 2
    assert json.loads((tmp_path / "e.sarif").read_text())["runs"][0]["invocations"][0]["executionSuccessful"] is False
    assert ET.parse(tmp_path / "e.xml").getroot().get("errors") == "1"
    assert "error" in json.loads((tmp_path / "e.json").read_text())
    assert not (tmp_path / "e.html").exists()  # a page for people: nothing to show


def test_params_and_verify_refuse_an_extension_no_format_writes(tiny_copy: Path) -> None:
    for command in ("params", "verify"):
        code, _, err = run([command, "ckpt", "-o", "out.yaml"], tiny_copy.parent)
        assert code == 2 and not (tiny_copy.parent / "out.yaml").exists(), err


# --- the CI docs in step ------------------------------------------------------------------------------------------


def test_ci_md_lists_every_junit_testcase(tiny_dir: Path) -> None:
    emitted = [c.get("name") for c in ET.fromstring(render_junit(audit_source(LocalSource(tiny_dir))))
               .iter("testcase")]
    assert emitted == [c.name for c in CHECKS] + ["q_a_layernorm"]
    text = (ROOT / "docs" / "ci.md").read_text()
    (listed,) = re.findall(r"one testcase per check\s*\(([^)]*)\)", text)
    assert [w.strip() for w in listed.split(",")] == emitted


def test_one_error_is_one_error_in_the_markdown(broken: Path) -> None:
    report = audit_source(LocalSource(broken))
    assert report.errors == 1
    text = render_markdown(report)
    assert "| findings | 1 error, 0 warnings (fail on error) |" in text and "### Findings (1 error, 0 warnings)" in text
    assert "1 errors" not in text and "1 errors" not in render_junit(report)


# --- a pull request on the Hub ------------------------------------------------------------------------------------


def test_a_hub_pull_request_is_audited_before_it_is_merged(hub: FakeHub, tiny_dir: Path, broken: Path,
                                                            tmp_path: Path) -> None:
    repo = "acme/pr-gate"
    hub.add_repo(repo, tiny_dir)
    try:
        pr = hub.add_pr(repo, broken, number=1)
        code, out, _ = run(["audit", repo, "--json", "--no-progress"], tmp_path)
        assert code == 0 and json.loads(out)["revision"] == hub.repos[repo].commit
        code, out, _ = run(["audit", f"{repo}@refs/pr/1", "--json", "--no-progress"], tmp_path)
        data = json.loads(out)
        assert code == 1 and data["revision"] == pr
        assert [f["code"] for f in data["findings"]] == ["SCALE_MISSING"]
        code, _, _ = run(["audit", repo, "--revision", "refs/pr/1", "--expect-revision", pr[:10], "-o", "pr.sarif",
                          "--no-progress"], tmp_path)
        assert code == 1 and json.loads((tmp_path / "pr.sarif").read_text())["runs"][0]["results"]
        code, _, err = run(["audit", f"{repo}@refs/pr/2", "--no-progress"], tmp_path)
        assert code == 2 and "refs/pr/2" in err
    finally:
        hub.repos.pop(repo, None)


# --- --expect-revision on a local git clone -----------------------------------------------------------------------


def git(where: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=where, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(subprocess.run(["which", "git"], capture_output=True).returncode != 0, reason="no git")
def test_expect_revision_holds_a_git_clone_to_its_head(tiny_copy: Path, tmp_path: Path) -> None:
    where = tiny_copy.parent
    assert git_head(tiny_copy) is None
    code, _, _ = run(["audit", "ckpt", "--expect-revision", "1234567", "--no-progress"], where)
    assert code == 1  # no clone: no revision to hold it to
    git(tiny_copy, "init", "-q", "-b", "main")
    git(tiny_copy, "add", ".")
    git(tiny_copy, "commit", "-qm", "release")
    head = git(tiny_copy, "rev-parse", "HEAD")
    assert git_head(tiny_copy) == head  # a loose ref
    code, out, _ = run(["audit", "ckpt", "--expect-revision", head[:12], "--json", "--no-progress"], where)
    assert code == 0, out
    code, out, _ = run(["audit", "ckpt", "--expect-revision", "1234567", "--json", "--no-progress"], where)
    (gate,) = json.loads(out)["findings"]
    assert code == 1 and gate["code"] == "REVISION_GATE" and head in gate["message"]
    git(tiny_copy, "pack-refs", "--all")
    assert not (tiny_copy / ".git" / "refs" / "heads" / "main").exists() and git_head(tiny_copy) == head
    git(tiny_copy, "checkout", "-q", "--detach")
    assert git_head(tiny_copy) == head  # a detached HEAD names the commit itself
    git(tiny_copy, "checkout", "-q", "main")
    git(tiny_copy, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "other")
    assert (tmp_path / "wt" / ".git").is_file() and git_head(tmp_path / "wt") == head  # gitdir: and commondir
    git(tiny_copy, "checkout", "-q", "--orphan", "unborn")
    assert git_head(tiny_copy) is None  # a branch with no commit yet
    (tiny_copy / "sub").mkdir()
    assert git_head(tiny_copy / "sub") is None  # only the folder itself: never a repository above it
