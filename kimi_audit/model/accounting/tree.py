"""The parameter accounting tree's types: nodes, their formulas' factors, stored and found tensors.

`Node` is one component of the tree (a leaf holds the tensors of one instance as `Part`s, multiplied
by its instance factors), `Accounting` the whole result. `tensor_slot` and `collapse` map checkpoint
tensor names to the tree's (block, component) slots and back to compact patterns. The tree is built
by builder.py and model.py; account.py is the entry point; the summary rows are in summary.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from kimi_audit.format.names import ranges
from kimi_audit.model.accounting.summary import Activation, Comparison, DtypeRow, ExcludedRow, MtpSummary
from kimi_audit.model.arch.registry import dialects
from kimi_audit.model.arch.spec import Factor
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import PARAMETER
from kimi_audit.model.layout import layer_block

EXPERT_RE = re.compile(r"(?<=\.experts\.)\d+\.")
DIGITS_RE = re.compile(r"\d+")

UNACCOUNTED = "unaccounted"


@dataclass(frozen=True)
class StoredPart:
    """One tensor storing one instance of a leaf, as its quantization scheme lays it out."""

    component: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    """PARAMETER, PACKED (quantized words) or SCALE (quantization metadata: never counted)."""
    logical: int
    """Parameters it counts for: its elements (PARAMETER), its module's out × in (PACKED), 0 (metadata)."""

    @property
    def numel(self) -> int:
        return max(0, math.prod(self.shape))  # an ANY_LENGTH dimension (model.quant.scheme): decided by the values


@dataclass(frozen=True)
class Part:
    """One counted tensor of one instance of a leaf: e.g. the weight of a q_a_proj. Its parameters are the
    product of its factors (out × in for a Linear module, however the weight is stored)."""

    label: str
    component: str
    """Tensor name relative to the layer prefix (`self_attn.q_a_proj.weight`), or the full name outside layers."""
    factors: tuple[Factor, ...]
    dtype: str
    """The stored tensor's dtype (I32 for INT4 packed words)."""
    kind: str = PARAMETER
    shape: tuple[int, ...] | None = None
    """The stored tensor's shape; None: the factors' values (a tensor holding its parameters as they are)."""
    param_dtype: str = ""
    """The parameters' dtype where the tensor packs them into another (`INT4` in I32 words); "": `dtype`."""
    scheme: str = ""
    """How its Linear module is stored (model.quant's `Scheme.describe()`); "" outside Linear modules."""
    meta: tuple[StoredPart, ...] = ()
    """Quantization metadata stored beside it (FP8 block scales, INT4 group scales, weight_shape)."""

    @property
    def numel(self) -> int:
        n = 1
        for f in self.factors:
            n *= f.value
        return n

    @property
    def logical_dtype(self) -> str:
        return self.param_dtype or self.dtype

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return self.shape if self.shape is not None else tuple(f.value for f in self.factors)

    def stored(self) -> tuple[StoredPart, ...]:
        """Every tensor storing one instance of this part: itself, then its metadata."""
        return (StoredPart(self.component, self.dtype, self.stored_shape, self.kind, self.numel),) + self.meta

    def calculation(self) -> str:
        return " × ".join(f.text() for f in self.factors)


class FoundTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str
    logical: int = -1
    """Parameters it counts for where that is not its elements (INT4 packed words: out × in); -1: numel."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def parameters(self) -> int:
        return self.numel if self.logical < 0 else self.logical


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
    children: tuple[Node, ...] = ()
    tensors: tuple[FoundTensor, ...] = ()
    """Leaves: the checkpoint tensors counted in `found`."""
    scales: tuple[FoundTensor, ...] = ()
    """Leaves: the quantization metadata found beside those tensors (FP8 block scales, INT4 group scales and
    weight_shape): listed, excluded from every count."""
    config_keys: tuple[str, ...] = ()
    dtype_ok: bool = True
    """Leaves: every found tensor has the dtype the config implies."""
    layers: tuple[int, ...] = ()
    """Decoder layers this node's instances live in (empty outside the blocks)."""
    by_dtype: tuple[DtypeRow, ...] = ()
    """Parameters by their dtype (derived, found): INT4 for packed words, metadata never counted."""
    stored: tuple[DtypeRow, ...] = ()
    """Stored elements by tensor dtype (derived, found), quantization metadata included."""
    note: str = ""
    """A remark shown with the node (e.g. an MTP table duplicating the main embedding)."""
    absent: bool = False
    """Declared by the config, not one tensor of it stored (the MTP layers transformers never saves): one
    warning (MTP_ABSENT), neither a mismatch nor part of the totals."""

    @property
    def schemes(self) -> tuple[str, ...]:
        """How the node's Linear modules are stored (model.quant descriptions), each once."""
        return tuple(dict.fromkeys(p.scheme for p in self.parts if p.scheme))

    @property
    def stored_parts(self) -> tuple[StoredPart, ...]:
        """Leaves: every tensor storing one instance, metadata included."""
        return tuple(s for p in self.parts for s in p.stored())

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
        if self.children or self.absent:
            return False
        return self.derived != self.found or self.derived_tensors != self.found_tensors or not self.dtype_ok

    @property
    def mismatch(self) -> bool:
        return not self.absent and (self.own_mismatch or any(c.mismatch for c in self.children))

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

    def walk(self, depth: int = 0) -> Iterable[tuple[int, Node]]:
        yield depth, self
        for c in self.children:
            yield from c.walk(depth + 1)

    def leaves(self) -> Iterable[Node]:
        for _, n in self.walk():
            if n.is_leaf:
                yield n


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
    stored: tuple[DtypeRow, ...] = ()
    """Stored elements by tensor dtype (derived, found), every tensor: parameters, packed words,
    quantization metadata and buffers."""
    mtp: MtpSummary | None = None
    """The MTP layers against the main model; None when the config has none."""
    incomplete: str | None = None
    """Why the found total is not the checkpoint's (quantization_config names a format no scheme implements: its
    Linear modules' tensors are not counted); None when it is."""

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
    """(block kind or None, component with expert index removed, layer or None) of a tensor name: a layer's
    when it starts with the config's layer prefix (`model.layers.N.`, DeepSeek-V4's `layers.N.`,
    `language_model.model.layers.N.`) or a dialect's spelling of it.

    `blocks` (layer -> block kind) may be passed to save recomputing it per tensor."""
    for prefix in layer_prefixes(cfg):
        index, dot, rest = name[len(prefix):].partition(".") if name.startswith(prefix) else ("", "", "")
        if dot and index.isascii() and index.isdigit() and rest:
            break
    else:
        return None, name, None
    layer = int(index)
    if blocks is not None:
        block = blocks[layer] if layer < len(blocks) else UNACCOUNTED
    else:
        block = layer_block(cfg, layer) if layer < cfg.total_layers else UNACCOUNTED
    if ".experts." in rest:
        rest = EXPERT_RE.sub("", rest, count=1)
    return block, rest, layer


def layer_prefixes(cfg: ModelConfig) -> tuple[str, ...]:
    """The config's layer prefix, then each of its dialects' spelling of it."""
    probe = f"{cfg.layer_prefix}0."
    spelled = (d.rename(probe) for d in dialects(cfg))
    return tuple(dict.fromkeys([cfg.layer_prefix, *(p[:-2] for p in spelled if p.endswith(".0."))]))


def collapse(names: Iterable[str]) -> list[str]:
    """Names with their varying numbers shown as ranges: `model.layers.{1-60}.mlp.gate.weight`; zero-padded
    numbers keep their padding (`model-{00001-00046}-of-000046.safetensors`)."""
    groups: dict[str, list[list[str]]] = {}
    order: list[str] = []
    for n in names:
        template = DIGITS_RE.sub("#", n)
        if template not in groups:
            groups[template] = []
            order.append(template)
        groups[template].append(DIGITS_RE.findall(n))
    out = []
    for template in order:
        rows = groups[template]
        pieces = template.split("#")
        s = pieces[0]
        for i, rest in enumerate(pieces[1:]):
            col = [r[i] for r in rows]
            width = max(map(len, col)) if any(len(d) > 1 and d[0] == "0" for d in col) else 0
            r = ranges([int(d) for d in col])
            if width:
                r = "-".join(",".join(x.zfill(width) for x in part.split(",")) for part in r.split("-"))
            s += r if "," not in r and "-" not in r else "{" + r + "}"
            s += rest
        out.append(s)
    return out
