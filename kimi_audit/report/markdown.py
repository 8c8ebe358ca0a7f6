"""The audit as GitHub-flavoured markdown: for `--format markdown` and `$GITHUB_STEP_SUMMARY`."""

from __future__ import annotations

import re

from kimi_audit.checks.audit import AuditReport
from kimi_audit.findings import Severity
from kimi_audit.report.grouping import first_groups, group_findings, ignored_counts
from kimi_audit.text import printable

MAX_GROUPS = 50
_MARKUP = re.compile(r"[|\[\]`*_~<>&]")
_ENTITY = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9]):(?=//)|(?<=www)(?<![a-z0-9]www)\.|@")
"""What GitHub's autolink extension turns into a link in plain text (`https://x`, `www.x`, `a@b.c`): its
punctuation is escaped, which renders as itself but is no longer a URL, domain or address."""


def cell(text: object) -> str:
    """Untrusted text (names, messages) as a table cell that renders as the text itself: backslashes and
    markdown punctuation (pipes, link brackets, emphasis, backticks) escaped, HTML as entities, control and
    bidi characters (U+202E) as their escapes, bare URLs, `www.` domains and e-mail addresses unlinked, one line."""
    s = printable(str(text).replace("\\", "\\\\"))
    s = _MARKUP.sub(lambda m: _ENTITY.get(m.group(), "\\" + m.group()), s)
    return _AUTOLINK.sub(lambda m: "\\" + m.group(), s)


def code(text: object) -> str:
    """Untrusted text as a code span (where neither HTML nor links are read): control and bidi characters
    escaped, pipes escaped for the table; as a plain cell if it holds a backtick."""
    s = str(text)
    if not s or "`" in s:
        return cell(s)
    return f"`{printable(s).replace('|', chr(92) + '|')}`"


def counted(report: AuditReport) -> str:
    """"1 error, 2 warnings": each noun as its count reads."""
    return ", ".join(f"{n:,} {word}{'' if n == 1 else 's'}"
                     for n, word in ((report.errors, "error"), (report.warnings, "warning")))


def render_markdown(report: AuditReport, fail_on: Severity = Severity.ERROR) -> str:
    m, s, qa = report.model, report.stats, report.q_a_layernorm
    headline = report.headline(fail_on)
    verdict = f"✅ {headline}" if headline == "PASS" else f"❌ {headline}"
    out = [f"## kimi-audit: {verdict} — {code(report.source)}", ""]
    blocks = f"{m['layers']} blocks: {m['dense_layers']} dense + {m['moe_layers']} MoE"
    if m.get("mtp_layers"):
        blocks += f" + {m['mtp_layers']} MTP"
    out += ["| | |", "|---|---|",
            f"| revision | {code(report.revision) if report.revision else '(local files)'} |",
            f"| model | {cell(m['model_type'])} · {blocks} · {m['routed_experts'] or 0} routed experts |",
            f"| shards | {s.shards:,} ({s.file_bytes:,} bytes; headers {s.header_bytes:,} bytes) |",
            f"| tensors | {s.tensors:,} |",
            f"| parameters | **{s.parameters:,}** (logical; quantization metadata and stored buffers excluded) |",
            f"| findings | {counted(report)} (fail on {fail_on.value}) |",
            f"| checked | {cell(report.coverage())} |", ""]
    out += ["### Tensors by class and dtype", "",
            "| class | dtype | tensors | stored elements | bytes | parameters |", "|---|---|---:|---:|---:|---:|"]
    out += [f"| {cell(r.kind)} | {cell(r.dtype)} | {r.tensors:,} | {r.elements:,} | {r.bytes:,} | {r.parameters:,} |"
            for r in s.rows]
    out += [f"| **all** | | **{s.tensors:,}** | **{s.elements:,}** | **{s.payload_bytes:,}** | **{s.parameters:,}** |",
            ""]
    if qa.width is not None:
        out += [f"### q_a_layernorm (query latent RMSNorm, [{qa.width:,}] each): {qa.total_params:,}", ""]
        out += [f"- {'✅' if qa.ok else '❌'} {cell(t.line(qa.width))}" for t in qa.totals]
        out += [f"- ❌ layer {r.layer} ({r.block}): "
                + ("missing" if r.shape is None else cell(f"{r.dtype} {list(r.shape)}")) for r in qa.rows if not r.ok]
        out += [""]
    groups = group_findings(report.findings)
    if groups:
        out += [f"### Findings ({counted(report)})", "",
                "| severity | code | count | tensor / shard | detail (first) |", "|---|---|---:|---|---|"]
        for g in first_groups(groups, MAX_GROUPS):
            out.append(f"| {g.severity} | {code(g.code)} | {g.count:,} | {code(g.pattern)} "
                       f"| {cell(g.example.message)} |")
        if len(groups) > MAX_GROUPS:
            out += ["", f"… and {len(groups) - MAX_GROUPS} more groups (use `--format json` for every finding)"]
        out += [""]
    else:
        out += ["No findings.", ""]
    if report.ignored:
        n = len(report.ignored)
        rules = ", ".join(f"{code(spec)} ×{k:,}" for spec, k in ignored_counts(report).items())
        out += [f"ignored: {n:,} finding{'' if n == 1 else 's'} ({rules}) — accepted with `--ignore`, "
                "not counted in the verdict", ""]
    return "\n".join(out) + "\n"
