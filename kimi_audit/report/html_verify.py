"""The parts of the HTML report only `verify` has: every file's hash status, and the weight-health findings
(NaN codes, all-zero blocks, NaN/Inf, scales <= 0) drawn as small multiples per layer and per expert, with
the FP8 saturation count. Read from verify's plain data and findings: nothing is computed here but sums of
the counts the findings carry."""

from __future__ import annotations

from typing import Any

from kimi_audit.findings import Finding
from kimi_audit.model.layout import ExpectedLayout
from kimi_audit.report.grid import Grid, locator
from kimi_audit.report.svg import CW, RH, esc, multiples_svg, rect, section, svg_open
from kimi_audit.report.table import plural
from kimi_audit.verify.result import ABSENT, MISMATCH, NOT_CHECKED, NOT_PRESENT, OK, UNREADABLE, UNREFERENCED

HEALTH_CODES = ("FP8_NAN", "BLOCK_ALL_ZERO", "VALUE_NAN", "VALUE_INF", "SCALE_NOT_POSITIVE")
STATUS_CLASS = {OK: "ok", UNREFERENCED: "i", NOT_CHECKED: "w", MISMATCH: "e", ABSENT: "e", NOT_PRESENT: "e",
                UNREADABLE: "e"}
MAX_FILE_ROWS = 40


def files_section(files: list[dict[str, Any]]) -> str:
    """One cell per file, coloured by its hash status, and the files that are not ok listed."""
    per_row = 64
    rows = (len(files) + per_row - 1) // per_row
    cells = [rect(4 + (k % per_row) * (CW + 2), 4 + (k // per_row) * (RH + 4), CW, RH + 2,
                  STATUS_CLASS.get(f["status"], "e"),
                  f"{f['name']}: {f['status']}" + (", unlisted" if f["unlisted"] else "")
                  + f"\nsha256 {f['sha256'] or '(not computed)'}"
                  + (f"\nexpected {f['expected']} ({f['reference']})" if f["expected"] else ""))
             for k, f in enumerate(files)]
    strip = svg_open(8 + min(len(files), per_row) * (CW + 2), 8 + rows * (RH + 4), "files by hash status")
    bad = [f for f in files if f["status"] not in (OK, UNREFERENCED) or f["unlisted"]]
    counts: dict[str, int] = {}
    for f in files:
        counts[f["status"]] = counts.get(f["status"], 0) + 1
    table = ""
    if bad:
        table = ("<table><thead><tr><th>file</th><th>status</th><th>sha256</th><th>expected</th></tr></thead><tbody>"
                 + "".join(f"<tr><td><code>{esc(f['name'])}</code></td><td class=\"sev-error\">{esc(f['status'])}"
                           f"{', unlisted' if f['unlisted'] else ''}</td><td><code>{esc(f['sha256'] or '')}</code>"
                           f"</td><td><code>{esc(f['expected'] or '')}</code></td></tr>" for f in bad[:MAX_FILE_ROWS])
                 + "</tbody></table>")
        if len(bad) > MAX_FILE_ROWS:
            table += f'<p class="mut">… and {len(bad) - MAX_FILE_ROWS:,} more</p>'
    summary = ", ".join(f"{n:,} {s}" for s, n in sorted(counts.items()))
    return section("files", f"Files and hashes ({len(files):,}: {summary})", f'<div class="scroll">{strip}',
                   "".join(cells), "</svg></div>", table)


def _count(f: Finding) -> int:
    return f.actual if isinstance(f.actual, int) and not isinstance(f.actual, bool) else 1


def health_section(findings: tuple[Finding, ...], grid: Grid | None, layout: ExpectedLayout | None) -> str:
    """Per health code: the values (blocks) flagged, summed per layer and per expert index."""
    health = [f for f in findings if f.code in HEALTH_CODES]
    saturated = [f for f in findings if f.code == "FP8_SATURATED"]
    parts: list[str] = []
    if saturated:
        parts.append(f"<p>{esc(saturated[0].message)}</p>")
    if not health:
        parts.append("<p>No NaN codes, all-zero blocks, NaN/Inf values or non-positive scales found.</p>")
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
    parts.append('<div class="multiples">' + "".join(charts) + "</div>")
    return section("health", "Weight health", *parts)
