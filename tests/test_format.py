"""The strict header reader: one test per format rule, and proof it reads no tensor data."""

from __future__ import annotations

import json

import pytest

from kimi_audit.findings import Severity
from kimi_audit.format.header import parse_shard_prefix, read_shard_header
from kimi_audit.sources import LocalSource
from kimi_audit.sources.base import RangeRead
from shard_builder import entry, header_json, shard_bytes

VALID = {
    "__metadata__": {"format": "pt"},
    "a": entry("BF16", [2, 3], 0, 12),
    "b": entry("F8_E4M3", [4], 12, 16),
    "c": entry("F32", [], 16, 20),
}


def parse(data: bytes, file_size: int | None = None):
    return parse_shard_prefix(data, shard="s.safetensors", file_size=len(data) if file_size is None else file_size)


def codes(header) -> list[str]:
    return [f.code for f in header.findings]


def error_codes(header) -> list[str]:
    return [f.code for f in header.findings if f.severity is Severity.ERROR]


def test_valid_header_parses_without_findings():
    h = parse(shard_bytes(VALID))
    assert codes(h) == []
    assert h.metadata == {"format": "pt"}
    assert h.tensors["a"].shape == (2, 3) and h.tensors["a"].dtype == "BF16"
    assert h.tensors["c"].shape == () and h.tensors["c"].nbytes == 4
    assert h.data_start == 8 + h.header_len
    assert h.payload_bytes == 20


