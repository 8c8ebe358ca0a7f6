"""`audit --ignore CODE` / `--ignore CODE:GLOB`: accept a known deviation.

A finding matches a rule when its code is the rule's and, for `CODE:GLOB`, when GLOB (fnmatch, case
sensitive) matches its tensor name, or its shard when it names no tensor. Matched findings leave the
report's findings (so the verdict and the exit code) and are kept in `AuditReport.ignored`, with the rule
that matched each, for every renderer to list (report.grouping counts them per rule). A rule that matched
nothing is an IGNORE_UNUSED info finding, so that a stale ignore stays visible.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Collection, Iterable
from fnmatch import fnmatchcase

from kimi_audit.checks.audit import AuditReport
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding, info


@dataclasses.dataclass(frozen=True)
class IgnoreRule:
    code: str
    glob: str | None = None

    @property
    def spec(self) -> str:
        return self.code if self.glob is None else f"{self.code}:{self.glob}"

    def matches(self, f: Finding) -> bool:
        if f.code != self.code:
            return False
        return self.glob is None or fnmatchcase(f.tensor or f.shard or "", self.glob)


def parse_ignore(spec: str, known: Collection[str]) -> IgnoreRule:
    """`CODE` or `CODE:GLOB`; `known` is every finding code (report.rules.RULES). Raises KimiAuditError."""
    code, sep, glob = spec.strip().partition(":")
    code = code.strip().upper()
    if code not in known:
        close = difflib.get_close_matches(code, list(known), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise KimiAuditError(f"--ignore {spec!r}: unknown finding code {code!r}{hint}")
    if sep and not glob:
        raise KimiAuditError(f"--ignore {spec!r}: empty glob after ':' (use CODE alone to ignore every {code})")
    return IgnoreRule(code, glob if sep else None)


def apply_ignores(report: AuditReport, rules: Iterable[IgnoreRule]) -> AuditReport:
    """The report with each finding that a rule matches moved to `ignored` (first matching rule wins)."""
    rules = list(dict.fromkeys(rules))
    if not rules:
        return report
    kept: list[Finding] = []
    ignored: list[Finding] = []
    by: list[str] = []
    used: set[IgnoreRule] = set()
    for f in report.findings:
        rule = next((r for r in rules if r.matches(f)), None)
        if rule is None:
            kept.append(f)
        else:
            ignored.append(f)
            by.append(rule.spec)
            used.add(rule)
    kept += [info("IGNORE_UNUSED", f"--ignore {r.spec} matched no finding", expected=r.spec, actual=0)
             for r in rules if r not in used]
    return dataclasses.replace(report, findings=tuple(kept), ignored=report.ignored + tuple(ignored),
                               ignored_by=report.ignored_by + tuple(by))
