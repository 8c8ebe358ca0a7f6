"""The types an architecture is described with: a tree of groups and leaves, each leaf holding the tensors of
one component (a Linear module stored by the quantization plan, plain parameters), plus stored buffers.

The description is the one place a module tree is written. Two walks read it:
- model.layout: every tensor name, dtype, shape and kind, in checkpoint order (a repeated group, such as the
  routed experts, is stamped out once per index: `mlp.experts.{i}.gate_proj`);
- model.accounting.model: the accounting tree (a repeated group multiplies its counts instead), whose titles,
  roles and config keys are the description's.

Config keys of a leaf may name groups the walk expands from the config: BLOCK_KEYS (the keys that decide the
block kind's layers), DTYPE_KEYS (`torch_dtype`, and `quantization_config` when the config has one),
QUANT_KEYS (`quantization_config` alone, when present) and ATTENTION_BIAS_KEYS (`attention_bias` when set).
"""

from __future__ import annotations

from dataclasses import dataclass

DENSE = "dense"
MOE = "moe"
MTP = "mtp"

BLOCK_KEYS = "$block"
DTYPE_KEYS = "$dtype"
QUANT_KEYS = "$quant"
ATTENTION_BIAS_KEYS = "$attention_bias"


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


def product(factors: tuple[Factor, ...]) -> int:
    n = 1
    for f in factors:
        n *= f.value
    return n


@dataclass(frozen=True)
class Linear:
    """A Linear module's weight [out, in], stored as the quantization plan's scheme for it says, and its bias."""

    module: str
    """Relative to the layer prefix (`self_attn.q_a_proj`), or the full name outside layers (`lm_head`)."""
    out: tuple[Factor, ...]
    inp: tuple[Factor, ...]
    bias: bool = False


@dataclass(frozen=True)
class Param:
    """A parameter tensor stored as it is (a norm's gain, an embedding table, a router's weight)."""

    label: str
    component: str
    shape: tuple[Factor, ...]
    dtype: str


@dataclass(frozen=True)
class Leaf:
    """One component: the tensors of one instance."""

    key: str
    """Its segment of the accounting tree's dotted key (`q_a_proj`, `shared_head_norm`)."""
    name: str
    title: str
    role: str
    """What it is (the explain catalogue's key, model.explain_docs)."""
    tensors: tuple[Linear | Param, ...]
    keys: tuple[str, ...] = ()
    """Config keys it comes from beside its factors' (the $-groups above expanded by the walk)."""
    note: str = ""


@dataclass(frozen=True)
class Buffer:
    """A stored tensor that is not a parameter (`rotary_emb.inv_freq`): in the layout, listed apart in the
    accounting."""

    component: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    children: tuple[Node, ...]
    name: str = ""
    """Its short name ("" : the key)."""
    repeat: Factor | None = None
    """A group stored `repeat.value` times (the routed experts): its modules carry an index after `index_at`."""
    index_at: str = ""
    role: str = "group"
    note: str = ""


Node = Group | Leaf | Buffer


def indexed(name: str, index_at: str, i: int) -> str:
    """`mlp.experts.gate_proj` -> `mlp.experts.{i}.gate_proj` (index_at `experts.`)."""
    return name.replace(index_at, f"{index_at}{i}.", 1)


@dataclass(frozen=True)
class ModelTree:
    """A config's module tree: the tensors before the decoder layers, each block kind's layer, and after."""

    before: tuple[Node, ...]
    blocks: dict[str, tuple[Node, ...]]
    """Block kind (DENSE, MOE, MTP, or the architecture's own: ModelConfig.layer_kinds) -> one layer's nodes,
    named relative to `{layer_prefix}{i}.`."""
    after: tuple[Node, ...]
    layer_prefix: str = "model.layers."
    """What precedes a decoder layer's index in its tensor names (DeepSeek-V4's release: `layers.`)."""