def test_every_dtype_of_the_format_is_known():
    # A missing dtype in a validator's table produced mass false positives (F8_E8M0 in DeepSeek artifacts).
    from kimi_audit.constants import DTYPE_BITS

    for dtype in ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                  "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
                  "F64", "I64", "U64"]:
        bits = DTYPE_BITS[dtype]
        n = 8  # 8 elements is a whole number of bytes for every width
        h = parse(shard_bytes({"t": entry(dtype, [n], 0, n * bits // 8)}))
        assert codes(h) == [], dtype


@pytest.mark.parametrize(
    "data, code",
    [
        (b"\x01\x02\x03", "HEADER_TOO_SHORT"),
        ((100_000_001).to_bytes(8, "little") + b"{}", "HEADER_TOO_LARGE"),
        ((1000).to_bytes(8, "little") + b"{}      ", "HEADER_PAST_EOF"),
        (shard_bytes(b'{"a\xff":1}'), "HEADER_NOT_UTF8"),
        (shard_bytes(b'{"a": '), "HEADER_INVALID_JSON"),
        (shard_bytes(b'{"a": NaN}'), "HEADER_INVALID_JSON"),
        (shard_bytes(b"[" * 100_000 + b"]" * 100_000), "HEADER_INVALID_JSON"),
        (shard_bytes(b'{"a": ' + b"9" * 5000 + b"}"), "HEADER_INVALID_JSON"),
        (shard_bytes(b"[1, 2]"), "HEADER_NOT_OBJECT"),
        (shard_bytes(b""), "HEADER_INVALID_JSON"),
    ],
)
def test_unparseable_headers_are_named(data, code):
    h = parse(data)
    assert error_codes(h) == [code]
    assert h.tensors == {}


def test_header_too_large_is_refused_from_the_prefix_alone():
    # 8 bytes are enough to refuse; the file need not hold the claimed header.
    h = parse((2**63).to_bytes(8, "little"), file_size=10**12)
    assert error_codes(h) == ["HEADER_TOO_LARGE"]


def test_duplicate_keys_are_found_even_though_json_keeps_the_last():
    one = json.dumps(entry("U8", [1], 0, 1)).encode()
    raw = b'{"a":' + one + b',"a":' + one + b"}"
    h = parse(shard_bytes(raw, 1))
    assert "HEADER_DUPLICATE_KEY" in error_codes(h)
    assert [f.tensor for f in h.findings if f.code == "HEADER_DUPLICATE_KEY"] == ["a"]


def test_duplicate_key_inside_an_entry():
    raw = b'{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    assert "HEADER_DUPLICATE_KEY" in error_codes(parse(shard_bytes(raw, 1)))


def test_colons_inside_names_do_not_hide_or_fake_duplicates():
    h = parse(shard_bytes({"a:b": entry("U8", [1], 0, 1), "c::": entry("U8", [1], 1, 2)}))
    assert codes(h) == []


def test_leading_whitespace_is_a_warning_only():
    h = parse(shard_bytes(b"\n " + header_json(VALID), 20))
    assert codes(h) == ["HEADER_LEADING_WHITESPACE"]
    assert h.ok


def test_trailing_space_padding_is_allowed():
    h = parse(shard_bytes(header_json(VALID) + b"        ", 20))
    assert codes(h) == []


@pytest.mark.parametrize("meta", [{"k": 1}, ["x"], "text", {"k": {"nested": "v"}}])
def test_metadata_must_be_a_string_map(meta):
    h = parse(shard_bytes({"__metadata__": meta, "a": entry("U8", [1], 0, 1)}))
    assert error_codes(h) == ["METADATA_INVALID"]


def test_null_metadata_is_accepted():
    assert codes(parse(shard_bytes({"__metadata__": None, "a": entry("U8", [1], 0, 1)}))) == []


@pytest.mark.parametrize(
    "bad, code",
    [
        ([1, 2], "TENSOR_ENTRY_INVALID"),
        ({"dtype": "U8", "shape": [1]}, "TENSOR_ENTRY_INVALID"),
        ({"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}, "DTYPE_UNKNOWN"),
        ({"dtype": 8, "shape": [1], "data_offsets": [0, 1]}, "DTYPE_UNKNOWN"),
        ({"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}, "SHAPE_INVALID"),
        ({"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}, "SHAPE_INVALID"),
        ({"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}, "SHAPE_INVALID"),
        ({"dtype": "U8", "shape": "1", "data_offsets": [0, 1]}, "SHAPE_INVALID"),
        ({"dtype": "U8", "shape": [2**40, 2**40], "data_offsets": [0, 1]}, "SHAPE_INVALID"),
        ({"dtype": "U8", "shape": [1], "data_offsets": [0]}, "OFFSETS_INVALID"),
        ({"dtype": "U8", "shape": [1], "data_offsets": [1, 0]}, "OFFSETS_INVALID"),
        ({"dtype": "U8", "shape": [1], "data_offsets": [0, 2**64]}, "OFFSETS_INVALID"),
        ({"dtype": "U8", "shape": [1], "data_offsets": "0-1"}, "OFFSETS_INVALID"),
        ({"dtype": "U8", "shape": [2], "data_offsets": [0, 1]}, "SIZE_MISMATCH"),
        ({"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}, "SIZE_MISMATCH"),
    ],
)
def test_bad_entries_are_named_with_their_tensor(bad, code):
    h = parse(shard_bytes({"bad": bad, "z": entry("U8", [1], 0, 1)}, 1))
    found = [f for f in h.findings if f.code == code]
    assert found and found[0].tensor == "bad"
    assert found[0].severity is Severity.ERROR


def test_extra_entry_fields_are_a_warning():
    e = dict(entry("U8", [1], 0, 1), extra="x")
    h = parse(shard_bytes({"a": e}, 1))
    assert codes(h) == ["TENSOR_EXTRA_FIELD"]
    assert h.tensors["a"].shape == (1,)


def test_overlap_and_gap():
    overlap = parse(shard_bytes({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}, 6))
    assert [(f.code, f.tensor) for f in overlap.findings] == [("OFFSETS_OVERLAP", "b")]
    gap = parse(shard_bytes({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 6, 10)}, 10))
    assert [(f.code, f.tensor) for f in gap.findings] == [("OFFSETS_GAP", "b")]
    first_not_zero = parse(shard_bytes({"a": entry("U8", [4], 4, 8)}, 8))
    assert error_codes(first_not_zero) == ["OFFSETS_GAP"]


def test_out_of_order_entries_are_fine_when_they_tile():
    h = parse(shard_bytes({"b": entry("U8", [4], 4, 8), "a": entry("U8", [4], 0, 4)}, 8))
    assert codes(h) == []


def test_data_past_end_of_file_and_trailing_bytes():
    short = parse(shard_bytes({"a": entry("U8", [8], 0, 8)}, 5))
    assert error_codes(short) == ["DATA_PAST_EOF"]
    long = parse(shard_bytes({"a": entry("U8", [8], 0, 8)}, 12))
    assert error_codes(long) == ["TRAILING_BYTES"]


def test_zero_sized_tensors_take_no_bytes():
    h = parse(shard_bytes({"a": entry("F32", [0, 5], 0, 0), "b": entry("U8", [2], 0, 2)}, 2))
    assert codes(h) == []


def test_slow_path_agrees_with_fast_path():
    fast = parse(shard_bytes(VALID))
    slow_header = dict(VALID, d=dict(entry("U8", [0], 20, 20), note="forces the per-entry path"))
    slow = parse(shard_bytes(slow_header))
    assert codes(slow) == ["TENSOR_EXTRA_FIELD"]
    assert {k: v for k, v in slow.tensors.items() if k != "d"} == fast.tensors


class CountingSource(LocalSource):
    def __init__(self, path):
        super().__init__(path)
        self.reads: list[tuple[int, int]] = []

    def read_range(self, name, start, length) -> RangeRead:
        r = super().read_range(name, start, length)
        self.reads.append((start, len(r.data)))
        return r


def test_read_shard_header_reads_only_the_header(tmp_path):
    big = {"w": entry("U8", [1 << 20], 0, 1 << 20)}
    (tmp_path / "s.safetensors").write_bytes(shard_bytes(big))
    src = CountingSource(tmp_path)
    h = read_shard_header(src, "s.safetensors", first_read=16)
    assert codes(h) == []
    assert len(src.reads) == 2
    assert sum(n for _, n in src.reads) == h.data_start  # exactly 8 + N bytes, no tensor data
    src.reads.clear()
    read_shard_header(src, "s.safetensors", first_read=h.data_start)
    assert src.reads == [(0, h.data_start)]


def test_read_shard_header_refuses_huge_length_after_eight_bytes(tmp_path):
    (tmp_path / "s.safetensors").write_bytes((99 * 10**9).to_bytes(8, "little") + b"\0" * 64)
    src = CountingSource(tmp_path)
    h = read_shard_header(src, "s.safetensors", first_read=8)
    assert error_codes(h) == ["HEADER_TOO_LARGE"]
    assert src.reads == [(0, 8)]
