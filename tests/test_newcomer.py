"""A newcomer's first hour (issue 32): the output format follows --output's extension, a contradiction is one
error line, and the accounting names each part once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app

runner = CliRunner()


@pytest.mark.parametrize(("name", "start"), [("report.html", "<!DOCTYPE html>"), ("report.json", "{"),
                                             ("report.sarif", "{"), ("report.xml", "<?xml"),
                                             ("report.md", "#")])
def test_the_output_extension_chooses_the_format(tiny_dir: Path, tmp_path: Path, name: str, start: str) -> None:
    """`audit DIR -o report.html` wrote the text table into the .html file, exit 0."""
    out = tmp_path / name
    r = runner.invoke(app, ["audit", str(tiny_dir), "-o", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert out.read_text().lstrip().startswith(start)
    if name.endswith(".json"):
        assert json.loads(out.read_text())["result"]["verdict"] == "PASS"


def test_a_format_the_extension_contradicts_is_one_error_line(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["audit", str(tiny_dir), "-o", str(out), "--format", "markdown", "--no-progress"])
    assert r.exit_code == 2 and "contradicts --format markdown" in r.output and not out.exists()


def test_params_names_the_output_head_once(tiny_dir: Path) -> None:
    r = runner.invoke(app, ["params", str(tiny_dir), "--no-progress"])
    assert r.exit_code == 0 and "Output head" in r.output and "(lm_head) (lm_head)" not in r.output
