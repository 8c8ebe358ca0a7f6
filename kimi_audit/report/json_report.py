"""The audit report as plain data and as JSON text: the `--json` output and what the API's
`AuditReport.to_dict` returns. Field names are stable (schema kimi-audit/audit/1).

The report stays small whatever the input: findings are listed one by one up to MAX_PER_GROUP per group
of like findings (the table's grouping: same code, names alike but for their indices) and MAX_FINDINGS in
all, every group is summed up in `finding_groups`, and long strings are cut. `all_findings=True`
(`audit --all-findings`) lists every finding, whole. Findings accepted with `--ignore` are listed the same
way in `ignored`, and counted per rule in `ignore_rules`.
"""

from __future__ import annotations

import json
from typing import Any

from kimi_audit.checks.audit import AuditReport
from kimi_audit.constants import VERSION
from kimi_audit.findings import Finding, Severity
from kimi_audit.report.grouping import FindingGroup, first_groups, group_findings, ignored_counts
from kimi_audit.text import json_dumps

SCHEMA = "kimi-audit/audit/1"
MAX_FINDINGS = 500
MAX_PER_GROUP = 10
MAX_GROUPS = 200
MAX_SHARDS = 1_000
MAX_TEXT = 400
"""Characters kept of a message, name or value in a capped report."""


def report_dict(report: AuditReport, fail_on: Severity = Severity.ERROR, all_findings: bool = False) -> dict[str, Any]:
    s = report.stats
    qa = report.q_a_layernorm
    groups = group_findings(report.findings)
    listed = listing(report.findings, groups, all_findings)
    ignored_groups = group_findings(report.ignored)
    ignored = listing(report.ignored, ignored_groups, all_findings)
    shards = report.shards if all_findings else report.shards[:MAX_SHARDS]
    return {
        "schema": SCHEMA,
        "tool": {"name": "kimi-audit", "version": VERSION},
        "source": report.source,
        "revision": report.revision,
        "model": report.model,
        "summary": {
            "shards": s.shards,
            "tensors": s.tensors,
            "elements": s.elements,
            "parameters": s.parameters,
            "scale_elements": s.elements_of("scale"),
            "buffer_elements": s.elements_of("buffer"),
            "payload_bytes": s.payload_bytes,
            "header_bytes": s.header_bytes,
            "file_bytes": s.file_bytes,
            "by_class": [
                {"class": r.kind, "dtype": r.dtype, "tensors": r.tensors, "elements": r.elements, "bytes": r.bytes,
                 "parameters": r.parameters}
                for r in s.rows
            ],
        },
        "q_a_layernorm": {
            "width": qa.width,
            "total_parameters": qa.total_params,
            "totals": [
                {"block": t.block, "blocks": t.blocks, "defined": t.of, "parameters": t.params,
                 "line": t.line(qa.width or 0)}
                for t in qa.totals
            ],
            "gains": [
                {"layer": r.layer, "block": r.block, "tensor": r.tensor, "shard": r.shard, "dtype": r.dtype,
                 "shape": list(r.shape) if r.shape is not None else None, "parameters": r.params if r.shape else 0,
                 "ok": r.ok}
                for r in qa.rows
            ],
        },
        "shards": [
            {"name": sh.name, "file_size": sh.file_size, "header_bytes": sh.header_bytes, "tensors": sh.tensors,
             "errors": sh.errors}
            for sh in shards
        ],
        "findings": listed,
        "finding_groups": [
            {"code": g.code, "severity": g.severity, "pattern": clip_value(g.pattern), "count": g.count,
             "covers": sum(f.covers for f in g.members)}
            for g in (groups if all_findings else first_groups(groups, MAX_GROUPS))
        ],
        "ignored": ignored,
        "ignore_rules": [{"rule": rule, "ignored": n} for rule, n in ignored_counts(report).items()],
        "listing": {"findings": len(report.findings), "findings_listed": len(listed), "groups": len(groups),
                    "ignored": len(report.ignored), "ignored_listed": len(ignored),
                    "shards_listed": len(shards), "complete": len(listed) == len(report.findings)
                    and len(ignored) == len(report.ignored)
                    and len(shards) == len(report.shards) and (all_findings or len(groups) <= MAX_GROUPS)},
        "result": {"errors": report.errors, "warnings": report.warnings, "infos": report.count(Severity.INFO),
                   "fail_on": fail_on.value,
                   "exit_code": report.exit_code(fail_on), "verdict": report.verdict(fail_on),
                   "headline": report.headline(fail_on), "absent_shards": report.absent_shards,
                   "values_checked": report.values_checked},
    }


def listing(findings: tuple[Finding, ...], groups: list[FindingGroup], all_findings: bool) -> list[dict[str, Any]]:
    """Every finding whole, or at most MAX_PER_GROUP a group and MAX_FINDINGS in all, clipped."""
    if all_findings:
        return [f.to_json() for f in findings]
    shown = first_groups(groups, min(MAX_GROUPS, MAX_FINDINGS))
    firsts = [g.members[0] for g in shown]  # one of each group shown before a second of any
    picked = (firsts + [f for g in shown for f in g.members[1:MAX_PER_GROUP]])[:MAX_FINDINGS]
    order = {id(f): i for i, f in enumerate(f for g in shown for f in g.members[:MAX_PER_GROUP])}
    picked.sort(key=lambda f: order[id(f)])
    return [clipped(f) for f in picked]


def clip_value(v: Any) -> Any:
    """A value of the JSON report cut to MAX_TEXT characters (a string, or the JSON text of a structure);
    numbers, booleans and null as they are. (Prose for a terminal is cut by kimi_audit.text.clip.)"""
    if isinstance(v, str):
        return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "…"
    if v is None or isinstance(v, bool | int | float):
        return v
    text = json.dumps(v, ensure_ascii=False, default=str)
    return v if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def clipped(f: Finding) -> dict[str, Any]:
    return {k: clip_value(v) for k, v in f.to_json().items()}


def render_json(report: AuditReport, fail_on: Severity = Severity.ERROR, all_findings: bool = False) -> str:
    return json_dumps(report_dict(report, fail_on, all_findings), indent=2) + "\n"
