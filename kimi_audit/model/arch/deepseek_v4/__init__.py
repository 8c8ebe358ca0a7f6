"""DeepSeek-V4 (`deepseek_v4`: V4-Flash, V4-Pro, their Base models, V4-Flash-0731) as data (V4.1: deepseek_v41).

Mirrors transformers 5.25's modeling_deepseek_v4.py, named as DeepSeek's release names its tensors (the
checkpoint conversion mapping of transformers 5.25, `deepseek_v4`, and vLLM's loader, which reads the release as
it is: vllm-project/vllm@f1b76c19 `model_executor/models/deepseek_v4.py` and `deepseek_v4_mtp.py`): no `model.`
prefix, `embed.weight`, `layers.N.attn.*` (`wq_a`, `q_norm`, `wq_b`, `wkv`, `kv_norm`, `wo_a`, `wo_b`, `attn_sink`),
`layers.N.attn_norm`, `layers.N.ffn_norm`, `layers.N.ffn.*` (`gate.weight`, `gate.bias`: the routing bias,
`gate.tid2eid` on hash-routed layers, `experts.E.{w1,w2,w3}`, `shared_experts.{w1,w2,w3}`), the
hyper-connections `layers.N.hc_{attn,ffn}_{fn,base,scale}`, then `norm.weight`, `hc_head_{fn,base,scale}` and
`head.weight`.

Per layer, the attention is sliding-window only (SWA), or adds a compressor (HCA: `attn.compressor.{wkv,
wgate,ape,norm}`) or a compressor and a lightning indexer with its own compressor (CSA: `attn.indexer.{wq_b,
weights_proj}`, `attn.indexer.compressor.*`); the first `num_hash_layers` MoE layers route by a token-id table
(`ffn.gate.tid2eid`, I64 [vocab, top-k], a buffer) instead of the routing bias.

The multi-token-prediction stages are `mtp.K.*` (vLLM's DeepSeekV4MultiTokenPredictorLayer): `e_proj` and
`h_proj` (FP8 Linear [hidden, hidden]), `enorm`, `hnorm`, `norm` (the shared head's), `hc_head_{fn,base,scale}`,
and a whole decoder layer (sliding-window attention, bias-routed MoE with its own routed experts) under the same
`mtp.K.` prefix; DeepSeek-V4-Flash's one stage is 1,575 tensors. With `dspark_target_layer_ids` (V4-Flash-0731)
the stages are DSpark's (`dspark`); its config declares one where the release stores three: the files decide.

Dialect `transformers`: transformers 5.x's save_pretrained writes the leaf names under `model.layers.N.`
(`kv_norm` as `norm`), `model.embed_tokens`, `model.norm`, `model.hc_head.hc_*` (`head.weight` unchanged), and
no MTP stage (MTP_ABSENT). Quantization naming (FP8 `.scale`, FP4 experts) is model.quant's, not this tree's.
llama.cpp's GGUF (`deepseek4`) writes the tree its converter makes: the dialect in model.arch.deepseek_v4.gguf.
"""

from __future__ import annotations

from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch.deepseek_v4.gguf import GGUF_DIALECT, gguf_tree
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    MTP,
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
from kimi_audit.model.config_fields import I64_MAX, ModelConfig, read_eps, read_int, read_layer_types, scheduled
from kimi_audit.model.kinds import EXPERT_IDS, ROUTER_BIAS
from kimi_audit.model.quant.deepseek import V4_SCALE_SUFFIX
from kimi_audit.model.quant.gguf import GGUF_TREE
from kimi_audit.model.quant.scheme import ReleaseQuant
from kimi_audit.numerics.grid import DEEPSEEK_FP8_BLOCK

MODEL_TYPES = ("deepseek_v4",)
TRANSFORMERS = Dialect(
    "transformers 5.x save_pretrained",
    (("layers.", "model.layers."), ("embed.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight"),
     ("hc_head_", "model.hc_head.hc_")),
    "transformers 5.25's DeepseekV4 modules: `model.` before the layers, `model.embed_tokens`, `model.norm`, "
    "`model.hc_head.*`")


