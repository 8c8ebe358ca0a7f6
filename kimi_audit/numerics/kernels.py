"""Pure numpy numerics: safetensors dtype decoding, FP8 block dequantization, torch-exact RMSNorm.

The one import for code that works on tensor values; the kernels live in

* dtypes.py: safetensors dtype -> numpy dtype, `decode`, the exact bf16 / FP8 bit conversions;
* fp8.py: `dequantize_fp8(w, s)` == ``(w.float() * s_expanded).to(torch.bfloat16)``;
* rmsnorm.py: `rms_norm` == ``DeepseekV3RMSNorm.forward``, with `torch_sum_f32`, the float32 sum
  in torch CPU's order;
* stats.py: `tensor_stats`, value statistics of any decoded tensor.

Importing this module loads numpy and ml_dtypes, so only code that decodes values imports it (inside
the functions that do, where the module is also imported by header-only commands). No torch at run
time: torch is a test-time reference only.
"""

from __future__ import annotations

from kimi_audit.numerics.dtypes import (
    BF16_NAN_BITS,
    FLOAT_DTYPES,
    FP8_E4M3_MAX,
    NP_DTYPES,
    NumericsError,
    bf16_bits_to_f32,
    bfloat16,
    bits16,
    decode,
    f32_to_bf16,
    f32_to_bf16_bits,
    float8_e4m3fn,
    float8_e5m2,
    fp8_e4m3_lut,
    numpy_dtype,
    to_float32,
)
from kimi_audit.numerics.fp8 import dequantize_fp8
from kimi_audit.numerics.grid import scale_grid
from kimi_audit.numerics.rmsnorm import rms_norm, torch_sum_f32
from kimi_audit.numerics.stats import TensorStats, tensor_stats

__all__ = [
    "BF16_NAN_BITS", "FLOAT_DTYPES", "FP8_E4M3_MAX", "NP_DTYPES", "NumericsError", "TensorStats",
    "bf16_bits_to_f32", "bfloat16", "bits16", "decode", "dequantize_fp8", "f32_to_bf16", "f32_to_bf16_bits",
    "float8_e4m3fn", "float8_e5m2", "fp8_e4m3_lut", "numpy_dtype", "rms_norm", "scale_grid",
    "tensor_stats", "to_float32", "torch_sum_f32",
]
