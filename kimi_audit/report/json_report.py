"""The machine-readable audit report: AuditReport.to_dict (checks.report_dict) as JSON text."""

from __future__ import annotations

import json

from kimi_audit.checks.audit import AuditReport
from kimi_audit.findings import Severity


def render_json(report: AuditReport, fail_on: Severity = Severity.ERROR, all_findings: bool = False) -> str:
    return json.dumps(report.to_dict(fail_on, all_findings), indent=2, ensure_ascii=False) + "\n"
