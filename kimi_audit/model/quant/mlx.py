"""MLX's quantization, as mlx-lm writes it (`mlx_lm.convert -q`, mlx-community's 2- to 8-bit builds): the
affine mode, and the `mxfp4`, `nvfp4` and `mxfp8` modes.

config.json holds `quantization` (and, since mlx-lm #957, the same object as `quantization_config`) with
`group_size`, `bits` and `mode` and no `quant_method`; a module quantized otherwise has its own entry under its
path (`"model.layers.3.mlp.gate_proj": {"group_size": 32, "bits": 8}`), one left plain `false`. Each quantized
Linear (and the embedding) stores `weight` U32 [out, in * bits / 32] (codes in a little-endian bit stream),
`scales` and `biases` [out, in / group_size] in the model's dtype (affine); the other modes store no biases and
U8 scales: E8M0 exponents per 32 inputs (mxfp4: FP4 E2M1 codes; mxfp8: FP8 E4M3 codes) or F8_E4M3 bits per 16
inputs (nvfp4: FP4 E2M1 codes), dequantized as the float32 product rounded once to bf16 (mx.dequantize's
default). mlx-lm leaves a module plain where its input width is not a multiple of group_size (quantize_model's
predicate).

The checkpoint holds mlx-lm's module tree (Scheme.tree): its models stack the routed experts
(`mlp.switch_mlp.gate_proj` [E, ...]), split DeepseekV3's kv_b_proj per head and drop the MTP layer; each
architecture describes its mlx-lm tree (model.arch). mlx-lm's loader reads every `model*.safetensors` and
ignores the index. Reference: mlx-lm 0.32 `utils.py` (quantize_model, save_model, load_model), mlx 0.32
`mx.quantize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kimi_audit.errors import ConfigError
from kimi_audit.model.kinds import AFFINE_BIAS, AFFINE_SCALE, PACKED, SCALE
from kimi_audit.model.quant import bounds
from kimi_audit.model.quant.scheme import (
    QuantPlan,
    ReleaseQuant,
    Scheme,
    Stored,
    Unquantized,
    UnsupportedQuantization,
    packed_rows,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Mlx"]

MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}
"""mode -> (group_size, bits) mlx-lm uses where the config omits them (quantize_model's defaults_for_mode)."""
SETTINGS = ("group_size", "bits", "mode", "quant_method")
TREE = "mlx-lm"


@dataclass(frozen=True)
class Mlx(Scheme):
    key: ClassVar[str] = "mlx"
    formats: ClassVar[tuple[tuple[str, str | None], ...]] = (("mlx", None),)
    roles: ClassVar[tuple[tuple[str, str], ...]] = ((".scales", AFFINE_SCALE), (".biases", AFFINE_BIAS))
    tree: ClassVar[str] = TREE
    loader_reads: ClassVar[str] = "model*.safetensors"
    """mlx-lm's load_model globs these and ignores the index."""
    dequant_bytes_per_value: ClassVar[int] = 48
    """The unpacked bit stream (one byte per bit), the codes and two float32 passes."""
    group_size: int = 64
    bits: int = 4
    dtype: str = "BF16"
    mode: str = "affine"

    @classmethod
    def claims(cls, q: dict[str, Any], config: Mapping[str, Any]) -> bool:
        mode = q.get("mode")
        return ("bits" in q and "group_size" in q and "quantization" in config) or (
            isinstance(mode, str) and mode in MODE_DEFAULTS)

    @classmethod
    def plan(cls, q: dict[str, Any], plain: Unquantized, config: Mapping[str, Any],
             release: ReleaseQuant) -> QuantPlan:
        every = cls.read(q, plain.dtype, "config.json quantization")
        exact: dict[str, Scheme] = {}
        ignore: set[str] = set()
        for path, v in q.items():
            if path in SETTINGS:
                continue
            if v is False:
                ignore.add(path)
            elif v is True:
                exact[path] = every
            elif isinstance(v, dict):
                exact[path] = cls.read({"mode": every_mode(q), **v}, plain.dtype, f"config.json quantization "
                                       f"{path!r}")
            else:
                raise ConfigError(f"config.json quantization {path!r} is {v!r}: mlx-lm writes an object or false")
        return QuantPlan(every, plain, exact=exact, ignore_names=frozenset(ignore), by_name=bool(exact or ignore))

    @classmethod
    def read(cls, q: Mapping[str, Any], dtype: str, where: str) -> Mlx:
        mode = every_mode(q)
        if mode not in MODE_DEFAULTS:
            raise UnsupportedQuantization(f"mlx mode {mode!r}")
        group, bits = MODE_DEFAULTS[mode]
        group, bits = q.get("group_size", group), q.get("bits", bits)
        if mode != "affine":
            if (group, bits) != MODE_DEFAULTS[mode]:
                raise ConfigError(f"{where} {mode} has group_size {group!r} and bits {bits!r}; mx.quantize's "
                                  f"{mode} is {MODE_DEFAULTS[mode][0]} and {MODE_DEFAULTS[mode][1]}")
            return cls(group, bits, dtype, mode)
        if type(bits) is not int or bits not in (2, 3, 4, 5, 6, 8):
            raise ConfigError(f"{where} bits {bits!r} is not one of 2, 3, 4, 5, 6, 8 (mx.quantize's affine widths)")
        if type(group) is not int or group not in (32, 64, 128):
            raise ConfigError(f"{where} group_size {group!r} is not 32, 64 or 128 (mx.quantize's groups)")
        return cls(group, bits, dtype)

    def summary(self) -> dict[str, Any]:
        return {"method": "mlx", "mode": self.mode, "bits": self.bits, "group_size": self.group_size,
                "scale_dtype": self.scale_dtype}

    @property
    def scale_dtype(self) -> str:
        return self.dtype if self.mode == "affine" else "U8"

    @property
    def name(self) -> str:
        return f"MLX{self.bits}" if self.mode == "affine" else f"MLX {self.mode.upper()}"

    @property
    def param_dtype(self) -> str:
        return {"affine": f"UINT{self.bits}", "mxfp8": "FP8"}.get(self.mode, "FP4")

    @property
    def power_of_two_scales(self) -> bool:
        return self.mode in ("mxfp4", "mxfp8")

    def quantizes(self, inp: int) -> bool:
        """mlx-lm quantizes a module only where its input width is a multiple of group_size."""
        return inp % self.group_size == 0

    def stored(self, out: int, inp: int) -> tuple[Stored, ...]:
        if not self.quantizes(inp):
            return Unquantized(self.dtype).stored(out, inp)
        groups = (out, inp // self.group_size)
        weight = Stored(".weight", "U32", (out, inp * self.bits // 32), PACKED, out * inp)
        if self.mode != "affine":
            return weight, Stored(".scales", "U8", groups, SCALE)
        return weight, Stored(".scales", self.dtype, groups, SCALE), Stored(".biases", self.dtype, groups, SCALE)

    def describe(self) -> str:
        if self.mode != "affine":
            scale = "F8_E4M3" if self.mode == "nvfp4" else "E8M0"
            return (f"MLX {self.mode}: {self.param_dtype} codes packed in U32 words, one {scale} scale (U8) per "
                    f"{self.group_size} inputs")
        return (f"MLX affine {self.bits}-bit, packed in U32 words, one {self.dtype} scale and bias per "
                f"{self.group_size} inputs")

    def error_bound(self) -> float:
        """affine: `bits`-bit codes with a scale and a bias per group (bounds.uniform_grid); mxfp4 / nvfp4: FP4
        E2M1 codes under an E8M0 / E4M3 scale; mxfp8: E4M3 codes."""
        if self.mode == "affine":
            return bounds.uniform_grid(self.bits)
        if self.mode == "mxfp8":
            return bounds.float_grid(3)
        return bounds.nvfp4(self.group_size) if self.mode == "nvfp4" else bounds.power_of_two_fp4(self.group_size)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        """``scales * q + biases``, rounded as mx.dequantize (numerics.affine); the FP modes' codes times their
        scale, rounded once to bf16 (numerics.fp4)."""
        from kimi_audit.numerics.affine import dequantize_affine
        from kimi_audit.numerics.fp4 import dequantize_mlx_fp

        flat = {k: v.reshape(-1, v.shape[-1]) if v.ndim > 2 else v for k, v in tensors.items()}  # stacked: rows
        if not self.quantizes(inp):
            return Unquantized(self.dtype).dequantize(flat, out, inp)
        if self.mode != "affine":
            return dequantize_mlx_fp(packed_rows(flat, ".weight", out), flat[".scales"], inp, self.mode,
                                     self.group_size)
        return dequantize_affine(packed_rows(flat, ".weight", out), flat[".scales"], flat[".biases"],
                                 self.group_size, self.bits)


def every_mode(q: Mapping[str, Any]) -> str:
    mode = q.get("mode", "affine")
    if not isinstance(mode, str):
        raise ConfigError(f"config.json quantization mode must be a string, got {mode!r}")
    return mode
