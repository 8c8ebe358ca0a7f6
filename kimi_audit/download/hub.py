"""`kimi-audit download`: a checkpoint from the Hub at a pinned commit, whole or headers only.

- Full download: huggingface_hub's `snapshot_download` at the resolved commit, into the standard
  cache (or `--local-dir`), resumable, with its progress bars. `--include` patterns select files.
- `--headers-only`: config.json, the index and the other small files whole, and for each
  `.safetensors` shard only its header (8 + N bytes, by Range), written into a sparse local file of
  the shard's true size, so that `kimi-audit audit DIR` works offline on it. A shard already
  complete on disk is skipped (resume); each file is written under a temporary name and renamed.
- `--verify`: sha256 of every downloaded LFS file against the Hub's LFS metadata for the commit.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from kimi_audit.constants import (
    CONFIG_FILE,
    HEADER_LENGTH_BYTES,
    INDEX_FILE,
    MAX_CONFIG_BYTES,
    MAX_HEADER_BYTES,
    MAX_INDEX_BYTES,
    SAFETENSORS_SUFFIX,
)
from kimi_audit.errors import KimiAuditError, ShortReadError, SourceError, UnsafePathError
from kimi_audit.format.estimate import DEFAULT_FIRST_READ, shard_first_reads
from kimi_audit.format.fetch import fetch_shard_prefix
from kimi_audit.format.index import load_index
from kimi_audit.model.checkpoint import load_config
from kimi_audit.model.layout import expected_layout
from kimi_audit.outputs import write_atomic
from kimi_audit.sources.base import safe_member_name
from kimi_audit.sources.hub import HubSource
from kimi_audit.sources.hub_snapshot import download_snapshot
from kimi_audit.sources.local import LocalSource
from kimi_audit.verify.read import FileTask, verify_file

SMALL_FILE_BYTES = 64 * 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class VerifyResult:
    name: str
    expected: str | None
    actual: str | None

    @property
    def ok(self) -> bool:
        return self.expected is not None and self.expected == self.actual


@dataclass
class DownloadResult:
    repo_id: str
    revision: str
    path: Path
    files: list[str] = field(default_factory=list)
    headers_only: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Shards already complete on disk (headers-only resume) or large non-shard files left out."""
    verified: list[VerifyResult] = field(default_factory=list)

    @property
    def verify_ok(self) -> bool:
        return all(v.ok for v in self.verified)


def select_files(names: Sequence[str], include: Sequence[str] | None) -> list[str]:
    """Files matching any of the `include` glob patterns (all files when none are given)."""
    if not include:
        return sorted(names)
    return sorted(n for n in names if any(fnmatch.fnmatch(n, p) for p in include))


def _atomic_write(local_dir: Path, name: str, data: bytes, *, size: int | None = None) -> None:
    """Write `data` (then extend to `size`, sparse) as local_dir/name: under an exclusive temporary name in
    its folder, renamed into place (outputs.write_atomic), and only inside `local_dir` (a folder on the way
    that is a symlink out of it is refused: nothing is written through a link)."""
    path = local_dir / safe_member_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    top = os.path.realpath(local_dir)
    if os.path.commonpath([top, os.path.realpath(path.parent)]) != top:
        raise UnsafePathError(f"{name}: a folder on its way in {local_dir} is a symlink out of it: not written")
    try:
        write_atomic(path, data, size)
    except OSError as e:
        raise SourceError(f"cannot write {path}: {e.strerror or e}") from None


def _header_complete(path: Path, size: int) -> bool:
    """A headers-only shard already on disk: right size and a plausible header prefix."""
    try:
        if path.stat().st_size != size:
            return False
        with open(path, "rb") as f:
            prefix = f.read(HEADER_LENGTH_BYTES)
            if len(prefix) < HEADER_LENGTH_BYTES:
                return False
            n = int.from_bytes(prefix, "little")
            if n == 0 or n > MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + n > size:
                return False
            f.seek(HEADER_LENGTH_BYTES + n - 1)
            return f.read(1) in (b"}", b" ")
    except OSError:
        return False


def header_bytes(source: HubSource, shard: str, first_read: int) -> bytes:
    """The 8-byte length and the JSON header of a shard (the audit's own fetch: one range read, a second
    if it was short), refused when the declared length does not fit the file."""
    data, size = fetch_shard_prefix(source, shard, first_read)
    if len(data) < HEADER_LENGTH_BYTES:
        raise ShortReadError(f"{shard}: {size} bytes, too short to be a safetensors file")
    n = int.from_bytes(data[:HEADER_LENGTH_BYTES], "little")
    if n > MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + n > size:
        raise SourceError(f"{shard}: header length {n:,} is not plausible for a {size:,}-byte file")
    need = HEADER_LENGTH_BYTES + n
    if len(data) < need:
        raise ShortReadError(f"{shard}: got {len(data):,} of {need:,} header bytes")
    return data[:need]


def _first_reads(source: HubSource, shards: Sequence[str], local: Path) -> dict[str, int]:
    """First-read sizes from the config and index just written, read by the audit's own loaders, so the
    reads are sized exactly as the audit sizes them. An index the audit cannot read leaves the default
    size; a config it refuses, the sizes from the index's names alone (the audit of the copy says why)."""
    written = LocalSource(local)
    try:
        index, _ = load_index(written, written.list_files())
    except SourceError:
        return {}
    if index is None:
        return {}
    try:
        specs = expected_layout(load_config(written)[1]).specs_by_name
    except KimiAuditError:  # ConfigError, or config.json unreadable
        specs = None
    return shard_first_reads(index.weight_map, specs, {s: source.file_size(s) for s in shards})


