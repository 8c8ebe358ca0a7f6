"""Hostile input (issue 21, items 7, 9, 10, 11, 13, 14): no hang, no traceback, cost bounded by the input.

- a FIFO (or any non-regular file) where a shard, config.json or index.json should be is one clear error
  or finding for `audit` and `verify`, never a blocked open();
- a shape of more than 64 dims (numpy's limit) or one whose size overflows 64 bits is SHAPE_INVALID, and
  no command (audit in every format, params, diff, tensor) computes or prints a number from it;
- an index naming more distinct shard files than any checkpoint has is refused whole; a finding's
  message is clipped where it is made; a megabyte dtype string is not printed whole;
- diff, tensor and markdown print untrusted names with terminal escapes, markup, HTML, link syntax and
  bidi overrides neutralised; a symlinked HF cache ref leaks nothing of its target;
- `audit PATH/config.json` audits PATH; `kimi_audit.audit("")` is an error.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kimi_audit
from kimi_audit.checks.audit import audit_source
from kimi_audit.cli import app
from kimi_audit.constants import INDEX_FILE
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import error
from kimi_audit.format.header import parse_shard_prefix
from kimi_audit.format.index import MAX_INDEX_SHARDS, parse_index
from kimi_audit.report.markdown import render_markdown
from kimi_audit.sources.cache import CacheMissError, find_snapshot
from kimi_audit.sources.local import LocalSource
from kimi_audit.text import MAX_TEXT

SHARD = "model-3-of-3.safetensors"


def invoke(*argv: str):  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(app, list(argv))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)[:500]
    assert "Traceback" not in r.output
    return r


def add_tensor(ckpt: Path, name: str, entry: dict, data: bytes = b"") -> None:  # type: ignore[type-arg]
    """Append one entry (its offsets at the end of the data buffer) to the last shard and the index."""
    p = ckpt / SHARD
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    header[name] = {**entry, "data_offsets": [len(body), len(body) + len(data)]}
    text = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(text)) + text + body + data)
    index = json.loads((ckpt / INDEX_FILE).read_text())
    index["weight_map"][name] = SHARD
    (ckpt / INDEX_FILE).write_text(json.dumps(index))


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output[-2000:]
    return lines[0]


# --- item 7: non-regular files never block ---------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("which", [SHARD, "config.json", INDEX_FILE])
@pytest.mark.parametrize("command", ["audit", "verify"])
def test_a_fifo_in_the_checkpoint_is_refused_not_waited_on(tiny_copy: Path, which: str, command: str) -> None:
    (tiny_copy / which).unlink()
    os.mkfifo(tiny_copy / which)
    # Run apart: the unfixed reader blocks in open() forever. The timeout only guards against that hang.
    r = subprocess.run([sys.executable, "-m", "kimi_audit", command, str(tiny_copy), "--no-progress", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr
    assert "FIFO" in r.stdout + r.stderr
    if which == SHARD:  # one shard unreadable: a finding, the rest audited
        assert r.returncode == 1
        assert any(f["code"] == "SHARD_UNREADABLE" and "FIFO" in f["message"] for f in json.loads(r.stdout)["findings"])
    else:
        assert r.returncode == 2
        assert json.loads(r.stdout)["error"]["code"] == "NOT_REGULAR_FILE"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_as_an_hf_cache_ref_is_no_ref(tmp_path: Path) -> None:
    folder = tmp_path / "models--o--n"
    (folder / "refs").mkdir(parents=True)
    os.mkfifo(folder / "refs" / "main")
    code = ("import sys, pathlib; from kimi_audit.sources.cache import find_snapshot; "
            "find_snapshot('o/n', 'main', pathlib.Path(sys.argv[1]))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "CacheMissError" in r.stderr and "no cached snapshot" in r.stderr


def test_a_directory_named_like_a_shard_is_a_finding(tiny_copy: Path) -> None:
    (tiny_copy / "extra.safetensors").mkdir()
    (tiny_copy / "extra.safetensors" / "x").write_text("x")
    r = invoke("audit", str(tiny_copy), "--no-progress", "--json")
    assert r.exit_code in (0, 1)


# --- item 13: the HF cache's refs ------------------------------------------------------------------

def test_a_symlinked_ref_leaks_nothing_of_its_target(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRETVALUE-0123456789")
    folder = tmp_path / "cache" / "models--o--n"
    (folder / "refs").mkdir(parents=True)
    (folder / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (folder / "refs" / "main").symlink_to(secret)
    with pytest.raises(CacheMissError) as ei:
        find_snapshot("o/n", "main", tmp_path / "cache")
    assert "TOPSECRET" not in str(ei.value) and "main -> ?" in str(ei.value)


def test_a_ref_that_is_not_a_commit_is_not_quoted(tmp_path: Path) -> None:
    folder = tmp_path / "models--o--n"
    (folder / "refs").mkdir(parents=True)
    (folder / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (folder / "refs" / "main").write_text("\x1b[2Jnot-a-commit")
    with pytest.raises(CacheMissError) as ei:
        find_snapshot("o/n", "main", tmp_path)
    assert "not-a-com" not in str(ei.value) and "\x1b" not in str(ei.value)


# --- item 14: what the path names ------------------------------------------------------------------

def test_an_empty_path_is_an_error_not_the_current_directory(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tiny_dir)  # a checkpoint right here: the old reading audited it silently
    with pytest.raises(KimiAuditError, match="empty path"):
        kimi_audit.audit("")
    r = invoke("audit", "", "--no-progress")
    assert r.exit_code == 2 and "empty path" in one_error_line(r.output)


@pytest.mark.parametrize("name", ["config.json", INDEX_FILE])
def test_the_config_or_index_stands_for_its_directory(tiny_dir: Path, name: str) -> None:
    whole = kimi_audit.audit(tiny_dir)
    via = kimi_audit.audit(tiny_dir / name)
    assert via.verdict() == whole.verdict() == "PASS"
    assert via.stats.shards == whole.stats.shards == 3 and via.stats.parameters == whole.stats.parameters


# --- item 9 and 11: huge ranks and sizes -----------------------------------------------------------

def header_of(shape: list[int], nbytes: int = 1) -> bytes:
    raw = json.dumps({"t": {"dtype": "U8", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * nbytes


@pytest.mark.parametrize("shape", [[1] * 65, [1] * 20_000, [2] * 20_000, [2**32, 2**32, 2**32], [1] * 10**6])
def test_a_shape_beyond_numpy_or_64_bits_is_invalid_and_not_kept(shape: list[int]) -> None:
    data = header_of(shape)
    h = parse_shard_prefix(data, shard="f", file_size=len(data))
    codes = [f.code for f in h.findings]
    assert codes == ["SHAPE_INVALID"], codes
    assert h.tensors["t"].shape == ()  # nothing downstream multiplies or prints those dims
    assert len(h.findings[0].message) < 300


def test_64_dims_are_still_fine() -> None:
    data = header_of([1] * 64)
    h = parse_shard_prefix(data, shard="f", file_size=len(data))
    assert h.ok and h.tensors["t"].shape == (1,) * 64


@pytest.fixture
def huge_rank(tiny_copy: Path) -> Path:
    add_tensor(tiny_copy, "evil.weight", {"dtype": "U8", "shape": [2] * 19_999 + [1]}, b"\1")
    add_tensor(tiny_copy, "deep.weight", {"dtype": "U8", "shape": [1] * 65}, b"\1")
    return tiny_copy


@pytest.mark.parametrize("argv", [
    ["audit", "{d}", "--no-progress"], ["audit", "{d}", "--no-progress", "--json"],
    ["audit", "{d}", "--no-progress", "--format", "sarif"], ["audit", "{d}", "--no-progress", "--format", "markdown"],
    ["params", "{d}"], ["diff", "{tiny}", "{d}", "--no-progress"], ["diff", "{tiny}", "{d}", "--json", "--no-progress"],
])
def test_no_command_tracebacks_on_a_20000_dim_shape(huge_rank: Path, tiny_dir: Path, argv: list[str]) -> None:
    r = invoke(*(a.format(d=huge_rank, tiny=tiny_dir) for a in argv))
    assert r.exit_code == 1, r.output[-1000:]
    assert len(r.output) < 200_000


@pytest.mark.parametrize("name", ["evil.weight", "deep.weight"])
def test_tensor_refuses_an_invalid_entry_in_one_line(huge_rank: Path, name: str) -> None:
    r = invoke("tensor", str(huge_rank), name)
    assert r.exit_code == 2 and "SHAPE_INVALID" in one_error_line(r.output)


@pytest.mark.parametrize("command", [["audit", "--no-progress"], ["params"], ["explain", "q_a_layernorm"]])
def test_a_4000_digit_number_in_config_is_one_error_line(tiny_copy: Path, command: list[str]) -> None:
    cfg = (tiny_copy / "config.json").read_text()
    cfg = json.dumps({**json.loads(cfg), "rms_norm_eps": 12345}).replace("12345", "9" * 4000)
    (tiny_copy / "config.json").write_text(cfg)
    r = invoke(command[0], str(tiny_copy), *command[1:])
    assert r.exit_code == 2 and "rms_norm_eps" in one_error_line(r.output)


# --- item 10: amplification ------------------------------------------------------------------------

def test_an_index_with_more_shards_than_any_checkpoint_is_refused_at_a_bounded_cost(tiny_copy: Path,
                                                                                     tiny_dir: Path) -> None:
    index = json.loads((tiny_copy / INDEX_FILE).read_text())
    index["weight_map"].update({f"t{i:x}": f"{i:x}" for i in range(MAX_INDEX_SHARDS * 3)})
    raw = json.dumps(index, separators=(",", ":")).encode()
    (tiny_copy / INDEX_FILE).write_bytes(raw)
    assert [f.code for f in parse_index(raw).findings] == ["INDEX_INVALID"]
    report, peak = traced(lambda: audit_source(LocalSource(tiny_copy)))
    codes = [f.code for f in report.findings]
    assert codes.count("INDEX_INVALID") == 1 and "INDEX_SHARD_ABSENT" not in codes
    assert len(codes) < 1000  # not one finding per listed name
    _, base = traced(lambda: audit_source(LocalSource(tiny_dir)))
    assert peak - base < 30 * len(raw), (peak, base, len(raw))  # what the index adds: a small multiple of it


def traced(fn):  # type: ignore[no-untyped-def]
    """(fn(), the peak bytes Python allocated while it ran)."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_index_shard_names_up_to_the_bound_are_still_read() -> None:
    raw = json.dumps({"weight_map": {f"t{i}": f"s{i}.safetensors" for i in range(MAX_INDEX_SHARDS)}}).encode()
    assert parse_index(raw).findings == () and len(parse_index(raw).weight_map) == MAX_INDEX_SHARDS


