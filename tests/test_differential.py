"""Differential testing: kimi-audit's accept/reject verdict against the safetensors library's.

The library's verdict is `safe_open(path, framework="np")`: opening validates the whole header and
the data extent (it fails on bad JSON, unknown dtypes, bad offsets, sizes, trailing bytes...), and
`keys()` lists without loading anything, so BF16/FP8 files are judged like any other.
`safetensors.deserialize` (in memory) is a second oracle; both must agree with each other.

kimi-audit "accepts" a file when its header yields no error finding (warnings allowed).
Every disagreement must be one of the documented, justified stricter rules below; the reverse
(kimi-audit accepting a file the library refuses) is never allowed.
"""

from __future__ import annotations

import collections
import os
import struct
import time
from pathlib import Path

import pytest

from header_mutations import CLASSES, generate, kimi_verdict, library_verdict

PER_CLASS = int(os.environ.get("DIFF_PER_CLASS", "560"))  # 18 classes x 560 = 10,080 inputs

# Rules where kimi-audit is deliberately stricter than the safetensors library, and why.
STRICTER = {
    "HEADER_DUPLICATE_KEY": (
        "A key repeated in the header JSON (a tensor name, a __metadata__ key, an ignored extra field). "
        "serde_json's HashMap and Python's json both keep the last value silently, so two readers that "
        "resolve the repeat differently can see different tensors in the same bytes; the format calls "
        "duplicate keys invalid. The library refuses only repeated struct fields (dtype, shape, "
        "data_offsets, __metadata__), which kimi-audit refuses too."
    ),

    "F64_MAX_IN_IGNORED_FIELD": (
        "A number that rounds to f64::MAX in an ignored extra field. serde_json's decimal conversion "
        "overflows on some spellings of it (1.797693134862315807e308, the 309-digit integer) and accepts "
        "others (1.7976931348623157e308); Python parses all of them to the same float and cannot tell the "
        "spellings apart, so kimi-audit refuses them all (HEADER_INVALID_JSON) rather than accept one the "
        "library refuses."
    ),

    "RANK_OVER_64": (
        "A shape of more than 64 dims. The library accepts one (300 dims, in this corpus), but numpy's "
        "NPY_MAXDIMS is 64, so safetensors.numpy (and kimi-audit's value checks) cannot load such a tensor; "
        "no real checkpoint has more than 5 dims, and a 20,000-dim shape otherwise costs 6,000-digit sizes "
        "in every report. kimi-audit refuses it (SHAPE_INVALID) from its length, before any product is computed."
    ),
}


def rules(data: bytes) -> set[str]:
    """The documented rules an input trips: its error codes, with the f64::MAX case named apart."""
    from kimi_audit.findings import Severity
    from kimi_audit.format.header import parse_shard_prefix

    out = set()
    for f in parse_shard_prefix(data, shard="f", file_size=len(data)).findings:
        if f.severity is Severity.ERROR:
            out.add("F64_MAX_IN_IGNORED_FIELD" if "rounds to its largest" in f.message
                    else "RANK_OVER_64" if "more than 64 (numpy's limit)" in f.message else f.code)
    return out


def library_deserialize_verdict(data: bytes) -> bool:
    from safetensors import deserialize

    try:
        deserialize(data)
    except Exception:
        return False
    return True


def run_differential(tmp: Path, per_class: int, seed0: int = 0):
    counts = collections.Counter()
    disagreements = []
    path = tmp / "f.safetensors"
    for cls in CLASSES:
        for seed in range(seed0, seed0 + per_class):
            data = generate(cls, seed)
            k_ok, _k_codes = kimi_verdict(data)
            path.write_bytes(data)
            l_ok, l_msg = library_verdict(str(path))
            assert library_deserialize_verdict(data) == l_ok, (cls, seed, "safe_open and deserialize disagree")
            counts[(cls, k_ok, l_ok)] += 1
            if k_ok != l_ok:
                disagreements.append((cls, seed, k_ok, l_ok, sorted(rules(data)), l_msg))
    return counts, disagreements


