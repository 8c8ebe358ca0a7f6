"""The release's names as a loader that reads the published files spells them: vLLM's DeepseekV3ForCausalLM
(tests/data/loader_names/deepseek_v3.vllm.json, its repository, commit and what was read cited in the file).
The name table, instantiated for a config, is exactly the expected layout's main-model names (vLLM skips the
rotary buffer and loads the MTP layers with its MTP model), for the pinned Kimi-K2-Instruct (139,644 tensors
less its 61 rotary buffers), DeepSeek-V3, DeepSeek-V3.2 (its indexer in every layer) and the tiny demo; and the
tiny demo, whose names are the table's, audits clean."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import kimi_audit
from kimi_audit.model.config import model_config_from_dict, pinned_config_bytes
from kimi_audit.model.kinds import BUFFER, ROTARY_BUFFER
from kimi_audit.model.layout import expected_layout
from kimi_audit.model.roles import role_of
from tiny_checkpoint import TINY_CONFIG, build_tiny

TABLE = json.loads((Path(__file__).parent / "data" / "loader_names" / "deepseek_v3.vllm.json").read_text())
KIMI_LINEAR = json.loads((Path(__file__).parent / "data" / "loader_names" / "kimi_linear.vllm.json").read_text())
DATA = Path(__file__).parent / "data"


def loader_names(cfg: dict[str, Any], fp8: bool = True) -> set[str]:
    """Every checkpoint name vLLM's load_weights consumes for this config's main model (`fp8`: block-FP8 Linear
    modules carry their weight_scale_inv)."""
    def stored(module: str, kind: str) -> list[str]:
        extra = {"fp8": [f"{module}.weight_scale_inv"] if fp8 else [], "layernorm": [f"{module}.bias"]}.get(kind, [])
        return [f"{module}.weight", *extra]

    names = [n for m, k in TABLE["top"].items() for n in stored(m, k)]
    if cfg.get("tie_word_embeddings"):
        names.remove("lm_head.weight")
    dense_until = cfg.get("first_k_dense_replace", 0)
    for layer in range(cfg["num_hidden_layers"]):
        parts = dict(TABLE["layer"], **(TABLE["v32_indexer"] if "index_topk" in cfg else {}))
        if layer >= dense_until and layer % cfg.get("moe_layer_freq", 1) == 0:
            for module, kind in TABLE["moe"].items():
                if "{e}" in module:
                    parts.update({module.format(e=e): kind for e in range(cfg["n_routed_experts"])})
                else:
                    parts[module] = kind
            bias = TABLE["noaux_tc"] if cfg.get("topk_method", "noaux_tc") == "noaux_tc" else []
            names += [f"model.layers.{layer}.{b}" for b in bias]
        else:
            parts.update(TABLE["dense"])
        names += [f"model.layers.{layer}.{n}" for m, k in parts.items() for n in stored(m, k)]
    assert len(names) == len(set(names))
    return set(names)


def layout_main_names(raw: dict[str, Any]) -> set[str]:
    """The layout's names outside the MTP layers, less the rotary buffers (every loader skips them; a buffer of
    trained state, DeepSeek-V4's tid2eid, stays)."""
    cfg = model_config_from_dict(raw)
    main = cfg.num_hidden_layers
    return {e.name for e in expected_layout(cfg).entries()
            if not (e.kind == BUFFER and role_of(e.name) == ROTARY_BUFFER) and (e.layer is None or e.layer < main)}


def test_the_table_cites_its_loader():
    assert TABLE["source"].startswith("vllm-project/vllm@") and len(TABLE["source"].split("@")[1].split()[0]) == 40


@pytest.mark.parametrize("config", ["pinned", "deepseek-v3", "deepseek-v32", "tiny"])
def test_vllms_names_are_the_layouts(config):
    from importlib import resources

    shipped = resources.files("kimi_audit").joinpath("data")
    raw = {"pinned": lambda: json.loads(pinned_config_bytes()), "tiny": lambda: TINY_CONFIG,
           "deepseek-v3": lambda: json.loads((DATA / "deepseek-v3.config.json").read_text()),
           "deepseek-v32": lambda: json.loads(shipped.joinpath("deepseek-v32.config.json").read_text())}[config]()
    want = loader_names(raw)
    got = layout_main_names(raw)
    assert want == got, (sorted(want - got)[:5], sorted(got - want)[:5])
    if config == "pinned":
        assert len(want) == 139_644 - 61


def test_a_checkpoint_in_vllms_names_audits_clean(tmp_path):
    path = build_tiny(tmp_path / "tiny")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    stored = {n for n in index["weight_map"] if not n.endswith("rotary_emb.inv_freq")}
    assert stored == loader_names(TINY_CONFIG)
    report = kimi_audit.audit(path)
    assert report.errors == 0 and report.warnings == 0


