"""Findings summed up for a reader, as every renderer shows them.

Like findings grouped: layer and expert indices collapsed so that 61 identical findings read as one
line, `model.layers.{0-60}.self_attn.rotary_emb.inv_freq`, as transformers' load report does. Findings
accepted with `--ignore` counted per rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kimi_audit.checks.audit import AuditReport
from kimi_audit.findings import Finding
from kimi_audit.format.names import ranges

INDEX_RE = re.compile(r"(?<=\.)(\d+)(?=\.)")
"""A layer or expert index inside a tensor name."""
SHARD_INDEX_RE = re.compile(r"\d+")
"""Any number inside a shard name (`model-{2-61}-of-61.safetensors`)."""


def _indices(f: Finding) -> re.Pattern[str]:
    return INDEX_RE if f.tensor else SHARD_INDEX_RE


@dataclass(frozen=True)
class FindingGroup:
    code: str
    severity: str
    pattern: str
    """Tensor name (or shard) with each varying index shown as a range, e.g. layers.{1-60}."""
    count: int
    example: Finding
    members: tuple[Finding, ...]


def group_findings(findings: tuple[Finding, ...] | list[Finding]) -> list[FindingGroup]:
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        subject = f.tensor or f.shard or ""
        key = (f.code, f.severity.value, _indices(f).sub("#", subject))
        groups.setdefault(key, []).append(f)
    out = []
    for (code, severity, shape), members in groups.items():
        out.append(FindingGroup(code, severity, _pattern(shape, members), len(members), members[0], tuple(members)))
    rank = {"error": 0, "warning": 1, "info": 2}
    out.sort(key=lambda g: (rank[g.severity], g.code, g.pattern))
    return out


def first_groups(groups: list[FindingGroup], limit: int) -> list[FindingGroup]:
    """At most `limit` groups, in their order, every code's first group among them: a capped report never leaves a
    rarer code out behind a flood of another (200,000 INDEX_ENTRY_MISSING groups once hid the one VALUE_NAN)."""
    if len(groups) <= limit:
        return groups
    firsts: dict[str, int] = {}  # each code's first group, codes in the order they first appear
    for i, g in enumerate(groups):
        firsts.setdefault(g.code, i)
    chosen = set(list(firsts.values())[:limit])
    for i in range(len(groups)):
        if len(chosen) >= limit:
            break
        chosen.add(i)
    return [groups[i] for i in sorted(chosen)]


def _pattern(shape: str, members: list[Finding]) -> str:
    if len(members) == 1 or "#" not in shape:
        return members[0].tensor or members[0].shard or ""
    columns: list[list[int]] = [[] for _ in range(shape.count("#"))]
    widths: list[set[int]] = [set() for _ in columns]
    padded: list[bool] = [False for _ in columns]
    for f in members:
        for i, m in enumerate(_indices(f).findall(f.tensor or f.shard or "")):
            columns[i].append(int(m))
            widths[i].add(len(m))
            padded[i] = padded[i] or (len(m) > 1 and m.startswith("0"))
    pieces = shape.split("#")
    out = pieces[0]
    for col, width, pad, rest in zip(columns, widths, padded, pieces[1:], strict=True):
        r = ranges(col)
        if pad and len(width) == 1:  # zero-padded numbers (a split part's `00003`) keep their padding
            w = max(width)
            r = re.sub(r"\d+", lambda m: m.group().zfill(w), r)  # noqa: B023 - used at once, in this iteration
        out += r if "," not in r and "-" not in r else "{" + r + "}"
        out += rest
    return out


def ignored_counts(report: AuditReport) -> dict[str, int]:
    """Rule spec -> findings it ignored, in the order the rules first matched."""
    counts: dict[str, int] = {}
    for spec in report.ignored_by:
        counts[spec] = counts.get(spec, 0) + 1
    return counts


def ignored_line(report: AuditReport) -> str | None:
    """`ignored: N findings (CODE:GLOB ×n, ...)`, or None when nothing was ignored."""
    if not report.ignored:
        return None
    n = len(report.ignored)
    rules = ", ".join(f"{spec} ×{k:,}" for spec, k in ignored_counts(report).items())
    return f"ignored: {n:,} finding{'' if n == 1 else 's'} ({rules})"
