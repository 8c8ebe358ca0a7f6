"""No false PASS, round four: a mutation oracle. Clean checkpoints (the GGUF files llama.cpp's own tools wrote, the
tiny safetensors checkpoint) are changed one header field at a time (every count, offset, dim, ggml type, key type,
general.alignment, split.* key, safetensors entry, index entry, and seeded byte edits within the headers), audited,
and held to the reference reader: gguf.cpp's load rules and llama.cpp's model loader (tests/gguf_reference.py, each
rule cited) with gguf-py's GGUFReader; safetensors' own parser. Properties for every mutant (tests/mutation.py):
(a) the reference refuses -> never PASS; (b) PASS -> every tensor reads as the original's; (c) no traceback;
(d) exit code in {0, 1, 2, 3}; (e) each audit under TIME_LIMIT seconds and RSS_LIMIT_MB of peak RSS growth.

The default run is seeded and bounded (well under 60 s on two cores): the named field classes every run, then
KIMI_AUDIT_MUTATIONS seeded mutations (default 1000) from KIMI_AUDIT_MUTATION_SEED. bench/mutation_long.py is the
longer run. Each mutation that found a bug is a file of tests/data/mutation_corpus, replayed here every run.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

import gguf_reference as ref
import mutation as mu

gguf = pytest.importorskip("gguf")
safetensors = pytest.importorskip("safetensors")

N_RANDOM = int(os.environ.get("KIMI_AUDIT_MUTATIONS", "1000"))
SEED = int(os.environ.get("KIMI_AUDIT_MUTATION_SEED", "20240604"))
CORPUS = mu.corpus()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mutation")
    mu.set_work_root(root)
    return root


def _report(outcomes: list[mu.Outcome], limit: int = 25) -> str:
    """Violations grouped by class (property, fixture, field with names taken out), one example each."""
    groups: dict[str, list[mu.Outcome]] = defaultdict(list)
    for o in outcomes:
        groups[mu.signature(o)].append(o)
    lines = [f"{len(outcomes)} mutants break a property, in {len(groups)} classes:"]
    for sig, group in sorted(groups.items())[:limit]:
        lines.append(f"  {len(group)} x {sig}\n      e.g. {group[0].summary()[:600]}")
    return "\n".join(lines)


# --- the reference itself -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(mu.GGUF_FIXTURES))
def test_reference_reads_the_clean_fixtures_as_gguf_py(name: str) -> None:
    """The rules accept what llama.cpp wrote and llama-simple loaded, and read every tensor where gguf-py does."""
    fx = mu.gguf_fixture(name)
    ref.loader_check(fx.parts, fx.expected)
    for path, part in zip(fx.paths, fx.parts):
        reader = gguf.GGUFReader(path)
        assert [(t.name, int(t.tensor_type), int(t.data_offset), int(t.n_bytes)) for t in reader.tensors] == [
            (t.name, t.type_id, part.data_offset + t.offset, t.nbytes()) for t in part.tensors]
        assert sorted(part.kv) == sorted(k for k in reader.fields if not k.startswith("GGUF."))
        assert part.data_offset + part.data_size == path.stat().st_size
    assert mu.gguf_reference(fx.paths[0] if len(fx.paths) == 1 else fx.paths[0].parent, fx).verdict == "accept"


def test_reference_type_table_is_ggml_s() -> None:
    """Block and type sizes as gguf-py's table. The installed gguf-py predates 0c1e5709: it knows no Q2_0 (42), and
    its Q8_1 block is the old 4 + 4 + 32 bytes (ggml's block_q8_1 is two halves and 32 int8, 36 bytes, as the
    vendored gguf-py of 0c1e5709 says: GGMLQuantizationType.Q8_1: (32, 2 + 2 + 32))."""
    for t, sizes in gguf.GGML_QUANT_SIZES.items():
        assert ref.GGML_TYPES[int(t)] == ((32, 36) if t.name == "Q8_1" else sizes), t.name
    assert set(ref.GGML_TYPES) - {int(t) for t in gguf.GGML_QUANT_SIZES} <= {42}
    assert max(ref.GGML_TYPES) < ref.GGML_TYPE_COUNT


def test_every_refusal_cites_llama_cpp(scratch: Path) -> None:
    """Each refusal the structural mutations meet names its rule's file and line."""
    for m in mu.structural_mutations():
        if m["fixture"] == mu.ST_FIXTURE:
            continue
        target = mu.materialize(m, scratch / f"cite-{abs(hash(json.dumps(m)))}")
        r = mu.gguf_reference(target, mu.gguf_fixture(m["fixture"]))
        if r.verdict == "refuse":
            assert re.search(r"\((ggml/src/gguf\.cpp|src/[\w/.-]+\.(cpp|h)):\d+", r.reason), r.reason