GAIN = "Learned gain"
F32 = "F32"
NORM = "BF16"  # every gain as released: V4-Flash's published total_size needs it (tests/data/published_totals.json)
KV_NORM = "attn.kv_norm."
"""The attention's key-value RMSNorm as the release names it (vLLM's DeepseekV4MLAModules.kv_norm, read under
`layers.N.attn.` with no renaming; transformers 5.25's save writes `attn.norm`)."""

# Block kinds: the MLP kind, then the attention kind (model_summary counts `moe*` as MoE layers).
SWA, CSA, HCA = "swa", "csa", "hca"
V4_ATTENTION = {"sliding_attention": SWA, "compressed_sparse_attention": CSA, "heavily_compressed_attention": HCA}
V4_RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
"""DeepSeek's legacy `compress_ratios` (one int per layer) as layer types (_COMPRESS_RATIO_TO_LAYER_TYPE)."""
V4_MLP = {"moe": "moe", "hash_moe": "moe_hash"}

V4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "head_dim": 512, "q_lora_rank": 1024, "num_experts_per_tok": 6,
    "n_routed_experts": 256, "n_shared_experts": 1, "hc_mult": 4, "o_groups": 8, "o_lora_rank": 1024,
    "index_n_heads": 64, "index_head_dim": 128, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6, "num_hash_layers": 3,
}
"""transformers 5.25 DeepseekV4Config's defaults (the V4-Flash dimensions; `default_num_hash_layers` 3)."""
V4_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
HASH_TABLES = (("ffn.gate.tid2eid", EXPERT_IDS), ("ffn_gate_tid2eid.weight", EXPERT_IDS))
"""The hash-routing table, as the release and (its GGUF dialect's name) llama.cpp's converter name it: expert ids."""

def read(cfg: dict[str, Any]) -> ModelConfig:
    """DeepSeek-V4: every layer MoE (the first `num_hash_layers` hash-routed), attention sliding-window (SWA),
    compressed sparse (CSA, with the lightning indexer) or heavily compressed (HCA), as DeepseekV4Config reads
    `layer_types` / legacy `compress_ratios` and `mlp_layer_types` / legacy `num_hash_layers`."""
    d = V4_DEFAULTS

    def g(key: str) -> Any:
        return read_int(cfg, key, d)

    n = g("num_hidden_layers")
    attention = read_layer_types(cfg, "layer_types", set(V4_ATTENTION), n)
    if attention is None and cfg.get("compress_ratios") is not None:
        ratios = cfg["compress_ratios"]
        if not isinstance(ratios, list) or len(ratios) < n or any(type(r) is not int or r not in V4_RATIO
                                                                  for r in ratios[:n]):
            raise ConfigError(f"config.json 'compress_ratios' must give one of {sorted(V4_RATIO)} per layer")
        attention = [V4_RATIO[r] for r in ratios[:n]]
    if attention is None:  # transformers' default: 2 HCA layers, then CSA and HCA interleaved
        attention = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    mlp = read_layer_types(cfg, "mlp_layer_types", set(V4_MLP), n)
    if mlp is None:
        hashed = g("num_hash_layers")
        mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    rates = dict(V4_RATES)
    if isinstance(cfg.get("compress_rates"), dict):
        rates.update(cfg["compress_rates"])
    for legacy, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                         ("compress_rate_hca", "heavily_compressed_attention")):
        if cfg.get(legacy) is not None:
            rates[kind] = cfg[legacy]
    for kind, r in rates.items():
        if type(r) is not int or not 1 <= r <= I64_MAX:
            raise ConfigError(f"config.json compress rate of {kind} must be a positive integer, got {r!r}")
    head_dim = g("head_dim")
    fields = {
        "hidden_size": g("hidden_size"), "intermediate_size": g("moe_intermediate_size"),
        "moe_intermediate_size": g("moe_intermediate_size"), "q_lora_rank": g("q_lora_rank"),
        "num_attention_heads": g("num_attention_heads"), "qk_nope_head_dim": head_dim, "v_head_dim": head_dim,
        "num_hidden_layers": n, "n_routed_experts": g("n_routed_experts"), "n_shared_experts": g("n_shared_experts"),
        "num_experts_per_tok": g("num_experts_per_tok"), "vocab_size": g("vocab_size"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)), "rms_norm_eps": read_eps(cfg, 1e-6),
        "layers_at": "layers.",  # the release's names: `layers.N.`, `embed`, `norm`, `hc_head_*` (no `model.`)
        "mtp_at": "mtp.", "num_nextn_predict_layers": g("num_nextn_predict_layers"),
    }
    dims = {k: g(k) for k in ("head_dim", "hc_mult", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim",
                              "num_nextn_predict_layers")}
    dims["csa_rate"] = rates["compressed_sparse_attention"]
    dims["hca_rate"] = rates["heavily_compressed_attention"]
    if dims["o_groups"] < 1 or (fields["num_attention_heads"] * head_dim) % dims["o_groups"]:
        raise ConfigError("config.json o_groups must divide num_attention_heads × head_dim")
    kinds = tuple(f"{V4_MLP[m]}_{V4_ATTENTION[a]}" for m, a in zip(mlp, attention))
    dims.update(dspark(cfg, n))
    kinds += mtp_kinds(fields["num_nextn_predict_layers"], bool(dims["dspark_targets"]))
    return scheduled(cfg, fields, dims, kinds, ARCHITECTURE.quant)


