"""GLM-5.3-Flash (`model_type: glm5_next`, Glm5NextForConditionalGeneration) as data.

The text model (`text_config`, under `model.language_model.`) alternates KDA linear-attention layers (Kimi-Linear's
module, model.arch.kimi_linear: `self_attn.{q,k,v}_proj`, F32 `{q,k,v}_conv1d`, `f_a/f_b_proj`, F32 `dt_bias`,
F32 `A_log` [heads], `b_proj`, `g_a/g_b_proj`, `o_norm`, `o_proj`) with NoPE latent-attention layers (DeepseekV3's
MLA with a query latent, model.arch.deepseek_v3) holding a sparse-attention indexer on `indexer_types` full
layers: `self_attn.indexer.{wq_b, wk, k_norm, weights_proj}` and its k-pool compressor
`index_kpool_compress_{ape [kpool, index head dim], gate [index head dim, H]}`. Every layer carries
hyper-connections `hc_{attn,ffn}_{fn, base, scale}` (DeepSeek-V4's shapes; `fn` in the model's dtype, `base` and
`scale` F32; the output collapse is an unweighted mean, no `hc_head`), dense layers `mlp.{gate,up,down}_proj`,
MoE layers a F32 router with its correction bias, `mlp.experts.E.*` and `mlp.shared_experts.*`. The vision
tower (`model.visual.`): a Conv3d patch embedding, blocks (`norm1`, `attn.qkv`, `attn.q_norm/k_norm`,
`attn.proj`, `norm2`, `mlp.{gate,up,down}_proj`, biases with `attention_bias`), `post_layernorm`, a Conv2d
`downsample` and the `merger`; `lm_head` sits at the top.

Names as the release stores them: transformers 5.25 reads them through its conversion mapping (`glm5_next`:
`self_attn.f_a_proj` -> `self_attn.forget_gate.f_a_proj`, `hc_attn_fn` -> `attn_hc.fn`, the experts merged) and
its save_pretrained writes them back; llama.cpp's `conversion/glm5next.py` (ggml-org/llama.cpp@e972e2ca) reads
`model.language_model.*`, `hc_*` and the k-pool tensors under the same names. Defaults are Glm5NextTextConfig's
and Glm5NextVisionConfig's. The release's MTP layer (`layers.45.*`, which transformers ignores on load,
_keys_to_ignore_on_load_unexpected) is not described: one TENSORS_UNDESCRIBED. Proven against transformers 5.25
(tests/test_glm5_next.py).
"""

from __future__ import annotations

from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v4, glm_moe_dsa, kimi_linear
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
)
from kimi_audit.model.config_fields import ModelConfig, nested_text, read_eps, read_int, read_layer_types, scheduled

MODEL_TYPES = ("glm5_next",)
PREFIX = "model.language_model."
GAIN = "Learned gain"
F32 = "F32"

TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 45, "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 288,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 0, "v_head_dim": 256, "qk_nope_head_dim": 256,
    "num_experts_per_tok": 8, "index_head_dim": 128, "index_n_heads": 32, "linear_head_dim": 128,
    "linear_num_heads": 64, "linear_conv_kernel_dim": 4, "hc_mult": 4, "index_kpool": 16, "rms_norm_eps": 1e-5,
}
"""Glm5NextTextConfig's defaults (transformers 5.25, configuration_glm5_next.py)."""
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 24, "hidden_size": 1024, "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "out_hidden_size": 1536, "intermediate_size": 4096,
    "projection_intermediate_size": 10240}
"""Glm5NextVisionConfig's defaults."""
LINEAR_KEYS = {"linear_head_dim": "head_dim", "linear_num_heads": "num_heads",
               "linear_conv_kernel_dim": "short_conv_kernel_size"}