KIMI_LINEAR_RELEASE = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
    "v_head_dim": 8, "mla_use_nope": True, "is_moe": True, "num_experts": 4, "num_experts_per_token": 2,
    "num_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "torch_dtype": "bfloat16",
    "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3], "head_dim": 8, "num_heads": 4,
                           "short_conv_kernel_size": 4}}
"""A release-style Kimi-Linear config (Moonshot's keys: num_experts, num_experts_per_token, linear_attn_config), every
layer kind in it: a dense KDA layer, MoE KDA layers and a MoE MLA layer."""


def kimi_linear_loader_names(cfg: dict[str, Any]) -> set[str]:
    """Every checkpoint name vLLM's KimiLinearForCausalLM.load_weights consumes for this config."""
    names = list(KIMI_LINEAR["top"])
    kda = set(cfg["linear_attn_config"]["kda_layers"])
    for layer in range(cfg["num_hidden_layers"]):
        parts = list(KIMI_LINEAR["layer"])
        parts += KIMI_LINEAR["kda"] if layer + 1 in kda else KIMI_LINEAR["mla"]  # KimiLinearConfig.is_kda_layer
        moe = cfg["is_moe"] and layer >= cfg["first_k_dense_replace"] and layer % cfg["moe_layer_freq"] == 0
        for part in KIMI_LINEAR["moe"] if moe else KIMI_LINEAR["dense"]:
            parts += [part.format(e=e) for e in range(cfg["num_experts"])] if "{e}" in part else [part]
        names += [f"model.layers.{layer}.{p}" for p in parts]
    assert len(names) == len(set(names))
    return set(names)


def test_kimi_linears_names_as_vllm_reads_them_are_the_layouts():
    assert KIMI_LINEAR["source"].startswith("vllm-project/vllm@")
    want = kimi_linear_loader_names(KIMI_LINEAR_RELEASE)
    got = layout_main_names(KIMI_LINEAR_RELEASE)
    assert want == got, (sorted(want - got)[:5], sorted(got - want)[:5])


def test_kimi_k25s_text_model_names_as_vllm_reads_them_are_the_layouts():
    """vLLM's KimiK25ForConditionalGeneration (vllm-project/vllm@dd4ad005 models/kimi_k25.py) holds the text model as a
    DeepseekV2Model under `language_model` and maps the checkpoint's `language_model.model` and
    `language_model.lm_head` onto it (load_weights' _KEYS_TO_MODIFY_MAPPING): the DeepseekV3 table under those
    prefixes; its vision tower and projector (kimi_k25_vit.py, kimi_k25_vision.vllm.json) as MoonViT3dPretrainedModel
    and KimiK25MultiModalProjector hold them. Kimi-K2.6's config with its quantization left out (the names, not
    the INT4 suffixes, are the point)."""
    from importlib import resources

    raw = json.loads(resources.files("kimi_audit").joinpath("data/kimi-k2.6.config.json").read_text())
    raw.pop("quantization_config")
    text = raw["text_config"]
    want = {"language_model.lm_head.weight" if n == "lm_head.weight" else "language_model." + n
            for n in loader_names(text, fp8=False)}
    vision = json.loads((DATA / "loader_names" / "kimi_k25_vision.vllm.json").read_text())
    want |= set(vision["top"]) | {f"vision_tower.encoder.blocks.{i}.{n}"
                                  for i in range(raw["vision_config"]["num_hidden_layers"]) for n in vision["block"]}
    got = layout_main_names(raw)
    assert want == got, (sorted(want - got)[:5], sorted(got - want)[:5])


def test_glm5s_names_as_vllm_reads_them_are_the_layouts():
    """vLLM's GlmMoeDsaForCausalLM is DeepseekV2ForCausalLM (the same file and commit): the DeepseekV3 table with
    the V3.2 indexer in every layer, for a GLM-5 config whose `indexer_types` are all full (that commit builds an
    indexer in every layer, so GLM-5.x's `shared` layers are not settled by it)."""
    transformers = pytest.importorskip("transformers")
    raw = transformers.GlmMoeDsaConfig(num_hidden_layers=4, n_routed_experts=8, first_k_dense_replace=1,
                                       mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                                       indexer_types=["full"] * 4).to_dict()
    raw.update(model_type="glm_moe_dsa", topk_method="noaux_tc")
    want = loader_names(raw, fp8=False)
    got = layout_main_names(raw)
    assert want == got, (sorted(want - got)[:5], sorted(got - want)[:5])
    assert any(".self_attn.indexer.weights_proj." in n for n in want)


V4 = json.loads((DATA / "loader_names" / "deepseek_v4.vllm.json").read_text())

