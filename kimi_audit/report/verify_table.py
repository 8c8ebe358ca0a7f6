"""The human-readable `verify` report, rendered with rich."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kimi_audit.findings import Severity
from kimi_audit.report.grouping import group_findings
from kimi_audit.report.table import MAX_GROUPS, SEVERITY_STYLE, _plain, plural
from kimi_audit.verify.result import OK, UNREFERENCED, VerifyReport

MAX_FILES = 40
"""Files listed one by one (the ones that are not ok first); `--json` lists them all."""
STATUS_STYLE = {OK: "green", UNREFERENCED: "cyan"}


def _size(n: float) -> str:
    for unit, shift in (("TB", 12), ("GB", 9), ("MB", 6), ("kB", 3)):
        if n >= 10**shift:
            return f"{n / 10**shift:,.1f} {unit}"
    return f"{n:,.0f} B"


def render_verify(report: VerifyReport, console: Console, plain: bool | None = None) -> None:
    """The report for a reader. `plain` (default: when the console is not a terminal, as in a CI log): each file
    and each finding group on one line, names and hashes never wrapped, so that a log can be grepped."""
    if plain is None:
        plain = not console.is_terminal
    head = Table.grid(padding=(0, 2))
    head.add_row("source", _plain(report.source))
    head.add_row("revision", report.revision or "(local files)")
    for i, where in enumerate(report.references or ("none: hashes computed, not compared",)):
        head.add_row("reference" if i == 0 else "", _plain(where))
    rate = report.bytes_read / report.seconds if report.seconds > 0 else 0.0
    head.add_row("read", f"{_size(report.bytes_read)} of {_size(report.bytes_total)} in {report.seconds:,.1f} s "
                 f"({_size(rate)}/s, {report.workers}); {report.tensors_scanned:,} tensors scanned")
    if report.manifest_written:
        head.add_row("manifest", _plain(f"written to {report.manifest_written}"))
    console.print(Panel(head, title="kimi-audit verify", expand=False))

    rows = sorted(report.files, key=lambda f: (f.status in (OK, UNREFERENCED), f.name))
    files = Table(title=f"Files ({len(report.files):,})", title_justify="left")
    for col in ("file", "size", "sha256", "status"):
        files.add_column(col, justify="right" if col == "size" else "left", overflow="fold")
    if plain:
        console.print(f"Files ({len(report.files):,}): name, size, sha256, status", soft_wrap=True)
    for f in rows[:MAX_FILES]:
        status = Text(f.status + (", unlisted" if f.unlisted else ""), style=STATUS_STYLE.get(f.status, "bold red"))
        size = f"{f.size:,}" if f.size is not None else "-"
        if plain:
            console.print(Text.assemble(_plain(f.name), f"  {size}  {f.sha256 or '-'}  ", status), soft_wrap=True)
        else:
            files.add_row(_plain(f.name), size, (f.sha256 or "")[:16], status)
    if not plain:
        console.print(files)
    if len(rows) > MAX_FILES:
        console.print(f"… and {len(rows) - MAX_FILES:,} more files (--json lists them all)")

    groups = group_findings(report.findings)
    counts = (f"{plural(report.count(Severity.ERROR), 'error')}, "
              f"{plural(report.count(Severity.WARNING), 'warning')}")
    if groups and plain:
        console.print(f"Findings ({counts})", soft_wrap=True)
        for g in groups[:MAX_GROUPS]:
            detail = g.example.message
            if g.example.tensor and detail.startswith(g.example.tensor + ": "):
                detail = detail[len(g.example.tensor) + 2:]
            console.print(Text.assemble((f"{g.severity:<8}", SEVERITY_STYLE[g.severity]), f"  {g.code}  {g.count:,}  ",
                                        _plain(g.pattern or "-"), "  ", _plain(detail)), soft_wrap=True)
    elif groups:
        t = Table(title=f"Findings ({counts})", title_justify="left")
        for col in ("severity", "code", "count", "tensor / file", "detail (first)"):
            t.add_column(col, overflow="fold", no_wrap=col in ("severity", "code", "count"))
        for g in groups[:MAX_GROUPS]:
            detail = g.example.message
            if g.example.tensor and detail.startswith(g.example.tensor + ": "):
                detail = detail[len(g.example.tensor) + 2:]
            t.add_row(Text(g.severity, style=SEVERITY_STYLE[g.severity]), g.code, f"{g.count:,}",
                      _plain(g.pattern), _plain(detail))
        console.print(t)
        if len(groups) > MAX_GROUPS:
            console.print(f"… and {len(groups) - MAX_GROUPS} more groups (use --json --all-findings for every finding)")
    verdict = report.headline
    style = "bold green" if verdict == "PASS" else "bold yellow" if verdict.startswith("PASS (") else "bold red"
    console.print(Text.assemble(Text(verdict, style=style), f"  {counts}"), soft_wrap=plain)
