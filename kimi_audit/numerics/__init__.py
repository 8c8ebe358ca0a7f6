"""Tensor values: decoding safetensors dtypes, RMSNorm and FP8 dequantization in numpy, ranged reads.

kernels.py is the one import for the numpy kernels (dtypes.py, fp8.py, rmsnorm.py, stats.py; bit-identical
to torch's CPU results where their docs say so); tensor_io.py fetches single tensors by byte range
through a validated header; grid.py (the FP8 scale grid) is numpy-free, for the header path. numpy and
ml_dtypes are imported at module level only by the kernel modules (and checks/rmsnorm.py); everything else
imports them inside the functions that decode values, so commands that read headers alone never load them
(tests/test_imports.py). It may import sources/ and format/; model/ (each quantization scheme's
dequantization), checks/ and cli/ import it.
"""
