"""Release gates for `audit`: expected parameter count and expected revision, as findings.

PARAMS_GATE (error): the parameter count (FP8 scales and stored buffers excluded) differs from --expect-params.
REVISION_GATE (error): the resolved commit (a local git clone: the commit its HEAD names) does not start with
--expect-revision, or the source has no revision (a local directory that is no git clone cannot say which commit it
holds).
"""

from __future__ import annotations

import dataclasses
import re

from kimi_audit.checks.audit import AuditReport
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, error

SHA_RE = re.compile(r"^[0-9a-fA-F]{7,40}$")


def parse_count(text: str) -> int:
    """'1026408232448', '1,026,408,232,448' or '1_026_408_232_448'."""
    cleaned = text.strip().replace(",", "").replace("_", "")
    if not (cleaned.isascii() and cleaned.isdigit()):
        raise KimiAuditError(f"--expect-params must be a whole number of parameters, got {text!r}")
    return int(cleaned)


def check_sha(text: str) -> str:
    if not SHA_RE.match(text.strip()):
        raise KimiAuditError(f"--expect-revision must be a commit hash (7-40 hex digits), got {text!r}")
    return text.strip().lower()


def params_gate(report: AuditReport, expected: int) -> list[Finding]:
    got = report.stats.parameters
    if got == expected:
        return []
    return [error("PARAMS_GATE", f"{got:,} parameters (scales and buffers excluded), expected {expected:,} "
                  f"({got - expected:+,})", expected=expected, actual=got)]


def revision_gate(report: AuditReport, expected: str, head: str | None = None) -> list[Finding]:
    """The resolved commit (a Hub repo, an HF cache snapshot) must start with `expected`; a local directory
    that has none is held to `head`, the commit its git clone's HEAD names (sources.git), when it is one."""
    got, where = report.revision, ""
    if got is None and head is not None:
        got, where = head, f" (the HEAD of the git clone {report.source})"
    if got is None:
        return [error("REVISION_GATE", f"{report.source} has no revision to check against {expected} "
                      "(a local directory that is no git clone does not record its commit)",
                      expected=expected, actual=None)]
    if got.lower().startswith(expected):
        return []
    return [error("REVISION_GATE", f"revision {got}{where} is not {expected}", expected=expected, actual=got)]


def apply_gates(report: AuditReport, expect_params: str | None, expect_revision: str | None,
                head: str | None = None) -> AuditReport:
    """The gates asked for, as findings; `head`: a local git clone's HEAD commit (sources.git.git_head)."""
    if expect_params is None and expect_revision is None:
        return report
    extra: list[Finding] = []
    if expect_params is not None:
        extra += params_gate(report, parse_count(expect_params))
    if expect_revision is not None:
        extra += revision_gate(report, check_sha(expect_revision), head)
    return dataclasses.replace(report, findings=report.findings + tuple(extra), gates_checked=True)
