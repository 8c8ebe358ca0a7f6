"""The `kimi-audit` command line.

Each command is a thin shell: parse options, open a source, call the core, render. Errors that make
the input unusable are KimiAuditError: one line on stderr, exit code 2. Findings exit 1.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kimi_audit import __version__
from kimi_audit.audit import AuditReport, audit_source
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.errors import KimiAuditError
from kimi_audit.report_json import render_json
from kimi_audit.report_table import render_table
from kimi_audit.sources import LocalSource, open_source

app = typer.Typer(
    name="kimi-audit",
    help=(
        "Audit a Kimi-K2 / DeepseekV3 safetensors checkpoint from its headers: every tensor present, "
        "with the right shape, dtype and FP8 scale, before you move a terabyte.\n\n"
        "Exit codes: 0 clean, 1 findings of error severity, 2 unusable input."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)

stdout = Console()
stderr = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn KimiAuditError into a one-line message and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KimiAuditError as e:
            # The message may quote hostile names: no markup from it, and one line whatever it holds.
            stderr.print(f"[bold red]error:[/bold red] {escape(one_line(str(e)))}", highlight=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def one_line(text: str) -> str:
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@contextmanager
def shard_progress(description: str, enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar on stderr (stdout stays clean for --json)."""
    if not enabled or not stderr.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[shard]}"), console=stderr, transient=True,
    ) as progress:
        task = progress.add_task(description, total=None, shard="")

        def update(shard: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, shard=shard)

        yield update


def emit_report(report: AuditReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(render_json(report))
    else:
        render_table(report, stdout)


def version_callback(value: bool) -> None:
    if value:
        stdout.print(f"kimi-audit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


@app.command()
@user_errors
def audit(
    source: str = typer.Argument(
        PINNED_REPO_ID,
        help="A local checkpoint directory (or .safetensors file), or a Hub repo id `owner/name[@revision]`.",
    ),
    revision: Optional[str] = typer.Option(
        None, "--revision", "-r", help="Hub revision: commit hash (full or short), branch or tag."),
    as_json: bool = typer.Option(False, "--json", help="Alias for --format json."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="table (default), json, junit or markdown."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to FILE, not stdout."),
    fail_on: str = typer.Option("error", "--fail-on", help="Exit 1 on findings of this severity or worse: "
                                "error or warning."),
    expect_params: Optional[str] = typer.Option(None, "--expect-params", metavar="N", help="Gate: PARAMS_GATE "
                                                "error unless the parameter count is exactly N."),
    expect_revision: Optional[str] = typer.Option(None, "--expect-revision", metavar="SHA", help="Gate: "
                                                  "REVISION_GATE error unless the resolved commit starts with SHA."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    values: bool = typer.Option(False, "--values", help="Also fetch every small tensor (norm gains, router "
                                "biases, FP8 scales: ~250 MB for Kimi-K2) and report NaN/Inf, scales <= 0, zero gains."),
) -> None:
    """Check every tensor of a checkpoint against the layout its config.json implies.

    Reads config.json, model.safetensors.index.json and each shard's header only: no tensor data.
    Over the Hub, a checkpoint of 16 shards or more has 40% of its headers read and parsed by a second
    process (set KIMI_AUDIT_HEADER_WORKER=0 to keep it all in one).
    """
    from kimi_audit.cli_ci import deliver, resolve_fail_on, resolve_format
    from kimi_audit.gates import apply_gates, check_sha, parse_count

    out_format, severity = resolve_format(fmt, as_json), resolve_fail_on(fail_on)
    for validate, value in ((parse_count, expect_params), (check_sha, expect_revision)):
        if value is not None:
            validate(value)  # refuse a malformed gate before reading anything
    started = time.monotonic()
    src = open_source(source, revision)
    with shard_progress("reading headers", progress) as update:
        if values:
            from kimi_audit.checks_values import audit_with_values
            report = audit_with_values(src, update, update)
        else:
            report = audit_source(src, update)
    report = apply_gates(report, expect_params, expect_revision)
    deliver(report, out_format, output, severity, time.monotonic() - started, stdout)
    raise typer.Exit(report.exit_code(severity))


@app.command()
@user_errors
def demo(
    directory: Optional[Path] = typer.Argument(
        None, help="Where to build the replica (default: a temporary directory, removed afterwards)."),
    as_json: bool = typer.Option(False, "--json", help="Print the machine-readable report on stdout."),
) -> None:
    """Build a full-scale header replica of Kimi-K2-Instruct (61 sparse shards) and audit it, offline.

    The replica's headers match the published layout at the pinned revision (959 GB apparent, a few
    hundred MB on disk), so this shows the whole audit on a machine with no Hub access.
    """
    from kimi_audit.replica import build_replica

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


# Commands defined in their own modules register themselves on `app` when imported.
# fmt: off
# (one import per line; keep this block just above main())
import kimi_audit.cli_numerics  # noqa: E402,F401  (rmsnorm, tensor)
import kimi_audit.cli_hub  # noqa: E402,F401  (download)
import kimi_audit.cli_params  # noqa: E402,F401  (params, explain)
import kimi_audit.cli_diff  # noqa: E402,F401  (diff)
# fmt: on


def main() -> None:
    app()


if __name__ == "__main__":
    main()
