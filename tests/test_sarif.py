"""`audit --format sarif`: SARIF 2.1.0 as GitHub code scanning takes it, and the rule table behind it."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.checks.ignore import apply_ignores, parse_ignore
from kimi_audit.cli import app
from kimi_audit.constants import CONFIG_FILE, INDEX_FILE
from kimi_audit.findings import Severity, error, info, warning
from kimi_audit.report.junit import OTHER, check_of
from kimi_audit.report.rules import RULES
from kimi_audit.report.sarif import MAX_RESULTS, artifact, render_sarif, sarif_dict
from kimi_audit.sources import LocalSource
from tiny_checkpoint import tiny_shards, write_tiny

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
S2 = "model-2-of-3.safetensors"
LEVELS = {"none", "note", "warning", "error"}
CODE_RE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")


def _text(obj: dict, where: str) -> None:
    """A SARIF message / multiformatMessageString: `text` required, a non-empty string."""
    assert isinstance(obj.get("text"), str) and obj["text"], where


def validate_sarif(doc: dict) -> dict:
    """The SARIF 2.1.0 schema's required properties and enums on what we write, and GitHub code scanning's
    own requirements (rules with descriptions and help, a location per result, fingerprints)."""
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    assert isinstance(doc["runs"], list) and len(doc["runs"]) == 1
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "kimi-audit" and isinstance(driver["version"], str)
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    for r in rules:
        for key in ("shortDescription", "fullDescription", "help"):
            _text(r[key], f"{r['id']}.{key}")
        assert r["defaultConfiguration"]["level"] in LEVELS
    for inv in run.get("invocations", []):
        assert isinstance(inv["executionSuccessful"], bool)
        for note in inv.get("toolExecutionNotifications", []):
            _text(note["message"], "notification")
            assert note.get("level", "warning") in LEVELS
    results = run["results"]
    assert len(results) <= MAX_RESULTS
    for res in results:
        assert res["ruleId"] in ids and ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in LEVELS
        _text(res["message"], res["ruleId"])
        assert 1 <= len(res["locations"]) <= 10
        phys = res["locations"][0]["physicalLocation"]
        uri = phys["artifactLocation"]["uri"]
        assert uri and not uri.startswith("/") and ".." not in uri.split("/") and ":" not in uri
        assert phys["region"]["startLine"] == 1
        for logical in res["locations"][0].get("logicalLocations", []):
            assert logical["fullyQualifiedName"] and logical["name"]
        fps = res["partialFingerprints"]
        assert fps and all(isinstance(v, str) and v for v in fps.values())
        for sup in res.get("suppressions", []):
            assert sup["kind"] in ("inSource", "external") and sup["justification"]
    fingerprints = [json.dumps(r["partialFingerprints"], sort_keys=True) for r in results]
    assert len(fingerprints) == len(set(fingerprints))
    return run


@pytest.fixture(scope="module")
def tiny_report(tiny_dir):
    return audit_source(LocalSource(tiny_dir))


def _with(report, *findings):
    return dataclasses.replace(report, findings=tuple(findings))


def mutated(tmp_path, mutate, name="ckpt"):
    shards = tiny_shards()
    mutate(shards)
    return write_tiny(tmp_path / name, shards)


def test_sarif_of_a_clean_checkpoint(tiny_dir):
    run = validate_sarif(sarif_dict(audit_source(LocalSource(tiny_dir))))
    assert run["results"] == [] and [r["id"] for r in run["tool"]["driver"]["rules"]] == list(RULES)
    assert run["properties"]["checksNotRun"] == ["values", "release-gates", "gguf", "against-source"]
    assert run["invocations"][0]["exitCode"] == 0


def test_sarif_results_name_the_tensor_and_its_file(tmp_path):
    gone = "model.layers.1.self_attn.q_a_layernorm.weight"
    scale = "model.layers.2.mlp.experts.5.up_proj.weight_scale_inv"
    extra = "model.layers.1.x y#%"

    def mutate(s):
        s[S2].pop(gone)
        s[S2].pop(scale)
        s[S2][extra] = np.ones(3, dtype=ml_dtypes.bfloat16)
    report = audit_source(LocalSource(mutated(tmp_path, mutate)))
    run = validate_sarif(sarif_dict(report))
    assert len(run["results"]) == len(report.findings)
    by_tensor = {r["locations"][0]["logicalLocations"][0]["fullyQualifiedName"]: r for r in run["results"]
                 if "logicalLocations" in r["locations"][0]}
    missing = by_tensor[gone]
    assert (missing["ruleId"], missing["level"]) == ("TENSOR_MISSING", "error")
    assert gone in missing["message"]["text"]
    assert by_tensor[scale]["ruleId"] == "SCALE_MISSING"
    unexpected = by_tensor[extra]
    assert unexpected["ruleId"] == "TENSOR_UNEXPECTED" and extra in unexpected["message"]["text"]
    assert unexpected["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == S2
    # the same checkpoint audited twice: the same fingerprints
    again = sarif_dict(audit_source(LocalSource(tmp_path / "ckpt")))
    assert [r["partialFingerprints"] for r in again["runs"][0]["results"]] == \
        [r["partialFingerprints"] for r in run["results"]]


def test_artifact_of_findings_without_a_shard(tiny_report):
    assert artifact(error("QUANT_CONFIG", "bad")) == CONFIG_FILE
    assert artifact(error("PARAMS_GATE", "n")) == CONFIG_FILE
    assert artifact(warning("MTP_ABSENT", "m", tensor="model.layers.61")) == CONFIG_FILE
    assert artifact(warning("INDEX_TOTAL_SIZE", "t")) == INDEX_FILE
    assert artifact(error("INDEX_ENTRY_MISSING", "e", tensor="a.b", shard="sub dir/m.safetensors")) \
        == "sub dir/m.safetensors"
    for hostile in ("../outside.safetensors", "/etc/passwd", "C:\\x.safetensors", "a//b", "x:y"):
        assert artifact(error("INDEX_SHARD_ABSENT", "gone", shard=hostile)) == INDEX_FILE
    doc = sarif_dict(_with(tiny_report, error("INDEX_ENTRY_MISSING", "e", tensor="t", shard="sub dir/m#1.safetensors")))
    loc = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert loc["uri"] == "sub%20dir/m%231.safetensors"


def test_results_are_capped_with_a_note(tiny_report):
    many = [error("TENSOR_MISSING", f"t{i} missing", tensor=f"model.layers.{i}.w") for i in range(MAX_RESULTS)]
    many += [info("VALUES_SKIPPED", f"s{i}", tensor=f"s.{i}") for i in range(700)]
    many.insert(0, info("VALUES_CHECKED", "checked"))
    run = validate_sarif(json.loads(render_sarif(_with(tiny_report, *many))))
    assert len(run["results"]) == MAX_RESULTS
    assert {r["level"] for r in run["results"]} == {"error"}  # errors first when capped
    assert run["properties"]["resultsLeftOut"] == 701 and run["properties"]["results"] == MAX_RESULTS + 701
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert "701 of 5,701 results left out" in note["message"]["text"]


def test_ignored_findings_are_suppressed_results(tiny_report):
    report = _with(tiny_report, error("TENSOR_MISSING", "gone", tensor="model.layers.1.mlp.w"),
                   error("TENSOR_MISSING", "gone", tensor="model.layers.2.mlp.w"))
    ignored = apply_ignores(report, [parse_ignore("TENSOR_MISSING:model.layers.1.*", RULES)])
    run = validate_sarif(sarif_dict(ignored))
    (sup,) = [r for r in run["results"] if "suppressions" in r]
    assert sup["suppressions"] == [{"kind": "external", "justification": "--ignore TENSOR_MISSING:model.layers.1.*"}]
    assert [r["ruleId"] for r in run["results"] if "suppressions" not in r] == ["TENSOR_MISSING"]
    assert run["properties"]["ignored"] == 1 and run["invocations"][0]["exitCode"] == 1


def test_cli_format_sarif_to_a_file(tiny_dir, tmp_path):
    out = tmp_path / "audit.sarif"
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "--format", "sarif", "--output", str(out)])
    assert r.exit_code == 0 and r.stdout == ""
    validate_sarif(json.loads(out.read_text()))
    r = runner.invoke(app, ["audit", str(tiny_dir), "--no-progress", "-f", "sarif"])
    assert r.exit_code == 0 and json.loads(r.stdout)["version"] == "2.1.0"


# --- the rule table: every code the package can emit, and README.md's tables ---

EMITTERS = frozenset(("error", "warning", "info", "Finding"))
"""kimi_audit.findings' constructors: their first argument is a finding code."""


