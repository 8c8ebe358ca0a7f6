"""`precommit`: the pre-commit hook's entry point (.pre-commit-hooks.yaml): the files a commit changes, mapped to
the checkpoints that hold them, each audited once."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from rich.text import Text

from kimi_audit.cli.application import app, stderr, stdout, user_errors
from kimi_audit.constants import CONFIG_FILE
from kimi_audit.errors import KimiAuditError
from kimi_audit.text import printable

GGUF_PART = re.compile(r"^(?P<set>.*)-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
CHECKPOINT_FILE = re.compile(r"(\.safetensors|\.safetensors\.index\.json|\.gguf)$", re.IGNORECASE)
WORST = (2, 1, 3, 0)
"""How the runs' exit codes combine: unusable input over a failure over inconclusive over a pass."""


def checkpoints_of(files: list[Path]) -> dict[str, Path]:
    """What to audit for the changed files, each checkpoint once, in the order first named: a safetensors file,
    index or config.json stands for its folder; a GGUF file for its split set (any part names it), or itself. A
    folder that holds no checkpoint file (a config.json of something else) is left out."""
    out: dict[str, Path] = {}
    for f in files:
        if f.suffix.lower() == ".gguf":
            m = GGUF_PART.match(f.name)
            out.setdefault(f"gguf:{f.parent / (m.group('set') if m else f.name)}", f)
            continue
        folder = f.parent
        if f.name != CONFIG_FILE and not CHECKPOINT_FILE.search(f.name):
            continue
        try:
            holds = any(CHECKPOINT_FILE.search(p.name) and p.suffix.lower() != ".gguf" for p in folder.iterdir())
        except OSError:
            holds = False
        if holds:
            out.setdefault(f"dir:{folder.resolve()}", folder)
    return out


@app.command()
@user_errors
def precommit(
    files: list[Path] | None = typer.Argument(None, help="The files a commit changes (pre-commit passes them)."),
    values: bool = typer.Option(False, "--values", help="Also fetch and check every small tensor's values."),
    fail_on: str = typer.Option("error", "--fail-on", help="Exit 1 on findings of this severity or worse: "
                                "error or warning."),
    ignore: list[str] | None = typer.Option(None, "--ignore", metavar="CODE[:GLOB]", help="Accept a known "
                                            "deviation (as audit's --ignore). Repeatable."),
) -> None:
    """The pre-commit hook: audit each checkpoint the changed files belong to, once.

    A safetensors shard, an index or a config.json stands for its folder; a GGUF part for its split set. Each
    checkpoint's verdict is one line; a failing one's findings follow. Exit 0 when every checkpoint passes,
    else the worst exit code (2 unusable input, 1 fail, 3 inconclusive). Set up in a model repository's
    .pre-commit-config.yaml as docs/ci.md shows.
    """
    from kimi_audit.checks.audit import audit_source
    from kimi_audit.checks.ignore import apply_ignores
    from kimi_audit.cli.ci import resolve_fail_on, resolve_ignores
    from kimi_audit.report.markdown import counted
    from kimi_audit.report.table import render_table
    from kimi_audit.sources import open_source

    severity, rules = resolve_fail_on(fail_on), resolve_ignores(ignore)
    codes = []
    for source in checkpoints_of(list(files or ())).values():
        try:
            src = open_source(str(source))
            if values:
                from kimi_audit.checks.values import audit_with_values
                report = audit_with_values(src)
            else:
                report = audit_source(src)
        except KimiAuditError as e:
            stderr.print(Text(printable(f"error: {source}: {e}")), soft_wrap=True)
            codes.append(e.exit_code)
            continue
        report = apply_ignores(report, rules)
        code = report.exit_code(severity)
        if code != 0:
            render_table(report, stdout, severity, plain=True)
        stdout.print(Text(printable(f"kimi-audit {report.headline(severity)}  {counted(report)}: {source}")),
                     soft_wrap=True)
        codes.append(code)
    raise typer.Exit(next((c for c in WORST if c in codes), 0))
