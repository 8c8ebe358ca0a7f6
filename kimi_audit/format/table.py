"""Where each tensor actually is: one table over all shard headers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat
from typing import Protocol, TypeVar

from kimi_audit.findings import Finding, error
from kimi_audit.format.header import ShardHeader, TensorInfo

T = TypeVar("T")
Located = dict[str, tuple[TensorInfo, str]]
"""Tensor name -> (its header entry, the shard holding it)."""


def locate_tensors(headers: dict[str, ShardHeader]) -> tuple[Located, list[Finding]]:
    """The table as a dict: name -> (header entry, shard)."""
    table, findings = tensor_table(headers)
    rows = zip(table.names, table.dtypes, table.shapes, table.begins, table.ends)
    return dict(zip(table.names, zip(map(tuple.__new__, repeat(TensorInfo), rows), table.shards))), findings


class TensorLookup(Protocol):
    """Where a named tensor is (TensorTable, or anything else that can say)."""

    def get(self, name: str) -> tuple[TensorInfo, str] | None: ...


@dataclass(frozen=True)
class TensorTable:
    """Every located tensor as parallel columns, shard by shard in header order (on a name stored in
    two shards, the first keeps it). What the checks read: whole columns at builtin speed, no object
    per tensor."""

    names: list[str]
    shards: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    ends: list[int]

    @cached_property
    def row_of(self) -> dict[str, int]:
        """Name -> its row, built when first asked: an audit that finds every name where the index and the layout
        put it never asks (Kimi K3's 497,052 names: a 30 MB dict held through the checks)."""
        return dict(zip(self.names, range(len(self.names))))

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.row_of

    def info(self, row: int) -> TensorInfo:
        return TensorInfo(self.names[row], self.dtypes[row], self.shapes[row], self.begins[row], self.ends[row])

    def get(self, name: str) -> tuple[TensorInfo, str] | None:
        """(its header entry, its shard), as a Located value."""
        row = self.row_of.get(name)
        return None if row is None else (self.info(row), self.shards[row])


def tensor_table(headers: dict[str, ShardHeader]) -> tuple[TensorTable, list[Finding]]:
    cols = [h.columns for h in headers.values()]
    names = list(chain.from_iterable(c.names for c in cols))
    shards = list(chain.from_iterable(repeat(s, h.tensor_count) for s, h in headers.items()))
    dtypes = list(chain.from_iterable(c.dtypes for c in cols))
    shapes = list(chain.from_iterable(c.shapes for c in cols))
    begins = list(chain.from_iterable(c.begins for c in cols))
    ends = list(chain.from_iterable(c.ends for c in cols))
    findings: list[Finding] = []
    if len(set(names)) != len(names):  # a name stored in two shards (a set: half a dict's memory, and dropped)
        first: dict[str, str] = {}
        keep = []
        for row, (name, shard) in enumerate(zip(names, shards)):
            prev = first.setdefault(name, shard)
            if prev != shard:
                findings.append(error("TENSOR_DUPLICATE", f"{name} is stored in both {prev} and {shard}",
                                      tensor=name, shard=shard, expected=prev, actual=shard))
            else:
                keep.append(row)
        names, shards, dtypes = _rows(names, keep), _rows(shards, keep), _rows(dtypes, keep)
        shapes, begins, ends = _rows(shapes, keep), _rows(begins, keep), _rows(ends, keep)
    return TensorTable(names, shards, dtypes, shapes, begins, ends), findings


def _rows(column: list[T], keep: list[int]) -> list[T]:
    return [column[row] for row in keep]
