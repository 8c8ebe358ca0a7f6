"""Read exactly one tensor's bytes (or some of its rows) from a local or remote shard, by byte range.

A 3 KB q_a_layernorm gain costs one header read (cached per shard) and one 3 KB range read; a 17 MB
q_a_proj weight one 17 MB range read. Nothing else of the shard is touched.

Importing this module loads no numpy: `audit` and `diff` use its byte-range helpers on headers alone;
the decoding kernels are imported by the methods that return values.

Two things are checked before bytes are read: that they are there (a local file's sparse hole is not
data: `data_holes`, DataNotPresentError), and, for anything large, that the memory they and their
decoding need is available (`check_memory`, NotEnoughMemoryError).
"""

from __future__ import annotations

import bisect
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING, TypeVar

from kimi_audit.constants import GGUF_SUFFIX, HEADER_LENGTH_BYTES, SAFETENSORS_SUFFIX
from kimi_audit.errors import DataNotPresentError, KimiAuditError, ShortReadError, SourceError
from kimi_audit.findings import Severity
from kimi_audit.format.estimate import first_read_bytes
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.format.header import ShardHeader, TensorInfo, read_shard_header
from kimi_audit.format.index import IndexFile, load_index, natural_key
from kimi_audit.sources.base import Source

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_TENSOR_BYTES = 1 << 30


def read_exact(source: Source, shard: str, start: int, length: int) -> bytes:
    """`length` bytes at `start`, or SourceError: a short read is never passed on as data."""
    got = source.read_range(shard, start, length)
    if len(got.data) != length:
        raise ShortReadError(
            f"{shard}: {length:,} bytes at offset {start:,} asked, {len(got.data):,} read "
            f"(file is {got.file_size:,} bytes)"
        )
    return got.data


