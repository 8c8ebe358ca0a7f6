"""The parameter accounting tree: every parameter of a DeepseekV3-family checkpoint, by component.

The tree mirrors the model as modeling_deepseek.py builds it (and as the design cards show it:
"61 transformer blocks › 60 MoE blocks › Latent attention › Query compression › Query latent RMSNorm"):

    model
    ├── embedding (model.embed_tokens)
    ├── transformer blocks
    │   ├── dense block(s): norms, latent attention, MLP
    │   └── MoE blocks: norms, latent attention, router, routed experts, shared experts
    ├── multi-token-prediction layers (only when num_nextn_predict_layers > 0)
    ├── final norm (model.norm)
    └── lm_head (absent when tie_word_embeddings)

Latent attention is split into query compression (q_a_proj, q_a_layernorm, q_b_proj), key-value
compression (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) and the output projection (o_proj).

Every node carries two counts:
  * `derived`: computed from config.json values alone, by the formulas of the model code (the node's
    `formula` spells them out, e.g. "1,536 × 60 MoE blocks = 92,160");
  * `found`: the elements of the checkpoint tensors that map to the node (from the shard headers).
A node is flagged (`mismatch`) when they differ, when the number of tensors differs, when a found
tensor has another dtype than the config implies, or when any descendant is flagged. Tensors the
config does not account for land in an extra "unaccounted" node, which is always a mismatch.

FP8 block scales (`weight_scale_inv`) and stored buffers (`rotary_emb.inv_freq`) are not parameters:
they are listed apart (`Accounting.excluded`) and counted in no node.

Activated parameters per token (`Activation`) are counted as follows:
  * every parameter outside the routed experts of the main stack counts in full: embedding, all
    attention and norm parameters, routers (gate weight and correction bias), dense MLPs, shared
    experts, the final norm and lm_head. The embedding is counted in full although a token reads
    one row of it, as the published figures do (`without_embedding` gives the other convention);
  * of the routed experts of each MoE block, `num_experts_per_tok` of `n_routed_experts` count;
  * multi-token-prediction layers are not counted (they do not take part in next-token inference).
The published figures (`PUBLISHED`) are reference constants for comparison only; nothing here is
derived from them.
"""

from __future__ import annotations

import math

import re
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from kimi_audit.format.names import ranges
from kimi_audit.format.table import Located
from kimi_audit.model.config import ModelConfig, parse_config_bytes, pinned_config_bytes
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
    expected_layout,
    is_fp8,
    layer_block,
)

LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
EXPERT_RE = re.compile(r"(?<=\.experts\.)\d+\.")
DIGITS_RE = re.compile(r"\d+")

UNACCOUNTED = "unaccounted"
BLOCK_LABEL = {DENSE: ("dense block", "dense blocks"), MOE: ("MoE block", "MoE blocks"),
               MTP: ("MTP layer", "MTP layers")}


@dataclass(frozen=True)
class PublishedFigure:
    source: str
    total: float
    activated: float
    significant: int
    """Significant figures the source states (for the 'consistent when rounded' verdict)."""


PUBLISHED: tuple[PublishedFigure, ...] = (
    PublishedFigure("Kimi K2 tech report (arXiv:2507.20534)", 1.04e12, 32.6e9, 3),
    PublishedFigure("Kimi-K2-Instruct model card", 1e12, 32e9, 2),
)


@dataclass(frozen=True)
class Factor:
    """One factor of a per-instance formula: its value, what it is, and the config keys it comes from."""

    value: int
    label: str
    keys: tuple[str, ...]
    expr: str | None = None
    """How the value is built when it is not a single config value, e.g. "(512 + 64)"."""

    def text(self) -> str:
        return self.expr or f"{self.value:,}"


