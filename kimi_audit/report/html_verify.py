"""The parts of the HTML report only `verify` has: every file's hash status, and the weight-health figures
drawn as small multiples per layer and per expert: the findings (NaN codes, all-zero blocks, NaN/Inf, scales
<= 0), and from the report's per layer / per expert sums (VerifyReport.layers / .experts) the share of FP8
values at ±448 and the range of the float scales. Nothing is computed here but sums of the counts the
findings carry and the outliers among those figures (marked w: a share or a scale bound 100x off the median
cell's; e: a scale <= 0)."""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from kimi_audit.findings import Finding
from kimi_audit.model.cells import locator
from kimi_audit.model.layout import ExpectedLayout
from kimi_audit.report.grid import Grid
from kimi_audit.report.svg import CHAR_W, CW, RH, esc, multiples_svg, rect, section, svg_open, text, wrappable
from kimi_audit.report.table import plural
from kimi_audit.verify.read import CellHealth
from kimi_audit.verify.result import ABSENT, MISMATCH, NOT_CHECKED, NOT_PRESENT, OK, UNREADABLE, UNREFERENCED

HEALTH_CODES = ("FP8_NAN", "BLOCK_ALL_ZERO", "VALUE_NAN", "VALUE_INF", "SCALE_NOT_POSITIVE")
STATUS_CLASS = {OK: "ok", UNREFERENCED: "i", NOT_CHECKED: "w", MISMATCH: "e", ABSENT: "e", NOT_PRESENT: "e",
                UNREADABLE: "e"}
MAX_FILE_ROWS = 200
OUTLIER = 100.0
"""A cell's saturation share or scale bound this many times off the median cell's is marked (class w)."""