def test_safetensors_reference_accepts_the_clean_checkpoint(scratch: Path) -> None:
    fx = mu.st_fixture()
    assert mu.st_reference(fx.directory).verdict == "accept"
    assert len(fx.view) == sum(len(h) - ("__metadata__" in h) for h in fx.headers.values())


# --- the corpus: every mutation that found a bug, replayed -----------------------------------------------------------


@pytest.mark.parametrize(("case", "doc"), CORPUS, ids=[c for c, _ in CORPUS])
def test_corpus(case: str, doc: dict, scratch: Path) -> None:
    """A mutation that once broke a property (`found` says how): the reference still decides it as recorded, and
    kimi-audit now keeps every property. Strict: a case fails until the bug it records is fixed."""
    out = mu.check(doc["mutation"], scratch)
    assert out.reference.verdict == doc["reference"], out.summary()
    assert not out.violations, f"{case}: {doc['bug']}\n{out.summary()}"


# --- the sweeps -----------------------------------------------------------------------------------------------------


def test_named_field_classes(scratch: Path) -> None:
    """Every class the issue names, each every run: counts to 2**40, alignment types and values, typed keys in other
    types, required keys removed, split.* keys, swapped offsets, a gap, safetensors dtype/shape/offsets/length, the
    index's weight_map and total_size."""
    outcomes = [mu.check(m, scratch) for m in mu.structural_mutations()]
    assert {o.reference.verdict for o in outcomes} >= {"refuse", "accept"}
    bad = [o for o in outcomes if o.violations]
    assert not bad, _report(bad)


def test_seeded_random_mutations(scratch: Path) -> None:
    """KIMI_AUDIT_MUTATIONS seeded single-field and header-byte mutations."""
    outcomes = [mu.check(m, scratch) for m in mu.random_mutations(SEED, N_RANDOM)]
    bad = [o for o in outcomes if o.violations]
    assert not bad, _report(bad)


def test_cli_sample(scratch: Path) -> None:
    """The command line on a sample: its exit code is the API's, never a traceback, always in {0, 1, 2, 3}."""
    sample = [
        {"fixture": "gguf/tiny-Q2_K.gguf", "op": "field", "field": "version", "value": 2},  # PASS
        {"fixture": "gguf/tiny-Q2_K.gguf", "op": "field", "field": "n_tensors", "value": 2**40},  # GGUF_INVALID
        {"fixture": "gguf/tiny-Q2_K.gguf", "op": "kv_set", "key": "deepseek2.rope.dimension_count",
         "type": "STRING", "value": "16"},
        {"fixture": "gguf/Q8_0", "op": "kv_set", "key": "split.no", "type": "UINT16", "value": 2, "part": 1},
        {"fixture": mu.ST_FIXTURE, "op": "st_len", "file": "model-1-of-3.safetensors", "value": 2**64 - 1},
        {"fixture": mu.ST_FIXTURE, "op": "bytes", "file": mu.INDEX, "seed": 7, "n": 4},
    ]
    seen = set()
    for i, m in enumerate(sample):
        api = mu.check(m, scratch)
        target = mu.materialize(m, scratch / f"cli-{i}")
        rc, stdout, stderr = mu.run_cli(target)
        assert "Traceback" not in stderr and "Traceback" not in stdout, (m, stderr[-2000:])
        assert rc in (0, 1, 2, 3), (m, rc, stderr[-2000:])
        assert rc == api.exit_code, (m, rc, api.summary())
        if rc in (0, 1):
            json.loads(stdout)
        seen.add(rc)
    assert {0, 1} <= seen
