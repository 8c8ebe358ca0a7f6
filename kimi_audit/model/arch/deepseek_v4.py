"""DeepSeek-V4 (`deepseek_v4`: V4-Flash, V4-Pro and their Base models; V4.1 where its config differs) as data.

Mirrors transformers 5.25's modeling_deepseek_v4.py, named as DeepSeek's release names its tensors (the
checkpoint conversion mapping of transformers 5.25, `deepseek_v4`, read backwards): no `model.` prefix,
`embed.weight`, `layers.N.attn.*` (`wq_a`, `q_norm`, `wq_b`, `wkv`, `norm`, `wo_a`, `wo_b`, `attn_sink`),
`layers.N.attn_norm`, `layers.N.ffn_norm`, `layers.N.ffn.*` (`gate.weight`, `gate.bias`: the routing bias,
`gate.tid2eid` on hash-routed layers, `experts.E.{w1,w2,w3}`, `shared_experts.{w1,w2,w3}`), the
hyper-connections `layers.N.hc_{attn,ffn}_{fn,base,scale}`, then `norm.weight`, `hc_head_{fn,base,scale}` and
`head.weight`.

Per layer, the attention is sliding-window only (SWA), or adds a compressor (HCA: `attn.compressor.{wkv,
wgate,ape,norm}`) or a compressor and a lightning indexer with its own compressor (CSA: `attn.indexer.{wq_b,
weights_proj}`, `attn.indexer.compressor.*`); the first `num_hash_layers` MoE layers route by a token-id table
(`ffn.gate.tid2eid`, I64 [vocab, top-k], a buffer) instead of the routing bias.

Dialect `transformers`: what transformers 5.x's save_pretrained writes: the same leaf names under
`model.layers.N.`, and `model.embed_tokens.weight`, `model.norm.weight`, `model.hc_head.hc_{fn,base,scale}`
at the top (`head.weight` unchanged).

Not described: the multi-token-prediction module (`mtp.N.*` in the release): transformers 5.25 builds none
and ignores it on load, and no public source gives its tensors; quantization naming (FP8 `.scale`, FP4
experts): the quantization scheme's (model.quant), not this tree's.
"""

from __future__ import annotations

from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    Buffer,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
)
from kimi_audit.model.config import ModelConfig

MODEL_TYPES = ("deepseek_v4",)
DIALECTS = {"transformers": r"^model\.(embed_tokens\.weight|norm\.weight|hc_head\.|layers\.\d+\.)"}
"""Dialect -> a pattern only its names match (model.arch.registry.detect_dialect)."""
DIALECT_NOTES = {"transformers": "transformers 5.x's save_pretrained spelling (`model.` before the layers, "
                                 "`model.embed_tokens`, `model.norm`, `model.hc_head.*`)"}

UNDESCRIBED = {r"^mtp\.\d+\.": "the multi-token-prediction module (`mtp.N.*`), which no source this tool "
                                 "reads describes (transformers 5.25 builds none and drops it on load)"}
"""Names stored by the release that this description leaves out: pattern -> what they are."""

