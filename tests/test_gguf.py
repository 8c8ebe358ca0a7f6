"""GGUF, proven against llama.cpp's own tools: tests/data/gguf was written by llama.cpp 0c1e5709's converter
(`convert_hf_to_gguf.py`), `llama-quantize` and `llama-gguf-split` (tests/writers/gguf_generate.py,
PROVENANCE.json), and loaded back by its `llama-simple` when it was written. The reader is held to gguf-py's
GGUFReader, the names to gguf-py's TensorNameMap (what the converter renames with), the parameter count to
transformers' model of the source config; each fault users meet is one finding."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.model.arch.registry import architecture
from kimi_audit.sources import LocalSource

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent / "data" / "gguf"
SPLIT = DATA / "Q8_0"
Q2K = DATA / "tiny-Q2_K.gguf"
runner = CliRunner()


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    script = Path(__file__).resolve().parent / "writers" / "gguf_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    for name, digest in prov["files"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    assert set(prov["llama.cpp"]["tools"]) == {"convert_hf_to_gguf.py", "llama-quantize", "llama-gguf-split"}


@pytest.mark.parametrize("path", sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.gguf")))
def test_reader_equals_gguf_py(path: str) -> None:
    """Every tensor's name, ggml type, shape and offset, and every scalar key, as llama.cpp's gguf-py reads them."""
    ours = read_gguf_part(LocalSource(DATA), path)
    theirs = gguf.GGUFReader(DATA / path)
    gb.assert_tensors_read_as_gguf_py(ours, theirs)
    cols = ours.header.columns
    assert [e - b for b, e in zip(cols.begins, cols.ends)] == [int(t.n_bytes) for t in theirs.tensors]
    for key, f in theirs.fields.items():
        if key.startswith("GGUF.") or f.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        value = f.contents()
        assert ours.kv[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    tokens = theirs.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        assert ours.kv["tokenizer.ggml.tokens"].count == len(tokens.data)


@pytest.mark.parametrize("path", ["Q8_0", "Q8_0/tiny-Q8_0-00003-of-00004.gguf", "tiny-Q2_K.gguf"])
def test_llama_cpp_outputs_audit_clean(path: str) -> None:
    report = audit(DATA / path)
    assert report.verdict() == "PASS" and codes(report) == []
    assert report.stats.tensors == 52
    q = report.q_a_layernorm
    assert q.width == 256 and q.total_params == 3 * 256 and q.ok


def test_parameters_equal_the_source_model_as_transformers_builds_it() -> None:
    """The GGUF's element total is the source model's parameters (transformers' DeepseekV3, from the config the
    converter read) plus the router biases transformers keeps as buffers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = json.loads((DATA / "source.config.json").read_text())
    config = transformers.DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    for path in (SPLIT, Q2K):
        assert audit(path).stats.parameters == params + biases


def test_gguf_names_are_the_converters() -> None:
    """Each name of the llama.cpp tree, renamed by deepseek2's dialect, is what gguf-py's TensorNameMap (the table
    convert_hf_to_gguf renames with) makes of it."""
    dialect = architecture("kimi_k2").gguf  # type: ignore[union-attr]
    assert dialect is not None and dialect.archs[0] == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.DEEPSEEK2]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, 4)
    # the indexer's names are deepseek32's (the same dialect's other arch: tests/test_gguf_archs.py); the NextN
    # layer's are not in the installed gguf 0.19's DEEPSEEK2 table (tests/test_gguf_glm4.py: llama.cpp's own gguf-py)
    for tree, spelled in dialect.top + tuple((f"model.layers.3.{a}", f"blk.3.{b}") for a, b in dialect.layer
                                             if not a.startswith("self_attn.indexer.") and not b.startswith("nextn.")):
        # conversion/base.py ModelBase.modify_tensors first respells the router bias `e_score_correction.bias`
        converted = tree.replace("e_score_correction_bias", "e_score_correction.bias")
        assert tmap.get_name(converted, try_suffixes=(".weight", ".bias")) == spelled, tree
        assert dialect.rename(tree) == spelled


