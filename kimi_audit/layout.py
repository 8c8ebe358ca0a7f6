"""Every tensor a DeepseekV3-family checkpoint should hold, derived from its config.

Mirrors modeling_deepseek.py: DeepseekV3Attention (MLA), DeepseekV3MLP for dense blocks,
DeepseekV3MoE (router gate + routed experts + shared experts) for MoE blocks, and the
multi-token-prediction layers stored after the main stack (DeepSeek-V3's `model.layers.61`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from typing import Any, Iterator, NamedTuple

import numpy as np

from kimi_audit.config import ModelConfig
from kimi_audit.constants import DTYPE_BITS

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


@dataclass(frozen=True)
class LayoutColumns:
    """The layout's dtype, shape and kind by position as small integer codes, and its element counts:
    what aligning a shard needs of each expected tensor, without visiting 139,644 objects."""

    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    kinds: tuple[str, ...]
    dtype_code: np.ndarray
    shape_code: np.ndarray
    kind_code: np.ndarray
    numel: np.ndarray
    """int64, or Python ints (dtype object) where int64 could overflow (a config of absurd sizes)."""

    @cached_property
    def dtype_index(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.dtypes)}

    @cached_property
    def shape_index(self) -> dict[tuple[int, ...], int]:
        return {s: i for i, s in enumerate(self.shapes)}

    @property
    def size(self) -> int:
        """The layout's number of tensors (a code per position)."""
        return len(self.dtype_code)

    def to_builtins(self) -> dict[str, Any]:
        """These columns as builtins (arrays as bytes), for the header worker's job."""
        numel = self.numel.tolist() if self.numel.dtype == object else self.numel.astype("<i8").tobytes()
        return {"dtypes": self.dtypes, "shapes": self.shapes, "kinds": self.kinds, "numel": numel,
                **{k: getattr(self, k).astype("<i4").tobytes() for k in ("dtype_code", "shape_code", "kind_code")}}

    @staticmethod
    def from_builtins(d: dict[str, Any]) -> "LayoutColumns":
        numel = d["numel"]
        dtype_code, shape_code, kind_code = (
            np.frombuffer(d[k], dtype="<i4") for k in ("dtype_code", "shape_code", "kind_code"))
        return LayoutColumns(
            tuple(d["dtypes"]), tuple(map(tuple, d["shapes"])), tuple(d["kinds"]), dtype_code, shape_code, kind_code,
            np.array(numel, dtype=object) if isinstance(numel, list) else np.frombuffer(numel, dtype="<i8"),
        )


class ExpectedLayout(dict[str, ExpectedTensor]):
    """expected_layout's result: a dict, and its `columns`."""

    __slots__ = ("columns",)
    columns: LayoutColumns


class _ColumnsBuilder:
    def __init__(self) -> None:
        self.codes: tuple[dict[Any, int], dict[Any, int], dict[Any, int]] = ({}, {}, {})
        self.chunks: list[tuple[Any, ...]] = []
        """(dtype, shape, kind codes, element counts, their sum) of each run of positions."""

    def add(self, dtypes: list[str], shapes: list[tuple[int, ...]], kinds: list[str]) -> tuple[Any, ...]:
        columns: tuple[list[Any], ...] = (dtypes, shapes, kinds)
        chunk = tuple(np.array([table.setdefault(v, len(table)) for v in column], dtype=np.int32)
                      for table, column in zip(self.codes, columns))
        numel = [math.prod(s) for s in shapes]
        return chunk + (np.array(numel, dtype=object), sum(numel))

    def build(self) -> LayoutColumns:
        codes = [np.concatenate([c[i] for c in self.chunks]) if self.chunks else np.zeros(0, np.int32)
                 for i in range(3)]
        numel = np.concatenate([c[3] for c in self.chunks]) if self.chunks else np.zeros(0, object)
        if sum(c[4] for c in self.chunks) < 2**63:  # then no sum of them overflows: int64 adds them up
            numel = numel.astype(np.int64)
        dtypes, shapes, kinds = (tuple(table) for table in self.codes)
        return LayoutColumns(dtypes, shapes, kinds, codes[0], codes[1], codes[2], numel)


def expected_layout(cfg: ModelConfig) -> ExpectedLayout:
    """Name -> expected tensor, in checkpoint order (embedding, layers 0..N-1, MTP layers, norm, lm_head)."""
    h, dt = cfg.hidden_size, cfg.dtype
    out = ExpectedLayout()
    columns = _ColumnsBuilder()

    def top(name: str, shape: tuple[int, ...]) -> None:
        out[name] = _tensor(name, dt, shape, PARAMETER, name, None, None, len(out))
        columns.chunks.append(columns.add([dt], [shape], [PARAMETER]))

    top("model.embed_tokens.weight", (cfg.vocab_size, h))
    # Layers of one block kind differ only in their index: build each kind once, then stamp it out.
    # (map/zip keep the 139,644 names and tuples of Kimi-K2 at C speed: no bytecode per tensor.)
    templates: dict[str, tuple[list[str], tuple[list[Any], ...], tuple[Any, ...]]] = {}
    for layer in range(cfg.total_layers):
        block = layer_block(cfg, layer)
        template = templates.get(block)
        if template is None:
            rows = list(_decoder_layer(cfg, layer))
            cols = tuple(list(col) for col in zip(*rows))
            template = templates[block] = (cols[0], cols[1:5] + cols[7:8], columns.add(*cols[1:4]))
        components, (dtypes, shapes, kinds, comps, nbytes), chunk = template
        columns.chunks.append(chunk)
        names = list(map(f"model.layers.{layer}.".__add__, components))
        stamped = zip(names, dtypes, shapes, kinds, comps, repeat(layer), repeat(block), nbytes,
                      range(len(out), len(out) + len(names)))
        out.update(zip(names, map(tuple.__new__, repeat(ExpectedTensor), stamped)))
    top("model.norm.weight", (h,))
    if not cfg.tie_word_embeddings:
        top("lm_head.weight", (cfg.vocab_size, h))
    out.columns = columns.build()
    return out


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