GAIN = "Learned gain"
F32 = "F32"


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe:
    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.hf = cfg.dialect == "transformers"

    def f(self, key: str, label: str) -> Factor:
        return Factor(getattr(self.cfg, key), label, (key,))

    def d(self, key: str, label: str) -> Factor:
        return Factor(self.cfg.dim(key), label, (key,))

    def tree(self) -> ModelTree:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        embed = "model.embed_tokens.weight" if self.hf else "embed.weight"
        before: tuple[Node, ...] = (Leaf("embedding", "embed", "Token embedding", "embedding",
                                         (Param("Embedding table", embed, (v, h), c.dtype),), ("dtype",)),)
        norm = "model.norm.weight" if self.hf else "norm.weight"
        after: list[Node] = [
            Leaf("norm", "norm", "Final RMSNorm", "final_norm", (Param(GAIN, norm, (h,), F32),), ("rms_norm_eps",)),
            self.hyper("hc_head", "hc_head", "Output hyper-connection", "model.hc_head.hc_" if self.hf else "hc_head_",
                       head=True),
        ]
        if not c.tie_word_embeddings:
            after.append(Leaf("lm_head", "head", "Output head", "lm_head", (Linear("head", (v,), (h,)),),
                              ("dtype", "tie_word_embeddings")))
        blocks = {kind: self.layer(kind) for kind in dict.fromkeys(c.layer_kinds)}
        return ModelTree(before, blocks, tuple(after), "model.layers." if self.hf else "layers.")

    def layer(self, kind: str) -> tuple[Node, ...]:
        h = self.f("hidden_size", "hidden")
        attention = kind.rsplit("_", 1)[1]
        return (
            Leaf("attn_norm", "attn_norm", "Pre-attention RMSNorm", "input_layernorm",
                 (Param(GAIN, "attn_norm.weight", (h,), F32),), (BLOCK_KEYS, "rms_norm_eps")),
            self.hyper("hc_attn", "hc_attn", "Attention hyper-connection", "hc_attn_"),
            self.attention(attention),
            Leaf("ffn_norm", "ffn_norm", "Pre-MoE RMSNorm", "post_attention_layernorm",
                 (Param(GAIN, "ffn_norm.weight", (h,), F32),), (BLOCK_KEYS, "rms_norm_eps")),
            self.hyper("hc_ffn", "hc_ffn", "MoE hyper-connection", "hc_ffn_"),
            *self.moe(hashed=kind.startswith("moe_hash")),
        )

    def hyper(self, key: str, name: str, title: str, stem: str, head: bool = False) -> Leaf:
        """A manifold-constrained hyper-connection (DeepseekV4HyperConnection, or DeepseekV4HyperHead for the
        output): `fn` [(2 + n) × n, n × hidden] (the head's [n, n × hidden]), `base`, `scale` [3] ([1]), F32."""
        c = self.cfg
        n, hd = c.dim("hc_mult"), c.hidden_size
        rows = Factor(n if head else (2 + n) * n, "mixing weights", ("hc_mult",),
                      None if head else f"((2 + {n}) × {n})")
        width = Factor(n * hd, "streams × hidden", ("hc_mult", "hidden_size"), f"({n} × {hd:,})")
        scales = Factor(1 if head else 3, "scales", ())
        return Leaf(key, name, title, "hyper_connection", (
            Param("Mixing projection", f"{stem}fn", (rows, width), F32),
            Param("Mixing bias", f"{stem}base", (rows,), F32),
            Param("Scales", f"{stem}scale", (scales,), F32)), ("hc_mult", *(() if head else (BLOCK_KEYS,))))

    def attention(self, kind: str) -> Group:
        c = self.cfg
        h, heads = self.f("hidden_size", "hidden"), self.f("num_attention_heads", "heads")
        ql, hd = self.f("q_lora_rank", "q latent"), self.d("head_dim", "head dim")
        groups, olr = c.dim("o_groups"), c.dim("o_lora_rank")
        per_group = Factor(c.num_attention_heads * c.dim("head_dim") // groups, "heads × head dim / groups",
                           ("num_attention_heads", "head_dim", "o_groups"))
        o_mid = Factor(groups * olr, "groups × o latent", ("o_groups", "o_lora_rank"), f"({groups} × {olr:,})")
        k = (BLOCK_KEYS, DTYPE_KEYS)
        children: list[Node] = [
            Leaf("wq_a", "wq_a", "Query down-projection", "q_a_proj", (Linear("attn.wq_a", (ql,), (h,)),), k),
            Leaf("q_norm", "q_norm", "Query latent RMSNorm", "q_a_layernorm",
                 (Param(GAIN, "attn.q_norm.weight", (ql,), F32),), (BLOCK_KEYS,)),
            Leaf("wq_b", "wq_b", "Query up-projection", "q_b_proj", (Linear("attn.wq_b", (heads, hd), (ql,)),), k),
            Leaf("wkv", "wkv", "Key-value projection (one shared head)", "kv_proj",
                 (Linear("attn.wkv", (hd,), (h,)),), k),
            Leaf("kv_norm", "norm", "Key-value RMSNorm", "kv_a_layernorm",
                 (Param(GAIN, "attn.norm.weight", (hd,), F32),), (BLOCK_KEYS,)),
            Leaf("wo_a", "wo_a", "Grouped output projection", "o_a_proj",
                 (Linear("attn.wo_a", (o_mid,), (per_group,)),), (*k, "o_groups", "o_lora_rank")),
            Leaf("wo_b", "wo_b", "Output mixing projection", "o_proj", (Linear("attn.wo_b", (h,), (o_mid,)),), k),
            Leaf("attn_sink", "attn_sink", "Attention sinks", "attn_sink",
                 (Param("Per-head sink logit", "attn.attn_sink", (heads,), F32),), (BLOCK_KEYS,)),
        ]
        if kind == "csa":
            children.append(self.compressor("compressor", "attn.compressor.", hd, "csa_rate", overlap=True))
            children.append(self.indexer())
        elif kind == "hca":
            children.append(self.compressor("compressor", "attn.compressor.", hd, "hca_rate", overlap=False))
        title = {"swa": "Sliding-window attention", "csa": "Compressed sparse attention",
                 "hca": "Heavily compressed attention"}[kind]
        return Group("attention", title, tuple(children))

    def compressor(self, key: str, stem: str, dim: Factor, rate: str, overlap: bool) -> Group:
        """DeepseekV4{CSA,HCA}Compressor (and the indexer's): `wkv`, `wgate` (stored as they are, unquantized,
        transformers' _keep_in_fp32_modules), the positional bias `ape` [rate, width] and the RMSNorm [dim];
        the overlapping (CSA) compressor's width is 2 × dim."""
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        width = Factor(2 * dim.value, "2 × " + dim.label, dim.keys, f"(2 × {dim.value:,})") if overlap else dim
        r = Factor(self.cfg.dim(rate), "compress rate", ("compress_rates",))
        keys = (BLOCK_KEYS, "compress_rates")
        return Group(key, "KV compressor", (
            Leaf("wkv", "wkv", "Compressor key-value projection", "compressor_wkv",
                 (Param("Weight", f"{stem}wkv.weight", (width, h), c.dtype),), (*keys, "dtype")),
            Leaf("wgate", "wgate", "Compressor gate projection", "compressor_wgate",
                 (Param("Weight", f"{stem}wgate.weight", (width, h), c.dtype),), (*keys, "dtype")),
            Leaf("ape", "ape", "Compressor positional bias", "compressor_ape",
                 (Param("Bias", f"{stem}ape", (r, width), F32),), keys),
            Leaf("norm", "norm", "Compressor RMSNorm", "compressor_norm",
                 (Param(GAIN, f"{stem}norm.weight", (dim,), F32),), keys)))

    def indexer(self) -> Group:
        c = self.cfg
        h, ql = self.f("hidden_size", "hidden"), self.f("q_lora_rank", "q latent")
        ih, idim = self.d("index_n_heads", "indexer heads"), self.d("index_head_dim", "indexer head dim")
        keys = (BLOCK_KEYS, "index_n_heads", "index_head_dim")
        return Group("indexer", "Lightning indexer", (
            Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                 (Linear("attn.indexer.wq_b", (ih, idim), (ql,)),), (*keys, DTYPE_KEYS)),
            Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                 (Param("Weight", "attn.indexer.weights_proj.weight", (ih, h), c.dtype),), (*keys, "dtype")),
            self.compressor("compressor", "attn.indexer.compressor.", idim, "csa_rate", overlap=True)))

    def moe(self, hashed: bool) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None and c.num_experts_per_tok is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        router: list[Node] = [Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                                   (Param("Weight", "ffn.gate.weight", (e, h), c.dtype),), (BLOCK_KEYS, "dtype"))]
        if hashed:
            router.append(Buffer("ffn.gate.tid2eid", (c.vocab_size, c.num_experts_per_tok), "I64"))
        else:
            router.append(Leaf("bias", "bias", "Routing bias (expert score correction)", "e_score_correction_bias",
                               (Param("Bias", "ffn.gate.bias", (e,), F32),), (BLOCK_KEYS,)))
        inter = self.f("moe_intermediate_size", "moe intermediate")
        out: list[Node] = [Group("router", "Hash router" if hashed else "Router", tuple(router)),
                           self.mlp("experts", "Routed experts", "expert", "ffn.experts", inter,
                                    Factor(c.n_routed_experts, "experts", ("n_routed_experts",)))]
        if c.n_shared_experts:  # DeepseekV4MLP: one shared expert of moe_intermediate_size
            out.append(self.mlp("shared_experts", "Shared expert", "shared", "ffn.shared_experts", inter))
        return tuple(out)

    def mlp(self, key: str, title: str, role: str, module: str, inter: Factor, repeat: Factor | None = None) -> Group:
        h = self.f("hidden_size", "hidden")
        rows = (("w1", "Gate projection", (inter,), (h,)), ("w2", "Down projection", (h,), (inter,)),
                ("w3", "Up projection", (inter,), (h,)))
        return Group(key, title, tuple(
            Leaf(p, p, t, f"{role}_{p}", (Linear(f"{module}.{p}", out, inp),),
                 (BLOCK_KEYS, "moe_intermediate_size", DTYPE_KEYS)) for p, t, out, inp in rows),
            repeat=repeat, index_at="experts." if repeat is not None else "")
