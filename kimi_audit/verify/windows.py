"""How `verify` gets a file's bytes, one window of at most a chunk at a time, never the whole file.

A local file is memory-mapped one window at a time (the page cache's own pages: nothing is copied, which
is what a read into a buffer costs on top of hashing), the next window's reading announced to the kernel
(POSIX_FADV_WILLNEED) while this one is hashed; a window is unmapped before the next is mapped, so memory
stays at one window. Sparse holes are never touched. A Hub file is read by ranged reads of one window
each through huggingface_hub (HubSource.read_range), the next one fetched by a thread while this one is
hashed: two windows in memory at most.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from kimi_audit.sources.files import open_regular

if TYPE_CHECKING:
    from kimi_audit.sources.hub import HubSource

Window = bytes | mmap.mmap

_HUB_SOURCES: dict[tuple[str, str, str], HubSource] = {}


def hub_source(repo: str, commit: str, endpoint: str) -> HubSource:
    """One HubSource per worker process and commit (building one resolves the revision: one API call)."""
    key = (repo, commit, endpoint)
    if key not in _HUB_SOURCES:
        from kimi_audit.sources.hub import HubSource

        _HUB_SOURCES[key] = HubSource(repo, commit, endpoint=endpoint)
    return _HUB_SOURCES[key]


class LocalReader:
    """Windows of a local file, memory-mapped."""

    def __init__(self, path: str) -> None:
        self.fd = open_regular(path, os.path.basename(path))  # a FIFO or device is refused, never blocks
        self.size = os.fstat(self.fd).st_size
        self.advise = getattr(os, "posix_fadvise", None)

    @contextmanager
    def window(self, start: int, end: int, following: tuple[int, int] | None) -> Iterator[tuple[Window, int]]:
        """The bytes [start, end) as (buffer, base): byte p of the file is buffer[p - base]."""
        if end > self.size:
            raise OSError(f"short read: the file is {self.size:,} bytes, {end:,} expected")
        base = start - start % mmap.ALLOCATIONGRANULARITY
        m = mmap.mmap(self.fd, end - base, access=mmap.ACCESS_READ, offset=base)
        if following is not None and self.advise is not None:
            self.advise(self.fd, following[0], following[1] - following[0], os.POSIX_FADV_WILLNEED)
        try:
            yield m, base
        finally:
            with suppress(BufferError):  # a view still holds it: unmapped when that goes
                m.close()

    def close(self) -> None:
        os.close(self.fd)


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
