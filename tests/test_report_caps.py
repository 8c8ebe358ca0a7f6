"""A capped report (the JSON listing, its finding_groups, the table, markdown and HTML pages) never leaves a code
out behind a flood of another: 200,000 stray tensors' INDEX_ENTRY_MISSING groups once filled every listing and the
one VALUE_NAN was in none (round two of this session's red team)."""

from __future__ import annotations

from kimi_audit.findings import error
from kimi_audit.report.grouping import first_groups, group_findings
from kimi_audit.report.json_report import MAX_FINDINGS, MAX_GROUPS, listing


def flood() -> tuple:  # type: ignore[type-arg]
    many = [error("INDEX_ENTRY_MISSING", f"stray {i}", tensor=f"model.layers.0.extra_{i}.weight")
            for i in range(MAX_GROUPS + MAX_FINDINGS)]
    return (*many, error("VALUE_NAN", "one NaN", tensor="model.norm.weight"))


def test_every_code_keeps_a_group_under_the_cap() -> None:
    groups = group_findings(flood())
    assert len(groups) > MAX_GROUPS and groups[-1].code == "VALUE_NAN"  # sorted last: the flood's code comes first
    shown = first_groups(groups, MAX_GROUPS)
    assert len(shown) == MAX_GROUPS and {g.code for g in shown} == {"INDEX_ENTRY_MISSING", "VALUE_NAN"}
    assert shown == sorted(shown, key=groups.index)  # the order kept


def test_the_json_listing_holds_the_rare_finding() -> None:
    findings = flood()
    listed = listing(findings, group_findings(findings), all_findings=False)
    assert len(listed) <= MAX_FINDINGS and "VALUE_NAN" in {f["code"] for f in listed}


def test_under_the_cap_nothing_changes() -> None:
    findings = flood()[:10]
    groups = group_findings(findings)
    assert first_groups(groups, MAX_GROUPS) == groups
    assert len(listing(findings, groups, all_findings=False)) == 10
