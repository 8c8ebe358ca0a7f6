"""Property-based fuzzing of config.json and model.safetensors.index.json, as test_fuzz_format.py does headers.

Typed random structures (the real keys with values of any JSON type), huge numbers (integers of up to
4,200 digits, floats at the edge of the range), deep nesting and long strings go into the two files of a
real tiny checkpoint. For each:
- the readers (parse_config_bytes, parse_index) return, or raise KimiAuditError only (exit 2);
- the whole audit returns a report or raises KimiAuditError, and the report serializes to JSON;
- every finding code is in docs/reference.md's table, every message one line and clipped;
- the readers allocate a bounded amount (tracemalloc peak <= 64 x the input + 1 MiB);
- the CLI exits 0, 1 or 2, never with a traceback, and exit 2 is one `error:` line.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.constants import CONFIG_FILE, INDEX_FILE
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Finding
from kimi_audit.format.index import IndexFile, parse_index
from kimi_audit.model.config import parse_config_bytes
from kimi_audit.report.json_report import report_dict
from kimi_audit.sources.base import safe_member_name
from kimi_audit.sources.local import LocalSource
from kimi_audit.text import MAX_TEXT
from tiny_checkpoint import TINY_CONFIG, build_tiny

README = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
DOCUMENTED_CODES: set[str] = set()
for a, b in re.findall(r"^\| ([A-Z][A-Z0-9_]+)(?: / ([A-Z][A-Z0-9_]+))? \|", README.read_text(), re.M):
    DOCUMENTED_CODES.update(x for x in (a, b) if x)

# FUZZ_EXAMPLES=2000 for a longer run; the defaults keep the suite fast.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ_CLI = settings(max_examples=max(10, EXAMPLES // 5), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NESTED = "__nested__"
"""A placeholder string replaced in the serialized text by a nesting far deeper than json.dumps can write."""

HUGE_INTS = st.integers(1, 4200).map(lambda d: int("9" * d)) | st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**308])
LONG_STRINGS = st.integers(0, 300_000).map(lambda n: "k" * n) | st.text(min_size=1, max_size=4).map(lambda s: s * 5000)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | HUGE_INTS
    | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1.7976931348623157e308, 5e-324, -0.0])
    | st.text(max_size=12) | LONG_STRINGS | st.just(NESTED)
)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=16
)


def nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def serialize(doc: Any, depth: int) -> bytes:
    text = json.dumps(doc, ensure_ascii=False)
    return text.replace(f'"{NESTED}"', nested_text(depth)).encode("utf-8", "surrogatepass")


QUANT = st.fixed_dictionaries({}, optional={
    "quant_method": st.sampled_from(["fp8", "compressed-tensors", "bitsandbytes"]) | VALUES,
    "fmt": st.sampled_from(["e4m3", "float8_e4m3fn"]) | VALUES,
    "weight_block_size": st.lists(st.integers(-2, 2**40) | HUGE_INTS, max_size=3) | VALUES,
    "activation_scheme": VALUES,
    "config_groups": st.dictionaries(st.text(max_size=6), VALUES, max_size=2) | VALUES,
    "ignore": st.lists(st.text(max_size=20), max_size=4) | VALUES,
})
CONFIGS = st.tuples(
    st.dictionaries(st.sampled_from(sorted(TINY_CONFIG)), VALUES | HUGE_INTS, max_size=5),
    st.none() | QUANT,
    st.sets(st.sampled_from(sorted(TINY_CONFIG)), max_size=3),
    st.integers(1, 200_000),
)


def config_bytes(changes: dict[str, Any], quant: dict[str, Any] | None, dropped: set[str], depth: int) -> bytes:
    doc = {k: v for k, v in {**TINY_CONFIG, **changes}.items() if k not in dropped}
    if quant is not None:
        doc["quantization_config"] = quant
    return serialize(doc, depth)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("fuzz-tiny") / "ckpt")


def tiny_index(tiny: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((tiny / INDEX_FILE).read_text())
    return doc


SHARD_NAMES = st.sampled_from(["model-1-of-3.safetensors", "model-2-of-3.safetensors", "model-3-of-3.safetensors",
                               "absent.safetensors", "../up.safetensors", "/etc/passwd", "a//b", ""])
INDEXES = st.tuples(
    st.integers(0, 200),  # how many of the real entries to keep
    st.dictionaries(st.text(max_size=30) | LONG_STRINGS, SHARD_NAMES | st.text(max_size=12) | VALUES, max_size=6),
    st.none() | VALUES | st.fixed_dictionaries({"total_size": VALUES | HUGE_INTS}),
    st.dictionaries(st.text(max_size=8), VALUES, max_size=2),
    st.integers(1, 200_000),
)


def index_bytes(tiny: Path, keep: int, extra: dict[str, Any], meta: Any, top: dict[str, Any], depth: int) -> bytes:
    real = list(tiny_index(tiny)["weight_map"].items())[:keep]
    doc = {**top, "metadata": meta, "weight_map": {**dict(real), **extra}}
    return serialize(doc, depth)


def check_findings(findings: tuple[Finding, ...] | list[Finding]) -> None:
    for f in findings:
        assert f.code in DOCUMENTED_CODES, f"finding code {f.code} is not in docs/reference.md's table"
        assert isinstance(f.message, str) and "\n" not in f.message
        assert len(f.message) <= MAX_TEXT + 40


def peak(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def read_config(raw: bytes) -> None:
    try:
        parse_config_bytes(raw)
    except KimiAuditError as e:
        assert "\n" not in str(e) or len(str(e)) < 100_000


def check_index(raw: bytes) -> IndexFile:
    ix = parse_index(raw, INDEX_FILE)
    assert isinstance(ix, IndexFile)
    check_findings(ix.findings)
    for shard in set(ix.weight_map.values()):
        assert safe_member_name(shard) == shard
    assert ix.total_size is None or (type(ix.total_size) is int and ix.total_size >= 0)
    return ix


def audit_with(tiny: Path, config: bytes | None = None, index: bytes | None = None) -> None:
    """The whole audit on the tiny shards (hard links) with the given config.json and index."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for f in tiny.iterdir():
            if f.suffix == ".safetensors":
                os.link(f, d / f.name)
        (d / CONFIG_FILE).write_bytes(config if config is not None else (tiny / CONFIG_FILE).read_bytes())
        (d / INDEX_FILE).write_bytes(index if index is not None else (tiny / INDEX_FILE).read_bytes())
        try:
            report = audit_source(LocalSource(d))
        except KimiAuditError:
            return
        check_findings(report.findings)
        json.dumps(report_dict(report))


