"""Kimi K3 (`model_type: kimi_k3`, KimiK3ForConditionalGeneration, July 2026) as data.

config.json nests the text model in `text_config` (`model_type: kimi_linear`, Kimi-Linear's keys: model.arch
.kimi_linear reads them) and adds K3's own keys, each of which adds tensors when set:
- `attn_res_block_size` (attention residuals): per layer `self_attention_res_norm` [H] and `mlp_res_norm` [H]
  gains with `self_attention_res_proj` and `mlp_res_proj` [1, H]; after the layers `output_attn_res_norm` [H] and
  `output_attn_res_proj` [1, H];
- `routed_expert_hidden_size` L (latent MoE): `block_sparse_moe.routed_expert_down_proj` [L, H] and
  `routed_expert_up_proj` [H, L] around the routed experts, which then read and write L (`w1`, `w3` [I, L], `w2`
  [L, I]); with `latent_moe_use_norm`, `routed_expert_norm` [L] between them;
- `mla_use_output_gate`: the MLA layers' `self_attn.g_proj` [heads × v head dim, H];
- `linear_attn_config.use_full_rank_gate`: the KDA output gate as one `self_attn.g_proj` [heads × head dim, H]
  where Kimi-Linear has `g_a_proj`/`g_b_proj`.
The KDA control weights (`q/k/v_conv1d`, `A_log`, `o_norm`) are F32 beside `dt_bias`, and `A_log` is stored 1-D
as [linear head dim] (128 values for 96 heads, the tail zero); the router's gate and correction bias are stored
in the model's dtype. Absent keys take SGLang's KimiLinearConfig defaults (features off).

Names, shapes and dtypes as the loaders that read the published files give them (tests/data/loader_names/
kimi_k3.json cites them): alibaba/rtp-llm's `KimiK3Weight` manifest (rtp_llm/models/kimi_k3/kimi_k3_weight.py)
lists every text-model tensor name; SGLang's `KimiK3ForConditionalGeneration` (python/sglang/srt/models/kimi_k3.py)
builds the modules that read them. The release quantizes the routed experts only, compressed-tensors
`mxfp4-pack-quantized` (model.quant). transformers 5.25 has no kimi_k3: no other writer's spelling is known.

llama.cpp's GGUF (`kimi-k3`, the dialect in model.arch.kimi_k3.gguf) writes the tree its converter makes: the
text model alone, Kimi-Linear's converted tree (model.arch.kimi_linear) with each attention residual's norm and
projection fused into one F32 vector (named here after the norm), the KDA gate `g_proj` told from the MLA one
(`self_attn.kda_g_proj` in that tree), `A_log` cut to its heads.

Not described: the vision tower (`vision_tower.*`, SGLang's MoonViT3d `KimiK3VisionTower`) and its projector
(`mm_projector.*`), whose config (`vision_config`) this module does not read: their tensors are one
TENSORS_UNDESCRIBED info, unchecked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import kimi_linear
from kimi_audit.model.arch.kimi_k3.gguf import GGUF_DIALECT, KDA_GATE
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    Architecture,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
    prefixed,
    register,
)
from kimi_audit.model.config_fields import ModelConfig, nested_text

MODEL_TYPES = ("kimi_k3",)
TEXT_PREFIX = "language_model."
RESIDUAL_KEYS = ("attn_res_block_size",)

FEATURES = ("latent", "latent_norm", "attn_res", "mla_output_gate", "full_rank_gate")
"""K3's dims beside Kimi-Linear's: the latent width (0: none) and four switches (0 or 1)."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    """The nested `text_config` read as Kimi-Linear, then K3's keys; a `quantization_config` or dtype at the top
    wins over the text config's (the release keeps them inside it)."""
    text = nested_text(cfg, MODEL_TYPES[0])
    parsed = kimi_linear.read({**text, "model_type": kimi_linear.MODEL_TYPES[0]})
    linear = text.get("linear_attn_config")
    features = {
        "latent": _positive(text, "routed_expert_hidden_size"),
        "attn_res": int(_positive(text, "attn_res_block_size") > 0),
        "latent_norm": _switch(text, "latent_moe_use_norm", "text_config"),
        "mla_output_gate": _switch(text, "mla_use_output_gate", "text_config"),
        "full_rank_gate": _switch(linear if isinstance(linear, dict) else {}, "use_full_rank_gate",
                                  "text_config.linear_attn_config"),
    }
    return replace(parsed, model_type=MODEL_TYPES[0], prefix=TEXT_PREFIX,
                   dims=tuple(sorted({**dict(parsed.dims), **features}.items())))


def _positive(cfg: dict[str, Any], key: str) -> int:
    """A positive integer, or 0 where the key is absent or null (the feature off)."""
    v = cfg.get(key)
    if v is None:
        return 0
    if type(v) is not int or v <= 0:
        raise ConfigError(f"config.json text_config.{key} must be a positive integer or null, got {v!r}")
    return v


def _switch(cfg: dict[str, Any], key: str, where: str) -> int:
    v = cfg.get(key, False)
    if not isinstance(v, bool):
        raise ConfigError(f"config.json {where}.{key} must be true or false, got {v!r}")
    return int(v)


def describe(cfg: ModelConfig) -> ModelTree:
    """The text model's tree under `language_model.`."""
    return _Describe(cfg).tree()


