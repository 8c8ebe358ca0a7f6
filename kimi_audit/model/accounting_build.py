"""Building the parameter accounting tree from a config and the checkpoint's tensors.

`Builder` files every found tensor under its (block kind, component) slot, then walks the model as
modeling_deepseek.py builds it (embedding, dense and MoE blocks with their latent attention, router and
experts, MTP layers, final norm, lm_head), making one leaf per module with its derived count (config
values and the model code's formulas) beside the found one. Tensors no leaf claims become the
"unaccounted" node; FP8 scales and buffers the excluded rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kimi_audit.format.table import Located
from kimi_audit.model.accounting_tree import (
    UNACCOUNTED,
    ExcludedRow,
    Factor,
    FoundTensor,
    Node,
    Part,
    collapse,
    tensor_slot,
)
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.layout import (
    BUFFER,
    DENSE,
    FP8_DTYPE,
    MOE,
    MTP,
    PARAMETER,
    SCALE,
    SCALE_SUFFIX,
    ExpectedTensor,
    classify_name,
    is_fp8,
    layer_block,
)

BLOCK_LABEL = {DENSE: ("dense block", "dense blocks"), MOE: ("MoE block", "MoE blocks"),
               MTP: ("MTP layer", "MTP layers")}


class Builder:
    """The tree of one config, with the found tensors of `actual` in its leaves."""


    def __init__(self, cfg: ModelConfig, actual: Located, expected: Mapping[str, ExpectedTensor]) -> None:
        self.cfg = cfg
        self.expected = expected
        self.params: dict[tuple[str | None, str], list[FoundTensor]] = {}
        self.scales: dict[tuple[str | None, str], list[FoundTensor]] = {}
        self.buffers: dict[tuple[str | None, str], list[FoundTensor]] = {}
        self.used: set[tuple[str | None, str]] = set()
        blocks = [layer_block(cfg, i) for i in range(cfg.total_layers)]
        tables = {PARAMETER: self.params, SCALE: self.scales, BUFFER: self.buffers}
        for name, (t, shard) in actual.items():
            e = expected.get(name)
            if e is not None:
                kind = e.kind
                slot = (e.block, e.component)
            else:
                kind = classify_name(name)
                slot = tensor_slot(cfg, name, blocks)[:2]
            tables[kind].setdefault(slot, []).append(FoundTensor(name, t.dtype, tuple(t.shape), shard))
        self.layers_of: dict[str, list[int]] = {}
        for layer in range(cfg.total_layers):
            self.layers_of.setdefault(layer_block(cfg, layer), []).append(layer)

    # leaves

    def leaf(self, key: str, name: str, title: str, role: str, block: str | None, parts: list[Part],
             mult: tuple[tuple[int, str], ...], keys: Iterable[str]) -> Node:
        tensors: list[FoundTensor] = []
        scales: list[FoundTensor] = []
        dtype_ok = True
        for p in parts:
            slot = (block, p.component)
            self.used.add(slot)
            mine = self.params.get(slot, [])
            tensors += mine
            dtype_ok = dtype_ok and all(t.dtype == p.dtype for t in mine)
            if p.component.endswith(".weight"):
                scales += self.scales.get((block, p.component[: -len(".weight")] + SCALE_SUFFIX), [])
        n_inst = 1
        for v, _ in mult:
            n_inst *= v
        all_keys = list(dict.fromkeys(k for p in parts for f in p.factors for k in f.keys))
        all_keys += [k for k in keys if k not in all_keys]
        return Node(
            key=key, name=name, title=title, role=role,
            derived=sum(p.numel for p in parts) * n_inst, found=sum(t.numel for t in tensors),
            derived_tensors=len(parts) * n_inst, found_tensors=len(tensors), mult=mult,
            parts=tuple(parts), tensors=tuple(tensors), scales=tuple(scales), config_keys=tuple(all_keys),
            dtype_ok=dtype_ok, layers=tuple(self.layers_of.get(block, ())) if block else (),
        )

    def group(self, key: str, name: str, title: str, children: list[Node],
              mult: tuple[tuple[int, str], ...] = (), role: str = "group") -> Node:
        children = [c for c in children if c is not None]
        keys = list(dict.fromkeys(k for c in children for k in c.config_keys))
        layers = sorted({layer for c in children for layer in c.layers})
        return Node(
            key=key, name=name, title=title, role=role,
            derived=sum(c.derived for c in children), found=sum(c.found for c in children),
            derived_tensors=sum(c.derived_tensors for c in children),
            found_tensors=sum(c.found_tensors for c in children),
            mult=mult, children=tuple(children), config_keys=tuple(keys), layers=tuple(layers),
        )

    # factor helpers

    def f(self, key: str, label: str) -> Factor:
        return Factor(getattr(self.cfg, key), label, (key,))

    def linear_parts(self, module: str, out: list[Factor], inp: list[Factor], bias: bool = False) -> list[Part]:
        wdtype = FP8_DTYPE if is_fp8(self.cfg) else self.cfg.dtype
        parts = [Part("Weight", f"{module}.weight", tuple(out + inp), wdtype)]
        if bias:
            parts.append(Part("Bias", f"{module}.bias", tuple(out), self.cfg.dtype))
        return parts

    def dtype_keys(self) -> list[str]:
        return ["torch_dtype"] + (["quantization_config"] if self.cfg.quantization else [])

    # the model

    def block_mult(self, block: str) -> tuple[tuple[int, str], ...]:
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

    def attention(self, pre: str, block: str, mult: tuple[tuple[int, str], ...]) -> Node:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        heads = self.f("num_attention_heads", "heads")
        bias = c.attention_bias
        bk = self.block_keys(block) + self.dtype_keys() + (["attention_bias"] if bias else [])
        qhd = Factor(c.q_head_dim, "q head dim", ("qk_nope_head_dim", "qk_rope_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.qk_rope_head_dim:,})")
        a = f"{pre}.attention"
        if c.q_lora_rank is None:
            q = self.group(f"{a}.q_projection", "q_projection", "Query projection", [
                self.leaf(f"{a}.q_projection.q_proj", "q_proj", "Query projection", "q_proj", block,
                          self.linear_parts("self_attn.q_proj", [heads, qhd], [h]), mult, bk)], mult)
        else:
            ql = self.f("q_lora_rank", "q latent")
            q = self.group(f"{a}.q_compression", "q_compression", "Query compression", [
                self.leaf(f"{a}.q_compression.q_a_proj", "q_a_proj", "Query down-projection", "q_a_proj", block,
                          self.linear_parts("self_attn.q_a_proj", [ql], [h], bias), mult, bk),
                self.leaf(f"{a}.q_compression.q_a_layernorm", "q_a_layernorm", "Query latent RMSNorm",
                          "q_a_layernorm", block,
                          [Part("Learned gain", "self_attn.q_a_layernorm.weight", (ql,), c.dtype)], mult,
                          self.block_keys(block) + ["torch_dtype", "rms_norm_eps"]),
                self.leaf(f"{a}.q_compression.q_b_proj", "q_b_proj", "Query up-projection", "q_b_proj", block,
                          self.linear_parts("self_attn.q_b_proj", [heads, qhd], [ql]), mult, bk),
            ], mult)
        kvl = self.f("kv_lora_rank", "kv latent")
        kv_out = Factor(c.kv_lora_rank + c.qk_rope_head_dim, "kv latent + rope key",
                        ("kv_lora_rank", "qk_rope_head_dim"), f"({c.kv_lora_rank:,} + {c.qk_rope_head_dim:,})")
        kvb = Factor(c.qk_nope_head_dim + c.v_head_dim, "nope key + value dim", ("qk_nope_head_dim", "v_head_dim"),
                     f"({c.qk_nope_head_dim:,} + {c.v_head_dim:,})")
        kv = self.group(f"{a}.kv_compression", "kv_compression", "Key-value compression", [
            self.leaf(f"{a}.kv_compression.kv_a_proj_with_mqa", "kv_a_proj_with_mqa",
                      "Joint key-value down-projection", "kv_a_proj_with_mqa", block,
                      self.linear_parts("self_attn.kv_a_proj_with_mqa", [kv_out], [h], bias), mult, bk),
            self.leaf(f"{a}.kv_compression.kv_a_layernorm", "kv_a_layernorm", "Key-value latent RMSNorm",
                      "kv_a_layernorm", block,
                      [Part("Learned gain", "self_attn.kv_a_layernorm.weight", (kvl,), c.dtype)], mult,
                      self.block_keys(block) + ["torch_dtype", "rms_norm_eps"]),
            self.leaf(f"{a}.kv_compression.kv_b_proj", "kv_b_proj", "Key-value up-projection", "kv_b_proj", block,
                      self.linear_parts("self_attn.kv_b_proj", [heads, kvb], [kvl]), mult, bk),
        ], mult)
        vd = self.f("v_head_dim", "value dim")
        o = self.group(f"{a}.output_projection", "output_projection", "Output projection", [
            self.leaf(f"{a}.output_projection.o_proj", "o_proj", "Attention output projection", "o_proj", block,
                      self.linear_parts("self_attn.o_proj", [h], [heads, vd], bias), mult, bk)], mult)
        return self.group(a, "attention", "Latent attention", [q, kv, o], mult)

    def norms(self, pre: str, block: str, mult: tuple[tuple[int, str], ...]) -> Node:
        h = self.f("hidden_size", "hidden")
        keys = self.block_keys(block) + ["torch_dtype", "rms_norm_eps"]
        return self.group(f"{pre}.norms", "norms", "Block norms", [
            self.leaf(f"{pre}.norms.input_layernorm", "input_layernorm", "Pre-attention RMSNorm",
                      "input_layernorm", block, [Part("Learned gain", "input_layernorm.weight", (h,), self.cfg.dtype)],
                      mult, keys),
            self.leaf(f"{pre}.norms.post_attention_layernorm", "post_attention_layernorm", "Pre-MLP RMSNorm",
                      "post_attention_layernorm", block,
                      [Part("Learned gain", "post_attention_layernorm.weight", (h,), self.cfg.dtype)], mult, keys),
        ], mult)

    def mlp(self, key: str, name: str, title: str, role: str, module: str, block: str, inter: Factor,
            mult: tuple[tuple[int, str], ...], keys: list[str]) -> Node:
        h = self.f("hidden_size", "hidden")
        keys = keys + self.dtype_keys()
        return self.group(key, name, title, [
            self.leaf(f"{key}.gate_proj", "gate_proj", "Gate projection", f"{role}_gate_proj", block,
                      self.linear_parts(f"{module}.gate_proj", [inter], [h]), mult, keys),
            self.leaf(f"{key}.up_proj", "up_proj", "Up projection", f"{role}_up_proj", block,
                      self.linear_parts(f"{module}.up_proj", [inter], [h]), mult, keys),
            self.leaf(f"{key}.down_proj", "down_proj", "Down projection", f"{role}_down_proj", block,
                      self.linear_parts(f"{module}.down_proj", [h], [inter]), mult, keys),
        ], mult)

    def block(self, block: str) -> Node | None:
        layers = self.layers_of.get(block)
        if not layers:
            return None
        c = self.cfg
        mult = self.block_mult(block)
        pre = "mtp" if block == MTP else f"blocks.{block}"
        bk = self.block_keys(block)
        children: list[Node] = []
        if block == MTP:
            h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
            two_h = Factor(2 * c.hidden_size, "2 × hidden", ("hidden_size",), f"(2 × {c.hidden_size:,})")
            k = bk + ["torch_dtype"]
            children.append(self.group(f"{pre}.mtp_head", "mtp_head", "MTP embedding, projection and head", [
                self.leaf(f"{pre}.mtp_head.embed_tokens", "embed_tokens", "MTP token embedding", "embed_tokens",
                          block, [Part("Embedding table", "embed_tokens.weight", (v, h), c.dtype)], mult, k),
                self.leaf(f"{pre}.mtp_head.enorm", "enorm", "MTP embedding RMSNorm", "enorm", block,
                          [Part("Learned gain", "enorm.weight", (h,), c.dtype)], mult, k),
                self.leaf(f"{pre}.mtp_head.hnorm", "hnorm", "MTP hidden-state RMSNorm", "hnorm", block,
                          [Part("Learned gain", "hnorm.weight", (h,), c.dtype)], mult, k),
                self.leaf(f"{pre}.mtp_head.eh_proj", "eh_proj", "MTP combining projection", "eh_proj", block,
                          [Part("Weight", "eh_proj.weight", (h, two_h), c.dtype)], mult, k),
                self.leaf(f"{pre}.mtp_head.shared_head_norm", "shared_head.norm", "MTP head RMSNorm",
                          "shared_head_norm", block, [Part("Learned gain", "shared_head.norm.weight", (h,), c.dtype)],
                          mult, k),
                self.leaf(f"{pre}.mtp_head.shared_head_head", "shared_head.head", "MTP output head",
                          "shared_head_head", block,
                          [Part("Weight", "shared_head.head.weight", (v, h), c.dtype)], mult, k),
            ], mult))
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
            children.append(self.group(f"{pre}.router", "router", "Router", router, mult))
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
        title = f"{mult[0][0]} {mult[0][1]}"
        return self.group(pre, block if block != MTP else "mtp", title, children, mult, role=f"{block}_blocks")

    def model(self) -> Node:
        c = self.cfg
        h, v = self.f("hidden_size", "hidden"), self.f("vocab_size", "vocab")
        children = [self.leaf("embedding", "embed_tokens", "Token embedding", "embedding", None,
                              [Part("Embedding table", "model.embed_tokens.weight", (v, h), c.dtype)], (),
                              ["torch_dtype"])]
        blocks = [self.block(DENSE), self.block(MOE)]
        children.append(self.group("blocks", "blocks", f"{c.num_hidden_layers} transformer blocks",
                                   [b for b in blocks if b is not None]))
        mtp = self.block(MTP)
        if mtp is not None:
            children.append(mtp)
        children.append(self.leaf("norm", "norm", "Final RMSNorm", "final_norm", None,
                                  [Part("Learned gain", "model.norm.weight", (h,), c.dtype)], (),
                                  ["torch_dtype", "rms_norm_eps"]))
        if not c.tie_word_embeddings:
            children.append(self.leaf("lm_head", "lm_head", "Output head (lm_head)", "lm_head", None,
                                      [Part("Weight", "lm_head.weight", (v, h), c.dtype)], (),
                                      ["torch_dtype", "tie_word_embeddings"]))
        leftover = [t for slot, ts in self.params.items() if slot not in self.used for t in ts]
        if leftover:
            leftover.sort(key=lambda t: t.name)
            children.append(Node(
                key=UNACCOUNTED, name=UNACCOUNTED, title="Tensors the config does not account for", role=UNACCOUNTED,
                derived=0, found=sum(t.numel for t in leftover), derived_tensors=0, found_tensors=len(leftover),
                tensors=tuple(leftover),
            ))
        return self.group("model", "model", f"{c.model_type} model", children, role="model")

    def excluded(self) -> tuple[ExcludedRow, ...]:
        derived: dict[tuple[str, str, str], list[int]] = {}
        for e in self.expected.values():
            if e.kind == PARAMETER:
                continue
            row = derived.setdefault((e.kind, e.block or "", e.component), [0, 0, 0])
            row[0] += 1
            row[1] += e.numel
        found: dict[tuple[str, str, str], list[FoundTensor]] = {}
        for kind, table in ((SCALE, self.scales), (BUFFER, self.buffers)):
            for (block, comp), ts in table.items():
                found.setdefault((kind, block or "", comp), []).extend(ts)
        rows = []
        for key in list(derived) + [k for k in found if k not in derived]:
            kind, block, comp = key
            ts = found.get(key, [])
            d = derived.get(key, [0, 0])
            if ts:
                pattern = ", ".join(collapse(sorted(t.name for t in ts)))
                dtypes = sorted({t.dtype for t in ts})
            else:
                layers = self.layers_of.get(block, [])
                pattern = comp if not layers else ", ".join(collapse(
                    f"model.layers.{i}.{comp}" for i in layers))
                dtypes = sorted({e.dtype for e in self.expected.values()
                                 if e.kind == kind and e.component == comp and (e.block or "") == block})
            rows.append(ExcludedRow(kind, pattern, "/".join(dtypes), d[0], len(ts), d[1],
                                    sum(t.numel for t in ts)))
        return tuple(rows)
