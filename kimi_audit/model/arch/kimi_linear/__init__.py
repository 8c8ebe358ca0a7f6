"""Kimi-Linear (`kimi_linear`) as data: KDA linear-attention layers beside MLA layers, dense or MoE MLPs.

Mirrors transformers 5.25's modeling_kimi_linear.py, named as Moonshot's release names its tensors (the
checkpoint conversion mapping of transformers 5.25, `kimi_linear`, read backwards):
- a KDA layer (KimiLinearDeltaAttention): `self_attn.{q,k,v}_proj`, the short convolutions
  `self_attn.{q,k,v}_conv1d.weight` [heads × head dim, 1, kernel] (transformers fuses them into one `conv1d`),
  the forget gate `self_attn.{f_a_proj, f_b_proj, dt_bias (F32), A_log}` (transformers: `forget_gate.*`),
  `self_attn.b_proj`, the output gate `self_attn.{g_a_proj, g_b_proj}`, `self_attn.o_norm`, `self_attn.o_proj`;
- an MLA layer: DeepseekV3's latent attention without a rotary buffer (model.arch.deepseek_v3);
- a dense layer's MLP `mlp.{gate,up,down}_proj`; an MoE layer's `block_sparse_moe.gate.weight` (F32),
  `block_sparse_moe.gate.e_score_correction_bias` (F32), `block_sparse_moe.experts.E.{w1,w2,w3}` and
  `block_sparse_moe.shared_experts.{gate,up,down}_proj`.

Dialect `transformers`: transformers 5.x's save_pretrained renames every `mlp.` to `block_sparse_moe.`, so the
dense layers' MLP is written `block_sparse_moe.{gate,up,down}_proj`; the rest as released.

llama.cpp's GGUF (`kimi-linear`, the dialect in model.arch.kimi_linear.gguf) writes the tree its converter makes:
each MoE layer's experts stacked into one [E, out, in] tensor per projection, the MLA layers' kv_b_proj split into
k_b and v_b (deepseek_v3's), the short convolutions 4-D (1, heads × head dim, 1, kernel), every parameter F32.

Kimi K3 (July 2026, `kimi_k3`) nests a text model of this architecture with K3's own parts: model.arch.kimi_k3,
which describes them by overriding this module's describer (its KDA gate, control-weight dtypes, MLA output gate,
latent MoE and attention residuals).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch.deepseek_v3 import ROUTER_BIAS_SUFFIX
from kimi_audit.model.arch.deepseek_v3 import _Describe as _MLA
from kimi_audit.model.arch.deepseek_v3.gguf import GGUF_ROUTER_BIAS
from kimi_audit.model.arch.kimi_linear.gguf import GGUF_DIALECT
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    Architecture,
    Buffer,
    Dialect,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
    register,
    w123_mlp,
)
from kimi_audit.model.config_fields import ModelConfig, read_eps, read_int, read_layer_types, scheduled
from kimi_audit.model.kinds import ROUTER_BIAS
from kimi_audit.model.quant.gguf import GGUF_KV_B_TREE, GGUF_TREE

MODEL_TYPES = ("kimi_linear",)
WRITER_TREES = (GGUF_TREE, GGUF_KV_B_TREE)
"""The other writers' trees it knows: llama.cpp's converter's (model.quant.gguf)."""
TRANSFORMERS_NOTE = ("transformers 5.x's save_pretrained spelling (the dense layers' MLP under "
                     "`block_sparse_moe.` instead of `mlp.`)")
GAIN = "Learned gain"

KL_DEFAULTS: dict[str, Any] = {
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "n_shared_experts": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "n_routed_experts": 256, "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
    "first_k_dense_replace": 1,
}
"""transformers 5.25 KimiLinearConfig's defaults (checkpoint moonshotai/Kimi-Linear-48B-A3B-Instruct)."""
KL_ALIASES = {"n_routed_experts": ("num_experts", "num_local_experts"),
              "num_experts_per_tok": ("num_experts_per_token",), "n_shared_experts": ("num_shared_experts",)}
"""KimiLinearConfig.attribute_map: the names Moonshot's config.json (and transformers' save) writes them under."""


KL_ATTENTION = {"linear_attention": "kda", "full_attention": "mla"}
KL_MLP = {"dense": "dense", "sparse": "moe"}


