"""Fuzzing `verify --manifest` input (issue 21: the fuzz suite covers manifests as it covers headers, config.json
and index.json): typed random statements around model-signing's form, huge numbers, deep nesting, long
strings, random bytes and DSSE envelopes. Invariants: the reader raises nothing but a KimiAuditError (exit 2,
one line), a manifest it accepts is consistent (its subject digest is its resources' root), a message stays
one short line, and a FIFO is refused without blocking."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimi_audit.errors import KimiAuditError
from kimi_audit.verify.manifest import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Manifest,
    manifest_statement,
    read_manifest,
    root_digest,
)
from test_fuzz_config_index import FUZZ, HUGE_INTS, LONG_STRINGS, NESTED, VALUES, serialize

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
RESOURCE = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=30) | VALUES, "algorithm": st.just("sha256") | VALUES, "digest": HEX | VALUES})
STATEMENTS = st.fixed_dictionaries({}, optional={
    "_type": st.just(STATEMENT_TYPE) | VALUES,
    "predicateType": st.just(PREDICATE_TYPE) | VALUES,
    "subject": st.lists(st.fixed_dictionaries({}, optional={
        "name": VALUES, "digest": st.fixed_dictionaries({}, optional={"sha256": HEX | VALUES}) | VALUES,
        "annotations": VALUES}), max_size=2) | VALUES,
    "predicate": st.fixed_dictionaries({}, optional={
        "serialization": st.just({"method": "files", "hash_type": "sha256"}) | VALUES,
        "resources": st.lists(RESOURCE, max_size=5) | VALUES,
        "kimi-audit": st.fixed_dictionaries({}, optional={
            "revision": VALUES, "source": VALUES, "tensors": st.dictionaries(st.text(max_size=8), VALUES | HEX,
                                                                             max_size=3)}) | VALUES,
    }) | VALUES,
})


def check(path: Path) -> Manifest | None:
    try:
        m = read_manifest(path)
    except KimiAuditError as e:
        text = str(e)
        assert "\n" not in text and len(text) < 4000, text[:200]
        return None
    assert all(isinstance(n, str) and isinstance(d, str) and len(d) == 64 for n, d in m.files.items())
    return m


def write(tmp_path: Path, raw: bytes) -> Path:
    p = tmp_path / "manifest.json"
    p.write_bytes(raw)
    return p


@FUZZ
@given(STATEMENTS, st.integers(1, 3000))
def test_a_fuzzed_statement_is_read_or_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                            doc: dict[str, Any], depth: int) -> None:
    check(write(tmp_path_factory.mktemp("m"), serialize(doc, depth)))


@FUZZ
@given(STATEMENTS, st.integers(1, 3000))
def test_a_fuzzed_statement_in_a_dsse_envelope(tmp_path_factory: pytest.TempPathFactory, doc: dict[str, Any],
                                               depth: int) -> None:
    payload = base64.b64encode(serialize(doc, depth)).decode()
    raw = json.dumps({"dsseEnvelope": {"payload": payload, "payloadType": "application/vnd.in-toto+json"}})
    check(write(tmp_path_factory.mktemp("m"), raw.encode()))


@FUZZ
@given(st.binary(max_size=2000) | HUGE_INTS.map(lambda n: str(n).encode()) | LONG_STRINGS.map(str.encode)
       | st.just(NESTED).map(lambda _: ("[" * 200_000 + "]" * 200_000).encode()))
def test_random_bytes_are_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    check(write(tmp_path_factory.mktemp("m"), raw))


def test_a_valid_manifest_survives_the_round_trip(tmp_path: Path) -> None:
    """The fuzzer's invariant can fail: a manifest the writer makes is read back equal."""
    files = {"model-1-of-2.safetensors": "a" * 64, "model-2-of-2.safetensors": "b" * 64}
    m = Manifest("ckpt", files, "0123abcd", "local", {})
    doc = manifest_statement(m)
    assert doc["subject"][0]["digest"]["sha256"] == root_digest(files)
    got = check(write(tmp_path, json.dumps(doc).encode()))
    assert got is not None and got.files == files and got.revision == "0123abcd"


@pytest.mark.timeout(20)
def test_a_fifo_as_the_manifest_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    with pytest.raises(KimiAuditError, match="FIFO"):
        read_manifest(fifo)
