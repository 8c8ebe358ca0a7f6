"""JUnit XML for CI systems: one <testsuite>, one <testcase> per check, a <failure> when it fails.

The shape is the one Jenkins, GitLab, GitHub Actions reporters and Azure read (the "JUnit.xsd" of the
Ant JUnit task): <testsuites><testsuite name tests failures errors skipped time timestamp hostname id
package><properties/><testcase name classname time><failure message type>text</failure></testcase>...
<system-out/><system-err/></testsuite></testsuites>.

A check fails when it has a finding at or above `fail_on` (error by default; warning with
`--fail-on warning`); lower-severity findings are listed in the testcase's <system-out>. A check that did
not run (values without `--values`, release-gates without `--expect-params` / `--expect-revision`) is
<skipped>. Findings accepted with `--ignore` are counted in the `ignored` property and listed in the
suite's <system-out>, with the --ignore rules that matched nothing (IGNORE_UNUSED: about the command line,
not the checkpoint, so no testcase of its own). Every other finding code belongs to one of the checks
(tests/test_reports_ci.py checks it): the testcases are always the same, whatever the findings.
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kimi_audit.checks.audit import AuditReport
from kimi_audit.constants import VERSION
from kimi_audit.findings import Finding, Severity
from kimi_audit.report.grouping import ignored_line
from kimi_audit.text import clip, printable

MAX_LINES = 500
"""Findings listed per testcase; the rest are counted (the JSON report has them all)."""

FORMAT_CODES = {"DTYPE_UNKNOWN", "SHAPE_INVALID", "SIZE_MISMATCH", "DATA_PAST_EOF", "TRAILING_BYTES"}
VALUE_CODES = {"SCALE_NOT_POSITIVE", "GAIN_ALL_ZERO", "DATA_NOT_PRESENT", "SCALE_NOT_UE8M0", "WEIGHT_SHAPE_MISMATCH",
               "FP8_NAN", "FP8_SATURATED", "BLOCK_ALL_ZERO", "EXPERT_ID_RANGE"}
LAYOUT_CODES = {"TENSOR_MISSING", "TENSOR_UNEXPECTED", "TENSOR_DUPLICATE", "DTYPE_MISMATCH", "SHAPE_MISMATCH",
                "MTP_ABSENT", "ROUTER_DTYPE", "WRITER_DTYPE", "LAYOUT_UNSUPPORTED", "LAYOUT_DIALECT",
                "TENSORS_UNDESCRIBED", "TENSORS_RESPELLED", "MTP_STAGES_FROM_FILES", "KV_SCALE_UNDECLARED",
                "CONFIG_DISAGREES", "PARAMS_DISAGREES", "PARAMS_ROPE_INVALID", "PARAMS_ROPE_LENGTHS"}
FILE_CODES = {"NO_SAFETENSORS", "PICKLE_NOT_INSPECTED", "CHECKPOINT_TOO_LARGE", "SYMLINK_OUTSIDE",
              "MISTRAL_LAYOUT_BESIDE",
              # kimi-audit verify: the files' bytes against their references
              "FILE_HASH_MISMATCH", "TENSOR_HASH_MISMATCH", "FILE_ABSENT", "FILE_UNLISTED", "MANIFEST_REVISION",
              "MANIFEST_NOT_WRITTEN", "NO_REFERENCE", "FILE_CHANGED", "CACHE_FILE_NOT_BLOB",
              # the Hub's own parameter count of the files
              "HUB_PARAMETERS"}


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    owns: Callable[[str], bool]


CHECKS: tuple[Check, ...] = (
    Check("header-format", "every shard's safetensors header is well formed",
          lambda c: c in FORMAT_CODES or c.startswith(("HEADER_", "METADATA_", "TENSOR_ENTRY_", "TENSOR_EXTRA_",
                                                       "OFFSETS_"))),
    Check("values", "small tensors' values are finite, scales positive, gains not all zero (--values)",
          lambda c: c.startswith(("VALUE_", "VALUES_")) or c in VALUE_CODES),
    Check("fp8-scales", "every FP8 weight has its weight_scale_inv, of the right dtype and shape",
          lambda c: c.startswith("SCALE_")),
    Check("files-and-index", "shards are readable and agree with model.safetensors.index.json",
          lambda c: c.startswith(("INDEX_", "SHARD_")) or c in FILE_CODES),
    Check("quantization-config", "quantization_config is fp8 / e4m3 / [128, 128]", lambda c: c.startswith("QUANT_")),
    Check("layout", "every tensor the config implies is present with its dtype and shape, and no other",
          lambda c: c in LAYOUT_CODES or c.startswith("BUFFER_")),
    Check("release-gates", "--expect-params / --expect-revision", lambda c: c.endswith("_GATE")),
    Check("gguf", "every GGUF part a well-formed container, the split set whole, the metadata as llama.cpp reads it",
          lambda c: c.startswith("GGUF_")),
    Check("against-source", "the GGUF set against the checkpoint it was converted from (--against)",
          lambda c: c.startswith("AGAINST_")),
)
OTHER = Check("other", "findings of other checks", lambda c: True)
"""A code no check owns: none today (a test checks every code of report.rules); kept so that a new code
without its check is still reported, never dropped."""
SUITE_CODES = frozenset({"IGNORE_UNUSED"})
"""Findings about the run, not the checkpoint: listed in the suite's <system-out>, in no testcase."""


