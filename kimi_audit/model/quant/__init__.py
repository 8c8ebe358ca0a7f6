"""Quantization schemes, one registered class per format, and the plan that picks one per Linear module.

- scheme.py: what every scheme is (Stored, Scheme and its registry, Unquantized) and the QuantPlan;
- deepseek.py: DeepSeek's own FP8 (V3's `weight_scale_inv`, V4's `.scale`) and V4's FP4 routed experts;
- compressed/: compressed-tensors' formats, one class each (pack.py: pack-quantized; naive.py: float- and
  int-quantized; fp4.py: nvfp4- and mxfp4-pack-quantized) and the plan of its config groups (base.py);
- dispatch.py: `quant_plan`, which makes a config's QuantPlan (scheme.py: the scheme per Linear module)
  through the registry.
"""
