"""`verify`: every byte of a checkpoint read once, hashed against a reference and scanned for bad values."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kimi_audit.cli.application import (
    app,
    byte_progress,
    shard_progress,
    signal_handled,
    sigterm_exits,
    stderr,
    stdout,
    user_errors,
)
from kimi_audit.errors import KimiAuditError
from kimi_audit.outputs import refuse_input

if TYPE_CHECKING:
    from kimi_audit.checks.audit import AuditReport
    from kimi_audit.verify.result import VerifyReport
    from kimi_audit.verify.run import VerifyTarget


@contextmanager
def _first_sigint_only() -> Iterator[None]:
    """The first Ctrl-C interrupts the reads (KeyboardInterrupt); later ones are ignored, so that the workers'
    clean-up and the report of what was checked are not cut short. The command's own setting: the library
    (verify.run) touches no signal disposition."""
    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    with signal_handled(signal.SIGINT, first):
        yield


@app.command()
@user_errors
def verify(
    source: str = typer.Argument(..., help="A local checkpoint directory (or one of its shards), a GGUF file (any "
                                 "part of a split set) or folder, or a Hub repo id `owner/name[@revision]` (its "
                                 "local copy: --local-dir, else the HF cache; or --stream)."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision: commit, branch or tag."),
    local_dir: Path | None = typer.Option(None, "--local-dir", help="REPO's local copy is in this directory "
                                          "(as `download --local-dir` wrote it), not in the HF cache."),
    stream: bool = typer.Option(False, "--stream", help="Read REPO's files from the Hub by ranged reads, hashed "
                                "and scanned as they arrive, never stored."),
    manifest: Path | None = typer.Option(None, "--manifest", metavar="FILE", help="Compare with this manifest "
                                         "(model-signing's in-toto statement, as --write-manifest writes it, or a "
                                         "model.sig bundle: its signature is not checked here)."),
    write_manifest: Path | None = typer.Option(None, "--write-manifest", metavar="FILE", help="Write the manifest "
                                               "of this copy (every file's sha256, and every tensor's) to FILE, "
                                               "for `model_signing` to sign."),
    ignore_unlisted: bool = typer.Option(False, "--ignore-unlisted", help="With --manifest: a file in the "
                                         "checkpoint that the manifest does not list is a warning, not an error "
                                         "(model_signing's verify fails on it too, unless told to ignore it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the machine-readable report (schema: "
                                 "kimi-audit/verify/1)."),
    fmt: str | None = typer.Option(None, "--format", "-f", metavar="FORMAT", help="table (default), json (--json) "
                                   "or html (one self-contained page: the model drawn, weight health, every file's "
                                   "hash)."),
    output: Path | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Write the report to FILE, not "
                                       "stdout."),
    all_findings: bool = typer.Option(False, "--all-findings", help="JSON: list every finding, whole."),
    workers: int | None = typer.Option(None, "--workers", "-j", min=1, help="Processes reading files at once "
                                       "(default: one per core)."),
    ray: bool = typer.Option(False, "--ray", help="Run the file tasks on a Ray cluster (the ray extra: "
                             "pip install kimi-audit[ray]): the running one (RAY_ADDRESS, or `ray start` here), "
                             "or the one --ray-address names. (Typer takes no option with an optional value: "
                             "hence two.)"),
    ray_address: str | None = typer.Option(None, "--ray-address", metavar="ADDRESS", help="The Ray cluster for "
                                           "--ray (implies it): ray://HOST:10001, HOST:6379, or `local` to "
                                           "start one here."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Read every byte of every file once: sha256 against a reference, and every tensor's values.

    The format, index and layout checks of `audit` run first. Each file's sha256 is compared with the HF
    cache's blob name, the Hub's LFS sha256 at the resolved commit (REPO[@REV] with a local copy, or --stream)
    and --manifest; a file that differs from a manifest is read again to name the tensors that differ. In the
    same pass: FP8 NaN codes, all-zero 128x128 blocks, NaN/Inf in BF16/F16/F32, scales not finite and > 0;
    sparse holes are data not present. Exit 0 clean, 1 findings, 2 unusable input, 130 interrupted (the
    files checked so far are reported).
    """
    from kimi_audit.cli.ci import choose_format
    from kimi_audit.verify.manifest import read_manifest
    from kimi_audit.verify.references import manifest_reference
    from kimi_audit.verify.run import VerifyOptions, finish_manifest, prepare, verify_files

    out_format = choose_format(fmt, as_json, ("table", "json", "html"), output)
    target = open_target(source, revision, local_dir, stream)
    refs = list(target.references)
    exclude = set(target.exclude)
    if manifest is not None:
        refs.append(manifest_reference(read_manifest(manifest), manifest))
    for path in (manifest, write_manifest):
        inside = _inside(target, path)
        if inside is not None and (path is manifest or _replaceable(path)):
            exclude.add(inside)  # a manifest in the checkpoint directory: not hashed, listed as ignored
    target = dataclasses.replace(target, references=tuple(refs), exclude=frozenset(exclude))
    if write_manifest is not None:  # before any work: never over a file this run reads
        refuse_input(write_manifest, _inputs(target, manifest), "--write-manifest")
    address = ray_address or ("auto" if ray else None)
    options = VerifyOptions(workers=workers, ray_address=address, tensor_hashes=write_manifest is not None,
                            ignore_unlisted=ignore_unlisted)
    with shard_progress("reading headers", progress) as header_update:
        prepared = prepare(target, options, header_update)
    with sigterm_exits(), _first_sigint_only(), _bytes_progress(progress, prepared.total_bytes) as update:
        report, made = verify_files(prepared, update)  # SIGTERM: SystemExit(143), the pool's workers ended
    if report.interrupted:  # what was checked gets printed: a second Ctrl-C does not cut it short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if write_manifest is not None and not report.interrupted:
        report = finish_manifest(report, made, write_manifest)
    if out_format != "table" or output is not None:
        _deliver(report, prepared.audit, out_format, output, all_findings)
    else:
        from kimi_audit.report.verify_table import render_verify

        render_verify(report, stdout)
    if report.interrupted:
        stderr.print(f"interrupted: {report.verdict.split(': ', 1)[1]}")
    raise typer.Exit(report.exit_code)


