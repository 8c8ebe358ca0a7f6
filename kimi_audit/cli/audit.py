"""`audit` and `demo`: the header audit of a checkpoint, and of a replica built offline."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.cli.app import app, shard_progress, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.report.json_report import render_json
from kimi_audit.report.table import render_table
from kimi_audit.sources import LocalSource, open_source


def emit_report(report: AuditReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(render_json(report))
    else:
        render_table(report, stdout)


@app.command()
@user_errors
def audit(
    source: str = typer.Argument(
        PINNED_REPO_ID,
        help="A local checkpoint directory (or .safetensors file), or a Hub repo id `owner/name[@revision]`.",
    ),
    revision: str | None = typer.Option(
        None, "--revision", "-r", help="Hub revision: commit hash (full or short), branch or tag."),
    as_json: bool = typer.Option(False, "--json", help="Alias for --format json."),
    fmt: str | None = typer.Option(None, "--format", "-f", help="table (default), json, junit or markdown."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to FILE, not stdout."),
    fail_on: str = typer.Option("error", "--fail-on", help="Exit 1 on findings of this severity or worse: "
                                "error or warning."),
    expect_params: str | None = typer.Option(None, "--expect-params", metavar="N", help="Gate: PARAMS_GATE "
                                                "error unless the parameter count is exactly N."),
    expect_revision: str | None = typer.Option(None, "--expect-revision", metavar="SHA", help="Gate: "
                                                  "REVISION_GATE error unless the resolved commit starts with SHA."),
    all_findings: bool = typer.Option(False, "--all-findings", help="JSON: list every finding, whole (by "
                                      "default like findings are grouped: at most 10 listed a group, 500 in all)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    values: bool = typer.Option(False, "--values", help="Also fetch every small tensor (norm gains, router "
                                "biases, FP8 scales: ~250 MB for Kimi-K2) and report NaN/Inf, scales <= 0, "
                                "zero gains."),
) -> None:
    """Check every tensor of a checkpoint against the layout its config.json implies.

    Reads config.json, model.safetensors.index.json and each shard's header only: no tensor data.
    Over the Hub, a checkpoint of 16 shards or more has 40% of its headers read and parsed by a second
    process (set KIMI_AUDIT_HEADER_WORKER=0 to keep it all in one).
    """
    from kimi_audit.checks.gates import apply_gates, check_sha, parse_count
    from kimi_audit.cli.ci import deliver, resolve_fail_on, resolve_format

    out_format, severity = resolve_format(fmt, as_json), resolve_fail_on(fail_on)
    for validate, value in ((parse_count, expect_params), (check_sha, expect_revision)):
        if value is not None:
            validate(value)  # refuse a malformed gate before reading anything
    started = time.monotonic()
    src = open_source(source, revision)
    with shard_progress("reading headers", progress) as update:
        if values:
            from kimi_audit.checks.values import audit_with_values
            report = audit_with_values(src, update, update)
        else:
            report = audit_source(src, update)
    report = apply_gates(report, expect_params, expect_revision)
    deliver(report, out_format, output, severity, time.monotonic() - started, stdout, all_findings)
    raise typer.Exit(report.exit_code(severity))


@app.command()
@user_errors
def demo(
    directory: Path | None = typer.Argument(
        None, help="Where to build the replica (default: a temporary directory, removed afterwards)."),
    as_json: bool = typer.Option(False, "--json", help="Print the machine-readable report on stdout."),
) -> None:
    """Build a full-scale header replica of Kimi-K2-Instruct (61 sparse shards) and audit it, offline.

    The replica's headers match the published layout at the pinned revision (959 GB apparent, a few
    hundred MB on disk), so this shows the whole audit on a machine with no Hub access.
    """
    from kimi_audit.model.replica import build_replica

    with tempfile.TemporaryDirectory(prefix="kimi-audit-demo-") as tmp:
        target = directory or Path(tmp)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=stderr, transient=True) as bar:
            task = bar.add_task("building replica", total=61)
            build_replica(target, progress=lambda shard: bar.advance(task))
        stderr.print(f"replica of the pinned Kimi-K2-Instruct layout written to {target}")
        with shard_progress("reading headers") as update:
            report = audit_source(LocalSource(target), update)
        emit_report(report, as_json)
    raise typer.Exit(report.exit_code())