def test_one_set_of_several_is_chosen() -> None:
    result = runner.invoke(app, ["audit", str(DATA), "--no-progress"])
    assert result.exit_code == 2 and "GGUF sets here" in result.output and "--include" in result.output
    result = runner.invoke(app, ["audit", str(DATA), "--include", "Q8_0/*", "--no-progress", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["result"]["verdict"] == "PASS" and doc["model"]["quantization"]["method"] == "gguf"
    assert doc["model"]["container"] == "gguf"


def test_values_check_the_gains_and_router_biases() -> None:
    report = audit(Q2K, values=True)
    checked = [f for f in report.findings if f.code == "VALUES_CHECKED"]
    assert report.verdict() == "PASS" and "13 gains, 2 router biases" in checked[0].message


# --- faults: one finding each ------------------------------------------------------------------------------


def copy_split(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SPLIT, tmp_path / "Q8_0"))


def test_missing_part(tmp_path: Path) -> None:
    d = copy_split(tmp_path)
    (d / "tiny-Q8_0-00003-of-00004.gguf").unlink()
    report = audit(d)
    assert codes(report) == ["GGUF_PART_MISSING"] and report.verdict() == "PARTIAL"  # as a missing shard is


def test_partial_download(tmp_path: Path) -> None:
    d = copy_split(tmp_path)
    part = d / "tiny-Q8_0-00002-of-00004.gguf"
    part.write_bytes(part.read_bytes()[:600_000])
    report = audit(d)
    assert codes(report) == ["DATA_PAST_EOF"] and "not within the file bounds" in report.findings[0].message


def test_header_cut_short(tmp_path: Path) -> None:
    d = copy_split(tmp_path)
    part = d / "tiny-Q8_0-00001-of-00004.gguf"
    part.write_bytes(part.read_bytes()[:5000])
    report = audit(d / "tiny-Q8_0-00002-of-00004.gguf")
    assert "GGUF_INVALID" in codes(report) and "TENSOR_MISSING" not in codes(report)


def test_parts_joined_with_cat(tmp_path: Path) -> None:
    joined = tmp_path / "tiny-Q8_0-00001-of-00004.gguf"
    joined.write_bytes(b"".join(p.read_bytes() for p in sorted(SPLIT.glob("*.gguf"))))
    report = audit(joined)
    assert set(codes(report)) == {"GGUF_PART_MISSING", "GGUF_TRAILING_BYTES"}


def rewrite(src: Path, dst: Path, edit: object) -> None:
    g = gb.read(src)
    edit(g)  # type: ignore[operator]
    gb.write(g, dst)


def test_stale_split_tensor_count(tmp_path: Path) -> None:
    d = copy_split(tmp_path)
    for p in d.glob("*.gguf"):
        rewrite(p, p, lambda g: g.set("split.tensors.count", 5, 2760))
    report = audit(d)
    assert codes(report) == ["GGUF_SPLIT_COUNT"] and report.findings[0].expected == 2760


def test_part_from_another_set(tmp_path: Path) -> None:
    d = copy_split(tmp_path)
    p = d / "tiny-Q8_0-00002-of-00004.gguf"
    rewrite(p, p, lambda g: (g.set("split.count", 2, 3), g.set("split.no", 2, 2)))
    assert "GGUF_SPLIT_INVALID" in codes(audit(d))


def drop(name: str) -> object:
    return lambda g: g.tensors.remove(g.tensor(name))


def test_missing_expert_tensor(tmp_path: Path) -> None:
    """ktransformers #656: a quant without blk.N.ffn_up_exps."""
    out = tmp_path / "m.gguf"
    rewrite(Q2K, out, drop("blk.1.ffn_up_exps.weight"))
    report = audit(out)
    assert codes(report) == ["TENSOR_MISSING"] and report.findings[0].tensor == "blk.1.ffn_up_exps.weight"


def test_token_list_longer_than_the_embedding(tmp_path: Path) -> None:
    """llama.cpp #14642: 163,842 tokens for a 163,840-row embedding."""
    out = tmp_path / "v.gguf"

    def more_tokens(g: gb.Gguf) -> None:
        vtype, tokens, item = g.kv["tokenizer.ggml.tokens"]
        g.set("tokenizer.ggml.tokens", vtype, [*tokens, "extra1", "extra2"], item)
        vtype, types, item = g.kv["tokenizer.ggml.token_type"]
        g.set("tokenizer.ggml.token_type", vtype, [*types, 1, 1], item)

    rewrite(Q2K, out, more_tokens)
    assert "GGUF_VOCAB_MISMATCH" in codes(audit(out))


def test_gating_absent_when_the_config_had_no_scoring_func() -> None:
    """Written by the converter itself from a config.json with no scoring_func: llama.cpp would route by softmax."""
    report = audit(DATA / "noscoring-Q2_K.gguf")
    assert codes(report) == ["GGUF_GATING"] and report.findings[0].actual is None


def test_split_attention_without_the_mla_keys(tmp_path: Path) -> None:
    out = tmp_path / "k.gguf"
    rewrite(Q2K, out, lambda g: [g.kv.pop(k) for k in ("deepseek2.attention.key_length_mla",
                                                         "deepseek2.attention.value_length_mla")])
    assert "GGUF_KEY_MISSING" in codes(audit(out))


def test_pre_mla_conversion_is_a_warning(tmp_path: Path) -> None:
    """Files converted before llama.cpp #12801 keep one attn_kv_b [heads x (nope + v), kv_lora] per layer."""
    out = tmp_path / "old.gguf"
    heads, nope, v, kvl = 2, 64, 64, 256

    def old(g: gb.Gguf) -> None:
        for n in range(3):
            for part in ("attn_k_b", "attn_v_b"):
                g.tensors.remove(g.tensor(f"blk.{n}.{part}.weight"))
            data = bytes(2 * heads * (nope + v) * kvl)
            g.tensors.append(gb.Tensor(f"blk.{n}.attn_kv_b.weight", [kvl, heads * (nope + v)], 1, data))
        for k in ("key_length_mla", "value_length_mla"):
            g.kv.pop(f"deepseek2.attention.{k}")
        g.set("deepseek2.attention.key_length", 4, nope + 32)
        g.set("deepseek2.attention.value_length", 4, v)

    rewrite(Q2K, out, old)
    report = audit(out)
    assert codes(report) == ["GGUF_PRE_MLA"] and report.verdict() == "PASS"


@pytest.mark.parametrize(("edit", "code"), [
    (lambda g: setattr(g.tensor("blk.0.attn_norm.weight"), "type_id", 99), "GGUF_TYPE_UNKNOWN"),
    (lambda g: setattr(g.tensor("blk.0.attn_q_b.weight"), "ne", [255, 192]), "GGUF_ROW_BLOCK"),
    (lambda g: setattr(g.tensors[-1], "offset", 1_000_000 + 8), "GGUF_MISALIGNED"),
    (lambda g: setattr(g, "version", 1), "GGUF_INVALID"),
])
def test_container_faults(tmp_path: Path, edit: object, code: str) -> None:
    out = tmp_path / "f.gguf"
    rewrite(Q2K, out, edit)
    report = audit(out)
    assert code in codes(report)
    assert report.verdict() == "FAIL"


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"safetensors?" + bytes(100))
    report = audit(bad)
    assert codes(report)[0] == "GGUF_INVALID"
    big = tmp_path / "y.gguf"
    big.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 2**60) + bytes(64))
    assert codes(audit(big))[0] == "GGUF_INVALID"