V4_RELEASE = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "vocab_size": 64, "hidden_size": 64,
    "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "hc_mult": 2, "index_n_heads": 2,
    "index_head_dim": 16, "index_topk": 8, "num_hash_layers": 1, "num_nextn_predict_layers": 1,
    "compress_ratios": [0, 4, 128, 4, 0], "topk_method": "noaux_tc", "scoring_func": "sqrtsoftplus",
    "sliding_window": 8, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"}}
"""A release-style DeepSeek-V4 config (`compress_ratios` one per layer and the MTP stage, `num_hash_layers`,
`expert_dtype: fp4`, DeepSeek's FP8): every attention kind (SWA, CSA with the indexer, HCA) and a hash layer."""


def v4_loader_names(cfg: dict[str, Any]) -> set[str]:
    """Every checkpoint name vLLM's DeepseekV4ForCausalLM consumes for this config's main model."""
    def stored(module: str, kind: str) -> list[str]:
        return [f"{module}.weight", *{"fp8": [f"{module}.scale"], "fp4": [f"{module}.scale"],
                                      "layernorm": [f"{module}.bias"]}.get(kind, [])]

    def expand(parts: dict[str, str]) -> list[str]:
        out = []
        for module, kind in parts.items():
            for m in ([module.format(e=e) for e in range(cfg["n_routed_experts"])] if "{e}" in module else [module]):
                out += stored(m, kind)
        return out

    names = [n for m, k in V4["top"].items() for n in stored(m, k)] + list(V4["top_bare"])
    for layer in range(cfg["num_hidden_layers"]):
        ratio = max(1, cfg["compress_ratios"][layer])
        parts = expand(V4["layer"]) + list(V4["layer_bare"])
        if ratio > 1:
            parts += expand(V4["compressor"]) + list(V4["compressor_bare"])
        if ratio == 4:
            parts += expand(V4["indexer"]) + list(V4["indexer_bare"])
        if layer < cfg["num_hash_layers"]:
            parts += V4["hash_bare"]
        elif cfg.get("topk_method") == "noaux_tc":
            parts += V4["noaux_tc_bare"]
        names += [f"layers.{layer}.{p}" for p in parts]
    assert len(names) == len(set(names))
    return set(names)


def test_deepseek_v4s_names_as_vllm_reads_them_are_the_layouts():
    want = v4_loader_names(V4_RELEASE)
    got = layout_main_names(V4_RELEASE)
    assert want == got, (sorted(want - got)[:8], sorted(got - want)[:8])


MISTRAL3 = json.loads((DATA / "loader_names" / "mistral3.json").read_text())
MISTRAL3_RELEASE = {
    "model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "spatial_merge_size": 2,
    "multimodal_projector_bias": False, "vision_feature_layer": -1, "tie_word_embeddings": False,
    "text_config": {"model_type": "mistral4", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                    "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
                    "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                    "v_head_dim": 8, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                    "first_k_dense_replace": 1, "tie_word_embeddings": False},
    "vision_config": {"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "head_dim": 8, "patch_size": 14, "num_channels": 3}}
"""A release-style Mistral Small 4 config: the mistral3 wrapper around a mistral4 text model and a Pixtral tower."""


def test_mistral_small_4s_names_as_its_loaders_read_them_are_the_layouts():
    """The mistral3 wrapper (tests/data/loader_names/mistral3.json: vLLM's Mistral3ForConditionalGeneration and
    PixtralHFVisionModel, the SGLang fork's Mistral4ForCausalLM, mlx-vlm's sanitize): the DeepseekV3 table under
    `language_model.`, its routed experts the two stacked tensors, no router bias; the vision blocks and the
    projector as the table lists them."""
    text = {**MISTRAL3_RELEASE["text_config"], "topk_method": "softmax"}
    per_expert = re.compile(r"\.mlp\.experts\.\d+\.")
    top = ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight")  # the table's `top`, prefixed
    want = {"language_model." + n for n in loader_names(text, fp8=False) if not per_expert.search(n) and n not in top}
    layers = range(text["first_k_dense_replace"], text["num_hidden_layers"])
    want |= {f"language_model.model.layers.{i}.{n}" for i in layers for n in MISTRAL3["moe_experts"]}
    want |= set(MISTRAL3["top"]) | {f"vision_tower.transformer.layers.{i}.{n}" for n in MISTRAL3["vision_block"]
                                    for i in range(MISTRAL3_RELEASE["vision_config"]["num_hidden_layers"])}
    got = layout_main_names(MISTRAL3_RELEASE)
    assert want == got, (sorted(want - got)[:5], sorted(got - want)[:5])
    assert MISTRAL3["source"].count("@") == 4