def files_section(files: list[dict[str, Any]]) -> str:
    """One cell per file, coloured by its hash status, and a table of every file (name, size, sha256, status;
    those not ok first): the hashes were only the cells' hover text."""
    per_row = 64
    rows = (len(files) + per_row - 1) // per_row
    cells = [rect(4 + (k % per_row) * (CW + 2), 4 + (k // per_row) * (RH + 4), CW, RH + 2,
                  STATUS_CLASS.get(f["status"], "e"),
                  f"{f['name']}: {f['status']}" + (", unlisted" if f["unlisted"] else "")
                  + f"\nsha256 {f['sha256'] or '(not computed)'}"
                  + (f"\nexpected {f['expected']} ({f['reference']})" if f["expected"] else ""))
             for k, f in enumerate(files)]
    strip = svg_open(8 + min(len(files), per_row) * (CW + 2), 8 + rows * (RH + 4), "files by hash status")
    counts: dict[str, int] = {}
    for f in files:
        counts[f["status"]] = counts.get(f["status"], 0) + 1
    # every file, not only as the cells' hover text: those not ok first, then by name
    ordered = sorted(files, key=lambda f: (f["status"] in (OK, UNREFERENCED) and not f["unlisted"], f["name"]))
    table = ("<table><thead><tr><th>file</th><th>size (bytes)</th><th>sha256</th><th>status</th></tr></thead><tbody>"
             + "".join(_file_row(f) for f in ordered[:MAX_FILE_ROWS]) + "</tbody></table>")
    if len(files) > MAX_FILE_ROWS:
        table += (f'<p class="mut">… and {len(files) - MAX_FILE_ROWS:,} more files, every one ok (the JSON report '
                  "lists each)</p>" if all(f["status"] in (OK, UNREFERENCED) and not f["unlisted"]
                                          for f in ordered[MAX_FILE_ROWS:]) else
                  f'<p class="mut">… and {len(files) - MAX_FILE_ROWS:,} more files (the JSON report lists each)</p>')
    summary = ", ".join(f"{n:,} {s}" for s, n in sorted(counts.items()))
    return section("files", f"Files and hashes ({len(files):,}: {summary})", f'<div class="scroll">{strip}',
                   "".join(cells), "</svg></div>", table)


def _file_row(f: dict[str, Any]) -> str:
    ok = f["status"] in (OK, UNREFERENCED) and not f["unlisted"]
    status = esc(f["status"]) + (", unlisted" if f["unlisted"] else "")
    if f["expected"]:
        status += f'<br><span class="mut">expected <code>{esc(f["expected"])}</code> ({esc(f["reference"])})</span>'
    size = f"{f['size']:,}" if isinstance(f.get("size"), int) else ""
    return (f'<tr><td><code>{wrappable(f["name"])}</code></td><td class="n">{size}</td>'
            f'<td><code class="hash">{esc(f["sha256"] or "(not computed)")}</code></td>'
            f'<td class="{"" if ok else "sev-error"}">{status}</td></tr>')


def _count(f: Finding) -> int:
    return f.actual if isinstance(f.actual, int) and not isinstance(f.actual, bool) else 1


def _off(value: float, typical: float) -> bool:
    return value > typical * OUTLIER or (typical > 0 and value < typical / OUTLIER)


def share_svg(title: str, cells: list[tuple[str, CellHealth | None]], unit: str) -> str:
    """One small multiple of the share of FP8 values at ±448: a bar per layer (expert), linear in the share."""
    shares = [(label, c.saturated / c.fp8_values if c is not None and c.fp8_values else None) for label, c in cells]
    typical = median([v for _, v in shares if v]) if any(v for _, v in shares) else 0.0
    top = max((v for _, v in shares if v is not None), default=0.0) or 1.0
    w = max(2.0, min(8.0, 480 / max(len(cells), 1)))
    base = 60
    out = [svg_open(max(w * len(cells) + 10, CHAR_W * len(title) + 6), 84, title), text(2, 10, title, "lab")]
    for k, ((label, c), (_, v)) in enumerate(zip(cells, shares)):
        if c is None or v is None:
            continue
        h = 44 * v / top
        cls = "w" if typical and _off(v, typical) else "ok"
        out.append(rect(5 + k * w, base - h, max(w - 0.5, 1), max(h, 0.5), cls,
                        f"{unit} {label}: {c.saturated:,} of {c.fp8_values:,} FP8 values at ±448 ({100 * v:.4g}%)"))
    if cells:
        out.append(text(5, base + 12, cells[0][0], "lab"))
        out.append(text(5 + len(cells) * w, base + 12, cells[-1][0], "lab", "end"))
    out.append("</svg>")
    return "".join(out)


def axis_ticks(lo: float, hi: float) -> tuple[str, str]:
    """The labels of a log axis's ends (log10 of the least and greatest value), top first: each value to two
    significant digits (`1e{hi:.0f}` rounded both ends of a span under a decade to the same `1e-4`)."""
    return f"{10 ** hi:.2g}", f"{10 ** lo:.2g}"


def range_svg(title: str, cells: list[tuple[str, CellHealth | None]], unit: str) -> str:
    """One small multiple of the float scales' range: a bar per layer (expert) from log10 of its least to its
    greatest finite scale, on one log axis for all."""
    ranged = [(label, c) for label, c in cells if c is not None and c.scale_min is not None and c.scale_max is not None]
    logs = [math.log10(v) for _, c in ranged for v in (c.scale_min, c.scale_max) if v is not None and v > 0]
    lo, hi = (min(logs), max(logs)) if logs else (0.0, 1.0)
    span = (hi - lo) or 1.0
    low = median([c.scale_min for _, c in ranged if c.scale_min is not None]) if ranged else 0.0
    high = median([c.scale_max for _, c in ranged if c.scale_max is not None]) if ranged else 0.0
    w = max(2.0, min(8.0, 480 / max(len(cells), 1)))
    base = 60
    ticks = tuple(dict.fromkeys(axis_ticks(lo, hi))) if logs else ()  # one label where both ends read alike
    axis = CHAR_W * max(map(len, ticks), default=0) + 8  # the axis labels right of the bars, below the title
    out = [svg_open(max(w * len(cells) + 10 + axis, CHAR_W * len(title) + 6), 84, title), text(2, 10, title, "lab")]
    for k, (label, c) in enumerate(cells):
        if c is None or c.scale_min is None or c.scale_max is None:
            continue
        y0 = 44 * (math.log10(c.scale_min) - lo) / span if c.scale_min > 0 else 0.0
        y1 = 44 * (math.log10(c.scale_max) - lo) / span if c.scale_max > 0 else 0.0
        cls = "e" if c.scale_min <= 0 else "w" if _off(c.scale_min, low) or _off(c.scale_max, high) else "ok"
        out.append(rect(5 + k * w, base - y1, max(w - 0.5, 1), max(y1 - y0, 1.0), cls,
                        f"{unit} {label}: scales {c.scale_min:.4g} to {c.scale_max:.4g}"))
    if cells:
        out.append(text(5, base + 12, cells[0][0], "lab"))
        out.append(text(5 + len(cells) * w, base + 12, cells[-1][0], "lab", "end"))
        for tick, y in zip(ticks, (base - 44 + 8, base) if len(ticks) == 2 else (base,)):
            out.append(text(w * len(cells) + 10, y, tick, "lab"))
    out.append("</svg>")
    return "".join(out)


def figures_charts(layers: tuple[CellHealth, ...], experts: tuple[CellHealth, ...], grid: Grid | None) -> list[str]:
    """The saturation share and the scales' range per layer and per expert."""
    by_layer = {c.row: c for c in layers}
    rows = [r.key for r in grid.rows] if grid is not None else sorted(
        (k for k in by_layer if k.isascii() and k.isdigit()), key=int)
    per_layer = [(k, by_layer.get(k)) for k in rows]
    by_expert = {c.expert: c for c in experts}
    n = max((c.strip for c in grid.columns), default=0) if grid is not None else max(by_expert, default=-1) + 1
    per_expert = [(str(i), by_expert.get(i)) for i in range(n)] if by_expert else []
    charts = []
    if any(c is not None and c.fp8_values for _, c in per_layer):
        charts.append("<figure>" + share_svg("±448 share per layer", per_layer, "layer")
                      + (share_svg("±448 share per expert", per_expert, "expert") if per_expert else "")
                      + '<figcaption class="mut">FP8 values at ±448 of those read</figcaption></figure>')
    if any(c is not None and c.scale_min is not None for _, c in per_layer):
        charts.append("<figure>" + range_svg("scale range per layer", per_layer, "layer")
                      + (range_svg("scale range per expert", per_expert, "expert") if per_expert else "")
                      + '<figcaption class="mut">least to greatest finite scale, log axis</figcaption></figure>')
    return charts


def health_section(findings: tuple[Finding, ...], grid: Grid | None, layout: ExpectedLayout | None,
                   layer_health: tuple[CellHealth, ...] = (), expert_health: tuple[CellHealth, ...] = (),
                   scanned: int | None = None) -> str:
    """Per health code: the values (blocks) flagged, summed per layer and per expert index; then the
    saturation share and the scales' range per layer and per expert. `scanned`: the tensors whose values were
    read; a "none found" says how many, and where none was read the section says nothing was scanned."""
    health = [f for f in findings if f.code in HEALTH_CODES]
    saturated = [f for f in findings if f.code == "FP8_SATURATED"]
    parts: list[str] = []
    if saturated:
        parts.append(f"<p>{esc(saturated[0].message)}</p>")
    figures = figures_charts(layer_health, expert_health, grid)
    absent = [f for f in findings if f.code == "DATA_NOT_PRESENT"]
    if absent:
        parts.append(f"<p>{plural(len(absent), 'file')} hold sparse holes (the data is not present): their tensors "
                     "there were not scanned.</p>")
    if not health and scanned == 0:
        parts.append("<p>No value was scanned: nothing can be said of the weights' health.</p>")
        return section("health", "Weight health", *parts)
    if not health:
        of = f" in the {plural(scanned, 'tensor')} scanned" if scanned is not None else ""
        parts.append(f"<p>No NaN codes, all-zero blocks, NaN/Inf values or non-positive scales found{of}.</p>")
        if figures:
            parts.append('<div class="multiples">' + "".join(figures) + "</div>")
        return section("health", "Weight health", *parts)
    where = locator(layout) if layout is not None else None
    layers = [r.key for r in grid.rows] if grid is not None else []
    experts = max((c.strip for c in grid.columns), default=0) if grid is not None else 0
    charts: list[str] = []
    for code in HEALTH_CODES:
        of_code = [f for f in health if f.code == code]
        if not of_code:
            continue
        named = [f for f in of_code if f.tensor]
        summed = [f for f in of_code if not f.tensor]  # "... and N more tensors (M in all)"
        total = _count(summed[0]) if summed else len(named)
        by_layer: dict[str, int] = {}
        by_expert: dict[int, int] = {}
        for f in named:
            assert f.tensor is not None
            row, column, index = where.cell(f.tensor) if where is not None else ("", "", -1)
            by_layer[row] = by_layer.get(row, 0) + _count(f)
            if index >= 0 and column:
                by_expert[index] = by_expert.get(index, 0) + _count(f)
        unit = "blocks" if code == "BLOCK_ALL_ZERO" else "values"
        per_layer = multiples_svg(f"{code} per layer ({unit})", [(k, by_layer.get(k, 0)) for k in layers], "layer")
        charts.append(f"<figure>{per_layer}"
                      + (multiples_svg(f"{code} per expert ({unit})", [(str(i), by_expert.get(i, 0))
                                                                        for i in range(experts)], "expert")
                         if experts and by_expert else "")
                      + f'<figcaption class="mut">{plural(len(named), "tensor")} drawn'
                      + (f" of {total:,} with {esc(code)}" if total > len(named) else "") + "</figcaption></figure>")
    parts.append('<div class="multiples">' + "".join(charts + figures) + "</div>")
    return section("health", "Weight health", *parts)
