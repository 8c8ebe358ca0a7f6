"""Hostile input, the edges (issue 21, items 8, 10, 11, 13, 14): no hang on a config's regex, one finding per
cause, no traceback when stdout is unusable, CI report files written even when the input is unusable.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_audit.cli import app
from kimi_audit.errors import ConfigError
from kimi_audit.model.patterns import compile_patterns
from kimi_audit.model.quant.dispatch import quant_plan

ROOT = Path(__file__).resolve().parents[1]
THINKING_QUANT = json.loads((ROOT / "kimi_audit" / "data" / "kimi-k2-thinking.config.json").read_text())[
    "quantization_config"]


def invoke(*argv: str):  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(app, list(argv))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)[:500]
    assert "Traceback" not in r.output
    return r


def run_cli(*argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess[bytes]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kimi_audit", *argv], env=env, timeout=timeout,
                          capture_output=kwargs.pop("capture_output", True), **kwargs)


# --- item 8: a config's regex never backtracks -------------------------------------------------------

EVIL_PATTERN = "re:(.|.)*X"
"""Exponential for a backtracking engine: ~2^n steps for a module name of n characters that holds no X."""


def test_a_catastrophic_ignore_pattern_is_matched_in_linear_time(tiny_copy: Path) -> None:
    """The audit of a checkpoint whose compressed-tensors `ignore` holds `re:(.|.)*X` finishes (it matched
    every ~40-character module name against it; Python's `re` takes ~2^40 steps per name, so the old code
    never returned before the subprocess timeout)."""
    cfg = json.loads((tiny_copy / "config.json").read_text())
    cfg["quantization_config"] = dict(THINKING_QUANT, ignore=["lm_head", EVIL_PATTERN])
    (tiny_copy / "config.json").write_text(json.dumps(cfg))
    r = run_cli("audit", str(tiny_copy), "--json", "--no-progress", timeout=240)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert json.loads(r.stdout)["model"]["quantization"]["bits"] == 4


def test_the_patterns_match_from_the_start_of_the_name_as_compressed_tensors() -> None:
    """compressed-tensors matches `re:` entries with re.match (utils/match.py): anchored at the start only."""
    plan = quant_plan(dict(THINKING_QUANT, ignore=["re:.*experts\\.1[0-9]\\..*", EVIL_PATTERN]), "BF16")
    assert plan is not None
    assert plan.scheme_for("model.layers.3.mlp.experts.12.up_proj") is plan.plain
    assert plan.scheme_for("model.layers.3.mlp.experts.2.up_proj") is plan.quantized
    assert plan.scheme_for("model.layers.3.mlp.experts.2.X") is plan.plain  # (.|.)*X from the start
    assert plan.scheme_for("model.layers.3.mlp.experts.2.Xy") is plan.plain  # re.match: a prefix is enough
    assert plan.scheme_for("model.layers.3.mlp.experts.2.up_proj") is plan.quantized  # no X anywhere


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=a)b", "(?<!a)b", "(", "a{1001}" * 50])
def test_a_pattern_re2_cannot_compile_is_a_config_error_naming_it(pattern: str) -> None:
    """Back-references and look-around (a backtracking engine's features), syntax errors and programs over
    RE2's memory bound are refused, with the pattern in the message: never a fallback to `re`."""
    with pytest.raises(ConfigError, match="RE2") as e:
        quant_plan(dict(THINKING_QUANT, ignore=["re:" + pattern]), "BF16")
    assert e.value.code == "CONFIG_INVALID"
    assert repr(pattern[:20])[1:-1] in str(e.value) or pattern[:20] in str(e.value)


def test_no_patterns_no_program() -> None:
    assert compile_patterns([], "x") is None


# --- item 10: one cause, one finding -----------------------------------------------------------------

SHARD = "model-3-of-3.safetensors"


def add_entries(ckpt: Path, entries: dict[str, dict]) -> None:  # type: ignore[type-arg]
    """Append header entries (one byte of data each, at the end of the buffer) to the last shard, not to the
    index."""
    p = ckpt / SHARD
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    for i, (name, entry) in enumerate(entries.items()):
        header[name] = {**entry, "data_offsets": [len(body) + i, len(body) + i + 1]}
    text = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(text)) + text + body + b"\1" * len(entries))


