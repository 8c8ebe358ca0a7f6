"""How `verify` gets a file's bytes, one window of at most a chunk at a time, never the whole file.

A local file is read by pread into one buffer reused for every window (not memory-mapped: a file cut
short under a map kills the process with SIGBUS, a short read is a finding), the next window's reading
announced to the kernel (POSIX_FADV_WILLNEED) while this one is hashed: memory stays at one window. The
file is checked after the read (its size, its mtime, and that its name still leads to it): bytes appended,
written or cut while it was read are FILE_CHANGED, never a digest of some other state of it. Sparse holes
are never touched. A Hub file is read by ranged reads of one window each through huggingface_hub
(HubSource.read_range), the next one fetched by a thread while this one is hashed: two windows in memory
at most.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kimi_audit.sources.files import file_identity, open_regular

if TYPE_CHECKING:
    from kimi_audit.sources.hub import HubSource

Window = bytes | bytearray

_HUB_SOURCES: dict[tuple[str, str, str], HubSource] = {}


def hub_source(repo: str, commit: str, endpoint: str) -> HubSource:
    """One HubSource per worker process and commit (building one resolves the revision: one API call)."""
    key = (repo, commit, endpoint)
    if key not in _HUB_SOURCES:
        from kimi_audit.sources.hub import HubSource

        _HUB_SOURCES[key] = HubSource(repo, commit, endpoint=endpoint)
    return _HUB_SOURCES[key]


class FileChangedError(OSError):
    """The file is not the one that was planned and opened: its size, mtime or inode changed while it was read."""


_SPARE: list[bytearray] = []
"""The buffer of the last LocalReader closed in this process, for the next one (a worker reads file after file:
a fresh 16 MiB bytearray a file was zero-filled and faulted in again each time)."""


class LocalReader:
    """Windows of a local file, read by pread into one reused buffer (reused from file to file in a process)."""

    def __init__(self, path: str, planned: int, audited: tuple[int, ...] | None = None) -> None:
        self.path = path
        self.planned = planned
        """The size the pieces were planned on (stat before the run)."""
        # a FIFO or device is refused (never blocks), and so is a link: verify opens files at their targets
        self.fd = open_regular(path, os.path.basename(path), follow=False)
        self.opened = os.fstat(self.fd)
        if audited is not None and file_identity(self.opened) != audited:
            os.close(self.fd)
            raise FileChangedError("it is not the file whose header the audit read: replaced or rewritten since "
                                   "(its inode, size, mtime or ctime differ); what would be hashed was not audited")
        self.buffer = _SPARE.pop() if _SPARE else bytearray()
        self.advise = getattr(os, "posix_fadvise", None)

    @contextmanager
    def window(self, start: int, end: int, following: tuple[int, int] | None) -> Iterator[tuple[Window, int]]:
        """The bytes [start, end) as (buffer, base): byte p of the file is buffer[p - base] (the buffer may be
        longer: bytes past `end` are not the file's)."""
        n = end - start
        if len(self.buffer) < n:
            self.buffer = bytearray(n)  # a new one: a view of the old one may still be held
        got = 0
        with memoryview(self.buffer) as view:
            while got < n:
                k = _pread_into(self.fd, view[got:n], start + got)
                if k == 0:
                    raise FileChangedError(f"it shrank while it was read: {start + got:,} bytes, "
                                           f"{self.planned:,} when verify began")
                got += k
        if following is not None and self.advise is not None:
            self.advise(self.fd, following[0], following[1] - following[0], os.POSIX_FADV_WILLNEED)
        yield self.buffer, start

    def changed(self) -> str | None:
        """Why the bytes read are not the file as it is now, or None: its size or mtime differ from when the run
        planned and opened it, or its name now leads to another file."""
        now = os.fstat(self.fd)
        before = self.opened
        if now.st_size != self.planned or before.st_size != self.planned:
            return (f"its size changed while it was read: {self.planned:,} bytes when verify began, "
                    f"{now.st_size:,} after the read")
        if now.st_mtime_ns != before.st_mtime_ns:
            return "it was written to while it was read (its mtime changed)"
        try:
            named = os.stat(self.path)
        except OSError:
            return "it was removed while it was read"
        if (named.st_dev, named.st_ino) != (before.st_dev, before.st_ino):
            return "it was replaced by another file while it was read"
        return None

    def close(self) -> None:
        os.close(self.fd)
        _SPARE[:] = [self.buffer]  # no view of it is held past the window that made it
        self.buffer = bytearray()


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):  # into the buffer: no copy of its own
        return os.preadv(fd, [view], offset)
    data = os.pread(fd, len(view), offset)
    view[:len(data)] = data
    return len(data)


class HubReader:
    """Windows of a Hub file, each one ranged read, the next fetched while this one is used."""

    def __init__(self, name: str, hub: tuple[str, str, str]) -> None:
        self.name = name
        self.source = hub_source(*hub)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kimi-audit-verify-read")
        self.pending: dict[tuple[int, int], Future[bytes]] = {}

    def _fetch(self, start: int, end: int) -> bytes:
        data = self.source.read_range(self.name, start, end - start).data
        if len(data) != end - start:
            raise OSError(f"short read: {len(data):,} of {end - start:,} bytes at offset {start:,}")
        return data

    @contextmanager
    def window(self, start: int, end: int, following: tuple[int, int] | None) -> Iterator[tuple[Window, int]]:
        fut = self.pending.pop((start, end), None)
        if following is not None and following not in self.pending:
            self.pending[following] = self.pool.submit(self._fetch, *following)
        data = fut.result() if fut is not None else self._fetch(start, end)
        yield data, start

    def close(self) -> None:
        for fut in self.pending.values():
            fut.cancel()
        self.pool.shutdown(wait=True)
