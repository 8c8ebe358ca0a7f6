"""Counts by tensor class and dtype: parameters are kept apart from FP8 scales and stored buffers."""

from __future__ import annotations

from collections import Counter
from math import prod
from dataclasses import dataclass

from kimi_audit.checks.tensors import Located
from kimi_audit.format import ShardHeader
from kimi_audit.layout import BUFFER, PARAMETER, SCALE, ExpectedTensor, classify_name

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


def compute_stats(actual: Located, expected: dict[str, ExpectedTensor], headers: dict[str, ShardHeader]) -> Stats:
    get = expected.get
    infos = [v[0] for v in actual.values()]
    kinds = [e[3] if (e := get(n)) is not None else classify_name(n) for n in actual]
    keys = list(zip(kinds, [t[1] for t in infos]))
    acc: dict[tuple[str, str], list[int]] = {k: [n, 0, 0] for k, n in Counter(keys).items()}
    for key, t in zip(keys, infos):
        row = acc[key]
        row[1] += prod(t[2])
        row[2] += t[4] - t[3]
    rows = tuple(
        ClassRow(kind, dtype, *acc[(kind, dtype)])
        for kind, dtype in sorted(acc, key=lambda k: (KIND_ORDER.index(k[0]), -acc[k][1]))
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
