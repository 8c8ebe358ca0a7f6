"""Inline SVG for the HTML report (report.html): the model grid, proportional bars, small multiples.

Every string that comes from the checkpoint goes through `esc`: markup escaped, and characters that XML
forbids or that reorder text (controls, bidi overrides, noncharacters) written as visible escapes, so the
page parses as HTML5 and each <svg> as XML. Colours are CSS classes (the page's stylesheet, light and dark).
"""

from __future__ import annotations

import html
import re

from kimi_audit.model.cells import OUTSIDE, Cell
from kimi_audit.report.grid import Column, Grid, Mark, Row

_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]")
CW, SW, RH, GAP = 11, 3, 9, 1
"""Cell width, strip cell width, row height, gap (px)."""
LABEL_W = 64
CHAR_W = 5.2
"""Width of a 9 px label's character (the column heads are sized by their longest name)."""
SEVERITY_CLASS = {2: "e", 1: "w", 0: "i"}
RANK_WORD = {2: "error", 1: "warning", 0: "info"}


def esc(value: object) -> str:
    """Text or attribute content: escaped, with unsafe characters shown as `\\xNN` / `\\uNNNN`."""
    text = _UNSAFE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", str(value))
    return html.escape(text, quote=True)


def section(ident: str, title: str, *body: str) -> str:
    return f'<section id="{ident}"><h2>{esc(title)}</h2>{"".join(body)}</section>'


def svg_open(width: float, height: float, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" width="{width:g}" '
            f'height="{height:g}" role="img" aria-label="{esc(label)}">')


def rect(x: float, y: float, w: float, h: float, cls: str, title: str = "", cell: Cell | None = None) -> str:
    data = f' data-cell="{esc(f"{cell[0]}|{cell[1]}|{cell[2]}")}"' if cell is not None else ""
    body = f"<title>{esc(title)}</title></rect>" if title else "</rect>"
    return f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" class="{cls}"{data}>{body}'


def text(x: float, y: float, s: str, cls: str = "", anchor: str = "start", rotate: float = 0) -> str:
    tr = f' transform="rotate({rotate:g} {x:g} {y:g})"' if rotate else ""
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:g}" y="{y:g}" text-anchor="{anchor}"{c}{tr}>{esc(s)}</text>'


def mark_class(m: Mark | None) -> str:
    if m is None:
        return "ok"
    return "abs" if m.absent else SEVERITY_CLASS[m.rank]


def mark_title(where: str, m: Mark | None) -> str:
    if m is None:
        return f"{where}: no finding"
    lines = [f"{where}: {RANK_WORD[m.rank]}" + (" (in a shard not read)" if m.absent else ""), *m.notes]
    if m.more:
        lines.append(f"… and {m.more:,} more findings")
    return "\n".join(lines)


def _outside_width(key: str) -> float:
    """A named cell outside the layers is as wide as its label below it."""
    return max(CW * 3, 5.5 * len(key) + 6)


def strip_label(c: Column) -> str:
    return f"{c.key} ×{c.strip:,}"


def _extent(c: Column) -> float:
    """A column's width: a cell's, or a strip's cells or its label above them, whichever is wider (a strip of 8
    experts is 24 px, its label `mlp.experts ×8` 73: the label was cut by the next column or the edge)."""
    return max(c.strip * SW, CHAR_W * len(strip_label(c))) if c.strip else CW


def _positions(columns: tuple[Column, ...]) -> dict[str, float]:
    """x of each column: single cells first, strips after (each as wide as its cells or its label)."""
    out: dict[str, float] = {}
    x = float(LABEL_W)
    for c in sorted(columns, key=lambda c: c.strip > 0):
        out[c.key] = x
        x += _extent(c) + (6 if c.strip else GAP)
    return out


def _width(columns: tuple[Column, ...], xs: dict[str, float]) -> float:
    return max((xs[c.key] + _extent(c) for c in columns), default=LABEL_W) + 4


def _row(row: Row, y: float, xs: dict[str, float], marks: dict[Cell, Mark], prefix: str, cw: float = CW,
         label_x: float = LABEL_W - 4) -> list[str]:
    out = [text(label_x, y + RH - 1, row.label, "lab", "end")]
    for c in row.columns:
        x = xs[c.key]
        if not c.strip:
            cell = (row.key, c.key, -1)
            m = marks.get(cell)
            title = mark_title(f"{prefix}{row.label} · {c.key}", m)
            out.append(rect(x, y, cw or _outside_width(c.key), RH, mark_class(m), title, cell if m else None))
            continue
        out.append(rect(x, y, c.strip * SW, RH, "ok strip",
                        f"{prefix}{row.label} · {c.key}.{{0-{c.strip - 1}}}: {c.strip:,} cells"))
        for i in range(c.strip):
            cell = (row.key, c.key, i)
            m = marks.get(cell)
            if m is not None:
                out.append(rect(x + i * SW, y, SW, RH, mark_class(m),
                                mark_title(f"{prefix}{row.label} · {c.key}.{i}", m), cell))
    return out


