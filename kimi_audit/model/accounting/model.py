"""The accounting tree's walk over the model, as modeling_deepseek.py builds it.

Embedding; dense and MoE blocks with their norms, latent attention (and DeepSeek-V3.2's sparse-attention
indexer), router, routed and shared experts; the multi-token-prediction layers (DeepSeek-V3's layer 61:
its own node, its embedding and output head noted as copies of the main ones); final norm; lm_head.
Every leaf is made by builder.Builder from config factors; Linear modules through the
quantization plan, RMSNorm gains in the config's norm dtype (F32 in DeepSeek-V3.2).
"""

from __future__ import annotations

from kimi_audit.format.names import ranges
from kimi_audit.model.accounting.builder import Builder, Mult
from kimi_audit.model.accounting.tree import Factor, Node, Part
from kimi_audit.model.layout import DENSE, MOE, MTP

BLOCK_LABEL = {DENSE: ("dense block", "dense blocks"), MOE: ("MoE block", "MoE blocks"),
               MTP: ("MTP layer", "MTP layers")}
MTP_EMBED_NOTE = ("A copy of model.embed_tokens.weight: the MTP module shares the main embedding at inference. "
                  "Left out of the total counted once.")
MTP_HEAD_NOTE = ("A copy of lm_head.weight: the MTP module shares the main output head at inference. "
                 "Left out of the total counted once.")


