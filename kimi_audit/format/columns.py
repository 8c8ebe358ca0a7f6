"""A header's tensors as typed rows and columns, and the rules both header readers share.

`TensorInfo` is one entry, `TensorColumns` a header's valid entries column by column. The two readers
of header.py (the msgspec one in decode.py, the json.loads one in strict.py) both end in
`sound_columns`, the numeric rules for all entries at once, and `extent_findings`, which checks that
the offsets tile the data buffer. Pure Python: no numpy in the format stage.
"""

from __future__ import annotations

import math
from itertools import repeat
from operator import mul, sub
from typing import NamedTuple

from kimi_audit.constants import DTYPE_BITS, HEADER_LENGTH_BYTES
from kimi_audit.findings import Finding, error

U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1
FAST_MAX_DIMS = 8
MAX_DIMS = 64
"""The most dims a tensor may have: numpy's NPY_MAXDIMS (64 since numpy 2.0), so safetensors.numpy (and
this tool's value checks) can load any tensor a header passes. Real checkpoints use at most 5. Beyond
it the shape is SHAPE_INVALID and never used: a 20,000-dim shape otherwise makes 6,000-digit numbers."""
# The bounds of the column rules (entries beyond them are judged one by one): data_offsets up to
# 2^60 and numel up to 2^57, so that no size computed from them approaches 2^64.
MAX_FAST_OFFSET = I64_MAX >> 3
MAX_FAST_NUMEL = I64_MAX >> 6


class TensorInfo(NamedTuple):
    """One tensor entry of a header. Offsets are relative to the data buffer (byte 8 + N)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class TensorColumns(NamedTuple):
    """A header's valid entries as parallel columns (how the parser validates them)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    """Equal shapes are one shared tuple where the reader could share them (the column rules do)."""
    begins: list[int]
    ends: list[int]

    @staticmethod
    def of(infos: list[TensorInfo]) -> TensorColumns:
        return TensorColumns(*(list(col) for col in zip(*infos))) if infos else EMPTY_COLUMNS


EMPTY_COLUMNS = TensorColumns([], [], [], [], [])


def sound_columns(names: list[str], dts: list[str], shapes: list[tuple[int, ...]],
                  begins: list[int], ends: list[int]) -> TensorColumns | None:
    """The numeric rules for all entries at once; None when any entry needs the per-entry look.

    Known: `dts` are known dtypes, each shape a tuple of at most FAST_MAX_DIMS ints, offsets ints.
    Accepted only what the per-entry rules accept without a finding: every dim >= 1 (a zero-element
    tensor goes the per-entry way, whose overflow rule applies to the running product), a size that
    stays far from 2^64, and `end - begin` equal to the tensor's bytes (so begin < end).
    """
    if not names:
        return EMPTY_COLUMNS
    if min(begins) < 0 or max(ends) > MAX_FAST_OFFSET:
        return None
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    shapes = list(map(shared.setdefault, shapes, shapes))  # one tuple per distinct shape
    numel_of = {}
    for shape in shared:
        numel = math.prod(shape)
        if numel <= 0 or numel > MAX_FAST_NUMEL or (shape and min(shape) < 1):
            return None
        numel_of[shape] = numel
    expected_bits = map(mul, map(numel_of.__getitem__, shapes), map(DTYPE_BITS.__getitem__, dts))
    if list(expected_bits) != list(map(mul, map(sub, ends, begins), repeat(8))):
        return None
    return TensorColumns(names, dts, shapes, begins, ends)


def label(name: str, limit: int = 200) -> str:
    """A tensor name fit for a one-line message: as is when printable and short, else escaped and cut."""
    if len(name) <= limit and name.isprintable():
        return name
    return repr(name[:limit])[1:-1] + ("..." if len(name) > limit else "")


def extent_findings(columns: TensorColumns, shard: str, n: int, file_size: int) -> list[Finding]:
    """Offsets must tile the data buffer exactly: from 0, no gaps, no overlaps, to the end of the file."""
    out: list[Finding] = []
    begins, ends = columns.begins, columns.ends
    if begins and (begins[0] != 0 or begins[1:] != ends[:-1]):
        pos = 0
        for begin, end, name in sorted(zip(begins, ends, columns.names)):
            if begin < pos:
                out.append(error("OFFSETS_OVERLAP", f"{label(name)}: data [{begin}, {end}) overlaps bytes before {pos}",
                                 tensor=name, shard=shard, expected=pos, actual=begin))
            elif begin > pos:
                out.append(error("OFFSETS_GAP", f"{label(name)}: data starts at {begin}, leaving {begin - pos:,} "
                                 f"unused bytes after {pos}", tensor=name, shard=shard, expected=pos, actual=begin))
            pos = max(pos, end)
    else:
        pos = ends[-1] if ends else 0
    data_end = HEADER_LENGTH_BYTES + n + pos
    if data_end > file_size:
        room = file_size - HEADER_LENGTH_BYTES - n  # the data bytes the file holds
        cut = [(b, nm) for b, e, nm in zip(begins, ends, columns.names) if e > room]
        cut.sort()
        first = ", ".join(label(nm, 120) for _, nm in cut[:3]) + (f" and {len(cut) - 3:,} more" if len(cut) > 3 else "")
        out.append(error("DATA_PAST_EOF", f"tensor data ends at byte {data_end:,}, past the end of the "
                         f"{file_size:,}-byte file: the bytes of {len(cut):,} tensor{'s' if len(cut) != 1 else ''} "
                         f"are cut ({first})", tensor=cut[0][1] if cut else None, shard=shard, expected=file_size,
                         actual=data_end, covers=len(cut)))
    elif data_end < file_size:
        out.append(error("TRAILING_BYTES", f"{file_size - data_end:,} bytes follow the last tensor",
                         shard=shard, expected=data_end, actual=file_size))
    return out
