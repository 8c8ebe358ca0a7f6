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

from collections.abc import Container, Mapping
from dataclasses import replace
from typing import Any

from kimi_audit.model.arch import deepseek_v3, mistral_params, pixtral
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.renamed import RenamedReader
from kimi_audit.model.arch.spec import (
    Architecture,
    Buffer,
    GgufProjector,
    Group,
    Linear,
    ModelTree,
    Node,
    ReleaseReader,
    register,
)
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import GAIN
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



# --- the release in Mistral's format as llama.cpp's converter writes it (`--mistral-format`) ------------------------

NATIVE_LAYERS, TREE_LAYERS = "layers.", "model.layers."
PROJECTION_OF = {theirs: ours for ours, theirs in PROJECTIONS}


def _swap(prefixes: tuple[tuple[str, str], ...], name: str) -> str:
    for a, b in prefixes:
        if name.startswith(a):
            return b + name[len(a):]
    return name


def _projection(rest: str, table: dict[str, str]) -> str:
    """A dense, shared or routed MLP projection's segment renamed (`table`: w1 -> gate_proj or back)."""
    parts = rest.split(".")
    if rest.startswith("mlp.") and len(parts) >= 3 and parts[-2] in table:
        parts[-2] = table[parts[-2]]
    return ".".join(parts)


def tree_name(name: str) -> str:
    """A release tensor's name in Mistral's spelling as the tree spells it (transformers' DeepseekV3 names), which
    is what llama.cpp's converter writes it as: MistralMoeModel.filter_tensors (conversion/mistral.py: `wkv_b` ->
    `kv_b_proj`, `experts.E.w{1,2,3}` -> `model.layers.N.mlp.experts.E.{gate,down,up}_proj`) and tensor_mapping.py's
    mistral-large and llama-pth entries lead each to the GGUF tensor the tree's name has (deepseek2's dialect).
    Names of neither table (the vision tower) are returned as they are."""
    if not name.startswith(NATIVE_LAYERS):
        return _swap(tuple((b, a) for a, b in TOP), name)
    number, _, rest = name[len(NATIVE_LAYERS):].partition(".")
    return f"{TREE_LAYERS}{number}.{_projection(_swap(tuple((b, a) for a, b in LAYER), rest), PROJECTION_OF)}"


def native_name(name: str) -> str:
    """tree_name's inverse: a tree name in Mistral's spelling (the release's tensor a converter reads)."""
    if not name.startswith(TREE_LAYERS):
        return _swap(TOP, name)
    number, _, rest = name[len(TREE_LAYERS):].partition(".")
    return f"{NATIVE_LAYERS}{number}.{_swap(LAYER, _projection(rest, dict(PROJECTIONS)))}"


EMBEDDING = "tok_embeddings.weight"


def converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The GGUF tensors llama.cpp's converter writes a release tensor in Mistral's format into: the text model's as
    deepseek2's (MistralMoeModel over DeepseekV2Model: experts stacked, kv_b split), the vision tower's into the
    mmproj file where one is read beside it (PixtralModel), and the token embedding's [IMG_BREAK] row into it too."""
    mmproj = pixtral.mmproj_name(name)
    if mmproj is not None:
        return (mmproj,) if mmproj in stored else ()
    out = deepseek2.GGUF_DIALECT.converted(tree_name(name), layers, stored)
    return (*out, pixtral.IMG_BREAK_GGUF) if name == EMBEDDING and pixtral.IMG_BREAK_GGUF in stored else out


def release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int, nope: int) -> Any:
    return deepseek2.GGUF_DIALECT.release_values(gguf_name, RenamedReader(read, native_name), experts, heads, nope)


def mmproj_config(kv: Mapping[str, Any], text: Mapping[str, Any],
                  stored: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The params.json-shaped config (Mistral's names, `load_format: mistral`) an mmproj file's `clip.vision.*` keys
    imply beside the paired text model's, as clip.cpp reads them: the text width the projector's own
    `clip.vision.projection_dim` (MmprojModel writes params.json's `dim` there), the patch merge
    `clip.vision.spatial_merge_size` (1 where absent, as clip.cpp), the adapter's biases where the file has them
    (clip.cpp reads `mm.1.bias` optionally), RGB patches, and the [IMG_BREAK] row clip.cpp requires."""
    v = "clip.vision."
    vision = {"hidden_size": kv.get(v + "embedding_length"), "intermediate_size": kv.get(v + "feed_forward_length"),
              "num_hidden_layers": kv.get(v + "block_count"), "num_channels": 3, "patch_size": kv.get(v + "patch_size")}
    return {**text, "model_type": MODEL_TYPES[0], "load_format": mistral_params.LOAD_FORMAT,
            "hidden_size": kv.get(v + "projection_dim", text.get("hidden_size")), "vision_config": vision,
            "spatial_merge_size": kv.get(pixtral.SPATIAL_MERGE, 1), "multimodal_projector_bias": "mm.1.bias" in stored,
            pixtral.IMG_BREAK: True}


PROJECTOR = GgufProjector(("pixtral",), mmproj_config, pixtral.mmproj_name, "mm.2.weight", key_types=pixtral.KEY_TYPES,
                          refuses=pixtral.refuses, release_values=pixtral.mmproj_values, repeated=pixtral.repeated)
"""The Pixtral tower of a release in Mistral's format as llama.cpp writes it with `--mmproj` (PixtralModel,
projector type `pixtral`) and tools/mtmd's clip.cpp loads it (PROJECTOR_TYPE_PIXTRAL, clip_n_mmproj_embd:
`mm.2.weight`'s rows)."""
GGUF = replace(deepseek2.GGUF_DIALECT, text_of=deepseek_v3.MODEL_TYPES[0], converted=converted,
               release_values=release_values, projector=PROJECTOR,
               converts=lambda cfg: cfg.get("load_format") == mistral_params.LOAD_FORMAT)
"""llama.cpp converts a release in Mistral's own format (params.json, `--mistral-format`) twice: its text model as
`deepseek2` (conversion/mistral.py MistralMoeModel over DeepseekV2Model: deepseek2's metadata from the params.json
keys model.arch.mistral_params reads, its tensors renamed to DeepseekV2Model's and converted as those), which
deepseek_v3's dialect reads back, and its vision tower as an mmproj file (PROJECTOR). A release in transformers'
spelling (Mistral4ForCausalLM) is no converter's input (`converts`)."""
MMPROJ_GAINS = (("v.pre_ln.weight", GAIN), (".ln1.weight", GAIN), (".ln2.weight", GAIN))
"""The mmproj's RMSNorm gains under names without `norm.weight`: read by `audit --values` as the model's gains."""

ARCHITECTURE = register(Architecture(
    name="Mistral Small 4", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("Mistral4ForCausalLM",), quant=MISTRAL_RELEASE, value_roles=MMPROJ_GAINS, gguf=GGUF))