class _Describe(kimi_linear._Describe):
    control_dtype = "F32"
    router_dtype = None

    def tree(self) -> ModelTree:
        base = super().tree()
        residual: tuple[Node, ...] = ()
        if self.cfg.dim("attn_res"):
            residual = (self.residual("output_attn_res", "Output attention residual", "model.output_attn_res"),)
        return ModelTree(tuple(prefixed(n, TEXT_PREFIX) for n in base.before), base.blocks,
                         tuple(prefixed(n, TEXT_PREFIX) for n in (*residual, *base.after)))

    def residual(self, key: str, title: str, stem: str) -> Group:
        """An attention residual: an RMSNorm's gain and a projection to one score; in llama.cpp's tree their
        product, one vector (KimiK3Model._try_fuse_res), under the norm's name."""
        h = self.f("hidden_size", "hidden")
        if self.stacked:
            return Group(key, title, (Leaf(f"{key}_score", f"{stem.rpartition('.')[2]}_score",
                                           f"{title} score (RMSNorm gain × score projection, fused)", "attn_res_norm",
                                           (Param("Fused gain", f"{stem}_norm.weight", (h,), self.norm_dtype),),
                                           (*RESIDUAL_KEYS, DTYPE_KEYS)),))
        one = Factor(1, "score", ())
        keys = (*RESIDUAL_KEYS, DTYPE_KEYS)
        return Group(key, title, (
            self.gain(f"{key}_norm", f"{stem.rpartition('.')[2]}_norm", f"{title} RMSNorm", "attn_res_norm",
                      f"{stem}_norm.weight", h, (*RESIDUAL_KEYS, "rms_norm_eps")),
            Leaf(f"{key}_proj", f"{stem.rpartition('.')[2]}_proj", f"{title} score projection", "attn_res_proj",
                 (Linear(f"{stem}_proj", (one,), (h,)),), keys)))

    def layer(self, kind: str) -> tuple[Node, ...]:
        norms, attn, *mlp = super().layer(kind)
        if kind.endswith("_mla") and self.cfg.dim("mla_output_gate"):
            assert isinstance(attn, Group)
            heads, vd = self.f("num_attention_heads", "heads"), self.f("v_head_dim", "value dim")
            gate = Leaf("g_proj", "g_proj", "Output gate", "mla_g_proj",
                        (Linear("self_attn.g_proj", (heads, vd), (self.f("hidden_size", "hidden"),)),),
                        (BLOCK_KEYS, "mla_use_output_gate", DTYPE_KEYS))
            attn = replace(attn, children=(*attn.children, gate))
        residual: tuple[Node, ...] = ()
        if self.cfg.dim("attn_res"):
            residual = (self.residual("self_attention_res", "Attention-input residual", "self_attention_res"),
                        self.residual("mlp_res", "MLP-input residual", "mlp_res"))
        return (norms, *residual, attn, *mlp)

    def a_log_shape(self) -> tuple[Factor, ...]:
        if self.stacked:  # llama.cpp's converter keeps the heads' values alone (`[:n_head]`)
            return (self.f("num_attention_heads", "heads"),)
        return (Factor(self.cfg.dim("linear_head_dim"), "linear head dim (heads, zero-padded)",
                       ("linear_head_dim",)),)

    def output_gate(self, h: Factor, d: Factor, qkv: Factor) -> tuple[Leaf, ...]:
        if not self.cfg.dim("full_rank_gate"):
            return super().output_gate(h, d, qkv)
        name = KDA_GATE.removesuffix(".weight") if self.stacked else "self_attn.g_proj"
        return (Leaf("g_proj", "g_proj", "Output gate (full rank)", "kda_g_proj", (Linear(name, (qkv,), (h,)),),
                     (BLOCK_KEYS, "use_full_rank_gate", DTYPE_KEYS)),)

    def expert_width(self) -> Factor:
        latent = self.cfg.dim("latent")
        if not latent:
            return super().expert_width()
        return Factor(latent, "latent", ("routed_expert_hidden_size",))

    def moe(self) -> tuple[Node, ...]:
        router, experts, *rest = super().moe()
        latent = self.cfg.dim("latent")
        if not latent:
            return (router, experts, *rest)
        h, w = self.f("hidden_size", "hidden"), self.expert_width()
        keys = (BLOCK_KEYS, "routed_expert_hidden_size", DTYPE_KEYS)
        down = Leaf("routed_expert_down_proj", "routed_expert_down_proj", "Latent down-projection",
                    "latent_down_proj", (Linear("block_sparse_moe.routed_expert_down_proj", (w,), (h,)),), keys)
        up = Leaf("routed_expert_up_proj", "routed_expert_up_proj", "Latent up-projection", "latent_up_proj",
                  (Linear("block_sparse_moe.routed_expert_up_proj", (h,), (w,)),), keys)
        norm: tuple[Node, ...] = ()
        if self.cfg.dim("latent_norm"):
            norm = (self.gain("routed_expert_norm", "routed_expert_norm", "Latent RMSNorm", "latent_norm",
                              "block_sparse_moe.routed_expert_norm.weight", w,
                              (BLOCK_KEYS, "latent_moe_use_norm", "rms_norm_eps")),)
        latent_group = Group("latent", "Latent MoE projections", (down, *norm, up))
        return (router, latent_group, experts, *rest)


ARCHITECTURE = register(Architecture(
    name="Kimi K3", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("KimiK3ForConditionalGeneration",), writer_trees=kimi_linear.WRITER_TREES, gguf=GGUF_DIALECT,
    undescribed={r"vision_tower\.": "K3's vision tower (MoonViT3d; vision_config is not read)",
                 r"mm_projector\.": "K3's multimodal projector (vision_config is not read)"},
    float32_routers=kimi_linear.ARCHITECTURE.float32_routers, buffered=kimi_linear.ARCHITECTURE.buffered,
    value_roles=kimi_linear.ARCHITECTURE.value_roles, block_titles=kimi_linear.ARCHITECTURE.block_titles))
