"""The byte-range interface every checkpoint source implements."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from kimi_audit.errors import UnsafePathError


@dataclass(frozen=True)
class RangeRead:
    """Bytes read from `start`, and the size of the whole file they came from.

    `data` is shorter than asked only when the file ends first
    (`start + len(data) == file_size`).
    """

    data: bytes
    file_size: int
    identity: tuple[int, ...] | None = field(default=None, compare=False)
    """A local file's (device, inode, size, mtime ns, ctime ns) when it was read (None elsewhere): what verify
    holds the file it hashes to (the same file, not rewritten since its header was audited)."""


Holes = tuple[tuple[int, int], ...]
"""(begin, end) file offsets of sparse holes, in order, not overlapping."""


@runtime_checkable
class Source(Protocol):
    """A checkpoint: a flat set of named files, read whole (small ones) or by byte range.

    Every source answers every member below. The capabilities only some sources have (a size known
    before any read, sparse holes, a digest the source vouches for, a local directory) are declared
    here too and answered with None or () by a source that lacks them, so that no caller probes a
    source with getattr/hasattr.
    """

    label: str
    """What the user pointed at, for reports: a path, or `repo@revision`."""

    revision: str | None
    """Full commit hash the files were read at (Hub, or an HF cache snapshot), or None (local)."""

    parallel_reads: int
    """How many range reads are worth issuing at once (1 for a local disk)."""

    @property
    def remote(self) -> bool:
        """True: every read is a network round trip, and `file_size` answers from the listing made when the
        source was opened (the Hub). False: a local disk."""
        ...

    @property
    def root(self) -> Path | None:
        """The local directory the files are read from; None for a remote source."""
        ...

    def list_files(self) -> tuple[str, ...]:
        """Names (posix, relative) of every file in the checkpoint, sorted."""
        ...

    def exists(self, name: str) -> bool: ...

    def read_file(self, name: str, max_bytes: int) -> bytes:
        """The whole file. Raises FileMissingError, FileTooLargeError (over max_bytes)."""
        ...

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        """`length` bytes from `start` (fewer only at end of file). Never reads more than asked."""
        ...

    def file_size(self, name: str) -> int | None:
        """The file's size as listed before any read (the Hub's listing); None when the source lists no
        size (a local file is sized when it is opened) or does not list the file."""
        ...

    def holes(self, name: str, start: int = 0, length: int | None = None) -> Holes:
        """The sparse holes overlapping [start, start + length), clipped to it: () for a source that has
        none (the Hub) or a filesystem that cannot tell. Raises SourceError when the file cannot be asked."""
        ...

    def lfs_sha256(self, name: str) -> str | None:
        """The sha256 the source vouches for (the Hub's LFS metadata for the commit), or None."""
        ...

    def outside_links(self) -> tuple[str, ...]:
        """Symlinks under the root that resolve outside the checkpoint (never opened); () when remote."""
        ...

    def reported_parameters(self) -> int | None:
        """The parameter total the source reports of the checkpoint (the Hub's model info `safetensors.total`,
        computed by the Hub from the shard headers), or None."""
        ...


def safe_member_name(name: object) -> str:
    """Validate a file name taken from untrusted input (index.json) as a plain relative path.

    Raises UnsafePathError for absolute paths, `..` components, backslashes, NUL or empty names.
    """
    if not isinstance(name, str) or not name:
        raise UnsafePathError(f"file name {name!r} is not a non-empty string")
    if "\x00" in name or "\\" in name:
        raise UnsafePathError(f"file name {name!r} contains a NUL or a backslash")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafePathError(f"file name {name!r} is absolute")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"file name {name!r} has an empty, '.' or '..' component")
    if posixpath.normpath(name) != name:
        raise UnsafePathError(f"file name {name!r} is not normalized")
    return name


_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def parse_content_range(value: str | None) -> tuple[int, int, int | None]:
    """`bytes first-last/total` -> (first, last, total); the end is inclusive."""
    m = _CONTENT_RANGE_RE.match(value or "")
    if m is None:
        raise ValueError(f"unusable Content-Range {value!r}")
    first, last = int(m.group(1)), int(m.group(2))
    total = None if m.group(3) == "*" else int(m.group(3))
    if last < first or (total is not None and last >= total):
        raise ValueError(f"inconsistent Content-Range {value!r}")
    return first, last, total
