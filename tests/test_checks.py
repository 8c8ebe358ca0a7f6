"""Each check sees the fault injected for it, named with the right tensor; a clean checkpoint has none."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kimi_audit.checks.audit import audit_checkpoint, audit_source
from kimi_audit.findings import Severity
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.sources import LocalSource
from tiny_checkpoint import TINY_CONFIG, tiny_shards, write_tiny

S1, S2, S3 = "model-1-of-3.safetensors", "model-2-of-3.safetensors", "model-3-of-3.safetensors"
L1 = "model.layers.1."


def audit(path: Path):
    """The audit of a loaded checkpoint, held to the one straight from its source."""
    report = audit_checkpoint(load_checkpoint(LocalSource(path)))
    assert report == audit_source(LocalSource(path))
    return report


def found(report, code: str) -> list[tuple[str | None, str]]:
    return [(f.tensor, f.severity.value) for f in report.findings if f.code == code]


def only_codes(report) -> set[str]:
    return {f.code for f in report.findings}


def mutated(tmp_path: Path, mutate, config: dict | None = None) -> Path:
    shards = tiny_shards()
    mutate(shards)
    return write_tiny(tmp_path / "ckpt", shards, config)


def edit_json(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def test_clean_tiny_checkpoint_has_no_findings(tiny_dir):
    r = audit(tiny_dir)
    assert r.findings == ()
    assert r.exit_code() == 0
    assert r.stats.shards == 3


def test_missing_tensor(tmp_path):
    name = L1 + "self_attn.kv_a_layernorm.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].pop(name)))
    assert found(r, "TENSOR_MISSING") == [(name, "error")]
    assert r.exit_code() == 1


def test_unexpected_tensor(tmp_path):
    name = L1 + "self_attn.extra_bias"
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, np.zeros(4, np.float32))))
    assert found(r, "TENSOR_UNEXPECTED") == [(name, "error")]


def test_wrong_dtype(tmp_path):
    name = L1 + "input_layernorm.weight"
    # F16 in a BF16 checkpoint: no writer variance explains it
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, s[S2][name].astype(np.float16))))
    assert found(r, "DTYPE_MISMATCH") == [(name, "error")]
    f = next(f for f in r.findings if f.code == "DTYPE_MISMATCH")
    assert (f.expected, f.actual) == ("BF16", "F16")


def cast_all(shards, suffix, dtype):
    for tensors in shards.values():
        for n in [n for n in tensors if n.endswith(suffix)]:
            tensors[n] = tensors[n].astype(dtype)


def test_a_norm_in_float32_is_writer_variance(tmp_path):
    """Issue 23: gains kept in float32 in a BF16 checkpoint (config's dtype or F32 explain it) are info, where the
    writer kept every one of them so."""
    r = audit(mutated(tmp_path, lambda s: cast_all(s, "input_layernorm.weight", np.float32)))
    variance = found(r, "WRITER_DTYPE")  # one convention, one info for every gain
    assert len(variance) == 1 and {sev for _, sev in variance} == {"info"}
    assert r.exit_code() == 0
    f = next(f for f in r.findings if f.code == "WRITER_DTYPE")
    assert (f.expected, f.actual, f.covers) == ("BF16", "F32", TINY_CONFIG["num_hidden_layers"])


def test_one_norm_cast_unlike_its_siblings_is_an_error(tmp_path):
    """Issue 33: variance is uniform. One layer's gain in F32 where the others are BF16 was an info WRITER_DTYPE,
    exit unaffected; a tensor cast on its own is an error naming how its siblings are stored."""
    name = L1 + "input_layernorm.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, s[S2][name].astype(np.float32))))
    assert found(r, "DTYPE_MISMATCH") == [(name, "error")] and found(r, "WRITER_DTYPE") == []
    f = next(f for f in r.findings if f.code == "DTYPE_MISMATCH")
    assert (f.expected, f.actual) == ("BF16", "F32") and "unlike its siblings" in f.message


def test_wrong_shape(tmp_path):
    name = L1 + "self_attn.q_a_layernorm.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, s[S2][name][:191].copy())))
    assert found(r, "SHAPE_MISMATCH") == [(name, "error")]
    qa = r.q_a_layernorm
    bad = [row for row in qa.rows if not row.ok]
    assert [row.layer for row in bad] == [1]
    moe = next(t for t in qa.totals if t.block == "moe")
    assert (moe.blocks, moe.params) == (2, 2 * 192 + 191)
    assert moe.line(192) == "2 MoE blocks (of 3 defined) × 192 ≠ 575"


def test_fp8_weight_without_scale(tmp_path):
    scale = L1 + "mlp.experts.3.up_proj.weight_scale_inv"
    r = audit(mutated(tmp_path, lambda s: s[S2].pop(scale)))
    assert found(r, "SCALE_MISSING") == [(scale, "error")]


def test_scale_without_weight(tmp_path):
    weight = L1 + "mlp.experts.3.up_proj.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].pop(weight)))
    assert found(r, "SCALE_ORPHAN") == []  # its weight's TENSOR_MISSING covers it (one cause)
    assert found(r, "TENSOR_MISSING") == [(weight, "error")] and r.findings[0].covers == 1


def test_scale_of_wrong_shape_and_dtype(tmp_path):
    a = L1 + "self_attn.kv_a_proj_with_mqa.weight_scale_inv"  # [ceil(112/128), ceil(320/128)] = [1, 3]
    b = L1 + "self_attn.o_proj.weight_scale_inv"

    def mutate(s):
        s[S2][a] = np.ones((1, 2), np.float32)
        s[S2][b] = s[S2][b].astype(ml_dtypes.bfloat16)

    r = audit(mutated(tmp_path, mutate))
    assert found(r, "SCALE_SHAPE") == [(a, "error")]
    assert found(r, "SCALE_DTYPE") == [(b, "error")]


def test_an_f16_fp8_scale_is_accepted_with_a_warning(tmp_path):
    """Third-party FP8 checkpoints store some weight_scale_inv as F16: it loads, so a warning, not an error."""
    b = L1 + "self_attn.o_proj.weight_scale_inv"
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(b, s[S2][b].astype(np.float16))))
    assert [(f.code, f.tensor, f.severity.value) for f in r.findings] == [("SCALE_DTYPE", b, "warning")]
    assert r.exit_code() == 0 and "F16" in r.findings[0].message


def test_scale_in_another_shard_than_its_weight(tmp_path):
    scale = L1 + "self_attn.q_a_proj.weight_scale_inv"
    r = audit(mutated(tmp_path, lambda s: s[S3].__setitem__(scale, s[S2].pop(scale))))
    # info (issue 23): the published DeepSeek-V3 does it, its loaders cope
    assert found(r, "SCALE_SHARD_SPLIT") == [(scale, "info")]
    assert r.exit_code() == 0 and r.exit_code("warning") == 0


def test_fp8_weight_the_layout_does_not_expect_and_has_no_scale(tmp_path):
    name = L1 + "self_attn.mystery_proj.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, np.zeros((4, 4), ml_dtypes.float8_e4m3fn))))
    assert found(r, "TENSOR_UNEXPECTED") == [(name, "error")]
    assert found(r, "SCALE_MISSING") == [(L1 + "self_attn.mystery_proj.weight_scale_inv", "error")]


def test_buffer_shape_is_info_and_never_a_parameter(tmp_path):
    """A stored buffer (rotary_emb.inv_freq, non-persistent: every loader drops it) of any shape is info."""
    name = L1 + "self_attn.rotary_emb.inv_freq"
    clean = audit_source(LocalSource(mutated(tmp_path / "a", lambda s: None)))
    r = audit(mutated(tmp_path, lambda s: s[S2].__setitem__(name, np.ones(14, ml_dtypes.bfloat16))))
    assert found(r, "BUFFER_SHAPE") == [(name, "info")]
    assert r.exit_code() == 0 and r.exit_code(Severity.WARNING) == 0
    assert r.stats.parameters == clean.stats.parameters
    assert r.stats.elements_of("buffer") == clean.stats.elements_of("buffer") + 6


def test_tensor_in_other_shard_than_index_says(tiny_copy):
    name = L1 + "post_attention_layernorm.weight"
    edit_json(tiny_copy / "model.safetensors.index.json", lambda o: o["weight_map"].__setitem__(name, S1))
    r = audit(tiny_copy)
    assert found(r, "INDEX_SHARD_MISMATCH") == [(name, "error")]
    f = next(f for f in r.findings if f.code == "INDEX_SHARD_MISMATCH")
    assert (f.expected, f.actual) == (S1, S2)


def test_tensor_not_in_index(tiny_copy):
    name = "model.layers.3.mlp.gate.weight"
    edit_json(tiny_copy / "model.safetensors.index.json", lambda o: o["weight_map"].pop(name))
    assert found(audit(tiny_copy), "INDEX_ENTRY_MISSING") == [(name, "error")]


def test_index_lists_a_tensor_its_shard_lacks(tiny_copy):
    name = "model.layers.3.mlp.ghost.weight"
    edit_json(tiny_copy / "model.safetensors.index.json", lambda o: o["weight_map"].__setitem__(name, S3))
    assert found(audit(tiny_copy), "INDEX_TENSOR_ABSENT") == [(name, "error")]


def test_index_entry_whose_shard_is_absent(tiny_copy):
    (tiny_copy / S3).unlink()
    r = audit(tiny_copy)
    absent = [f for f in r.findings if f.code == "INDEX_SHARD_ABSENT"]
    assert [f.shard for f in absent] == [S3]
    listed = sum(1 for s in json.loads((tiny_copy / "model.safetensors.index.json").read_text())["weight_map"].values()
                 if s == S3)
    assert absent[0].covers == listed > 0  # one finding for the shard, none per tensor it holds
    assert not {"TENSOR_MISSING", "SCALE_MISSING", "INDEX_TENSOR_ABSENT"} & only_codes(r)
    assert r.headline() == "PARTIAL: 1 of 3 shards absent" and r.verdict() == "PARTIAL" and r.exit_code() == 1
    assert "INDEX_TOTAL_SIZE" not in only_codes(r)  # the payload of an absent shard is unknown, not zero


@pytest.mark.parametrize("evil", ["../outside.safetensors", "/etc/passwd", "a/../../b.safetensors", "C:\\x"])
def test_index_shard_names_that_escape_are_refused(tiny_copy, evil):
    canary = tiny_copy.parent / "outside.safetensors"
    canary.write_bytes(b"\0" * 16)
    edit_json(tiny_copy / "model.safetensors.index.json",
              lambda o: o["weight_map"].__setitem__("model.layers.3.mlp.gate.weight", evil))
    r = audit(tiny_copy)
    unsafe = [f for f in r.findings if f.code == "INDEX_UNSAFE_PATH"]
    assert len(unsafe) == 1 and unsafe[0].severity is Severity.ERROR
    assert all(f.shard != "outside.safetensors" for f in r.findings if f.code.startswith("HEADER"))
    assert r.exit_code() == 1


def test_total_size_disagrees_with_payloads(tiny_copy):
    edit_json(tiny_copy / "model.safetensors.index.json", lambda o: o["metadata"].__setitem__("total_size", 5))
    r = audit(tiny_copy)
    f = next(f for f in r.findings if f.code == "INDEX_TOTAL_SIZE")
    assert f.actual == 5 and f.expected == r.stats.payload_bytes


def test_invalid_index_json(tiny_copy):
    (tiny_copy / "model.safetensors.index.json").write_text("{not json")
    assert "INDEX_INVALID" in only_codes(audit(tiny_copy))


def test_index_with_a_lone_surrogate_escape_is_invalid(tiny_copy):
    path = tiny_copy / "model.safetensors.index.json"
    text = path.read_text()
    path.write_text(text.replace('"weight_map": {', '"weight_map": {"bad\\ud800name": "model-1-of-2.safetensors", ', 1))
    f = next(f for f in audit(tiny_copy).findings if f.code == "INDEX_INVALID")
    assert "surrogate" in f.message


@pytest.mark.parametrize("key, value", [("fmt", "e5m2"), ("weight_block_size", [64, 64])])
def test_quantization_config_must_be_fp8_e4m3_128(tmp_path, key, value):
    cfg = json.loads(json.dumps(TINY_CONFIG))
    cfg["quantization_config"][key] = value
    r = audit(mutated(tmp_path, lambda s: None, cfg))
    assert (f"quantization_config.{key}", "error") in found(r, "QUANT_CONFIG")


@pytest.mark.parametrize("q", [{"quant_method": "int4"}, {"quant_method": "compressed-tensors", "format": "marlin-24"}])
def test_an_unknown_quantization_is_one_finding_naming_it(tmp_path, q):
    """QUANT_UNSUPPORTED names the method or format; the Linear modules' tensors are not reported one by one,
    and the other checks still run (a fault elsewhere is still found)."""
    cfg = dict(json.loads(json.dumps(TINY_CONFIG)), quantization_config=q)
    norm = L1 + "input_layernorm.weight"
    r = audit(mutated(tmp_path, lambda s: s[S2].pop(norm), cfg))
    assert only_codes(r) == {"QUANT_UNSUPPORTED", "TENSOR_MISSING"}
    (f,) = [f for f in r.findings if f.code == "QUANT_UNSUPPORTED"]
    assert repr(q.get("format", q["quant_method"])) in f.message and f.severity.value == "error"
    assert found(r, "TENSOR_MISSING") == [(norm, "error")]


def test_tensor_in_two_shards(tiny_copy):
    from tiny_checkpoint import write_safetensors

    name = "model.norm.weight"
    write_safetensors(tiny_copy / "model-extra.safetensors", {name: np.ones(320, ml_dtypes.bfloat16)})
    r = audit(tiny_copy)
    assert found(r, "TENSOR_DUPLICATE") == [(name, "error")]
    assert "SHARD_NOT_IN_INDEX" in only_codes(r)


def test_pickle_files_are_reported_not_opened(tiny_copy):
    (tiny_copy / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    r = audit(tiny_copy)
    assert [(f.code, f.shard) for f in r.findings] == [("PICKLE_NOT_INSPECTED", "pytorch_model.bin")]


def test_corrupt_shard_header_is_a_finding_not_a_crash(tiny_copy):
    data = bytearray((tiny_copy / S2).read_bytes())
    data[8] = ord("[")
    (tiny_copy / S2).write_bytes(bytes(data))
    r = audit(tiny_copy)
    assert ("HEADER_INVALID_JSON", S2) in {(f.code, f.shard) for f in r.findings}
    assert r.exit_code() == 1


def test_an_index_that_lists_a_tensor_elsewhere_is_not_as_listed(tiny_copy):
    name = L1 + "input_layernorm.weight"
    edit_json(tiny_copy / "model.safetensors.index.json", lambda o: o["weight_map"].__setitem__(name, S3))
    assert found(audit(tiny_copy), "INDEX_SHARD_MISMATCH") == [(name, "error")]


def test_a_checkpoint_outside_the_family_gets_the_format_checks_and_one_warning(tmp_path):
    from tiny_checkpoint import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                      "hidden_size": 8, "num_hidden_layers": 1}))
    write_safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": np.ones((4, 8), np.float32),
                                                       "model.norm.weight": np.ones(8, np.float32)})
    r = audit(tmp_path)
    assert only_codes(r) == {"LAYOUT_UNSUPPORTED"} and r.exit_code() == 3 and r.verdict() == "INCONCLUSIVE"
    (f,) = r.findings
    assert "'llama'" in f.message and "LlamaForCausalLM" in f.message and f.severity is Severity.WARNING
    assert r.stats.tensors == 2 and r.stats.parameters == 40
    (tmp_path / "model.safetensors").write_bytes(b"\x04\0\0\0\0\0\0\0{oops")
    assert only_codes(audit(tmp_path)) == {"LAYOUT_UNSUPPORTED", "HEADER_INVALID_JSON"}


def test_a_missing_weight_covers_its_own_scales(tmp_path):
    """Issue 33: a missing weight also reported its stored scale as SCALE_ORPHAN (two findings, one cause); the
    weight's TENSOR_MISSING now stands for its quantization tensors and names them."""
    name = "model.layers.1.self_attn.q_a_proj.weight"

    def drop(s):
        for tensors in s.values():
            tensors.pop(name, None)
    r = audit(mutated(tmp_path, drop))
    assert [(f.code, f.tensor, f.covers) for f in r.findings] == [("TENSOR_MISSING", name, 1)]
    assert "q_a_proj.weight_scale_inv stored without it" in r.findings[0].message