def _emitters(tree: ast.Module) -> set[str]:
    """The names a module calls to make a finding: findings' constructors, its own functions whose first parameter
    is `code` (a strict reader's `bad(code, message)`), and names bound to a constructor (`severity = warning if
    ... else error`)."""
    names = set(EMITTERS)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)) and node.args.args and node.args.args[0].arg == "code":
            names.add(getattr(node, "name", ""))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            parts = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            if all(isinstance(v, ast.Name) and v.id in names for v in parts):
                names.add(node.targets[0].id)
    return names - {""}


def codes_in(source: str) -> set[str]:
    """The finding codes a module spells, told by how each string is used, not by how it is spelled: the first
    argument (or `code=`) of a call that makes a finding, and the strings of a table named `..._CODES` (the
    layout's kind -> (dtype code, shape code)). An upper-case constant used otherwise (ModelOpt's `quant_algo`
    value `MIXED_PRECISION`, a dtype) is not a code, and needs no allowlist."""
    tree = ast.parse(source)
    emitters = _emitters(tree)
    out: set[str] = set()

    def strings(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in emitters:
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "code"), None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    out.add(first.value)
                elif isinstance(first, ast.IfExp):  # error("A" if ... else "B", ...)
                    out |= strings(first)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id.endswith("_CODES") for t in targets) and node.value is not None:
                out |= {v for v in strings(node.value) if CODE_RE.match(v)}
    return out


