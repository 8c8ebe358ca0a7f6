"""Delivering an audit report in the CI formats: --format, --output, $GITHUB_STEP_SUMMARY; --ignore rules."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from kimi_audit.checks.audit import AuditReport
from kimi_audit.checks.ignore import IgnoreRule
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Severity
from kimi_audit.outputs import refuse_input, write_atomic
from kimi_audit.sources.base import Source
from kimi_audit.text import clip, printable

if TYPE_CHECKING:
    from rich.console import Console

FORMATS = ("table", "json", "junit", "markdown", "sarif", "html")
FAIL_ON = {"error": Severity.ERROR, "warning": Severity.WARNING}


def resolve_format(fmt: str | None, as_json: bool, output: Path | None = None) -> str:
    return choose_format(fmt, as_json, FORMATS, output)


BY_EXTENSION = {".json": "json", ".html": "html", ".htm": "html", ".xml": "junit", ".md": "markdown",
                ".sarif": "sarif", ".txt": "table"}
"""The format an --output file's extension names (`-o report.html` writes the page, not the text table)."""


def choose_format(fmt: str | None, as_json: bool, formats: tuple[str, ...], output: Path | None = None) -> str:
    """--format among `formats` (table by default, or what --output's extension names); --json is --format
    json. A contradiction (--json with another --format, a --format the output's extension does not name, or an
    extension naming a format the command does not write: never a text table in `p.md`) is exit 2."""
    if fmt is not None and fmt not in formats:
        raise KimiAuditError(f"--format must be one of {', '.join(formats)}, got {fmt!r}")
    if as_json and fmt not in (None, "json"):
        raise KimiAuditError(f"--json is --format json; it contradicts --format {fmt}")
    chosen = "json" if as_json else fmt
    named = BY_EXTENSION.get(output.suffix.lower()) if output is not None else None
    if output is not None and named is None and output.suffix and chosen is None:
        raise KimiAuditError(f"--output {output.name}: no format writes {output.suffix} files (this command writes "
                             f"{', '.join(_extensions(formats))}); name the format with --format")
    if output is not None and named is not None and named not in formats:
        raise KimiAuditError(f"--output {output.name} names the {named} format, which this command does not write "
                             f"(it writes {', '.join(formats)}: .txt for the table)")
    if output is not None and named is not None:
        if chosen is not None and chosen != named:
            raise KimiAuditError(f"--output {output.name} names the {named} format; it contradicts "
                                 f"{'--json' if as_json else '--format ' + chosen}")
        return named
    return chosen or "table"


def _extensions(formats: tuple[str, ...]) -> list[str]:
    return [f"{ext} ({name})" for ext, name in BY_EXTENSION.items() if name in formats and ext != ".htm"]


def resolve_outputs(fmt: str | None, as_json: bool, outputs: list[Path] | None) -> tuple[tuple[Path, str], ...]:
    """Each --output FILE (repeatable) with the format it is written in: its extension's (a --format or --json
    naming another is exit 2), or --format's for a file with no extension. The same file twice is exit 2. All
    decided before anything is read or written."""
    chosen = tuple((path, resolve_format(fmt, as_json, path)) for path in outputs or ())
    seen: set[Path] = set()
    for path, _ in chosen:
        key = Path(os.path.abspath(path))
        if key in seen:
            raise KimiAuditError(f"--output {path} is given twice")
        seen.add(key)
    return chosen


def resolve_fail_on(value: str) -> Severity:
    try:
        return FAIL_ON[value.lower()]
    except KeyError:
        raise KimiAuditError(f"--fail-on must be error or warning, got {value!r}") from None


def resolve_ignores(specs: list[str] | None) -> list[IgnoreRule]:
    """--ignore CODE / CODE:GLOB, each checked against the known finding codes (exit 2 on a bad one)."""
    from kimi_audit.checks.ignore import parse_ignore
    from kimi_audit.report.rules import RULES

    return [parse_ignore(spec, RULES) for spec in specs or ()]


def render(report: AuditReport, fmt: str, fail_on: Severity, elapsed: float, width: int | None = None,
           all_findings: bool = False) -> str:
    if fmt == "json":
        from kimi_audit.report.json_report import render_json
        return render_json(report, fail_on, all_findings)
    if fmt == "junit":
        from kimi_audit.report.junit import render_junit
        return render_junit(report, fail_on=fail_on, elapsed=elapsed)
    if fmt == "markdown":
        from kimi_audit.report.markdown import render_markdown
        return render_markdown(report, fail_on)
    if fmt == "sarif":
        from kimi_audit.report.sarif import render_sarif
        return render_sarif(report, fail_on)
    if fmt == "html":
        from kimi_audit.report.html import render_html
        return render_html(report, fail_on)
    from rich.console import Console

    from kimi_audit.report.table import render_table
    buf = io.StringIO()
    render_table(report, Console(file=buf, width=width or 120, color_system=None, soft_wrap=False), fail_on)
    return buf.getvalue()


