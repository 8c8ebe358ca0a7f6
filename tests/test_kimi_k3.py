"""Kimi K3 (`kimi_k3`) against the loaders that read its published files (tests/data/loader_names/kimi_k3.json:
rtp-llm's manifest of every text-model name, SGLang's modules for their shapes and dtypes, llama.cpp's MXFP4
repack for the experts' packing). transformers 5.25 has no kimi_k3, so nothing of the layout is taken from this
tool: the names, shapes and dtypes below are the table's, evaluated on the config.

- Published config (kimi_audit/data/kimi-k3.config.json; its sources, and how its `quantization_config` is
  completed, in kimi-k3.sources.md): the table's names are the layout's, 497,052 tensors, with the table's
  shapes and dtypes.
- A tiny release-named checkpoint built from the table alone, its experts compressed by compressed-tensors' own
  MXFP4 compressor, audits clean; its vision tensors are one TENSORS_UNDESCRIBED each part.
"""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig
from safetensors.torch import save_file

from ct_checkpoint import compress_module, preset_scheme
from kimi_audit import audit
from kimi_audit.errors import ConfigError
from kimi_audit.findings import Severity
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout
from loader_tables import dim

DATA = Path(__file__).parent / "data"
TABLE = json.loads((DATA / "loader_names" / "kimi_k3.json").read_text())
PUBLISHED = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k3.config.json").read_text())
EXPERTS = r"re:.*block_sparse_moe\.experts\.\d+\.w[123]$"
HUB_TOTAL = 2_779_931_837_184
"""The Hub's parameter count for moonshotai/Kimi-K3 (../shared/reference/family.md): text model and vision tower."""

TINY: dict[str, Any] = {
    "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "tie_word_embeddings": False,
    "text_config": {
        "model_type": "kimi_linear", "attn_res_block_size": 2, "first_k_dense_replace": 1, "hidden_act": "situ",
        "hidden_size": 64, "intermediate_size": 96, "kv_lora_rank": 16, "latent_moe_use_norm": True,
        "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2, 4], "head_dim": 8, "num_heads": 4,
                               "short_conv_kernel_size": 4, "use_full_rank_gate": True},
        "mla_use_nope": True, "mla_use_output_gate": True, "moe_intermediate_size": 32, "moe_layer_freq": 1,
        "num_attention_heads": 4, "num_experts": 4, "num_experts_per_token": 2, "num_hidden_layers": 4,
        "num_key_value_heads": 4, "num_shared_experts": 2, "q_lora_rank": 24, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "rms_norm_eps": 1e-5, "routed_expert_hidden_size": 32, "v_head_dim": 8,
        "vocab_size": 128, "dtype": "bfloat16"},
    "vision_config": {"patch_size": 14}}
"""Every K3 layer kind at toy size: a dense KDA layer, MoE KDA layers, a MoE MLA layer."""


def mxfp4_config() -> dict[str, Any]:
    """compressed-tensors' MXFP4A16 scheme on the routed experts only, as compressed-tensors serializes it."""
    fmt, scheme = preset_scheme("mxfp4a16", [EXPERTS])
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed")
    return qc.model_dump(mode="json", exclude_none=True)