def download_headers_only(
    source: HubSource,
    names: Sequence[str],
    local_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
) -> DownloadResult:
    result = DownloadResult(source.repo_id, source.revision or "", local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    shards = [n for n in names if n.endswith(SAFETENSORS_SUFFIX)]
    others = [n for n in names if not n.endswith(SAFETENSORS_SUFFIX)]
    # config.json and the index first: they size the header reads, and `audit DIR` needs them.
    others.sort(key=lambda n: (n not in (CONFIG_FILE, INDEX_FILE), n))
    for name in others:
        safe_member_name(name)
        size = source.file_size(name)
        if size is not None and size > SMALL_FILE_BYTES:
            result.skipped.append(name)
            continue
        limit = MAX_INDEX_BYTES if name == INDEX_FILE else max(MAX_CONFIG_BYTES, SMALL_FILE_BYTES)
        _atomic_write(local_dir, name, source.read_file(name, limit))
        result.files.append(name)
        if progress:
            progress(name)
    first_reads = _first_reads(source, shards, local_dir)

    def one(shard: str) -> str | None:
        safe_member_name(shard)
        size = source.file_size(shard)
        target = local_dir / shard
        if size is not None and _header_complete(target, size):
            return None
        head = header_bytes(source, shard, first_reads.get(shard, DEFAULT_FIRST_READ))
        _atomic_write(local_dir, shard, head, size=size)
        return shard

    with ThreadPoolExecutor(max_workers=max(1, source.parallel_reads)) as pool:
        for shard, done in zip(shards, pool.map(one, shards), strict=True):
            if done is None:
                result.skipped.append(shard)
            else:
                result.headers_only.append(shard)
            if progress:
                progress(shard)
    return result


def download_full(
    source: HubSource,
    names: Sequence[str],
    *,
    local_dir: Path | None,
    cache_dir: Path | None,
    max_workers: int = 8,
) -> DownloadResult:
    """snapshot_download at the resolved commit: cache layout, resume, progress bars. It runs in a thread of its
    own, so that Ctrl-C reaches the caller at once (huggingface_hub's pool would first finish every file in
    flight); the command then ends, and a later download resumes the files' `.incomplete` parts."""
    path = _in_thread(lambda: download_snapshot(source, names, local_dir=local_dir, cache_dir=cache_dir,
                                                max_workers=max_workers))
    return DownloadResult(source.repo_id, source.revision or "", path, files=list(names))


def _in_thread(fn: Callable[[], T]) -> T:
    """fn() run in a daemon thread while this thread waits, interruptibly."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the waiting thread as it is
            box["error"] = e

    thread = threading.Thread(target=run, name="kimi-audit-download", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])


def verify_files(
    source: HubSource,
    root: Path,
    names: Sequence[str],
    progress: Callable[[int], None] | None = None,
) -> list[VerifyResult]:
    """sha256 of each LFS file under `root` against the Hub's LFS metadata for the commit, hashed as
    `verify` hashes (verify.read.verify_file, no value scan): None for a file absent or unreadable."""
    out = []
    for name in names:
        expected = source.lfs_sha256(name)
        if expected is None and not name.endswith(SAFETENSORS_SUFFIX):
            continue  # a plain git file: no LFS sha256 to check against
        path = root / name
        actual = None
        if path.is_file():
            task = FileTask(name, path.stat().st_size, path=os.path.realpath(path), scan=False)  # a cache blob
            actual = verify_file(task, progress).sha256
        out.append(VerifyResult(name, expected, actual))
    return out


def download(
    repo_id: str,
    revision: str | None = None,
    *,
    local_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    include: Sequence[str] | None = None,
    headers_only: bool = False,
    verify: bool = False,
    endpoint: str | None = None,
    token: str | bool | None = None,
    progress: Callable[[str], None] | None = None,
    hash_progress: Callable[[int], None] | None = None,
    source: HubSource | None = None,
) -> DownloadResult:
    if headers_only and verify:
        raise KimiAuditError("--verify checks whole files; it cannot be combined with --headers-only")
    if headers_only and local_dir is None:
        raise KimiAuditError("--headers-only needs --local-dir (sparse header files are not cache blobs)")
    source = source or HubSource(repo_id, revision, endpoint=endpoint, token=token)
    names = select_files(source.list_files(), include)
    for name in names:  # a listing is untrusted input too: `../x` would be written outside the target
        try:
            safe_member_name(name)
        except UnsafePathError as e:
            raise UnsafePathError(f"{source.label} lists an unsafe file name: {e}; nothing downloaded") from None
    if headers_only:
        for extra in (CONFIG_FILE, INDEX_FILE):
            if source.exists(extra) and extra not in names:
                names.append(extra)
    if not names:
        raise KimiAuditError(f"no file of {source.label} matches {', '.join(include or [])}")
    if headers_only:
        return download_headers_only(source, names, Path(local_dir), progress=progress)  # type: ignore[arg-type]
    result = download_full(
        source,
        names,
        local_dir=Path(local_dir) if local_dir is not None else None,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
    )
    if verify:
        result.verified = verify_files(source, result.path, names, hash_progress)
    return result