class ModelBuilder(Builder):
    """The whole tree: `model()` is its root."""

    @property
    def norm_dtype(self) -> str:
        return self.cfg.norm_dtype or self.cfg.dtype

    def dtype_keys(self) -> list[str]:
        return ["torch_dtype"] + (["quantization_config"] if self.cfg.quant is not None else [])

    def block_mult(self, block: str) -> Mult:
        n = len(self.layers_of.get(block, ()))
        one, many = BLOCK_LABEL[block]
        return ((n, one if n == 1 else many),)

    def block_keys(self, block: str) -> list[str]:
        if block == MTP:
            return ["num_nextn_predict_layers"]
        keys = ["num_hidden_layers"]
        if self.cfg.n_routed_experts is not None:
            keys += ["first_k_dense_replace", "moe_layer_freq", "n_routed_experts"]
        return keys

    def gain(self, key: str, name: str, title: str, role: str, block: str | None, component: str,
             width: Factor, mult: Mult, keys: list[str], note: str = "") -> Node:
        """An RMSNorm's learned gain."""
        return self.leaf(key, name, title, role, block, [Part("Learned gain", component, (width,), self.norm_dtype)],
                         mult, keys + ["rms_norm_eps"], note)

    def attention(self, pre: str, block: str, mult: Mult) -> Node:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        heads = self.f("num_attention_heads", "heads")
        bias = c.attention_bias
        bk = self.block_keys(block) + self.dtype_keys() + (["attention_bias"] if bias else [])
        nk = self.block_keys(block) + ["torch_dtype"]
        qhd = Factor(c.q_head_dim, "q head dim", ("qk_nope_head_dim", "qk_rope_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.qk_rope_head_dim:,})")
        a = f"{pre}.attention"
        if c.q_lora_rank is None:
            q = self.group(f"{a}.q_projection", "q_projection", "Query projection", [
                self.leaf(f"{a}.q_projection.q_proj", "q_proj", "Query projection", "q_proj", block,
                          self.linear_parts(block, "self_attn.q_proj", [heads, qhd], [h]), mult, bk)], mult)
        else:
            ql = self.f("q_lora_rank", "q latent")
            q = self.group(f"{a}.q_compression", "q_compression", "Query compression", [
                self.leaf(f"{a}.q_compression.q_a_proj", "q_a_proj", "Query down-projection", "q_a_proj", block,
                          self.linear_parts(block, "self_attn.q_a_proj", [ql], [h], bias), mult, bk),
                self.gain(f"{a}.q_compression.q_a_layernorm", "q_a_layernorm", "Query latent RMSNorm",
                          "q_a_layernorm", block, "self_attn.q_a_layernorm.weight", ql, mult, nk),
                self.leaf(f"{a}.q_compression.q_b_proj", "q_b_proj", "Query up-projection", "q_b_proj", block,
                          self.linear_parts(block, "self_attn.q_b_proj", [heads, qhd], [ql]), mult, bk),
            ], mult)
        kvl = self.f("kv_lora_rank", "kv latent")
        kv_out = Factor(c.kv_lora_rank + c.qk_rope_head_dim, "kv latent + rope key",
                        ("kv_lora_rank", "qk_rope_head_dim"), f"({c.kv_lora_rank:,} + {c.qk_rope_head_dim:,})")
        kvb = Factor(c.qk_nope_head_dim + c.v_head_dim, "nope key + value dim", ("qk_nope_head_dim", "v_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.v_head_dim:,})")
        kv = self.group(f"{a}.kv_compression", "kv_compression", "Key-value compression", [
            self.leaf(f"{a}.kv_compression.kv_a_proj_with_mqa", "kv_a_proj_with_mqa",
                      "Joint key-value down-projection", "kv_a_proj_with_mqa", block,
                      self.linear_parts(block, "self_attn.kv_a_proj_with_mqa", [kv_out], [h], bias), mult, bk),
            self.gain(f"{a}.kv_compression.kv_a_layernorm", "kv_a_layernorm", "Key-value latent RMSNorm",
                      "kv_a_layernorm", block, "self_attn.kv_a_layernorm.weight", kvl, mult, nk),
            self.leaf(f"{a}.kv_compression.kv_b_proj", "kv_b_proj", "Key-value up-projection", "kv_b_proj", block,
                      self.linear_parts(block, "self_attn.kv_b_proj", [heads, kvb], [kvl]), mult, bk),
        ], mult)
        vd = self.f("v_head_dim", "value dim")
        o = self.group(f"{a}.output_projection", "output_projection", "Output projection", [
            self.leaf(f"{a}.output_projection.o_proj", "o_proj", "Attention output projection", "o_proj", block,
                      self.linear_parts(block, "self_attn.o_proj", [h], [heads, vd], bias), mult, bk)], mult)
        return self.group(a, "attention", "Latent attention", [q, kv, o, self.indexer(a, block, mult)], mult)

    def indexer(self, a: str, block: str, mult: Mult) -> Node | None:
        """DeepSeek-V3.2's sparse-attention indexer (DSA): query and key projections, a LayerNorm on the keys
        (gain and bias, F32) and per-head weights."""
        c = self.cfg
        if not (c.index_n_heads and c.index_head_dim):
            return None
        h = self.f("hidden_size", "hidden")
        ih, idim = self.f("index_n_heads", "indexer heads"), self.f("index_head_dim", "indexer head dim")
        q_in = self.f("q_lora_rank", "q latent") if c.q_lora_rank else h
        keys = self.block_keys(block) + ["index_n_heads", "index_head_dim"]
        x = f"{a}.indexer"
        return self.group(x, "indexer", "Sparse-attention indexer", [
            self.leaf(f"{x}.wq_b", "wq_b", "Indexer query projection", "indexer_wq_b", block,
                      self.linear_parts(block, "self_attn.indexer.wq_b", [ih, idim], [q_in]), mult,
                      keys + self.dtype_keys()),
            self.leaf(f"{x}.wk", "wk", "Indexer key projection", "indexer_wk", block,
                      self.linear_parts(block, "self_attn.indexer.wk", [idim], [h]), mult, keys + self.dtype_keys()),
            self.leaf(f"{x}.k_norm", "k_norm", "Indexer key LayerNorm", "indexer_k_norm", block,
                      [Part("Learned gain", "self_attn.indexer.k_norm.weight", (idim,), "F32"),
                       Part("Bias", "self_attn.indexer.k_norm.bias", (idim,), "F32")], mult, keys),
            self.leaf(f"{x}.weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj", block,
                      [Part("Weight", "self_attn.indexer.weights_proj.weight", (ih, h), c.dtype)], mult,
                      keys + ["torch_dtype"]),
        ], mult)

    def norms(self, pre: str, block: str, mult: Mult) -> Node:
        h = self.f("hidden_size", "hidden")
        keys = self.block_keys(block) + ["torch_dtype"]
        return self.group(f"{pre}.norms", "norms", "Block norms", [
            self.gain(f"{pre}.norms.input_layernorm", "input_layernorm", "Pre-attention RMSNorm",
                      "input_layernorm", block, "input_layernorm.weight", h, mult, keys),
            self.gain(f"{pre}.norms.post_attention_layernorm", "post_attention_layernorm", "Pre-MLP RMSNorm",
                      "post_attention_layernorm", block, "post_attention_layernorm.weight", h, mult, keys),
        ], mult)

    def mlp(self, key: str, name: str, title: str, role: str, module: str, block: str, inter: Factor,
            mult: Mult, keys: list[str]) -> Node:
        h = self.f("hidden_size", "hidden")
        keys = keys + self.dtype_keys()
        return self.group(key, name, title, [
            self.leaf(f"{key}.{p}", p, t, f"{role}_{p}", block,
                      self.linear_parts(block, f"{module}.{p}", [h] if p == "down_proj" else [inter],
                                        [inter] if p == "down_proj" else [h]), mult, keys)
            for p, t in (("gate_proj", "Gate projection"), ("up_proj", "Up projection"),
                         ("down_proj", "Down projection"))
        ], mult)

    def mtp_head(self, pre: str, mult: Mult) -> Node:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        two_h = Factor(2 * c.hidden_size, "2 × hidden", ("hidden_size",), f"(2 × {c.hidden_size:,})")
        k = self.block_keys(MTP) + ["torch_dtype"]
        lk = k + (["quantization_config"] if c.quant is not None else [])
        g = f"{pre}.mtp_head"
        return self.group(g, "mtp_head", "MTP embedding, projection and head", [
            self.leaf(f"{g}.embed_tokens", "embed_tokens", "MTP token embedding", "embed_tokens", MTP,
                      [Part("Embedding table", "embed_tokens.weight", (v, h), c.dtype)], mult, k, MTP_EMBED_NOTE),
            self.gain(f"{g}.enorm", "enorm", "MTP embedding RMSNorm", "enorm", MTP, "enorm.weight", h, mult, k),
            self.gain(f"{g}.hnorm", "hnorm", "MTP hidden-state RMSNorm", "hnorm", MTP, "hnorm.weight", h, mult, k),
            self.leaf(f"{g}.eh_proj", "eh_proj", "MTP combining projection", "eh_proj", MTP,
                      self.linear_parts(MTP, "eh_proj", [h], [two_h]), mult, lk),
            self.gain(f"{g}.shared_head_norm", "shared_head.norm", "MTP head RMSNorm", "shared_head_norm", MTP,
                      "shared_head.norm.weight", h, mult, k),
            self.leaf(f"{g}.shared_head_head", "shared_head.head", "MTP output head", "shared_head_head", MTP,
                      self.linear_parts(MTP, "shared_head.head", [v], [h]), mult, lk, MTP_HEAD_NOTE),
        ], mult)

    def block(self, block: str) -> Node | None:
        layers = self.layers_of.get(block)
        if not layers:
            return None
        c = self.cfg
        mult = self.block_mult(block)
        pre = "mtp" if block == MTP else f"blocks.{block}"
        bk = self.block_keys(block)
        children: list[Node | None] = [self.mtp_head(pre, mult)] if block == MTP else []
        children.append(self.norms(pre, block, mult))
        children.append(self.attention(pre, block, mult))
        if block == DENSE:
            children.append(self.mlp(f"{pre}.mlp", "mlp", "MLP (dense)", "mlp", "mlp", block,
                                     self.f("intermediate_size", "intermediate"), mult, bk + ["intermediate_size"]))
        else:
            e = self.f("n_routed_experts", "experts")
            h = self.f("hidden_size", "hidden")
            router = [self.leaf(f"{pre}.router.gate", "gate", "Router gate (expert affinities)", "router_gate",
                                block, [Part("Weight", "mlp.gate.weight", (e, h), c.dtype)], mult,
                                bk + ["torch_dtype", "num_experts_per_tok"])]
            if c.topk_method == "noaux_tc":
                router.append(self.leaf(f"{pre}.router.e_score_correction_bias", "e_score_correction_bias",
                                        "Expert score correction bias", "e_score_correction_bias", block,
                                        [Part("Bias", "mlp.gate.e_score_correction_bias", (e,), "F32")], mult,
                                        bk + ["topk_method"]))
            children.append(self.group(f"{pre}.router", "router", "Router", list(router), mult))
            assert c.n_routed_experts is not None
            emult = ((c.n_routed_experts, "experts"),) + mult
            inter = self.f("moe_intermediate_size", "moe intermediate")
            children.append(self.mlp(f"{pre}.experts", "experts", "Routed experts", "expert", "mlp.experts", block,
                                     inter, emult, bk + ["moe_intermediate_size", "num_experts_per_tok"]))
            if c.n_shared_experts:
                sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                            ("moe_intermediate_size", "n_shared_experts"),
                            f"({c.moe_intermediate_size:,} × {c.n_shared_experts:,})" if c.n_shared_experts > 1
                            else None)
                children.append(self.mlp(f"{pre}.shared_experts", "shared_experts", "Shared experts", "shared",
                                         "mlp.shared_experts", block, sh, mult,
                                         bk + ["moe_intermediate_size", "n_shared_experts"]))
        if block == MTP:
            r = ranges(layers)
            title = f"Multi-token prediction (layer{'s' if len(layers) > 1 else ''} {r})"
            note = "Not in next-token inference: excluded from the activated parameters."
            return self.group(pre, "mtp", title, children, mult, role="mtp_blocks", note=note)
        return self.group(pre, block, f"{mult[0][0]} {mult[0][1]}", children, mult, role=f"{block}_blocks")

    def model(self) -> Node:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        children: list[Node | None] = [
            self.leaf("embedding", "embed_tokens", "Token embedding", "embedding", None,
                      [Part("Embedding table", "model.embed_tokens.weight", (v, h), c.dtype)], (), ["torch_dtype"])]
        children.append(self.group("blocks", "blocks", f"{c.num_hidden_layers} transformer blocks",
                                   [self.block(DENSE), self.block(MOE)]))
        children.append(self.block(MTP))
        children.append(self.gain("norm", "norm", "Final RMSNorm", "final_norm", None, "model.norm.weight", h, (),
                                  ["torch_dtype"]))
        if not c.tie_word_embeddings:
            children.append(self.leaf("lm_head", "lm_head", "Output head (lm_head)", "lm_head", None,
                                      self.linear_parts(None, "lm_head", [v], [h]), (),
                                      ["torch_dtype", "tie_word_embeddings"]
                                      + (["quantization_config"] if c.quant is not None else [])))
        children.append(self.unaccounted())
        return self.group("model", "model", f"{c.model_type} model", children, role="model")
