"""DeepSeek-V4.1 (`deepseek_v41`) against the loader that reads its published files: vLLM's
`vllm/models/deepseek_v4_1/` (tests/data/loader_names/deepseek_v41.vllm.json transcribes its modules and weights
mapper, commits cited). transformers 5.25 has no deepseek_v41, so nothing below is taken from this tool's layout:
- for a config with every layer kind (sliding window; ratio 1 and 2; kv source, index source, both; two Engram
  layers), the table's names are the layout's text-model names, with the table's shapes, and its dtypes where
  vLLM fixes them (block FP8 in 32 x 32 blocks with F8_E8M0 scales, FP4 experts, the unquantized projections,
  the Engram table with its per-row scales);
- a tiny checkpoint built from the table alone audits clean; the vision tower, aligner, image embeddings, vision
  routing biases and MTP stages stored beside it are one TENSORS_UNDESCRIBED each.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from kimi_audit import audit
from kimi_audit.errors import ConfigError
from kimi_audit.findings import Severity
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from loader_tables import dim

TABLE = json.loads((Path(__file__).parent / "data" / "loader_names" / "deepseek_v41.vllm.json").read_text())
BLOCK = 32
TEXT: dict[str, Any] = {
    "model_type": "deepseek_v41_text", "vocab_size": 64, "hidden_size": 64, "moe_intermediate_size": 32,
    "num_hidden_layers": 5, "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
    "o_lora_rank": 32, "o_groups": 2, "index_n_heads": 2, "index_head_dim": 32, "n_routed_experts": 4,
    "n_shared_experts": 1, "num_experts_per_tok": 2, "hc_mult": 2, "compress_ratios": [0, 1, 2, 1, 2, 0],
    "kv_source_layer_ids": [1, 2], "index_source_layer_ids": [1, 3], "engram_layer_ids": [1, 4],
    "engram_num_embeddings": [50, 60], "engram_max_ngram_size": 3, "engram_n_heads": 2, "engram_head_dim": 64,
    "num_nextn_predict_layers": 1, "dtype": "bfloat16"}
"""Layer 0 sliding window; 1 ratio 1, kv and index source, Engram; 2 ratio 2, kv source; 3 ratio 1, index source
(its keys from layer 1); 4 ratio 2, consumer, Engram."""
CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"],
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [32, 32],
                            "expert_dtype": "fp4"},
    "text_config": TEXT, "vision_config": {"n_layers": 2}}


def stored(name: str, shape: tuple[int, ...], how: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The tensors vLLM's loader reads for one table entry, as the release stores it."""
    out, inp = shape[0], shape[-1]
    if how == "fp8":
        return {f"{name}.weight": (shape, "F8_E4M3"),
                f"{name}.scale": ((math.ceil(out / BLOCK), math.ceil(inp / BLOCK)), "F8_E8M0")}
    if how == "fp4":
        return {f"{name}.weight": ((out, inp // 2), "I8"), f"{name}.scale": ((out, inp // BLOCK), "F8_E8M0")}
    return {name: (shape, {"plain": "BF16"}.get(how, how))}


def table_tensors() -> dict[str, tuple[tuple[int, ...], str]]:
    out: dict[str, tuple[tuple[int, ...], str]] = {}

    def put(prefix: str, entries: dict[str, Any], **names: int) -> None:
        for name, (shape, how) in entries.items():
            out.update(stored(prefix + name, tuple(dim(d, {**TEXT, **names}) for d in shape), how))

    put("", TABLE["top"])
    for i in range(TEXT["num_hidden_layers"]):
        at = f"layers.{i}."
        put(at, TABLE["layer"])
        for e in range(TEXT["n_routed_experts"]):
            put(at, {k.format(e=e): v for k, v in TABLE["expert"].items()})
        ratio = TEXT["compress_ratios"][i]
        kv, ix = i in TEXT["kv_source_layer_ids"], i in TEXT["index_source_layer_ids"]
        if kv and ratio:
            put(at, TABLE["compressor"])
            if ratio > 1:
                put(at, TABLE["compressor_gate"])
        if ix:
            put(at, TABLE["indexer"])
            if kv:
                put(at, TABLE["indexer_keys"])
        if i in TEXT["engram_layer_ids"]:
            put(at, TABLE["engram"], rows=TEXT["engram_num_embeddings"][TEXT["engram_layer_ids"].index(i)])
    return out


def test_the_table_cites_vllm() -> None:
    assert {m.group(1) for m in re.finditer(r"vllm-project/vllm@([0-9a-f]{40})", TABLE["source"])}


def test_vllms_names_shapes_and_dtypes_are_the_layouts() -> None:
    want = table_tensors()
    got = {n: (t.shape, t.dtype) for n, t in expected_layout(model_config_from_dict(CONFIG)).items()}
    assert set(want) == set(got), (sorted(set(want) - set(got))[:5], sorted(set(got) - set(want))[:5])
    assert {n: (s, got[n][0]) for n, (s, _) in want.items() if got[n][0] != s} == {}
    assert {n: (d, got[n][1]) for n, (_, d) in want.items() if d != "-" and got[n][1] != d} == {}


TORCH = {"BF16": torch.bfloat16, "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn,
         "F8_E8M0": torch.float8_e8m0fnu, "I8": torch.int8}
EXTRA = {"vision.patch_embed.weight": (8, 8), "aligner.proj.weight": (8, 8), "image_newline": (8,),
         "layers.2.ffn.gate.bias_vl": (4,), "mtp.0.attn_norm.weight": (64,)}
"""Tensors of the parts not described, one of each."""


def write(d: Path, tensors: dict[str, tuple[tuple[int, ...], str]]) -> Path:
    """The tensors (ones of their dtype: F8_E8M0 scales 2^0) in two shards, with an index and config.json."""
    d.mkdir()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, members in shards.items():
        save_file({n: torch.ones(tensors[n][0]).to(TORCH[tensors[n][1]]) for n in members}, str(d / shard),
                  metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: s for s, ms in shards.items() for n in ms}}))
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def release_tensors() -> dict[str, tuple[tuple[int, ...], str]]:
    """The table's tensors, a dtype the loader leaves open ('-') written F32 (norms, the routing bias) or BF16
    (the router gate)."""
    return {n: (s, d if d != "-" else "BF16" if n.endswith("gate.weight") else "F32")
            for n, (s, d) in table_tensors().items()}


