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

from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any, Protocol

from kimi_audit.findings import Finding
from kimi_audit.format.gguf_keys import KeyType
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.quant.scheme import DEEPSEEK_RELEASE, ReleaseQuant

DENSE = "dense"
MOE = "moe"
MTP = "mtp"


def is_mtp(kind: str) -> bool:
    """A multi-token-prediction block kind: MTP, or an architecture's own MTP stage kind (`mtp_...`: the
    DSpark stages of DeepSeek-V4-Flash-0731, whose first and last stages hold parts the others do not)."""
    return kind == MTP or kind.startswith(MTP + "_")

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
    stack: tuple[Factor, ...] = ()
    """Leading dimensions of a module stored as one tensor per stack (mlx-lm's `switch_mlp` experts [E, out, in],
    its per-head `embed_q` [heads, out, in]): each stored tensor's shape starts with them and counts for their
    product times out x in."""


@dataclass(frozen=True)
class Param:
    """A parameter tensor stored as it is (a norm's gain, an embedding table, a router's weight)."""

    label: str
    component: str
    shape: tuple[Factor, ...]
    dtype: str
    scale: bool = False
    """Quantization metadata, not a parameter: the scales of the Param listed just before it in its leaf
    (DeepSeek-V4.1's Engram table and its per-row F8_E8M0 scales)."""


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
    named relative to `{ModelConfig.layer_prefix}{i}.`."""
    after: tuple[Node, ...]


def w123_mlp(key: str, title: str, role: str, module: str, width: Factor, inter: Factor, keys: tuple[str, ...],
             repeat: Factor | None = None) -> Group:
    """A gated MLP in DeepSeek's native names (DeepSeek-V4, Kimi-Linear's experts, Mistral's releases): `w1`
    (gate) and `w3` (up) [inter, width], `w2` (down) [width, inter]; repeated (the routed experts), indexed after
    `experts.`."""
    rows = (("w1", "Gate projection", (inter,), (width,)), ("w2", "Down projection", (width,), (inter,)),
            ("w3", "Up projection", (inter,), (width,)))
    return Group(key, title, tuple(Leaf(p, p, t, f"{role}_{p}", (Linear(f"{module}.{p}", out, inp),), keys)
                                   for p, t, out, inp in rows),
                 repeat=repeat, index_at="experts." if repeat is not None else "")


def prefixed(node: Node, prefix: str) -> Node:
    """The node with every full name under `prefix` (a text model nested in a multimodal one:
    `model.embed_tokens.weight` -> `language_model.model.embed_tokens.weight`)."""
    if isinstance(node, Group):
        return replace(node, children=tuple(prefixed(c, prefix) for c in node.children))
    if isinstance(node, Buffer):
        return replace(node, component=prefix + node.component)
    return replace(node, tensors=tuple(
        replace(t, module=prefix + t.module) if isinstance(t, Linear) else replace(t, component=prefix + t.component)
        for t in node.tensors))


@dataclass(frozen=True)
class Dialect:
    """Names another writer gives the same tree (transformers 5.x re-saving a release): whole-name prefixes
    rewritten, canonical -> dialect. A checkpoint entirely in one dialect is audited against the same tree
    renamed, and the dialect named once (model.dialect)."""

    name: str
    renames: tuple[tuple[str, str], ...]
    """(canonical prefix, the dialect's prefix), tried in order, the first that matches applies."""
    note: str = ""

    def rename(self, name: str) -> str:
        for canonical, spelled in self.renames:
            if name.startswith(canonical):
                return spelled + name[len(canonical):]
        return name

    def canonical(self, name: str) -> str:
        """A name in the dialect's spelling as the release spells it (rename's inverse)."""
        for canonical, spelled in self.renames:
            if name.startswith(spelled):
                return canonical + name[len(spelled):]
        return name


def no_dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    return ()


GgufMetadata = Mapping[str, Any]
"""A GGUF set's metadata (part 1's key-values; format.gguf)."""
StoredShapes = Mapping[str, tuple[int, ...]]
"""Every tensor a GGUF set stores -> its shape (numpy order)."""


class ReleaseReader(Protocol):
    """A release's tensors as a GGUF converter reads them (float32, dequantized as the release's format says),
    by row ranges: `audit --against --values` (checks.against) compares a GGUF set with them in bands."""

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's (dequantized) shape."""

    def rows(self, name: str, start: int, stop: int) -> Any:
        """Rows [start, stop) of its first dimension, float32 (numpy)."""

    def bands(self, name: str) -> Iterator[Any]:
        """All its rows in order, in bands of bounded size, float32 (numpy)."""


@dataclass(frozen=True)
class GgufProjector:
    """An architecture's vision tower and projector as llama.cpp's converter writes them with `--mmproj`
    (conversion/base.py MmprojModel: general.architecture `clip`, general.type `mmproj`, the `clip.vision.*`
    keys) and tools/mtmd/clip.cpp loads them: its projector type, its names, and how its keys read back into the
    architecture's config.json."""

    projector_types: tuple[str, ...]
    """The `clip.projector_type` values it answers to."""
    config: Callable[[GgufMetadata, Mapping[str, Any], StoredShapes], dict[str, Any]]
    """(the mmproj file's metadata, the paired text model's config.json, its stored names and shapes) -> the
    architecture's config.json."""
    names: Callable[[str], str | None]
    """A release tensor's name -> its name in the mmproj file; None for a tensor the projector does not hold."""
    output: str
    """The tensor whose rows are the projector's output width (clip.cpp clip_n_mmproj_embd: its ne[1])."""
    key_types: Mapping[str, KeyType] = field(default_factory=dict)
    """The `clip.` keys clip.cpp reads for this projector type (beyond every vision projector's:
    model.gguf_beside), and the GGUF types it reads them with."""
    refuses: Callable[[GgufMetadata], list[tuple[str, str]]] = lambda kv: []
    """(key, why) for each of the projector type's values clip.cpp refuses or asserts against."""
    release_values: Callable[[str, ReleaseReader, Mapping[str, Any]], tuple[tuple[int, ...], Iterator[Any]] | str
                             | None] = lambda name, read, cfg: None
    """(an mmproj tensor's name, the release's reader, the release's config.json) -> the values the converter
    writes there, as GgufDialect.release_values; a string where the converter's transform is not modelled (why);
    None for a name the projector does not write from the release."""
    repeated: Callable[[Mapping[str, Any]], int] = lambda cfg: 0
    """(the release's config.json) -> the elements of the text model the converter writes into the mmproj again
    (Pixtral's [IMG_BREAK] row of the token embedding), which `audit --against` adds to the release's total where
    the mmproj is read beside the model."""


@dataclass(frozen=True)
class GgufDialect:
    """llama.cpp's GGUF spelling of an architecture: the `general.architecture` names its converter writes, how
    its metadata keys read back into config.json's (as llama.cpp's loader derives the hyperparameters from them),
    and its tensor names, one more dialect of the same tree (the tree's `llama.cpp` writer variant: what the
    converter stacks, splits or drops)."""

    archs: tuple[str, ...]
    config: Callable[[GgufMetadata, StoredShapes], tuple[dict[str, Any], list[Finding]]]
    """The metadata (and the stored names and shapes, where llama.cpp's loader decides by them: a tied output,
    the pre-MLA `attn_kv_b`) -> a config.json its `read` takes, and what is wrong with the metadata."""
    metadata: Callable[[Mapping[str, Any]], dict[str, Any]]
    """A config.json -> the architecture's metadata keys the converter writes from it (`audit --against`)."""
    top: tuple[tuple[str, str], ...]
    """(the tree's full name, the GGUF name) of the tensors outside the layers."""
    layer: tuple[tuple[str, str], ...]
    """(the tree's name relative to a layer, the GGUF name relative to `blk.N.`)."""
    converted: Callable[[str, int, Container[str]], tuple[str, ...]]
    """(a release tensor's name, the main layers, the GGUF's names) -> the GGUF tensors the converter writes it
    into; () for what it drops (scales, buffers, MTP layers)."""
    release_values: Callable[[str, ReleaseReader, int, int, int], tuple[tuple[int, ...], Iterator[Any]] | None]
    """(a GGUF tensor's name, a reader of the release's dequantized tensors, experts, heads, nope head dim) ->
    the shape of the float32 values the converter writes there and those values in pieces (numpy arrays whose
    last dimension is the tensor's, in the tensor's order: each read by row bands, memory bounded whatever the
    tensor's size), None where the release has no source of it."""
    layer_prefix: str = "model.layers."
    key_types: Mapping[str, KeyType] = field(default_factory=dict)
    """The architecture's metadata keys (without the `ARCH.` prefix) -> the GGUF value types llama.cpp's loader
    reads each with (its typed getters refuse any other: format.gguf_keys)."""
    required: tuple[str, ...] = ()
    """The keys (without the prefix) llama.cpp's loader cannot load the model without ("key not found in model")."""

    converts: Callable[[Mapping[str, Any]], bool] = lambda cfg: True
    """Whether llama.cpp's converter writes a release of this config.json as this dialect (Mistral Small 4: only in
    Mistral's own format, `--mistral-format`); `audit --against` holds no other to the GGUF."""
    text_of: str = ""
    """A wrapper's dialect (a multimodal model whose converter writes its text model alone): the model_type whose
    own dialect reads such a file back. Reading a GGUF goes to that architecture; this dialect says how the
    wrapper's release converts (`audit --against`)."""
    projector: GgufProjector | None = None
    """The architecture's vision tower as llama.cpp's `--mmproj` converter writes it (an `mmproj-*.gguf` file)."""
    written: Callable[[str, int, ModelConfig], int] | None = None
    """(a release tensor's name as `converted` takes it, its elements, the release's config) -> the elements the
    converter writes of it, where it writes fewer than it reads (Kimi K3's A_log cut to its heads): what `audit
    --against` totals; None: every element."""

    def rename(self, name: str) -> str:
        """A tree name in GGUF's spelling (unchanged where the table has none)."""
        table = self._table
        if name.startswith(self.layer_prefix):
            number, _, rest = name[len(self.layer_prefix):].partition(".")
            spelled = table.get(rest)
            return name if spelled is None else f"blk.{number}.{spelled}"
        return table.get(name, name)

    @cached_property
    def _table(self) -> dict[str, str]:
        return dict(self.top + self.layer)


@dataclass(frozen=True, eq=False)
class Architecture:
    """Everything this tool knows of one architecture, in one record (llama.cpp's gguf-py keeps one table per
    architecture; this is that table, typed). Every stage reads it through model.arch.registry: the config
    reader, the layout and the accounting (its module tree), explain (its words), the checks (its routers,
    buffers, dialects and quantization conventions), the values pass (its value roles) and the replica."""

    name: str
    """What the family calls it (`DeepSeek-V4`)."""
    model_types: tuple[str, ...]
    """The config.json `model_type`s it answers to."""
    read: Callable[[dict[str, Any]], ModelConfig]
    """config.json -> ModelConfig, through model.config_fields' readers (the same bounds and errors for all)."""
    describe: Callable[[ModelConfig], ModelTree]
    """Its module tree, in the release's names."""
    class_names: tuple[str, ...] = ()
    """config.json `architectures` entries that name it where `model_type` is absent."""
    nests_text: bool = False
    """A multimodal config whose text model sits in `text_config` (read as this architecture when neither
    model_type nor architectures says)."""
    dialects: Callable[[ModelConfig], tuple[Dialect, ...]] = no_dialects
    """Other writers' spellings of the tree (transformers' save_pretrained)."""
    writer_trees: tuple[str, ...] = ()
    """Other writers' module trees `describe` knows (a format's Scheme.tree: `mlx-lm`); a checkpoint in a
    format whose tree it does not know is QUANT_UNSUPPORTED (format checks only)."""
    titles: Mapping[str, str] = field(default_factory=dict)
    """model_type -> the product's name where it differs from `name` (`kimi_k2` -> Kimi K2)."""
    undescribed: Mapping[str, str] = field(default_factory=dict)
    """Names its release stores that the tree leaves out: RE2 pattern -> what they are."""
    quant: ReleaseQuant = DEEPSEEK_RELEASE
    """How its release writes DeepSeek's FP8 (scale suffix and dtype, blocks, FP4 experts)."""
    float32_routers: tuple[str, ...] = ()
    """Components (relative to a layer) transformers keeps in float32 whatever the dtype
    (_keep_in_fp32_modules_strict): a writer's BF16/F32 variance there is ROUTER_DTYPE info."""
    buffered: tuple[str, ...] = ()
    """Parameters transformers registers as buffers (its save's total_parameters leaves them out)."""
    value_roles: tuple[tuple[str, str], ...] = ()
    """Name suffixes of its small tensors and their value role (model.kinds: ROUTER_BIAS, ROTARY_BUFFER):
    the values pass checks them (model.roles)."""
    stages_from_files: Callable[[ModelConfig], bool] = lambda cfg: False
    """Whether the files decide how many MTP stages there are when they hold more than config.json declares
    (DeepSeek-V4-Flash-0731's DSpark stages; model.mtp_stages)."""
    block_titles: Mapping[str, str] = field(default_factory=dict)
    """Block kind -> what explain and the reports call it (DENSE, MOE and MTP have the family's words)."""
    gguf: GgufDialect | None = None
    """How llama.cpp's GGUF writes it; None: no GGUF of it is described."""

    def title(self, model_type: str) -> str:
        return self.titles.get(model_type, self.name)


_REGISTERED: dict[str, Architecture] = {}
_BY_CLASS: dict[str, Architecture] = {}
REGISTERED: Mapping[str, Architecture] = MappingProxyType(_REGISTERED)
"""model_type -> its Architecture (read-only; model.arch.registry loads every module of model.arch first)."""
BY_CLASS: Mapping[str, Architecture] = MappingProxyType(_BY_CLASS)


def register(arch: Architecture) -> Architecture:
    """Adds an architecture; a model_type or class name already registered is refused (ValueError)."""
    taken = [t for t in arch.model_types if t in _REGISTERED] + [c for c in arch.class_names if c in _BY_CLASS]
    if taken:
        raise ValueError(f"architecture {arch.name}: {', '.join(taken)} already registered")
    _REGISTERED.update(dict.fromkeys(arch.model_types, arch))
    _BY_CLASS.update(dict.fromkeys(arch.class_names, arch))
    return arch


def unregister(arch: Architecture) -> None:
    """Takes an architecture out (a plug-in or a test that registered it)."""
    for table, keys in ((_REGISTERED, arch.model_types), (_BY_CLASS, arch.class_names)):
        for k in keys:
            if table.get(k) is arch:
                del table[k]
