"""`audit --ignore CODE[:GLOB]`: accepted deviations leave the verdict and are listed in every format."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.checks.ignore import IgnoreRule, apply_ignores, parse_ignore
from kimi_audit.cli import app
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Severity, error, warning
from kimi_audit.report.grouping import ignored_line
from kimi_audit.report.json_report import MAX_FINDINGS, report_dict
from kimi_audit.report.markdown import render_markdown
from kimi_audit.report.rules import RULES
from kimi_audit.sources import LocalSource
from tiny_checkpoint import tiny_shards, write_tiny

runner = CliRunner()
S2 = "model-2-of-3.safetensors"
GONE = "model.layers.1.self_attn.q_a_layernorm.weight"


@pytest.fixture(scope="module")
def base(tiny_dir):
    return audit_source(LocalSource(tiny_dir))


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A tiny checkpoint missing one gain (TENSOR_MISSING, error): exit 1 unless ignored."""
    shards = tiny_shards()
    shards[S2].pop(GONE)
    return write_tiny(tmp_path_factory.mktemp("ignore") / "ckpt", shards)


def test_parse_ignore():
    assert parse_ignore("TENSOR_MISSING", RULES) == IgnoreRule("TENSOR_MISSING")
    rule = parse_ignore(" tensor_missing:model.layers.*.q_a_layernorm.weight", RULES)
    assert rule == IgnoreRule("TENSOR_MISSING", "model.layers.*.q_a_layernorm.weight")
    assert rule.spec == "TENSOR_MISSING:model.layers.*.q_a_layernorm.weight"
    with pytest.raises(KimiAuditError, match=r"unknown finding code 'TENSOR_MISING'.*TENSOR_MISSING"):
        parse_ignore("TENSOR_MISING", RULES)
    with pytest.raises(KimiAuditError, match="empty glob"):
        parse_ignore("TENSOR_MISSING:", RULES)
    with pytest.raises(KimiAuditError, match="unknown finding code"):
        parse_ignore("", RULES)


def test_apply_ignores_matches_tensor_else_shard_first_rule_wins(base):
    findings = (
        error("TENSOR_MISSING", "a", tensor="model.layers.1.mlp.w"),
        error("TENSOR_MISSING", "b", tensor="model.layers.2.mlp.w"),
        warning("SHARD_NOT_IN_INDEX", "c", shard="extra-1.safetensors"),
        error("QUANT_CONFIG", "d"),
    )
    report = dataclasses.replace(base, findings=findings)
    rules = [parse_ignore(s, RULES) for s in ("TENSOR_MISSING:model.layers.1.*", "TENSOR_MISSING",
                                              "SHARD_NOT_IN_INDEX:extra-*", "VALUE_NAN", "TENSOR_MISSING")]
    out = apply_ignores(report, rules)
    assert [f.message for f in out.ignored] == ["a", "b", "c"]
    assert out.ignored_by == ("TENSOR_MISSING:model.layers.1.*", "TENSOR_MISSING", "SHARD_NOT_IN_INDEX:extra-*")
    assert [f.code for f in out.findings] == ["QUANT_CONFIG", "IGNORE_UNUSED"]  # the duplicate rule counts once
    unused = out.findings[1]
    assert unused.severity is Severity.INFO and "VALUE_NAN" in unused.message
    assert out.exit_code() == 1 and report.exit_code() == 1
    assert ignored_line(out) == ("ignored: 3 findings (TENSOR_MISSING:model.layers.1.* ×1, TENSOR_MISSING ×1, "
                                 "SHARD_NOT_IN_INDEX:extra-* ×1)")
    assert apply_ignores(report, []) is report and ignored_line(report) is None
    # the glob is case-sensitive and matches the whole name
    none = apply_ignores(report, [parse_ignore("TENSOR_MISSING:MODEL.*", RULES),
                                  parse_ignore("TENSOR_MISSING:layers.1", RULES)])
    assert none.ignored == () and [f.code for f in none.findings].count("IGNORE_UNUSED") == 2


def test_cli_ignore_turns_a_known_deviation_into_a_pass(broken, tmp_path):
    r = runner.invoke(app, ["audit", str(broken), "--no-progress"])
    assert r.exit_code == 1 and "FAIL" in r.stdout
    args = ["audit", str(broken), "--no-progress", "--ignore", "TENSOR_MISSING:*.q_a_layernorm.weight"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "PASS" in r.stdout and "ignored: 1 finding (TENSOR_MISSING:*.q_a_layernorm.weight ×1)" in r.stdout
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["result"]["verdict"] == "PASS" and doc["result"]["errors"] == 0
    (ign,) = doc["ignored"]
    assert (ign["code"], ign["tensor"]) == ("TENSOR_MISSING", GONE)
    assert doc["ignore_rules"] == [{"rule": "TENSOR_MISSING:*.q_a_layernorm.weight", "ignored": 1}]
    assert doc["listing"]["ignored"] == doc["listing"]["ignored_listed"] == 1 and doc["listing"]["complete"]
    root = ET.fromstring(runner.invoke(app, [*args, "--format", "junit"]).stdout)
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["ignored"] == "1"
    suite_out = root.find("testsuite").find("system-out").text
    assert GONE in suite_out and "(--ignore TENSOR_MISSING:*.q_a_layernorm.weight)" in suite_out
    md = runner.invoke(app, [*args, "--format", "markdown"]).stdout
    assert "✅ PASS" in md and "ignored: 1 finding (`TENSOR_MISSING:*.q_a_layernorm.weight` ×1)" in md


def test_cli_ignore_errors_and_unused_rules(tiny_dir):
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--ignore", "NOT_A_CODE"])
    assert r.exit_code == 2 and "unknown finding code" in r.stderr
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--ignore", "SCALE_MISSING:"])
    assert r.exit_code == 2 and "empty glob" in r.stderr
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--json", "--ignore", "SCALE_MISSING"])
    assert r.exit_code == 0
    (f,) = json.loads(r.stdout)["findings"]
    assert (f["code"], f["severity"], f["expected"]) == ("IGNORE_UNUSED", "info", "SCALE_MISSING")


def test_ignoring_a_gate(tiny_dir):
    args = ["audit", str(tiny_dir), "--no-progress", "--json", "--expect-revision", "abcdef1"]
    assert runner.invoke(app, args).exit_code == 1  # a local directory has no revision
    r = runner.invoke(app, [*args, "--ignore", "REVISION_GATE"])
    assert r.exit_code == 0 and json.loads(r.stdout)["ignored"][0]["code"] == "REVISION_GATE"


def test_json_ignored_listing_is_capped_like_findings(base):
    many = tuple(error("TENSOR_MISSING", f"m{i}", tensor=f"model.layers.{i}.w{i % 7}.weight") for i in range(3000))
    out = apply_ignores(dataclasses.replace(base, findings=many), [parse_ignore("TENSOR_MISSING", RULES)])
    doc = report_dict(out)
    assert doc["findings"] == [] and len(doc["ignored"]) <= MAX_FINDINGS
    assert doc["listing"]["ignored"] == 3000 and not doc["listing"]["complete"]
    assert len(report_dict(out, all_findings=True)["ignored"]) == 3000
    assert "ignored: 3,000 findings" in render_markdown(out)
