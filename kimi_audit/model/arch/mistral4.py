"""Mistral Small 4 (`model_type: mistral4`, transformers 5.25 `models/mistral4/`): DeepseekV3's tree (multi-head
latent attention with q_lora, dense blocks before `first_k_dense_replace`, MoE blocks with shared experts) with
the routed experts of a layer stored as two stacked parameters, `mlp.experts.gate_up_proj` [E, 2·I, H] and
`mlp.experts.down_proj` [E, H, I] (Mistral4NaiveMoe; the release stores them so: a loader of the published
files explodes exactly these two packed names into per-expert weights), and a softmax router with no score
correction bias (Mistral4TopkRouter). Defaults are Mistral4Config's. Proven against transformers 5.25
(tests/test_mistral4.py: its save audits clean, parameters = sum(numel)); the release's FP8 in transformers'
names (per-tensor scales, `*_scale_inv` and `*_activation_scale` beside the stacked experts) is not described:
QUANT_UNSUPPORTED.

Mistral's own format (`params.json` and `consolidated*.safetensors`, Mistral Small 4 and Mistral Large 3 as
Mistral publishes them; read through model.arch.mistral_params, which writes `load_format: mistral`) is the same
tree in Mistral's names, one expert per module, as llama.cpp's converter reads them (ggml-org/llama.cpp@0c1e57098
`conversion/mistral.py` MistralMoeModel.filter_tensors, `gguf-py/gguf/tensor_mapping.py`'s mistral-large and
llama-pth entries; tests/data/loader_names/mistral_format.llamacpp.json): `tok_embeddings`, `norm`, `output`;
per layer (`layers.N.`) `attention_norm`, `ffn_norm`, `attention.{wq_a, q_a_norm, wq_b}` (or `attention.wq` without
a query latent), `attention.{wkv_a_with_mqa, kv_a_norm, wkv_b, wo}`, dense `feed_forward.w{1,2,3}`, MoE `gate`,
`experts.E.w{1,2,3}`, `shared_experts.w{1,2,3}`; no rotary buffer; the Pixtral tower in Mistral's spelling
(model.arch.pixtral.NATIVE) where params.json has a `vision_encoder`. Its FP8 is model.quant.mistral_fp8
(`qscale_weight`, `qscale_act`), which leaves the output head and the vision tower plain (MISTRAL_RELEASE).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.model.arch import deepseek_v3, mistral_params, pixtral
from kimi_audit.model.arch.spec import Architecture, Buffer, Group, Linear, ModelTree, Node, register
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.quant.scheme import ReleaseQuant

MODEL_TYPES = ("mistral4",)

DEFAULTS: dict[str, Any] = {
    "moe_intermediate_size": 2048, "q_lora_rank": 1024, "first_k_dense_replace": 0, "moe_layer_freq": 1,
    "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 4, "topk_method": "softmax",
    "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "attention_bias": False, "rms_norm_eps": 1e-6,
}
"""Mistral4Config's defaults (transformers 5.25); `topk_method` is not one of its keys: its router is softmax
top-k with no `e_score_correction_bias`, so any config value of it is read as that."""
NATIVE = "mistral_native"
"""The dim that marks a config read from params.json: the tree in Mistral's names."""
VISION_ABSENT: dict[str, Any] = dict(pixtral.DEFAULTS)
MISTRAL_RELEASE = ReleaseQuant(plain=("output",), unreached=(r"vision_encoder\..*", r"vision_language_adapter\..*",
                                                             r"patch_merger\..*"))
"""What Mistral's FP8 leaves plain: the output head and the vision tower with its projector (llama.cpp's converter
dequantizes whatever carries a `qscale_weight`, conversion/base.py lines 465-475)."""

TOP = (("model.embed_tokens.", "tok_embeddings."), ("model.norm.", "norm."), ("lm_head", "output"))
LAYER = (("input_layernorm.", "attention_norm."), ("post_attention_layernorm.", "ffn_norm."),
         ("self_attn.q_a_proj", "attention.wq_a"), ("self_attn.q_a_layernorm.", "attention.q_a_norm."),
         ("self_attn.q_b_proj", "attention.wq_b"), ("self_attn.q_proj", "attention.wq"),
         ("self_attn.kv_a_proj_with_mqa", "attention.wkv_a_with_mqa"),
         ("self_attn.kv_a_layernorm.", "attention.kv_a_norm."), ("self_attn.kv_b_proj", "attention.wkv_b"),
         ("self_attn.o_proj", "attention.wo"), ("mlp.gate.", "gate."), ("mlp.experts.", "experts."),
         ("mlp.shared_experts.", "shared_experts."), ("mlp.", "feed_forward."))
"""The tree's names (transformers' DeepseekV3 spelling) -> Mistral's, first match wins; then a projection's last
segment: gate_proj -> w1, down_proj -> w2, up_proj -> w3."""
PROJECTIONS = (("gate_proj", "w1"), ("down_proj", "w2"), ("up_proj", "w3"))


def read(cfg: dict[str, Any]) -> ModelConfig:
    parsed = deepseek_v3.read_family({**cfg, "topk_method": "softmax"}, DEFAULTS, indexer=False, norm_f32=False,
                                     release=MISTRAL_RELEASE)
    if cfg.get("load_format") != mistral_params.LOAD_FORMAT:
        return parsed
    dims = {NATIVE: 1, **(pixtral.read_dims(cfg, VISION_ABSENT) if "vision_config" in cfg else {})}
    return replace(parsed, layers_at="layers.", dims=tuple(sorted(dims.items())))


def mistral_name(name: str, table: tuple[tuple[str, str], ...]) -> str:
    """A tree name in Mistral's spelling (`table`: TOP for full names, LAYER for names within a layer)."""
    for ours, theirs in table:
        if name.startswith(ours):
            name = theirs + name[len(ours):]
            break
    head, dot, last = name.rpartition(".")
    spelled = dict(PROJECTIONS).get(last)
    return f"{head}{dot}{spelled}" if spelled and (head.endswith(("experts", "feed_forward"))) else name


def _respelled(node: Node, table: tuple[tuple[str, str], ...]) -> Node | None:
    """The node in Mistral's names; None for a buffer (the consolidated files hold none)."""
    if isinstance(node, Buffer):
        return None
    if isinstance(node, Group):
        kids = tuple(k for k in (_respelled(c, table) for c in node.children) if k is not None)
        return replace(node, children=kids)
    return replace(node, tensors=tuple(
        replace(t, module=mistral_name(t.module, table)) if isinstance(t, Linear)
        else replace(t, component=mistral_name(t.component, table)) for t in node.tensors))


def _all(nodes: tuple[Node, ...], table: tuple[tuple[str, str], ...]) -> tuple[Node, ...]:
    return tuple(n for n in (_respelled(x, table) for x in nodes) if n is not None)


def describe(cfg: ModelConfig) -> ModelTree:
    if NATIVE not in dict(cfg.dims):
        return deepseek_v3.describe(cfg, fused_experts=True)
    tree = deepseek_v3.describe(cfg)
    after = _all(tree.after, TOP)
    if "vision_hidden_size" in dict(cfg.dims):
        after = (*after, pixtral.tower(cfg, pixtral.NATIVE), pixtral.projector(cfg, pixtral.NATIVE))
    return ModelTree(_all(tree.before, TOP), {k: _all(v, LAYER) for k, v in tree.blocks.items()}, after)



ARCHITECTURE = register(Architecture(
    name="Mistral Small 4", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("Mistral4ForCausalLM",), quant=MISTRAL_RELEASE))