DSPARK_FIRST, DSPARK_MID, DSPARK_LAST, DSPARK_ONLY = (f"mtp_dspark{s}" for s in ("_first", "", "_last", "_only"))


def mtp_kinds(n: int, dspark_stages: bool) -> tuple[str, ...]:
    """The block kind of each MTP stage: MTP, or DSpark's (the first and the last hold parts the others do not)."""
    if not dspark_stages or n < 2:
        return (DSPARK_ONLY if dspark_stages else MTP,) * n
    return (DSPARK_FIRST, *(DSPARK_MID,) * (n - 2), DSPARK_LAST)


def dspark(cfg: dict[str, Any], n: int) -> dict[str, int]:
    """DSpark's dims: the target layers `main_proj` reads (0: no DSpark) and the Markov head's rank."""
    if (ids := cfg.get("dspark_target_layer_ids")) is None:
        return {"dspark_targets": 0, "dspark_rank": 0}
    if not isinstance(ids, list) or not ids or any(type(i) is not int or not 0 <= i < n for i in ids):
        raise ConfigError(f"config.json dspark_target_layer_ids must list layers 0..{n - 1}, got {ids!r}")
    rank = cfg.get("dspark_markov_rank")
    if type(rank) is not int or not 1 <= rank <= I64_MAX:
        raise ConfigError(f"config.json dspark_markov_rank must be a positive integer, got {rank!r}")
    return {"dspark_targets": len(ids), "dspark_rank": rank}


def describe(cfg: ModelConfig) -> ModelTree:
    tree = _Describe(cfg).tree()
    return gguf_tree(tree) if cfg.quant is not None and cfg.quant.tree == GGUF_TREE else tree


def hyper_connection(c: ModelConfig, key: str, name: str, title: str, stem: str, head: bool = False,
                     fn_dtype: str = F32) -> Leaf:
    """A manifold-constrained hyper-connection (DeepseekV4HyperConnection, or DeepseekV4HyperHead for the output;
    GLM-5.3-Flash's too, its `fn` in the model's dtype): `fn` [(2 + n) × n, n × hidden] (the head's [n, n ×
    hidden]), `base`, `scale` [3] ([1]), F32."""
    n, hd = c.dim("hc_mult"), c.hidden_size
    rows = Factor(n if head else (2 + n) * n, "mixing weights", ("hc_mult",), None if head else f"((2 + {n}) × {n})")
    width = Factor(n * hd, "streams × hidden", ("hc_mult", "hidden_size"), f"({n} × {hd:,})")
    scales = Factor(1 if head else 3, "scales", ())
    return Leaf(key, name, title, "hyper_connection", (
        Param("Mixing projection", f"{stem}fn", (rows, width), fn_dtype),
        Param("Mixing bias", f"{stem}base", (rows,), F32),
        Param("Scales", f"{stem}scale", (scales,), F32)), ("hc_mult", *(() if head else (BLOCK_KEYS,))))


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    """transformers' spelling: TRANSFORMERS, after each layer's `attn.kv_norm` written `attn.norm`."""
    kv_norms = tuple((f"{cfg.layer_name(i)}{KV_NORM}", f"model.{cfg.layer_name(i)}attn.norm.")
                     for i in range(cfg.num_hidden_layers))
    return (Dialect(TRANSFORMERS.name, kv_norms + TRANSFORMERS.renames, TRANSFORMERS.note),)


