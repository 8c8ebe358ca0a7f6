"""`verify`'s report: every file with its sha256 and status, the findings, the totals (schema kimi-audit/verify/1).

Findings are listed as `audit --json` lists them (grouped, at most 10 a group and 500 in all unless
`--all-findings`), after the header audit's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimi_audit import __version__
from kimi_audit.checks.grouping import group_findings
from kimi_audit.checks.report_dict import MAX_GROUPS, _clip, _listing
from kimi_audit.findings import Finding, Severity

SCHEMA = "kimi-audit/verify/1"

OK = "ok"
MISMATCH = "mismatch"
UNREFERENCED = "unreferenced"
"""Hashed; no reference digest to compare with."""
ABSENT = "absent"
"""Listed by the reference, not in the checkpoint."""
NOT_PRESENT = "data-not-present"
"""Sparse holes: not read whole, no sha256."""
UNREADABLE = "unreadable"
NOT_CHECKED = "not-checked"
"""Interrupted before it was read."""


@dataclass(frozen=True)
class FileRow:
    name: str
    size: int | None
    sha256: str | None
    expected: str | None
    reference: str | None
    """Where `expected` came from (Reference.kind)."""
    status: str
    unlisted: bool = False
    """Present, but the reference's listing does not name it."""
    bytes_read: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class VerifyReport:
    source: str
    revision: str | None
    references: tuple[str, ...]
    """Where each reference came from (Reference.where)."""
    files: tuple[FileRow, ...]
    findings: tuple[Finding, ...]
    seconds: float
    workers: str
    """`4 processes` or `Ray at ADDRESS`."""
    tensors_scanned: int = 0
    interrupted: bool = False
    manifest_written: str | None = None

    @property
    def bytes_total(self) -> int:
        return sum(f.size or 0 for f in self.files if f.status != ABSENT)

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.count(Severity.ERROR) else 0

    @property
    def verdict(self) -> str:
        if self.interrupted:
            done = sum(1 for f in self.files if f.status not in (NOT_CHECKED, ABSENT))
            return f"INTERRUPTED: {done:,} of {len(self.files):,} files checked"
        return "FAIL" if self.exit_code else "PASS"

    def to_dict(self, all_findings: bool = False) -> dict[str, Any]:
        groups = group_findings(self.findings)
        listed = _listing(self.findings, groups, all_findings)
        rate = self.bytes_read / self.seconds if self.seconds > 0 else None
        return {
            "schema": SCHEMA,
            "tool": {"name": "kimi-audit", "version": __version__},
            "source": self.source,
            "revision": self.revision,
            "references": list(self.references),
            "files": [
                {"name": f.name, "size": f.size, "sha256": f.sha256, "expected": f.expected,
                 "reference": f.reference, "status": f.status, "unlisted": f.unlisted,
                 "bytes_read": f.bytes_read, "seconds": round(f.seconds, 3)}
                for f in self.files
            ],
            "findings": listed,
            "finding_groups": [
                {"code": g.code, "severity": g.severity, "pattern": _clip(g.pattern), "count": g.count,
                 "covers": sum(f.covers for f in g.members)}
                for g in (groups if all_findings else groups[:MAX_GROUPS])
            ],
            "totals": {"files": len(self.files), "bytes": self.bytes_total, "bytes_read": self.bytes_read,
                       "tensors_scanned": self.tensors_scanned, "seconds": round(self.seconds, 3),
                       "bytes_per_second": round(rate) if rate is not None else None, "workers": self.workers},
            "manifest_written": self.manifest_written,
            "result": {"errors": self.count(Severity.ERROR), "warnings": self.count(Severity.WARNING),
                       "infos": self.count(Severity.INFO), "exit_code": self.exit_code, "verdict": self.verdict,
                       "findings_listed": len(listed), "findings": len(self.findings)},
        }
