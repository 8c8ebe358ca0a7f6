"""The model as a grid of cells, for the HTML report's drawing (report.html).

Rows are the decoder layers (and, below them, the tensors outside the layers, one row per prefix);
columns are the parts of a block as the expected layout names them (`input_layernorm`,
`self_attn.q_a_proj`, `mlp.gate` ...), in checkpoint order; a repeated group (the routed experts,
`mlp.experts.{i}`) is one column drawn as a strip of cells, one per index. Everything is read from the
layout's names (model.layout.ExpectedLayout), so a new architecture's parts fall out without a list here.

Each cell is marked by the worst finding on its tensors: a finding names a tensor (or a layer, as MTP_ABSENT
does), or is a shard's root cause (an absent or unreadable shard, `covers` > 0), which marks the cells of
every tensor the index puts in that shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import compress, count
from operator import is_

from kimi_audit.findings import Finding, Severity
from kimi_audit.model.arch.spec import is_mtp
from kimi_audit.model.cells import Cell, Locator, first_of_spec, locator
from kimi_audit.model.layout import ExpectedLayout

MAX_NOTES = 6
"""Findings named in one cell's tooltip; the rest are counted."""
MAX_NAME = 200
"""Characters of a tensor name kept in a tooltip."""



@dataclass(frozen=True)
class Column:
    key: str
    """`self_attn.q_a_proj`; a strip's group, `mlp.experts`."""
    strip: int = 0
    """Cells of a repeated group (384 routed experts); 0 for one cell."""

    @property
    def label(self) -> str:
        return self.key.rpartition(".")[2] or "(all)"


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    block: str | None
    columns: tuple[Column, ...]
    """The columns this row holds (a dense layer has no experts), in order."""


@dataclass(frozen=True)
class Mark:
    rank: int
    """Worst severity's rank (Severity.rank)."""
    absent: bool = False
    """In a shard that is absent or unreadable: the cell it would have held."""
    notes: tuple[str, ...] = ()
    """What the tooltip lists (MAX_NOTES at most, each once)."""
    more: int = 0
    """Further findings on the cell, counted."""

    def add(self, rank: int, note: str, absent: bool) -> Mark:
        listed = note in self.notes or len(self.notes) >= MAX_NOTES
        return Mark(max(self.rank, rank), self.absent or absent, self.notes if listed else (*self.notes, note),
                    self.more + (len(self.notes) >= MAX_NOTES and note not in self.notes))


@dataclass(frozen=True)
class Grid:
    columns: tuple[Column, ...]
    """The layers' columns, in order (the union over block kinds, strips at their largest)."""
    rows: tuple[Row, ...]
    """One per decoder layer (MTP layers included), in order."""
    outside: tuple[Row, ...]
    """The tensors outside the layers: one row per prefix, each with its own columns."""
    marks: dict[Cell, Mark]
    unplaced: int
    """Findings naming a tensor no cell holds (an unexpected name), listed in the findings only."""


def build_grid(layout: ExpectedLayout, findings: Iterable[Finding],
               weight_map: Mapping[str, str] | None = None) -> Grid:
    """The grid of `layout`, marked by `findings`; `weight_map` (the index's) places a shard's root cause."""
    first = first_of_spec(layout)
    names = locator(layout, first)
    column_of = {s: names.cell(layout.names[p])[1:] for s, p in first.items() if layout.layer_of[p] is not None}
    per_layer = Counter(zip(layout.layer_of, layout.spec_of))
    order: dict[str, int] = {}
    rows: dict[int, dict[str, int]] = {}
    blocks: dict[int, str | None] = {}
    for (layer, s), n in per_layer.items():
        if layer is None:
            continue
        key, index = column_of[s]
        order[key] = max(order.get(key, 0), n if index >= 0 else 0)
        rows.setdefault(layer, {})[key] = max(rows.get(layer, {}).get(key, 0), n if index >= 0 else 0)
        blocks[layer] = layout.specs[s].block
    columns = tuple(Column(k, n) for k, n in order.items())
    grid_rows = tuple(
        Row(str(layer), f"{layer}" + (" MTP" if is_mtp(blocks[layer] or "") else ""), blocks[layer],
            tuple(Column(c.key, rows[layer][c.key]) for c in columns if c.key in rows[layer]))
        for layer in sorted(rows))
    outside: dict[str, dict[str, int]] = {}
    for p in compress(count(), map(partial(is_, None), layout.layer_of)):
        row, key, index = names.cell(layout.names[p])
        cols = outside.setdefault(row, {})
        cols[key] = max(cols.get(key, 0), index + 1 if index >= 0 else 0)
    outside_rows = tuple(Row(r, r, None, tuple(Column(k, n) for k, n in cols.items())) for r, cols in outside.items())
    grid = Grid(columns, grid_rows, outside_rows, {}, 0)
    return _mark(grid, names, findings, weight_map)


def _cells(grid: Grid) -> dict[str, dict[str, int]]:
    """Row key -> column key -> strip size (0: one cell)."""
    return {r.key: {c.key: c.strip for c in r.columns} for r in (*grid.rows, *grid.outside)}


def _mark(grid: Grid, names: Locator, findings: Iterable[Finding], weight_map: Mapping[str, str] | None) -> Grid:
    cells = _cells(grid)
    marks: dict[Cell, Mark] = {}
    unplaced = 0

    def put(cell: Cell, f: Finding, note: str, absent: bool = False) -> None:
        marks[cell] = marks.get(cell, Mark(f.severity.rank)).add(f.severity.rank, note, absent)

    def placed(cell: Cell) -> bool:
        row, key, index = cell
        strip = cells.get(row, {}).get(key)
        return strip is not None and (index < 0 if strip == 0 else 0 <= index < strip)

    roots: dict[str, list[Finding]] = {}
    for f in findings:
        if f.severity is Severity.INFO:  # not drawn: a PASS page painted a column blue for one (listed below)
            continue
        if f.tensor:
            cell = names.cell(f.tensor)
            name = f.tensor if len(f.tensor) <= MAX_NAME else f.tensor[:MAX_NAME] + "…"
            note = f"{f.code} ({f.severity.value}): {name}"
            if cell[1] == "" and cell[0] in cells and cell[2] < 0:  # a whole layer
                for key, strip in cells[cell[0]].items():
                    for i in range(strip) if strip else (-1,):
                        put((cell[0], key, i), f, note)
            elif placed(cell):
                put(cell, f, note)
            else:
                unplaced += 1
        elif f.shard and f.covers and f.severity is Severity.ERROR:
            roots.setdefault(f.shard, []).append(f)
    if roots and weight_map:
        for tensor in compress(weight_map, map(roots.__contains__, weight_map.values())):
            shard = weight_map[tensor]
            cell = names.cell(tensor)
            if placed(cell):
                for f in roots[shard]:
                    put(cell, f, f"{f.code} ({f.severity.value}): {shard}, which the index says holds "
                        f"{f.covers:,} tensors, was not read", absent=True)
    return Grid(grid.columns, grid.rows, grid.outside, marks, unplaced)
