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


@pytest.mark.parametrize("argv", [["--layer", "3", "--all"], ["--input", "x.npy", "--seed", "3"],
                                  ["--from-embeddings", "1,2", "--tokens", "4"]])
def test_conflicting_rmsnorm_options_are_one_error_line(tiny_dir: Path, argv: list[str]) -> None:
    """`rmsnorm --layer 3 --all` and `--input x.npy --seed 3` silently ignored one of the two options."""
    r = runner.invoke(app, ["rmsnorm", str(tiny_dir), *argv])
    assert r.exit_code == 2 and ("exclusive" in r.output or "random input" in r.output), r.output


def test_verify_stream_of_a_local_directory_says_so(tiny_dir: Path) -> None:
    """`verify LOCAL_DIR --stream` took the directory for a Hub repo and failed on the network."""
    r = runner.invoke(app, ["verify", str(tiny_dir), "--stream", "--no-progress"])
    assert r.exit_code == 2 and "is a local directory" in r.output, r.output