def test_the_index_duplicate_key_search_turns_deep_nesting_into_a_finding() -> None:
    """Found by the config/index fuzzer (hypothesis raises the recursion limit, so json.loads read a ~2,000-deep
    index that the duplicate-key search, one frame deeper, could not): a RecursionError escaped parse_index.
    The search itself now answers with a finding whatever the depth."""
    from kimi_audit.format.index import _duplicates

    found = _duplicates("[" * 100_000 + "]" * 100_000, INDEX_FILE)
    assert [f.code for f in found] == ["INDEX_INVALID"] and "nested too deeply" in found[0].message


def test_megabyte_dtypes_are_not_repeated_whole(tiny_copy: Path) -> None:
    for i in range(4):
        add_tensor(tiny_copy, f"d{i}.weight", {"dtype": chr(65 + i) * 1_000_000, "shape": [1]}, b"\0")
    table = invoke("audit", str(tiny_copy), "--no-progress")
    assert table.exit_code == 1 and len(table.output) < 100_000
    js = invoke("audit", str(tiny_copy), "--no-progress", "--json")
    assert len(js.stdout) < 200_000
    md = invoke("audit", str(tiny_copy), "--no-progress", "--format", "markdown")
    assert len(md.stdout) < 100_000
    assert any(f["code"] == "DTYPE_UNKNOWN" for f in json.loads(js.stdout)["findings"])


