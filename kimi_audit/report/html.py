"""`--format html`: one self-contained page (no script, no network, light and dark, printable) with the model
drawn as inline SVG (report.svg): the verdict and summary, the model grid marked by the findings, the
parameter accounting as bars, the findings grouped by root cause; for `verify`, the weight-health figures as
small multiples per layer and per expert, and every file's hash status.

Every number comes from the report objects the other formats render: the audit's plain data (report_dict),
its findings and groups (report.grouping), the Accounting of `params`, verify's plain data (verify_dict).
"""

from __future__ import annotations

from typing import Any

from kimi_audit.checks.audit import AuditReport
from kimi_audit.checks.stats import Stats
from kimi_audit.constants import VERSION
from kimi_audit.findings import Finding, Severity
from kimi_audit.model.accounting.tree import Accounting
from kimi_audit.model.arch.spec import DENSE, MOE, MTP
from kimi_audit.model.kinds import module_name
from kimi_audit.report.grid import Grid, build_grid
from kimi_audit.report.grouping import first_groups, group_findings, ignored_line
from kimi_audit.report.html_verify import files_section, health_section
from kimi_audit.report.json_report import MAX_GROUPS, clip_value, report_dict
from kimi_audit.report.svg import bars_svg, esc, grid_svg, outside_svg, section, wrappable
from kimi_audit.report.table import plural
from kimi_audit.report.verify_data import verify_dict
from kimi_audit.verify.result import VerifyReport

STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1f2328;--mut:#59636e;--line:#d1d9e0;--ok:#cfe8d5;--e:#cf222e;
--w:#bf8700;--i:#0969da;--abs:#8250df;--der:#818b98;--fnd:#1a7f37;--card:#f6f8fa}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mut:#9198a1;--line:#3d444d;--ok:#1c3a27;
--e:#f85149;--w:#d29922;--i:#4493f8;--abs:#ab7df8;--der:#656c76;--fnd:#3fb950;--card:#151b23}}
@media print{:root{--bg:#fff;--fg:#000;--mut:#444;--line:#999;--ok:#d8eedd;--card:#fff}
.scroll{overflow:visible!important}svg{max-width:100%;height:auto}section{break-inside:avoid-page}}
body{background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
margin:0 auto;padding:16px 24px;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid var(--line)}
.verdict{display:inline-block;font-weight:700;padding:2px 10px;border-radius:6px;color:#fff;background:var(--e)}
.verdict.pass{background:var(--fnd)}.verdict.partial{background:var(--w)}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0}dt{color:var(--mut)}dd{margin:0}
.scroll{overflow-x:auto;background:var(--card);border:1px solid var(--line);border-radius:6px;padding:6px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:3px 8px;
border-bottom:1px solid var(--line);vertical-align:top;overflow-wrap:break-word}
td.n,th.n{text-align:right;white-space:nowrap}
td.c code{word-break:normal;white-space:nowrap}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:break-word}.mut{color:var(--mut)}
code.hash{word-break:break-all}.scroll svg{max-width:100%;height:auto}
.sev-error{color:var(--e);font-weight:600}.sev-warning{color:var(--w);font-weight:600}.sev-info{color:var(--i)}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:10px;height:10px;
margin-right:4px;vertical-align:-1px;border-radius:2px}
svg text{fill:var(--fg);font:9px system-ui,sans-serif}svg text.num{font-size:10px}svg .bad{fill:var(--e)}
svg .ok,.sw.ok{fill:var(--ok);background:var(--ok)}svg .e,.sw.e{fill:var(--e);background:var(--e)}
svg .w,.sw.w{fill:var(--w);background:var(--w)}svg .i,.sw.i{fill:var(--i);background:var(--i)}
svg .abs,.sw.abs{fill:var(--abs);background:var(--abs)}svg .der{fill:var(--der)}svg .fnd{fill:var(--fnd)}
.multiples{display:flex;flex-wrap:wrap;gap:10px}
"""
LEGEND = ('<p class="legend"><span><i class="sw ok"></i>no finding (info findings are listed, not drawn)</span>'
          '<span><i class="sw e"></i>error</span><span><i class="sw w"></i>warning</span>'
          '<span><i class="sw abs"></i>in a shard that is absent or unreadable</span></p>')


def page(kind: str, source: str, verdict: str, sections: list[str]) -> str:
    source = clip_value(source)
    cls = "pass" if verdict == "PASS" else "partial" if verdict.startswith(("PARTIAL", "INTERRUPTED", "PASS (")) \
        else "fail"
    return "".join([
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="color-scheme" content="light dark">',
        f"<title>kimi-audit {kind}: {esc(verdict)} · {esc(source)}</title><style>{STYLE}</style></head><body>",
        f'<header><h1>kimi-audit {kind}</h1><p><span class="verdict {cls}">{esc(verdict)}</span> ',
        f"<code>{esc(source)}</code></p></header>", *sections,
        f'<footer class="mut"><p>kimi-audit {esc(VERSION)} · one self-contained page, no script</p></footer>',
        "</body></html>\n"])


def definitions(rows: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(clip_value(v))}</dd>" for k, v in rows) + "</dl>"


def _scheme(q: Any) -> str:
    if not q:
        return "unquantized"
    if isinstance(q, dict):
        return ", ".join(f"{k} {v}" for k, v in q.items() if v is not None)
    return str(q)


def summary_rows(d: dict[str, Any], report: AuditReport) -> list[tuple[str, str]]:
    m, s, r = d["model"], d["summary"], d["result"]
    archs = m.get("architectures")
    shards = f"{s['shards']:,}" + (f" of {report.listed_shards:,} listed" if report.listed_shards else "")
    return [
        ("source", d["source"]), ("revision", d["revision"] or "(local files)"),
        ("architecture", f"{m.get('model_type')} ({', '.join(map(str, archs)) if isinstance(archs, list) else archs})"),
        ("layers", f"{m.get('layers')} ({m.get('dense_layers')} dense, {m.get('moe_layers')} MoE, "
                   f"{m.get('mtp_layers')} MTP); {m.get('routed_experts')} routed experts"),
        ("scheme", _scheme(m.get("quantization"))),
        ("tensors", f"{s['tensors']:,}"), ("parameters", f"{s['parameters']:,}"), ("shards", shards),
        ("bytes", f"{s['file_bytes']:,} in files, {s['header_bytes']:,} of headers"),
        ("findings", f"{plural(r['errors'], 'error')}, {plural(r['warnings'], 'warning')} (fail on "
                     f"{r['fail_on']}; exit {r['exit_code']})"),
        ("checked", report.coverage()),
    ]


def model_section(grid: Grid | None) -> str:
    if grid is None:
        return section("model", "The model", '<p class="mut">No layout to draw: the config is outside the '
                       "architectures described (format checks only).</p>")
    marked = len(grid.marks)
    cells = f"{marked:,} cell{'' if marked == 1 else 's'} marked"
    note = (f"<p>{cells}" + (f"; {grid.unplaced:,} findings name tensors outside the layout "
            "(listed below)" if grid.unplaced else "") + ". Hover a cell for its tensors and findings.</p>")
    return section("model", "The model", note, LEGEND, f'<div class="scroll">{grid_svg(grid)}</div>',
                   f'<div class="scroll">{outside_svg(grid)}</div>' if grid.outside else "")


BLOCK_TITLES = {DENSE: ("dense layers", "dense_layers"), MOE: ("MoE layers", "moe_layers"),
                MTP: ("MTP layers", "mtp_layers")}


def accounting_rows(stats: Stats, model: dict[str, Any]) -> list[tuple[int, str, int, int, bool]]:
    """The model, each block kind, and each module in it: parameters derived and found (stats.components)."""
    groups: dict[str | None, dict[str, list[int]]] = {}
    for c in stats.components:
        module = module_name(c.component) or c.component or "(names the layout lacks)"
        row = groups.setdefault(c.block, {}).setdefault(module, [0, 0])
        row[0] += c.derived
        row[1] += c.found
    derived = sum(c.derived for c in stats.components)
    found = sum(c.found for c in stats.components)
    out = [(0, "model", derived, found, derived != found)]
    for block, modules in sorted(groups.items(), key=lambda kv: kv[0] is None):
        title, key = BLOCK_TITLES.get(block or "", ("outside the layers", ""))
        if key and isinstance(model.get(key), int):
            title += f" (×{model[key]:,})"
        d, f = sum(v[0] for v in modules.values()), sum(v[1] for v in modules.values())
        out.append((1, title, d, f, d != f))
        out += [(2, m, d, f, d != f) for m, (d, f) in modules.items()]
    return out


def accounting_section(stats: Stats, model: dict[str, Any]) -> str:
    rows = accounting_rows(stats, model)
    if len(rows) == 1:
        return ""
    _, _, derived, found, _ = rows[0]
    head = (f"<p>Parameters per module, derived from config.json (grey) and found in the tensors bearing its "
            f"names (green; red where they differ): {derived:,} derived, {found:,} found. Quantization metadata "
            "and buffers count for none; packed words for their module's weights.</p>")
    return section("parameters", "Parameter accounting", head,
                   f'<div class="scroll">{bars_svg(rows, max(derived, found))}</div>')


def dtypes_section(stats: Stats) -> str:
    """Tensors by class and dtype, as the terminal's table shows them (F8_E4M3, the GGUF types, ...)."""
    if not stats.rows:
        return ""
    rows = "".join(f"<tr><td>{esc(r.kind)}</td><td><code>{esc(r.dtype)}</code></td><td class=\"n\">{r.tensors:,}</td>"
                   f'<td class="n">{r.elements:,}</td><td class="n">{r.parameters:,}</td></tr>' for r in stats.rows)
    rows += (f'<tr><th>all</th><th></th><th class="n">{stats.tensors:,}</th><th class="n">{stats.elements:,}</th>'
             f'<th class="n">{stats.parameters:,}</th></tr>')
    return section("dtypes", "Tensors by class and dtype",
                   "<table><thead><tr><th>class</th><th>dtype</th><th>tensors</th><th>stored elements</th>"
                   f"<th>parameters</th></tr></thead><tbody>{rows}</tbody></table>")