class _Describe:
    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def f(self, key: str, label: str) -> Factor:
        return Factor(getattr(self.cfg, key), label, (key,))

    def d(self, key: str, label: str) -> Factor:
        return Factor(self.cfg.dim(key), label, (key,))

    def tree(self) -> ModelTree:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        embed = "embed.weight"
        before: tuple[Node, ...] = (Leaf("embedding", "embed", "Token embedding", "embedding",
                                         (Param("Embedding table", embed, (v, h), c.dtype),), ("dtype",)),)
        norm = "norm.weight"
        after: list[Node] = [
            Leaf("norm", "norm", "Final RMSNorm", "final_norm", (Param(GAIN, norm, (h,), NORM),), ("rms_norm_eps",)),
            self.hyper("hc_head", "hc_head", "Output hyper-connection", "hc_head_", head=True),
        ]
        if not c.tie_word_embeddings:
            after.append(Leaf("lm_head", "head", "Output head", "lm_head", (Linear("head", (v,), (h,)),),
                              ("dtype", "tie_word_embeddings")))
        blocks = {kind: self.mtp() if kind == MTP else self.dspark(kind) if kind.startswith(MTP) else self.layer(kind)
                  for kind in dict.fromkeys(c.layer_kinds)}
        return ModelTree(before, blocks, tuple(after))

    def mtp(self) -> tuple[Node, ...]:
        """One multi-token-prediction stage (`mtp.K.`): the embedding's and the hidden state's norms and
        projections, the shared head's norm and hyper-connection, then a sliding-window MoE layer."""
        h = self.f("hidden_size", "hidden")
        k = (BLOCK_KEYS, DTYPE_KEYS)
        return (
            Leaf("e_proj", "e_proj", "Embedding projection", "mtp_e_proj", (Linear("e_proj", (h,), (h,)),), k),
            Leaf("h_proj", "h_proj", "Hidden-state projection", "mtp_h_proj", (Linear("h_proj", (h,), (h,)),), k),
            Leaf("enorm", "enorm", "Embedding RMSNorm", "mtp_enorm", (Param(GAIN, "enorm.weight", (h,), NORM),),
                 (BLOCK_KEYS, "rms_norm_eps")),
            Leaf("hnorm", "hnorm", "Hidden-state RMSNorm", "mtp_hnorm", (Param(GAIN, "hnorm.weight", (h,), NORM),),
                 (BLOCK_KEYS, "rms_norm_eps")),
            Leaf("norm", "norm", "Shared head RMSNorm", "mtp_shared_head_norm",
                 (Param(GAIN, "norm.weight", (h,), NORM),), (BLOCK_KEYS, "rms_norm_eps")),
            self.hyper("hc_head", "hc_head", "Output hyper-connection", "hc_head_", head=True),
            *self.layer(f"moe_{SWA}"),
        )

    def dspark(self, kind: str) -> tuple[Node, ...]:
        """A DSpark stage (`mtp.K.`): a sliding-window MoE layer; the first stage adds `main_proj` (FP8 [hidden,
        targets × hidden]) and `main_norm`, the last `norm`, `hc_head_*`, `markov_head.markov_w{1,2}` [vocab,
        rank] and `confidence_head.proj` [1, hidden + rank]; no `e_proj`/`h_proj`/`enorm`/`hnorm`. As DSpark's
        loaders and converters read mtp.0..2 (0731's 72,317 tensors: V4-Flash's 67,612 outside `mtp.` and
        three such stages, 4,705)."""
        c, h = self.cfg, self.f("hidden_size", "hidden")
        targets, rank = c.dim("dspark_targets"), c.dim("dspark_rank")
        first: tuple[Node, ...] = ()
        if kind in (DSPARK_FIRST, DSPARK_ONLY):
            wide = Factor(targets * c.hidden_size, "targets × hidden", ("dspark_target_layer_ids", "hidden_size"),
                          f"({targets} × {c.hidden_size:,})")
            first = (Leaf("main_proj", "main_proj", "Target hidden-state projection", "dspark_main_proj",
                          (Linear("main_proj", (h,), (wide,)),), (BLOCK_KEYS, "dspark_target_layer_ids", DTYPE_KEYS)),
                     Leaf("main_norm", "main_norm", "Target hidden-state RMSNorm", "dspark_main_norm",
                          (Param(GAIN, "main_norm.weight", (h,), NORM),), (BLOCK_KEYS, "rms_norm_eps")))
        last: tuple[Node, ...] = ()
        if kind in (DSPARK_LAST, DSPARK_ONLY):
            v, r = self.f("vocab_size", "vocab"), Factor(rank, "Markov rank", ("dspark_markov_rank",))
            both = Factor(c.hidden_size + rank, "hidden + Markov rank", ("hidden_size", "dspark_markov_rank"),
                          f"({c.hidden_size:,} + {rank:,})")
            keys = (BLOCK_KEYS, "dspark_markov_rank", "dtype")
            last = (Leaf("norm", "norm", "Shared head RMSNorm", "mtp_shared_head_norm",
                         (Param(GAIN, "norm.weight", (h,), NORM),), (BLOCK_KEYS, "rms_norm_eps")),
                    self.hyper("hc_head", "hc_head", "Output hyper-connection", "hc_head_", head=True),
                    Group("markov_head", "Markov head", (
                        Leaf("markov_w1", "markov_w1", "Previous-token embedding", "dspark_markov",
                             (Param("Table", "markov_head.markov_w1.weight", (v, r), c.dtype),), keys),
                        Leaf("markov_w2", "markov_w2", "Logit-bias projection", "dspark_markov",
                             (Param("Weight", "markov_head.markov_w2.weight", (v, r), c.dtype),), keys))),
                    Leaf("confidence_head", "confidence_head.proj", "Confidence head", "dspark_confidence",
                         (Param("Weight", "confidence_head.proj.weight", (Factor(1, "score", ()), both), c.dtype),),
                         keys))
        return (*first, *self.layer(f"moe_{SWA}"), *last)

    def layer(self, kind: str) -> tuple[Node, ...]:
        h = self.f("hidden_size", "hidden")
        attention = kind.rsplit("_", 1)[1]
        return (
            Leaf("attn_norm", "attn_norm", "Pre-attention RMSNorm", "input_layernorm",
                 (Param(GAIN, "attn_norm.weight", (h,), NORM),), (BLOCK_KEYS, "rms_norm_eps")),
            self.hyper("hc_attn", "hc_attn", "Attention hyper-connection", "hc_attn_"),
            self.attention(attention),
            Leaf("ffn_norm", "ffn_norm", "Pre-MoE RMSNorm", "post_attention_layernorm",
                 (Param(GAIN, "ffn_norm.weight", (h,), NORM),), (BLOCK_KEYS, "rms_norm_eps")),
            self.hyper("hc_ffn", "hc_ffn", "MoE hyper-connection", "hc_ffn_"),
            *self.moe(hashed=kind.startswith("moe_hash")),
        )

    def hyper(self, key: str, name: str, title: str, stem: str, head: bool = False) -> Leaf:
        return hyper_connection(self.cfg, key, name, title, stem, head)

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
                 (Param(GAIN, "attn.q_norm.weight", (ql,), NORM),), (BLOCK_KEYS,)),
            Leaf("wq_b", "wq_b", "Query up-projection", "q_b_proj", (Linear("attn.wq_b", (heads, hd), (ql,)),), k),
            Leaf("wkv", "wkv", "Key-value projection (one shared head)", "kv_proj",
                 (Linear("attn.wkv", (hd,), (h,)),), k),
            Leaf("kv_norm", "kv_norm", "Key-value RMSNorm", "kv_a_layernorm",
                 (Param(GAIN, KV_NORM + "weight", (hd,), NORM),), (BLOCK_KEYS,)),
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
        """DeepseekV4{CSA,HCA}Compressor (and the indexer's): the Linear modules `wkv`, `wgate` (left unquantized
        by the release's FP8, transformers' _keep_in_fp32_modules: ReleaseQuant.plain_suffixes; a
        compressed-tensors config's targets decide for its checkpoints),
        the positional bias `ape` [rate, width] and the RMSNorm [dim];
        the overlapping (CSA) compressor's width is 2 × dim."""
        h = self.f("hidden_size", "hidden")
        width = Factor(2 * dim.value, "2 × " + dim.label, dim.keys, f"(2 × {dim.value:,})") if overlap else dim
        r = Factor(self.cfg.dim(rate), "compress rate", ("compress_rates",))
        keys = (BLOCK_KEYS, "compress_rates")
        return Group(key, "KV compressor", (
            Leaf("wkv", "wkv", "Compressor key-value projection", "compressor_wkv",
                 (Linear(f"{stem}wkv", (width,), (h,)),), (*keys, DTYPE_KEYS)),
            Leaf("wgate", "wgate", "Compressor gate projection", "compressor_wgate",
                 (Linear(f"{stem}wgate", (width,), (h,)),), (*keys, DTYPE_KEYS)),
            Leaf("ape", "ape", "Compressor positional bias", "compressor_ape",
                 (Param("Bias", f"{stem}ape", (r, width), F32),), keys),
            Leaf("norm", "norm", "Compressor RMSNorm", "compressor_norm",
                 (Param(GAIN, f"{stem}norm.weight", (dim,), NORM),), keys)))

    def indexer(self) -> Group:
        h, ql = self.f("hidden_size", "hidden"), self.f("q_lora_rank", "q latent")
        ih, idim = self.d("index_n_heads", "indexer heads"), self.d("index_head_dim", "indexer head dim")
        keys = (BLOCK_KEYS, "index_n_heads", "index_head_dim")
        return Group("indexer", "Lightning indexer", (
            Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                 (Linear("attn.indexer.wq_b", (ih, idim), (ql,)),), (*keys, DTYPE_KEYS)),
            Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                 (Linear("attn.indexer.weights_proj", (ih,), (h,)),), (*keys, DTYPE_KEYS)),
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
        return w123_mlp(key, title, role, module, self.f("hidden_size", "hidden"), inter,
                        (BLOCK_KEYS, "moe_intermediate_size", DTYPE_KEYS), repeat)

