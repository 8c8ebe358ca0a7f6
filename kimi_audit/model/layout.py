"""Every tensor a DeepseekV3-family checkpoint should hold, derived from its config.

Mirrors modeling_deepseek.py: DeepseekV3Attention (MLA), DeepseekV3MLP for dense blocks,
DeepseekV3MoE (router gate + routed experts + shared experts) for MoE blocks, and the
multi-token-prediction layers stored after the main stack (DeepSeek-V3's `model.layers.61`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from itertools import compress, repeat
from operator import sub
from typing import Any, NamedTuple

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.kinds import BUFFER, PARAMETER, SCALE
from kimi_audit.model.quant import Scheme, Unquantized

DENSE = "dense"
MOE = "moe"
MTP = "mtp"

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
        return math.prod(self.shape)


def payload_bytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    bits = DTYPE_BITS.get(dtype)
    return None if bits is None else (math.prod(shape) * bits + 7) // 8


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
    h, dt = cfg.hidden_size, cfg.dtype
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

    top(_tensor("model.embed_tokens.weight", dt, (cfg.vocab_size, h), PARAMETER, "model.embed_tokens.weight",
                None, None))
    # Layers of one block kind differ only in their index: build each kind once, then stamp it out
    # (the 139,644 names of Kimi-K2 are made by map, at C speed: no bytecode per tensor). Where the
    # quantization plan picks schemes by module name (an ignore list), each layer's choices are part of
    # the template's key.
    templates: dict[tuple[str, tuple[bool, ...]], tuple[list[str], list[int], list[int], list[int]]] = {}
    modules: dict[str, list[str]] = {}
    by_name = cfg.quant is not None and cfg.quant.by_name
    for layer in range(cfg.total_layers):
        block = layer_block(cfg, layer)
        prefix = f"model.layers.{layer}."
        choices: tuple[bool, ...] = ()
        if by_name and block in modules:
            assert cfg.quant is not None
            choices = cfg.quant.quantized_mask(list(map(prefix.__add__, modules[block])))
        template = templates.get((block, choices))
        if template is None:
            seen: list[str] = []
            rows = list(_decoder_layer(cfg, layer, seen))
            modules.setdefault(block, seen)
            if by_name and not choices:
                assert cfg.quant is not None
                choices = cfg.quant.quantized_mask(list(map(prefix.__add__, seen)))
            meta = [k for k, t in enumerate(rows) if t.owner]
            template = templates[block, choices] = ([t.name for t in rows], [spec(t) for t in rows], meta,
                                                    [k - rows[k].owner for k in meta])
        suffixes, specs, meta_rel, owner_rel = template
        meta_at.extend(map(len(names).__add__, meta_rel))
        meta_owner.extend(map(len(names).__add__, owner_rel))
        names.extend(map(prefix.__add__, suffixes))
        spec_of.extend(specs)
        layer_of.extend(repeat(layer, len(specs)))
    top(_tensor("model.norm.weight", cfg.norm_dtype, (h,), PARAMETER, "model.norm.weight", None, None))
    if not cfg.tie_word_embeddings:
        for t in _linear_tensors(cfg, "lm_head", cfg.vocab_size, h, None, None):
            top(t)
    return ExpectedLayout(names, spec_of, list(spec_index), layer_of, meta_at, meta_owner)


def _linear_tensors(cfg: ModelConfig, module: str, out: int, inp: int, layer: int | None,
                    block: str | None) -> list[ExpectedTensor]:
    """The tensors storing one Linear module's weight, by the scheme the plan picks for its full name."""
    full = module if layer is None else f"model.layers.{layer}.{module}"
    scheme = scheme_of(cfg, full)
    return [_tensor(module + s.suffix, s.dtype, s.shape, s.kind, module + s.suffix, layer, block, s.logical,
                    scheme.key, i if s.kind == SCALE else 0) for i, s in enumerate(scheme.stored(out, inp))]


def layer_block(cfg: ModelConfig, layer: int) -> str:
    if layer >= cfg.num_hidden_layers:
        return MTP
    return MOE if cfg.is_moe_layer(layer) else DENSE