def test_a_release_named_checkpoint_audits_clean(tmp_path: Path) -> None:
    tensors = release_tensors()
    report = audit(write(tmp_path / "v41", {**tensors, **{n: (s, "BF16") for n, s in EXTRA.items()}}))
    assert [f.code for f in report.findings if f.severity is not Severity.INFO] == []
    assert sorted(f.tensor or "" for f in report.findings if f.code == "TENSORS_UNDESCRIBED") == sorted(EXTRA)
    assert report.exit_code() == 0


def test_the_published_config_without_fmt_and_an_fp8_mtp_projection(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40: DeepSeek-V4.1's config as published has no `fmt` (no loader reads it); the undescribed MTP stage's
    FP8 `main_proj` with its `.scale` is part of that stage's one TENSORS_UNDESCRIBED, not two scale errors."""
    config = json.loads(json.dumps(CONFIG))
    q = config.get("quantization_config") or config["text_config"]["quantization_config"]
    del q["fmt"]
    monkeypatch.setitem(globals(), "CONFIG", config)
    mtp = {"mtp.0.main_proj.weight": ((64, 128), "F8_E4M3"), "mtp.0.main_proj.scale": ((2, 4), "F8_E8M0")}
    report = audit(write(tmp_path / "v41", {**release_tensors(), **{n: (s, "BF16") for n, s in EXTRA.items()},
                                            **mtp}))
    assert [f.code for f in report.findings if f.severity is not Severity.INFO] == []
    stage = [f for f in report.findings if f.code == "TENSORS_UNDESCRIBED" and (f.tensor or "").startswith("mtp.")]
    assert len(stage) == 1 and stage[0].actual == 3 and report.exit_code() == 0


def test_a_missing_engram_scale_is_one_finding(tmp_path: Path) -> None:
    tensors = release_tensors()
    del tensors["layers.4.engram.embed.scale"]
    report = audit(write(tmp_path / "v41", tensors))
    assert [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR] == [
        ("SCALE_MISSING", "layers.4.engram.embed.scale")]


@pytest.mark.parametrize(("keys", "match"), [({"compress_ratios": [0, 4, 0, 0, 0]}, "compress_ratios"),
                                             ({"engram_num_embeddings": [50]}, "engram_num_embeddings"),
                                             ({"kv_source_layer_ids": [3]}, "compressed layer 1")])
def test_a_bad_v41_config_is_a_config_error(keys: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        model_config_from_dict({**CONFIG, "text_config": {**TEXT, **keys}})
