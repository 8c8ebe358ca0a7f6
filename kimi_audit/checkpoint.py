"""Load what an audit needs from a source: config.json, the index and every shard's header.

This is the only place the audit does I/O; everything downstream works on the returned Checkpoint.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

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
from kimi_audit.format import ShardHeader, parse_shard_prefix, read_shard_header
from kimi_audit.header_estimate import fetch_shard_prefix, first_read_bytes, source_file_size
from kimi_audit.index import IndexFile, natural_key, parse_index
from kimi_audit.gcpause import gc_paused
from kimi_audit.layout import ExpectedTensor, expected_layout
from kimi_audit.sources.base import Source

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_TOTAL_HEADER_BYTES = 128_000_000
"""All shards' headers together (Kimi-K2: 17.7 MB, 139,644 tensors: 7x headroom). Past it, no further
shard is read. Parsing costs ~7x the JSON at peak, so a hostile checkpoint (10 million tensor names over
many shards) stays near 1 GB instead of growing with the number of shards."""
_SKIPPED = "skipped"


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
    expected: Any = None,
) -> tuple[dict[str, ShardHeader], list[Finding]]:
    budget = {"used": 0}
    lock = threading.Lock()

    def spend(n: int | None) -> None:
        with lock:
            budget["used"] += n or 0

    def one(shard: str) -> ShardHeader | Finding | str:
        if budget["used"] > MAX_TOTAL_HEADER_BYTES:
            return _SKIPPED
        try:
            h = read_shard_header(source, shard)  # local: a short read costs a second pread, nothing more
        except SourceError as e:
            return error("SHARD_UNREADABLE", f"{shard}: {e}", shard=shard)
        spend(h.header_len if h.header_len is not None and h.header_len <= MAX_HEADER_BYTES else 0)
        return h

    results: dict[str, ShardHeader | Finding | str] = {}
    total = len(shards)
    with gc_paused():
        if source.parallel_reads > 1 and total > 1:
            names_by_shard = _names_by_shard(shards, index)

            # Threads only fetch; this thread parses, so parsing never starves the receiving threads.
            def fetch(shard: str) -> tuple[bytes, int] | Finding | str:
                if budget["used"] > MAX_TOTAL_HEADER_BYTES:
                    return _SKIPPED
                try:
                    first = first_read_bytes(names_by_shard[shard], expected, source_file_size(source, shard))
                    got = fetch_shard_prefix(source, shard, first)
                except SourceError as e:
                    return error("SHARD_UNREADABLE", f"{shard}: {e}", shard=shard)
                spend(len(got[0]))
                return got

            with ThreadPoolExecutor(max_workers=min(source.parallel_reads, total)) as pool:
                for done, (shard, got) in enumerate(zip(shards, pool.map(fetch, shards)), 1):
                    results[shard] = got if isinstance(got, (Finding, str)) else parse_shard_prefix(
                        got[0], shard=shard, file_size=got[1])
                    if progress:
                        progress(shard, done, total)
        else:
            for done, shard in enumerate(shards, 1):
                results[shard] = one(shard)
                if progress:
                    progress(shard, done, total)
    headers = {s: r for s, r in results.items() if isinstance(r, ShardHeader)}
    failures = [r for r in results.values() if isinstance(r, Finding)]
    skipped = [s for s, r in results.items() if r is _SKIPPED]
    if skipped:
        failures.append(error(
            "CHECKPOINT_TOO_LARGE", f"the headers of {len(headers):,} shards already exceed "
            f"{MAX_TOTAL_HEADER_BYTES:,} bytes together: {len(skipped):,} more shards not read "
            f"(from {skipped[0]})", shard=skipped[0], expected=MAX_TOTAL_HEADER_BYTES, actual=len(skipped)))
    return headers, failures


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
    with gc_paused():
        files = source.list_files()
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
        headers, failures = read_headers(source, shards, index, progress, expected)
        if expected is None:
            expected = expected_layout(config)
        findings += failures
        return Checkpoint(source.label, source.revision, files, config_raw, config, index, expected, headers,
                          tuple(findings))
