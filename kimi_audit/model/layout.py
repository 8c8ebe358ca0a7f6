"""Every tensor a DeepseekV3-family checkpoint should hold, derived from its config.

Mirrors modeling_deepseek.py: DeepseekV3Attention (MLA), DeepseekV3MLP for dense blocks,
DeepseekV3MoE (router gate + routed experts + shared experts) for MoE blocks, and the
multi-token-prediction layers stored after the main stack (DeepSeek-V3's `model.layers.61`).
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any, Iterator, NamedTuple


from kimi_audit.model.config import ModelConfig
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


class ExpectedLayout(dict[str, ExpectedTensor]):
    """expected_layout's result: expected tensor by name, in checkpoint order."""


def expected_layout(cfg: ModelConfig) -> ExpectedLayout:
    """Name -> expected tensor, in checkpoint order (embedding, layers 0..N-1, MTP layers, norm, lm_head)."""
    h, dt = cfg.hidden_size, cfg.dtype
    out = ExpectedLayout()

    def top(name: str, shape: tuple[int, ...]) -> None:
        out[name] = _tensor(name, dt, shape, PARAMETER, name, None, None, len(out))

    top("model.embed_tokens.weight", (cfg.vocab_size, h))
    # Layers of one block kind differ only in their index: build each kind once, then stamp it out.
    # (map/zip keep the 139,644 names and tuples of Kimi-K2 at C speed: no bytecode per tensor.)
    templates: dict[str, tuple[list[str], tuple[list[Any], ...]]] = {}
    for layer in range(cfg.total_layers):
        block = layer_block(cfg, layer)
        template = templates.get(block)
        if template is None:
            rows = list(_decoder_layer(cfg, layer))
            cols = tuple(list(col) for col in zip(*rows))
            template = templates[block] = (cols[0], cols[1:5] + cols[7:8])
        components, (dtypes, shapes, kinds, comps, nbytes) = template
        names = list(map(f"model.layers.{layer}.".__add__, components))
        stamped = zip(names, dtypes, shapes, kinds, comps, repeat(layer), repeat(block), nbytes,
                      range(len(out), len(out) + len(names)))
        out.update(zip(names, map(tuple.__new__, repeat(ExpectedTensor), stamped)))
    top("model.norm.weight", (h,))
    if not cfg.tie_word_embeddings:
        top("lm_head.weight", (cfg.vocab_size, h))
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
