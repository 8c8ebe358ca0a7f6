"""The machine-readable audit report. Field names are stable (schema kimi-audit/audit/1)."""

from __future__ import annotations

import json
from typing import Any

from kimi_audit import __version__
from kimi_audit.checks.audit import AuditReport
from kimi_audit.findings import Severity

SCHEMA = "kimi-audit/audit/1"


def report_dict(report: AuditReport, fail_on: Severity = Severity.ERROR) -> dict[str, Any]:
    s = report.stats
    qa = report.q_a_layernorm
    return {
        "schema": SCHEMA,
        "tool": {"name": "kimi-audit", "version": __version__},
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
                {"class": r.kind, "dtype": r.dtype, "tensors": r.tensors, "elements": r.elements, "bytes": r.bytes}
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
            for sh in report.shards
        ],
        "findings": [f.to_json() for f in report.findings],
        "result": {"errors": report.errors, "warnings": report.warnings, "fail_on": fail_on.value,
                   "exit_code": report.exit_code(fail_on)},
    }


def render_json(report: AuditReport, fail_on: Severity = Severity.ERROR) -> str:
    return json.dumps(report_dict(report, fail_on), indent=2, ensure_ascii=False) + "\n"