def test_unknown_gguf_architecture_is_inconclusive(tmp_path: Path) -> None:
    out = tmp_path / "llama.gguf"
    rewrite(Q2K, out, lambda g: g.set("general.architecture", 8, "llama"))
    report = audit(out)
    assert report.exit_code() == 3 and "LAYOUT_UNSUPPORTED" in codes(report)


def f32(value: object) -> object:
    return struct.unpack("<f", struct.pack("<f", value))[0] if isinstance(value, float) else value


def test_metadata_is_what_the_converter_writes_from_the_config() -> None:
    """deepseek2's dialect, applied to the config.json the converter read, gives every `deepseek2.*` key the
    converter wrote, value for value (floats as GGUF stores them)."""
    dialect = architecture("kimi_k2").gguf  # type: ignore[union-attr]
    assert dialect is not None
    written = read_gguf_part(LocalSource(DATA), "tiny-Q2_K.gguf").kv
    ours = dialect.metadata(json.loads((DATA / "source.config.json").read_text()))
    assert {k: f32(v) for k, v in ours.items()} == {k: v for k, v in written.items() if k.startswith("deepseek2.")}
    nogating = read_gguf_part(LocalSource(DATA), "noscoring-Q2_K.gguf").kv
    cfg = json.loads((DATA / "source.config.json").read_text())
    del cfg["scoring_func"]
    assert {k: f32(v) for k, v in dialect.metadata(cfg).items()} == {
        k: v for k, v in nogating.items() if k.startswith("deepseek2.")}


# --- against the checkpoint it was converted from -----------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint tests/data/gguf was converted from, saved again by the generator's own code (seeded:
    the same bytes on this torch and transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "writers"))
    import gguf_generate

    out = tmp_path_factory.mktemp("hf") / "tiny"
    gguf_generate.save_source(out, "sigmoid")
    return out


