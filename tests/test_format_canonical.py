"""The typed (msgspec) path of the header reader against the strict JSON path it stands in for.

`format.decode.typed_header` decodes well-formed headers into msgspec Structs; every other header goes
through json.loads and the per-entry rules (format/strict.py). On any input both must give the same
ShardHeader (tensors, metadata, findings), and the typed path must really carry the well-formed ones.
"""

from __future__ import annotations

import collections
import json
import struct
from pathlib import Path

import pytest

from header_mutations import corpus
from kimi_audit.format import header as fmt
from kimi_audit.format.decode import typed_header
from kimi_audit.format.header import parse_shard_prefix


def both_paths(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[fmt.ShardHeader, fmt.ShardHeader]:
    typed = parse_shard_prefix(data, shard="s.safetensors", file_size=len(data))
    with monkeypatch.context() as m:
        m.setattr(fmt, "typed_header", lambda body: None)
        strict = parse_shard_prefix(data, shard="s.safetensors", file_size=len(data))
    return typed, strict


def takes_typed_path(data: bytes) -> bool:
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
    raw = data[8:8 + n]
    try:
        raw.decode("utf-8")  # the typed path is only ever given valid UTF-8
    except UnicodeDecodeError:
        return False
    return typed_header(raw.rstrip(b" ")) is not None


def test_the_typed_path_agrees_with_the_json_path_on_the_mutation_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: collections.Counter[str] = collections.Counter()
    for cls, seed, data in corpus(per_class=120):
        typed, strict = both_paths(data, monkeypatch)
        assert typed == strict, (cls, seed)
        taken[cls] += takes_typed_path(data)
    # The generator writes canonical text: the typed path carried valid files (the others use zero-element
    # tensors or strict-path features) and mutants of several classes, accepted and refused.
    assert taken["valid"] > 40 and len(+taken) >= 5, taken


def test_real_safetensors_files_take_the_typed_path(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards = sorted(tiny_dir.glob("*.safetensors"))
    assert shards
    for path in shards:
        data = path.read_bytes()
        assert takes_typed_path(data), path.name
        typed, strict = both_paths(data, monkeypatch)
        assert typed == strict and typed.ok and typed.tensor_count > 0


def _file(header: str, payload: int) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * payload


ENTRY = '"{name}":{{"dtype":"F32","shape":[2],"data_offsets":[{b},{e}]}}'
A = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
B = '"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}'
META = '"__metadata__":{"format":"pt"}'


@pytest.mark.parametrize(
    "header, payload, code, typed",
    [
        # fields in another order, whitespace between tokens: still the format's schema
        ("{" + A + ',"b":{"shape":[2],"dtype":"F32","data_offsets":[8,16]}}', 16, None, True),
        ('{ "a" : {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}\n}', 8, None, True),
        ("{" + B + "," + META + "," + A + "}", 16, None, False),  # __metadata__ not first: the strict path
        ("{" + META + "}", 0, None, True),
        ('{"__metadata__":{}}', 0, None, True),
        ("{}", 0, None, True),
        ('{"__metadata__":{"url":"http://x","t":"1:2"},"a:b":' + A[4:] + "}", 8, None, True),  # colons in strings
        ('{"a-0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, None, True),  # `-0` in a string
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]}}', 8, "OFFSETS_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[-0,2],"data_offsets":[0,8]}}', 8, "SHAPE_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[ -0],"data_offsets":[0,0]}}', 0, "SHAPE_INVALID", False),
        # duplicate keys: whole entries, struct fields, metadata keys, __metadata__ itself, behind colons
        ("{" + A + "," + A.replace("0,8", "8,16") + "}", 16, "HEADER_DUPLICATE_KEY", False),
        ('{"__metadata__":{"k":"v","k":"w"},' + A + "}", 8, "HEADER_DUPLICATE_KEY", False),
        ('{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "HEADER_DUPLICATE_KEY", False),
        ("{" + META + "," + META + "," + A + "}", 8, "HEADER_DUPLICATE_KEY", False),
        ('{"x:y":' + A[4:] + ',"x:y":' + A[4:] + "}", 8, "HEADER_DUPLICATE_KEY", False),
        ('{"__metadata__":' + A[4:] + "," + A + "}", 8, "METADATA_INVALID", False),
        ("{" + META + ',"__metadata__":' + A[4:] + "," + A + "}", 8, "HEADER_DUPLICATE_KEY", False),
        # malformed metadata, cut where the typed path looks for its end
        ("{" + META + ",}", 0, "HEADER_INVALID_JSON", False),
        ('{"__metadata__":{"k":"}"},' + A + "}", 8, None, False),
        ('{"__metadata__":{"k":{"n":"v"}},' + A + "}", 8, "METADATA_INVALID", False),
        ('{"__metadata__":{"k":1},' + A + "}", 8, "METADATA_INVALID", False),
        ('{"__metadata__":{"k":"v"}' + A + "}", 8, "HEADER_INVALID_JSON", False),
        ('{"__metadata__":{"k":"v"}}x', 0, "HEADER_INVALID_JSON", False),
        ('{"__metadata__":{"k":"v"', 0, "HEADER_INVALID_JSON", False),
        ("{" + A + ',"x":1}', 8, "TENSOR_ENTRY_INVALID", False),
        ("{" + A + ',"x":[1],' + B + "}", 16, "TENSOR_ENTRY_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', 8, None, False),  # TENSOR_EXTRA_FIELD
        ('{"a":{"dtype":"F32","shape":[2]}}', 0, "TENSOR_ENTRY_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[1,,2],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON", False),
        ('{"a":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON", False),
        ('{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', 8, None, False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,' + "9" * 5000 + "]}}", 8, "HEADER_INVALID_JSON", False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}x', 8, "HEADER_INVALID_JSON", False),
        ("[" + A[4:] + "]", 8, "HEADER_NOT_OBJECT", False),
        ('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8, "SIZE_MISMATCH", False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', 0, "OFFSETS_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', 8, "SHAPE_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', 4, "SHAPE_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[0,2],"data_offsets":[0,0]}}', 0, None, False),  # zero elements: per entry
        ("{" + A + ',"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "OFFSETS_OVERLAP", True),
        ("{" + A + ',"b":{"dtype":"F32","shape":[2],"data_offsets":[9,17]}}', 17, "OFFSETS_GAP", True),
        ("{" + A + "}", 9, "TRAILING_BYTES", True),
        ('{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}', 8, "DTYPE_UNKNOWN", False),
        ('{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', 8, "DTYPE_UNKNOWN", False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,08]}}', 8, "HEADER_INVALID_JSON", False),
        ('{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}', 8, "SHAPE_INVALID", False),
        ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1152921504606846984]}}', 8, "SIZE_MISMATCH", False),
        ('{"a":{"dtype":"F64","shape":[144115188075855872],"data_offsets":[0,1152921504606846976]}}', 0,
         "DATA_PAST_EOF", False),
        ('{"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "METADATA_INVALID", False),
        ('{"a\\u0062":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, None, False),
        ('{"a\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON", False),
        ('{"\u00e9\u4e2d":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, None, True),  # UTF-8 names
        ('{"a\x01":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON", False),
        ('\t{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\n  ', 8, None, True),  # warnings only
        ('\ufeff{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, "HEADER_INVALID_JSON", False),
    ],
)
def test_near_canonical_headers_are_judged_like_the_json_path_judges_them(
    header: str, payload: int, code: str | None, typed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _file(header, payload)
    assert takes_typed_path(data) is typed
    via_typed, strict = both_paths(data, monkeypatch)
    assert via_typed == strict
    codes = {f.code for f in via_typed.findings}
    assert (code in codes) if code else via_typed.ok, codes


def test_a_canonical_header_of_many_entries_is_read_by_the_typed_path(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [ENTRY.format(name=f"t.{i}", b=8 * i, e=8 * i + 8) for i in range(5000)]
    meta = json.dumps({"format": "pt"}, separators=(",", ":"))
    data = _file('{"__metadata__":' + meta + "," + ",".join(entries) + "}", 8 * 5000)
    assert takes_typed_path(data)
    typed, strict = both_paths(data, monkeypatch)
    assert typed == strict and typed.ok and typed.tensor_count == 5000 and typed.metadata == {"format": "pt"}
    assert typed.tensors["t.4999"].begin == 39992
    assert len({id(s) for s in typed.columns.shapes}) == 1  # equal shapes share one tuple
