"""A shard's header fetched (its leading bytes by one or two range reads), within the total header budget,
and parsed: the remote load's step for each shard (model/checkpoint.py); `download --headers-only` writes
the same bytes."""

from __future__ import annotations

import threading

from kimi_audit.constants import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES
from kimi_audit.errors import SourceError
from kimi_audit.findings import Finding, error
from kimi_audit.format.header import ShardHeader, parse_shard_prefix
from kimi_audit.sources.base import Source

SKIPPED = "skipped"
"""A shard's result when the header budget was spent before it was read."""

Fetched = tuple[bytes, int] | Finding | str
"""(leading bytes, file size), SHARD_UNREADABLE, or SKIPPED."""


class HeaderBudget:
    """Header bytes read so far, against a limit; past it, no further shard is read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    @property
    def spent(self) -> bool:
        return self.used > self.limit

    def spend(self, n: int) -> None:
        with self._lock:
            self.used += n


def declared_header_len(prefix: bytes) -> int:
    """N as a fetched prefix declares it (0 when absent or over the format's limit): what a shard's
    header costs against the total header budget, however many bytes its reads took."""
    if len(prefix) < HEADER_LENGTH_BYTES:
        return 0
    n = int.from_bytes(prefix[:HEADER_LENGTH_BYTES], "little")
    return n if n <= MAX_HEADER_BYTES else 0


def fetch_shard_prefix(source: Source, shard: str, first_read: int) -> tuple[bytes, int]:
    """The reads of `format.read_shard_header`, without the parse: (leading bytes, file size).

    One read of `first_read` bytes, a second for the rest of the header only if the first fell
    short. Lets a caller fetch many headers in threads and parse them in one thread, so that
    parsing (CPU, holding the GIL) does not starve the threads that are receiving.
    """
    first = source.read_range(shard, 0, max(first_read, HEADER_LENGTH_BYTES))
    data = first.data
    if len(data) >= HEADER_LENGTH_BYTES:
        n = int.from_bytes(data[:HEADER_LENGTH_BYTES], "little")
        need = HEADER_LENGTH_BYTES + n
        if n <= MAX_HEADER_BYTES and len(data) < need <= first.file_size:
            data += source.read_range(shard, len(data), need - len(data)).data
    return data, first.file_size


def fetch_header(source: Source, shard: str, first_read: int, budget: HeaderBudget) -> Fetched:
    """The shard's header bytes (format.read_shard_header's reads, without the parse), unless the
    budget is spent. A failing read is a SHARD_UNREADABLE finding; a Hub error is raised."""
    if budget.spent:
        return SKIPPED
    try:
        got = fetch_shard_prefix(source, shard, first_read)
    except SourceError as e:
        return error("SHARD_UNREADABLE", f"{shard}: {e}", shard=shard)
    budget.spend(declared_header_len(got[0]))
    return got


def parse_fetched(shard: str, got: Fetched) -> ShardHeader | Finding | str:
    return got if isinstance(got, (Finding, str)) else parse_shard_prefix(got[0], shard=shard, file_size=got[1])
