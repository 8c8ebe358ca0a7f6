"""Load what an audit needs from a source: config.json, the index and every shard's header.

This is the only place the audit does I/O (a remote load hands a share of the shards' headers to a
second process, header_worker); everything downstream works on the returned Checkpoint.
"""

from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from kimi_audit.alignment import ShardAlignment, align_listed, align_shard, listed_positions
from kimi_audit.config import ModelConfig, parse_config_bytes
from kimi_audit.constants import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_CONFIG_BYTES,
    MAX_INDEX_BYTES,
    MAX_HEADER_BYTES,
    SAFETENSORS_SUFFIX,
)
from kimi_audit.errors import ConfigError, FileMissingError, FileTooLargeError, SourceError, UnsafePathError
from kimi_audit.findings import Finding, error, warning
from kimi_audit.format import ShardHeader, read_shard_header
from kimi_audit.header_estimate import first_read_bytes, source_file_size
from kimi_audit.header_fetch import SKIPPED, Fetched, HeaderBudget, fetch_header, parse_fetched
from kimi_audit.index import IndexFile, natural_key, parse_index
from kimi_audit.gcpause import gc_paused
from kimi_audit.header_worker import HeaderWorker, WorkerFailed, enabled as worker_enabled
from kimi_audit.layout import ExpectedLayout, ExpectedTensor, expected_layout
from kimi_audit.sources.base import Source

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_TOTAL_HEADER_BYTES = 128_000_000
"""All shards' headers together (Kimi-K2: 17.7 MB, 139,644 tensors: 7x headroom). Past it, no further
shard is read. Parsing costs ~7x the JSON at peak, so a hostile checkpoint (10 million tensor names over
many shards) stays near 1 GB instead of growing with the number of shards."""
WORKER_SHARE = 0.4
"""The share of a remote checkpoint's shards the header worker reads. Under half: the parent's own share
costs it less (no results to pickle and hand back), so at 0.4 both finish together (on the replica,
the parent waited 50-200 ms for the worker at 0.5, ~20 ms at 0.36-0.42). Since both align their shards
as they parse them (and the worker derives the layout first), 0.3, 0.4 and 0.5 came within noise."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    label: str
    revision: str | None
    files: tuple[str, ...]
    config_raw: dict[str, Any]
    config: ModelConfig
    index: IndexFile | None
    expected: dict[str, ExpectedTensor]
    """The layout config.json implies (layout.expected_layout)."""
    headers: dict[str, ShardHeader]
    """Shard name -> parsed header, for every shard that could be read, in natural order."""
    findings: tuple[Finding, ...]
    """What loading itself found: absent or unlisted shards, pickle files, unreadable files."""
    alignments: dict[str, ShardAlignment] = field(default_factory=dict)
    """Shard -> its tensors against `expected`, where the load worked that out as it parsed (remote)."""


ProgressFn = Callable[[str, int, int], None]
"""Called with (shard, done, total) after each header is read."""


def load_config(source: Source) -> tuple[dict[str, Any], ModelConfig]:
    try:
        raw = source.read_file(CONFIG_FILE, MAX_CONFIG_BYTES)
    except FileMissingError:
        raise ConfigError(f"no {CONFIG_FILE} in {source.label}: the expected layout is derived from it") from None
    except FileTooLargeError as e:
        raise ConfigError(str(e)) from None
    return parse_config_bytes(raw)


def load_index(source: Source, files: tuple[str, ...]) -> tuple[IndexFile | None, list[Finding]]:
    if INDEX_FILE not in files:
        return None, []
    try:
        return parse_index(source.read_file(INDEX_FILE, MAX_INDEX_BYTES), INDEX_FILE), []
    except FileTooLargeError as e:
        return None, [error("INDEX_TOO_LARGE", str(e), shard=INDEX_FILE)]
    except UnsafePathError:  # a symlink out of the directory: reported as SYMLINK_OUTSIDE, never read
        return None, []


def shards_to_read(files: tuple[str, ...], index: IndexFile | None) -> tuple[list[str], list[Finding]]:
    on_disk = [f for f in files if f.endswith(SAFETENSORS_SUFFIX)]
    findings: list[Finding] = []
    present = set(on_disk)
    if index is not None:
        listed = Counter(index.weight_map.values())
        for shard, count in listed.items():
            if shard not in present:
                findings.append(error("INDEX_SHARD_ABSENT", f"{INDEX_FILE} maps {count:,} tensors to {shard}, "
                                      "which is not in the checkpoint", shard=shard, actual=count))
        for shard in on_disk:
            if shard not in listed:
                findings.append(warning("SHARD_NOT_IN_INDEX", f"{shard} is not listed in {INDEX_FILE}; loaders "
                                        "that follow the index will not read it", shard=shard))
    elif len(on_disk) > 1:
        findings.append(warning("INDEX_MISSING", f"{len(on_disk)} shards but no {INDEX_FILE}"))
    for f in files:
        if f.endswith(PICKLE_SUFFIXES):
            findings.append(warning("PICKLE_NOT_INSPECTED", f"{f} is a pickle-based file: not inspected "
                                    "(kimi-audit never unpickles)", shard=f))
    if not on_disk:
        findings.append(error("NO_SAFETENSORS", "the checkpoint has no .safetensors files"))
    return sorted(on_disk, key=natural_key), findings


def read_headers(
    source: Source, shards: list[str], index: IndexFile | None, progress: ProgressFn | None = None,
    expected: ExpectedLayout | None = None, worker: HeaderWorker | None = None,
    alignments: dict[str, ShardAlignment] | None = None,
) -> tuple[dict[str, ShardHeader], list[Finding]]:
    """Every shard's header. A remote source's headers are fetched in threads (and by `worker`, a
    second process, for a share of them, if given); a local one's are read one after another. A
    remote read given `expected` and `alignments` aligns each shard as it is parsed, into
    `alignments` (the worker aligns its own with the layout's columns and the names the index lists)."""
    results: dict[str, ShardHeader | Finding | str] = {}
    with gc_paused():
        if source.parallel_reads > 1 and len(shards) > 1:
            _read_remote(source, shards, index, expected, worker, results, progress,
                         alignments if alignments is not None and expected is not None else None)
        else:
            budget = HeaderBudget(MAX_TOTAL_HEADER_BYTES)
            for done, shard in enumerate(shards, 1):
                results[shard] = _read_one(source, shard, budget)
                if progress:
                    progress(shard, done, len(shards))
    results = {s: results[s] for s in shards}
    headers = {s: r for s, r in results.items() if isinstance(r, ShardHeader)}
    failures = [r for r in results.values() if isinstance(r, Finding)]
    skipped = [s for s, r in results.items() if r == SKIPPED]
    if skipped:
        failures.append(error(
            "CHECKPOINT_TOO_LARGE", f"the headers of {len(headers):,} shards already exceed "
            f"{MAX_TOTAL_HEADER_BYTES:,} bytes together: {len(skipped):,} more shards not read "
            f"(from {skipped[0]})", shard=skipped[0], expected=MAX_TOTAL_HEADER_BYTES, actual=len(skipped)))
    return headers, failures


def _read_one(source: Source, shard: str, budget: HeaderBudget) -> ShardHeader | Finding | str:
    if budget.spent:
        return SKIPPED
    try:
        h = read_shard_header(source, shard)  # local: a short read costs a second pread, nothing more
    except SourceError as e:
        return error("SHARD_UNREADABLE", f"{shard}: {e}", shard=shard)
    budget.spend(h.header_len if h.header_len is not None and h.header_len <= MAX_HEADER_BYTES else 0)
    return h


def _read_remote(
    source: Source, shards: list[str], index: IndexFile | None, expected: ExpectedLayout | None,
    worker: HeaderWorker | None, results: dict[str, ShardHeader | Finding | str], progress: ProgressFn | None,
    alignments: dict[str, ShardAlignment] | None,
) -> None:
    names_by_shard = _names_by_shard(shards, index)
    total = len(shards)

    listed: dict[str, bytes | None] = {}  # what the index lists in each shard, as layout positions

    def first_read(shard: str) -> int:
        names = names_by_shard[shard]
        found = None if expected is None else list(map(expected.get, names))
        if found is not None and alignments is not None and index is not None:
            listed[shard] = listed_positions(found)
        return first_read_bytes(names, expected, source_file_size(source, shard), found=found)

    reported: set[str] = set()

    def report(shard: str) -> None:
        if shard not in reported:
            reported.add(shard)
            if progress:
                progress(shard, len(reported), total)

    # With a worker: it takes a share of the shards, spread evenly (neighbouring shards differ most in
    # size: the first holds the embedding), half the threads and half the header-byte budget.
    theirs = worker_share(shards) if worker is not None else []
    taken = set(theirs)
    mine = [s for s in shards if s not in taken]
    threads = max(1, source.parallel_reads // 2) if theirs else source.parallel_reads
    budget = HeaderBudget(MAX_TOTAL_HEADER_BYTES // 2 if theirs else MAX_TOTAL_HEADER_BYTES)

    # Threads only fetch; this thread parses, so parsing never starves the receiving threads.
    def fetch(shard: str) -> Fetched:
        return fetch_header(source, shard, first_read(shard), budget)

    def keep(shard: str, result: ShardHeader | Finding | str) -> None:
        """A shard's result, aligned with the layout here unless the worker already did."""
        results[shard] = result
        if alignments is not None and shard not in alignments and isinstance(result, ShardHeader):
            assert expected is not None
            got = listed.get(shard)
            aligned = None if got is None else align_listed(result, names_by_shard[shard], got, expected.columns)
            alignments[shard] = aligned if aligned is not None else align_shard(result, expected, got)
        report(shard)

    def parse(todo: list[str], fetched: Iterator[Fetched]) -> None:
        for shard, got in zip(todo, fetched):
            keep(shard, parse_fetched(shard, got))
            if worker is not None:
                for their_shard in worker.progressed():
                    report(their_shard)

    if worker is not None:  # the worker's share first: it is idle until then, and the parent has work
        try:
            sizes = [first_read(s) for s in theirs]  # fills listed[s]
            items = [(s, size, names_by_shard[s], listed.get(s)) for s, size in zip(theirs, sizes)]
            layout = None if alignments is None or expected is None else expected.columns
            worker.submit(source.worker_state(), items,  # type: ignore[attr-defined]
                          threads=source.parallel_reads - threads, budget=MAX_TOTAL_HEADER_BYTES // 2,
                          layout=layout)
        except WorkerFailed as e:
            log.debug("reading every header here: %s", e)
            worker = None
    with ThreadPoolExecutor(max_workers=min(threads, total)) as pool:
        parse(mine, pool.map(fetch, mine))
        if not theirs:
            return
        theirs_read: dict[str, Any] = {}
        if worker is not None:
            try:
                theirs_read, their_alignments = worker.results()
                if alignments is not None:
                    alignments.update((s, a) for s, a in their_alignments.items() if s in theirs_read)
            except WorkerFailed as e:
                log.debug("reading the worker's %d headers here: %s", len(theirs), e)
        worker = None
        for shard in theirs:
            if shard in theirs_read:
                keep(shard, theirs_read[shard])
        left = [s for s in theirs if s not in results]
        if left:  # the worker failed: what it did not read is read here, within what is left of the budget
            budget.limit = MAX_TOTAL_HEADER_BYTES - sum(
                r.header_len or 0 for r in theirs_read.values() if isinstance(r, ShardHeader))
            parse(left, pool.map(fetch, left))


def worker_share(shards: list[str]) -> list[str]:
    """The shards the header worker reads: WORKER_SHARE of them, evenly spread."""
    return [s for i, s in enumerate(shards) if int((i + 1) * WORKER_SHARE) > int(i * WORKER_SHARE)]


def _names_by_shard(shards: list[str], index: IndexFile | None) -> dict[str, list[str]]:
    """The tensor names the index lists in each shard (what sizes a remote shard's first read)."""
    out: dict[str, list[str]] = {s: [] for s in shards}
    if index is not None:
        for tensor, shard in index.weight_map.items():
            if shard in out:
                out[shard].append(tensor)
    return out


def load_checkpoint(source: Source, progress: ProgressFn | None = None) -> Checkpoint:
    # Remote sources list file sizes: with the expected layout, each header's length is known exactly.
    # Locally it is not needed yet, and building it after the headers keeps the peak memory lower.
    remote = hasattr(source, "file_size")
    files = source.list_files()
    worker = None
    if remote and source.parallel_reads > 1 and hasattr(source, "worker_state"):
        if worker_enabled(sum(1 for f in files if f.endswith(SAFETENSORS_SUFFIX))):
            worker = HeaderWorker()  # it starts up while config.json and the index are read
    try:
        with gc_paused():
            return _load(source, files, remote, progress, worker)
    finally:
        if worker is not None:
            worker.close()


def _load(
    source: Source, files: tuple[str, ...], remote: bool, progress: ProgressFn | None, worker: HeaderWorker | None,
) -> Checkpoint:
    expected = None
    if remote and source.parallel_reads > 1:
        # The index (megabytes) downloads while config.json is fetched and the layout derived from it.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(load_index, source, files)
            config_raw, config = load_config(source)
            expected = expected_layout(config)
            index, findings = pending.result()
    else:
        config_raw, config = load_config(source)
        index, findings = load_index(source, files)
        expected = expected_layout(config) if remote else None
    for link in getattr(source, "outside_links", tuple)():
        findings.append(error("SYMLINK_OUTSIDE", f"{link} is a symlink that leaves the checkpoint directory: "
                              "not opened", shard=link))
    shards, shard_findings = shards_to_read(files, index)
    findings += shard_findings
    alignments: dict[str, ShardAlignment] = {}
    headers, failures = read_headers(source, shards, index, progress, expected, worker, alignments)
    if expected is None:
        expected = expected_layout(config)
    findings += failures
    return Checkpoint(source.label, source.revision, files, config_raw, config, index, expected, headers,
                      tuple(findings), alignments)
