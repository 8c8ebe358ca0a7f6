"""CI outputs of `audit`: JUnit XML (the testsuite/testcase/failure shape), markdown, --output,
$GITHUB_STEP_SUMMARY, --fail-on, and the --expect-params / --expect-revision gates."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from hub_repos import TINY_REPO
from kimi_audit.checks.audit import audit_source
from kimi_audit.checks.gates import apply_gates, revision_gate
from kimi_audit.cli import app
from kimi_audit.findings import Severity
from kimi_audit.report.grouping import group_findings
from kimi_audit.report.junit import CHECKS, junit_tree, render_junit
from kimi_audit.report.markdown import render_markdown
from kimi_audit.sources import LocalSource
from tiny_checkpoint import tiny_shards, write_tiny

runner = CliRunner()
S2 = "model-2-of-3.safetensors"

# Required attributes in the JUnit XML schema (Ant's JUnit.xsd, which CI reporters follow) for a
# <testsuite> inside <testsuites>, a <testcase>, and a <failure>.
SUITE_REQUIRED = {"name", "tests", "failures", "errors", "time", "timestamp", "hostname", "id", "package"}
CASE_REQUIRED = {"name", "classname", "time"}
FAILURE_REQUIRED = {"type"}
ISO8601_NO_TZ = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
DECIMAL = re.compile(r"^\d+(\.\d+)?$")


def validate_junit(xml_text: str) -> ET.Element:
    """Structural validation against the schema: element nesting and order, required attributes, counts."""
    root = ET.fromstring(xml_text)
    assert root.tag == "testsuites"
    suites = list(root)
    assert suites and all(s.tag == "testsuite" for s in suites)
    for suite in suites:
        assert suite.attrib.keys() >= SUITE_REQUIRED
        assert ISO8601_NO_TZ.match(suite.get("timestamp"))
        assert DECIMAL.match(suite.get("time"))
        tags = [c.tag for c in suite]
        # sequence: properties, testcase*, system-out, system-err
        assert tags[0] == "properties" and tags[-2:] == ["system-out", "system-err"]
        assert set(tags[1:-2]) <= {"testcase"}
        for prop in suite.find("properties"):
            assert prop.tag == "property" and {"name", "value"} <= prop.attrib.keys()
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        failing = 0
        for case in cases:
            assert case.attrib.keys() >= CASE_REQUIRED and DECIMAL.match(case.get("time"))
            kids = [c.tag for c in case]
            assert set(kids) <= {"failure", "error", "skipped", "system-out", "system-err"}
            assert kids.count("failure") + kids.count("error") + kids.count("skipped") <= 1  # the schema's choice
            for sk in case.findall("skipped"):
                assert sk.get("message")
            for f in case.findall("failure"):
                assert f.attrib.keys() >= FAILURE_REQUIRED
            failing += "failure" in kids
        assert int(suite.get("failures")) == failing
        assert int(suite.get("errors")) == sum("error" in [c.tag for c in case] for case in cases)
        assert int(suite.get("skipped")) == sum(case.find("skipped") is not None for case in cases)
    return root


def skipped(root: ET.Element) -> dict[str, str]:
    return {c.get("name"): c.find("skipped").get("message") for c in root.iter("testcase")
            if c.find("skipped") is not None}


def failures(root: ET.Element) -> dict[str, ET.Element]:
    return {c.get("name"): c.find("failure") for c in root.iter("testcase") if c.find("failure") is not None}


def mutated(tmp_path, mutate, name="ckpt"):
    shards = tiny_shards()
    mutate(shards)
    return write_tiny(tmp_path / name, shards)


def test_junit_of_a_clean_checkpoint_passes_every_check(tiny_dir):
    report = audit_source(LocalSource(tiny_dir))
    root = validate_junit(render_junit(report, elapsed=0.25))
    names = [c.get("name") for c in root.iter("testcase")]
    assert names == [c.name for c in CHECKS] + ["q_a_layernorm"]
    assert failures(root) == {}
    # checks that did not run are skipped, not passed
    assert set(skipped(root)) == {"values", "release-gates", "gguf", "against-source"}
    assert "--values" in skipped(root)["values"] and "--expect-params" in skipped(root)["release-gates"]
    assert "not a GGUF" in skipped(root)["gguf"]
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["parameters"] == str(report.stats.parameters)


def test_junit_checks_that_ran_are_not_skipped(tiny_dir):
    from kimi_audit.checks.values import audit_with_values

    report = audit_with_values(LocalSource(tiny_dir))
    assert report.values_checked and not report.gates_checked
    gated = apply_gates(report, str(report.stats.parameters), None)
    assert gated.gates_checked and gated.exit_code() == 0
    root = validate_junit(render_junit(gated))
    assert set(skipped(root)) == {"gguf", "against-source"} and failures(root) == {}
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--format", "junit", "--values"])
    assert r.exit_code == 0 and set(skipped(validate_junit(r.stdout))) == {"release-gates", "gguf", "against-source"}


def test_junit_failures_name_the_checks_and_tensors(tmp_path):
    gone = "model.layers.1.self_attn.q_a_layernorm.weight"
    scale = "model.layers.2.mlp.experts.5.up_proj.weight_scale_inv"
    hostile = "model.layers.1.x|y\x1b[31m"

    def mutate(s):
        s[S2].pop(gone)
        s[S2].pop(scale)
        s[S2][hostile] = np.ones(3, dtype=ml_dtypes.bfloat16)
    report = audit_source(LocalSource(mutated(tmp_path, mutate)))
    root = validate_junit(render_junit(report))
    fails = failures(root)
    assert set(fails) == {"layout", "fp8-scales", "q_a_layernorm"}  # write_tiny keeps the index in step
    assert fails["layout"].get("type") in ("TENSOR_MISSING", "TENSOR_UNEXPECTED")
    assert "TENSOR_MISSING ×1" in fails["layout"].get("message") and gone in fails["layout"].text
    assert fails["fp8-scales"].get("type") == "SCALE_MISSING" and scale in fails["fp8-scales"].text
    assert "\\x1b" in fails["layout"].text  # the control character is escaped, the XML still parses
    # every error finding appears in exactly one failing testcase
    listed = sum(len(f.text.splitlines()) for name, f in fails.items() if name != "q_a_layernorm")
    assert listed == report.errors
    md = render_markdown(report)
    assert "❌ FAIL" in md and "x\\|y\\x1b[31m" in md and "\x1b" not in md
    rows = [line for line in md.splitlines() if line.startswith("| error") or line.startswith("| warning")]
    assert len(rows) == len(group_findings(report.findings))


def test_fail_on_warning(tmp_path, tiny_dir):
    ckpt = mutated(tmp_path, lambda s: None)
    index = ckpt / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["metadata"]["total_size"] += 1  # INDEX_TOTAL_SIZE: a warning
    index.write_text(json.dumps(doc))
    r = runner.invoke(app, ["audit", str(ckpt), "--no-progress", "--format", "junit"])
    assert r.exit_code == 0, r.output
    assert failures(validate_junit(r.stdout)) == {}
    r = runner.invoke(app, ["audit", str(ckpt), "--no-progress", "--format", "junit", "--fail-on", "warning"])
    assert r.exit_code == 1
    fails = failures(validate_junit(r.stdout))
    assert list(fails) == ["files-and-index"] and fails["files-and-index"].get("type") == "INDEX_TOTAL_SIZE"
    r = runner.invoke(app, ["audit", str(ckpt), "--no-progress", "--fail-on", "sometimes"])
    assert r.exit_code == 2


def test_output_file_json_alias_and_step_summary(tiny_dir, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = tmp_path / "report.xml"
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--format", "junit", "--output", str(out)])
    assert r.exit_code == 0 and r.stdout == ""
    validate_junit(out.read_text())
    a = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--json"])
    b = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--format", "json"])
    assert json.loads(a.stdout) == json.loads(b.stdout)
    text = summary.read_text()
    assert text.count("## kimi-audit: ✅ PASS") == 3  # appended, once per run
    report = audit_source(LocalSource(tiny_dir))
    assert f"**{report.stats.parameters:,}**" in text
    md = tmp_path / "r.md"
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--format", "markdown", "-o", str(md)])
    assert md.read_text() == render_markdown(report)
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--json", "--format", "junit"])
    assert r.exit_code == 2


def test_expect_params_gate(tiny_dir):
    n = audit_source(LocalSource(tiny_dir)).stats.parameters
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--json", "--expect-params", f"{n:,}"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--json", "--expect-params", str(n + 1)])
    assert r.exit_code == 1
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "PARAMS_GATE"]
    assert (f["severity"], f["expected"], f["actual"]) == ("error", n + 1, n)
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--expect-params", "lots"])
    assert r.exit_code == 2 and "--expect-params" in r.output


def test_expect_revision_gate_pure(tiny_dir):
    report = audit_source(LocalSource(tiny_dir))
    [local] = revision_gate(report, "abcdef1")
    assert local.code == "REVISION_GATE" and local.severity is Severity.ERROR
    pinned = dataclasses.replace(report, revision="fd1984e2b7a3350dbf7305fe73a4ede25c14de50")
    assert revision_gate(pinned, "fd1984e2b7a3") == []
    assert revision_gate(pinned, "fd1984e2b7a3350dbf7305fe73a4ede25c14de50") == []
    assert [f.code for f in revision_gate(pinned, "fd1984e2b7a4")] == ["REVISION_GATE"]
    gated = apply_gates(pinned, None, "0000000")
    assert gated.exit_code() == 1 and len(gated.findings) == len(pinned.findings) + 1
    assert junit_tree(gated) is not None and "release-gates" in failures(junit_tree(gated))


def test_expect_revision_gate_against_the_hub(hub):
    commit = hub.repos[TINY_REPO].commit
    r = runner.invoke(app, ["audit", TINY_REPO, "--no-progress", "--json", "--expect-revision", commit[:10]])
    assert r.exit_code == 0, r.output
    other = ("0" if commit[0] != "0" else "1") + commit[1:12]
    r = runner.invoke(app, ["audit", TINY_REPO, "--no-progress", "--format", "junit", "--expect-revision", other])
    assert r.exit_code == 1
    assert failures(validate_junit(r.stdout))["release-gates"].get("type") == "REVISION_GATE"
    r = runner.invoke(app, ["audit", TINY_REPO, "--no-progress", "--expect-revision", "main"])
    assert r.exit_code == 2


@pytest.mark.parametrize("fmt", ["table", "json", "junit", "markdown", "sarif"])
def test_every_format_renders_the_replica(replica_dir, fmt, tmp_path):
    out = tmp_path / f"report.{fmt}"
    r = runner.invoke(app, ["audit", str(replica_dir), "--no-progress", "--format", fmt, "--output", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "1,026,408,232,448" in text or "1026408232448" in text