def read(cfg: dict[str, Any]) -> ModelConfig:
    """Kimi-Linear: KDA linear-attention layers beside MLA layers (`layer_types`, or Moonshot's
    `linear_attn_config.{kda_layers, full_attn_layers}`, 1-indexed), dense before `first_k_dense_replace`
    (`mlp_layer_types`), as KimiLinearConfig reads them."""
    d = KL_DEFAULTS

    def g(key: str, optional: bool = False) -> Any:
        return read_int(cfg, key, d, aliases=KL_ALIASES.get(key, ()), optional=optional)

    n = g("num_hidden_layers")
    raw_linear = cfg.get("linear_attn_config")
    linear: dict[str, Any] = raw_linear if isinstance(raw_linear, dict) else {}
    attention = read_layer_types(cfg, "layer_types", set(KL_ATTENTION), n)
    if attention is None and "full_attn_layers" in linear and "kda_layers" in linear:
        slots: list[str | None] = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            if not isinstance(linear[key], list):
                raise ConfigError(f"config.json linear_attn_config.{key} is {linear[key]!r}, not a list of layers "
                                  f"1..{n}")
            for layer in linear[key]:
                if type(layer) is not int or not 1 <= layer <= n:
                    raise ConfigError(f"config.json linear_attn_config.{key} holds {layer!r}, not a layer 1..{n}")
                slots[layer - 1] = kind
        if None in slots:
            raise ConfigError("config.json linear_attn_config names no attention type for layer "
                              f"{slots.index(None) + 1}")
        attention = [s for s in slots if s is not None]
    if attention is None:
        attention = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    mlp = read_layer_types(cfg, "mlp_layer_types", set(KL_MLP), n)
    if mlp is None:
        first = g("first_k_dense_replace")
        mlp = ["dense" if i < first else "sparse" for i in range(n)]
    fields = {k: g(k, optional=k == "q_lora_rank") for k in (
        "hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
        "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
        "n_shared_experts", "num_experts_per_tok", "vocab_size")}
    fields.update(num_hidden_layers=n, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                  attention_bias=bool(cfg.get("attention_bias", False)), rms_norm_eps=read_eps(cfg, 1e-5))
    spelled = {"linear_head_dim": "head_dim", "linear_num_heads": "num_heads",
               "linear_conv_kernel_dim": "short_conv_kernel_size"}
    dims = {k: read_int(linear, spelled[k], {spelled[k]: g(k)}) for k in spelled}
    kinds = tuple(f"{KL_MLP[m]}_{KL_ATTENTION[a]}" for m, a in zip(mlp, attention))
    return scheduled(cfg, fields, dims, kinds, ARCHITECTURE.quant)


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    """transformers names the dense layers' MLP `block_sparse_moe`, as the MoE layers': one rename per dense layer."""
    dense = [i for i, kind in enumerate(cfg.layer_kinds) if kind.split("_")[0] != "moe"]
    if not dense:
        return ()
    renames = tuple((f"{cfg.layer_prefix}{i}.mlp.", f"{cfg.layer_prefix}{i}.block_sparse_moe.") for i in dense)
    return (Dialect("transformers 5.x save_pretrained", renames, TRANSFORMERS_NOTE),)