def grid_svg(grid: Grid) -> str:
    """The layers' grid: one row per layer, one column per part, strips for repeated groups."""
    xs = _positions(grid.columns)
    width = _width(grid.columns, xs)
    head = 16 + CHAR_W * max((len(c.key) for c in grid.columns if not c.strip), default=0)
    height = head + len(grid.rows) * (RH + GAP) + 4
    out = [svg_open(width, height, f"model grid: {len(grid.rows)} layers, {len(grid.columns)} parts")]
    for c in grid.columns:
        x = xs[c.key]
        if c.strip:
            out.append(text(x, head - 4, strip_label(c), "lab"))
        else:
            out.append(text(x + CW - 3, head - 4, c.key, "lab", rotate=-90))
    for k, row in enumerate(grid.rows):
        out += _row(row, head + k * (RH + GAP), xs, grid.marks, "layer ")
    out.append("</svg>")
    return "".join(out)


def outside_svg(grid: Grid) -> str:
    """The tensors outside the layers: one row per prefix, its own cells (and strips), labelled below."""
    if not grid.outside:
        return ""
    label_w = max(LABEL_W, 7 * max(len(r.label) for r in grid.outside))
    lines: list[str] = []
    width = 0.0
    y = 4.0
    for row in grid.outside:
        xs: dict[str, float] = {}
        x = float(label_w)
        for c in row.columns:
            xs[c.key] = x
            x += (c.strip * SW if c.strip else _outside_width(c.key)) + 3
        width = max(width, x + 4)
        lines += _row(row, y, xs, grid.marks, "", 0, label_w - 4)
        if row.key == OUTSIDE:
            lines += [text(xs[c.key], y + 2 * RH + 2, c.key, "lab") for c in row.columns]
            y += RH + 16
        y += RH + 6
    return "".join([svg_open(max(width, 320), y + 4, "tensors outside the layers"), *lines, "</svg>"])


def wrappable(name: str) -> str:
    """A tensor, file or pattern name for HTML text (not SVG): escaped, with a break opportunity (<wbr>) after
    `.`, `/` or `-` between word characters, so that a narrow column wraps it there, not in the middle of a word
    (the page's `word-break: break-all` broke `model.layers.2.self_attn` anywhere)."""
    return re.sub(r"(?<=\w[./-])(?=\w)", "<wbr>", esc(name))  # between word characters: never in an entity


LABEL_CHAR_W = 5.6
"""Width of a 9 px bar label's character, with room (a label's right end must not reach its bars)."""


def bars_svg(rows: list[tuple[int, str, int, int, bool]], total: int) -> str:
    """Proportional bars, two per row (derived, found): (depth, title, derived, found, mismatch). The labels'
    column is as wide as the longest label (from 250 px): a long one ran into its bars."""
    scale = 520 / total if total else 0.0
    label_w = max(250, round(max((8 + 12 * depth + LABEL_CHAR_W * len(title) for depth, title, *_ in rows),
                                 default=0)) + 12)
    row_h = 26
    out = [svg_open(label_w + 540 + 190, len(rows) * row_h + 6, "parameter accounting: derived and found")]
    for k, (depth, title, derived, found, bad) in enumerate(rows):
        y = 4 + k * row_h
        out.append(text(8 + 12 * depth, y + 14, title, "lab bad" if bad else "lab"))
        out.append(rect(label_w, y + 2, max(derived * scale, 1), 9, "der", f"{title}: derived {derived:,}"))
        out.append(rect(label_w, y + 12, max(found * scale, 1), 9, "e" if bad else "fnd",
                        f"{title}: found {found:,}" + (" (differs from derived)" if bad else "")))
        out.append(text(label_w + 530, y + 11, f"{derived:,}", "num"))
        out.append(text(label_w + 530, y + 21, f"{found:,}" + ("  ✗" if bad else ""), "num bad" if bad else "num"))
    out.append("</svg>")
    return "".join(out)


def multiples_svg(title: str, series: list[tuple[str, int]], unit: str) -> str:
    """One small multiple: a bar per label (layer or expert), height by log10(1 + count)."""
    import math

    w = max(2.0, min(8.0, 480 / max(len(series), 1)))
    top = max((math.log10(1 + n) for _, n in series), default=0.0) or 1.0
    height, base = 70, 60
    out = [svg_open(max(w * len(series) + 10, CHAR_W * len(title) + 6), height + 14, title), text(2, 10, title, "lab")]
    for k, (label, n) in enumerate(series):
        h = 44 * math.log10(1 + n) / top
        out.append(rect(5 + k * w, base - h, max(w - 0.5, 1), max(h, 0.5), "e" if n else "ok",
                        f"{unit} {label}: {n:,}"))
    if series:
        out.append(text(5, base + 12, series[0][0], "lab"))
        out.append(text(5 + len(series) * w, base + 12, series[-1][0], "lab", "end"))
    out.append("</svg>")
    return "".join(out)