def windowed_map(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
    """pool.map in order, with at most `window` calls submitted and not yet consumed (bounded memory
    when each result is a chunk of bytes)."""
    pending: deque[Future[R]] = deque()
    it = iter(items)
    for item in it:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            break
    while pending:
        fut = pending.popleft()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(pool.submit(fn, nxt))
        yield fut.result()


# ------------------------------------------------------------------ holes

Holes = tuple[tuple[int, int], ...]
"""(begin, end) file offsets of sparse holes, in order, not overlapping."""

HEADER_BLOCK_SLACK = 1 << 17
"""A shard whose only data past its header is less than this, followed by one hole to the end of the
file, is a header-only copy: the bytes after the header share the header's last filesystem block(s)
and count as data to the filesystem, but were never written (they read as zeros)."""


def data_holes(source: Source, shard: str, data_start: int, file_size: int) -> Holes:
    """The holes in a shard's data region [data_start, file_size): none for a remote source or a
    filesystem without sparse files. A header-only copy's whole data region is one hole (see
    HEADER_BLOCK_SLACK). Raises SourceError when the file cannot be opened."""
    if file_size <= data_start:
        return ()
    holes = source.holes(shard, data_start, file_size - data_start)
    if len(holes) == 1 and holes[0][1] >= file_size and holes[0][0] - data_start < HEADER_BLOCK_SLACK:
        return ((data_start, file_size),)
    return holes


def in_hole(holes: Holes, begin: int, end: int) -> bool:
    """Whether any byte of [begin, end) lies in a hole (such a range reads, at least partly, as zeros)."""
    if not holes or end <= begin:
        return False
    i = bisect.bisect_right(holes, (begin, float("inf"))) - 1  # the last hole starting at or before begin
    if i >= 0 and holes[i][1] > begin:
        return True
    return i + 1 < len(holes) and holes[i + 1][0] < end


def not_present_message(name: str, shard: str) -> str:
    return f"{name}: the data is not present in {shard} (a sparse hole: a header-only or partial copy)"


# ------------------------------------------------------------------ memory


class NotEnoughMemoryError(KimiAuditError):
    """The arrays a command would allocate need more memory than is available."""

    code = "NOT_ENOUGH_MEMORY"


MEMORY_CHECK_BYTES = 1 << 26
"""Needs below this are not checked (reading /proc/meminfo for every 3 KB gain is not worth it)."""


def available_memory() -> int | None:
    """Bytes a new allocation can get: the least of the system's MemAvailable (Linux; else the free physical
    pages), the room left under this process's address-space limit (RLIMIT_AS, `ulimit -v`) and the room left
    in its memory cgroup (v2 memory.max, v1 memory.limit_in_bytes, this cgroup's and its ancestors'); None
    where none is known (no check then)."""
    figures = [f for f in (system_available(), address_space_room(), cgroup_room()) if f is not None]
    return min(figures) if figures else None


def system_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def address_space_room() -> int | None:
    """RLIMIT_AS's soft limit less the address space this process already maps (/proc/self/statm)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0)


def cgroup_room(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> int | None:
    """The least room (limit less usage) of the memory cgroups this process is in, up to the hierarchy's root:
    v2 (`0::/path`: memory.max, memory.current) or v1 (`N:memory:/path` or `N:...,memory,...:/path`:
    memory/memory.limit_in_bytes, memory.usage_in_bytes). None when no limit is set or readable."""
    try:
        with open(membership, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            base, limit_file, usage_file = root, "memory.max", "memory.current"
        elif "memory" in parts[1].split(","):
            base, limit_file = os.path.join(root, "memory"), "memory.limit_in_bytes"
            usage_file = "memory.usage_in_bytes"
        else:
            continue
        path = parts[2].strip("/")
        while True:
            here = os.path.join(base, path) if path else base
            limit, usage = _read_int(os.path.join(here, limit_file)), _read_int(os.path.join(here, usage_file))
            if limit is not None and limit < 1 << 62:  # "max", or v1's "no limit" (a page-rounded 2^63 - 1)
                rooms.append(max(limit - (usage or 0), 0))
            if not path:
                break
            path = os.path.dirname(path)
    return min(rooms) if rooms else None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):  # absent, unreadable, or "max"
        return None


def format_size(n: float) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n / 1024:,.1f} KiB"


def check_memory(need: int, what: str) -> None:
    """NotEnoughMemoryError (exit 2) when `what` needs more than the memory available."""
    if need < MEMORY_CHECK_BYTES:
        return
    avail = available_memory()
    if avail is not None and need > avail:
        raise NotEnoughMemoryError(f"{what} needs {format_size(need)} of memory, {format_size(avail)} available")


class TensorNotFoundError(KimiAuditError):
    pass


class TensorFetcher:
    """Finds tensors through the index (or the headers) and reads exactly their bytes."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.files = source.list_files()
        self._index: IndexFile | None = None
        self._index_loaded = False
        self._headers: dict[str, ShardHeader] = {}
        self._holes: dict[str, Holes] = {}
        self._listed_in: dict[str, list[str]] | None = None
        self.bytes_read = 0

    @cached_property
    def _shards(self) -> list[str]:
        """The listing's shards in natural order (sorted once: a fetcher is asked for tensor after tensor)."""
        return sorted((f for f in self.files if f.endswith((SAFETENSORS_SUFFIX, GGUF_SUFFIX))), key=natural_key)

    def _names_in(self, shard: str) -> list[str]:
        """The names the index puts in `shard` (the index grouped by shard once, not scanned per shard)."""
        if self._index is None:  # (none, or not loaded yet)
            return []
        if self._listed_in is None:
            self._listed_in = {}
            for n, s in self._index.weight_map.items():
                self._listed_in.setdefault(s, []).append(n)
        return self._listed_in.get(shard, [])

    def header(self, shard: str) -> ShardHeader:
        h = self._headers.get(shard)
        if h is None and shard.endswith(GGUF_SUFFIX):  # a GGUF part: its header is read as the audit reads it
            h = self._headers[shard] = read_gguf_part(self.source, shard).header
            if not h.ok:
                raise SourceError(f"{shard}: {h.findings[0].message}")
            self.bytes_read += h.data_start
        if h is None:
            names = self._names_in(shard)
            first = first_read_bytes(names, None, self.source.file_size(shard)) if names else 1 << 16
            h = self._headers[shard] = read_shard_header(self.source, shard, first)
            if h.header_len is None:
                raise SourceError(f"{shard}: not a safetensors file")
            self.bytes_read += HEADER_LENGTH_BYTES + (h.header_len or 0)
        return h

    def locate(self, name: str) -> tuple[str, TensorInfo, ShardHeader]:
        if not self._index_loaded:
            self._index, _ = load_index(self.source, self.files)
            self._index_loaded = True
        listed = self._index.weight_map.get(name) if self._index is not None else None
        # the shard the index names first; every other shard only when that one lacks the name
        for shard in chain([] if listed is None else [listed], (s for s in self._shards if s != listed)):
            if not self.source.exists(shard):
                continue
            h = self.header(shard)
            t = h.tensors.get(name)
            if t is not None:
                bad = next((f for f in h.findings if f.tensor == name and f.severity is Severity.ERROR), None)
                if bad is not None:  # e.g. a 65-dim or overflowing shape: its values cannot be read as it says
                    raise SourceError(f"{shard}: invalid header entry ({bad.code}): {bad.message}")
                if h.data_start + t.end > h.file_size or t.end < t.begin:
                    raise SourceError(f"{name}: its data_offsets run past the end of {shard}")
                return shard, t, h
        raise TensorNotFoundError(f"no tensor named {name!r} in {self.source.label}")

    def has(self, name: str) -> bool:
        try:
            self.locate(name)
            return True
        except TensorNotFoundError:
            return False

    def listed(self, name: str) -> bool:
        """Whether the index lists `name` (no header read); without an index, whether a header holds it."""
        if not self._index_loaded:
            self._index, _ = load_index(self.source, self.files)
            self._index_loaded = True
        if self._index is not None:
            return name in self._index.weight_map
        return self.has(name)

    def require_present(self, name: str, shard: str, h: ShardHeader, start: int, length: int) -> None:
        """DataNotPresentError when any of the bytes [start, start + length) of `shard` is a hole."""
        holes = self._holes.get(shard)
        if holes is None:
            holes = self._holes[shard] = data_holes(self.source, shard, h.data_start, h.file_size)
        if in_hole(holes, start, start + length):
            raise DataNotPresentError(not_present_message(name, shard))

    def _read(self, name: str, shard: str, h: ShardHeader, start: int, length: int) -> bytes:
        self.require_present(name, shard, h, start, length)
        data = read_exact(self.source, shard, start, length)
        self.bytes_read += length
        return data

    def read(self, name: str, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> tuple[np.ndarray, TensorInfo, str]:
        shard, t, h = self.locate(name)
        if t.nbytes > max_bytes:
            raise KimiAuditError(
                f"{name} is {t.nbytes:,} bytes, over the {max_bytes:,}-byte limit (raise --max-bytes to read it)"
            )
        self.require_present(name, shard, h, h.data_start + t.begin, t.nbytes)
        check_memory(2 * t.nbytes + _decoded_bytes(t.dtype, t.shape), f"reading {name} ({t.nbytes:,} bytes)")
        raw = self._read(name, shard, h, h.data_start + t.begin, t.nbytes)  # the chunks, then their join
        return _decode(raw, t.dtype, t.shape), t, shard

    def read_slice(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor's first dimension (all of a 0-dim tensor), decoded: one range read of
        exactly their bytes, whatever the tensor's size (a band of a tensor too large to read whole)."""
        shard, t, h = self.locate(name)
        shape = t.shape or (1,)
        if not 0 <= start <= stop <= shape[0]:
            raise KimiAuditError(f"rows [{start}, {stop}) out of range for {name} with {shape[0]:,} rows")
        row_bytes = t.nbytes // shape[0] if shape[0] else 0
        length = (stop - start) * row_bytes
        check_memory(2 * length, f"reading rows {start:,} to {stop:,} of {name} ({length:,} bytes)")
        raw = self._read(name, shard, h, h.data_start + t.begin + start * row_bytes, length)
        return _decode(raw, t.dtype, (stop - start, *shape[1:]) if t.shape else ())

    def read_rows(self, name: str, rows: list[int]) -> tuple[np.ndarray, TensorInfo, str]:
        """Selected rows of a 2-D tensor (e.g. embedding rows), one range read per run of rows."""
        import numpy as np

        from kimi_audit.numerics.dtypes import decode

        shard, t, h = self.locate(name)
        if len(t.shape) != 2:
            raise KimiAuditError(f"{name} has shape {list(t.shape)}: rows need a 2-D tensor")
        n_rows, width = t.shape
        row_bytes = t.nbytes // max(1, n_rows)
        for r in rows:
            if not 0 <= r < n_rows:
                raise KimiAuditError(f"row {r} out of range for {name} with {n_rows:,} rows")
        check_memory(2 * len(rows) * row_bytes, f"reading {len(rows):,} rows of {name}")
        out = []
        for r in rows:
            raw = self._read(f"{name} row {r}", shard, h, h.data_start + t.begin + r * row_bytes, row_bytes)
            out.append(decode(raw, t.dtype, (width,)))
        return np.stack(out) if out else np.zeros((0, width)), t, shard


def _decoded_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The float32 array a ggml-quantized tensor is decoded into (0 for a dtype decoded in place)."""
    from kimi_audit.numerics.ggml_quants import is_quantized

    return 4 * math.prod(shape) if is_quantized(dtype) else 0


def _decode(raw: bytes | bytearray | memoryview, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor's values from its bytes: viewed as its dtype, or a ggml block type's dequantized (gguf-py's)."""
    from kimi_audit.numerics.dtypes import decode
    from kimi_audit.numerics.ggml_quants import dequantize, is_quantized

    return dequantize(raw, dtype, shape) if is_quantized(dtype) else decode(raw, dtype, shape)


def read_tensor(
    source: Source, name: str, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES
) -> tuple[np.ndarray, TensorInfo, str]:
    """One tensor, decoded: (values, its header entry, its shard)."""
    return TensorFetcher(source).read(name, max_bytes)