class _Describe(_MLA):
    control_dtype: str | None = None
    """The dtype of the KDA short convolutions, decay and output norm (None: the model's)."""
    router_dtype: str | None = "F32"
    """The router gate's and correction bias's dtype (None: the model's)."""

    def tree(self) -> ModelTree:
        base = super().tree()
        return ModelTree(base.before, {kind: self.layer(kind) for kind in dict.fromkeys(self.cfg.layer_kinds)},
                         base.after)

    def layer(self, kind: str) -> tuple[Node, ...]:
        mlp, attention = kind.split("_")
        mla = self.attention()
        attn = self.kda() if attention == "kda" else Group(
            mla.key, mla.title, tuple(c for c in mla.children if not isinstance(c, Buffer)))
        return (self.norms(), attn, *(self.moe() if mlp == "moe" else self.dense()))

    def a_log_shape(self) -> tuple[Factor, ...]:
        one = Factor(1, "channel", ())
        heads = Factor(self.cfg.dim("linear_num_heads"), "linear heads", ("linear_num_heads",))
        return (one, one, heads, one)

    def o_norm_dtype(self) -> str:
        return self.control_dtype or self.cfg.dtype

    def output_gate(self, h: Factor, d: Factor, qkv: Factor) -> tuple[Leaf, ...]:
        """The KDA output gate: a low-rank pair through the head dim."""
        k = (BLOCK_KEYS, DTYPE_KEYS)
        return (Leaf("g_a_proj", "g_a_proj", "Output-gate down-projection", "kda_g_a_proj",
                     (Linear("self_attn.g_a_proj", (d,), (h,)),), k),
                Leaf("g_b_proj", "g_b_proj", "Output-gate up-projection", "kda_g_b_proj",
                     (Linear("self_attn.g_b_proj", (qkv,), (d,)),), k))

    def kda(self) -> Group:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        heads, hd = c.dim("linear_num_heads"), c.dim("linear_head_dim")
        nh = Factor(heads, "linear heads", ("linear_num_heads",))
        d = Factor(hd, "linear head dim", ("linear_head_dim",))
        qkv = Factor(heads * hd, "heads × head dim", ("linear_num_heads", "linear_head_dim"),
                     f"({heads} × {hd})")
        kernel = Factor(c.dim("linear_conv_kernel_dim"), "kernel", ("linear_conv_kernel_dim",))
        one = Factor(1, "channel", ())
        control = self.control_dtype or c.dtype
        k = (BLOCK_KEYS, DTYPE_KEYS)
        # llama.cpp's converter writes (1, d_inner, 1, d_conv); ggml's writers drop the leading 1, which the GGUF
        # layout takes as the loader does (model.gguf.with_stored_types)
        conv = (one, qkv, one, kernel) if self.stacked else (qkv, one, kernel)

        def lin(p: str, title: str, out: Factor, inp: Factor) -> Leaf:
            return Leaf(p, p, title, f"kda_{p}", (Linear(f"self_attn.{p}", (out,), (inp,)),), k)

        def param(p: str, title: str, shape: tuple[Factor, ...], dtype: str, label: str = "Weight") -> Leaf:
            name = p.removesuffix(".weight")
            return Leaf(name, name, title, f"kda_{name}", (Param(label, f"self_attn.{p}", shape, dtype),),
                        (BLOCK_KEYS,))

        return Group("attention", "Kimi delta attention (KDA)", (
            lin("q_proj", "Query projection", qkv, h), lin("k_proj", "Key projection", qkv, h),
            lin("v_proj", "Value projection", qkv, h),
            *(param(f"{x}_conv1d.weight", f"{t} short convolution", conv, control)
              for x, t in (("q", "Query"), ("k", "Key"), ("v", "Value"))),
            lin("f_a_proj", "Forget-gate down-projection", d, h), lin("f_b_proj", "Forget-gate up-projection", qkv, d),
            param("dt_bias", "Forget-gate bias", (qkv,), "F32", "Bias"),
            param("A_log", "Decay (log)", self.a_log_shape(), control, "Parameter"),
            lin("b_proj", "Beta projection", nh, h),
            *self.output_gate(h, d, qkv),
            param("o_norm.weight", "Gated output RMSNorm", (d,), self.o_norm_dtype(), GAIN),
            lin("o_proj", "Output projection", h, qkv)))

    def dense(self) -> tuple[Node, ...]:
        return (self.mlp("mlp", "MLP (dense)", "mlp", "mlp", self.f("intermediate_size", "intermediate"),
                         (BLOCK_KEYS, "intermediate_size")),)

    def expert_width(self) -> Factor:
        """The width the routed experts read and write."""
        return self.f("hidden_size", "hidden")

    def moe(self) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        inter = self.f("moe_intermediate_size", "moe intermediate")
        rd = self.router_dtype or c.dtype
        router = Group("router", "Router", (
            Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                 (Param("Weight", "block_sparse_moe.gate.weight", (e, h), rd),), (BLOCK_KEYS, "num_experts")),
            Leaf("e_score_correction_bias", "e_score_correction_bias", "Expert score correction bias",
                 "e_score_correction_bias",
                 (Param("Bias", "block_sparse_moe.gate.e_score_correction_bias", (e,), rd),), (BLOCK_KEYS,))))
        repeat = Factor(c.n_routed_experts, "experts", ("n_routed_experts",))
        experts = w123_mlp("experts", "Routed experts", "expert", "block_sparse_moe.experts", self.expert_width(),
                           inter, (BLOCK_KEYS, "moe_intermediate_size", DTYPE_KEYS), None if self.stacked else repeat)
        if self.stacked:  # llama.cpp's converter stacks each projection's experts: [E, out, in]
            experts = replace(experts, children=tuple(
                replace(leaf, tensors=tuple(replace(t, stack=(repeat,)) for t in leaf.tensors if isinstance(t, Linear)))
                for leaf in experts.children if isinstance(leaf, Leaf)))
        out: list[Node] = [router, experts]
        if c.n_shared_experts:
            sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                        ("moe_intermediate_size", "num_shared_experts"))
            out.append(self.mlp("shared_experts", "Shared experts", "shared", "block_sparse_moe.shared_experts", sh,
                                (BLOCK_KEYS, "moe_intermediate_size", "num_shared_experts")))
        return tuple(out)


ARCHITECTURE = register(Architecture(
    name="Kimi-Linear", model_types=MODEL_TYPES, read=read, describe=describe, dialects=dialects,
    class_names=("KimiLinearForCausalLM",), writer_trees=WRITER_TREES, gguf=GGUF_DIALECT,
    float32_routers=("block_sparse_moe.gate.weight", "block_sparse_moe.gate.e_score_correction_bias"),
    buffered=("block_sparse_moe.gate.e_score_correction_bias",),
    value_roles=((ROUTER_BIAS_SUFFIX, ROUTER_BIAS), (GGUF_ROUTER_BIAS, ROUTER_BIAS)),
    block_titles={f"{m}_{a}": f"{'MoE' if m == 'moe' else 'dense'} {a.upper()}" for m in KL_MLP.values()
                  for a in KL_ATTENTION.values()}))
