"""Read exactly one tensor's bytes (or some of its rows) from a local or remote shard, by byte range.

A 3 KB q_a_layernorm gain costs one header read (cached per shard) and one 3 KB range read; a 17 MB
q_a_proj weight one 17 MB range read. Nothing else of the shard is touched.

Importing this module loads no numpy: `audit` and `diff` use its byte-range helpers on headers alone;
the decoding kernels are imported by the methods that return values.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from kimi_audit.constants import HEADER_LENGTH_BYTES, SAFETENSORS_SUFFIX
from kimi_audit.errors import KimiAuditError, ShortReadError, SourceError
from kimi_audit.format.estimate import first_read_bytes, source_file_size
from kimi_audit.format.header import ShardHeader, TensorInfo, read_shard_header
from kimi_audit.format.index import IndexFile, natural_key
from kimi_audit.model.checkpoint import load_index
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
        self.bytes_read = 0

    def _shards(self) -> list[str]:
        return sorted((f for f in self.files if f.endswith(SAFETENSORS_SUFFIX)), key=natural_key)

    def header(self, shard: str) -> ShardHeader:
        h = self._headers.get(shard)
        if h is None:
            names = []
            if self._index is not None:
                names = [n for n, s in self._index.weight_map.items() if s == shard]
            first = first_read_bytes(names, None, source_file_size(self.source, shard)) if names else 1 << 16
            h = self._headers[shard] = read_shard_header(self.source, shard, first)
            if h.header_len is None:
                raise SourceError(f"{shard}: not a safetensors file")
            self.bytes_read += HEADER_LENGTH_BYTES + (h.header_len or 0)
        return h

    def locate(self, name: str) -> tuple[str, TensorInfo, ShardHeader]:
        if not self._index_loaded:
            self._index, _ = load_index(self.source, self.files)
            self._index_loaded = True
        candidates: list[str] = []
        if self._index is not None and name in self._index.weight_map:
            candidates.append(self._index.weight_map[name])
        candidates += [s for s in self._shards() if s not in candidates]
        for shard in candidates:
            if not self.source.exists(shard):
                continue
            h = self.header(shard)
            t = h.tensors.get(name)
            if t is not None:
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

    def _read(self, shard: str, start: int, length: int) -> bytes:
        data = read_exact(self.source, shard, start, length)
        self.bytes_read += length
        return data

    def read(self, name: str, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> tuple[np.ndarray, TensorInfo, str]:
        from kimi_audit.numerics.dtypes import decode

        shard, t, h = self.locate(name)
        if t.nbytes > max_bytes:
            raise KimiAuditError(
                f"{name} is {t.nbytes:,} bytes, over the {max_bytes:,}-byte limit (raise --max-bytes to read it)"
            )
        raw = self._read(shard, h.data_start + t.begin, t.nbytes)
        return decode(raw, t.dtype, t.shape), t, shard

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
        out = []
        for r in rows:
            raw = self._read(shard, h.data_start + t.begin + r * row_bytes, row_bytes)
            out.append(decode(raw, t.dtype, (width,)))
        return np.stack(out) if out else np.zeros((0, width)), t, shard


def read_tensor(
    source: Source, name: str, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES
) -> tuple[np.ndarray, TensorInfo, str]:
    """One tensor, decoded: (values, its header entry, its shard)."""
    return TensorFetcher(source).read(name, max_bytes)
