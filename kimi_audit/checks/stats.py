"""Counts by tensor class and dtype: parameters are kept apart from quantization metadata and stored buffers.

A PARAMETER's elements are parameters; PACKED words (INT4 weight_packed) count for the out x in logical
parameters of their module, never for their stored elements; SCALE (metadata) and BUFFER count for none.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from math import prod
from operator import sub

from kimi_audit.checks.layout import Alignment, align
from kimi_audit.format.header import ShardHeader
from kimi_audit.format.table import TensorTable
from kimi_audit.model.kinds import BUFFER, PACKED, PARAMETER, SCALE, block_prefix
from kimi_audit.model.layout import ExpectedLayout
from kimi_audit.model.roles import kind_of

KIND_ORDER = (PARAMETER, PACKED, SCALE, BUFFER)


@dataclass(frozen=True)
class ClassRow:
    kind: str
    dtype: str
    tensors: int
    elements: int
    bytes: int
    parameters: int = 0
    """Logical parameters these tensors count for (elements of a PARAMETER, out x in of PACKED words)."""


@dataclass(frozen=True)
class ComponentRow:
    """One component's parameters, derived from the layout and found in the tensors that bear its names."""

    block: str | None
    """DENSE, MOE or MTP inside the decoder layers (all layers of that kind together), None outside them."""
    component: str
    """`self_attn.q_a_proj.weight`, `mlp.experts.gate_proj.weight_packed`; "" for names the layout lacks."""
    derived: int
    found: int


@dataclass(frozen=True)
class Stats:
    shards: int
    tensors: int
    elements: int
    """Elements of every tensor, scales and buffers included."""
    parameters: int
    """Logical parameters: elements of parameter tensors plus what packed words stand for; no
    weight_scale_inv, no other quantization metadata, no rotary_emb.inv_freq."""
    payload_bytes: int
    header_bytes: int
    file_bytes: int
    rows: tuple[ClassRow, ...]
    components: tuple[ComponentRow, ...] = ()
    """Parameters per component, derived and found, in checkpoint order (the HTML report's bars)."""

    def count(self, kind: str) -> int:
        return sum(r.tensors for r in self.rows if r.kind == kind)

    def elements_of(self, kind: str) -> int:
        return sum(r.elements for r in self.rows if r.kind == kind)


def compute_stats(
    actual: TensorTable, expected: ExpectedLayout, headers: dict[str, ShardHeader], aligned: Alignment | None = None
) -> Stats:
    """(kind, dtype) -> tensors, elements, payload bytes: rows as the layout expects them are counted
    by Spec and multiplied out; the odd rows (checks.layout.align) are added one by one."""
    if aligned is None:
        aligned = align(actual, expected)
    spec_rows, odd = aligned.specs, aligned.odd
    counts = Counter(spec_rows)
    counts.subtract(Counter(map(spec_rows.__getitem__, odd)))  # (a Counter of them: counted at builtin speed)
    acc: dict[tuple[str, str], list[int]] = {}
    found: dict[int, int] = {}
    """Spec -> parameters found under its names (-1: names the layout lacks)."""

    def add(kind: str, dtype: str, n: int, elements: int, nbytes: int, logical: int, spec: int) -> None:
        row = acc.setdefault((kind, dtype), [0, 0, 0, 0])
        row[0] += n
        row[1] += elements
        row[2] += nbytes
        row[3] += logical
        found[spec] = found.get(spec, 0) + logical

    for i, n in counts.items():
        if n:
            s = expected.specs[i]
            assert s.nbytes is not None  # a row of unknown width differs from its Spec: it is odd
            add(s.kind, s.dtype, n, n * prod(s.shape), n * s.nbytes, n * s.logical, i)
    # the odd rows the layout knows, by class (Spec, dtype, shape, payload): one add per class (69,120 I64
    # weight_shapes are one); the names it lacks one by one, their kind from their names
    known = [row for row in odd if spec_rows[row] >= 0]
    classes = Counter(zip(map(spec_rows.__getitem__, known), map(actual.dtypes.__getitem__, known),
                          map(actual.shapes.__getitem__, known),
                          map(sub, map(actual.ends.__getitem__, known), map(actual.begins.__getitem__, known))))
    for (i, dtype, shape, nbytes), n in classes.items():
        s = expected.specs[i]
        elements = prod(shape)
        # packed words of the wrong shape still stand for their module (reported as SHAPE_MISMATCH)
        logical = elements if s.kind == PARAMETER else s.logical if s.kind == PACKED else 0
        add(s.kind, dtype, n, n * elements, n * nbytes, n * logical, i)
    for row in odd:
        if spec_rows[row] < 0:
            kind, elements = kind_of(actual.names[row]), prod(actual.shapes[row])
            add(kind, actual.dtypes[row], 1, elements, actual.ends[row] - actual.begins[row],
                elements if kind == PARAMETER else 0, -1)
    return _stats(acc, headers, _components(expected, found))


INDEX = re.compile(r"\.\d+(?=\.)")


def _components(expected: ExpectedLayout, found: dict[int, int]) -> tuple[ComponentRow, ...]:
    """Derived and found parameters per (block kind, component), in checkpoint order; each component as the
    checkpoint spells it (a GGUF's `attn_q_b.weight`, where the release's is `self_attn.q_b_proj.weight`)."""
    rows: dict[tuple[str | None, str], list[int]] = {}
    names, specs = expected.names, expected.specs
    respelled = bool(names) and not INDEX.sub("", names[0]).endswith(specs[expected.spec_of[0]].component)
    first = dict(zip(reversed(expected.spec_of), reversed(names))) if respelled else {}  # each spec's first name
    for i, n in Counter(expected.spec_of).items():
        s = specs[i]
        if s.logical or found.get(i):
            name = first.get(i, s.component)
            spelled = INDEX.sub("", name)
            component = s.component if spelled.endswith(s.component) else INDEX.sub(
                "", name[len(block_prefix(name)):])
            row = rows.setdefault((s.block, component), [0, 0])
            row[0] += n * s.logical
            row[1] += found.get(i, 0)
    if found.get(-1):
        rows[None, ""] = [0, found[-1]]
    return tuple(ComponentRow(block, comp, d, f) for (block, comp), (d, f) in rows.items())


def _stats(acc: dict[tuple[str, str], list[int]], headers: dict[str, ShardHeader],
           components: tuple[ComponentRow, ...] = ()) -> Stats:
    rows = tuple(
        ClassRow(kind, dtype, *acc[(kind, dtype)])
        for kind, dtype in sorted(acc, key=lambda k: (KIND_ORDER.index(k[0]), -acc[k][1], k[1]))
    )
    return Stats(
        shards=len(headers),
        tensors=sum(r.tensors for r in rows),
        elements=sum(r.elements for r in rows),
        parameters=sum(r.parameters for r in rows),
        payload_bytes=sum(r.bytes for r in rows),
        header_bytes=sum(h.data_start for h in headers.values()),
        file_bytes=sum(h.file_size for h in headers.values()),
        rows=rows,
        components=components,
    )
