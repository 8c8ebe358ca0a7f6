"""DeepseekV3ForCausalLM as data: Kimi-K2 (Instruct, Base, 0905, Thinking), DeepSeek-V3, R1 and V3.1, and
DeepSeek-V3.2 (`deepseek_v32`) as its variant with the sparse-attention indexer and F32 norm gains.

Mirrors modeling_deepseek.py: DeepseekV3Attention (multi-head latent attention), DeepseekV3MLP for dense
blocks, DeepseekV3MoE (router gate + routed experts + shared experts) for MoE blocks, and the
multi-token-prediction layers stored after the main stack (DeepSeek-V3's `model.layers.61`): its embedding,
norms, combining projection and output head before an ordinary MoE layer. DeepSeek-V3.2's indexer is
DeepSeek-V3.2-Exp's inference/model.py `Indexer`; it takes the place of the rotary buffer.
"""

from __future__ import annotations

from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch.deepseek_v3.gguf import GGUF_ROUTER_BIAS
from kimi_audit.model.arch.deepseek_v3.gguf_dsa import GGUF_DIALECT
from kimi_audit.model.arch.spec import (
    ATTENTION_BIAS_KEYS,
    BLOCK_KEYS,
    DENSE,
    DTYPE_KEYS,
    MOE,
    MTP,
    QUANT_KEYS,
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
)
from kimi_audit.model.config_fields import (
    ModelConfig,
    bounded,
    quantization,
    read_eps,
    read_int,
    weights_dtype,
)
from kimi_audit.model.kinds import ROTARY_BUFFER, ROUTER_BIAS
from kimi_audit.model.quant.gguf import GGUF_KV_B_TREE, GGUF_TREE
from kimi_audit.model.quant.scheme import ReleaseQuant

MODEL_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v32")
"""The config model_types this description is registered for (model.arch.registry)."""
V32 = "deepseek_v32"
"""DeepSeek-V3.2: the sparse-attention indexer in every layer, F32 norm gains."""

REFERENCE_DEFAULTS: dict[str, Any] = {
    "moe_intermediate_size": 2048,
    "q_lora_rank": 1536,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
}
"""What a key absent from config.json means: the defaults of `DeepseekV3Config.__init__` in DeepSeek's
configuration_deepseek.py (the reference the layout mirrors), so an omitted key builds the model that code
builds. transformers' DeepseekV3Config (5.x) agrees on every value it has, but has no `topk_method` (its
DeepseekV3TopkRouter always holds `e_score_correction_bias`, i.e. noaux_tc) and no `moe_layer_freq` (every
layer from `first_k_dense_replace` on is MoE, i.e. 1), so it never writes them; it writes
`num_nextn_predict_layers` (default 1) but builds and saves no MTP layer.

The dimensions (hidden_size, intermediate_size, kv_lora_rank, heads and head dims, num_hidden_layers,
vocab_size) stay required: every writer records them, and a config without them is not one to audit against
the 671B defaults; their absence is a ConfigError that names the key.
"""


def read(cfg: dict[str, Any]) -> ModelConfig:
    return read_family(cfg, REFERENCE_DEFAULTS, indexer=cfg.get("model_type") == V32,
                       norm_f32=cfg.get("model_type") == V32)


