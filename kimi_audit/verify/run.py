"""`verify`: the header audit, then one read of every byte of every file, then the findings.

1. The audit (format, index, layout) runs first, so every byte is interpreted through a validated header:
   a shard whose header has errors is hashed, never value-scanned.
2. Every file becomes a FileTask (verify/read.py), run by a process pool or Ray (verify/pool.py). A local
   file whose sparse holes cannot be asked about is not read: SHARD_UNREADABLE, never "no holes".
3. Each file's sha256 is compared with every reference (verify/references.py); a file that differs from a
   manifest carrying per-tensor digests is read a second time, tensor by tensor, to name the tensors whose
   bytes differ. Files a full listing names but the checkpoint lacks, or holds but the listing does not
   name, are findings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kimi_audit.checks.audit import AuditReport, audit_checkpoint
from kimi_audit.constants import SAFETENSORS_SUFFIX
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error
from kimi_audit.model.checkpoint import Checkpoint, load_checkpoint
from kimi_audit.model.quant.scheme import fp8_block
from kimi_audit.numerics.tensor_io import data_holes
from kimi_audit.sources.base import Source
from kimi_audit.sources.hub import HubSource
from kimi_audit.verify.findings import (
    cache_findings,
    file_findings,
    health_findings,
    listing_findings,
    tensor_mismatches,
    unreferenced_finding,
)
from kimi_audit.verify.manifest import Manifest, ignored, write_manifest
from kimi_audit.verify.pool import ProgressFn, default_workers, run_tasks
from kimi_audit.verify.read import CHUNK, FP8, SCALE, CellHealth, FileResult, FileTask, TensorPlan, tensor_kind
from kimi_audit.verify.references import Reference
from kimi_audit.verify.result import (
    ABSENT,
    MISMATCH,
    NOT_CHECKED,
    NOT_PRESENT,
    OK,
    UNREADABLE,
    UNREFERENCED,
    FileRow,
    VerifyReport,
)


@dataclass(frozen=True)
class VerifyTarget:
    source: Source
    """Where the bytes are read and the audit runs: a LocalSource, or a HubSource (`--stream`)."""
    references: tuple[Reference, ...] = ()
    exclude: frozenset[str] = frozenset()
    """Files not to hash (a manifest written or read inside the checkpoint directory)."""


@dataclass(frozen=True)
class VerifyOptions:
    workers: int | None = None
    ray_address: str | None = None
    tensor_hashes: bool = False
    """Also hash every tensor (for --write-manifest)."""
    chunk: int | None = None
    ignore_unlisted: bool = False
    """A file a manifest does not list is a warning, not an error (--ignore-unlisted)."""


@dataclass(frozen=True)
class Prepared:
    """The audit done and the files planned: what `verify_files` reads."""

    target: VerifyTarget
    options: VerifyOptions
    audit: AuditReport
    tasks: tuple[FileTask, ...]
    started: float

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.tasks)


def prepare(target: VerifyTarget, options: VerifyOptions = VerifyOptions(),
            header_progress: Callable[[str, int, int], None] | None = None) -> Prepared:
    """The header audit (format, index, layout) and one task per file."""
    started = time.monotonic()
    ckpt = load_checkpoint(target.source, header_progress)
    return Prepared(target, options, audit_checkpoint(ckpt), tuple(plan_tasks(ckpt, target, options)), started)


def verify_files(p: Prepared, progress: ProgressFn | None = None) -> tuple[VerifyReport, Manifest]:
    """Read every file once and compare. A KeyboardInterrupt while they are read ends the run with the report
    of what was checked (`interrupted`). Also returns the manifest of what was read (for --write-manifest).
    No signal disposition is touched: the command line's (cli.verify) keeps a second Ctrl-C from cutting the
    report short."""
    results: dict[str, FileResult] = {}
    interrupted = False
    try:
        with contextlib.closing(run_tasks(list(p.tasks), workers=p.options.workers,
                                          ray_address=p.options.ray_address, progress=progress)) as running:
            for r in running:
                results[r.name] = r
    except KeyboardInterrupt:
        interrupted = True
    return _compare(p, results, interrupted)


def _compare(p: Prepared, results: dict[str, FileResult], interrupted: bool) -> tuple[VerifyReport, Manifest]:
    target, options, tasks = p.target, p.options, list(p.tasks)
    src = target.source
    findings: list[Finding] = list(p.audit.findings)
    retry = [t for t in tasks if t.name in results and _needs_tensor_pass(results[t.name], t, target.references)]
    differ: dict[str, list[str]] = {}
    tensor_findings: list[Finding] = []
    if retry and not interrupted:
        again = {r.name: r for r in run_tasks([_tensor_pass(t) for t in retry], workers=options.workers,
                                              ray_address=options.ray_address)}
        for ref in target.references:
            for t in retry:
                names, found = tensor_mismatches(t.name, ref, again.get(t.name))
                if found or ref.tensors.get(t.name):
                    differ[t.name] = names
                tensor_findings += found
    not_blobs = {n for ref in target.references for n in ref.not_blobs if n not in target.exclude}
    rows, row_findings = _rows(tasks, results, target.references, differ, not_blobs)
    findings += row_findings + tensor_findings + cache_findings(sorted(not_blobs))
    findings += unreferenced_finding([r.name for r in rows if r.status == UNREFERENCED])
    for ref in target.references:
        findings += listing_findings(ref, {t.name for t in tasks}, src.revision, options.ignore_unlisted)
    findings += health_findings([results[t.name] for t in tasks if t.name in results])
    workers = f"Ray at {options.ray_address}" if options.ray_address is not None else \
        f"{max(1, min(options.workers or default_workers(), len(tasks)))} processes"
    layers, experts = weight_health(results[t.name] for t in tasks if t.name in results)
    report = VerifyReport(
        src.label, src.revision, tuple(r.where for r in target.references), rows, tuple(findings),
        time.monotonic() - p.started, workers, sum(r.tensors_scanned for r in results.values()), interrupted,
        layers=layers, experts=experts)
    manifest = Manifest(_model_name(src), {r.name: r.sha256 for r in rows if r.sha256}, src.revision, src.label,
                        {n: r.tensor_sha256 for n, r in results.items() if r.tensor_sha256},
                        tuple(sorted(target.exclude)))
    return report, manifest


def finish_manifest(report: VerifyReport, manifest: Manifest, path: Path) -> VerifyReport:
    """Write the manifest when every file was read whole and none differs from a reference; else a
    MANIFEST_NOT_WRITTEN finding says why not. A manifest that cannot be written (a read-only directory, a
    full disk) is that finding too: the report of what was verified is kept, never discarded for it."""
    bad = [f for f in report.files if f.status in (MISMATCH, UNREADABLE, NOT_PRESENT, NOT_CHECKED)]
    if bad:
        finding = error("MANIFEST_NOT_WRITTEN", f"{path}: not written: {len(bad):,} file{'s' if len(bad) > 1 else ''}"
                        f" not read whole or differing from a reference (the first: {bad[0].name}, {bad[0].status}); "
                        "a manifest is written of a copy that verifies", actual=len(bad))
        return dataclasses.replace(report, findings=(*report.findings, finding))
    try:
        write_manifest(manifest, path)
    except KimiAuditError as e:
        finding = error("MANIFEST_NOT_WRITTEN", f"{e}; the files were verified, the manifest is not written",
                        actual=0)
        return dataclasses.replace(report, findings=(*report.findings, finding))
    return dataclasses.replace(report, manifest_written=str(path))


def plan_tasks(ckpt: Checkpoint, target: VerifyTarget, options: VerifyOptions) -> list[FileTask]:
    src = target.source
    block = fp8_block(ckpt.config.quant)
    hub = None
    root = src.root
    if root is None:
        if not isinstance(src, HubSource) or src.revision is None:
            raise KimiAuditError(f"{src.label}: not a source verify can stream")
        hub = (src.repo_id, src.revision, src.endpoint)
    tasks = []
    # Every file the index or the layout references is verified, whatever its path (a shard under .git/):
    # only the unreferenced files of model_signing's ignored paths and huggingface_hub's metadata are skipped.
    referenced = set(ckpt.headers) | {f for f in ckpt.files if f.endswith(SAFETENSORS_SUFFIX)}
    if ckpt.index is not None:
        referenced |= set(ckpt.index.weight_map.values())
    outside = set(src.outside_links()) if root is not None else set()
    cell_of = _cell_of(ckpt)
    for name in ckpt.files:
        if name in target.exclude or (ignored(name) and name not in referenced):
            continue
        header = ckpt.headers.get(name)
        tensors: tuple[TensorPlan, ...] = ()
        if header is not None and header.ok:
            start = header.data_start
            c = header.columns
            tensors = tuple(sorted(
                (TensorPlan(n, d, s, start + b, start + e, kind, block, cell_of(n) if kind in (FP8, SCALE) else None)
                 for n, d, s, b, e in zip(c.names, c.dtypes, c.shapes, c.begins, c.ends)
                 for kind in (tensor_kind(n, d, s),)),
                key=lambda t: t.begin))
        chunk = options.chunk or CHUNK
        if root is None:  # the Hub: streamed
            size = src.file_size(name)
            if size is None:
                continue  # listed without a size: nothing to stream against
            tasks.append(FileTask(name, size, hub=hub, tensors=tensors, tensor_hashes=options.tensor_hashes,
                                  chunk=chunk))
            continue
        path = root / name
        if not src.exists(name):
            if name in outside:
                continue  # a symlink out of the directory: the audit reports SYMLINK_OUTSIDE
            tasks.append(FileTask(name, 0, path=str(path), failed=f"not a regular file ({_what(path)}): not read"))
            continue
        try:
            size = os.stat(path).st_size
            if header is not None and header.header_len is not None:
                holes = data_holes(src, name, header.data_start, size)
            else:
                holes = src.holes(name)
        except (OSError, KimiAuditError) as e:  # which bytes are present is unknown: the file is not read
            why = f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e)
            tasks.append(FileTask(name, header.file_size if header is not None else 0, path=os.path.realpath(path),
                                  failed=f"cannot tell which of its bytes are present ({why})"))
            continue
        tasks.append(FileTask(name, size, path=os.path.realpath(path), tensors=tensors, holes=holes,
                              tensor_hashes=options.tensor_hashes, chunk=chunk,
                              identity=header.identity if header is not None else None))
    return tasks


def _cell_of(ckpt: Checkpoint) -> Callable[[str], tuple[str, int]]:
    """A tensor name -> its (layer row, expert index or -1) in the grid the HTML report draws (model.cells)."""
    from kimi_audit.model.cells import locator

    names = locator(ckpt.expected)

    def cell(name: str) -> tuple[str, int]:
        row, column, index = names.cell(name)
        return row, index if index >= 0 and column else -1

    return cell


def weight_health(results: Iterable[FileResult]) -> tuple[tuple[CellHealth, ...], tuple[CellHealth, ...]]:
    """The files' cells summed per layer row (expert -1) and per expert index (row '')."""
    layers: dict[str, CellHealth] = {}
    experts: dict[int, CellHealth] = {}
    for r in results:
        for c in r.cells:
            layers[c.row] = layers[c.row].merge(c) if c.row in layers else c._replace(expert=-1)
            if c.expert >= 0:
                experts[c.expert] = experts[c.expert].merge(c) if c.expert in experts else c._replace(row="")
    return tuple(layers.values()), tuple(experts[k] for k in sorted(experts))