"""Glm5NextTextConfig's `linear_attn_config` entries, which override its linear_* keys."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    """The nested `text_config` (a top-level quantization_config or dtype wins) with its schedules as
    Glm5NextTextConfig.__post_init__ reads them, and the vision sub-config's dims."""
    merged = nested_text(cfg, MODEL_TYPES[0])

    def g(key: str) -> Any:
        return read_int(merged, key, TEXT_DEFAULTS)

    n = g("num_hidden_layers")
    attention = read_layer_types(merged, "layer_types", {"linear_attention", "indexed_attention", "full_attention"},
                                 n) or ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    mlp = read_layer_types(merged, "mlp_layer_types", {"dense", "sparse"}, n) or [
        "dense" if i < 3 else "sparse" for i in range(n)]
    indexer = glm_moe_dsa.indexer_types(merged, n)
    linear = merged.get("linear_attn_config") or {}
    if not isinstance(linear, dict):
        raise ConfigError("config.json linear_attn_config is not an object")
    dims = {k: read_int(linear, spelled, {spelled: g(k)}) for k, spelled in LINEAR_KEYS.items()}
    dims.update(hc_mult=g("hc_mult"), index_kpool=g("index_kpool"), attention_bias=0)
    vision = cfg.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise ConfigError("config.json vision_config is not an object")
    dims.update({f"vision_{k}": read_int(vision, k, VISION_DEFAULTS) for k in VISION_DEFAULTS})
    bias = vision.get("attention_bias", True)
    if not isinstance(bias, bool):
        raise ConfigError(f"config.json vision_config.attention_bias must be true or false, got {bias!r}")
    dims["vision_bias"] = int(bias)
    if dims["vision_num_heads"] < 1 or dims["vision_hidden_size"] % dims["vision_num_heads"]:
        raise ConfigError("config.json vision_config.num_heads must divide vision_config.hidden_size")
    fields = {k: g(k) for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank",
                                "kv_lora_rank", "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                                "vocab_size", "index_n_heads", "index_head_dim")}
    fields.update(num_hidden_layers=n, prefix=PREFIX, layers_at="layers.", topk_method="noaux_tc",
                  tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                  rms_norm_eps=read_eps(merged, TEXT_DEFAULTS["rms_norm_eps"]))
    kinds = tuple(f"{'moe' if m == 'sparse' else 'dense'}_"
                  + ("kda" if a == "linear_attention" else "mla" if x == "full" else "mla_sharedindexer")
                  for m, a, x in zip(mlp, attention, indexer))
    return scheduled({**merged, "model_type": MODEL_TYPES[0]}, fields, dims, kinds, ARCHITECTURE.quant)


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe(kimi_linear._Describe):
    control_dtype = F32

    def o_norm_dtype(self) -> str:
        return self.cfg.dtype

    def a_log_shape(self) -> tuple[Factor, ...]:
        return (Factor(self.cfg.dim("linear_num_heads"), "linear heads", ("linear_num_heads",)),)

    def tree(self) -> ModelTree:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        before: tuple[Node, ...] = (Leaf("embedding", "embed_tokens", "Token embedding", "embedding",
                                         (Param("Embedding table", f"{PREFIX}embed_tokens.weight", (v, h), c.dtype),),
                                         ("torch_dtype",)),)
        after: list[Node] = [self.gain("norm", "norm", "Final RMSNorm", "final_norm", f"{PREFIX}norm.weight", h,
                                       ("rms_norm_eps",))]
        if not c.tie_word_embeddings:
            after.append(Leaf("lm_head", "lm_head", "Output head", "lm_head", (Linear("lm_head", (v,), (h,)),),
                              ("tie_word_embeddings", "torch_dtype")))
        after.append(self.vision())
        return ModelTree(before, {kind: self.layer(kind) for kind in dict.fromkeys(c.layer_kinds)}, tuple(after))

    def layer(self, kind: str) -> tuple[Node, ...]:
        mlp, attention = kind.split("_", 1)
        if attention == "kda":
            attn: Group = self.kda()
        else:
            mla = self.attention()  # the indexer in place of a rotary buffer: replaced by this model's own
            children = tuple(ch for ch in mla.children if not (isinstance(ch, Group) and ch.key == "indexer"))
            attn = Group(mla.key, mla.title, children + (() if attention.endswith("sharedindexer") else
                                                         (self.glm_indexer(),)))
        return (self.norms(), self.hyper("hc_attn", "Attention hyper-connection"), attn,
                self.hyper("hc_ffn", "MLP hyper-connection"), *(self.moe() if mlp == "moe" else self.dense()))

    def hyper(self, stem: str, title: str) -> Leaf:
        """DeepSeek-V4's hyper-connection, its `fn` in the model's dtype."""
        return deepseek_v4.hyper_connection(self.cfg, stem, stem, title, f"{stem}_", fn_dtype=self.cfg.dtype)

    def glm_indexer(self) -> Group:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        ih, idim = self.f("index_n_heads", "indexer heads"), self.f("index_head_dim", "indexer head dim")
        pool = Factor(c.dim("index_kpool"), "k-pool", ("index_kpool",))
        keys = (BLOCK_KEYS, "index_n_heads", "index_head_dim", "indexer_types")
        at = "self_attn.indexer."
        return Group("indexer", "Sparse-attention indexer", (
            Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                 (Linear(f"{at}wq_b", (ih, idim), (self.f("q_lora_rank", "q latent"),)),), (*keys, DTYPE_KEYS)),
            Leaf("wk", "wk", "Indexer key projection", "indexer_wk", (Linear(f"{at}wk", (idim,), (h,)),),
                 (*keys, DTYPE_KEYS)),
            Leaf("k_norm", "k_norm", "Indexer key LayerNorm", "indexer_k_norm",
                 (Param(GAIN, f"{at}k_norm.weight", (idim,), c.dtype),
                  Param("Bias", f"{at}k_norm.bias", (idim,), c.dtype)), keys),
            Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                 (Param("Weight", f"{at}weights_proj.weight", (ih, h), c.dtype),), keys),
            Leaf("kpool", "index_kpool_compress", "Indexer k-pool compressor", "indexer_kpool",
                 (Param("Position embedding", f"{at}index_kpool_compress_ape", (pool, idim), c.dtype),
                  Param("Gate", f"{at}index_kpool_compress_gate", (idim, h), c.dtype)), (*keys, "index_kpool"))))

    def moe(self) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        router = Group("router", "Router", (
            Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                 (Param("Weight", "mlp.gate.weight", (e, h), F32),), (BLOCK_KEYS,)),
            Leaf("e_score_correction_bias", "e_score_correction_bias", "Expert score correction bias",
                 "e_score_correction_bias", (Param("Bias", "mlp.gate.e_score_correction_bias", (e,), F32),),
                 (BLOCK_KEYS,))))
        out: list[Node] = [router, self.mlp("experts", "Routed experts", "expert", "mlp.experts",
                                            self.f("moe_intermediate_size", "moe intermediate"),
                                            (BLOCK_KEYS, "moe_intermediate_size"), repeat=e)]
        if c.n_shared_experts:
            sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                        ("moe_intermediate_size", "n_shared_experts"))
            out.append(self.mlp("shared_experts", "Shared experts", "shared", "mlp.shared_experts", sh,
                                (BLOCK_KEYS, "moe_intermediate_size", "n_shared_experts")))
        return tuple(out)

    def vision(self) -> Group:
        c = self.cfg

        def v(key: str, label: str) -> Factor:
            return Factor(c.dim(f"vision_{key}"), label, (f"vision_config.{key}",))

        d, inter, out = v("hidden_size", "vision width"), v("intermediate_size", "vision MLP width"), \
            v("out_hidden_size", "vision output width")
        bias = bool(c.dim("vision_bias"))
        hd = Factor(c.dim("vision_hidden_size") // c.dim("vision_num_heads"), "vision head dim",
                    ("vision_config.hidden_size", "vision_config.num_heads"))
        three = Factor(3 * c.dim("vision_hidden_size"), "q, k, v", ("vision_config.hidden_size",))
        at, keys = "model.visual.blocks.", ("vision_config", "torch_dtype")

        def lin(key: str, title: str, o: Factor, i: Factor, has_bias: bool = bias, stem: str = at) -> Leaf:
            return Leaf(key.replace(".", "_"), key, title, f"vision_{key.replace('.', '_')}",
                        (Linear(f"{stem}{key}", (o,), (i,), has_bias),), keys)

        def norm(key: str, title: str, component: str, width: Factor) -> Leaf:
            return self.gain(key, key, title, "vision_norm", component, width, ("vision_config",))

        block = Group("blocks", "Vision blocks", (
            norm("norm1", "Pre-attention RMSNorm", f"{at}norm1.weight", d), lin("attn.qkv", "Fused q/k/v", three, d),
            norm("q_norm", "Query RMSNorm", f"{at}attn.q_norm.weight", hd),
            norm("k_norm", "Key RMSNorm", f"{at}attn.k_norm.weight", hd),
            lin("attn.proj", "Attention output projection", d, d),
            norm("norm2", "Pre-MLP RMSNorm", f"{at}norm2.weight", d),
            lin("mlp.gate_proj", "MLP gate projection", inter, d), lin("mlp.up_proj", "MLP up projection", inter, d),
            lin("mlp.down_proj", "MLP down projection", d, inter)),
            repeat=v("depth", "vision blocks"), index_at="blocks.", role="vision_blocks")
        p, tp, m = v("patch_size", "patch"), v("temporal_patch_size", "frames"), v("spatial_merge_size", "merge")
        pi = v("projection_intermediate_size", "merger MLP width")
        mg = "model.visual.merger."
        return Group("visual", "Vision tower", (
            Leaf("patch_embed", "patch_embed.proj", "Patch embedding (Conv3d)", "vision_patch_embed",
                 (Param("Kernel", "model.visual.patch_embed.proj.weight", (d, v("in_channels", "channels"), tp, p, p),
                        c.dtype), Param("Bias", "model.visual.patch_embed.proj.bias", (d,), c.dtype)), keys),
            block, norm("post_layernorm", "Post-blocks RMSNorm", "model.visual.post_layernorm.weight", d),
            Leaf("downsample", "downsample", "Patch merge (Conv2d)", "vision_downsample",
                 (Param("Kernel", "model.visual.downsample.weight", (out, d, m, m), c.dtype),
                  Param("Bias", "model.visual.downsample.bias", (out,), c.dtype)), keys),
            Group("merger", "Merger", (
                lin("proj", "Merger projection", out, out, False, mg),
                Leaf("post_projection_norm", "post_projection_norm", "Merger LayerNorm", "vision_norm",
                     (Param(GAIN, f"{mg}post_projection_norm.weight", (out,), c.dtype),
                      Param("Bias", f"{mg}post_projection_norm.bias", (out,), c.dtype)), keys),
                lin("gate_proj", "Merger gate projection", pi, out, False, mg),
                lin("up_proj", "Merger up projection", pi, out, False, mg),
                lin("down_proj", "Merger down projection", out, pi, False, mg)))), role="vision_tower")


ARCHITECTURE = register(Architecture(
    name="GLM-5.3-Flash", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("Glm5NextForConditionalGeneration",),
    undescribed={r"model\.language_model\.layers\.45\.": "GLM-5.3-Flash's MTP layer (layer 45, which transformers "
                 "ignores on load)"},
    float32_routers=("mlp.gate.weight", "mlp.gate.e_score_correction_bias"),
    buffered=("mlp.gate.e_score_correction_bias",), value_roles=kimi_linear.ARCHITECTURE.value_roles,
    block_titles={f"{m}_{a}": f"{'MoE' if m == 'moe' else 'dense'} {a.split('_')[0].upper()}"
                  + (", shared indexer" if a.endswith("sharedindexer") else "")
                  for m in ("dense", "moe") for a in ("kda", "mla", "mla_sharedindexer")}))
