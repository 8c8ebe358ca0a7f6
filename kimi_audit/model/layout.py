"""Every tensor a checkpoint should hold, derived from its config: a walk over its architecture's module
tree (model.arch), in checkpoint order (the tensors before the layers, each decoder layer by its block kind,
the tensors after), each Linear module stored as the quantization plan's scheme for it says (model.quant).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from itertools import compress, repeat
from operator import sub
from typing import Any, NamedTuple

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.model.arch.registry import describe
from kimi_audit.model.arch.spec import DENSE, MOE, MTP, Buffer, Group, Node, Param, indexed, is_mtp, product
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import BUFFER, PARAMETER, SCALE
from kimi_audit.model.quant.scheme import ANY_LENGTH, Scheme, Unquantized


class ExpectedTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    """PARAMETER, PACKED (quantized weight words), SCALE (quantization metadata) or BUFFER (stored, not a
    parameter)."""
    component: str
    """The name with layer and expert indices taken out, e.g. `self_attn.q_a_layernorm.weight`."""
    layer: int | None
    block: str | None
    """DENSE, MOE or MTP for tensors inside a decoder layer."""
    nbytes: int | None
    """The payload bytes it occupies (numel x dtype bits / 8); None for a dtype of unknown width."""
    position: int
    """Its place in checkpoint order (an FP8 scale's weight is at position - 1)."""
    logical: int = 0
    """Parameters it counts for: numel of a PARAMETER, out x in of PACKED words, 0 for metadata and buffers."""
    scheme: str = ""
    """The quantization scheme (model.quant) of the Linear module it stores, "" outside Linear modules."""
    owner: int = 0
    """For quantization metadata: how many positions back the tensor it describes is (an FP8 scale's
    weight: 1); 0 for everything else."""

    @property
    def numel(self) -> int:
        """Its elements (0 where a dimension is ANY_LENGTH: decided by the values)."""
        return max(0, math.prod(self.shape))


def payload_bytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    """None for a dtype of unknown width, or a shape with an ANY_LENGTH dimension."""
    bits = DTYPE_BITS.get(dtype)
    return None if bits is None or min(shape, default=0) < 0 else (math.prod(shape) * bits + 7) // 8


def shape_fits(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """The stored shape is the expected one (an ANY_LENGTH dimension fits any length)."""
    return shape == expected or (len(shape) == len(expected) and all(
        e == ANY_LENGTH or a == e for a, e in zip(shape, expected)))


def _tensor(name: str, dtype: str, shape: tuple[int, ...], kind: str, component: str,
            layer: int | None, block: str | None, logical: int | None = None, scheme: str = "",
            owner: int = 0) -> ExpectedTensor:
    if logical is None:
        logical = math.prod(shape) if kind == PARAMETER else 0
    return ExpectedTensor(name, dtype, shape, kind, component, layer, block, payload_bytes(dtype, shape), -1,
                          logical, scheme, owner)


def scheme_of(cfg: ModelConfig, module: str) -> Scheme:
    """The scheme storing the Linear module of that full name."""
    return cfg.quant.scheme_for(module) if cfg.quant is not None else Unquantized(cfg.dtype)


class Spec(NamedTuple):
    """What expected tensors share apart from their name and layer (all experts' gate_proj weights of
    one block kind share one Spec)."""

    dtype: str
    shape: tuple[int, ...]
    kind: str
    component: str
    block: str | None
    nbytes: int | None
    logical: int
    scheme: str
    owner: int


class ExpectedLayout(Mapping[str, ExpectedTensor]):
    """Every expected tensor, in checkpoint order, as columns: its name, its layer and its Spec.

    A mapping name -> ExpectedTensor (entries are made when asked for); the checks read the columns
    (`position`, `spec_of`, `specs`) so that a 139,644-tensor layout costs a list of names and one
    dict, not an object per tensor.
    """

    __slots__ = ("_entries", "layer_of", "meta_at", "meta_owner", "names", "position", "spec_of", "specs")

    def __init__(self, names: list[str], spec_of: list[int], specs: list[Spec], layer_of: list[int | None],
                 meta_at: list[int] | None = None, meta_owner: list[int] | None = None):
        self.names = names
        self.position: dict[str, int] = dict(zip(names, range(len(names))))
        """Name -> its place in checkpoint order (a scale's weight is at position - 1)."""
        self.spec_of = spec_of
        """Position -> index into `specs`."""
        self.specs = specs
        self.layer_of = layer_of
        if meta_at is None or meta_owner is None:
            offsets = [self.specs[i].owner for i in spec_of]
            meta_at = list(compress(range(len(names)), offsets))
            meta_owner = list(map(sub, meta_at, compress(offsets, offsets)))
        self.meta_at = meta_at
        """Positions of the quantization-metadata tensors (FP8 scales, INT4 group scales and shapes)."""
        self.meta_owner = meta_owner
        """The position of the tensor each of `meta_at` describes (it follows that tensor in its module)."""
        self._entries: list[ExpectedTensor] | None = None

    def entry(self, position: int) -> ExpectedTensor:
        s = self.specs[self.spec_of[position]]
        return ExpectedTensor(self.names[position], s.dtype, s.shape, s.kind, s.component,
                              self.layer_of[position], s.block, s.nbytes, position, s.logical, s.scheme, s.owner)

    @property
    def specs_by_name(self) -> SpecsByName:
        """The same layout as name -> Spec: what a lookup of dtype, shape and size needs, with no
        ExpectedTensor made per name (sizing 61 remote header reads looks up all 139,644 names)."""
        return SpecsByName(self)

    def entries(self) -> list[ExpectedTensor]:
        """Every entry, in order (made once, for callers that visit them all)."""
        if self._entries is None:
            self._entries = list(map(self.entry, range(len(self.names))))
        return self._entries

    def __getitem__(self, name: str) -> ExpectedTensor:
        return self.entry(self.position[name])

    def get(self, name: str, default: Any = None) -> Any:
        p = self.position.get(name)
        return default if p is None else self.entry(p)

    def __contains__(self, name: object) -> bool:
        return name in self.position

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def values(self) -> Any:  # a list: callers index and iterate it more than once
        return self.entries()

    def items(self) -> Any:
        return list(zip(self.names, self.entries()))


class SpecsByName(Mapping[str, Spec]):
    """An ExpectedLayout seen as name -> Spec (ExpectedLayout.specs_by_name)."""

    __slots__ = ("_layout",)

    def __init__(self, layout: ExpectedLayout):
        self._layout = layout

    def __getitem__(self, name: str) -> Spec:
        layout = self._layout
        return layout.specs[layout.spec_of[layout.position[name]]]

    def get(self, name: str, default: Any = None) -> Any:
        layout = self._layout
        p = layout.position.get(name)
        return default if p is None else layout.specs[layout.spec_of[p]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.names)

    def __len__(self) -> int:
        return len(self._layout.names)


def expected_layout(cfg: ModelConfig) -> ExpectedLayout:
    """Name -> expected tensor, in checkpoint order (embedding, layers 0..N-1, MTP layers, norm, lm_head).
    A config outside the family (LAYOUT_UNSUPPORTED) has an empty layout."""
    names: list[str] = []
    spec_of: list[int] = []
    layer_of: list[int | None] = []
    spec_index: dict[Spec, int] = {}
    if not cfg.layout_supported:
        return ExpectedLayout(names, spec_of, [], layer_of)

    def spec(t: ExpectedTensor) -> int:
        key = Spec(t.dtype, t.shape, t.kind, t.component, t.block, t.nbytes, t.logical, t.scheme, t.owner)
        return spec_index.setdefault(key, len(spec_index))

    meta_at: list[int] = []
    meta_owner: list[int] = []

    def top(t: ExpectedTensor) -> None:
        if t.owner:
            meta_at.append(len(names))
            meta_owner.append(len(names) - t.owner)
        names.append(t.name)
        spec_of.append(spec(t))
        layer_of.append(None)

    tree = describe(cfg)
    for node in tree.before:
        for t in _walk(cfg, node, None, None, []):
            top(t)
    # Layers of one block kind differ only in their index: build each kind once, then stamp it out
    # (the 139,644 names of Kimi-K2 are made by map, at C speed: no bytecode per tensor). Where the
    # quantization plan picks schemes by module name (an ignore list), each layer's choices are part of
    # the template's key.
    templates: dict[tuple[str, tuple[int, ...]], tuple[list[str], list[int], list[int], list[int]]] = {}
    modules: dict[str, list[str]] = {}
    by_name = cfg.quant is not None and cfg.quant.by_name
    for layer in range(cfg.total_layers):
        block = layer_block(cfg, layer)
        prefix = cfg.layer_name(layer)
        choices: tuple[int, ...] = ()
        if by_name and block in modules:
            assert cfg.quant is not None
            choices = cfg.quant.choices(list(map(prefix.__add__, modules[block])))
        template = templates.get((block, choices))
        if template is None:
            seen: list[str] = []
            rows = [t for node in tree.blocks[block] for t in _walk(cfg, node, layer, block, seen)]
            if cfg.quant is not None and not is_mtp(block):  # the KV cache's scales (QuantPlan.layer_tensors)
                rows += [_tensor(s.suffix, s.dtype, s.shape, s.kind, s.suffix, layer, block)
                         for s in cfg.quant.layer_tensors]
            modules.setdefault(block, seen)
            if by_name and not choices:
                assert cfg.quant is not None
                choices = cfg.quant.choices(list(map(prefix.__add__, seen)))
            meta = [k for k, t in enumerate(rows) if t.owner]
            template = templates[block, choices] = ([t.name for t in rows], [spec(t) for t in rows], meta,
                                                    [k - rows[k].owner for k in meta])
        suffixes, specs, meta_rel, owner_rel = template
        meta_at.extend(map(len(names).__add__, meta_rel))
        meta_owner.extend(map(len(names).__add__, owner_rel))
        names.extend(map(prefix.__add__, suffixes))
        spec_of.extend(specs)
        layer_of.extend(repeat(layer, len(specs)))
    for node in tree.after:
        for t in _walk(cfg, node, None, None, []):
            top(t)
    return ExpectedLayout(names, spec_of, list(spec_index), layer_of, meta_at, meta_owner)


def _linear_tensors(cfg: ModelConfig, module: str, out: int, inp: int, layer: int | None,
                    block: str | None, stack: tuple[int, ...] = ()) -> list[ExpectedTensor]:
    """The tensors storing one Linear module's weight, by the scheme the plan picks for its full name (`stack`:
    leading dimensions of a stacked module, spec.Linear.stack)."""
    full = module if layer is None else cfg.layer_name(layer) + module
    scheme = scheme_of(cfg, full)
    n = math.prod(stack)
    return [_tensor(module + s.suffix, s.dtype, stack + s.shape, s.kind, module + s.suffix, layer, block,
                    n * s.logical, scheme.key, i if s.kind == SCALE else 0)
            for i, s in enumerate(scheme.stored(out, inp))]


def layer_block(cfg: ModelConfig, layer: int) -> str:
    if cfg.layer_kinds and layer < len(cfg.layer_kinds):
        return cfg.layer_kinds[layer]
    if layer >= cfg.num_hidden_layers:
        return MTP
    return MOE if cfg.is_moe_layer(layer) else DENSE


def _walk(cfg: ModelConfig, node: Node, layer: int | None, block: str | None, modules: list[str],
          index: tuple[str, int] | None = None) -> Iterator[ExpectedTensor]:
    """The tensors of one description node in checkpoint order (a repeated group once per index), named
    relative to the layer's prefix; the Linear modules met are appended to `modules`."""
    if isinstance(node, Group):
        if node.repeat is None:
            for child in node.children:
                yield from _walk(cfg, child, layer, block, modules, index)
            return
        for i in range(node.repeat.value):
            for child in node.children:
                yield from _walk(cfg, child, layer, block, modules, (node.index_at, i))
        return
    if isinstance(node, Buffer):
        yield _tensor(node.component, node.dtype, node.shape, BUFFER, node.component, layer, block)
        return
    for t in node.tensors:
        if isinstance(t, Param):
            name = t.component if index is None else indexed(t.component, *index)
            yield _tensor(name, t.dtype, tuple(f.value for f in t.shape), SCALE if t.scale else PARAMETER,
                          t.component, layer, block, owner=1 if t.scale else 0)
            continue
        module = t.module if index is None else indexed(t.module, *index)
        modules.append(module)
        out = product(t.out)
        stack = tuple(f.value for f in t.stack)
        for e in _linear_tensors(cfg, module, out, product(t.inp), layer, block, stack):
            yield e._replace(component=t.module + e.component[len(module):]) if index is not None else e
        if t.bias:
            yield _tensor(module + ".bias", cfg.dtype, (out,), PARAMETER, t.module + ".bias", layer, block)


def role_name(cfg: ModelConfig, layer: int | None, role: str) -> str | None:
    """The name of the tensor (a Param's) or Linear module playing `role` (the explain catalogue's key:
    `q_a_layernorm`, `input_layernorm`, `q_a_proj`, `embedding`) in layer `layer`, or outside the layers for
    None; None where the architecture has no such part. Its description says, not a name written here:
    DeepSeek-V4's query norm is `attn.q_norm`, DeepseekV3's `self_attn.q_a_layernorm`."""
    tree = describe(cfg)
    nodes = tree.blocks.get(layer_block(cfg, layer), ()) if layer is not None else (*tree.before, *tree.after)
    prefix = cfg.layer_name(layer) if layer is not None else ""
    stack = list(nodes)
    while stack:
        node = stack.pop(0)
        if isinstance(node, Group):
            stack[:0] = node.children
        elif not isinstance(node, Buffer) and node.role == role and node.tensors:
            t = node.tensors[0]
            return prefix + (t.component if isinstance(t, Param) else t.module)
    return None


def linear_shapes(cfg: ModelConfig) -> dict[tuple[str | None, str], tuple[int, int]]:
    """(block kind or None outside the layers, a Linear module's name relative to its layer) -> its weight's
    [out, in]: what a format that stores the module flattened (bitsandbytes' 4-bit bytes) records of it."""
    tree = describe(cfg)
    out: dict[tuple[str | None, str], tuple[int, int]] = {}

    def walk(node: Node, block: str | None) -> None:
        if isinstance(node, Group):
            for child in node.children:
                walk(child, block)
        elif not isinstance(node, Buffer):
            for t in node.tensors:
                if not isinstance(t, Param):
                    out[block, t.module] = (product(t.out), product(t.inp))

    for node in (*tree.before, *tree.after):
        walk(node, None)
    for block, nodes in tree.blocks.items():
        for node in nodes:
            walk(node, block)
    return out