def _what(path: Path) -> str:
    """What a listed path that is no regular file is (never opened: a FIFO would block the open)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"a broken symlink ({e.strerror})" if os.path.islink(path) else (e.strerror or str(e))
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))
    return next((what for test, what in kinds if test(mode)), stat.filemode(mode))


def _needs_tensor_pass(r: FileResult, task: FileTask, refs: tuple[Reference, ...]) -> bool:
    return r.sha256 is not None and bool(task.tensors) and not r.tensor_sha256 and any(
        task.name in ref.tensors and ref.digests.get(task.name) not in (None, r.sha256) for ref in refs)


def _tensor_pass(task: FileTask) -> FileTask:
    return dataclasses.replace(task, tensor_hashes=True, scan=False)


def _rows(tasks: list[FileTask], results: dict[str, FileResult], refs: tuple[Reference, ...],
          differ: dict[str, list[str]], not_blobs: set[str]) -> tuple[tuple[FileRow, ...], list[Finding]]:
    rows: list[FileRow] = []
    findings: list[Finding] = []
    listings = [ref.listing for ref in refs if ref.listing is not None]
    for t in tasks:
        r = results.get(t.name)
        expected = next(((ref.digests[t.name], ref) for ref in refs if t.name in ref.digests), None)
        unlisted = any(t.name not in listing for listing in listings)
        if r is None:
            status = NOT_CHECKED
        elif r.error is not None or r.changed is not None:
            status = UNREADABLE
        elif r.holes:
            status = NOT_PRESENT
        elif t.name in not_blobs:
            status = MISMATCH  # not the cache's bytes (CACHE_FILE_NOT_BLOB)
        elif expected is None:
            status = UNREFERENCED
        else:
            status = OK if all(ref.digests.get(t.name) in (None, r.sha256) for ref in refs) else MISMATCH
        if r is not None:
            findings += file_findings(r, refs, differ)
        rows.append(FileRow(t.name, t.size, r.sha256 if r else None, expected[0] if expected else None,
                            expected[1].kind if expected else None, status, unlisted,
                            r.bytes_read if r else 0, r.seconds if r else 0.0))
    present = {t.name for t in tasks}
    for ref in refs:
        for name in sorted((ref.listing or frozenset()) - present):
            if not any(row.name == name for row in rows):
                rows.append(FileRow(name, None, None, ref.digests.get(name), ref.kind, ABSENT))
    return tuple(rows), findings


def _model_name(src: Source) -> str:
    if isinstance(src, HubSource):
        return src.repo_id
    return src.root.resolve().name if src.root is not None else src.label