def with_experts_quantized(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with the experts' MXFP4 config group as compressed-tensors writes it (the published config's too)."""
    return {**raw, "text_config": {**raw["text_config"], "quantization_config": mxfp4_config()}}


def table_tensors(raw: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor the loaders read for this config: name -> (shape, dtype), experts stored in MXFP4."""
    text = raw["text_config"]
    out: dict[str, tuple[tuple[int, ...], str]] = {}

    def put(name: str, entry: list[Any]) -> None:
        out[name] = (tuple(dim(d, text) for d in entry[0]), entry[1])

    for name, entry in TABLE["top"].items():
        put(name, entry)
    kda = set(text["linear_attn_config"]["kda_layers"])
    for layer in range(text["num_hidden_layers"]):
        prefix = f"language_model.model.layers.{layer}."
        parts = {**TABLE["layer"], **(TABLE["kda"] if layer + 1 in kda else TABLE["mla"])}  # 1-indexed, as loaded
        moe = layer >= text["first_k_dense_replace"]
        parts.update(TABLE["moe"] if moe else TABLE["dense"])
        for name, entry in parts.items():
            put(prefix + name, entry)
        if moe:
            for e in range(text["num_experts"]):
                for w, (rows, cols) in TABLE["expert"].items():
                    out_, in_ = dim(rows, text), dim(cols, text)
                    for suffix, (_, packed, dtype) in TABLE["mxfp4"].items():
                        width = in_ // int(packed.split("/")[1])
                        out[f"{prefix}block_sparse_moe.experts.{e}.{w}.{suffix}"] = ((out_, width), dtype)
    return out


def test_the_table_cites_its_loaders() -> None:
    cited = re.findall(r"([\w.-]+/[\w.-]+)@([0-9a-f]{40})", TABLE["source"])
    assert [repo for repo, _ in cited] == ["alibaba/rtp-llm", "sgl-project/sglang", "ggml-org/llama.cpp"]


@pytest.mark.parametrize("config", ["published", "tiny"])
def test_the_loaders_names_shapes_and_dtypes_are_the_layouts(config: str) -> None:
    raw = with_experts_quantized(PUBLISHED if config == "published" else TINY)
    want = table_tensors(raw)
    got = {name: (t.shape, t.dtype) for name, t in expected_layout(model_config_from_dict(raw)).items()}
    assert set(want) == set(got), (sorted(set(want) - set(got))[:5], sorted(set(got) - set(want))[:5])
    assert {n: v for n, v in want.items() if got[n] != v} == {}
    if config == "published":
        assert len(got) == 497_052  # family.md: ~497,000 tensors, a vision tower beside them


def test_the_text_models_count_leaves_the_hubs_vision_tower() -> None:
    """The logical count of the published text model falls short of the Hub's total (text and vision) by less
    than a vision tower of a billion parameters."""
    raw = with_experts_quantized(PUBLISHED)
    text = raw["text_config"]
    logical = sum(math.prod(shape) for name, (shape, _) in table_tensors(raw).items() if ".experts." not in name)
    experts_per_layer = text["num_experts"] * sum(dim(r, text) * dim(c, text) for r, c in TABLE["expert"].values())
    logical += experts_per_layer * (text["num_hidden_layers"] - text["first_k_dense_replace"])
    assert 0 < HUB_TOTAL - logical < 10**9