def test_finding_messages_are_clipped_where_they_are_made() -> None:
    f = error("X", "y" * 10**6)
    assert len(f.message) < MAX_TEXT + 100 and f.message.endswith("more characters)")
    assert error("X", "short").message == "short"


# --- item 13: untrusted names on the terminal and in markdown --------------------------------------

EVIL = "evil.\x1b[2J\u202e[bold]x[/bold].weight"


@pytest.fixture
def evil(tiny_copy: Path) -> Path:
    add_tensor(tiny_copy, EVIL, {"dtype": "U8", "shape": [1]}, b"\1")
    add_tensor(tiny_copy, "<img src=x onerror=alert(1)>[click](https://example.com).weight",
               {"dtype": "U8", "shape": [1]}, b"\1")
    return tiny_copy


def test_diff_neutralises_escapes_in_names(evil: Path, tiny_dir: Path) -> None:
    r = invoke("diff", str(tiny_dir), str(evil), "--no-progress")
    assert r.exit_code == 1
    assert "\x1b" not in r.output and "\u202e" not in r.output
    assert "\\x1b[2J\\u202e[bold]x[/bold]" in r.output  # shown as written, markup not read


def test_tensor_neutralises_escapes_in_names(evil: Path) -> None:
    r = invoke("tensor", str(evil), EVIL)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\u202e" not in r.output and "[bold]x[/bold]" in r.output


def test_markdown_passes_no_html_links_or_bidi(evil: Path) -> None:
    md = render_markdown(audit_source(LocalSource(evil)))
    assert "\x1b" not in md and "\u202e" not in md
    prose = re.sub(r"`[^`\n]*`", "", md)  # code spans show HTML and links as text; elsewhere they must be escaped
    assert "<img" not in prose and "[bold]" not in prose
    assert not re.search(r"(?<!\\)\]\(", prose)  # no unescaped `](`: no link
    assert "\\u202e" in md and "&lt;img" in prose and "\\[click\\]" in prose


@pytest.mark.parametrize("model_type", [["deepseek_v4"], {"a": 1}, 7])
def test_a_model_type_that_is_not_a_string_is_outside_the_family(model_type: object) -> None:
    """The architecture registry is looked up by model_type: an unhashable or non-string value is a config
    outside the family (LAYOUT_UNSUPPORTED), not a TypeError."""
    from kimi_audit.model.config import parse_config_bytes

    cfg = parse_config_bytes(json.dumps({"model_type": model_type}).encode())[1]
    assert not cfg.layout_supported