def read_family(cfg: dict[str, Any], defaults: dict[str, Any], *, indexer: bool, norm_f32: bool,
                release: ReleaseQuant | None = None) -> ModelConfig:
    """A DeepseekV3-shaped config (GLM-5's and Kimi-K2.5's text model too): `defaults` for absent keys (its
    configuration class's), `indexer`: V3.2's sparse-attention indexer in every layer, `norm_f32`: F32 gains,
    `release`: the architecture's own quantization conventions (DeepseekV3's when None)."""

    def i(key: str, optional: bool = False) -> Any:
        return read_int(cfg, key, defaults, optional=optional)

    def d(key: str) -> Any:
        return cfg.get(key, defaults[key])

    dtype = weights_dtype(cfg)
    plan, unsupported = quantization(cfg, dtype, ARCHITECTURE.quant if release is None else release)
    eps = read_eps(cfg, defaults["rms_norm_eps"])
    moe_layer_freq = i("moe_layer_freq")
    if moe_layer_freq == 0:
        raise ConfigError("config.json moe_layer_freq must be at least 1")
    # mlx-lm's sanitize drops them; llama.cpp's GGUF config says how many its file keeps (GLM's converters keep them)
    mtp = 0 if plan is not None and plan.tree == MLX_TREE else i("num_nextn_predict_layers")
    bounded(i("num_hidden_layers") + mtp, i("n_routed_experts", optional=True) or 0)
    return ModelConfig(
        model_type=str(cfg.get("model_type", MODEL_TYPES[0])),
        hidden_size=i("hidden_size"),
        intermediate_size=i("intermediate_size"),
        moe_intermediate_size=i("moe_intermediate_size"),
        q_lora_rank=i("q_lora_rank", optional=True),
        kv_lora_rank=i("kv_lora_rank"),
        num_attention_heads=i("num_attention_heads"),
        qk_nope_head_dim=i("qk_nope_head_dim"),
        qk_rope_head_dim=i("qk_rope_head_dim"),
        v_head_dim=i("v_head_dim"),
        num_hidden_layers=i("num_hidden_layers"),
        first_k_dense_replace=i("first_k_dense_replace"),
        moe_layer_freq=moe_layer_freq,
        n_routed_experts=i("n_routed_experts", optional=True),
        n_shared_experts=i("n_shared_experts", optional=True),
        num_experts_per_tok=i("num_experts_per_tok", optional=True),
        topk_method=d("topk_method"),
        vocab_size=i("vocab_size"),
        tie_word_embeddings=bool(d("tie_word_embeddings")),
        num_nextn_predict_layers=mtp,
        attention_bias=bool(d("attention_bias")),
        dtype=dtype,
        rms_norm_eps=eps,
        quant=plan,
        quant_unsupported=unsupported,
        index_n_heads=i("index_n_heads", optional=True) if indexer else None,
        index_head_dim=i("index_head_dim", optional=True) if indexer else None,
        norm_dtype="F32" if norm_f32 else dtype,
    )


MTP_EMBED_NOTE = ("A copy of model.embed_tokens.weight: the MTP module shares the main embedding at inference. "
                  "Left out of the total counted once.")
MTP_HEAD_NOTE = ("A copy of lm_head.weight: the MTP module shares the main output head at inference. "
                 "Left out of the total counted once.")
GAIN = "Learned gain"
MLX_TREE = "mlx-lm"
"""mlx-lm's DeepseekV3 tree (mlx-lm 0.32 models/deepseek_v3.py `Model.sanitize`, ml-explore/mlx-lm@v0.32.2, the
loader of mlx-community's Kimi-K2 and DeepSeek-V3 conversions): the routed experts of a layer stacked into one
`mlp.switch_mlp.{gate,up,down}_proj` [E, out, in]; kv_b_proj split per head into `self_attn.embed_q`
[heads, kv_lora_rank, qk_nope_head_dim] (the key half, transposed) and `self_attn.unembed_out`
[heads, v_head_dim, kv_lora_rank]; the embedding quantized as a Linear; no MTP layer and no rotary buffer."""
WRITER_TREES = (MLX_TREE, GGUF_TREE, GGUF_KV_B_TREE)
NORM_KEYS = (BLOCK_KEYS, "torch_dtype", "rms_norm_eps")


def describe(cfg: ModelConfig, fused_experts: bool = False) -> ModelTree:
    """The module tree of `cfg` (a DeepseekV3-family config); `fused_experts`: each layer's routed experts as two
    stacked parameters (Mistral Small 4, model.arch.mistral4)."""
    return _Describe(cfg, fused_experts).tree()


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    """transformers writes DeepseekV3 in the release's own names: no other spelling."""
    return ()


