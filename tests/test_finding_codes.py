"""Every finding code has a test that names it: the code table (report.rules.RULES, which docs/reference.md's tables and
tests/test_sarif.py keep equal to what the package can emit) against the string literals of the test modules;
and a test for each code no other module named."""

from __future__ import annotations

import ast
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.errors import SourceError
from kimi_audit.format.header import parse_shard_prefix, read_shard_header
from kimi_audit.report.rules import RULES
from kimi_audit.sources import LocalSource
from kimi_audit.sources.base import RangeRead
from shard_builder import entry, header_json, shard_bytes, write_shard
from tiny_checkpoint import tiny_shards, write_tiny

VALID = {"__metadata__": {"format": "pt"}, "a": entry("BF16", [2, 3], 0, 12), "b": entry("F32", [2], 12, 20)}

TESTS = Path(__file__).resolve().parent
WORD = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")


def named_codes(path: Path) -> set[str]:
    """The upper-case snake words in the module's string literals (f-strings' literal parts included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(WORD.findall(node.value))
    return names


def test_every_finding_code_is_named_by_a_test() -> None:
    named: set[str] = set()
    for path in TESTS.glob("test_*.py"):
        named |= named_codes(path)
    missing = sorted(set(RULES) - named)
    assert not missing, f"finding codes no test names: {missing}"


def test_the_scan_sees_a_code_only_in_a_string(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text('NOT_A_CODE = 1\nassert codes == ["FAKE_CODE"]\nmsg = f"{x} OTHER_FAKE here"\n')
    assert named_codes(probe) == {"FAKE_CODE", "OTHER_FAKE"}


# --- the codes no other test named: each one provoked, its finding checked ------------------------------------

S2 = "model-2-of-3.safetensors"
L1 = "model.layers.1."


def run(*args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def findings_of(report: Any, code: str) -> list[tuple[str | None, str | None, str]]:
    return [(f.tensor, f.shard, f.severity.value) for f in report.findings if f.code == code]


def tiny_with(tmp_path: Path, mutate: Callable[[dict[str, dict[str, np.ndarray]]], None]) -> Path:
    shards = tiny_shards()
    mutate(shards)
    return write_tiny(tmp_path / "ckpt", shards)


def test_header_trailing_whitespace_is_a_warning() -> None:
    raw = shard_bytes(header_json(VALID) + b"\n\t", 20)  # then space padding, as the format pads
    h = parse_shard_prefix(raw, shard="s.safetensors", file_size=len(raw))
    assert [(f.code, f.severity.value) for f in h.findings] == [("HEADER_TRAILING_WHITESPACE", "warning")]
    assert h.ok and set(h.tensors) == {"a", "b"}


class ShortReads(LocalSource):
    """A source that answers at most 16 bytes a read while the file is longer (a server cutting bodies short
    without an error)."""

    def read_range(self, name: str, start: int, length: int) -> RangeRead:
        got = super().read_range(name, start, length)
        return RangeRead(got.data[:16], got.file_size)


def test_a_header_that_cannot_be_read_whole_is_a_short_read(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.safetensors", VALID)
    h = read_shard_header(ShortReads(tmp_path), "s.safetensors")
    n = len(header_json(VALID)) + (-len(header_json(VALID)) % 8)
    assert [(f.code, f.severity.value) for f in h.findings] == [("HEADER_SHORT_READ", "error")]
    assert f"only 24 of {n:,} header bytes" in h.findings[0].message  # 16 + 16 read, less the 8-byte length
    assert not h.ok
    assert read_shard_header(LocalSource(tmp_path), "s.safetensors").findings == ()


def test_index_duplicate_key(tiny_copy: Path) -> None:
    index = tiny_copy / INDEX_FILE
    name = L1 + "mlp.gate.weight"
    text = index.read_text()
    entry = f'"{name}": "{json.loads(text)["weight_map"][name]}"'
    index.write_text(text.replace("\"weight_map\": {", "\"weight_map\": {" + entry + ", ", 1))
    assert text.count(entry) == 1 and index.read_text().count(entry) == 2
    report = audit_source(LocalSource(tiny_copy))
    assert findings_of(report, "INDEX_DUPLICATE_KEY") == [(name, INDEX_FILE, "error")]
    assert report.exit_code() == 1


def test_buffer_of_another_dtype(tmp_path: Path) -> None:
    name = L1 + "self_attn.rotary_emb.inv_freq"
    d = tiny_with(tmp_path, lambda s: s[S2].__setitem__(name, np.ones(8, np.float32)))  # the shape is right
    report = audit_source(LocalSource(d))
    # info, as BUFFER_SHAPE (test_checks): every loader drops a stored buffer, so it is not a fault
    assert [(f.code, f.tensor, f.shard, f.severity.value) for f in report.findings] == [
        ("BUFFER_DTYPE", name, S2, "info")]
    assert (report.findings[0].expected, report.findings[0].actual) == ("BF16", "F32")


def test_quantization_metadata_beside_a_weight_the_layout_keeps_unquantized(tmp_path: Path) -> None:
    name = L1 + "mlp.gate.weight_scale_inv"  # the router's weight is BF16: it has no scale
    d = tiny_with(tmp_path, lambda s: s[S2].__setitem__(name, np.ones((1, 3), np.float32)))
    report = audit_source(LocalSource(d))
    assert findings_of(report, "SCALE_UNEXPECTED") == [(name, S2, "error")]
    assert not {"SCALE_ORPHAN", "TENSOR_UNEXPECTED"} & {f.code for f in report.findings}


def test_a_small_tensor_whose_bytes_cannot_be_read_is_value_unreadable(
    tiny_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tiny_copy / S2, "rb") as f:
        data_start = 8 + struct.unpack("<Q", f.read(8))[0]
    read_range = LocalSource.read_range

    def failing(self: LocalSource, name: str, start: int, length: int) -> RangeRead:
        if name == S2 and start >= data_start:
            raise SourceError(f"{name}: input/output error (injected)")
        return read_range(self, name, start, length)

    monkeypatch.setattr(LocalSource, "read_range", failing)
    code, doc = run("audit", str(tiny_copy), "--values", "--no-progress", "--json")
    unreadable = [f for f in doc["findings"] if f["code"] == "VALUE_UNREADABLE"]
    assert unreadable and {(f["shard"], f["severity"]) for f in unreadable} == {(S2, "error")}
    assert "input/output error (injected)" in unreadable[0]["message"]
    assert code == 1


def test_a_plain_directory_verifies_with_no_reference(tiny_copy: Path) -> None:
    code, doc = run("verify", str(tiny_copy), "--json", "--no-progress")
    (f,) = [f for f in doc["findings"] if f["code"] == "NO_REFERENCE"]
    files = sorted(p.name for p in tiny_copy.iterdir())
    assert f["severity"] == "info" and f["actual"] == len(files) and files[0] in f["message"]
    assert code == 0


def test_a_manifest_is_not_written_of_a_copy_that_differs(tiny_copy: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    code, _ = run("verify", str(tiny_copy), "--write-manifest", str(good), "--json", "--no-progress")
    assert code == 0 and good.is_file()
    with open(tiny_copy / S2, "r+b") as f:  # one byte of the last tensor's data
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))
    again = tmp_path / "again.json"
    code, doc = run("verify", str(tiny_copy), "--manifest", str(good), "--write-manifest", str(again), "--json",
                    "--no-progress")
    (f,) = [f for f in doc["findings"] if f["code"] == "MANIFEST_NOT_WRITTEN"]
    assert f["severity"] == "error" and f["actual"] == 1 and S2 in f["message"]
    assert code == 1 and not again.exists()