def emitted_codes() -> dict[str, str]:
    """The finding codes every module that makes findings spells (format/, model/, checks/, findings.py): a
    finding code is always spelled out as a literal somewhere there, where a finding is made of it."""
    found: dict[str, str] = {}
    pkg = ROOT / "kimi_audit"
    paths = [pkg / "findings.py"] + [p for d in ("format", "model", "checks") for p in sorted((pkg / d).rglob("*.py"))]
    for path in paths:
        for code in sorted(codes_in(path.read_text())):
            found.setdefault(code, str(path.relative_to(ROOT)))
    return found


def test_codes_are_told_by_their_use_not_their_spelling():
    """A format's upper-case constants (a config value, a dtype) are not finding codes, whatever their spelling;
    a code passed to findings' constructors, to a module's own `code` helper, or listed in a `_CODES` table is."""
    source = """
from kimi_audit.findings import error, warning
ALGO = "MIXED_PRECISION"
MISMATCH_CODES = {"scale": ("SCALE_DTYPE", "SCALE_SHAPE")}
def check(q, strict):
    if q.get("quant_algo") == "NVFP4_AWQ":
        return [error("PLANTED_ERROR", "x")]
    severity = error if strict else warning
    def bad(code, message):
        return severity(code, message)
    return [severity("PLANTED_SEVERITY", "y"), bad("PLANTED_HELPER", "z"), warning(code="PLANTED_KEYWORD",
            message="w"), error("PLANTED_A" if strict else "PLANTED_B", "v")]
"""
    assert codes_in(source) == {"SCALE_DTYPE", "SCALE_SHAPE", "PLANTED_ERROR", "PLANTED_SEVERITY", "PLANTED_HELPER",
                                "PLANTED_KEYWORD", "PLANTED_A", "PLANTED_B"}


def test_every_emitted_code_has_a_rule():
    codes = emitted_codes()
    assert {"TENSOR_MISSING", "VALUES_CHECKED", "MTP_ABSENT", "IGNORE_UNUSED", "PARAMS_GATE", "BUFFER_SHAPE",
            "HEADER_TOO_LARGE", "TENSOR_ENTRY_INVALID", "SCALE_NOT_UE8M0"} <= codes.keys()
    assert [c for c in codes if not CODE_RE.match(c)] == []
    missing = {c: p for c, p in codes.items() if c not in RULES}
    assert not missing, f"finding codes without a rule in kimi_audit/report/rules.py (and docs/reference.md): {missing}"


def readme_codes() -> dict[str, set[str]]:
    """Code -> severities (a row may read `info / warning`) in docs/reference.md's "Finding codes" tables."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text[text.index("## Finding codes"):]
    section = section[:section.index("\n## ", 1)]
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"^\| ([A-Z0-9_ /]+) \| ((?:error|warning|info)(?: / (?:error|warning|info))*) \|",
                         section, re.M):
        for code in m.group(1).split(" / "):
            out[code.strip()] = set(m.group(2).split(" / "))
    return out


def test_rules_agree_with_readme_and_the_checks():
    documented = readme_codes()
    assert documented.keys() == RULES.keys(), (documented.keys() ^ RULES.keys())
    assert {c: r.severity for c, r in RULES.items() if r.severity not in documented[c]} == {}
    for code, r in RULES.items():
        assert r.short and r.full and r.help and r.severity in {s.value for s in Severity}
        assert code == "IGNORE_UNUSED" or check_of(code) is not OTHER, code
