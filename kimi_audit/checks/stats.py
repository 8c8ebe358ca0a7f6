"""Counts by tensor class and dtype: parameters are kept apart from FP8 scales and stored buffers."""

from __future__ import annotations

from math import prod
from operator import itemgetter, sub
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from kimi_audit.format.table import TensorTable
from kimi_audit.format.header import ShardHeader
from kimi_audit.model.layout import BUFFER, PARAMETER, SCALE, ExpectedTensor, classify_name

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
    actual: TensorTable, expected: dict[str, ExpectedTensor], headers: dict[str, ShardHeader],
    aligned: list[ExpectedTensor | None] | None = None,
) -> Stats:
    """`aligned`: the expected entry of each actual tensor, row by row (checks.layout.align), if known."""
    if aligned is None:
        aligned = list(map(expected.get, actual.names))
    if None in aligned:
        kinds = [e[3] if e is not None else classify_name(n) for n, e in zip(actual.names, aligned)]
    else:
        kinds = list(map(itemgetter(3), aligned))
    return _stats(class_sums(kinds, actual.dtypes, actual.shapes, list(map(sub, actual.ends, actual.begins))), headers)


def class_sums(
    kinds: list[str], dtypes: list[str], shapes: list[tuple[int, ...]], nbytes: list[int]
) -> dict[tuple[str, str], list[int]]:
    """(kind, dtype) -> [tensors, elements, payload bytes] over parallel columns."""
    # Group through small integer codes: a handful of vector passes, no loop per tensor.
    kind_code = {k: i for i, k in enumerate(dict.fromkeys(kinds))}
    dtype_code = {d: i for i, d in enumerate(dict.fromkeys(dtypes))}
    codes = (np.array(list(map(kind_code.__getitem__, kinds)), dtype=np.int64) * len(dtype_code)
             + np.array(list(map(dtype_code.__getitem__, dtypes)), dtype=np.int64))
    counts = np.bincount(codes).tolist()
    sums = [sums_by_code(codes, values) for values in (list(map(prod, shapes)), nbytes)]
    acc: dict[tuple[str, str], list[int]] = {}
    for kind, k in kind_code.items():
        for dtype, d in dtype_code.items():
            c = k * len(dtype_code) + d
            if c < len(counts) and counts[c]:
                acc[(kind, dtype)] = [counts[c], sums[0][c], sums[1][c]]
    return acc


def stats_from_classes(
    classes: Iterable[tuple[str, str, int, int, int]], headers: dict[str, ShardHeader]
) -> Stats:
    """The same Stats, from (kind, dtype, tensors, elements, bytes) partial sums (alignment.ShardAlignment)."""
    acc: dict[tuple[str, str], list[int]] = {}
    for kind, dtype, *sums in classes:
        row = acc.setdefault((kind, dtype), [0, 0, 0])
        for i, v in enumerate(sums):
            row[i] += v
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


def sums_by_code(codes: np.ndarray, values: list[int]) -> list[int]:
    """Sum of `values` per code, exactly: float64 sums are exact while every total stays below 2**53."""
    if sum(values) < 2**53:
        return [int(v) for v in np.bincount(codes, weights=np.array(values, dtype=np.float64))]
    picked = codes.tolist()
    out = [0] * (max(picked) + 1)
    for c, v in zip(picked, values):
        out[c] += v
    return out