def test_verdicts_agree_with_safetensors_on_10k_inputs(tmp_path: Path) -> None:
    t = time.perf_counter()
    counts, dis = run_differential(tmp_path, PER_CLASS)
    elapsed = time.perf_counter() - t
    total = sum(counts.values())
    assert total >= 10_000
    agreed = total - len(dis)
    lenient = [d for d in dis if d[2] and not d[3]]
    assert not lenient, f"kimi-audit accepted what safetensors refuses: {lenient[:5]}"
    undocumented = [d for d in dis if not set(d[4]) <= STRICTER.keys()]
    assert not undocumented, f"undocumented disagreements: {undocumented[:5]}"
    # Both verdicts occur a lot: the corpus is neither all-valid nor all-garbage.
    accepted = sum(n for (_c, k, lib), n in counts.items() if k and lib)
    rejected = sum(n for (_c, k, lib), n in counts.items() if not k and not lib)
    assert accepted > 1000 and rejected > 3000, (accepted, rejected)
    by_rule = collections.Counter(r for d in dis for r in d[4])
    print(f"\ndifferential: {total} inputs, {agreed} agree ({accepted} both accept, {rejected} both reject), "
          f"{len(dis)} documented stricter {dict(by_rule)}, {elapsed:.1f} s")


def _file(raw: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}',
        b'{"__metadata__":{"k":"a","k":"b"}}',
        b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1,"x":2}}',
        b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"\\u0061":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}',
    ],
)
def test_documented_stricter_rule_duplicate_keys(tmp_path: Path, raw: bytes) -> None:
    data = _file(raw)
    (tmp_path / "d.safetensors").write_bytes(data)
    assert library_verdict(str(tmp_path / "d.safetensors"))[0] is True
    ok, codes = kimi_verdict(data)
    assert not ok and set(codes) == {"HEADER_DUPLICATE_KEY"}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}}',  # repeated struct field
        b'{"__metadata__":{"a":"b"},"__metadata__":{"a":"c"}}',
    ],
)
def test_duplicates_the_library_refuses_too(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "d.safetensors").write_bytes(_file(raw))
    assert library_verdict(str(tmp_path / "d.safetensors"))[0] is False
    assert kimi_verdict(_file(raw))[0] is False


@pytest.mark.parametrize(
    "raw, why",
    [
        (b'{"a":{"dtype":"F64","shape":[288230376151711744],"data_offsets":[0,0]}}', "2^58 x 64 bits wraps int64 to 0"),
        (
            b'{"a":{"dtype":"U8","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}}',
            "running product overflows",
        ),
        (b'{"a":{"dtype":"U8","shape":[0,18446744073709551616],"data_offsets":[0,0]}}', "a dim over u64"),
        (b'{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}', "-0 is a float to serde_json"),
        (b'{"\\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', "lone surrogate"),
        (b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1e400}}', "number out of f64 range"),
        (b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":' + b"[" * 126 + b"]" * 126 + b"}}", "depth 128"),
    ],
)
def test_former_disagreements_now_agree(tmp_path: Path, raw: bytes, why: str) -> None:
    """Each of these was accepted by kimi-audit and refused by the library before the fixes."""
    (tmp_path / "d.safetensors").write_bytes(_file(raw))
    assert library_verdict(str(tmp_path / "d.safetensors"))[0] is False, why
    assert kimi_verdict(_file(raw))[0] is False, why


def test_depth_boundary_matches_the_library(tmp_path: Path) -> None:
    for depth in (124, 125, 126, 127):
        raw = b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":' + b"[" * depth + b"]" * depth + b"}}"
        (tmp_path / "d.safetensors").write_bytes(_file(raw))
        assert kimi_verdict(_file(raw))[0] == library_verdict(str(tmp_path / "d.safetensors"))[0], depth


@pytest.mark.parametrize("number, library_ok", [
    (b"1.797693134862315807e308", False),  # rounds to f64::MAX; serde_json overflows
    (b"179769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766878171540"
     b"458953514382464234321326889464182768467546703537516986049910576551282076245490090389328944075868508455133"
     b"942304583236903222948165808559332123348274797826204144723168738177180919299881250404026184124858368", False),
    (b"1.7976931348623157e308", True),  # the same float; serde_json accepts this spelling
])
def test_documented_stricter_rule_f64_max(tmp_path: Path, number: bytes, library_ok: bool) -> None:
    raw = b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":' + number + b"}}"
    (tmp_path / "d.safetensors").write_bytes(_file(raw))
    assert library_verdict(str(tmp_path / "d.safetensors"))[0] is library_ok
    assert kimi_verdict(_file(raw))[0] is False
    if library_ok:  # the one disagreement: documented above
        assert rules(_file(raw)) == {"F64_MAX_IN_IGNORED_FIELD"}