def findings_section(findings: tuple[Finding, ...], extra: str = "") -> str:
    groups = group_findings(findings)
    if not groups:
        return section("findings", "Findings", "<p>No findings.</p>", extra)
    rows = []
    for g in first_groups(groups, MAX_GROUPS):
        covers = sum(f.covers for f in g.members)
        rows.append(f'<tr><td class="sev-{esc(g.severity)}">{esc(g.severity)}</td>'
                    f'<td class="c"><code>{esc(g.code)}</code></td><td class="n">{g.count:,}</td>'
                    f'<td class="n">{covers:,}</td><td><code>{wrappable(clip_value(g.pattern))}</code></td>'
                    f"<td>{wrappable(clip_value(g.example.message))}</td></tr>")
    more = (f'<p class="mut">… and {len(groups) - MAX_GROUPS:,} more groups (--json --all-findings lists every '
            "finding)</p>" if len(groups) > MAX_GROUPS else "")
    table = ("<table><thead><tr><th>severity</th><th>code</th><th>count</th><th>covers</th><th>tensor / shard</th>"
             "<th>first message</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    return section("findings", f"Findings ({len(findings):,}, {len(groups):,} groups, root causes first)",
                   '<p class="mut">Like findings grouped as in the JSON report; "covers" counts the findings a '
                   "root cause stands for.</p>", table, more, extra)


def audit_grid(report: AuditReport, findings: tuple[Finding, ...]) -> Grid | None:
    ckpt = report.checkpoint
    if ckpt is None or not len(ckpt.expected):
        return None
    return build_grid(ckpt.expected, findings, ckpt.index.weight_map if ckpt.index is not None else None)


def render_html(report: AuditReport, fail_on: Severity = Severity.ERROR) -> str:
    """The audit's page."""
    d = report_dict(report, fail_on)
    line = ignored_line(report)
    sections = [section("summary", "Summary", definitions(summary_rows(d, report))), dtypes_section(report.stats),
                model_section(audit_grid(report, report.findings)), accounting_section(report.stats, d["model"]),
                findings_section(report.findings, f'<p class="mut">{esc(line)}</p>' if line else "")]
    return page("audit", report.source, d["result"]["headline"], sections)


def render_params_html(acc: Accounting, depth: int | None = None) -> str:
    """`params`' page: the accounting tree as bars (down to `depth`, as `--depth`), derived against found."""
    rows = [(d, n.title + ("" if n.name in ("", n.title) or not n.is_leaf else f" ({n.name})"), n.derived,
             n.found, n.own_mismatch or n.mismatch) for d, n in acc.root.walk() if depth is None or d <= depth]
    summary = [("source", acc.source), ("revision", acc.revision or "(local files)"),
               ("derived", f"{acc.derived:,} parameters from config.json"),
               ("found", f"{acc.found:,} in the tensors")]
    bars = f'<div class="scroll">{bars_svg(rows, max(acc.derived, acc.found))}</div>'
    return page("params", acc.source, "MISMATCH" if acc.mismatch else "PASS",
                [section("summary", "Summary", definitions(summary)),
                 section("parameters", "Parameter accounting", "<p>Each node derived from config.json (grey) and "
                         "found in the checkpoint's tensors (green; red where they differ).</p>", bars)])


def render_verify_html(report: VerifyReport, audit: AuditReport | None = None) -> str:
    """verify's page; `audit` (the header audit verify ran first) draws the model grid and places the
    weight-health findings on layers and experts."""
    d = verify_dict(report)
    t, r = d["totals"], d["result"]
    rows = [("source", d["source"]), ("revision", d["revision"] or "(local files)"),
            *(("reference", ref) for ref in d["references"] or ["none: hashes computed, not compared"]),
            ("read", f"{t['bytes_read']:,} of {t['bytes']:,} bytes in {t['seconds']:,} s ({t['workers']}); "
                     f"{t['tensors_scanned']:,} tensors scanned"),
            ("findings", f"{plural(r['errors'], 'error')}, {plural(r['warnings'], 'warning')}, "
                         f"{plural(r['infos'], 'info')} (exit {r['exit_code']})")]
    grid = audit_grid(audit, report.findings) if audit is not None else None
    layout = audit.checkpoint.expected if audit is not None and audit.checkpoint is not None else None
    sections = [section("summary", "Summary", definitions(rows)),
                dtypes_section(audit.stats) if audit is not None else "", files_section(d["files"]),
                health_section(report.findings, grid, layout, report.layers, report.experts, report.tensors_scanned),
                model_section(grid),
                findings_section(report.findings)]
    return page("verify", report.source, r["headline"], sections)
