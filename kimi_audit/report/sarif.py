"""SARIF 2.1.0 for GitHub code scanning (`audit --format sarif`).

One run; `tool.driver.rules` holds every finding code (report.rules) with its short and full description
and help. Each finding is a result: its rule, a level (error, warning, note), a message naming the tensor,
one location (the shard, else config.json or model.safetensors.index.json, relative to the checkpoint
root, at line 1), the tensor's full name as a logical location, and a fingerprint that stays the same from
run to run. Findings accepted with `--ignore` are results too, suppressed ("external", the rule as the
justification). At most MAX_RESULTS results; what is left out is counted in a tool notification and in the
run's properties.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from kimi_audit.checks.audit import AuditReport
from kimi_audit.constants import CONFIG_FILE, INDEX_FILE, VERSION
from kimi_audit.findings import Finding, Severity
from kimi_audit.model.mistral_layout import index_name
from kimi_audit.report.junit import CHECKS, check_of, not_run
from kimi_audit.report.rules import RULES, rule
from kimi_audit.text import clip, json_dumps, printable

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
MAX_RESULTS = 5_000
MAX_MESSAGE = 1_000
"""Characters kept of a message (names come from untrusted headers)."""
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
FINGERPRINT = "kimiAudit/v1"
INDEX_CODES = ("INDEX_", "SHARD_NOT_IN_INDEX")


def _safe_relative(name: str) -> bool:
    """A shard name usable as a relative URI: no absolute path, no `..`, no backslash, no scheme."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\\" not in name and ".." not in parts \
        and ":" not in parts[0] and all(parts)


def artifact(f: Finding, home: Callable[[Finding], str] | None = None, index: str = INDEX_FILE) -> str:
    """The file a finding is about, relative to the checkpoint root: its shard; else the index for the index's
    findings; else, in a GGUF set, the part holding the tensor or the set's first part (a GGUF folder has no
    config.json: its metadata is in part 1); else config.json."""
    if f.shard and f.code != "INDEX_UNSAFE_PATH" and _safe_relative(f.shard):
        return f.shard
    if f.code.startswith(INDEX_CODES):
        return index
    return home(f) if home is not None else CONFIG_FILE


def gguf_home(report: AuditReport) -> Callable[[Finding], str] | None:
    """For a GGUF set's report, where a finding without a part lives: the part that stores its tensor, else the
    set's first part (which carries the metadata)."""
    ckpt = report.checkpoint
    if ckpt is None or ckpt.container != "gguf" or not ckpt.files:
        return None
    first = ckpt.files[0]
    where = {n: part for part, h in ckpt.headers.items() for n in h.columns.names}

    def home(f: Finding) -> str:
        part = where.get(f.tensor or "", first)
        return part if _safe_relative(part) else CONFIG_FILE

    return home


def subject(f: Finding) -> str:
    """What a finding is about, for its fingerprint: the tensor, else the shard, else its expected value
    (a gate's N or SHA, an --ignore rule), never the message (counts in it change from run to run)."""
    return f.tensor or f.shard or ("" if f.expected is None else repr(f.expected))


def message(f: Finding) -> str:
    """The finding's message, its tensor named first (escaped: names come from untrusted headers)."""
    text = printable(f.message)
    if f.tensor and f.tensor not in f.message:
        text = f"{printable(f.tensor)}: {text}"
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def _rules(codes: list[str]) -> list[dict[str, Any]]:
    out = []
    for code in codes:
        r = rule(code)
        out.append({
            "id": code,
            "name": "".join(w.capitalize() for w in code.split("_")),
            "shortDescription": {"text": r.short},
            "fullDescription": {"text": r.full},
            "help": {"text": r.help, "markdown": f"**{code}** ({r.severity}): {r.full}\n\n{r.help}"},
            "defaultConfiguration": {"level": LEVEL[Severity(r.severity)]},
            "properties": {"tags": ["checkpoint", check_of(code).name]},
        })
    return out


