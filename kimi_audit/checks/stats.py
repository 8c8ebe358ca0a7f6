"""Counts by tensor class and dtype: parameters are kept apart from FP8 scales and stored buffers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod
from operator import sub

from kimi_audit.format.header import ShardHeader
from kimi_audit.format.table import TensorTable
from kimi_audit.model.layout import BUFFER, PARAMETER, SCALE, ExpectedLayout, classify_name

KIND_ORDER = (PARAMETER, SCALE, BUFFER)


@dataclass(frozen=True)
class ClassRow:
    kind: str
    dtype: str
    tensors: int
    elements: int
    bytes: int


@dataclass(frozen=True)
class Stats:
    shards: int
    tensors: int
    elements: int
    """Elements of every tensor, scales and buffers included."""
    parameters: int
    """Elements of parameter tensors only: no weight_scale_inv, no rotary_emb.inv_freq."""
    payload_bytes: int
    header_bytes: int
    file_bytes: int
    rows: tuple[ClassRow, ...]

    def count(self, kind: str) -> int:
        return sum(r.tensors for r in self.rows if r.kind == kind)

    def elements_of(self, kind: str) -> int:
        return sum(r.elements for r in self.rows if r.kind == kind)


def compute_stats(
    actual: TensorTable, expected: ExpectedLayout, headers: dict[str, ShardHeader],
    positions: list[int | None] | None = None,
) -> Stats:
    """`positions`: the layout position of each actual tensor (checks.layout.align), if known."""
    if positions is None:
        positions = list(map(expected.position.get, actual.names))
    kind_of_spec = [s.kind for s in expected.specs]
    spec_of = expected.spec_of
    if None in positions:
        kinds = [kind_of_spec[spec_of[p]] if p is not None else classify_name(n) for n, p in zip(actual.names, positions)]
    else:
        kinds = list(map(kind_of_spec.__getitem__, map(spec_of.__getitem__, positions)))  # type: ignore[arg-type]
    # A checkpoint repeats a few hundred (kind, dtype, shape, bytes): count those, then multiply out.
    groups = Counter(zip(kinds, actual.dtypes, actual.shapes, map(sub, actual.ends, actual.begins)))
    acc: dict[tuple[str, str], list[int]] = {}
    for (kind, dtype, shape, nbytes), n in groups.items():
        row = acc.setdefault((kind, dtype), [0, 0, 0])
        row[0] += n
        row[1] += n * prod(shape)
        row[2] += n * nbytes
    return _stats(acc, headers)


def _stats(acc: dict[tuple[str, str], list[int]], headers: dict[str, ShardHeader]) -> Stats:
    rows = tuple(
        ClassRow(kind, dtype, *acc[(kind, dtype)])
        for kind, dtype in sorted(acc, key=lambda k: (KIND_ORDER.index(k[0]), -acc[k][1], k[1]))
    )
    return Stats(
        shards=len(headers),
        tensors=sum(r.tensors for r in rows),
        elements=sum(r.elements for r in rows),
        parameters=sum(r.elements for r in rows if r.kind == PARAMETER),
        payload_bytes=sum(r.bytes for r in rows),
        header_bytes=sum(h.data_start for h in headers.values()),
        file_bytes=sum(h.file_size for h in headers.values()),
        rows=rows,
    )