ARCHITECTURE = register(Architecture(
    name="DeepSeek-V4", model_types=MODEL_TYPES, read=read, describe=describe, dialects=dialects,
    class_names=("DeepseekV4ForCausalLM",), writer_trees=(GGUF_TREE,), gguf=GGUF_DIALECT,
    quant=ReleaseQuant(scale_suffix=V4_SCALE_SUFFIX, e8m0_scales=True, blocks=(DEEPSEEK_FP8_BLOCK, (32, 32)),
                       fp4_experts=True, plain=("head",),
                       plain_suffixes=(".compressor.wkv", ".compressor.wgate", ".indexer.weights_proj"),
                       aliases=(("lm_head", "head"),)),
    float32_routers=("ffn.gate.bias",), buffered=("ffn.gate.bias",),
    value_roles=(("ffn.gate.bias", ROUTER_BIAS), *HASH_TABLES),
    stages_from_files=lambda cfg: bool(cfg.dim("dspark_targets")),  # 0731 declares 1 stage, stores 3
    block_titles={**{f"{m}_{a}": f"{'hash-routed MoE' if m == 'moe_hash' else 'MoE'} {a.upper()}"
                     for m in V4_MLP.values() for a in V4_ATTENTION.values()},
                  DSPARK_FIRST: "first DSpark stage", DSPARK_MID: "DSpark stage", DSPARK_LAST: "last DSpark stage",
                  DSPARK_ONLY: "DSpark stage"}))
