"""Every tensor a DeepseekV3-family checkpoint should hold, derived from its config.

Mirrors modeling_deepseek.py: DeepseekV3Attention (MLA), DeepseekV3MLP for dense blocks,
DeepseekV3MoE (router gate + routed experts + shared experts) for MoE blocks, and the
multi-token-prediction layers stored after the main stack (DeepSeek-V3's `model.layers.61`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from itertools import compress, repeat
from typing import Any, NamedTuple

from kimi_audit.constants import DTYPE_BITS
from kimi_audit.model.config import ModelConfig

PARAMETER = "parameter"
SCALE = "scale"
BUFFER = "buffer"

DENSE = "dense"
MOE = "moe"
MTP = "mtp"

SCALE_SUFFIX = ".weight_scale_inv"
FP8_DTYPE = "F8_E4M3"
SCALE_DTYPE = "F32"


class ExpectedTensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    """PARAMETER, SCALE (quantization metadata) or BUFFER (stored, not a parameter)."""
    component: str
    """The name with layer and expert indices taken out, e.g. `self_attn.q_a_layernorm.weight`."""
    layer: int | None
    block: str | None
    """DENSE, MOE or MTP for tensors inside a decoder layer."""
    nbytes: int | None
    """The payload bytes it occupies (numel x dtype bits / 8); None for a dtype of unknown width."""
    position: int
    """Its place in checkpoint order (a scale's weight is at position - 1)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def payload_bytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    bits = DTYPE_BITS.get(dtype)
    return None if bits is None else (math.prod(shape) * bits + 7) // 8


def _tensor(name: str, dtype: str, shape: tuple[int, ...], kind: str, component: str,
            layer: int | None, block: str | None, position: int = -1) -> ExpectedTensor:
    return ExpectedTensor(name, dtype, shape, kind, component, layer, block, payload_bytes(dtype, shape), position)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    out, inp = shape
    return ceil_div(out, block[0]), ceil_div(inp, block[1])


def is_fp8(cfg: ModelConfig) -> bool:
    return cfg.quantization is not None and cfg.quantization.method == "fp8"


class Spec(NamedTuple):
    """What expected tensors share apart from their name and layer (all experts' gate_proj weights of
    one block kind share one Spec)."""

    dtype: str
    shape: tuple[int, ...]
    kind: str
    component: str
    block: str | None
    nbytes: int | None


class ExpectedLayout(Mapping[str, ExpectedTensor]):
    """Every expected tensor, in checkpoint order, as columns: its name, its layer and its Spec.

    A mapping name -> ExpectedTensor (entries are made when asked for); the checks read the columns
    (`position`, `spec_of`, `specs`) so that a 139,644-tensor layout costs a list of names and one
    dict, not an object per tensor.
    """

    __slots__ = ("_entries", "layer_of", "names", "position", "spec_of", "specs")

    def __init__(self, names: list[str], spec_of: list[int], specs: list[Spec], layer_of: list[int | None]):
        self.names = names
        self.position: dict[str, int] = dict(zip(names, range(len(names))))
        """Name -> its place in checkpoint order (a scale's weight is at position - 1)."""
        self.spec_of = spec_of
        """Position -> index into `specs`."""
        self.specs = specs
        self.layer_of = layer_of
        self._entries: list[ExpectedTensor] | None = None

    def entry(self, position: int) -> ExpectedTensor:
        s = self.specs[self.spec_of[position]]
        return ExpectedTensor(self.names[position], s.dtype, s.shape, s.kind, s.component,
                              self.layer_of[position], s.block, s.nbytes, position)

    def scale_positions(self) -> list[int]:
        """Positions of the SCALE tensors (each follows its weight)."""
        is_scale = [s.kind == SCALE for s in self.specs]
        return list(compress(range(len(self.names)), map(is_scale.__getitem__, self.spec_of)))

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


def expected_layout(cfg: ModelConfig) -> ExpectedLayout:
    """Name -> expected tensor, in checkpoint order (embedding, layers 0..N-1, MTP layers, norm, lm_head)."""
    h, dt = cfg.hidden_size, cfg.dtype
    names: list[str] = []
    spec_of: list[int] = []
    layer_of: list[int | None] = []
    spec_index: dict[Spec, int] = {}

    def spec(t: ExpectedTensor) -> int:
        return spec_index.setdefault(Spec(t.dtype, t.shape, t.kind, t.component, t.block, t.nbytes), len(spec_index))

    def top(name: str, shape: tuple[int, ...]) -> None:
        names.append(name)
        spec_of.append(spec(_tensor(name, dt, shape, PARAMETER, name, None, None)))
        layer_of.append(None)

    top("model.embed_tokens.weight", (cfg.vocab_size, h))
    # Layers of one block kind differ only in their index: build each kind once, then stamp it out
    # (the 139,644 names of Kimi-K2 are made by map, at C speed: no bytecode per tensor).
    templates: dict[str, tuple[list[str], list[int]]] = {}
    for layer in range(cfg.total_layers):
        block = layer_block(cfg, layer)
        template = templates.get(block)
        if template is None:
            rows = list(_decoder_layer(cfg, layer))
            template = templates[block] = ([t.name for t in rows], [spec(t) for t in rows])
        suffixes, specs = template
        names.extend(map(f"model.layers.{layer}.".__add__, suffixes))
        spec_of.extend(specs)
        layer_of.extend(repeat(layer, len(specs)))
    top("model.norm.weight", (h,))
    if not cfg.tie_word_embeddings:
        top("lm_head.weight", (cfg.vocab_size, h))
    return ExpectedLayout(names, spec_of, list(spec_index), layer_of)


def layer_block(cfg: ModelConfig, layer: int) -> str:
    if layer >= cfg.num_hidden_layers:
        return MTP
    return MOE if cfg.is_moe_layer(layer) else DENSE


def _decoder_layer(cfg: ModelConfig, layer: int) -> Iterator[ExpectedTensor]:
    """One layer's tensors, named relative to its `model.layers.{i}.` prefix."""
    block = layer_block(cfg, layer)
    mtp = block == MTP
    h, dt = cfg.hidden_size, cfg.dtype
    fp8 = is_fp8(cfg)
    block_size = cfg.quantization.block if cfg.quantization else (128, 128)

    def param(component: str, shape: tuple[int, ...], dtype: str = dt) -> ExpectedTensor:
        return _tensor(component, dtype, shape, PARAMETER, component, layer, block)

    def linear(module: str, out: int, inp: int, bias: bool = False) -> Iterator[ExpectedTensor]:
        shape = (out, inp)
        if fp8:
            yield param(module + ".weight", shape, FP8_DTYPE)
            comp = module + SCALE_SUFFIX
            yield _tensor(comp, SCALE_DTYPE, scale_shape(shape, block_size), SCALE, comp, layer, block)
        else:
            yield param(module + ".weight", shape, dt)
        if bias:
            yield param(module + ".bias", (out,), dt)

    if mtp:
        yield param("embed_tokens.weight", (cfg.vocab_size, h))
        yield param("enorm.weight", (h,))
        yield param("hnorm.weight", (h,))
        yield param("eh_proj.weight", (h, 2 * h))
        yield param("shared_head.norm.weight", (h,))
        yield param("shared_head.head.weight", (cfg.vocab_size, h))

    yield param("input_layernorm.weight", (h,))
    yield param("post_attention_layernorm.weight", (h,))

    heads, qhd, bias = cfg.num_attention_heads, cfg.q_head_dim, cfg.attention_bias
    if cfg.q_lora_rank is None:
        yield from linear("self_attn.q_proj", heads * qhd, h)
    else:
        yield from linear("self_attn.q_a_proj", cfg.q_lora_rank, h, bias)
        yield param("self_attn.q_a_layernorm.weight", (cfg.q_lora_rank,))
        yield from linear("self_attn.q_b_proj", heads * qhd, cfg.q_lora_rank)
    yield from linear("self_attn.kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, h, bias)
    yield param("self_attn.kv_a_layernorm.weight", (cfg.kv_lora_rank,))
    yield from linear("self_attn.kv_b_proj", heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    yield from linear("self_attn.o_proj", h, heads * cfg.v_head_dim, bias)
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


def classify_name(name: str) -> str:
    """Kind of a tensor the layout does not know, from its name alone."""
    if name.endswith((SCALE_SUFFIX, ".weight_scale", ".weight_shape", ".input_scale")):
        return SCALE
    if name.endswith(".inv_freq"):
        return BUFFER
    return PARAMETER
