"""`audit` and `demo`: the header audit of a checkpoint, and of a replica built offline."""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import typer
from rich.text import Text

from kimi_audit.checks.audit import AuditReport, audit_source
from kimi_audit.cli.application import app, shard_progress, sigterm_exits, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.errors import DirectoryNotEmptyError, KimiAuditError
from kimi_audit.replica.models import DEFAULT_MODEL, REPLICA_MODELS
from kimi_audit.replica.tiny import FAULTS as TINY_FAULTS
from kimi_audit.replica.tiny import build_tiny
from kimi_audit.report.json_report import render_json
from kimi_audit.sources import LocalSource, open_source


def emit_report(report: AuditReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(render_json(report))
    else:
        from kimi_audit.report.table import render_table

        render_table(report, stdout)


@app.command()
@user_errors
def audit(
    source: str = typer.Argument(
        PINNED_REPO_ID,
        help="A local checkpoint directory (or .safetensors file), a GGUF file (any part of a split set) or "
        "folder, or a Hub repo id `owner/name[@revision]`.",
    ),
    include: list[str] | None = typer.Option(
        None, "--include", metavar="GLOB", help="Only the files matching GLOB (repeatable): one GGUF set of a repo "
        "or folder holding several, e.g. 'UD-Q2_K_XL/*'."),
    revision: str | None = typer.Option(
        None, "--revision", "-r", help="Hub revision: commit hash (full or short), branch or tag."),
    as_json: bool = typer.Option(False, "--json", help="Alias for --format json."),
    fmt: str | None = typer.Option(None, "--format", "-f", help="table (default), json, junit, markdown, "
                                   "sarif (SARIF 2.1.0 for GitHub code scanning) or html (one self-contained page "
                                   "with the model drawn)."),
    output: list[Path] | None = typer.Option(None, "--output", "-o", help="Write the report to FILE, not stdout "
                                             "(the format follows its extension: .json, .html, .sarif, .xml, .md, "
                                             ".txt; a file without one takes --format). Repeatable: one run, every "
                                             "report; the verdict goes to stderr in one line."),
    plain: bool = typer.Option(False, "--plain", help="Table format: one line per finding group, names never "
                               "wrapped (the default off a terminal, as in CI logs)."),
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
                                "biases, every scale, any other float tensor up to 256 KiB, a GGUF's block scales: "
                                "~250 MB for Kimi-K2) and report NaN/Inf, scales <= 0, zero gains, expert ids "
                                "out of range."),
    against: str | None = typer.Option(None, "--against", metavar="SOURCE", help="A GGUF set against the "
                                       "safetensors checkpoint it was converted from, or a quantized safetensors "
                                       "release against the one it was quantized from (a directory or Hub repo): "
                                       "config, every tensor accounted for, the totals; with --values, every "
                                       "tensor's values (quantized ones within their format's error bound)."),
    ignore: list[str] | None = typer.Option(None, "--ignore", metavar="CODE[:GLOB]", help="Accept a known "
                                            "deviation: findings of CODE (whose tensor name, or shard, matches "
                                            "GLOB) leave the verdict and the exit code and are listed as "
                                            "ignored. Repeatable."),
) -> None:
    """Check every tensor of a checkpoint against the layout its config.json implies.

    Reads config.json, model.safetensors.index.json and each shard's header only: no tensor data.
    Over the Hub, one ranged request per shard, 16 at a time, at the resolved commit.

    A GGUF set (llama.cpp's files, e.g. `kimi-audit audit UD-Q2_K_XL/Kimi-K2-Instruct-UD-Q2_K_XL-00001-of-00008.gguf`)
    is audited the same way: the split set whole, every tensor's bytes inside its part, and the tensors its
    metadata implies, as llama.cpp's loader derives them.
    """
    from kimi_audit.checks.gates import apply_gates, check_sha, parse_count
    from kimi_audit.checks.ignore import apply_ignores
    from kimi_audit.cli.ci import (
        deliver,
        errors_reported,
        refuse_output_over_input,
        resolve_fail_on,
        resolve_format,
        resolve_ignores,
        resolve_outputs,
        verdict_line,
    )

    out_format, severity = resolve_format(fmt, as_json), resolve_fail_on(fail_on)
    outputs = resolve_outputs(fmt, as_json, output)
    ignore_rules = resolve_ignores(ignore)
    for validate, value in ((parse_count, expect_params), (check_sha, expect_revision)):
        if value is not None:
            validate(value)  # refuse a malformed gate before reading anything
    started = time.monotonic()
    with errors_reported(out_format, outputs, source):  # exit 2 still leaves a JSON, SARIF or JUnit report
        src = open_source(source, revision, tuple(include or ()))
    refuse_output_over_input(outputs, src)  # (outside: nothing is written over an input)
    with errors_reported(out_format, outputs, source), shard_progress("reading headers", progress) as update:
        if values:
            from kimi_audit.checks.values import audit_with_values
            report = audit_with_values(src, update, update)
        else:
            report = audit_source(src, update)
    if against is not None:
        from kimi_audit.checks.against import apply_against

        with errors_reported(out_format, outputs, source):
            reference = open_source(against)
        with errors_reported(out_format, outputs, source), shard_progress("comparing", progress) as update:
            report = apply_against(report, src, reference, values, update)
    head = None
    if expect_revision is not None and report.revision is None and src.root is not None:
        from kimi_audit.sources.git import git_head

        head = git_head(src.root)  # a local git clone of the repo: the commit its HEAD names
    report = apply_ignores(apply_gates(report, expect_params, expect_revision, head), ignore_rules)
    deliver(report, out_format, outputs, severity, time.monotonic() - started, stdout, all_findings, plain)
    if outputs:
        stderr.print(Text(verdict_line(report, severity, outputs)), soft_wrap=True)
    raise typer.Exit(report.exit_code(severity))