def _deliver(report: VerifyReport, audit: AuditReport, fmt: str, output: Path | None, all_findings: bool) -> None:
    """The report as JSON or HTML (or the table, into --output), on stdout or into --output."""
    from kimi_audit.cli.ci import emit

    if fmt == "json":
        from kimi_audit.report.verify_data import verify_dict

        text = json.dumps(verify_dict(report, all_findings), indent=1) + "\n"
    elif fmt == "html":
        from kimi_audit.report.html import render_verify_html

        text = render_verify_html(report, audit)
    else:
        import io

        from rich.console import Console

        from kimi_audit.report.verify_table import render_verify

        buf = io.StringIO()
        render_verify(report, Console(file=buf, width=120, color_system=None, soft_wrap=False))
        text = buf.getvalue()
    emit(text, output)


def open_target(spec: str, revision: str | None, local_dir: Path | None, stream: bool) -> VerifyTarget:
    """The source to read (sources.resolve_source: a REPO's local copy, or the Hub with --stream) and the
    references the source itself brings (HF cache blob names, the Hub's LFS)."""
    from kimi_audit.sources.resolve import resolve_source
    from kimi_audit.verify.references import cache_reference, hub_reference
    from kimi_audit.verify.run import VerifyTarget

    if stream and os.path.isdir(spec):
        raise KimiAuditError(f"--stream reads a Hub repo by ranged reads; {spec} is a local directory: verify it "
                             "without --stream")
    opened = resolve_source(spec, revision, mode="stream" if stream else "copy", local_dir=local_dir)
    src = opened.source
    if opened.hub is not None:
        return VerifyTarget(src, (hub_reference(opened.hub),))
    ref = None
    if src.root is not None and (src.revision is not None or local_dir is not None):
        ref = cache_reference(src.root, src.list_files())
    return VerifyTarget(src, (ref,) if ref else ())


def _replaceable(path: Path | None) -> bool:
    """Whether --write-manifest may take `path` out of the files hashed (and then replace it): nothing is there
    yet, or a manifest (the one written before); any other file stays a file the run reads."""
    from kimi_audit.verify.manifest import read_manifest

    if path is None or not os.path.lexists(path):
        return True
    try:
        if path.name.endswith(".safetensors") or not os.path.isfile(path) or os.stat(path).st_size > 64 << 20:
            return False
        read_manifest(path)
    except (OSError, KimiAuditError):
        return False
    return True


def _inputs(target: VerifyTarget, manifest: Path | None) -> list[Path]:
    """The local files this run reads: the checkpoint's (those not excluded), and --manifest."""
    root = target.source.root
    files = [root / n for n in target.source.list_files() if n not in target.exclude] if root is not None else []
    return files + ([manifest] if manifest is not None else [])


def _inside(target: VerifyTarget, path: Path | None) -> str | None:
    """`path`'s name relative to a local checkpoint directory it lies in (not to be hashed), else None."""
    root = target.source.root
    if path is None or root is None:
        return None
    try:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    except ValueError:
        return None
    return None if rel.startswith("..") else rel.replace(os.sep, "/")


@contextmanager
def _bytes_progress(enabled: bool, total: int) -> Iterator[Callable[[str, int], None] | None]:
    """The bytes bar, fed per file (file, bytes done in it) and showing the sum."""
    with byte_progress("verifying", enabled) as bar:
        if bar is None:
            yield None
            return
        done: dict[str, int] = {}

        def update(name: str, n: int) -> None:
            done[name] = n
            bar(sum(done.values()), total)

        yield update