def _result(f: Finding, index: int, fingerprint: str, suppressed_by: str | None,
            home: Callable[[Finding], str] | None = None, index_file: str = INDEX_FILE) -> dict[str, Any]:
    uri = artifact(f, home, index_file)
    res: dict[str, Any] = {
        "ruleId": f.code,
        "ruleIndex": index,
        "level": LEVEL[f.severity],
        "message": {"text": message(f)},
        "locations": [{
            "physicalLocation": {"artifactLocation": {"uri": quote(uri, safe="/")}, "region": {"startLine": 1}},
        }],
        "partialFingerprints": {FINGERPRINT: fingerprint},
    }
    if f.tensor:
        tensor = printable(f.tensor)
        res["locations"][0]["logicalLocations"] = [
            {"name": tensor.rsplit(".", 1)[-1] if "." in tensor else tensor,
             "fullyQualifiedName": tensor, "kind": "member"}]
    props: dict[str, Any] = {"severity": f.severity.value, "check": check_of(f.code).name}
    if f.covers:
        props["covers"] = f.covers
    res["properties"] = props
    if suppressed_by is not None:
        res["suppressions"] = [{"kind": "external", "justification": f"--ignore {suppressed_by}"}]
    return res


def sarif_dict(report: AuditReport, fail_on: Severity = Severity.ERROR,
               max_results: int = MAX_RESULTS) -> dict[str, Any]:
    rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    active = sorted(report.findings, key=lambda f: rank[f.severity])  # stable: errors first when capped
    entries: list[tuple[Finding, str | None]] = [(f, None) for f in active]
    entries += list(zip(report.ignored, report.ignored_by, strict=True))
    codes = list(RULES) + sorted({f.code for f, _ in entries} - RULES.keys())
    index = {c: i for i, c in enumerate(codes)}
    seen: dict[str, int] = {}
    results: list[dict[str, Any]] = []
    home = gguf_home(report)
    ckpt = report.checkpoint  # the index findings' file: the checkpoint's (Mistral's consolidated one, or not)
    named = INDEX_FILE if ckpt is None else ckpt.index.name if ckpt.index is not None else index_name(ckpt.files)
    for f, by in entries:  # fingerprints over every finding, so the kept ones do not depend on the cap
        key = hashlib.sha256("\0".join((f.code, subject(f), artifact(f, home, named))).encode(
            "utf-8", "backslashreplace")).hexdigest()
        n = seen[key] = seen.get(key, 0) + 1
        if len(results) < max_results:
            results.append(_result(f, index[f.code], f"{key}:{n}", by, home, named))
    left_out = len(entries) - len(results)
    invocation: dict[str, Any] = {"executionSuccessful": True, "exitCode": report.exit_code(fail_on)}
    if left_out:
        invocation["toolExecutionNotifications"] = [{
            "level": "warning",
            "message": {"text": f"{left_out:,} of {len(entries):,} results left out (at most {max_results:,} "
                                "a run); the JSON report (--format json --all-findings) lists every finding"},
        }]
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "kimi-audit", "version": VERSION, "semanticVersion": VERSION,
                                "rules": _rules(codes)}},
            "invocations": [invocation],
            "results": results,
            "columnKind": "unicodeCodePoints",
            "properties": {
                "source": report.source, "revision": report.revision, "verdict": report.verdict(fail_on),
                "failOn": fail_on.value, "errors": report.errors, "warnings": report.warnings,
                "tensors": report.stats.tensors, "parameters": report.stats.parameters,
                "results": len(entries), "resultsListed": len(results), "resultsLeftOut": left_out,
                "ignored": len(report.ignored),
                "checksNotRun": [c.name for c in CHECKS if not_run(c.name, report)],
            },
        }],
    }


def render_sarif(report: AuditReport, fail_on: Severity = Severity.ERROR) -> str:
    return json_dumps(sarif_dict(report, fail_on), indent=2) + "\n"


def sarif_error_dict(code: str, message: str, source: str, exit_code: int = 2) -> dict[str, Any]:
    """The run when the input could not be audited at all (exit 2): no results, the error as a tool execution
    notification and `executionSuccessful: false`, so a CI upload step still finds a valid SARIF file."""
    text = clip(message)
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "kimi-audit", "version": VERSION, "semanticVersion": VERSION, "rules": []}},
            "invocations": [{"executionSuccessful": False, "exitCode": exit_code, "toolExecutionNotifications": [
                {"level": "error", "message": {"text": text}, "descriptor": {"id": code}}]}],
            "results": [],
            "columnKind": "unicodeCodePoints",
            "properties": {"source": clip(source), "verdict": "ERROR", "error": {"code": code, "message": text}},
        }],
    }


def render_sarif_error(code: str, message: str, source: str, exit_code: int = 2) -> str:
    return json_dumps(sarif_error_dict(code, message, source, exit_code), indent=2) + "\n"