@app.command()
@user_errors
def demo(
    directory: Path | None = typer.Argument(
        None, help="Where to build the replica: a new or empty directory (default: a temporary directory, "
                   "removed afterwards, also on Ctrl-C or SIGTERM)."),
    force: bool = typer.Option(False, "--force", help="Build in DIRECTORY even if it holds files. Only the "
                               "replica's own files are written there (config.json, model.safetensors.index.json, "
                               "its shards), each as a new file that replaces any of the same name (a link there "
                               "is replaced, never written through); nothing else is touched."),
    as_json: bool = typer.Option(False, "--json", help="Print the machine-readable report on stdout."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", metavar="NAME", help="The release to replicate: "
                              f"{', '.join(REPLICA_MODELS)}."),
    tiny: bool = typer.Option(False, "--tiny", help="Instead: a tiny Kimi-K2-shaped checkpoint with real values (a "
                              "few MB, 3 shards), on which every command can be tried offline: verify, diff "
                              "--content, tensor --dequant, rmsnorm. Audited with --values."),
    fault: str | None = typer.Option(None, "--fault", metavar="NAME", help="With --tiny: break it as NAME says, "
                                     "to see what a broken checkpoint looks like: " + ", ".join(
                                         f"{k} ({v[0]})" for k, v in TINY_FAULTS.items()) + "."),
) -> None:
    """Build a full-scale header replica of a family member (default Kimi-K2-Instruct, 61 sparse shards) and
    audit it, offline.

    The replica's headers match the release's layout (Kimi-K2-Instruct: at the pinned revision, 958 GiB
    apparent, a few hundred MB on disk), so this shows the whole audit on a machine with no Hub access.
    A DIRECTORY that holds files is refused (exit 2, nothing written) unless --force.
    """
    spec = REPLICA_MODELS.get(model)
    if spec is None:
        raise KimiAuditError(f"--model {model!r}: no replica of it; one of {', '.join(REPLICA_MODELS)}")
    if fault is not None and not tiny:
        raise KimiAuditError("--fault breaks the tiny checkpoint: pass --tiny with it")
    if fault is not None and fault not in TINY_FAULTS:
        raise KimiAuditError(f"--fault {fault!r}: one of {', '.join(TINY_FAULTS)}")
    if tiny and model != DEFAULT_MODEL:
        raise KimiAuditError("--tiny is a Kimi-K2-shaped checkpoint of its own: it takes no --model")
    if directory is not None:
        _check_demo_directory(directory, force)
    where = str(directory) if directory is not None else \
        "a temporary directory (removed when the demo ends: pass DIRECTORY to keep it)"
    broken = f", broken: {TINY_FAULTS[fault][0]}" if fault is not None else ""
    built = f"tiny Kimi-K2-shaped checkpoint (3 shards, real values{broken})" if tiny else \
        f"replica of the {spec.title} layout ({spec.shards} shards)"
    with sigterm_exits(), ExitStack() as cleanup:
        target = directory or _temporary_directory(cleanup)
        try:
            _build_demo(target, tiny, fault, model, spec.shards)
        except OSError as e:
            raise KimiAuditError(f"cannot write the {'tiny checkpoint' if tiny else 'replica'} in {target}: "
                                 f"{e.strerror or e}") from None
        stderr.print(f"{built} written to {where}")
        if tiny:  # real values: audited with --values
            from kimi_audit.checks.values import audit_with_values

            report = audit_with_values(LocalSource(target))
        else:
            with shard_progress("reading headers") as update:
                report = audit_source(LocalSource(target), update)
        emit_report(report, as_json)
    raise typer.Exit(report.exit_code())


def _build_demo(target: Path, tiny: bool, fault: str | None, model: str, shards: int) -> None:
    """Write the demo's checkpoint in `target`: the tiny one (broken as `fault` says), or the replica of `model`
    with a progress bar over its `shards`."""
    if tiny:
        build_tiny(target, fault=fault)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kimi_audit.replica.build import build_replica

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task("building replica", total=shards)
        build_replica(target, model=model, progress=lambda shard: bar.advance(task))


def _temporary_directory(cleanup: ExitStack) -> Path:
    """A new temporary directory whose removal `cleanup` holds before a signal can cut in: SIGTERM and SIGINT
    wait while it is made and registered (one arriving between mkdtemp and the registration left it behind)."""
    held = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        return Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="kimi-audit-demo-")))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _check_demo_directory(directory: Path, force: bool) -> None:
    """Refuse, before writing anything, a DIRECTORY that is a file or (without --force) holds files."""
    try:
        if not directory.exists():
            return
        if not directory.is_dir():
            raise KimiAuditError(f"{directory} is not a directory")
        if not force and next(directory.iterdir(), None) is not None:
            raise DirectoryNotEmptyError(f"{directory} is not empty; demo would overwrite the files of its replica "
                                         "there (pass --force to allow it, or name a new directory)")
    except OSError as e:
        raise KimiAuditError(f"cannot use {directory}: {e.strerror or e}") from None