def test_an_invalid_entry_is_one_finding_not_also_unexpected_or_unindexed(tiny_copy: Path) -> None:
    add_entries(tiny_copy, {"bad.0.weight": {"dtype": "XX", "shape": [1]},
                            "bad.1.weight": {"dtype": "U8", "shape": [[1]]},
                            "bad.2.weight": {"dtype": "U8", "shape": [1] * 65},
                            "good.weight": {"dtype": "U8", "shape": [1]}})
    r = invoke("audit", str(tiny_copy), "--json", "--no-progress")
    by_tensor: dict[str, list[str]] = {}
    for f in json.loads(r.output)["findings"]:
        by_tensor.setdefault(f.get("tensor") or "", []).append(f["code"])
    assert by_tensor["bad.0.weight"] == ["DTYPE_UNKNOWN"]
    assert by_tensor["bad.1.weight"] == by_tensor["bad.2.weight"] == ["SHAPE_INVALID"]
    # a valid entry stored where it does not belong is still both unexpected and missing from the index
    assert sorted(by_tensor["good.weight"]) == ["INDEX_ENTRY_MISSING", "TENSOR_UNEXPECTED"]


# --- item 13: markdown autolinks ---------------------------------------------------------------------


def test_markdown_does_not_autolink_urls_domains_or_addresses_in_names(tiny_copy: Path) -> None:
    """GitHub's autolink extension links a bare `https://...`, `www....` or `a@b.c` in plain text: in a tensor
    name (every message quotes it) they are shown, not linked."""
    from kimi_audit.checks.audit import audit_source
    from kimi_audit.report.markdown import render_markdown
    from kimi_audit.sources.local import LocalSource

    add_entries(tiny_copy, {"x.https://evil.example/p.weight": {"dtype": "U8", "shape": [1]},
                            "y.www.evil.example.weight": {"dtype": "U8", "shape": [1]},
                            "z.admin@evil.example.weight": {"dtype": "U8", "shape": [1]}})
    md = render_markdown(audit_source(LocalSource(tiny_copy)))
    prose = re.sub(r"`[^`\n]*`", "", md)  # code spans read no links
    assert "evil" in prose
    assert not re.search(r"[A-Za-z0-9]://", prose) and not re.search(r"(?i)(?<![a-z0-9])www\.", prose)
    assert not re.search(r"(?<!\\)@", prose)
    assert "https\\://evil.example" in prose and "www\\.evil" in prose and "admin\\@evil" in prose


