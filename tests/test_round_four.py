"""No false PASS, round four (issue 46): each class of attack fixed at its root, each test failing before its fix.
The GGUF files are llama.cpp's own (tests/data/gguf), read with gguf-py and written back changed (gguf_builder);
what llama.cpp refuses is cited from its source (llama.cpp 0c1e5709)."""

from __future__ import annotations

import json
import shutil
import struct
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.errors import KimiAuditError
from kimi_audit.model.config import model_config_from_dict

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data" / "gguf"
Q2K = DATA / "tiny-Q2_K.gguf"
U32, STRING, ARRAY, I32, U64, U16 = 4, 8, 9, 5, 10, 2


def codes(report: object) -> list[str]:
    return [f.code for f in report.findings]  # type: ignore[attr-defined]


def rewrite(out: Path, edit: object) -> Path:
    g = gb.read(Q2K)
    edit(g)  # type: ignore[operator]
    gb.write(g, out)
    return out


def laid_out(g: gb.Gguf) -> dict[str, int]:
    """Each tensor's offset as llama.cpp's writer lays them: end to end in order, each padded to the alignment."""
    pos, out = 0, {}
    for t in g.tensors:
        out[t.name] = pos
        pos += -(-len(t.data) // g.alignment) * g.alignment
    return out


# --- 1. a GGUF with no model ------------------------------------------------------------------------------------


def test_a_gguf_with_no_keys_and_no_tensors_is_no_pass(tmp_path: Path) -> None:
    empty = tmp_path / "e.gguf"
    empty.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    report = audit(empty)
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_MISSING"]
    result = runner.invoke(app, ["audit", str(empty), "--no-progress"])
    assert result.exit_code == 1


def test_a_gguf_without_general_architecture_is_no_pass(tmp_path: Path) -> None:
    out = rewrite(tmp_path / "m.gguf", lambda g: g.kv.pop("general.architecture"))
    report = audit(out)
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_MISSING"]
    assert report.findings[0].tensor == "general.architecture"


def test_a_header_then_a_gigabyte_hole_is_no_pass(tmp_path: Path) -> None:
    hole = tmp_path / "h.gguf"
    with hole.open("wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
        f.truncate(1 << 30)
    report = audit(hole)
    assert report.verdict() == "FAIL" and "GGUF_KEY_MISSING" in codes(report)


# --- 2. offsets llama.cpp refuses (gguf.cpp: "tensor '%s' has offset %zu, expected %zu") ---------------------------


def test_two_equal_tensors_with_swapped_offsets_are_refused(tmp_path: Path) -> None:
    """Two F32 norms of one shape whose offsets trade places, each name pointing at the other's bytes: every byte is
    inside the file, aligned, nothing overlaps, and llama.cpp refuses the file."""
    raw = bytearray(Q2K.read_bytes())
    a, b = (_offset_field(raw, n) for n in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"))
    raw[a:a + 8], raw[b:b + 8] = raw[b:b + 8], raw[a:a + 8]
    out = tmp_path / "s.gguf"
    out.write_bytes(raw)
    report = audit(out)
    assert report.verdict() == "FAIL"
    assert codes(report) == ["GGUF_OFFSET"] and report.findings[0].covers == 2


def test_an_aligned_gap_between_tensors_is_refused(tmp_path: Path) -> None:
    def gap(g: gb.Gguf) -> None:
        at = laid_out(g)
        half = len(g.tensors) // 2
        for i, t in enumerate(g.tensors):
            t.offset = at[t.name] + (4096 if i >= half else 0)

    out = rewrite(tmp_path / "g.gguf", gap)
    report = audit(out)
    n = len(gb.read(Q2K).tensors)
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_OFFSET"]
    assert report.findings[0].covers == n - n // 2


def _offset_field(raw: bytearray, name: str) -> int:
    """Where tensor `name`'s info keeps its data offset: after its name, dims and type (gguf.cpp's layout)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = raw.find(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", raw, at)
    return at + 4 + 8 * n_dims + 4


# --- 6. metadata types llama.cpp's typed getters refuse ------------------------------------------------------------


@pytest.mark.parametrize(("key", "vtype", "value", "item", "code"), [
    ("general.alignment", U64, 32, None, "GGUF_INVALID"),  # gguf.cpp: "must be of type UINT32"
    ("general.alignment", U16, 32, None, "GGUF_INVALID"),
    ("tokenizer.ggml.tokens", ARRAY, list(range(512)), I32, "GGUF_KEY_TYPE"),  # llama-vocab.cpp:2466
    ("tokenizer.ggml.pre", ARRAY, ["kimi-k2"], STRING, "GGUF_KEY_TYPE"),
    ("general.architecture", U32, 2, None, "GGUF_KEY_TYPE"),
    ("deepseek2.expert_weights_scale", STRING, "2.5", None, "GGUF_KEY_TYPE"),  # GKV::get_kv: "has wrong type"
])
def test_a_key_of_another_type_than_llama_cpp_reads(tmp_path: Path, key: str, vtype: int, value: object,
                                                    item: int | None, code: str) -> None:
    out = rewrite(tmp_path / "t.gguf", lambda g: g.set(key, vtype, value, item))
    report = audit(out)
    assert report.verdict() == "FAIL" and codes(report) == [code]
    assert key in report.findings[0].message


# --- 8. values of the wrong type: one finding or one line, never a traceback --------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("deepseek2.rope.dimension_count", "16"), ("deepseek2.attention.key_length_mla", "x"),
    ("deepseek2.block_count", 3.0)])
def test_hyperparameters_of_the_wrong_type_are_one_finding(tmp_path: Path, key: str, value: object) -> None:
    vtype = STRING if isinstance(value, str) else 6
    out = rewrite(tmp_path / "w.gguf", lambda g: g.set(key, vtype, value))
    result = runner.invoke(app, ["audit", str(out), "--no-progress", "--json"])
    assert result.exit_code == 1, result.output  # a traceback is exit 1 too: the JSON below is the proof
    doc = json.loads(result.stdout)
    assert [f["code"] for f in doc["findings"]] == ["GGUF_KEY_TYPE"]


def test_vocab_size_of_the_wrong_type_without_a_token_list(tmp_path: Path) -> None:
    def edit(g: gb.Gguf) -> None:
        g.kv.pop("tokenizer.ggml.tokens")
        g.set("deepseek2.vocab_size", STRING, "abc")

    report = audit(rewrite(tmp_path / "v.gguf", edit))
    assert codes(report) == ["GGUF_KEY_TYPE"]


@pytest.mark.parametrize("key", ["full_attn_layers", "kda_layers"])
@pytest.mark.parametrize("value", [None, 3, "1,2", {"a": 1}, True])
def test_kimi_linear_layer_lists_that_are_no_lists(key: str, value: object) -> None:
    """Kimi K3 (its text_config is Kimi-Linear's) and Kimi-Linear itself: a layer list that is null or a scalar is
    one ConfigError (exit 2), not a TypeError."""
    cfg = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k3.config.json").read_text())
    for c in (cfg, {**cfg["text_config"], "model_type": "kimi_linear"}):
        c = json.loads(json.dumps(c))
        text = c.get("text_config", c)
        text["linear_attn_config"][key] = value
        with pytest.raises(KimiAuditError):
            model_config_from_dict(c)


# --- 5. a Content-Range the listing contradicts ---------------------------------------------------------------


def test_a_content_range_total_the_listing_contradicts(hub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A part cut short on the server, whose ranged answers claim the full size: honest, the cut is DATA_PAST_EOF;
    lying, the two sizes disagreeing is itself the error, never a PASS."""
    root = tmp_path / "repo"
    root.mkdir()
    full = Q2K.read_bytes()
    (root / "m.gguf").write_bytes(full[: len(full) - 4096])
    hub.add_repo("test-org/cut-gguf", root)
    honest = runner.invoke(app, ["audit", "test-org/cut-gguf", "--no-progress", "--json"])
    assert honest.exit_code == 1 and "DATA_PAST_EOF" in honest.stdout
    hub.add_fault("lie_total", times=100, match="m.gguf", method="GET", total=len(full))
    lying = runner.invoke(app, ["audit", "test-org/cut-gguf", "--no-progress", "--json"])
    assert lying.exit_code != 0, lying.stdout
    assert "lists" in lying.stdout and f"{len(full):,}" in lying.stdout


# --- 9. JSON keeps no raw bidi character; --include is bounded --------------------------------------------------


def test_json_escapes_bidi_and_format_characters(tiny_dir: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "c"
    shutil.copytree(tiny_dir, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "kimi_k2\u202e\u2066x"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "r.json"
    written = runner.invoke(app, ["audit", str(ckpt), "--no-progress", "-o", str(out)])
    result = runner.invoke(app, ["audit", str(ckpt), "--no-progress", "--json"])
    assert result.exit_code == written.exit_code == 0, result.output  # its `architectures` names the model
    for text in (result.stdout, out.read_text(encoding="utf-8")):
        assert "\u202e" not in text and "\u2066" not in text
        assert "\\u202e" in text
        assert json.loads(text)["model"]["model_type"] == "kimi_k2\u202e\u2066x"  # the same value, escaped


def test_an_include_glob_is_bounded(tiny_dir: Path) -> None:
    result = runner.invoke(app, ["audit", str(tiny_dir), "--include", "[" * 20_000, "--no-progress"])
    assert result.exit_code == 2 and "at most 1,024" in result.output


# --- a stranger's attack on this round's surfaces: values llama.cpp's loader asserts against ---------------------


@pytest.mark.parametrize(("key", "vtype", "value"), [
    ("deepseek2.expert_used_count", U32, 5),  # llama-model.cpp:1362 n_expert_used_max <= n_expert
    ("deepseek2.expert_used_count", U32, 0),  # :1364 n_expert_used_max > 0
    ("deepseek2.expert_group_count", U32, 4),  # :1365 n_expert_groups < n_expert
    ("deepseek2.expert_group_count", U32, 3),  # :1367 n_expert % n_expert_groups == 0
    ("deepseek2.nextn_predict_layers", U32, 9),  # :1330 n_layer_nextn <= n_layer_all
    ("deepseek2.vocab_size", U32, 129),  # deepseek2.cpp: token_embd created {n_embd, n_vocab}
    ("tokenizer.ggml.model", STRING, "bogus"),  # llama-vocab.cpp:2151 "unknown tokenizer"
    ("tokenizer.ggml.token_type", ARRAY, [1] * 5),  # llama-vocab.cpp:2502 one per token
])
def test_a_value_llama_cpp_asserts_against(tmp_path: Path, key: str, vtype: int, value: object) -> None:
    item = I32 if isinstance(value, list) else None
    report = audit(rewrite(tmp_path / "v.gguf", lambda g: g.set(key, vtype, value, item)))
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_VALUE"], codes(report)
    assert report.findings[0].tensor == key


@pytest.mark.parametrize("key", ["deepseek2.block_count", "deepseek2.attention.head_count",
                                 "deepseek2.rope.dimension_count"])
def test_a_key_the_layout_needs_missing_is_one_finding_not_exit_2(tmp_path: Path, key: str) -> None:
    """Absent, a key the layout is derived from is GGUF_KEY_MISSING naming it (exit 1), as any other key llama.cpp
    requires: the file was read, and is wrong."""
    report = audit(rewrite(tmp_path / "m.gguf", lambda g: g.kv.pop(key)))
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_MISSING"] and report.findings[0].tensor == key


ARCHS = Path(__file__).resolve().parent / "data" / "gguf_archs"


@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa"])
def test_the_indexers_top_k_is_required(tmp_path: Path, arch: str) -> None:
    """src/models/deepseek32.cpp and glm-dsa.cpp get_key the indexer's top_k, required."""
    out = tmp_path / "t.gguf"
    g = gb.read(ARCHS / arch / "tiny-Q8_0.gguf")
    g.kv.pop(f"{arch}.attention.indexer.top_k")
    gb.write(g, out)
    report = audit(out)
    assert codes(report) == ["GGUF_KEY_MISSING"] and report.findings[0].tensor == f"{arch}.attention.indexer.top_k"


def test_glm_indexer_types_longer_than_the_blocks(tmp_path: Path) -> None:
    """get_key_or_arr: an array of another length than block_count is "wrong array length", whatever its length."""
    out = tmp_path / "t.gguf"
    g = gb.read(ARCHS / "glm-dsa" / "tiny-Q8_0.gguf")
    g.set("glm-dsa.attention.indexer.types", ARRAY, [1] * 1000, 7)
    gb.write(g, out)
    report = audit(out)
    assert codes(report) == ["GGUF_KEY_VALUE"] and report.findings[0].tensor == "glm-dsa.attention.indexer.types"


def test_a_q8_1_weight_is_no_pass(tmp_path: Path) -> None:
    """Q8_1 is an intermediate of ggml's dot products: ggml_validate_row_data refuses it ("invalid type"), and a
    weight stored in it is no weight llama.cpp loads; the header says so, without --values."""
    def q8_1(g: gb.Gguf) -> None:
        t = g.tensor("blk.0.attn_q_b.weight")
        t.type_id, t.data = 9, bytes(t.ne[0] * t.ne[1] // 32 * 36)

    report = audit(rewrite(tmp_path / "q.gguf", q8_1))
    assert report.verdict() == "FAIL" and codes(report) == ["DTYPE_MISMATCH"]
    assert "ggml type llama.cpp loads a weight in" in report.findings[0].message


def test_config_disagrees_names_the_key_that_explains_the_shapes(tmp_path: Path) -> None:
    """deepseek32's indexer head_count 4 over 2 stored: one CONFIG_DISAGREES naming that key (the layout derived
    again with it at 2 gives every tensor its shape, the product-sized attn_q_b too), not embedding_length, which
    shares the value 128 by chance."""
    out = tmp_path / "t.gguf"
    g = gb.read(ARCHS / "deepseek32" / "tiny-Q8_0.gguf")
    g.set("deepseek32.attention.indexer.head_count", U32, 4)
    gb.write(g, out)
    report = audit(out)
    assert codes(report) == ["CONFIG_DISAGREES"]
    assert report.findings[0].tensor == "deepseek32.attention.indexer.head_count" and report.findings[0].covers == 6


# --- one cause, one finding, on the container -------------------------------------------------------------------


def test_a_shape_past_64_bits_is_shape_invalid_alone(tmp_path: Path) -> None:
    """gguf.cpp refuses dimensions whose product passes int64: SHAPE_INVALID naming the tensor, not the overlaps
    its nonsense extent would make with every tensor after it."""
    report = audit(rewrite(tmp_path / "s.gguf", lambda g: setattr(g.tensor("output_norm.weight"), "ne",
                                                                     [2**32, 2**32, 2**32])))
    assert codes(report) == ["SHAPE_INVALID"] and report.findings[0].tensor == "output_norm.weight"


def test_a_huge_tensor_is_one_past_eof_not_an_overlap_per_tensor(tmp_path: Path) -> None:
    report = audit(rewrite(tmp_path / "h.gguf", lambda g: setattr(g.tensors[0], "ne", [g.tensors[0].ne[0], 2**40])))
    assert "DATA_PAST_EOF" in codes(report) and "OFFSETS_OVERLAP" not in codes(report)
    assert len([f for f in report.findings if f.severity.value == "error"]) <= 2


def test_an_alignment_not_the_one_written_with_is_one_finding(tmp_path: Path) -> None:
    """general.alignment 64 over tensors laid at 32: one GGUF_MISALIGNED for the part, the rest counted."""
    g = gb.read(Q2K)
    at = laid_out(g)
    for t in g.tensors:
        t.offset = at[t.name]
    g.set("general.alignment", U32, 64)
    g.alignment = 32
    gb.write(g, tmp_path / "a.gguf")
    # the header's padding is to 32 as written; re-pad its data start as a writer that used 32 would
    report = audit(tmp_path / "a.gguf")
    mis = [f for f in report.findings if f.code == "GGUF_MISALIGNED"]
    assert report.verdict() == "FAIL" and len(mis) == 1 and mis[0].covers > 1


def test_split_keys_that_cannot_be_read_are_no_missing_part(tmp_path: Path) -> None:
    """split.tensors.count deleted from part 1, split.no as UINT32 in part 3: each its own finding, neither part
    also 'not in the set'."""
    d = tmp_path / "set"
    shutil.copytree(DATA / "Q8_0", d)
    first, third = d / "tiny-Q8_0-00001-of-00004.gguf", d / "tiny-Q8_0-00003-of-00004.gguf"
    g = gb.read(first)
    g.kv.pop("split.tensors.count")
    gb.write(g, first)
    g = gb.read(third)
    g.set("split.no", U32, 2)
    gb.write(g, third)
    report = audit(d)
    assert sorted(codes(report)) == ["GGUF_KEY_TYPE", "GGUF_SPLIT_INVALID"]


def test_expert_count_missing_over_stored_experts_is_one_finding(tmp_path: Path) -> None:
    report = audit(rewrite(tmp_path / "e.gguf", lambda g: g.kv.pop("deepseek2.expert_count")))
    assert codes(report) == ["GGUF_KEY_MISSING"] and report.findings[0].tensor == "deepseek2.expert_count"


def test_weights_stored_in_a_type_llama_cpp_refuses_are_one_cause_in_gguf_words(tmp_path: Path) -> None:
    """Three weights stored Q8_1 are one QUANT_FORMAT_MISMATCH (one choice of the quantizer), worded for a GGUF,
    which has no quantization_config to blame."""
    def q8_1(g: gb.Gguf) -> None:
        for layer in range(3):
            t = g.tensor(f"blk.{layer}.attn_q_b.weight")
            t.type_id, t.data = 9, bytes(t.ne[0] * t.ne[1] // 32 * 36)

    report = audit(rewrite(tmp_path / "q.gguf", q8_1))
    assert codes(report) == ["QUANT_FORMAT_MISMATCH"] and report.findings[0].covers == 3
    message = report.findings[0].message
    assert "quantization_config" not in message and "3 weights are stored Q8_1" in message
