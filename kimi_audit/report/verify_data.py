"""`verify`'s report as plain data (the `--json` output, schema kimi-audit/verify/1): every file with its
sha256 and status, the findings, the totals.

`weight_health` holds, per layer and per routed-expert index (summed over the layers), the FP8 values read,
those at ±448 and the least and greatest finite float scale: a few hundred entries for a full-scale checkpoint
(61 layers, 384 experts), never one per tensor.

Findings are listed as `audit --json` lists them (grouped, at most 10 a group and 500 in all unless
`--all-findings`), after the header audit's own.
"""

from __future__ import annotations

from typing import Any

from kimi_audit.constants import VERSION
from kimi_audit.findings import Severity
from kimi_audit.report.grouping import group_findings
from kimi_audit.report.json_report import MAX_GROUPS, clip_value, listing
from kimi_audit.verify.read import CellHealth
from kimi_audit.verify.result import VerifyReport

SCHEMA = "kimi-audit/verify/1"


def _health(c: CellHealth) -> dict[str, Any]:
    return {"fp8_values": c.fp8_values, "saturated": c.saturated, "scale_min": c.scale_min, "scale_max": c.scale_max}


def verify_dict(report: VerifyReport, all_findings: bool = False) -> dict[str, Any]:
    groups = group_findings(report.findings)
    listed = listing(report.findings, groups, all_findings)
    rate = report.bytes_read / report.seconds if report.seconds > 0 else None
    return {
        "schema": SCHEMA,
        "tool": {"name": "kimi-audit", "version": VERSION},
        "source": report.source,
        "revision": report.revision,
        "references": list(report.references),
        "files": [
            {"name": f.name, "size": f.size, "sha256": f.sha256, "expected": f.expected,
             "reference": f.reference, "status": f.status, "unlisted": f.unlisted,
             "bytes_read": f.bytes_read, "seconds": round(f.seconds, 3)}
            for f in report.files
        ],
        "findings": listed,
        "finding_groups": [
            {"code": g.code, "severity": g.severity, "pattern": clip_value(g.pattern), "count": g.count,
             "covers": sum(f.covers for f in g.members)}
            for g in (groups if all_findings else groups[:MAX_GROUPS])
        ],
        "totals": {"files": len(report.files), "bytes": report.bytes_total, "bytes_read": report.bytes_read,
                   "tensors_scanned": report.tensors_scanned, "seconds": round(report.seconds, 3),
                   "bytes_per_second": round(rate) if rate is not None else None, "workers": report.workers},
        "weight_health": {"layers": [{"layer": c.row, **_health(c)} for c in report.layers],
                          "experts": [{"expert": c.expert, **_health(c)} for c in report.experts]},
        "manifest_written": report.manifest_written,
        "result": {"errors": report.count(Severity.ERROR), "warnings": report.count(Severity.WARNING),
                   "infos": report.count(Severity.INFO), "exit_code": report.exit_code, "verdict": report.verdict,
                   "headline": report.headline, "findings_listed": len(listed), "findings": len(report.findings)},
    }