def not_run(check: str, report: AuditReport) -> str | None:
    """Why a check did not run on this report, or None when it ran."""
    if check == "values" and not report.values_checked:
        return "not run: audit --values fetches and checks the small tensors' values"
    if check == "gguf" and report.model.get("container") != "gguf":
        return "not run: not a GGUF checkpoint"
    if check == "against-source" and report.against is None:
        return "not run: no --against"
    if check == "release-gates" and not report.gates_checked:
        return "not run: no --expect-params or --expect-revision"
    return None


def check_of(code: str) -> Check:
    for c in CHECKS:
        if c.owns(code):
            return c
    return OTHER


INVALID_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: object) -> str:
    """Characters XML 1.0 cannot hold (NUL, ESC, ...; names come from untrusted headers) as \\xNN."""
    return INVALID_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def finding_line(f: Finding) -> str:
    """One line of a testcase's failure text: names escaped (bidi overrides and escapes from untrusted headers)."""
    where = printable(f.tensor or f.shard or "")
    return xml_safe(f"{f.severity.value.upper()} {f.code}" + (f" [{where}]" if where else "") +
                    f": {printable(f.message)}")


def _lines(findings: list[Finding]) -> str:
    lines = [finding_line(f) for f in findings[:MAX_LINES]]
    if len(findings) > MAX_LINES:
        lines.append(f"... and {len(findings) - MAX_LINES:,} more (see the JSON report)")
    return "\n".join(lines)


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _summary(findings: list[Finding]) -> str:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    noun = "finding" if len(findings) == 1 else "findings"
    return f"{len(findings):,} {noun}: " + ", ".join(f"{code} ×{n:,}" for code, n in counts.items())