def _decoder_layer(cfg: ModelConfig, layer: int, modules: list[str]) -> Iterator[ExpectedTensor]:
    """One layer's tensors, named relative to its `model.layers.{i}.` prefix; the Linear modules met are
    appended to `modules`."""
    block = layer_block(cfg, layer)
    h, dt, nt = cfg.hidden_size, cfg.dtype, cfg.norm_dtype

    def param(component: str, shape: tuple[int, ...], dtype: str = dt) -> ExpectedTensor:
        return _tensor(component, dtype, shape, PARAMETER, component, layer, block)

    def linear(module: str, out: int, inp: int, bias: bool = False) -> Iterator[ExpectedTensor]:
        modules.append(module)
        yield from _linear_tensors(cfg, module, out, inp, layer, block)
        if bias:
            yield param(module + ".bias", (out,), dt)

    if block == MTP:
        yield param("embed_tokens.weight", (cfg.vocab_size, h))
        yield param("enorm.weight", (h,), nt)
        yield param("hnorm.weight", (h,), nt)
        yield from linear("eh_proj", h, 2 * h)
        yield param("shared_head.norm.weight", (h,), nt)
        yield from linear("shared_head.head", cfg.vocab_size, h)

    yield param("input_layernorm.weight", (h,), nt)
    yield param("post_attention_layernorm.weight", (h,), nt)

    heads, qhd, bias = cfg.num_attention_heads, cfg.q_head_dim, cfg.attention_bias
    if cfg.q_lora_rank is None:
        yield from linear("self_attn.q_proj", heads * qhd, h)
    else:
        yield from linear("self_attn.q_a_proj", cfg.q_lora_rank, h, bias)
        yield param("self_attn.q_a_layernorm.weight", (cfg.q_lora_rank,), nt)
        yield from linear("self_attn.q_b_proj", heads * qhd, cfg.q_lora_rank)
    yield from linear("self_attn.kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, h, bias)
    yield param("self_attn.kv_a_layernorm.weight", (cfg.kv_lora_rank,), nt)
    yield from linear("self_attn.kv_b_proj", heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    yield from linear("self_attn.o_proj", h, heads * cfg.v_head_dim, bias)
    if cfg.index_n_heads and cfg.index_head_dim:  # DeepSeek-V3.2's sparse-attention indexer
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        yield from linear("self_attn.indexer.wq_b", ih * idim, cfg.q_lora_rank or h)
        yield from linear("self_attn.indexer.wk", idim, h)
        yield param("self_attn.indexer.k_norm.weight", (idim,), "F32")  # a LayerNorm: gain and bias
        yield param("self_attn.indexer.k_norm.bias", (idim,), "F32")
        yield param("self_attn.indexer.weights_proj.weight", (ih, h), dt)  # kept unquantized, no bias
    else:
        comp = "self_attn.rotary_emb.inv_freq"
        yield _tensor(comp, dt, (cfg.qk_rope_head_dim // 2,), BUFFER, comp, layer, block)

    if block == DENSE:
        yield from _mlp(linear, "mlp", cfg.intermediate_size, h)
        return
    assert cfg.n_routed_experts is not None
    yield param("mlp.gate.weight", (cfg.n_routed_experts, h))
    if cfg.topk_method == "noaux_tc":
        yield param("mlp.gate.e_score_correction_bias", (cfg.n_routed_experts,), "F32")
    inter = cfg.moe_intermediate_size
    for e in range(cfg.n_routed_experts):
        for t in _mlp(linear, f"mlp.experts.{e}", inter, h):
            yield t._replace(component=t.component.replace(f"experts.{e}.", "experts.", 1))
    if cfg.n_shared_experts:
        yield from _mlp(linear, "mlp.shared_experts", inter * cfg.n_shared_experts, h)


def _mlp(linear, module: str, inter: int, h: int) -> Iterator[ExpectedTensor]:  # type: ignore[no-untyped-def]
    yield from linear(f"{module}.gate_proj", inter, h)
    yield from linear(f"{module}.up_proj", inter, h)
    yield from linear(f"{module}.down_proj", h, inter)
