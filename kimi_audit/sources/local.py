"""A checkpoint in a local directory (or a single .safetensors file)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kimi_audit.constants import CONFIG_FILE, INDEX_FILE
from kimi_audit.errors import (
    FileMissingError,
    SourceError,
    UnsafePathError,
)
from kimi_audit.sources.base import RangeRead, safe_member_name
from kimi_audit.sources.cache import snapshot_of
from kimi_audit.sources.files import file_identity, open_regular, read_bounded

CHECKPOINT_FILES = frozenset((CONFIG_FILE, INDEX_FILE))


class LocalSource:
    """Reads with os.pread: no file is ever read beyond the range asked for.

    `path` is a directory, one .safetensors file, or a checkpoint's config.json or index.json, which
    stand for their directory.

    Inside a Hugging Face cache snapshot (`.../models--owner--name/snapshots/<commit>/...`) the
    snapshot's commit is the source's `revision`, so `--expect-revision` can check it.
    """

    parallel_reads = 1
    remote = False

    def __init__(self, path: str | os.PathLike[str], *, label: str | None = None) -> None:
        if not os.fspath(path):  # Path("") is the current directory: never audit it by accident
            raise SourceError("an empty path: give a checkpoint directory, a .safetensors file or a Hub repo id")
        p = Path(path)
        if p.name in CHECKPOINT_FILES and p.is_file():
            p = p.parent  # the checkpoint's config or index names its directory: that is what is audited
        if not p.exists():
            raise FileMissingError(f"no such file or directory: {p}")
        if p.is_file():
            self.root = p.parent
            self._only: str | None = p.name
        elif p.is_dir():
            self.root = p
            self._only = None
        else:
            raise SourceError(f"not a file or directory: {p}")
        snapshot = snapshot_of(self.root)
        self.revision: str | None = snapshot.commit if snapshot is not None else None
        if label is not None:
            self.label = label
        elif snapshot is not None:
            self.label = f"{p} ({snapshot.repo_id}, HF cache)"
        else:
            self.label = str(p)
        # Where a symlink may lead: inside the directory; for a Hugging Face cache snapshot
        # (`snapshots/<rev>/f -> ../../blobs/<sha256>`), or a folder in one, also into that repo's
        # blobs; the file named itself.
        real = os.path.realpath(self.root)
        self._allowed = [real]
        if os.path.basename(os.path.dirname(real)) == "snapshots":
            self._allowed.append(os.path.join(os.path.dirname(os.path.dirname(real)), "blobs"))
        elif snapshot is not None:
            self._allowed.append(str(snapshot.path.parent.parent / "blobs"))
        if self._only is not None:
            self._allowed.append(os.path.realpath(p))

    def _inside(self, real: str) -> bool:
        return any(real == a or real.startswith(a.rstrip(os.sep) + os.sep) for a in self._allowed)

    def _path(self, name: str) -> Path:
        path = self.root / safe_member_name(name)
        real = os.path.realpath(path)
        if not self._inside(real):
            raise UnsafePathError(f"{name} is a symlink that leaves the checkpoint directory: not opened")
        return path

    def outside_links(self) -> tuple[str, ...]:
        """Names of the symlinks (files or directories) under the root that resolve outside it."""
        if self._only is not None:
            return ()
        out = []
        for dirpath, dirs, files in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for f in dirs + files:
                full = os.path.join(dirpath, f)
                if os.path.islink(full) and not self._inside(os.path.realpath(full)):
                    out.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
        return tuple(sorted(out))

    def list_files(self) -> tuple[str, ...]:
        if self._only is not None:
            return (self._only,)
        names = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for f in files:
                names.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
        return tuple(sorted(names))

    def file_size(self, name: str) -> int | None:
        """None: a local directory lists no sizes (a file is sized when it is opened)."""
        return None

    def reported_parameters(self) -> int | None:
        return None

    def lfs_sha256(self, name: str) -> str | None:
        """None: a local file carries no digest (an HF cache blob's name does: verify/references.py)."""
        return None

    def exists(self, name: str) -> bool:
        if self._only is not None and name != self._only:
            return False
        try:
            return self._path(name).is_file()
        except UnsafePathError:
            return False

    def read_file(self, name: str, max_bytes: int) -> bytes:
        path = self._path(name)
        try:
            return read_bounded(path, name, max_bytes)
        except FileNotFoundError:
            raise FileMissingError(f"{name}: no such file in {self.root}") from None
        except OSError as e:
            raise SourceError(f"{name}: {e.strerror or e}") from None

    @contextmanager
    def _opened(self, name: str) -> Iterator[int]:
        """A read-only descriptor of a member file; OS errors as SourceError, naming the file."""
        path = self._path(name)
        try:
            fd = open_regular(path, name)
        except FileNotFoundError:
            raise FileMissingError(f"{name}: no such file in {self.root}") from None
        except OSError as e:
            raise SourceError(f"{name}: {e.strerror or e}") from None
        try:
            yield fd
        except OSError as e:
            raise SourceError(f"{name}: {e.strerror or e}") from None
        finally:
            os.close(fd)

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        if start < 0 or length < 0:
            raise ValueError("negative range")
        with self._opened(name) as fd:
            st = os.fstat(fd)
            size = st.st_size
            want = max(0, min(length, size - start))
            chunks = []
            got = 0
            while got < want:
                chunk = os.pread(fd, want - got, start + got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return RangeRead(b"".join(chunks), size, file_identity(st))

    def holes(self, name: str, start: int = 0, length: int | None = None) -> tuple[tuple[int, int], ...]:
        """The sparse holes of a file that overlap [start, start + length), as (begin, end) offsets
        clipped to that range, in order (lseek SEEK_HOLE / SEEK_DATA).

        A hole reads as zeros but holds no data: a header-only or interrupted copy. The filesystem
        reports holes in whole blocks, so bytes that share a block with written data count as data.
        Where holes cannot be asked about (no SEEK_HOLE on the platform, a filesystem that answers
        EINVAL or EOPNOTSUPP) the answer is no holes: every byte is taken as present.
        """
        seek_hole = getattr(os, "SEEK_HOLE", None)
        seek_data = getattr(os, "SEEK_DATA", None)
        if start < 0 or (length is not None and length < 0):
            raise ValueError("negative range")
        if seek_hole is None or seek_data is None:
            return ()
        with self._opened(name) as fd:
            size = os.fstat(fd).st_size
            end = size if length is None else min(size, start + length)
            out: list[tuple[int, int]] = []
            pos = start
            while pos < end:
                try:
                    hole = os.lseek(fd, pos, seek_hole)  # the end of file counts as a hole
                except OSError as e:
                    if e.errno == errno.ENXIO:  # pos at or past the end of file
                        break
                    if e.errno in _NO_HOLE_SUPPORT:
                        return ()
                    raise
                if hole >= end:
                    break
                try:
                    data = os.lseek(fd, hole, seek_data)
                except OSError as e:
                    if e.errno != errno.ENXIO:  # ENXIO: no data after `hole`, a hole to the end
                        if e.errno in _NO_HOLE_SUPPORT:
                            return ()
                        raise
                    data = size
                out.append((hole, min(data, end)))
                pos = data
            return tuple(out)


_NO_HOLE_SUPPORT = frozenset(
    e for e in (errno.EINVAL, getattr(errno, "EOPNOTSUPP", None), getattr(errno, "ENOTSUP", None)) if e is not None
)