def emit(text: str, output: Path | None) -> None:
    """A rendered report on stdout, or written whole to --output FILE."""
    if output is None:
        sys.stdout.write(text)
    else:
        _write(output, text, "w")


def deliver(report: AuditReport, fmt: str, outputs: tuple[tuple[Path, str], ...], fail_on: Severity,
            elapsed: float, console: Console, all_findings: bool = False, plain: bool = False) -> None:
    """Write the report: on stdout in `fmt` when there is no --output, else into each --output FILE in its
    format (and then its one-line verdict on stderr, for the log); a markdown summary to $GITHUB_STEP_SUMMARY
    if set."""
    if not outputs:
        if fmt == "table":
            from kimi_audit.report.table import render_table
            render_table(report, console, fail_on, plain=True if plain else None)
        else:
            sys.stdout.write(render(report, fmt, fail_on, elapsed, all_findings=all_findings))
    for path, out_format in outputs:
        _write(path, render(report, out_format, fail_on, elapsed, all_findings=all_findings), "w")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        from kimi_audit.report.markdown import render_markdown
        _write(Path(summary), render_markdown(report, fail_on), "a")


def verdict_line(report: AuditReport, fail_on: Severity, outputs: tuple[tuple[Path, str], ...]) -> str:
    """The one line a run with --output prints on stderr: the verdict, the counts, the files written."""
    from kimi_audit.report.markdown import counted

    written = ", ".join(f"{path} ({fmt})" for path, fmt in outputs)
    return printable(f"{report.headline(fail_on)}  {counted(report)}: {report.source} (report in {written})")


@contextmanager
def errors_reported(fmt: str, outputs: tuple[tuple[Path, str], ...], source: str) -> Iterator[None]:
    """An error that leaves the input unusable (exit 2) inside the block still leaves a report where the
    report would have gone, so a CI step that uploads it finds a file: in each --output FILE of the JSON, SARIF
    or JUnit format, a document holding the error; on stdout (no --output), a SARIF or JUnit one (JSON's error
    object is user_errors'). Never written over the checkpoint: not when an --output lies in SOURCE's directory
    (the block's error may be that the source could not be listed, so its files are unknown)."""
    try:
        yield
    except KimiAuditError as e:
        for output, out_format in outputs:
            text = error_document(e, out_format, source)
            if text is not None and not _within(output, source):
                with suppress(KimiAuditError):  # the error the user sees is the one that made the input unusable
                    _write(output, text, "w")
        if not outputs and fmt != "json" and (text := error_document(e, fmt, source)) is not None:
            sys.stdout.write(text)
        raise


def error_document(e: KimiAuditError, fmt: str, source: str) -> str | None:
    """The error as a report in `fmt` (json, sarif, junit), or None for a format read by people."""
    if fmt == "json":
        return json.dumps({"error": {"code": e.code, "message": clip(str(e))}, "exit_code": e.exit_code}) + "\n"
    if fmt == "sarif":
        from kimi_audit.report.sarif import render_sarif_error
        return render_sarif_error(e.code, str(e), source, e.exit_code)
    if fmt == "junit":
        from kimi_audit.report.junit import render_junit_error
        return render_junit_error(e.code, str(e), source)
    return None


def _within(output: Path, source: str) -> bool:
    """Whether --output lies in the local checkpoint SOURCE names (its directory, or a file's folder)."""
    try:
        where = Path(source).resolve()
        if not where.exists():
            return False
        root = where if where.is_dir() else where.parent
        out = output.resolve()
    except (OSError, RuntimeError, ValueError):
        return True  # cannot tell: do not write
    return out == root or root in out.parents


def refuse_output_over_input(outputs: tuple[tuple[Path, str], ...], source: Source) -> None:
    """Before the audit: no --output may name a file the audit reads (exit 2, nothing read or written)."""
    if outputs and source.root is not None:
        files = [source.root / name for name in source.list_files()]
        for output, _ in outputs:
            refuse_input(output, files, "--output")


def _write(path: Path, text: str, mode: str) -> None:
    """--output (mode "w"): written under an exclusive temporary name, renamed into place (never through a
    link); $GITHUB_STEP_SUMMARY (mode "a"): appended to, as CI expects."""
    try:
        if mode == "w":
            write_atomic(path, text.encode("utf-8", "backslashreplace"))  # a non-UTF-8 file name, escaped
            return
        with open(path, mode, encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise KimiAuditError(f"cannot write {path}: {e.strerror or e}") from None