def cli_audit(tiny: Path, config: bytes | None = None, index: bytes | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for f in tiny.iterdir():
            if f.suffix == ".safetensors":
                os.link(f, d / f.name)
        (d / CONFIG_FILE).write_bytes(config if config is not None else (tiny / CONFIG_FILE).read_bytes())
        (d / INDEX_FILE).write_bytes(index if index is not None else (tiny / INDEX_FILE).read_bytes())
        for extra in ([], ["--json"]):
            r = CliRunner().invoke(app, ["audit", str(d), "--no-progress", *extra])
            assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)[:500]
            assert "Traceback" not in r.output and r.exit_code in (0, 1, 2, 3)
            if r.exit_code == 2 and not extra:
                lines = [line for line in r.output.splitlines() if line.strip()]
                assert len(lines) == 1 and lines[0].startswith("error:"), r.output[-1000:]
            elif extra:
                doc = json.loads(r.stdout)
                assert ("error" in doc) is (r.exit_code == 2)


# --- config.json ----------------------------------------------------------------------------------

@FUZZ
@given(CONFIGS)
def test_config_reader_never_raises_but_config_errors(case: tuple[Any, ...]) -> None:
    raw = config_bytes(*case)
    read_config(raw)
    assert peak(lambda: read_config(raw)) <= 64 * len(raw) + (1 << 20)


@FUZZ
@given(CONFIGS)
def test_audit_with_a_fuzzed_config(tiny: Path, case: tuple[Any, ...]) -> None:
    audit_with(tiny, config=config_bytes(*case))


@FUZZ_CLI
@given(CONFIGS)
def test_cli_with_a_fuzzed_config(tiny: Path, case: tuple[Any, ...]) -> None:
    cli_audit(tiny, config=config_bytes(*case))


@FUZZ
@given(VALUES)
def test_config_that_is_any_json_document(value: Any) -> None:
    read_config(serialize(value, 1000))


# --- model.safetensors.index.json -----------------------------------------------------------------

@FUZZ
@given(INDEXES)
def test_index_reader_never_raises_and_keeps_only_safe_names(tiny: Path, case: tuple[Any, ...]) -> None:
    raw = index_bytes(tiny, *case)
    check_index(raw)
    assert peak(lambda: parse_index(raw, INDEX_FILE)) <= 64 * len(raw) + (1 << 20)


@FUZZ
@given(INDEXES)
def test_audit_with_a_fuzzed_index(tiny: Path, case: tuple[Any, ...]) -> None:
    audit_with(tiny, index=index_bytes(tiny, *case))


@FUZZ_CLI
@given(INDEXES)
def test_cli_with_a_fuzzed_index(tiny: Path, case: tuple[Any, ...]) -> None:
    cli_audit(tiny, index=index_bytes(tiny, *case))


@FUZZ
@given(VALUES, st.binary(max_size=64))
def test_index_that_is_any_json_document_or_bytes(value: Any, junk: bytes) -> None:
    check_index(serialize(value, 1000))
    check_index(junk)


@pytest.mark.parametrize("depth", [127, 128, 10_000, 1_000_000])
def test_deep_nesting_is_bounded(tiny: Path, depth: int) -> None:
    deep = nested_text(depth).encode()
    read_config(b'{"hidden_size": ' + deep + b"}")
    check_index(b'{"weight_map": {}, "metadata": ' + deep + b"}")
    audit_with(tiny, config=b'{"quantization_config": ' + deep + b"}")
