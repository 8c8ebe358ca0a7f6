"""One shard's tensors against the expected layout, worked out right after its header is parsed.

A remote load aligns each shard as it parses it (in the parent or in the header worker), while the
header's columns are still in the CPU's caches; the audit then adds the shards up (checks.aligned)
instead of walking 139,644 rows again. Everything here is pure and its result holds builtins only,
so that the header worker can hand it back with the header.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from math import prod
from operator import attrgetter

import numpy as np

from kimi_audit.format import ShardHeader
from kimi_audit.layout import SCALE, ExpectedLayout, ExpectedTensor, LayoutColumns

_POSITION = np.dtype("<i4")


@dataclass(frozen=True)
class ShardAlignment:
    """What the layout checks and the statistics need from one shard, when every one of its names is
    in the layout (else `positions` is None and the audit takes the row-by-row path)."""

    layout_size: int
    """len(expected) it was aligned against: results from another layout are not added up."""
    positions: bytes | None
    """Each row's ExpectedTensor.position, int32 little-endian; None if a name is not in the layout."""
    scale_rows: bytes
    """Rows whose expected kind is SCALE, int32 little-endian."""
    mismatched: tuple[int, ...]
    """Rows whose dtype or shape is not the expected one."""
    classes: tuple[tuple[str, str, int, int, int], ...]
    """(expected kind, dtype, tensors, elements, payload bytes) over the shard's rows."""
    as_listed: bool | None = None
    """Whether the index lists exactly this shard's names for it (None: not compared)."""

    def position_array(self) -> np.ndarray:
        assert self.positions is not None
        return np.frombuffer(self.positions, dtype=_POSITION)

    def scale_row_array(self) -> np.ndarray:
        return np.frombuffer(self.scale_rows, dtype=_POSITION)


def listed_positions(found: list[ExpectedTensor | None]) -> bytes | None:
    """The positions of the names an index lists for a shard (their entries `found` in the layout),
    for align_shard to compare; None when one is not in the layout."""
    if None in found:
        return None
    return np.array(list(map(attrgetter("position"), found)), dtype=_POSITION).tobytes()


def align_shard(header: ShardHeader, expected: ExpectedLayout, listed: bytes | None = None) -> ShardAlignment:
    """`listed`: listed_positions of the names the index gives this shard, if known."""
    found = list(map(expected.get, header.columns.names))
    if None in found or len(expected) >= 2**31:
        return ShardAlignment(len(expected), None, b"", (), ())
    pos = np.array(list(map(attrgetter("position"), found)), dtype=np.int64)
    as_listed = None
    if listed is not None:
        index_pos = np.frombuffer(listed, dtype=_POSITION)
        as_listed = len(index_pos) == len(pos) and bool(np.array_equal(np.sort(index_pos), np.sort(pos)))
    return _align(header, pos, expected.columns, as_listed)


def align_listed(header: ShardHeader, names: list[str], listed: bytes, layout: LayoutColumns) -> ShardAlignment | None:
    """align_shard's result, from the names the index lists for this shard and their positions
    (listed_positions) instead of the whole layout's table of names: 2,300 names instead of 139,644,
    and what the header worker needs of the layout without deriving it. None when the header holds a
    name the index does not list for this shard (align_shard then says whether the layout has it)."""
    row_of = dict(zip(names, range(len(names))))
    rows = list(map(row_of.get, header.columns.names))
    if None in rows or len(row_of) != len(names) or layout.size >= 2**31:
        return None
    pos = np.frombuffer(listed, dtype=_POSITION)[np.array(rows, dtype=np.intp)].astype(np.int64)
    # Every stored name is listed: the two are the same names if there are as many, each stored once.
    as_listed = len(rows) == len(names) and len(set(rows)) == len(rows)
    return _align(header, pos, layout, as_listed)


def _align(header: ShardHeader, pos: np.ndarray, layout: LayoutColumns, as_listed: bool | None) -> ShardAlignment:
    cols = header.columns
    # Codes of the stored dtype and shape (-1: none in the layout) against the expected ones.
    dtype_code = np.array(list(map(layout.dtype_index.get, cols.dtypes, repeat(-1))), dtype=np.int32)
    shape_code = np.array(list(map(layout.shape_index.get, cols.shapes, repeat(-1))), dtype=np.int32)
    differs = (dtype_code != layout.dtype_code[pos]) | (shape_code != layout.shape_code[pos])
    mismatched = np.flatnonzero(differs).tolist()
    kind_code = layout.kind_code[pos]
    scale_code = layout.kinds.index(SCALE) if SCALE in layout.kinds else -1
    return ShardAlignment(
        layout_size=layout.size,
        positions=pos.astype(_POSITION).tobytes(),
        scale_rows=np.flatnonzero(kind_code == scale_code).astype(_POSITION).tobytes(),
        mismatched=tuple(mismatched),
        classes=_classes(header, layout, pos, kind_code, differs, mismatched),
        as_listed=as_listed,
    )


def _classes(
    header: ShardHeader, layout: LayoutColumns, pos: np.ndarray, kind_code: np.ndarray, differs: np.ndarray,
    mismatched: list[int],
) -> tuple[tuple[str, str, int, int, int], ...]:
    """(kind, dtype, tensors, elements, payload bytes): the rows stored as expected by their layout
    codes, the others one by one (the expected kind, the stored dtype and shape)."""
    cols = header.columns
    keep = ~differs
    span = np.array(cols.ends, dtype=np.uint64) - np.array(cols.begins, dtype=np.uint64)
    code = kind_code.astype(np.int64) * len(layout.dtypes) + layout.dtype_code[pos]
    acc: dict[tuple[str, str], list[int]] = {}
    for c in np.unique(code[keep]).tolist():
        rows = keep & (code == c)
        key = (layout.kinds[c // len(layout.dtypes)], layout.dtypes[c % len(layout.dtypes)])
        acc[key] = [int(rows.sum()), int(layout.numel[pos[rows]].sum()), int(span[rows].sum())]
    for row in mismatched:
        entry = acc.setdefault((layout.kinds[kind_code[row]], cols.dtypes[row]), [0, 0, 0])
        entry[0] += 1
        entry[1] += prod(cols.shapes[row])
        entry[2] += cols.ends[row] - cols.begins[row]
    return tuple((k, d, t, e, b) for (k, d), (t, e, b) in acc.items())
