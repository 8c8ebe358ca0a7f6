"""A quantized release's finding codes against the checkpoint it was quantized from (`audit QUANT --against
ORIGINAL`, checks.same_model), as rules (report.rules merges them)."""

from __future__ import annotations

from kimi_audit.report.rules.rule import Rule

SAME_MODEL_HELP = ("Quantize the release again from the original named by --against (the same revision), or give "
                   "--against the checkpoint it was really quantized from; `kimi-audit diff ORIGINAL QUANT` lists "
                   "every tensor and config key that differs.")

SAME_MODEL_RULES: dict[str, Rule] = {
    "AGAINST_CONFIG": Rule(
        "error", "a config.json key of the release differs from the original's (its quantization aside)",
        "A key of config.json other than the quantization's and its writer's (quantization_config, "
        "compression_config, dtype, torch_dtype, transformers_version, _name_or_path, and the forward pass's "
        "output flags) holds another value than the original's: another architecture, size or setting (RoPE, "
        "routing, experts), which the loader builds without a word.", SAME_MODEL_HELP),
    "AGAINST_MISSING": Rule(
        "error", "tensors of the original that no tensor of the release holds",
        "A tensor of the original (its own quantization metadata aside) is neither in the release as it is nor, "
        "where the release's config quantizes its Linear module, stored as every tensor its format keeps for it.",
        SAME_MODEL_HELP),
    "AGAINST_EXTRA": Rule(
        "error", "tensors of the release that stand for no tensor of the original",
        "A tensor of the release is neither one of the original's, nor a tensor its format stores for a "
        "quantized module, nor quantization metadata (scales, KV-cache scales): something the original does not "
        "have.", SAME_MODEL_HELP),
    "AGAINST_SHAPE": Rule(
        "error", "a tensor's shape (a quantized module's [out, in]) is not the original's",
        "The release holds the tensor with another shape than the original's (for a quantized module, the "
        "[out, in] its format's tensors stand for).", SAME_MODEL_HELP),
    "AGAINST_PARAMS": Rule(
        "error", "the release's parameter count is not the original's",
        "The accounting's logical parameter count (a packed weight counting its module's out x in) differs "
        "between the release and the original: not the same model.", SAME_MODEL_HELP),
    "AGAINST_UNQUANTIZED": Rule(
        "error", "`--values`: an unquantized tensor is not the original's values after the writer's cast",
        "A tensor the release keeps unquantized (a norm gain, the embedding, a router, lm_head) is not bit-equal "
        "to the original's values cast to the release's dtype (BF16 as is, F32 rounded to BF16): a tensor from "
        "another model, layer or seed.", SAME_MODEL_HELP),
    "AGAINST_DEQUANTIZED": Rule(
        "error", "`--values`: a quantized weight, dequantized, is off the original's beyond its format's bound",
        "The weight dequantized as its format says is farther from the original's (relative RMS error) than its "
        "format's quantization can put it (model.quant.bounds: FP8 0.067, NVFP4 0.31, MXFP4 0.54, INT4 0.2): a "
        "weight from another model, layer or expert is about 1.41 off.", SAME_MODEL_HELP),
    "AGAINST_SAME_MODEL": Rule(
        "info", "`--against`: what the release was held to, and how its quantization differs from the original's",
        "Said on every --against run of a safetensors release, a PASS included: the original, the config keys, "
        "tensors and parameters held to it, `same model (ARCH, N parameters); quantization differs: BF16 → NVFP4` "
        "where all of that holds, and whether the values were compared (--values).", SAME_MODEL_HELP),
    "AGAINST_ERROR_BOUNDS": Rule(
        "info", "`--against --values`: the tensors compared, and the worst error of each format against its bound",
        "How many tensors were compared with the original's values: unquantized ones bit for bit, quantized "
        "weights dequantized within their format's relative error bound, the worst weight of each format named "
        "with its error and bound.", SAME_MODEL_HELP),
}
