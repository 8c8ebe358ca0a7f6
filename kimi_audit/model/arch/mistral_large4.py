"""Mistral's large MLA model (`model_type: mistral_large4`, MistralLarge4ForConditionalGeneration) as data.

A GLM-5-style text model (multi-head latent attention without a query latent, DeepSeek-V3.2's sparse-attention
indexer) with Mistral's own parts, and a Pixtral vision tower with its projector. Names are Mistral's native
ones, the release's: transformers 5.25 loads them through its conversion mapping (`conversion_mapping.py`,
`mistral_large4` and `mistral_large4_text`: `tok_embeddings` -> `model.language_model.embed_tokens`,
`layers.N.attention.wq` -> `...self_attn.q_proj`, `experts.E.w{1,3}` merged into `mlp.experts.gate_up_proj`, ...)
and its save_pretrained writes them back, so both agree on these names:
- top: `tok_embeddings`, `lerope.alpha` (the learned RoPE frequency scale, [rope dim / 2], F32), `norm`, `output`;
- per layer (`layers.N.`): `attention_norm`, `ffn_norm`; `attention.wq` [heads × (nope + rope), H] (no query
  latent), `attention.ssmax_scaling.{s,b}` [heads] (the position-dependent softmax scale), `attention.wo`; the
  layer's own latent KV unless `kv_source_layers` shares an earlier layer's (`attention.wkv_a_with_mqa`,
  `attention.kv_a_norm`), and `attention.wkv_b` always; a NoPE layer (`no_rope_layers` 0) folds the rope dims
  into the key: `wkv_a_with_mqa` [kv latent, H], `wkv_b` [heads × (nope + rope + v), kv latent]; on an
  `indexer_types` full layer `attention.indexer.{wq_b, wk, k_norm, weights_proj, q_input_norm, ssmax_scaling}`;
  dense layers `feed_forward.w{1,2,3}`, MoE layers `gate` (F32), `experts.E.w{1,2,3}`, `shared_experts.w{1,2,3}`;
- vision (`vision_encoder.`) and projector: Pixtral's, in Mistral's native spelling (model.arch.pixtral.NATIVE).
Defaults are MistralLarge4TextConfig's and PixtralVisionConfig's (transformers 5.25). Proven against transformers
5.25 (tests/test_mistral_large4.py). The release's quantization is not described: a quantized config is read by
the format's own conventions only.
"""

from __future__ import annotations

from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import glm_moe_dsa, pixtral
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
    register,
    w123_mlp,
)
from kimi_audit.model.config_fields import ModelConfig, nested_text, read_eps, read_int, read_layer_types, scheduled

MODEL_TYPES = ("mistral_large4",)
GAIN = "Learned gain"
F32 = "F32"

TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 204800, "hidden_size": 6144, "intermediate_size": 24576, "moe_intermediate_size": 6144,
    "num_hidden_layers": 72, "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 128,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "num_experts_per_tok": 4,
    "index_n_heads": 32, "index_head_dim": 128, "first_k_dense_replace": 1, "rms_norm_eps": 1e-5,
}
"""MistralLarge4TextConfig's defaults (transformers 5.25, configuration_mistral_large4.py)."""
VISION_ABSENT: dict[str, Any] = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 30,
                                 "num_channels": 3, "patch_size": 14}
"""MistralLarge4Config's vision sub-config when config.json has no vision_config (its init_kwargs)."""

KINDS = {(m, r, kv, ix) for m in ("dense", "moe") for r in ("rope", "nope") for kv in ("kv", "sharedkv")
         for ix in ("indexer", "sharedindexer")}


