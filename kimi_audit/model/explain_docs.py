"""The explain cards' catalogue: what each role of the accounting tree computes, from the model code.

`DOCS` maps a node's role (model.accounting.tree.Node.role) to its `Doc`: the code expression, a sentence, the
math, input and output shapes with named axes (from the config), where the code is, and a note. How a
Linear module is stored (its quantization scheme) is not here: the card takes it from the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kimi_audit.model.config_fields import ModelConfig

RMSNORM_MATH = (
    "m₂(x) = (1/d) Σⱼ xⱼ²",
    "y = γ ⊙ x / √(m₂(x) + ε)",
)
RMSNORM_NOTE = ("Normalized in float32, cast back to the input type, then multiplied by the gain "
                "(DeepseekV3RMSNorm, modeling_deepseek.py 94–111).")
LINEAR_NOTE = ("nn.Linear without bias: y = x Wᵀ; its out × in parameters count however the weight is stored "
               "(see \"Stored as\"); quantization metadata (scales, weight_shape) is excluded from the counts.")
INDEXER_REF = "Indexer (DeepSeek-V3.2-Exp inference/model.py)"
MLA_REF = "DeepseekV3Attention.__init__, modeling_deepseek.py 662–688"
QUERY_REF = "DeepseekV3Attention.forward, modeling_deepseek.py 767–774"
VISION_REF = "transformers 5.25 models/kimi_k25/modeling_kimi_k25.py"
PIXTRAL_REF = "transformers 5.25 models/pixtral/modeling_pixtral.py"
MISTRAL3_REF = "transformers 5.25 models/mistral3/modeling_mistral3.py"


@dataclass(frozen=True)
class Doc:
    computes: str
    description: str
    math: tuple[str, ...]
    shapes: Callable[[ModelConfig], tuple[list[tuple[str, str]], list[tuple[str, str]]]]
    """cfg -> (inputs, outputs): each (symbol, "[axis, axis, ...]")."""
    code: str
    note: str = ""


def _vw(c: ModelConfig) -> str:
    return f"{c.vision.hidden_size} vision width" if c.vision is not None else "vision width"


def _pw(c: ModelConfig) -> str:
    width = dict(c.dims).get("vision_hidden_size")
    return f"{width} vision width" if width is not None else "vision width"


def _bt(*axes: str) -> str:
    return "[" + ", ".join(("B batch", "T positions") + axes) + "]"


def _h(c: ModelConfig) -> str:
    return f"{c.hidden_size} hidden"


Shapes = Callable[[ModelConfig], tuple[list[tuple[str, str]], list[tuple[str, str]]]]


def _norm(symbol_in: str, symbol_out: str, width: Callable[[ModelConfig], str]) -> Shapes:
    return lambda c: ([(symbol_in, _bt(width(c)))], [(symbol_out, _bt(width(c)))])


def _lin(sym_in: str, w_in: Callable[[ModelConfig], str], sym_out: str, w_out: Callable[[ModelConfig], str],
         lead: tuple[str, ...] | None = None) -> Shapes:
    def shapes(c: ModelConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        if lead is None:
            return [(sym_in, _bt(w_in(c)))], [(sym_out, _bt(w_out(c)))]
        return ([(sym_in, "[" + ", ".join(lead + (w_in(c),)) + "]")],
                [(sym_out, "[" + ", ".join(lead + (w_out(c),)) + "]")])
    return shapes


def _heads(c: ModelConfig, per: str, width: int) -> str:
    return f"{c.num_attention_heads * width} = {c.num_attention_heads} heads × {width} {per}"


def _mlp_docs(prefix: str, where: str, inter: Callable[[ModelConfig], int], lead: tuple[str, ...] | None,
              code: str) -> dict[str, Doc]:
    i_label = lambda c: f"{inter(c)} intermediate"  # noqa: E731
    return {
        f"{prefix}_gate_proj": Doc(
            "self.gate_proj(x)", f"{where}: the gate of the SwiGLU, passed through SiLU.",
            ("g = x W_gateᵀ", "h = SiLU(g) ⊙ (x W_upᵀ)"), _lin("x", _h, "g", i_label, lead), code, LINEAR_NOTE),
        f"{prefix}_up_proj": Doc(
            "self.up_proj(x)", f"{where}: the value branch of the SwiGLU.",
            ("u = x W_upᵀ", "h = SiLU(x W_gateᵀ) ⊙ u"), _lin("x", _h, "u", i_label, lead), code, LINEAR_NOTE),
        f"{prefix}_down_proj": Doc(
            "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
            f"{where}: projects the gated hidden features back to the model width.",
            ("y = (SiLU(x W_gateᵀ) ⊙ x W_upᵀ) W_downᵀ",), _lin("h", i_label, "y", _h, lead), code, LINEAR_NOTE),
    }


DOCS: dict[str, Doc] = {
    "embedding": Doc(
        "self.embed_tokens(input_ids)", "Look up one learned vector per token id.", ("x = E[token id]",),
        lambda c: ([("ids", "[B batch, T positions]")], [("x", _bt(_h(c)))]),
        "DeepseekV3Model.embed_tokens (nn.Embedding)", "Only one row is read per token."),
    "final_norm": Doc(
        "self.norm(hidden_states)", "RMSNorm of the last block's output, before the output head.",
        RMSNORM_MATH, _norm("h", "ĥ", _h), "DeepseekV3Model.norm", RMSNORM_NOTE),
    "lm_head": Doc(
        "self.lm_head(hidden_states)", "Project each position's features to one logit per vocabulary entry.",
        ("logits = ĥ W_headᵀ",), lambda c: ([("ĥ", _bt(_h(c)))], [("logits", _bt(f"{c.vocab_size} vocab"))]),
        "DeepseekV3ForCausalLM.lm_head (nn.Linear, no bias)",
        "Left unquantized by the FP8 and the INT4 releases alike."),
    "input_layernorm": Doc(
        "self.input_layernorm(hidden_states)", "RMSNorm of the block input, before latent attention.",
        RMSNORM_MATH, _norm("x", "x̂", _h), "DeepseekV3DecoderLayer.input_layernorm", RMSNORM_NOTE),
    "post_attention_layernorm": Doc(
        "self.post_attention_layernorm(hidden_states)",
        "RMSNorm of the residual stream after attention, before the MLP / MoE.",
        RMSNORM_MATH, _norm("x", "x̂", _h), "DeepseekV3DecoderLayer.post_attention_layernorm", RMSNORM_NOTE),
    "q_proj": Doc(
        "self.q_proj(hidden_states)", "Full-rank query projection (used when q_lora_rank is null).",
        ("q = x W_Qᵀ",), lambda c: ([("x", _bt(_h(c)))], [("q", _bt(_heads(c, "q head dim", c.q_head_dim)))]),
        MLA_REF, LINEAR_NOTE),
    "q_a_proj": Doc(
        "self.q_a_proj(hidden_states)", "Compress each position's features into the low-rank query latent.",
        ("c^Q = x W_DQᵀ",), lambda c: ([("x", _bt(_h(c)))], [("c^Q", _bt(f"{c.q_lora_rank} q latent"))]),
        MLA_REF, LINEAR_NOTE),
    "q_a_layernorm": Doc(
        "self.q_a_layernorm(self.q_a_proj(hidden_states))",
        "Rescale each position's features using their root mean square, then apply learned gain.",
        RMSNORM_MATH, _norm("c^Q", "ĉ^Q", lambda c: f"{c.q_lora_rank} q latent"), QUERY_REF, RMSNORM_NOTE),
    "q_b_proj": Doc(
        "self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))",
        "Expand the normalized query latent into every head's query, split into a non-rotated and a rotated part.",
        ("q = ĉ^Q W_UQᵀ", "q → [q_nope | q_pe] per head"),
        lambda c: ([("ĉ^Q", _bt(f"{c.q_lora_rank} q latent"))],
                   [("q", _bt(_heads(c, "q head dim", c.q_head_dim)))]), QUERY_REF, LINEAR_NOTE),
    "kv_a_proj_with_mqa": Doc(
        "self.kv_a_proj_with_mqa(hidden_states)",
        "Compress keys and values into one shared latent, and emit the rotary key shared by all heads.",
        ("[c^KV | k_pe] = x W_DKVᵀ",),
        lambda c: ([("x", _bt(_h(c)))],
                   [("[c^KV | k_pe]", _bt(f"{c.kv_lora_rank + c.qk_rope_head_dim} = {c.kv_lora_rank} kv latent "
                                          f"+ {c.qk_rope_head_dim} rope key"))]), MLA_REF, LINEAR_NOTE),
    "kv_a_layernorm": Doc(
        "self.kv_a_layernorm(compressed_kv)",
        "Rescale the key-value latent by its root mean square, then apply learned gain.",
        RMSNORM_MATH, _norm("c^KV", "ĉ^KV", lambda c: f"{c.kv_lora_rank} kv latent"), MLA_REF, RMSNORM_NOTE),
    "kv_b_proj": Doc(
        "self.kv_b_proj(self.kv_a_layernorm(compressed_kv))",
        "Expand the normalized key-value latent into every head's non-rotated key and value.",
        ("[k_nope | v] = ĉ^KV W_UKVᵀ",),
        lambda c: ([("ĉ^KV", _bt(f"{c.kv_lora_rank} kv latent"))],
                   [("[k_nope | v]", _bt(_heads(c, "(nope key + value) dim", c.qk_nope_head_dim + c.v_head_dim)))]),
        MLA_REF, LINEAR_NOTE),
    "o_proj": Doc(
        "self.o_proj(attn_output)", "Mix the heads' attention outputs back into the model width.",
        ("y = concat_h(o_h) W_Oᵀ",),
        lambda c: ([("o", _bt(_heads(c, "value dim", c.v_head_dim)))], [("y", _bt(_h(c)))]), MLA_REF, LINEAR_NOTE),
    "router_gate": Doc(
        "MoEGate: logits = F.linear(hidden_states, self.weight)",
        "Score every routed expert for each token (sigmoid of the logits); the top num_experts_per_tok are used.",
        ("s = σ(x W_gᵀ)", "experts = top-k(s + b)", "weights = s[experts] / Σ s[experts] × routed_scaling_factor"),
        lambda c: ([("x", f"[B·T tokens, {c.hidden_size} hidden]")],
                   [("s", f"[B·T tokens, {c.n_routed_experts} expert scores]")]),
        "MoEGate (modeling_deepseek.py)", "Kept in BF16 (not quantized)."),
    "e_score_correction_bias": Doc(
        "scores_for_choice = scores + self.e_score_correction_bias",
        "Per-expert bias added to the scores only to choose the top-k experts (auxiliary-loss-free balancing); "
        "the mixing weights use the unbiased scores.",
        ("experts = top-k(s + b)",),
        lambda c: ([("s", f"[B·T tokens, {c.n_routed_experts} expert scores]")],
                   [("experts", f"[B·T tokens, {c.num_experts_per_tok} chosen experts]")]),
        "MoEGate, topk_method noaux_tc", "Stored in F32."),
    "embed_tokens": Doc("self.embed_tokens(input_ids)", "The MTP layer's token embedding.", ("x = E[token id]",),
                        lambda c: ([("ids", "[B batch, T positions]")], [("x", _bt(_h(c)))]), "MTP layer"),
    "enorm": Doc("enorm(embedding)", "RMSNorm of the next token's embedding.", RMSNORM_MATH,
                 _norm("e", "ê", _h), "MTP layer", RMSNORM_NOTE),
    "hnorm": Doc("hnorm(hidden)", "RMSNorm of the main model's hidden state.", RMSNORM_MATH,
                 _norm("h", "ĥ", _h), "MTP layer", RMSNORM_NOTE),
    "eh_proj": Doc("eh_proj(concat(ê, ĥ))", "Combine the normalized embedding and hidden state.",
                   ("x = [ê | ĥ] W_ehᵀ",),
                   lambda c: ([("[ê | ĥ]", _bt(f"{2 * c.hidden_size} = 2 × {c.hidden_size} hidden"))],
                              [("x", _bt(_h(c)))]), "MTP layer"),
    "shared_head_norm": Doc("shared_head.norm(h)", "RMSNorm before the MTP output head.", RMSNORM_MATH,
                            _norm("h", "ĥ", _h), "MTP layer", RMSNORM_NOTE),
    "shared_head_head": Doc("shared_head.head(ĥ)", "The MTP layer's output head.", ("logits = ĥ W_headᵀ",),
                            lambda c: ([("ĥ", _bt(_h(c)))], [("logits", _bt(f"{c.vocab_size} vocab"))]),
                            "MTP layer"),
}
DOCS.update(_mlp_docs("mlp", "Dense MLP (SwiGLU)", lambda c: c.intermediate_size, None,
                      "DeepseekV3MLP (dense block)"))
DOCS.update(_mlp_docs("expert", "One routed expert (SwiGLU), run only on the tokens routed to it",
                      lambda c: c.moe_intermediate_size, ("N_e tokens routed to the expert",),
                      "DeepseekV3MoE.experts[i] (DeepseekV3MLP)"))
DOCS.update(_mlp_docs("shared", "Shared experts (SwiGLU), run on every token",
                      lambda c: c.moe_intermediate_size * (c.n_shared_experts or 1), None,
                      "DeepseekV3MoE.shared_experts (DeepseekV3MLP)"))
DOCS.update({
    "indexer_wq_b": Doc(
        "self.wq_b(qr)", "The indexer's queries: the normalized query latent expanded into every indexer head.",
        ("q^I = ĉ^Q W_qbᵀ → [indexer heads, indexer head dim]",),
        lambda c: ([("ĉ^Q", _bt(f"{c.q_lora_rank or c.hidden_size} q latent"))],
                   [("q^I", _bt(f"{(c.index_n_heads or 0) * (c.index_head_dim or 0)} = {c.index_n_heads} indexer "
                                f"heads × {c.index_head_dim} indexer head dim"))]), INDEXER_REF, LINEAR_NOTE),
    "indexer_wk": Doc(
        "self.k_norm(self.wk(x))", "The indexer's key: one per position, shared by all indexer heads.",
        ("k^I = LayerNorm(x W_kᵀ)",),
        lambda c: ([("x", _bt(_h(c)))], [("k^I", _bt(f"{c.index_head_dim} indexer head dim"))]),
        INDEXER_REF, LINEAR_NOTE),
    "indexer_k_norm": Doc(
        "self.k_norm(k)", "LayerNorm (with bias, not an RMSNorm) of the indexer's key.",
        ("y = γ ⊙ (k − mean(k)) / √(var(k) + ε) + β",),
        lambda c: ([("k", _bt(f"{c.index_head_dim} indexer head dim"))],
                   [("k̂", _bt(f"{c.index_head_dim} indexer head dim"))]),
        INDEXER_REF, "Gain and bias stored in F32."),
    "indexer_weights_proj": Doc(
        "self.weights_proj(x) * self.n_heads ** -0.5",
        "Per-position weights of the indexer heads: the index score is Σ_h w_h · ReLU(q^I_h · k^I), and each "
        "query attends to its top index_topk keys.",
        ("w = x W_wᵀ / √(indexer heads)", "score = Σ_h w_h ReLU(q^I_h · k^I)"),
        lambda c: ([("x", _bt(_h(c)))], [("w", _bt(f"{c.index_n_heads} indexer heads"))]),
        INDEXER_REF, "nn.Linear without bias, left unquantized."),
    # kimi_k25's MoonViT vision tower and projector (transformers 5.25 modeling_kimi_k25.py; release names)
    "vision_patch_embed": Doc(
        "self.proj(pixel_values)", "Cut the image into patch × patch squares and project each to the vision width "
        "(a Conv2d whose stride is its kernel).", ("p = W * x + b",),
        lambda c: ([("x", "[N patches, 3 RGB, patch, patch]")], [("p", f"[N patches, {_vw(c)} vision width]")]),
        VISION_REF + " Kimi_K25VisionPatchEmbed"),
    "vision_pos_emb": Doc(
        "self.pos_emb(p, grid_thw)", "Add a learned 2-D position embedding, interpolated to the image's grid.",
        ("p' = p + interp(P)[row, col]",),
        lambda c: ([("p", f"[N patches, {_vw(c)} vision width]")], [("p'", f"[N patches, {_vw(c)} vision width]")]),
        VISION_REF + " Kimi_K25VisionPositionEmbeddings"),
    "vision_norm": Doc(
        "nn.LayerNorm(x)", "LayerNorm (gain and bias) of the vision features.",
        ("y = γ ⊙ (x − mean(x)) / √(var(x) + ε) + β",),
        lambda c: ([("x", "[N patches, width]")], [("y", "[N patches, width]")]), VISION_REF),
    "vision_wqkv": Doc(
        "self.wqkv(x)", "Queries, keys and values of the vision attention in one Linear (with bias); transformers "
        "splits it into q_proj, k_proj and v_proj on load.", ("[q; k; v] = x Wᵀ + b",),
        lambda c: ([("x", f"[N patches, {_vw(c)}]")], [("qkv", f"[N patches, 3 × {_vw(c)}]")]),
        VISION_REF + " Kimi_K25VisionAttention"),
    "vision_wo": Doc(
        "self.wo(attn)", "Project the attention output back to the vision width (with bias).", ("y = a Wᵀ + b",),
        lambda c: ([("a", f"[N patches, {_vw(c)}]")], [("y", f"[N patches, {_vw(c)}]")]),
        VISION_REF + " Kimi_K25VisionAttention.proj"),
    "vision_fc0": Doc(
        "self.fc0(x)", "The vision MLP's up-projection (with bias), before a tanh-approximated GELU.",
        ("h = GELU(x Wᵀ + b)",),
        lambda c: ([("x", f"[N patches, {_vw(c)}]")], [("h", "[N patches, vision MLP width]")]),
        VISION_REF + " Kimi_K25VisionMLP.fc1"),
    "vision_fc1": Doc(
        "self.fc1(h)", "The vision MLP's down-projection (with bias).", ("y = h Wᵀ + b",),
        lambda c: ([("h", "[N patches, vision MLP width]")], [("y", f"[N patches, {_vw(c)}]")]),
        VISION_REF + " Kimi_K25VisionMLP.fc2"),
    "projector_in": Doc(
        "self.proj[0](merge(pre_norm(x)))", "Merge each 2 × 2 group of patches into one vector and project it "
        "(with bias), before a GELU.", ("h = GELU(m Wᵀ + b)",),
        lambda c: ([("m", "[N merged, merged width]")], [("h", "[N merged, merged width]")]),
        VISION_REF + " Kimi_K25MultimodalProjection.in_proj"),
    "projector_out": Doc(
        "self.proj[2](h)", "Project the merged patches to the text model's hidden width: one image token each.",
        ("t = h Wᵀ + b",),
        lambda c: ([("h", "[N merged, merged width]")], [("t", f"[N merged, {c.hidden_size} hidden]")]),
        VISION_REF + " Kimi_K25MultimodalProjection.out_proj"),
    # Pixtral's vision tower and projector (Mistral Large 4, Mistral Small 4: model.arch.pixtral)
    "pixtral_patch_conv": Doc(
        "self.patch_conv(pixel_values)", "Cut the image into patch × patch squares and project each to the vision "
        "width (a Conv2d without bias whose stride is its kernel).", ("p = W * x",),
        lambda c: ([("x", "[N patches, channels, patch, patch]")], [("p", f"[N patches, {_pw(c)}]")]),
        PIXTRAL_REF + " PixtralVisionModel.patch_conv"),
    "pixtral_norm": Doc(
        "PixtralRMSNorm(x)", "RMSNorm (a gain, no bias, ε 1e-5) of the vision features.", RMSNORM_MATH,
        lambda c: ([("x", "[N patches, width]")], [("y", "[N patches, width]")]), PIXTRAL_REF),
    "pixtral_merge": Doc(
        "self.merging_layer(unfold(x))", "Concatenate each spatial_merge_size × spatial_merge_size group of "
        "patches and project it back to the vision width (no bias).", ("m = unfold(x) Wᵀ",),
        lambda c: ([("x", f"[N patches, {_pw(c)}]")], [("m", f"[N merged, {_pw(c)}]")]),
        MISTRAL3_REF + " Mistral3PatchMerger"),
    "pixtral_projector_in": Doc(
        "self.linear_1(m)", "Project the merged patches to the text model's hidden width, before a GELU (a bias "
        "with multimodal_projector_bias).", ("h = GELU(m Wᵀ + b)",),
        lambda c: ([("m", f"[N merged, {_pw(c)}]")], [("h", f"[N merged, {_h(c)}]")]),
        MISTRAL3_REF + " Mistral3MultiModalProjector"),
    "pixtral_projector_out": Doc(
        "self.linear_2(h)", "The projector's second Linear: one image token per merged patch.", ("t = h Wᵀ + b",),
        lambda c: ([("h", f"[N merged, {_h(c)}]")], [("t", f"[N merged, {_h(c)}]")]),
        MISTRAL3_REF + " Mistral3MultiModalProjector"),
})