def release_tensors(raw: dict[str, Any], seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """The table's tensors for `raw`: BF16/F32 as the table says, the experts compressed by compressed-tensors'
    MXFP4 compressor from BF16 weights of their logical shape; two vision tensors beside. With the logical
    parameter count of the text model."""
    gen = torch.Generator().manual_seed(seed)
    fmt, scheme = preset_scheme("mxfp4a16", [EXPERTS])
    text = raw["text_config"]
    tensors: dict[str, torch.Tensor] = {}
    logical = 0
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    for name, (shape, dtype) in table_tensors(raw).items():
        if ".experts." in name:
            if not name.endswith(".weight_packed"):
                continue
            module = name.removesuffix(".weight_packed")
            rows, cols = (dim(x, text) for x in TABLE["expert"][module.rpartition(".")[2]])
            w = (0.02 * torch.randn((rows, cols), generator=gen)).to(torch.bfloat16)
            tensors.update({f"{module}.{k}": v for k, v in compress_module(w, fmt, scheme).items()})
            logical += rows * cols
        else:
            base = torch.ones(shape) if name.endswith("norm.weight") else 0.02 * torch.randn(shape, generator=gen)
            tensors[name] = base.to(dtypes[dtype])
            logical += math.prod(shape)
    tensors["vision_tower.patch_embed.proj.weight"] = torch.zeros((8, 3, 2, 2), dtype=torch.bfloat16)
    tensors["mm_projector.proj.0.weight"] = torch.zeros((8, 8), dtype=torch.bfloat16)
    return tensors, logical


def write_release(d: Path, raw: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Two shards, an index, config.json."""
    d.mkdir(parents=True)
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, members in halves.items():
        save_file({n: tensors[n].contiguous() for n in members}, str(d / shard), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": {n: s for s, ms in halves.items() for n in ms}}))
    (d / "config.json").write_text(json.dumps(raw, indent=1))
    return d


def test_a_release_named_checkpoint_audits_clean(tmp_path: Path) -> None:
    raw = with_experts_quantized(TINY)
    tensors, logical = release_tensors(raw)
    report = audit(write_release(tmp_path / "k3", raw, tensors))
    assert [f.code for f in report.findings if f.severity is not Severity.INFO] == []
    undescribed = [f for f in report.findings if f.code == "TENSORS_UNDESCRIBED"]
    assert sorted(f.tensor or "" for f in undescribed) == ["mm_projector.proj.0.weight",
                                                          "vision_tower.patch_embed.proj.weight"]
    assert report.exit_code() == 0
    vision = sum(t.numel() for n, t in tensors.items() if n.startswith(("vision_tower.", "mm_projector.")))
    assert report.stats.parameters == logical + vision  # the undescribed tensors counted as stored, unchecked


L = "language_model.model.layers."


@pytest.mark.parametrize(("name", "stored", "code"), [
    (f"{L}2.block_sparse_moe.routed_expert_norm.weight", None, "TENSOR_MISSING"),
    (f"{L}1.self_attn.A_log", torch.zeros((1, 1, 4, 1)), "SHAPE_MISMATCH"),  # Kimi-Linear's shape of it
    (f"{L}3.self_attn.g_proj.weight", torch.zeros((32, 64)), "DTYPE_MISMATCH"),
    (f"{L}2.block_sparse_moe.experts.1.w2.weight_scale", None, "SCALE_MISSING"),
])
def test_a_k3_fault_is_one_finding(tmp_path: Path, name: str, stored: torch.Tensor | None, code: str) -> None:
    raw = with_experts_quantized(TINY)
    tensors, _ = release_tensors(raw)
    if stored is None:
        del tensors[name]
    else:
        tensors[name] = stored
    report = audit(write_release(tmp_path / "k3", raw, tensors))
    errors = [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR]
    assert errors == [(code, name)]


@pytest.mark.parametrize(("key", "value"), [("routed_expert_hidden_size", -1), ("attn_res_block_size", "12"),
                                            ("latent_moe_use_norm", "yes")])
def test_a_bad_k3_key_is_a_config_error(key: str, value: Any) -> None:
    raw = {**TINY, "text_config": {**TINY["text_config"], key: value}}
    with pytest.raises(ConfigError, match=key):
        model_config_from_dict(raw)


def test_an_f32_router_bias_is_writer_variance_not_an_error(tmp_path: Path) -> None:
    """Issue 40: the loader the table cites (SGLang) reads K3's e_score_correction_bias as "the bf16 checkpoint
    values", so the layout says BF16; the specification tables the issue names (F32) were not found in any stored
    source. A release that stores it F32 is one ROUTER_DTYPE info per writer, and the audit passes."""
    raw = with_experts_quantized(TINY)
    tensors, _ = release_tensors(raw)
    biases = [n for n in tensors if n.endswith("gate.e_score_correction_bias")]
    assert biases and all(tensors[n].dtype == torch.bfloat16 for n in biases)
    tensors.update({n: tensors[n].float() for n in biases})
    report = audit(write_release(tmp_path / "k3", raw, tensors))
    assert [f.code for f in report.findings if f.severity is not Severity.INFO] == []
    assert {f.code for f in report.findings if f.tensor in biases or "e_score_correction_bias" in f.message} \
        == {"ROUTER_DTYPE"}
    assert report.exit_code() == 0