def read(cfg: dict[str, Any]) -> ModelConfig:
    """The nested `text_config` (its quantization and dtype at the top win), its per-layer schedules as
    MistralLarge4TextConfig.__post_init__ reads them, and the vision sub-config's dims."""
    merged = nested_text(cfg, MODEL_TYPES[0])

    def g(key: str) -> Any:
        return read_int(merged, key, TEXT_DEFAULTS)

    n = g("num_hidden_layers")
    rope = merged.get("no_rope_layers")
    if rope is None:
        interval = merged.get("no_rope_layer_interval", 4)
        if type(interval) is not int or interval < 1:
            raise ConfigError(f"config.json no_rope_layer_interval must be a positive integer, got {interval!r}")
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(rope, list) or len(rope) < n or any(r not in (0, 1) for r in rope):
        raise ConfigError(f"config.json no_rope_layers must give 0 or 1 for each of the {n} layers")
    sources = merged.get("kv_source_layers", list(range(n)))
    if (not isinstance(sources, list) or len(sources) != n
            or any(type(s) is not int or not 0 <= s <= i or sources[s] != s for i, s in enumerate(sources))):
        raise ConfigError("config.json kv_source_layers must name, for each layer, itself or an earlier layer "
                          "that owns its cache")
    first = g("first_k_dense_replace")
    mlp = read_layer_types(merged, "mlp_layer_types", {"dense", "sparse"}, n) or [
        "dense" if i < first else "sparse" for i in range(n)]
    indexer = glm_moe_dsa.indexer_types(merged, n)
    fields = {k: g(k) for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "kv_lora_rank",
                                "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "vocab_size",
                                "index_n_heads", "index_head_dim")}
    fields.update(num_hidden_layers=n, first_k_dense_replace=first, q_lora_rank=None, layers_at="layers.",
                  tie_word_embeddings=bool(cfg.get("tie_word_embeddings", merged.get("tie_word_embeddings", False))),
                  rms_norm_eps=read_eps(merged, TEXT_DEFAULTS["rms_norm_eps"]))
    kinds = tuple(f"{'moe' if m == 'sparse' else 'dense'}_{'rope' if r else 'nope'}_"
                  f"{'kv' if s == i else 'sharedkv'}_{'indexer' if x == 'full' else 'sharedindexer'}"
                  for i, (m, r, s, x) in enumerate(zip(mlp, rope, sources, indexer)))
    return scheduled({**merged, "model_type": MODEL_TYPES[0]}, fields, pixtral.read_dims(cfg, VISION_ABSENT), kinds,
                     ARCHITECTURE.quant)


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe:
    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def f(self, key: str, label: str) -> Factor:
        return Factor(getattr(self.cfg, key), label, (key,))

    def v(self, key: str, label: str) -> Factor:
        return Factor(self.cfg.dim(f"vision_{key}"), label, (f"vision_config.{key}",))

    def gain(self, key: str, title: str, role: str, component: str, width: Factor, dtype: str | None = None) -> Leaf:
        return Leaf(key, component.removesuffix(".weight"), title, role,
                    (Param(GAIN, component, (width,), dtype or self.cfg.dtype),), ("rms_norm_eps",))

    def tree(self) -> ModelTree:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        half = Factor(c.qk_rope_head_dim // 2, "rope dim / 2", ("qk_rope_head_dim",))
        before: tuple[Node, ...] = (
            Leaf("embedding", "tok_embeddings", "Token embedding", "embedding",
                 (Param("Embedding table", "tok_embeddings.weight", (v, h), c.dtype),), ("dtype",)),
            Leaf("lerope", "lerope.alpha", "Learned RoPE frequency scale", "rope_alpha",
                 (Param("Log scale", "lerope.alpha", (half,), F32),), ("qk_rope_head_dim",)))
        after: list[Node] = [self.gain("norm", "Final RMSNorm", "final_norm", "norm.weight", h)]
        if not c.tie_word_embeddings:
            after.append(Leaf("lm_head", "output", "Output head", "lm_head", (Linear("output", (v,), (h,)),),
                              ("dtype", "tie_word_embeddings")))
        after += [pixtral.tower(c, pixtral.NATIVE), pixtral.projector(c, pixtral.NATIVE)]
        blocks = {kind: self.layer(kind) for kind in dict.fromkeys(c.layer_kinds)}
        return ModelTree(before, blocks, tuple(after))

    def layer(self, kind: str) -> tuple[Node, ...]:
        mlp, rope, kv, indexer = kind.split("_")
        h = self.f("hidden_size", "hidden")
        return (self.gain("attention_norm", "Pre-attention RMSNorm", "input_layernorm", "attention_norm.weight", h),
                self.attention(rope == "rope", kv == "kv", indexer == "indexer"),
                self.gain("ffn_norm", "Pre-MLP RMSNorm", "post_attention_layernorm", "ffn_norm.weight", h),
                *(self.moe() if mlp == "moe" else (self.mlp("feed_forward", "MLP (dense)", "mlp", "feed_forward",
                                                            self.f("intermediate_size", "intermediate")),)))

    def attention(self, rope: bool, own_kv: bool, indexer: bool) -> Group:
        c = self.cfg
        h, heads = self.f("hidden_size", "hidden"), self.f("num_attention_heads", "heads")
        k = (BLOCK_KEYS, DTYPE_KEYS)
        r = c.qk_rope_head_dim if rope else 0
        qhd = Factor(c.q_head_dim, "q head dim", ("qk_nope_head_dim", "qk_rope_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.qk_rope_head_dim:,})")
        kvl = self.f("kv_lora_rank", "kv latent")
        kvb = Factor(c.qk_nope_head_dim + c.qk_rope_head_dim - r + c.v_head_dim, "key + value dim",
                     ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "no_rope_layers"))
        children: list[Node] = [
            Leaf("wq", "wq", "Query projection", "q_proj", (Linear("attention.wq", (heads, qhd), (h,)),), k),
            self.scaling("ssmax_scaling", "attention.ssmax_scaling", heads)]
        if own_kv:
            kv_out = Factor(c.kv_lora_rank + r, "kv latent + rope key", ("kv_lora_rank", "qk_rope_head_dim",
                                                                          "no_rope_layers"))
            children += [Leaf("wkv_a_with_mqa", "wkv_a_with_mqa", "Joint key-value down-projection",
                              "kv_a_proj_with_mqa", (Linear("attention.wkv_a_with_mqa", (kv_out,), (h,)),),
                              (*k, "kv_source_layers")),
                         self.gain("kv_a_norm", "Key-value latent RMSNorm", "kv_a_layernorm",
                                   "attention.kv_a_norm.weight", kvl)]
        children += [Leaf("wkv_b", "wkv_b", "Key-value up-projection", "kv_b_proj",
                          (Linear("attention.wkv_b", (heads, kvb), (kvl,)),), k),
                     Leaf("wo", "wo", "Attention output projection", "o_proj",
                          (Linear("attention.wo", (h,), (heads, self.f("v_head_dim", "value dim"))),), k)]
        if indexer:
            children.append(self.indexer())
        return Group("attention", "Latent attention", tuple(children))

    def scaling(self, key: str, stem: str, heads: Factor) -> Leaf:
        return Leaf(key, stem.rpartition(".")[2], "Softmax scaling by position", "softmax_scaling",
                    (Param("Scale", f"{stem}.s", (heads,), self.cfg.dtype),
                     Param("Bias", f"{stem}.b", (heads,), self.cfg.dtype)), (BLOCK_KEYS,))

    def indexer(self) -> Group:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        ih, idim = self.f("index_n_heads", "indexer heads"), self.f("index_head_dim", "indexer head dim")
        keys = (BLOCK_KEYS, "index_n_heads", "index_head_dim", "indexer_types")
        at = "attention.indexer."

        def layer_norm(key: str, title: str, width: Factor) -> Leaf:
            return Leaf(key, key, title, f"indexer_{key}", (Param(GAIN, f"{at}{key}.weight", (width,), c.dtype),
                                                           Param("Bias", f"{at}{key}.bias", (width,), c.dtype)), keys)

        return Group("indexer", "Sparse-attention indexer", (
            Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                 (Linear(f"{at}wq_b", (ih, idim), (h,)),), (*keys, DTYPE_KEYS)),
            Leaf("wk", "wk", "Indexer key projection", "indexer_wk", (Linear(f"{at}wk", (idim,), (h,)),),
                 (*keys, DTYPE_KEYS)),
            layer_norm("k_norm", "Indexer key LayerNorm", idim),
            Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                 (Linear(f"{at}weights_proj", (ih,), (h,)),), (*keys, DTYPE_KEYS)),
            layer_norm("q_input_norm", "Indexer query-input LayerNorm", h),
            self.scaling("indexer_ssmax_scaling", f"{at}ssmax_scaling", ih)))

    def mlp(self, key: str, title: str, role: str, module: str, inter: Factor, repeat: Factor | None = None) -> Group:
        return w123_mlp(key, title, role, module, self.f("hidden_size", "hidden"), inter, (BLOCK_KEYS, DTYPE_KEYS),
                        repeat)

    def moe(self) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        inter = self.f("moe_intermediate_size", "moe intermediate")
        out: list[Node] = [
            Group("router", "Router", (Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                                            (Param("Weight", "gate.weight", (e, h), F32),), (BLOCK_KEYS,)),)),
            self.mlp("experts", "Routed experts", "expert", "experts", inter,
                     Factor(c.n_routed_experts, "experts", ("n_routed_experts",)))]
        if c.n_shared_experts:
            sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                        ("moe_intermediate_size", "n_shared_experts"))
            out.append(self.mlp("shared_experts", "Shared experts", "shared", "shared_experts", sh))
        return tuple(out)


ARCHITECTURE = register(Architecture(
    name="Mistral Large 4", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("MistralLarge4ForConditionalGeneration",), float32_routers=("gate.weight",),
    block_titles={"_".join(k): f"{'MoE' if k[0] == 'moe' else 'dense'} {'RoPE' if k[1] == 'rope' else 'NoPE'}"
                  f"{'' if k[2] == 'kv' else ', shared KV'}{'' if k[3] == 'indexer' else ', shared indexer'}"
                  for k in KINDS}))
