"""Explain cards: one node of the accounting tree, as the design cards (shared/seeds) present it.

A card says what the component computes (formula), its input and output shapes with named axes,
the exact per-instance parameter accounting, the count across blocks, the checkpoint tensors that
hold it (names with indices collapsed, dtypes, shapes, shards) and the config keys it came from.
Pure: everything comes from an Accounting (kimi_audit.model.accounting) and the config.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kimi_audit.errors import KimiAuditError
from kimi_audit.model.accounting import UNACCOUNTED, Accounting, FoundTensor, Node, collapse, tensor_slot
from kimi_audit.model.config import ModelConfig

RMSNORM_MATH = (
    "m₂(x) = (1/d) Σⱼ xⱼ²",
    "y = γ ⊙ x / √(m₂(x) + ε)",
)
RMSNORM_NOTE = ("Normalized in float32, cast back to the input type, then multiplied by the gain "
                "(DeepseekV3RMSNorm, modeling_deepseek.py 94–111).")
LINEAR_NOTE = ("nn.Linear without bias: y = x Wᵀ. Stored as FP8 e4m3 with one F32 scale per 128 × 128 block "
               "(weight_scale_inv); the scales are quantization metadata, excluded from parameter counts.")
MLA_REF = "DeepseekV3Attention.__init__, modeling_deepseek.py 662–688"
QUERY_REF = "DeepseekV3Attention.forward, modeling_deepseek.py 767–774"


@dataclass(frozen=True)
class Doc:
    computes: str
    description: str
    math: tuple[str, ...]
    shapes: Callable[[ModelConfig], tuple[list[tuple[str, str]], list[tuple[str, str]]]]
    """cfg -> (inputs, outputs): each (symbol, "[axis, axis, ...]")."""
    code: str
    note: str = ""


def _bt(*axes: str) -> str:
    return "[" + ", ".join(("B batch", "T positions") + axes) + "]"


def _h(c: ModelConfig) -> str:
    return f"{c.hidden_size} hidden"


def _norm(symbol_in: str, symbol_out: str, width: Callable[[ModelConfig], str]):  # type: ignore[no-untyped-def]
    return lambda c: ([(symbol_in, _bt(width(c)))], [(symbol_out, _bt(width(c)))])


def _lin(sym_in: str, w_in: Callable[[ModelConfig], str], sym_out: str, w_out: Callable[[ModelConfig], str],
         lead: tuple[str, ...] | None = None):  # type: ignore[no-untyped-def]
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
        "DeepseekV3ForCausalLM.lm_head (nn.Linear, no bias)", "Kept in BF16 (not quantized)."),
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


@dataclass(frozen=True)
class TensorGroup:
    names: str
    dtype: str
    shape: tuple[int, ...]
    count: int
    shards: str


@dataclass(frozen=True)
class Card:
    key: str
    name: str
    title: str
    breadcrumb: tuple[str, ...]
    computes: str | None
    description: str
    math: tuple[str, ...]
    eps: float | None
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    formula: str
    rows: tuple[tuple[str, str, int], ...]
    """Exact per-instance accounting: (component, calculation, parameters)."""
    per_instance: int
    instances: str
    instance_count: int
    derived: int
    found: int
    derived_tensors: int
    found_tensors: int
    mismatch: bool
    tensors: tuple[TensorGroup, ...]
    scales: tuple[TensorGroup, ...]
    config: tuple[tuple[str, Any], ...]
    code: str | None
    note: str
    model: str

    @property
    def verdict(self) -> str:
        if not self.mismatch:
            return ("Derived from the config; the model total matches the checkpoint's tensors "
                    f"({_n(self.found_tensors, 'tensor')}, {_n(self.found, 'parameter')}).")
        return (f"MISMATCH: the config implies {_n(self.derived_tensors, 'tensor')} and "
                f"{_n(self.derived, 'parameter')}; the checkpoint holds {_n(self.found_tensors, 'tensor')} and "
                f"{_n(self.found, 'parameter')}.")


def tensor_groups(tensors: tuple[FoundTensor, ...] | list[FoundTensor]) -> tuple[TensorGroup, ...]:
    by: dict[tuple[str, tuple[int, ...]], list[FoundTensor]] = {}
    for t in tensors:
        by.setdefault((t.dtype, t.shape), []).append(t)
    out = []
    for (dtype, shape), ts in by.items():
        names = ", ".join(collapse(sorted(t.name for t in ts)))
        shards = ", ".join(collapse(sorted({t.shard for t in ts}, key=_natural)))
        out.append(TensorGroup(names, dtype, shape, len(ts), shards))
    return tuple(out)


def _natural(s: str) -> list[Any]:
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def find_nodes(acc: Accounting, cfg: ModelConfig, query: str) -> list[Node]:
    """Nodes named by `query`: a key (`blocks.moe.router.gate`), a key suffix on a dot boundary
    (`q_a_layernorm`, `experts.gate_proj`), a title (`Query latent RMSNorm`), or a tensor name
    (`model.layers.5.self_attn.q_a_layernorm.weight`). Raises KimiAuditError (with suggestions) if none."""
    q = query.strip()
    nodes = acc.nodes()
    exact = [n for n in nodes if n.key == q]
    if exact:
        return exact
    low = q.lower()
    hits = [n for n in nodes if n.key.endswith("." + q) or n.name == q]
    if not hits:
        hits = [n for n in nodes if n.title.lower() == low]
    if not hits and "." in q:
        # A tensor name: the leaf that holds it, or (when it is absent) the leaf whose part it would be.
        hits = [n for n in nodes if n.is_leaf and any(t.name == q for t in n.tensors + n.scales)]
        if not hits:
            block, comp, _ = tensor_slot(cfg, q)
            comp = comp.replace(".weight_scale_inv", ".weight")
            prefix = {None: "", "dense": "blocks.dense.", "moe": "blocks.moe.", "mtp": "mtp."}.get(block, "?")
            hits = [n for n in nodes if n.is_leaf and n.key.startswith(prefix)
                    and any(p.component == comp for p in n.parts) and (block is not None or "." not in n.key)]
    if not hits:
        names = sorted({n.name for n in nodes} | {n.key for n in nodes})
        close = difflib.get_close_matches(q, names, n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `kimi-audit params SOURCE` lists every node"
        raise KimiAuditError(f"no component {query!r} in the accounting tree{hint}")
    # MoE blocks first (the seed cards' order), then dense, MTP, the rest.
    rank = {"blocks.moe": 0, "blocks.dense": 1, "mtp": 2}
    return sorted(hits, key=lambda n: min([v for k, v in rank.items() if n.key.startswith(k)] or [3]))


def _per_instance_calc(child: Node, div: int) -> str:
    if not child.mult:
        return child.formula
    per = " + ".join(p.calculation() for p in child.parts) if child.is_leaf else f"{child.per_instance:,}"
    times = child.instances // div
    return per + (f" × {times:,} {child.mult[0][1]}" if times > 1 else "")


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def build_card(acc: Accounting, cfg: ModelConfig, config_raw: dict[str, Any], node: Node) -> Card:
    path = acc.path_to(node.key)
    crumbs = tuple(n.title for n in path[1:-1])
    doc = DOCS.get(node.role)
    if node.is_leaf:
        rows = tuple((p.label, p.calculation(), p.numel) for p in node.parts)
        tensors = tensor_groups(node.tensors)
        scales = tensor_groups(node.scales)
    else:
        div = node.instances or 1
        rows = tuple((c.title, _per_instance_calc(c, div), c.derived // div) for c in node.children)
        tensors = scales = ()
    if doc is not None:
        ins, outs = doc.shapes(cfg)
    else:
        ins = outs = []
    config = tuple((k, config_raw.get(k)) for k in node.config_keys)
    is_norm = doc is not None and doc.math == RMSNORM_MATH
    description = doc.description if doc else (
        "Tensors in the checkpoint that the config does not account for." if node.key == UNACCOUNTED
        else f"{len(node.children)} components: " + ", ".join(c.title for c in node.children) + ".")
    return Card(
        key=node.key, name=node.name, title=node.title, breadcrumb=crumbs,
        computes=doc.computes if doc else None, description=description,
        math=doc.math if doc else (), eps=cfg.rms_norm_eps if is_norm else None,
        inputs=tuple(ins), outputs=tuple(outs), formula=node.formula, rows=rows,
        per_instance=node.per_instance if node.mult else node.derived,
        instances=node.instance_text(), instance_count=node.instances if node.mult else 1,
        derived=node.derived, found=node.found, derived_tensors=node.derived_tensors,
        found_tensors=node.found_tensors, mismatch=node.mismatch, tensors=tensors, scales=scales,
        config=config, code=doc.code if doc else None, note=doc.note if doc else "",
        model=str(config_raw.get("model_type", cfg.model_type)),
    )


def card_dict(card: Card) -> dict[str, Any]:
    return {
        "key": card.key, "name": card.name, "title": card.title, "breadcrumb": list(card.breadcrumb),
        "computes": card.computes, "description": card.description, "math": list(card.math), "eps": card.eps,
        "in": [{"symbol": s, "shape": sh} for s, sh in card.inputs],
        "out": [{"symbol": s, "shape": sh} for s, sh in card.outputs],
        "formula": card.formula,
        "per_instance": [{"component": c, "calculation": calc, "parameters": p} for c, calc, p in card.rows],
        "per_instance_total": card.per_instance, "instances": card.instances, "instance_count": card.instance_count,
        "derived": card.derived, "found": card.found, "derived_tensors": card.derived_tensors,
        "found_tensors": card.found_tensors, "mismatch": card.mismatch, "verdict": card.verdict,
        "tensors": [{"names": g.names, "dtype": g.dtype, "shape": list(g.shape), "count": g.count,
                     "shards": g.shards} for g in card.tensors],
        "scales_excluded": [{"names": g.names, "dtype": g.dtype, "shape": list(g.shape), "count": g.count,
                             "shards": g.shards} for g in card.scales],
        "config_keys": {k: v for k, v in card.config}, "code": card.code, "note": card.note,
    }


def card_text(card: Card) -> str:
    """The card as plain text (the seeds' order of sections)."""
    lines = [f"{_model_title(card.model)} · {card.title}", ""]
    if card.breadcrumb:
        lines += [" › ".join(card.breadcrumb), ""]
    lines += [f"{card.title}  ({card.key})"]
    if card.computes:
        lines += [f"computes: {card.computes}"]
    lines += ["", card.description]
    if card.math:
        lines += [""] + [f"  {m}" for m in card.math]
        if card.eps is not None:
            lines += [f"  ε = {card.eps:g}"]
    if card.inputs or card.outputs:
        lines += [""]
        lines += [f"in:  {s} {sh}" for s, sh in card.inputs]
        lines += [f"out: {s} {sh}" for s, sh in card.outputs]
    lines += [f"parameters: {card.formula}", ""]
    if card.note:
        lines += [card.note, ""]
    lines += ["Exact per-instance accounting"]
    w = max([len(r[0]) for r in card.rows] + [len("Per-instance total")])
    for comp, calc, p in card.rows:
        lines += [f"  {comp:<{w}}  {calc}  =  {p:,}"]
    lines += [f"  {'Per-instance total':<{w}}  {card.per_instance:,}"]
    if card.instances:
        lines += ["", f"Across {card.instances}: {card.per_instance:,} × {card.instance_count:,} = {card.derived:,} "
                      "parameters."]
    lines += ["", card.verdict]
    if card.tensors:
        lines += ["", "Tensors"]
        for g in card.tensors:
            lines += [f"  {g.names}  {g.dtype} {list(g.shape)}  ×{g.count:,}  in {g.shards}"]
    if card.scales:
        lines += ["", "FP8 scales (quantization metadata, excluded from the counts)"]
        for g in card.scales:
            lines += [f"  {g.names}  {g.dtype} {list(g.shape)}  ×{g.count:,}  in {g.shards}"]
    if card.config:
        lines += ["", "Config keys: " + ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                                   for k, v in card.config)]
    if card.code:
        lines += [f"Code: {card.code}"]
    return "\n".join(lines) + "\n"


def _model_title(model_type: str) -> str:
    return {"kimi_k2": "Kimi K2", "deepseek_v3": "DeepSeek-V3"}.get(model_type, model_type)