def junit_tree(report: AuditReport, *, fail_on: Severity = Severity.ERROR, elapsed: float = 0.0,
               timestamp: datetime | None = None, hostname: str | None = None) -> ET.Element:
    by_check: dict[str, list[Finding]] = {}
    suite_findings = [f for f in report.findings if f.code in SUITE_CODES]
    for f in report.findings:
        if f.code not in SUITE_CODES:
            by_check.setdefault(check_of(f.code).name, []).append(f)
    checks = list(CHECKS) + ([OTHER] if OTHER.name in by_check else [])
    ts = (timestamp or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None, microsecond=0)

    root = ET.Element("testsuites", name="kimi-audit")
    suite = ET.SubElement(root, "testsuite", name=xml_safe(f"kimi-audit {report.source}"))
    props = ET.SubElement(suite, "properties")
    s = report.stats
    for k, v in (("source", report.source), ("revision", report.revision or ""),
                 ("tool", f"kimi-audit {VERSION}"), ("fail_on", fail_on.value),
                 ("tensors", s.tensors), ("parameters", s.parameters), ("shards", s.shards),
                 ("ignored", len(report.ignored))):
        ET.SubElement(props, "property", name=k, value=xml_safe(v))

    failures = skipped = 0
    cases: list[ET.Element] = []
    classname = xml_safe("kimi_audit." + str(report.model.get("model_type") or "checkpoint"))
    for check in checks:
        mine = by_check.get(check.name, [])
        failing = [f for f in mine if f.severity.rank >= fail_on.rank]
        case = ET.Element("testcase", name=check.name, classname=classname, time="0")
        why = not_run(check.name, report)
        if why is not None and not mine:
            skipped += 1
            ET.SubElement(case, "skipped", message=why)
        if failing:
            failures += 1
            fail = ET.SubElement(case, "failure", message=xml_safe(_summary(failing)), type=xml_safe(failing[0].code))
            fail.text = _lines(failing)
        rest = [f for f in mine if f.severity.rank < fail_on.rank]
        if rest:
            ET.SubElement(case, "system-out").text = _lines(rest)
        cases.append(case)
    if report.q_a_layernorm.width is not None:
        qa = report.q_a_layernorm
        case = ET.Element("testcase", name="q_a_layernorm", classname=classname, time="0")
        lines = [t.line(qa.width or 0) for t in qa.totals]
        if not qa.ok:
            failures += 1
            bad = [r for r in qa.rows if not r.ok]
            fail = ET.SubElement(case, "failure", message=f"{len(bad)} of {len(qa.rows)} gains missing or malformed",
                                 type="Q_A_LAYERNORM")
            fail.text = xml_safe("\n".join(lines + [f"layer {r.layer} ({r.block}): {r.tensor}" for r in bad]))
        else:
            ET.SubElement(case, "system-out").text = "\n".join(lines)
        cases.append(case)
    suite.extend(cases)
    summary = (f"{s.tensors:,} tensors, {s.parameters:,} parameters (scales and buffers excluded), "
               f"{_count(report.errors, 'error')}, {_count(report.warnings, 'warning')}")
    if suite_findings:
        summary += "\n" + _lines(suite_findings)
    ignored = ignored_line(report)
    if ignored is not None:
        lines = [f"{finding_line(f)} (--ignore {xml_safe(by)})"
                 for f, by in zip(report.ignored[:MAX_LINES], report.ignored_by)]
        more = len(report.ignored) - len(lines)
        summary += "\n".join(["", xml_safe(ignored), *lines] + ([f"... and {more:,} more"] if more else []))
    ET.SubElement(suite, "system-out").text = summary
    ET.SubElement(suite, "system-err")
    attrs = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": str(skipped),
             "time": f"{elapsed:.3f}", "timestamp": ts.isoformat(), "hostname": hostname or _hostname(),
             "id": "0", "package": "kimi_audit"}
    suite.attrib.update(attrs)
    root.attrib.update({"tests": attrs["tests"], "failures": attrs["failures"], "errors": "0",
                        "skipped": attrs["skipped"], "time": attrs["time"]})
    return root


def _hostname() -> str:
    try:
        return socket.gethostname() or "localhost"
    except OSError:  # pragma: no cover
        return "localhost"


def render_junit(report: AuditReport, **kw: object) -> str:
    root = junit_tree(report, **kw)  # type: ignore[arg-type]
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render_junit_error(code: str, message: str, source: str, *, elapsed: float = 0.0,
                       timestamp: datetime | None = None, hostname: str | None = None) -> str:
    """The suite when the input could not be audited at all (exit 2): one `input` testcase in <error>, so a CI
    step that reads the JUnit file finds one, and sees why nothing was checked."""
    ts = (timestamp or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None, microsecond=0)
    root = ET.Element("testsuites", name="kimi-audit", tests="1", failures="0", errors="1", skipped="0",
                      time=f"{elapsed:.3f}")
    suite = ET.SubElement(root, "testsuite", name=xml_safe(f"kimi-audit {clip(source)}"), tests="1", failures="0",
                          errors="1", skipped="0", time=f"{elapsed:.3f}", timestamp=ts.isoformat(),
                          hostname=hostname or _hostname(), id="0", package="kimi_audit")
    props = ET.SubElement(suite, "properties")
    for k, v in (("source", clip(source)), ("tool", f"kimi-audit {VERSION}")):
        ET.SubElement(props, "property", name=k, value=xml_safe(v))
    case = ET.SubElement(suite, "testcase", name="input", classname="kimi_audit.checkpoint", time="0")
    ET.SubElement(case, "error", message=xml_safe(clip(message)), type=xml_safe(code)).text = xml_safe(clip(message))
    ET.SubElement(suite, "system-out").text = "the input could not be audited: no check ran"
    ET.SubElement(suite, "system-err")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