# --- item 11: a stdout that cannot be written --------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists() or sys.platform == "win32", reason="needs /dev/full and a shell")
@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
@pytest.mark.parametrize("fmt", ["table", "json", "sarif"])
def test_an_unwritable_stdout_is_one_line_and_exit_120(tiny_dir: Path, redirect: str, fmt: str) -> None:
    """stdout closed (`>&-`: Python's sys.stdout is None) or on a full device: no AttributeError/OSError
    traceback but one line on stderr and exit code 120, what Python exits with when stdout cannot be flushed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    line = f'"{sys.executable}" -m kimi_audit audit "{tiny_dir}" --no-progress --format {fmt} {redirect}'
    r = subprocess.run(["bash", "-c", line], env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 120, r.stderr[-2000:]
    assert r.stderr.decode().splitlines() == [
        "error: cannot write to stdout: " + ("it is closed" if redirect == ">&-" else "No space left on device")]


def test_a_closed_pipe_is_still_141(tiny_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "kimi_audit", "audit", str(tiny_dir), "--no-progress", "--json"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    assert p.wait(timeout=120) == 141
    assert b"Traceback" not in p.stderr.read()


# --- item 11: the memory pre-check honours every limit -----------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc are Linux's")
def test_the_memory_figure_honours_the_address_space_limit() -> None:
    """Under `ulimit -v` (RLIMIT_AS) an allocation fails beyond the limit whatever MemAvailable says: the
    figure the pre-check compares with is at most the limit."""
    limit = 3 << 30
    code = ("import resource; from kimi_audit.numerics.tensor_io import available_memory; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, resource.RLIM_INFINITY)); print(available_memory())")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, timeout=120, check=True)
    assert 0 < int(r.stdout) <= limit


def test_the_memory_figure_honours_cgroup_limits(tmp_path: Path) -> None:
    from kimi_audit.numerics.tensor_io import cgroup_room

    v2 = tmp_path / "v2"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("1000000\n")
    (v2 / "job" / "memory.current").write_text("400000\n")
    (v2 / "job" / "step" / "memory.max").write_text("max\n")
    (v2 / "job" / "step" / "memory.current").write_text("300000\n")
    (tmp_path / "cgroup2").write_text("0::/job/step\n")
    assert cgroup_room(str(v2), str(tmp_path / "cgroup2")) == 600_000  # the parent's limit binds
    v1 = tmp_path / "v1"
    (v1 / "memory" / "box").mkdir(parents=True)
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text("5000000\n")
    (v1 / "memory" / "box" / "memory.usage_in_bytes").write_text("1000000\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (tmp_path / "cgroup1").write_text("5:cpu,cpuacct:/box\n4:memory:/box\n0::/\n")
    assert cgroup_room(str(v1), str(tmp_path / "cgroup1")) == 4_000_000
    (tmp_path / "none").write_text("0::/\n")
    assert cgroup_room(str(v2), str(tmp_path / "none")) is None  # no limit anywhere: no figure


def test_the_pre_check_refuses_what_the_cgroup_cannot_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi_audit.numerics import tensor_io

    monkeypatch.setattr(tensor_io, "cgroup_room", lambda: 1 << 30)
    with pytest.raises(tensor_io.NotEnoughMemoryError, match=r"1\.0 GiB available"):
        tensor_io.check_memory(2 << 30, "dequantizing x")


# --- item 14: CI reports ------------------------------------------------------------------------------


def test_junit_has_the_same_testcases_whatever_the_findings(tiny_dir: Path) -> None:
    """A stale --ignore (IGNORE_UNUSED) is listed in the suite's <system-out>, not as an undocumented extra
    `other` testcase; and no finding code falls to `other`."""
    import xml.etree.ElementTree as ET

    def cases(*extra: str) -> tuple[list[str], str]:
        r = invoke("audit", str(tiny_dir), "--no-progress", "--format", "junit", *extra)
        suite = ET.fromstring(r.output).find("testsuite")
        assert suite is not None
        out = suite.find("system-out")
        return [c.get("name") or "" for c in suite.iter("testcase")], (out.text or "") if out is not None else ""

    plain, _ = cases()
    stale, text = cases("--ignore", "SCALE_MISSING")
    assert stale == plain and "other" not in stale
    assert "IGNORE_UNUSED: --ignore SCALE_MISSING matched no finding" in text
    from kimi_audit.report.junit import OTHER, SUITE_CODES, check_of
    from kimi_audit.report.rules import RULES

    assert [c for c in RULES if c not in SUITE_CODES and check_of(c) is OTHER] == []


@pytest.mark.parametrize("fmt", ["sarif", "junit", "json"])
def test_an_unusable_input_still_leaves_the_ci_report(tiny_copy: Path, tmp_path: Path, fmt: str) -> None:
    """Exit 2 (config.json not JSON) with --output: the file exists and holds the error in its format, so a
    CI upload step does not fail on a missing file."""
    import xml.etree.ElementTree as ET

    (tiny_copy / "config.json").write_text("{")
    out = tmp_path / f"report.{fmt}"
    r = invoke("audit", str(tiny_copy), "--no-progress", "--format", fmt, "--output", str(out))
    assert r.exit_code == 2
    text = out.read_text()
    if fmt == "sarif":
        run = json.loads(text)["runs"][0]
        assert run["results"] == [] and run["invocations"][0]["executionSuccessful"] is False
        note = run["invocations"][0]["toolExecutionNotifications"][0]
        assert note["descriptor"]["id"] == "CONFIG_INVALID" and "not valid JSON" in note["message"]["text"]
    elif fmt == "junit":
        suite = ET.fromstring(text).find("testsuite")
        assert suite is not None and suite.get("errors") == "1"
        error = suite.find("testcase/error")
        assert error is not None and error.get("type") == "CONFIG_INVALID"
    else:
        assert json.loads(text) == {"error": {"code": "CONFIG_INVALID", "message": json.loads(
            r.stdout.splitlines()[-1])["error"]["message"]}, "exit_code": 2}


def test_an_unusable_input_on_stdout_is_a_sarif_document(tmp_path: Path) -> None:
    r = invoke("audit", str(tmp_path / "absent"), "--no-progress", "--format", "sarif")
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["descriptor"]["id"] == "FILE_MISSING"


def test_the_error_report_is_never_written_into_the_checkpoint(tiny_copy: Path) -> None:
    (tiny_copy / "config.json").write_text("{")
    out = tiny_copy / "report.sarif"
    assert invoke("audit", str(tiny_copy), "--no-progress", "--format", "sarif", "-o", str(out)).exit_code == 2
    assert not out.exists()
    # and an --output that names an input is refused before anything is read or written
    index = tiny_copy / "model.safetensors.index.json"
    before = index.read_bytes()
    assert invoke("audit", str(tiny_copy), "--no-progress", "--format", "sarif", "-o", str(index)).exit_code == 2
    assert index.read_bytes() == before


def test_a_manifest_that_cannot_be_written_keeps_the_report(tiny_copy: Path, tmp_path: Path) -> None:
    """verify --write-manifest into a directory that does not exist: the report of what was verified is still
    printed, the failure is its MANIFEST_NOT_WRITTEN finding, exit 1 (before: exit 2 and no report)."""
    target = tmp_path / "absent" / "manifest.json"
    r = invoke("verify", str(tiny_copy), "--write-manifest", str(target), "--json", "--no-progress")
    assert r.exit_code == 1, r.output[-2000:]
    doc = json.loads(r.stdout)
    assert doc["manifest_written"] is None and len(doc["files"]) >= 4
    (finding,) = [f for f in doc["findings"] if f["code"] == "MANIFEST_NOT_WRITTEN"]
    assert "cannot write the manifest" in finding["message"] and str(target) in finding["message"]
    assert not target.exists()


def test_the_api_progress_counts_headers_only_even_with_values(tiny_dir: Path) -> None:
    """`progress` keeps one meaning, (shard, shards done, shards total), with values=True too; the values
    phase reports to `values_progress` (shard, tensors done, tensors total)."""
    import kimi_audit

    shards = sorted(p.name for p in tiny_dir.glob("*.safetensors"))
    only: list[tuple[str, int, int]] = []
    kimi_audit.audit(tiny_dir, values=True, progress=lambda *a: only.append(a))
    assert [t for _, _, t in only] == [len(shards)] * len(shards)  # before: tensor counts followed
    headers: list[tuple[str, int, int]] = []
    values: list[tuple[str, int, int]] = []
    kimi_audit.audit(tiny_dir, values=True, progress=lambda *a: headers.append(a),
                     values_progress=lambda *a: values.append(a))
    assert sorted(s for s, _, _ in headers) == shards
    assert [(d, t) for _, d, t in headers] == [(i, len(shards)) for i in range(1, len(shards) + 1)]
    assert values and values[-1][1] == values[-1][2] > len(shards)


@pytest.mark.parametrize("patterns", [[r".*self_attn.*"], [r"[^x]*q"], [r""], [r"model\.layers\.1[0-9]\."],
                                      [r".*experts\.(1|2)\.", r"lm_head"], [r".*X"]])
def test_matching_many_names_in_one_scan_equals_one_at_a_time(patterns: list[str]) -> None:
    """The layout asks for every module of a layer at once (one RE2 scan over the names joined by newlines):
    the answers equal re.match's, one name at a time, patterns that could cross a newline included."""
    import re

    names = [f"model.layers.{i}.{m}" for i in (0, 1, 12, 20) for m in
             ("self_attn.q_a_proj", "mlp.experts.1.up_proj", "mlp.experts.2.down_projX", "mlp.gate_proj")]
    names += ["lm_head", "q", "zz", "xq"]
    compiled = compile_patterns(patterns, "test")
    assert compiled is not None
    want = [any(re.match(p, n) for p in patterns) for n in names]
    assert compiled.match_many(names) == want == [compiled.match(n) for n in names]