class _Describe:
    def __init__(self, cfg: ModelConfig, fused_experts: bool = False) -> None:
        self.cfg = cfg
        self.norm_dtype = cfg.norm_dtype or cfg.dtype
        self.writer = cfg.quant.tree if cfg.quant is not None else ""
        self.mlx = self.writer == MLX_TREE
        self.stacked = self.writer in WRITER_TREES
        """A writer's tree (MLX_TREE, GGUF_TREE, GGUF_KV_B_TREE): the experts stacked, the embedding a weight, no
        MTP layer, no rotary buffer."""
        self.fused_experts = fused_experts
        """The routed experts as two stacked parameters per layer (`mlp.experts.gate_up_proj` [E, 2I, H],
        `mlp.experts.down_proj` [E, H, I]): Mistral Small 4's release and transformers' save of it."""

    def f(self, key: str, label: str) -> Factor:
        return Factor(getattr(self.cfg, key), label, (key,))

    def gain(self, key: str, name: str, title: str, role: str, component: str, width: Factor,
             keys: tuple[str, ...] = NORM_KEYS, note: str = "") -> Leaf:
        """An RMSNorm's learned gain."""
        return Leaf(key, name, title, role, (Param(GAIN, component, (width,), self.norm_dtype),), keys, note)

    def tree(self) -> ModelTree:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        table: Linear | Param = (Linear("model.embed_tokens", (v,), (h,)) if self.stacked else
                                 Param("Embedding table", "model.embed_tokens.weight", (v, h), c.dtype))
        before: tuple[Node, ...] = (
            Leaf("embedding", "embed_tokens", "Token embedding", "embedding", (table,),
                 ("torch_dtype", QUANT_KEYS) if self.stacked else ("torch_dtype",)),)
        after: list[Node] = [self.gain("norm", "norm", "Final RMSNorm", "final_norm", "model.norm.weight", h,
                                       ("torch_dtype", "rms_norm_eps"))]
        if not c.tie_word_embeddings:
            after.append(Leaf("lm_head", "lm_head", "Output head", "lm_head",
                              (Linear("lm_head", (v,), (h,)),), ("torch_dtype", "tie_word_embeddings", QUANT_KEYS)))
        # n_routed_experts None (DeepseekV3Config allows it) makes every layer dense, the MTP layers too.
        mlp = self.dense_mlp() if c.n_routed_experts is None else self.moe()
        blocks = {DENSE: (self.norms(), self.attention(), *self.dense_mlp()),
                  MTP: (self.mtp_head(), self.norms(), self.attention(), *mlp)}
        if c.n_routed_experts is not None:
            blocks[MOE] = (self.norms(), self.attention(), *mlp)
        return ModelTree(before, blocks, tuple(after))

    def norms(self) -> Group:
        h = self.f("hidden_size", "hidden")
        return Group("norms", "Block norms", (
            self.gain("input_layernorm", "input_layernorm", "Pre-attention RMSNorm", "input_layernorm",
                      "input_layernorm.weight", h),
            self.gain("post_attention_layernorm", "post_attention_layernorm", "Pre-MLP RMSNorm",
                      "post_attention_layernorm", "post_attention_layernorm.weight", h)))

    def attention(self) -> Group:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        heads = self.f("num_attention_heads", "heads")
        bias = c.attention_bias
        bk = (BLOCK_KEYS, DTYPE_KEYS, ATTENTION_BIAS_KEYS)
        qhd = Factor(c.q_head_dim, "q head dim", ("qk_nope_head_dim", "qk_rope_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.qk_rope_head_dim:,})")
        if c.q_lora_rank is None:
            q = Group("q_projection", "Query projection", (
                Leaf("q_proj", "q_proj", "Query projection", "q_proj",
                     (Linear("self_attn.q_proj", (heads, qhd), (h,)),), bk),))
        else:
            ql = self.f("q_lora_rank", "q latent")
            q = Group("q_compression", "Query compression", (
                Leaf("q_a_proj", "q_a_proj", "Query down-projection", "q_a_proj",
                     (Linear("self_attn.q_a_proj", (ql,), (h,), bias),), bk),
                self.gain("q_a_layernorm", "q_a_layernorm", "Query latent RMSNorm", "q_a_layernorm",
                          "self_attn.q_a_layernorm.weight", ql),
                Leaf("q_b_proj", "q_b_proj", "Query up-projection", "q_b_proj",
                     (Linear("self_attn.q_b_proj", (heads, qhd), (ql,)),), bk)))
        kvl = self.f("kv_lora_rank", "kv latent")
        kv_out = Factor(c.kv_lora_rank + c.qk_rope_head_dim, "kv latent + rope key",
                        ("kv_lora_rank", "qk_rope_head_dim"), f"({c.kv_lora_rank:,} + {c.qk_rope_head_dim:,})")
        kvb = Factor(c.qk_nope_head_dim + c.v_head_dim, "nope key + value dim", ("qk_nope_head_dim", "v_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.v_head_dim:,})")
        vd = self.f("v_head_dim", "value dim")
        if self.mlx:  # kv_b_proj split per head (MLX_TREE)
            nope = self.f("qk_nope_head_dim", "nope key dim")
            up: tuple[Node, ...] = (
                Leaf("embed_q", "embed_q", "Key up-projection, per head (kv_b_proj's key half)", "kv_b_proj",
                     (Linear("self_attn.embed_q", (kvl,), (nope,), stack=(heads,)),), bk),
                Leaf("unembed_out", "unembed_out", "Value up-projection, per head (kv_b_proj's value half)",
                     "kv_b_proj", (Linear("self_attn.unembed_out", (vd,), (kvl,), stack=(heads,)),), bk))
        elif self.writer == GGUF_TREE:  # split as llama.cpp's converter splits it, k_b transposed
            nope = self.f("qk_nope_head_dim", "nope key dim")
            up = (Leaf("k_b_proj", "k_b_proj", "Key up-projection, per head (kv_b_proj's key half)", "kv_b_proj",
                       (Linear("self_attn.k_b_proj", (kvl,), (nope,), stack=(heads,)),), bk),
                  Leaf("v_b_proj", "v_b_proj", "Value up-projection, per head (kv_b_proj's value half)",
                       "kv_b_proj", (Linear("self_attn.v_b_proj", (vd,), (kvl,), stack=(heads,)),), bk))
        else:
            up = (Leaf("kv_b_proj", "kv_b_proj", "Key-value up-projection", "kv_b_proj",
                       (Linear("self_attn.kv_b_proj", (heads, kvb), (kvl,)),), bk),)
        kv = Group("kv_compression", "Key-value compression", (
            Leaf("kv_a_proj_with_mqa", "kv_a_proj_with_mqa", "Joint key-value down-projection", "kv_a_proj_with_mqa",
                 (Linear("self_attn.kv_a_proj_with_mqa", (kv_out,), (h,), bias),), bk),
            self.gain("kv_a_layernorm", "kv_a_layernorm", "Key-value latent RMSNorm", "kv_a_layernorm",
                      "self_attn.kv_a_layernorm.weight", kvl), *up))
        o = Group("output_projection", "Output projection", (
            Leaf("o_proj", "o_proj", "Attention output projection", "o_proj",
                 (Linear("self_attn.o_proj", (h,), (heads, vd), bias),), bk),))
        if c.index_n_heads and c.index_head_dim:
            last: tuple[Node, ...] = (self.indexer(),)
        else:
            stored = KIMI_K2_INV_FREQ if (c.model_type, c.qk_rope_head_dim) == ("kimi_k2", 64) else None
            rotary = Buffer("self_attn.rotary_emb.inv_freq", stored or (c.qk_rope_head_dim // 2,), c.dtype)
            last = () if self.stacked else (rotary,)
        return Group("attention", "Latent attention", (q, kv, o, *last))

    def indexer(self) -> Group:
        """DeepSeek-V3.2's sparse-attention indexer (DSA): query and key projections, a LayerNorm on the keys
        (gain and bias, F32) and per-head weights, a Linear module with no bias (transformers' and mlx-lm 0.32's
        nn.Linear, which llmcompressor's `Linear` target and mlx-lm's quantization store like any other) that the
        release's own FP8 keeps unquantized (V32_RELEASE)."""
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        ih, idim = self.f("index_n_heads", "indexer heads"), self.f("index_head_dim", "indexer head dim")
        q_in = self.f("q_lora_rank", "q latent") if c.q_lora_rank else h
        keys = (BLOCK_KEYS, "index_n_heads", "index_head_dim")
        return Group("indexer", "Sparse-attention indexer", (
            Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                 (Linear("self_attn.indexer.wq_b", (ih, idim), (q_in,)),), (*keys, DTYPE_KEYS)),
            Leaf("wk", "wk", "Indexer key projection", "indexer_wk",
                 (Linear("self_attn.indexer.wk", (idim,), (h,)),), (*keys, DTYPE_KEYS)),
            Leaf("k_norm", "k_norm", "Indexer key LayerNorm", "indexer_k_norm",
                 (Param(GAIN, "self_attn.indexer.k_norm.weight", (idim,), "F32"),
                  Param("Bias", "self_attn.indexer.k_norm.bias", (idim,), "F32")), keys),
            Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                 (Linear("self_attn.indexer.weights_proj", (ih,), (h,)),), (*keys, DTYPE_KEYS)),
        ))

    def mlp(self, key: str, title: str, role: str, module: str, inter: Factor, keys: tuple[str, ...],
            repeat: Factor | None = None) -> Group:
        h = self.f("hidden_size", "hidden")
        if repeat is not None and self.fused_experts:
            two = Factor(2 * inter.value, "2 × moe intermediate", inter.keys, f"(2 × {inter.value:,})")
            return Group(key, title, (
                Leaf("gate_up_proj", "gate_up_proj", "Gate and up projections, stacked", f"{role}_gate_proj",
                     (Param("Weight", f"{module}.gate_up_proj", (repeat, two, h), self.cfg.dtype),),
                     (*keys, "torch_dtype")),
                Leaf("down_proj", "down_proj", "Down projections, stacked", f"{role}_down_proj",
                     (Param("Weight", f"{module}.down_proj", (repeat, h, inter), self.cfg.dtype),),
                     (*keys, "torch_dtype"))))
        stack: tuple[Factor, ...] = ()
        if repeat is not None and self.stacked:  # one stacked tensor per projection (mlx-lm's, llama.cpp's)
            module = module.replace(".experts", ".switch_mlp") if self.mlx else module
            stack, repeat = (repeat,), None
        return Group(key, title, tuple(
            Leaf(p, p, t, f"{role}_{p}",
                 (Linear(f"{module}.{p}", (h,) if p == "down_proj" else (inter,),
                         (inter,) if p == "down_proj" else (h,), stack=stack),), (*keys, DTYPE_KEYS))
            for p, t in (("gate_proj", "Gate projection"), ("up_proj", "Up projection"),
                         ("down_proj", "Down projection"))),
            repeat=repeat, index_at="experts." if repeat is not None else "")

    def dense_mlp(self) -> tuple[Node, ...]:
        return (self.mlp("mlp", "MLP (dense)", "mlp", "mlp", self.f("intermediate_size", "intermediate"),
                         (BLOCK_KEYS, "intermediate_size")),)

    def moe(self) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        router: list[Node] = [Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                                   (Param("Weight", "mlp.gate.weight", (e, h), c.dtype),),
                                   (BLOCK_KEYS, "torch_dtype", "num_experts_per_tok"))]
        if c.topk_method == "noaux_tc":
            router.append(Leaf("e_score_correction_bias", "e_score_correction_bias", "Expert score correction bias",
                               "e_score_correction_bias",
                               (Param("Bias", "mlp.gate.e_score_correction_bias", (e,), "F32"),),
                               (BLOCK_KEYS, "topk_method")))
        out: list[Node] = [Group("router", "Router", tuple(router)),
                           self.mlp("experts", "Routed experts", "expert", "mlp.experts",
                                    self.f("moe_intermediate_size", "moe intermediate"),
                                    (BLOCK_KEYS, "moe_intermediate_size", "num_experts_per_tok"),
                                    repeat=Factor(c.n_routed_experts, "experts", ("n_routed_experts",)))]
        if c.n_shared_experts:
            sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                        ("moe_intermediate_size", "n_shared_experts"),
                        f"({c.moe_intermediate_size:,} × {c.n_shared_experts:,})" if c.n_shared_experts > 1 else None)
            out.append(self.mlp("shared_experts", "Shared experts", "shared", "mlp.shared_experts", sh,
                                (BLOCK_KEYS, "moe_intermediate_size", "n_shared_experts")))
        return tuple(out)

    def mtp_head(self) -> Group:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        two_h = Factor(2 * c.hidden_size, "2 × hidden", ("hidden_size",), f"(2 × {c.hidden_size:,})")
        k = (BLOCK_KEYS, "torch_dtype")
        lk = (*k, QUANT_KEYS)
        return Group("mtp_head", "MTP embedding, projection and head", (
            Leaf("embed_tokens", "embed_tokens", "MTP token embedding", "embed_tokens",
                 (Linear("embed_tokens", (v,), (h,)) if self.stacked else
                  Param("Embedding table", "embed_tokens.weight", (v, h), c.dtype),), k, MTP_EMBED_NOTE),
            self.gain("enorm", "enorm", "MTP embedding RMSNorm", "enorm", "enorm.weight", h),
            self.gain("hnorm", "hnorm", "MTP hidden-state RMSNorm", "hnorm", "hnorm.weight", h),
            Leaf("eh_proj", "eh_proj", "MTP combining projection", "eh_proj", (Linear("eh_proj", (h,), (two_h,)),), lk),
            self.gain("shared_head_norm", "shared_head.norm", "MTP head RMSNorm", "shared_head_norm",
                      "shared_head.norm.weight", h),
            Leaf("shared_head_head", "shared_head.head", "MTP output head", "shared_head_head",
                 (Linear("shared_head.head", (v,), (h,)),), lk, MTP_HEAD_NOTE),
        ))


