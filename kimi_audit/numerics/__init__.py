"""Tensor values: decoding safetensors dtypes, RMSNorm and FP8 dequantization in numpy, ranged reads.

kernels.py is pure numpy (bit-identical to torch's CPU results where the docs say so); tensor_io.py
fetches single tensors by byte range through a validated header. numpy and ml_dtypes are imported only
here and by the modules that decode values, so commands that read headers alone never load them.
This package sits beside the pipeline: it may import sources/, format/ and model/; checks/ and cli/
import it.
"""