@dataclass(frozen=True)
class Part:
    """One tensor of one instance of a leaf: e.g. the weight of a q_a_proj."""

    label: str
    component: str
    """Tensor name relative to the layer prefix (`self_attn.q_a_proj.weight`), or the full name outside layers."""
    factors: tuple[Factor, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for f in self.factors:
            n *= f.value
        return n

    def calculation(self) -> str:
        return " × ".join(f.text() for f in self.factors)


class FoundTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Node:
    key: str
    """Stable dotted path, e.g. `blocks.moe.attention.q_compression.q_a_layernorm`."""
    name: str
    """Short name: the module attribute for leaves (`q_a_layernorm`), a group name otherwise."""
    title: str
    role: str
    """What kind of thing it is (explain.py's catalogue key): `q_a_layernorm`, `expert_gate_proj`, `group`..."""
    derived: int
    found: int
    derived_tensors: int
    found_tensors: int
    mult: tuple[tuple[int, str], ...] = ()
    """Instance factors, e.g. ((384, "experts"), (60, "MoE blocks")): derived = per instance × their product."""
    parts: tuple[Part, ...] = ()
    """Leaves: the tensors of one instance."""
    children: tuple["Node", ...] = ()
    tensors: tuple[FoundTensor, ...] = ()
    """Leaves: the checkpoint tensors counted in `found`."""
    scales: tuple[FoundTensor, ...] = ()
    """Leaves: the FP8 scales of those tensors (excluded from every count)."""
    config_keys: tuple[str, ...] = ()
    dtype_ok: bool = True
    """Leaves: every found tensor has the dtype the config implies."""
    layers: tuple[int, ...] = ()
    """Decoder layers this node's instances live in (empty outside the blocks)."""

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def instances(self) -> int:
        n = 1
        for v, _ in self.mult:
            n *= v
        return n

    @property
    def per_instance(self) -> int:
        return self.derived // self.instances if self.instances else 0

    @property
    def own_mismatch(self) -> bool:
        """A leaf whose found tensors differ from the derived ones (count, parameters or dtype).
        Groups are flagged (`mismatch`) through their leaves."""
        if self.children:
            return False
        return self.derived != self.found or self.derived_tensors != self.found_tensors or not self.dtype_ok

    @property
    def mismatch(self) -> bool:
        return self.own_mismatch or any(c.mismatch for c in self.children)

    def instance_text(self) -> str:
        return " × ".join(f"{v:,} {label}" for v, label in self.mult)

    @property
    def formula(self) -> str:
        """E.g. "1,536 × 60 MoE blocks = 92,160" or "a + b + c = total"."""
        if self.key == UNACCOUNTED:
            noun = "tensor" if self.found_tensors == 1 else "tensors"
            return f"not derivable from config: {self.found_tensors:,} {noun} found"
        if self.parts:
            terms = [p.calculation() for p in self.parts]
            per = terms[0] if len(terms) == 1 else "(" + " + ".join(terms) + ")"
            simple = len(self.parts) == 1 and len(self.parts[0].factors) == 1 and not self.parts[0].factors[0].expr
        else:
            contrib = [c.derived // self.instances for c in self.children] if self.instances else []
            per = " + ".join(f"{c:,}" for c in contrib) or "0"
            simple = len(contrib) <= 1
            if self.mult and not simple:
                per = f"({per} = {self.per_instance:,})"
        if self.mult:
            return f"{per} × {self.instance_text()} = {self.derived:,}"
        return f"{self.derived:,}" if simple else f"{per} = {self.derived:,}"

    def walk(self, depth: int = 0) -> Iterable[tuple[int, "Node"]]:
        yield depth, self
        for c in self.children:
            yield from c.walk(depth + 1)

    def leaves(self) -> Iterable["Node"]:
        for _, n in self.walk():
            if n.is_leaf:
                yield n


@dataclass(frozen=True)
class ExcludedRow:
    """Scales or buffers of one component (indices collapsed): listed, never counted."""

    kind: str
    pattern: str
    dtype: str
    derived_tensors: int
    found_tensors: int
    derived_elements: int
    found_elements: int


@dataclass(frozen=True)
class DtypeRow:
    dtype: str
    derived: int
    found: int


@dataclass(frozen=True)
class Comparison:
    source: str
    published_total: float
    published_activated: float
    total_ratio: float
    activated_ratio: float
    total_consistent: bool
    """The computed total, rounded to the published significant figures, equals the published one."""
    activated_consistent: bool


@dataclass(frozen=True)
class Activation:
    per_token: int
    always_active: int
    """Parameters outside the routed experts of the main stack, MTP layers excluded."""
    routed_total: int
    routed_active: int
    top_k: int
    experts: int
    moe_blocks: int
    per_expert: int
    mtp_excluded: int
    embedding: int

    @property
    def without_embedding(self) -> int:
        return self.per_token - self.embedding


@dataclass(frozen=True)
class Accounting:
    root: Node
    excluded: tuple[ExcludedRow, ...]
    dtypes: tuple[DtypeRow, ...]
    activation: Activation
    comparisons: tuple[Comparison, ...]
    """Against PUBLISHED; empty unless the config is Kimi-K2-Instruct's architecture."""
    source: str = ""
    revision: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def derived(self) -> int:
        return self.root.derived

    @property
    def found(self) -> int:
        return self.root.found

    @property
    def mismatch(self) -> bool:
        return self.root.mismatch

    def nodes(self) -> list[Node]:
        return [n for _, n in self.root.walk()]

    def node(self, key: str) -> Node:
        for n in self.nodes():
            if n.key == key:
                return n
        raise KeyError(key)

    def path_to(self, key: str) -> list[Node]:
        """Root .. the node with `key`, for breadcrumbs."""

        def find(n: Node, trail: list[Node]) -> list[Node] | None:
            trail = trail + [n]
            if n.key == key:
                return trail
            for c in n.children:
                got = find(c, trail)
                if got is not None:
                    return got
            return None

        got = find(self.root, [])
        if got is None:
            raise KeyError(key)
        return got


# --- mapping checkpoint tensors to (block kind, component) ----------------------------------------

def tensor_slot(cfg: ModelConfig, name: str, blocks: list[str] | None = None) -> tuple[str | None, str, int | None]:
    """(block kind or None, component with expert index removed, layer or None) of a tensor name.

    `blocks` (layer -> block kind) may be passed to save recomputing it per tensor."""
    m = LAYER_RE.match(name)
    if m is None:
        return None, name, None
    layer = int(m.group(1))
    rest = m.group(2)
    if blocks is not None:
        block = blocks[layer] if layer < len(blocks) else UNACCOUNTED
    else:
        block = layer_block(cfg, layer) if layer < cfg.total_layers else UNACCOUNTED
    if ".experts." in rest:
        rest = EXPERT_RE.sub("", rest, count=1)
    return block, rest, layer


def collapse(names: Iterable[str]) -> list[str]:
    """Names with their varying numbers shown as ranges: `model.layers.{1-60}.mlp.gate.weight`."""
    groups: dict[str, list[list[int]]] = {}
    order: list[str] = []
    for n in names:
        template = DIGITS_RE.sub("#", n)
        if template not in groups:
            groups[template] = []
            order.append(template)
        groups[template].append([int(d) for d in DIGITS_RE.findall(n)])
    out = []
    for template in order:
        rows = groups[template]
        pieces = template.split("#")
        s = pieces[0]
        for i, rest in enumerate(pieces[1:]):
            col = [r[i] for r in rows]
            r = ranges(col)
            s += r if "," not in r and "-" not in r else "{" + r + "}"
            s += rest
        out.append(s)
    return out


# --- building ------------------------------------------------------------------------------------

class _Builder:
    def __init__(self, cfg: ModelConfig, actual: Located, expected: dict[str, ExpectedTensor]) -> None:
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


def _dtype_rows(root: Node) -> tuple[DtypeRow, ...]:
    derived: dict[str, int] = {}
    found: dict[str, int] = {}
    for leaf in root.leaves():
        for p in leaf.parts:
            derived[p.dtype] = derived.get(p.dtype, 0) + p.numel * leaf.instances
        for t in leaf.tensors:
            found[t.dtype] = found.get(t.dtype, 0) + t.numel
    keys = sorted(set(derived) | set(found), key=lambda d: -max(derived.get(d, 0), found.get(d, 0)))
    return tuple(DtypeRow(d, derived.get(d, 0), found.get(d, 0)) for d in keys)


def _activation(cfg: ModelConfig, root: Node) -> Activation:
    mtp = next((c.derived for c in root.children if c.key == "mtp"), 0)
    embedding = next((c.derived for c in root.children if c.key == "embedding"), 0)
    experts = [n for _, n in root.walk() if n.key == "blocks.moe.experts"]
    routed = experts[0].derived if experts else 0
    k = cfg.num_experts_per_tok or 0
    if experts:
        per_expert = experts[0].per_instance
        moe_blocks = experts[0].mult[1][0]
        active = per_expert * min(k, cfg.n_routed_experts or 0) * moe_blocks
    else:
        per_expert = moe_blocks = active = 0
    always = root.derived - mtp - routed
    return Activation(always + active, always, routed, active, k, cfg.n_routed_experts or 0, moe_blocks,
                      per_expert, mtp, embedding)


def _round_sig(x: float, sig: int) -> float:
    if x == 0:
        return 0.0
    from math import floor, log10

    return round(x, -int(floor(log10(abs(x)))) + sig - 1)


def published_applies(cfg: ModelConfig) -> bool:
    """The published figures describe Kimi-K2's architecture: compare only when the config has it."""
    _, pinned = parse_config_bytes(pinned_config_bytes())
    return cfg == pinned


def compare_published(total: int, activated: int) -> tuple[Comparison, ...]:
    return tuple(
        Comparison(p.source, p.total, p.activated, total / p.total, activated / p.activated,
                   _round_sig(total, p.significant) == p.total, _round_sig(activated, p.significant) == p.activated)
        for p in PUBLISHED
    )


def build_accounting(cfg: ModelConfig, actual: Located, expected: dict[str, ExpectedTensor] | None = None,
                     *, source: str = "", revision: str | None = None) -> Accounting:
    """The tree for `cfg`, with found counts from `actual` (tensor name -> (header entry, shard))."""
    b = _Builder(cfg, actual, expected if expected is not None else expected_layout(cfg))
    root = b.model()
    act = _activation(cfg, root)
    comps = compare_published(root.derived, act.per_token) if published_applies(cfg) else ()
    return Accounting(root, b.excluded(), _dtype_rows(root), act, comps, source, revision)


def accounting_of_checkpoint(ckpt) -> Accounting:  # type: ignore[no-untyped-def]
    """From a kimi_audit.checkpoint.Checkpoint (already loaded: no I/O here)."""
    from kimi_audit.format.table import locate_tensors

    actual, _ = locate_tensors(ckpt.headers)
    return build_accounting(ckpt.config, actual, ckpt.expected, source=ckpt.label, revision=ckpt.revision)


def accounting_dict(acc: Accounting, depth: int | None = None) -> dict[str, object]:
    """JSON-ready form (schema kimi-audit/params/1). Leaves list their tensors collapsed, not one by one."""

    def node(n: Node, d: int) -> dict[str, object]:
        out: dict[str, object] = {
            "key": n.key, "name": n.name, "title": n.title, "formula": n.formula,
            "derived": n.derived, "found": n.found, "derived_tensors": n.derived_tensors,
            "found_tensors": n.found_tensors, "per_instance": n.per_instance,
            "instances": [{"count": v, "of": label} for v, label in n.mult],
            "mismatch": n.mismatch, "config_keys": list(n.config_keys),
        }
        if n.is_leaf:
            out["parts"] = [{"label": p.label, "tensor": p.component, "calculation": p.calculation(),
                             "parameters": p.numel, "dtype": p.dtype} for p in n.parts]
            out["tensors"] = collapse(t.name for t in n.tensors)
            out["dtype_ok"] = n.dtype_ok
        elif depth is None or d < depth:
            out["children"] = [node(c, d + 1) for c in n.children]
        return out

    a = acc.activation
    return {
        "schema": "kimi-audit/params/1",
        "source": acc.source,
        "revision": acc.revision,
        "total": {"derived": acc.derived, "found": acc.found, "mismatch": acc.mismatch},
        "tree": node(acc.root, 0),
        "by_dtype": [{"dtype": r.dtype, "derived": r.derived, "found": r.found} for r in acc.dtypes],
        "excluded": [{"kind": r.kind, "tensors": r.pattern, "dtype": r.dtype, "derived_tensors": r.derived_tensors,
                      "found_tensors": r.found_tensors, "derived_elements": r.derived_elements,
                      "found_elements": r.found_elements} for r in acc.excluded],
        "activated": {
            "per_token": a.per_token, "always_active": a.always_active, "routed_total": a.routed_total,
            "routed_active": a.routed_active, "experts_per_token": a.top_k, "routed_experts": a.experts,
            "moe_blocks": a.moe_blocks, "per_expert": a.per_expert, "mtp_excluded": a.mtp_excluded,
            "without_embedding": a.without_embedding,
            "definition": "all parameters outside the routed experts (embedding and lm_head in full), plus "
                          "num_experts_per_tok of n_routed_experts experts per MoE block; MTP layers excluded",
        },
        "published": [{"source": c.source, "total": c.published_total, "activated": c.published_activated,
                       "total_ratio": c.total_ratio, "activated_ratio": c.activated_ratio,
                       "total_consistent": c.total_consistent, "activated_consistent": c.activated_consistent}
                      for c in acc.comparisons],
    }