def against(path: Path, src: Path, *extra: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["audit", str(path), "--against", str(src), "--no-progress", "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


def found(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


def test_against_its_source_every_q8_0_byte_equal(source: Path) -> None:
    """llama-quantize's Q8_0 of the converter's output, every tensor (stacked experts and the split kv_b
    included) byte-equal to ggml's Q8_0 of the source's values."""
    code, doc = against(SPLIT, source, "--values")
    assert code == 0 and doc["result"]["verdict"] == "PASS"
    checked = [f for f in doc["findings"] if f["code"] == "AGAINST_CHECKED"]
    assert checked[0]["actual"] == 52


def test_against_holds_every_quantized_type_to_its_bound(source: Path) -> None:
    """llama-quantize's Q2_K file (Q2_K, Q3_K, Q4_0, Q6_K and F32 tensors): every tensor compared, the quantized
    ones dequantized by gguf-py within their type's relative error bound, the worst of each type named; each
    measured worst well under its bound and far under the sqrt 2 of a tensor from elsewhere."""
    from kimi_audit.checks.against import error_bound

    code, doc = against(Q2K, source, "--values")
    checked = next(f for f in doc["findings"] if f["code"] == "AGAINST_CHECKED")
    assert code == 0 and checked["actual"] == 52 and "AGAINST_NOT_COMPARED" not in found(doc)
    for t in ("Q2_K", "Q3_K", "Q4_0", "Q6_K"):
        worst = float(checked["message"].split(f"{t} ", 1)[1].split("/", 1)[0])
        assert 0 < worst < 0.8 * error_bound(t) < 0.95, t


def test_against_a_quantized_tensor_from_another_layer(tmp_path: Path, source: Path) -> None:
    """Two layers' Q2_K experts traded places: every header is right, each tensor decodes, and each is off its
    source by about sqrt 2 (uncorrelated values): one AGAINST_VALUES naming them."""
    out = tmp_path / "s.gguf"

    def swap(g: gb.Gguf) -> None:
        a, b = g.tensor("blk.1.ffn_gate_exps.weight"), g.tensor("blk.2.ffn_gate_exps.weight")
        a.data, b.data = b.data, a.data

    rewrite(Q2K, out, swap)
    assert audit(out).verdict() == "PASS"
    code, doc = against(out, source, "--values")
    bad = [f for f in doc["findings"] if f["code"] == "AGAINST_VALUES"]
    assert code == 1 and len(bad) == 1 and bad[0]["covers"] == 2 and "blk.1.ffn_gate_exps" in bad[0]["message"]


def test_against_says_what_it_held_on_a_pass(source: Path) -> None:
    """A PASS --against is not silent: what was held, and that the values were not compared without --values."""
    code, doc = against(SPLIT, source)
    held = [f for f in doc["findings"] if f["code"] == "AGAINST_HELD"]
    assert code == 0 and len(held) == 1 and "add --values" in held[0]["message"]


def test_against_finds_the_swapped_part(tmp_path: Path, source: Path) -> None:
    """A part from another upload: the same names, types and shapes, other values. The headers pass; its
    values against the source name the part, once."""
    d = copy_split(tmp_path)
    part = d / "tiny-Q8_0-00003-of-00004.gguf"

    def other_values(g: gb.Gguf) -> None:
        for t in g.tensors:
            t.data = bytes(b ^ 1 for b in t.data[:64]) + t.data[64:]

    rewrite(part, part, other_values)
    assert audit(d).verdict() == "PASS"
    code, doc = against(d, source, "--values")
    assert code == 1 and found(doc).count("AGAINST_VALUES") == 1
    assert next(f for f in doc["findings"] if f["code"] == "AGAINST_VALUES")["shard"] == part.name


def test_against_names_the_metadata_the_config_implies(source: Path) -> None:
    """Converted from a config.json without scoring_func: its gating key differs from the source's."""
    code, doc = against(DATA / "noscoring-Q2_K.gguf", source)
    assert code == 1 and "AGAINST_METADATA" in found(doc) and "GGUF_GATING" in found(doc)
    meta = next(f for f in doc["findings"] if f["code"] == "AGAINST_METADATA")
    assert meta["tensor"] == "deepseek2.expert_gating_func" and meta["expected"] == 2


def test_against_a_missing_tensor_is_said_once(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "m.gguf"
    rewrite(Q2K, out, drop("blk.2.ffn_gate_exps.weight"))
    code, doc = against(out, source)
    assert code == 1 and found(doc) == ["TENSOR_MISSING", "AGAINST_HELD"]


def test_against_another_model(tmp_path: Path, source: Path) -> None:
    other = Path(shutil.copytree(source, tmp_path / "other"))
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (other / "config.json").write_text(json.dumps(cfg))
    code, doc = against(Q2K, other)
    assert code == 1 and "AGAINST_METADATA" in found(doc) and "AGAINST_UNACCOUNTED" not in found(doc)
    assert "AGAINST_TOTAL" in found(doc)


def test_against_not_a_source(tmp_path: Path) -> None:
    code, doc = against(Q2K, SPLIT)
    assert code == 2
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    code, doc = against(Q2K, tmp_path)
    assert code == 1 and "AGAINST_ARCHITECTURE" in found(doc)


def test_q8_0_encoding_equals_gguf_py() -> None:
    import numpy as np

    from kimi_audit.numerics.ggml import encode

    rng = np.random.default_rng(0)
    for scale in (1e-6, 0.02, 30.0):
        x = (rng.normal(0, scale, (16, 256))).astype(np.float32)
        x[0, :32] = 0
        x[1, :32] = np.arange(32, dtype=np.float32) * np.float32(0.5)
        for name in ("Q8_0", "BF16", "F16", "F32"):
            qt = getattr(gguf.GGMLQuantizationType, name)
            assert encode(x, name) == gguf.quants.quantize(x, qt).tobytes(), name


@pytest.mark.slow
def test_kimi_k2_gguf_replica_holds_the_seeds_gains(family_replica) -> None:  # type: ignore[no-untyped-def]
    """The full-scale Kimi-K2 GGUF replica (8 parts, Kimi's 163,840-token tokenizer): the seed's 60 MoE blocks x
    1,536 + 1,536 attn_q_a_norm gains, F32 [1536], and Kimi-K2's 1,026,408,232,448 parameters (router biases
    included: the safetensors audit's count of the same model)."""
    d = family_replica("kimi-k2-instruct-gguf")
    parts = sorted(p.name for p in (d / "UD-Q2_K_XL").glob("*.gguf"))
    assert parts == [f"Kimi-K2-Instruct-UD-Q2_K_XL-{i:05d}-of-00008.gguf" for i in range(1, 9)]
    report = audit(d / "UD-Q2_K_XL" / parts[4], values=True)
    # the quantized tensors' blocks lie in the replica's holes (those the pass reads whole: not present), and the
    # larger ones are left to `verify`, said once each
    assert report.verdict() == "PASS"
    assert sorted(f.code for f in report.findings) == ["DATA_NOT_PRESENT", "VALUES_CHECKED", "VALUES_SKIPPED"]
    assert (report.stats.tensors, report.stats.parameters, report.stats.payload_bytes) == (
        1_096, 1_026_408_232_448, 293_899_601_920)  # docs/family.md's row
    q = report.q_a_layernorm
    assert (q.width, [t.params for t in q.totals]) == (1536, [92_160, 1_536])
    assert all(r.dtype == "F32" and r.tensor.endswith("attn_q_a_norm.weight") for r in q.rows)
    part1 = read_gguf_part(LocalSource(d / "UD-Q2_K_XL"), parts[0])
    assert part1.kv["tokenizer.ggml.tokens"].count == 163_840 and part1.header.data_start > 6_000_000


def test_params_and_explain_read_a_gguf_set() -> None:
    """The accounting tree of a GGUF set: every weight in the ggml type llama-quantize chose counts as derived."""
    r = runner.invoke(app, ["params", str(Q2K), "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["total"]["derived"] == doc["total"]["found"] and not doc["total"]["mismatch"]
    stored = {row["dtype"]: (row["derived"], row["found"]) for row in doc["stored_by_dtype"]}
    assert all(d == f for d, f in stored.values()) and {"Q2_K", "Q3_K", "Q6_K", "F32"} <= stored.keys()
    r = runner.invoke(app, ["explain", str(Q2K), "q_a_layernorm"])
    assert r.exit_code == 0 and "blk.0.attn_q_a_norm.weight" in r.stdout


def test_tensor_and_rmsnorm_read_a_gguf_part() -> None:
    """One F32 tensor by byte range from its part; DeepseekV3RMSNorm on each layer's real attn_q_a_norm gain."""
    r = runner.invoke(app, ["tensor", str(SPLIT), "blk.2.attn_q_a_norm.weight", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"]
    r = runner.invoke(app, ["rmsnorm", str(SPLIT), "--all", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["ok"] and [x["tensor"] for x in doc["layers"]] == [
        f"blk.{n}.attn_q_a_norm.weight" for n in range(3)]



@pytest.mark.parametrize("path", [Q2K, SPLIT / "tiny-Q8_0-00001-of-00004.gguf"])
def test_every_quantized_tensor_dequantizes_as_gguf_py_reads_it(path: Path, tmp_path: Path) -> None:
    """`tensor --dequant` on every tensor of a file llama-quantize wrote (Q2_K, Q3_K, Q4_0, Q6_K, Q8_0, F32): the
    bytes kimi-audit reads by range, in its shape, dequantized, equal gguf-py's GGUFReader's tensor dequantized by
    gguf-py's quants (llama.cpp's numpy reference), value for value."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from kimi_audit.numerics.tensor_io import TensorFetcher
    from kimi_audit.sources import LocalSource

    shutil.copy(path, tmp_path / path.name)  # the file alone: tests/data/gguf holds other sets of the same names
    fetch = TensorFetcher(LocalSource(tmp_path))
    seen = set()
    for t in GGUFReader(path).tensors:
        ours, info, _ = fetch.read(t.name)
        want = dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(d) for d in t.shape])))
        assert ours.dtype == np.float32 and ours.shape == want.shape == info.shape, t.name
        assert np.array_equal(ours, want.astype(np.float32), equal_nan=True), t.name
        seen.add(t.tensor_type.name)
    r = runner.invoke(app, ["tensor", str(tmp_path / path.name), t.name, "--dequant", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["dequantized"] is not None
    assert seen >= ({"Q2_K", "Q3_K", "Q4_0", "Q6_K", "F32"} if path == Q2K else {"Q8_0", "F32"})


def test_gguf_set_over_the_hub(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A repo of several quant folders: --include picks one; its parts' headers by Range, far less than the files."""
    root = tmp_path / "repo"
    shutil.copytree(SPLIT, root / "Q8_0")
    shutil.copy(Q2K, root / "tiny-Q2_K.gguf")
    hub.add_repo("test-org/tiny-gguf", root)
    result = runner.invoke(app, ["audit", "test-org/tiny-gguf", "--no-progress", "--json"])
    assert result.exit_code == 2 and "--include" in result.output
    hub.reset_stats()
    result = runner.invoke(app, ["audit", "test-org/tiny-gguf", "--include", "Q8_0/*", "--no-progress", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["result"]["verdict"] == "PASS" and doc["summary"]["tensors"] == 52
    sent = hub.stats().bytes_sent
    assert sent < 0.35 * sum(p.stat().st_size for p in SPLIT.glob("*.gguf"))


def test_a_large_header_is_read_in_few_requests_over_the_hub(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Part 1 with a Kimi-K2-like tokenizer (60,000 tokens, their types, 60,000 merges: a 2.6 MB header) is read
    in at most 3 ranged requests and at most 1.3x its header's bytes (the read plan of format.gguf._Cursor: the
    doubling reads it replaced took 5 requests and 3.7 MB; it takes 2 and 3.2 MB)."""
    import random

    root = tmp_path / "repo"
    shutil.copytree(SPLIT, root)
    first = sorted(root.glob("*.gguf"))[0]
    g = gb.read(first)
    rng = random.Random(0)
    tokens = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 14))) for _ in range(60_000)]
    g.set("tokenizer.ggml.tokens", 9, tokens, 8)
    g.set("tokenizer.ggml.token_type", 9, [1] * len(tokens), 5)
    g.set("tokenizer.ggml.merges", 9, [f"{rng.choice(tokens)} {rng.choice(tokens)}" for _ in tokens], 8)
    gb.write(g, first)
    header = read_gguf_part(LocalSource(root), first.name).header.data_offset
    assert header > 2 << 20
    hub.add_repo("test-org/big-tokenizer", root)
    hub.reset_stats()
    result = runner.invoke(app, ["audit", "test-org/big-tokenizer", "--no-progress", "--json"])
    assert result.exit_code in (0, 1), result.output
    requests, sent = hub.stats().for_path(first.name)
    assert requests <= 3 and sent <= 1.3 * header, (requests, sent, header)


@pytest.mark.parametrize("counts", [(2**21 + 1, 1), (1, 2**16 + 1)])
def test_hostile_counts_are_refused_before_the_work(tmp_path: Path, counts: tuple[int, int]) -> None:
    """A part that claims more tensors or keys than a real file holds is one GGUF_INVALID, read no further."""
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, *counts) + bytes(64 << 20))
    report = audit(bad)
    assert codes(report) == ["GGUF_INVALID"] and "at most" in report.findings[0].message


def test_a_string_array_of_millions_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "s.gguf"
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    head += struct.pack("<IIQ", 9, 8, 2**22 + 1)  # an array of 4,194,305 strings, each 8 bytes of length 0
    out.write_bytes(head + bytes(40 << 20))
    assert codes(audit(out)) == ["GGUF_INVALID"]


def test_gating_follows_the_loaders_default_when_the_key_is_absent() -> None:
    """llama.cpp's deepseek2 loader (src/models/deepseek2.cpp load_arch_hparams) routes by sigmoid when
    expert_gating_func is absent and the model has 47 or 48 main layers and a 154,880-token vocabulary
    (GLM-4.7-Flash, whose GGUFs lack the key): such a file is no GGUF_GATING; any other stays softmax."""
    from kimi_audit.model.arch.deepseek_v3.gguf import SIGMOID, loader_gating

    assert loader_gating(None, 47, 154_880) == SIGMOID and loader_gating(None, 48, 154_880) == SIGMOID
    assert loader_gating(None, 61, 154_880) is None and loader_gating(None, 47, 163_840) is None
    assert loader_gating(1, 47, 154_880) == 1  # a stored key is what the loader reads


def test_every_ggml_block_type_reads_as_gguf_py_dequantizes_it(tmp_path: Path) -> None:
    """A tensor of every quantized ggml type kimi-audit's table and the installed gguf-py both know (IQ, TQ, MXFP4,
    NVFP4 included; random block bytes, one row of two blocks and a second row), read by range and dequantized,
    equals gguf-py's GGUFReader view of the same file dequantized by gguf-py."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    from kimi_audit.format.gguf_types import GGML_TYPES
    from kimi_audit.numerics.ggml_quants import is_quantized
    from kimi_audit.numerics.tensor_io import TensorFetcher
    from kimi_audit.sources import LocalSource

    rng = np.random.default_rng(0)
    known = {t.name for t in GGMLQuantizationType}
    g = gb.Gguf()
    g.set("general.architecture", 8, "deepseek2")
    types = [t for t in GGML_TYPES.values() if is_quantized(t.name) and t.name in known and t.name != "Q8_1"]
    for t in types:
        g.tensors.append(gb.Tensor(f"t.{t.name}", [2 * t.block, 2], t.id, rng.bytes(4 * t.size)))
    gb.write(g, tmp_path / "all.gguf")
    fetch = TensorFetcher(LocalSource(tmp_path))
    for t in GGUFReader(tmp_path / "all.gguf").tensors:
        try:
            want = dequantize(t.data, t.tensor_type).reshape(2, -1)
        except NotImplementedError:
            continue
        ours, _, _ = fetch.read(t.name)
        assert np.array_equal(ours, want.astype(np.float32), equal_nan=True), t.name
    assert len(types) >= 20


def test_sarif_of_a_gguf_set_points_at_its_parts(tmp_path: Path) -> None:
    """A GGUF folder has no config.json: each result points at the part that holds its tensor, else the set's
    first part (which carries the metadata)."""
    out = tmp_path / "set"
    shutil.copytree(SPLIT, out)
    part = "tiny-Q8_0-00001-of-00004.gguf"
    rewrite(out / part, out / part, lambda g: g.kv.pop("deepseek2.expert_gating_func"))  # GGUF_GATING: no part
    r = runner.invoke(app, ["audit", str(out), "--format", "sarif", "--no-progress"])
    results = json.loads(r.stdout)["runs"][0]["results"]
    uris = {x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for x in results}
    assert r.exit_code == 1 and results and "config.json" not in uris and uris <= {p.name for p in SPLIT.iterdir()}


def test_a_missing_part_is_partial(tmp_path: Path) -> None:
    """A split set with a part not (yet) downloaded is PARTIAL, as a checkpoint with an absent shard is."""
    out = tmp_path / "set"
    shutil.copytree(SPLIT, out)
    (out / "tiny-Q8_0-00003-of-00004.gguf").unlink()
    report = audit(out)
    assert report.verdict() == "PARTIAL" and report.exit_code() == 1
    assert (report.absent_shards, report.listed_shards) == (1, 4)
    assert report.headline() == "PARTIAL: 1 of 4 shards absent"


def test_the_include_hint_selects_one_set(tmp_path: Path) -> None:
    """Two sets whose names share a prefix (m-Q2_K, m-Q2_K_XL): the hint's glob selects the first alone."""
    shutil.copy(Q2K, tmp_path / "m-Q2_K.gguf")
    shutil.copy(DATA / "noscoring-Q2_K.gguf", tmp_path / "m-Q2_K_XL.gguf")
    r = runner.invoke(app, ["audit", str(tmp_path), "--no-progress"])
    assert r.exit_code == 2
    glob = r.output.split("--include '", 1)[1].split("'", 1)[0]
    r = runner.invoke(app, ["audit", str(tmp_path), "--include", glob, "--no-progress"])
    assert r.exit_code == 0, r.output


def test_expert_count_disagreeing_with_the_tensors_is_one_cause(tmp_path: Path) -> None:
    """deepseek2.expert_count 8 over 4 stacked experts: one CONFIG_DISAGREES naming the key, the routers, their
    biases and the stacked experts it sizes counted beneath, not ten shape errors."""
    out = tmp_path / "e.gguf"
    rewrite(Q2K, out, lambda g: g.set("deepseek2.expert_count", 4, 8))
    report = audit(out)
    assert codes(report) == ["CONFIG_DISAGREES"] and report.findings[0].tensor == "deepseek2.expert_count"
    assert report.findings[0].covers == 10 and (report.findings[0].expected, report.findings[0].actual) == (8, 4)


def test_a_part_from_another_quant_of_the_same_model(tmp_path: Path, source: Path) -> None:
    """Part 3 of the Q8_0 set replaced by the same tensors from llama-quantize's Q2_K file (same model, same
    names, other types): a warning naming the part (dynamic quants vary types on purpose); held to the source with
    --values, its values are the source's within their bounds, and the mixed upload is an error."""
    d = copy_split(tmp_path)
    part = d / "tiny-Q8_0-00003-of-00004.gguf"
    q2k = {t.name: t for t in gb.read(Q2K).tensors}

    def from_q2k(g: gb.Gguf) -> None:
        for i, t in enumerate(g.tensors):
            g.tensors[i] = gb.Tensor(t.name, q2k[t.name].ne, q2k[t.name].type_id, q2k[t.name].data)

    rewrite(part, part, from_q2k)
    report = audit(d)
    assert codes(report) == ["GGUF_QUANT_MIXED"] and report.findings[0].shard == part.name
    assert report.verdict() == "PASS"  # a warning: a dynamic quant may do this on purpose
    code, doc = against(d, source, "--values")
    assert code == 1 and [f["shard"] for f in doc["findings"] if f["code"] == "AGAINST_QUANT_MIXED"] == [part.name]
    assert "AGAINST_VALUES" not in found(doc)


def test_the_demo_sets_dynamic_quant_is_no_mixed_part() -> None:
    """The files llama-quantize wrote vary types by role and layer (Q2_K with Q3_K, Q4_0 and Q6_K): no part of a
    set written whole is called out."""
    assert "GGUF_QUANT_MIXED" not in codes(audit(SPLIT)) and "GGUF_QUANT_MIXED" not in codes(audit(Q2K))


def test_params_shows_the_ggml_types_stored() -> None:
    """params names each GGUF weight's ggml type as stored (Q2_K, Q3_K, ...), in its tree and its parameters by
    dtype, never the layout's placeholder for "whatever type the quantizer chose"."""
    from kimi_audit.model.quant.gguf import GGML_ANY

    text = runner.invoke(app, ["params", str(Q2K)], env={"COLUMNS": "200"})
    doc = json.loads(runner.invoke(app, ["params", str(Q2K), "--json"]).stdout)
    assert text.exit_code == 0 and GGML_ANY not in text.stdout.split() and "Q3_K" in text.stdout
    assert {r["dtype"] for r in doc["by_dtype"]} == {"Q2_K", "Q3_K", "Q4_0", "Q6_K", "F32"}


def test_grouped_part_names_keep_their_zero_padding() -> None:
    """Findings on several parts of a split set group as `-{00001-00003}-of-00004.gguf`, the names as written."""
    from kimi_audit.findings import error
    from kimi_audit.report.grouping import group_findings

    parts = [error("DATA_PAST_EOF", "cut", shard=f"m-{i:05d}-of-00004.gguf") for i in (1, 2, 3)]
    assert group_findings(parts)[0].pattern == "m-{00001-00003}-of-00004.gguf"
    layers = [error("TENSOR_MISSING", "x", tensor=f"model.layers.{i}.mlp.weight") for i in (1, 2, 10)]
    assert group_findings(layers)[0].pattern == "model.layers.{1-2,10}.mlp.weight"


def test_integer_types_encode_exactly_or_not_at_all() -> None:
    """ggml's integer types hold integers as they are (DeepSeek-V4's I32 hash table): a value with a fraction, or
    past the type's range, has no encoding (ValueError), never a truncated one that would compare equal."""
    import numpy as np

    from kimi_audit.numerics.ggml import encode

    assert encode(np.array([[1, -2], [3, 2**31 - 1]]), "I32") == np.array([1, -2, 3, 2**31 - 1], "<i4").tobytes()
    for bad, t in ((np.array([1.5]), "I32"), (np.array([2**31]), "I32"), (np.array([300]), "I8")):
        with pytest.raises(ValueError):
            encode(bad, t)
