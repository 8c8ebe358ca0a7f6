"""compressed-tensors' formats (`quant_method: compressed-tensors`), one class each, as its compressors write
them (compressed_tensors.compressors, 0.19-0.20):

- pack-quantized (W4A16, W8A16; Kimi-K2-Thinking's INT4): `weight_packed` I32 [out, ceil(in*bits/32)],
  `weight_scale` [out, ceil(in/group)] (group), [out, 1] (channel) or [1] (tensor), `weight_shape` I64 [2];
  `weight_zero_point` packed along the outputs for asymmetric group/channel schemes, `weight_g_idx` for
  actorder=group;
- float-quantized (FP8_BLOCK, FP8_DYNAMIC, FP8): `weight` F8_E4M3 [out, in], `weight_scale`
  [ceil(out/b0), ceil(in/b1)] (block), [out, 1] (channel) or [1] (tensor); `input_scale` [1] when the
  activations are quantized statically;
- int-quantized (INT8 W8A8): `weight` I8 [out, in] and `weight_scale` as float-quantized's;
- nvfp4-pack-quantized (NVFP4A16, NVFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale` F8_E4M3
  [out, ceil(in/16)], `weight_global_scale` F32 [1]; `input_global_scale` F32 [1] with quantized activations;
- mxfp4-pack-quantized (MXFP4A16, MXFP4): `weight_packed` U8 [out, ceil(in/2)], `weight_scale` U8 holding E8M0
  exponents [out, ceil(in/32)].

One module per kind of compressor: pack.py, naive.py (float- and int-quantized), fp4.py (NVFP4, MXFP4);
base.py holds what they share and the plan of a config's groups.

A scale's dtype is the group's `scale_dtype` where written, else the model's dtype (the observers' output).
`compressed_tensors_plan` reads `config_groups` (several allowed, each with its own targets and, as
compressed-tensors allows, its own `format`) and `ignore`, names (exact) or `re:` patterns (re.match).
"""
