"""Tensor values: decoding safetensors dtypes, RMSNorm and FP8 dequantization in numpy, ranged reads.

kernels.py is the one import for the numpy kernels (dtypes.py, fp8.py, rmsnorm.py, stats.py; bit-identical
to torch's CPU results where their docs say so); rmsnorm_check.py is the `rmsnorm` command's per-layer
check; tensor_io.py fetches single tensors by byte range through a validated header. numpy and ml_dtypes
are imported only by those kernel modules, which the rest of the package imports inside the functions
that decode values, so commands that read headers alone never load them (tests/test_imports.py).
This package sits beside the pipeline: it may import sources/, format/ and model/; checks/ and cli/
import it.
"""
