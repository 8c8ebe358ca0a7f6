"""The accounting tree: a walk over the architecture's description (model.arch), the same one the layout reads.

Each block kind present becomes a node (dense blocks and MoE blocks under "N transformer blocks", the
multi-token-prediction layers apart: their embedding and output head noted as copies of the main ones), each
description group a group, each leaf a leaf made by builder.Builder from the description's factors: Linear
modules through the quantization plan, parameters as they are stored. A repeated group (the routed experts)
multiplies its counts instead of listing its instances. Buffers are listed apart (Builder.excluded).
"""

from __future__ import annotations

from dataclasses import replace

from kimi_audit.format.names import ranges
from kimi_audit.model.accounting.builder import Builder, Mult
from kimi_audit.model.accounting.summary import sum_rows
from kimi_audit.model.accounting.tree import Node, Part, StoredPart
from kimi_audit.model.arch.registry import block_titles, describe
from kimi_audit.model.arch.spec import (
    ATTENTION_BIAS_KEYS,
    BLOCK_KEYS,
    DENSE,
    DTYPE_KEYS,
    MOE,
    MTP,
    QUANT_KEYS,
    Buffer,
    Group,
    Linear,
    is_mtp,
)
from kimi_audit.model.arch.spec import Node as Described
from kimi_audit.model.kinds import SCALE

BLOCK_LABEL = {DENSE: ("dense block", "dense blocks"), MOE: ("MoE block", "MoE blocks"),
               MTP: ("MTP layer", "MTP layers")}
MTP_ROLE = "mtp_blocks"
"""The role of each multi-token-prediction block kind's node (a child of the root, keyed by its kind)."""


def block_label(block: str) -> tuple[str, str]:
    """(one, many) of a block kind: BLOCK_LABEL's, or its architecture's words for it (`moe_hash_csa`:
    "hash-routed MoE CSA block")."""
    if block in BLOCK_LABEL:
        return BLOCK_LABEL[block]
    words = block_titles().get(block, block)
    return f"{words} block", f"{words} blocks"


class ModelBuilder(Builder):
    """The whole tree: `model()` is its root."""

    def block_mult(self, block: str) -> Mult:
        n = len(self.layers_of.get(block, ()))
        one, many = block_label(block)
        return ((n, one if n == 1 else many),)

    def block_keys(self, block: str | None) -> list[str]:
        if block is None:
            return []
        if is_mtp(block):
            return ["num_nextn_predict_layers"]
        keys = ["num_hidden_layers"]
        if self.cfg.layer_kinds:
            return keys + ["layer_types", "mlp_layer_types"]
        if self.cfg.n_routed_experts is not None:
            keys += ["first_k_dense_replace", "moe_layer_freq", "n_routed_experts"]
        return keys

    def keys(self, keys: tuple[str, ...], block: str | None) -> list[str]:
        """The leaf's config keys, the description's $-groups expanded."""
        quant = ["quantization_config"] if self.cfg.quant is not None else []
        groups = {BLOCK_KEYS: self.block_keys(block), DTYPE_KEYS: ["torch_dtype", *quant], QUANT_KEYS: quant,
                  ATTENTION_BIAS_KEYS: ["attention_bias"] if self.cfg.attention_bias else []}
        return [k for key in keys for k in groups.get(key, [key])]

    def node(self, d: Described, prefix: str, block: str | None, mult: Mult) -> Node | None:
        if isinstance(d, Buffer):
            return None
        key = f"{prefix}.{d.key}" if prefix else d.key
        if isinstance(d, Group):
            if d.repeat is not None:
                mult = ((d.repeat.value, d.repeat.label),) + mult
            return self.group(key, d.name or d.key, d.title, [self.node(c, key, block, mult) for c in d.children],
                              mult, role=d.role, note=d.note)
        parts: list[Part] = []
        for t in d.tensors:
            if isinstance(t, Linear):
                parts += self.linear_parts(block, t.module, list(t.out), list(t.inp), t.bias, list(t.stack))
            elif t.scale and parts:  # the metadata of the Param before it
                meta = StoredPart(t.component, t.dtype, tuple(f.value for f in t.shape), SCALE, 0)
                parts[-1] = replace(parts[-1], meta=(*parts[-1].meta, meta))
            else:
                parts.append(Part(t.label, t.component, t.shape, t.dtype))
        return self.leaf(key, d.name, d.title, d.role, block, parts, mult, self.keys(d.keys, block), d.note)

    def block(self, block: str, nodes: tuple[Described, ...]) -> Node | None:
        layers = self.layers_of.get(block)
        if not layers:
            return None
        mult = self.block_mult(block)
        pre = block if is_mtp(block) else f"blocks.{block}"
        children = [self.node(d, pre, block, mult) for d in nodes]
        if is_mtp(block):
            words = "" if block == MTP else f", {block_titles().get(block, block)}"
            title = f"Multi-token prediction (layer{'s' if len(layers) > 1 else ''} {ranges(layers)}{words})"
            note = "Not in next-token inference: excluded from the activated parameters."
            node = self.group(pre, block, title, children, mult, role=MTP_ROLE, note=note)
            if node.found_tensors == 0 and self.params:  # declared, none stored (as transformers writes it)
                return absent(node, "Declared by config.json (num_nextn_predict_layers), not one tensor stored: "
                                    "left out of the totals.")
            return node
        return self.group(pre, block, f"{mult[0][0]} {mult[0][1]}", children, mult, role=f"{block}_blocks")

    def model(self) -> Node:
        c = self.cfg
        tree = describe(c)
        children: list[Node | None] = [self.node(d, "", None, ()) for d in tree.before]
        children.append(self.group("blocks", "blocks", f"{c.num_hidden_layers} transformer blocks",
                                   [self.block(b, nodes) for b, nodes in tree.blocks.items() if not is_mtp(b)]))
        children += [self.block(b, nodes) for b, nodes in tree.blocks.items() if is_mtp(b)]
        children += [self.node(d, "", None, ()) for d in tree.after]
        children.append(self.unaccounted())
        root = self.group("model", "model", f"{c.model_type} model", children, role="model")
        counted = [n for n in root.children if not n.absent]
        return replace(root, derived=sum(n.derived for n in counted),
                       derived_tensors=sum(n.derived_tensors for n in counted),
                       by_dtype=sum_rows(r for n in counted for r in n.by_dtype),
                       stored=sum_rows(r for n in counted for r in n.stored))


def absent(node: Node, note: str = "") -> Node:
    """The node and everything under it declared but not stored (Node.absent)."""
    return replace(node, absent=True, note=note or node.note, children=tuple(absent(c) for c in node.children))