ROUTER_FP32 = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")
"""DeepseekV3's router, kept in float32 by transformers (_keep_in_fp32_modules_strict)."""
ROUTER_BIAS_SUFFIX = ".e_score_correction_bias"

KIMI_K2_INV_FREQ = (56,)
"""What Kimi-K2's releases (model_type kimi_k2, qk_rope_head_dim 64: Instruct, Base, 0905, Thinking) store as
each layer's `rotary_emb.inv_freq`: BF16 [56], not qk_rope_head_dim / 2 = [32] (the published shard headers:
docs/family.md). A buffer no loader reads (recomputed), expected as the release stores it: the official release
showed an info BUFFER_SHAPE on every layer. Any other kimi_k2 config expects the derived [qk_rope_head_dim / 2]."""

V32_RELEASE = ReleaseQuant(plain_suffixes=(".indexer.weights_proj",))
"""DeepSeek's own FP8 (DeepSeek-V3.2) keeps the indexer's weights_proj in BF16, no scale."""

ARCHITECTURE = register(Architecture(
    name="DeepSeek-V3", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"), writer_trees=WRITER_TREES,
    gguf=GGUF_DIALECT, quant=V32_RELEASE,
    titles={"kimi_k2": "Kimi K2", V32: "DeepSeek-V3.2"},
    float32_routers=ROUTER_FP32, buffered=("mlp.gate.e_score_correction_bias",),
    value_roles=((ROUTER_BIAS_SUFFIX, ROUTER_BIAS), (GGUF_ROUTER_BIAS, ROUTER_BIAS), (".inv_freq", ROTARY_BUFFER))))
