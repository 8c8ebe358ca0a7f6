"""Writes tests/data/awq/: the tiny DeepseekV3 of tests/writers/gptq_generate.py quantized with AWQ by GPTQModel
(its AWQ port of AutoAWQ / llm-awq) in the GEMM format, with GPTQModel's own dequantization of every module
beside it (reference.json: dtype, shape and sha256 of `dequantize_gemm`'s [in, out] result, transposed).

GPTQModel 7.7 needs torch >= 2.14.1, so this runs in its own venv, as the GPTQ generator does:

    python3 -m venv /tmp/gptqvenv && /tmp/gptqvenv/bin/pip install gptqmodel==7.7.0
    GPTQMODEL_CPU_WORKERS=2 /tmp/gptqvenv/bin/python tests/writers/awq_generate.py tests/data/awq
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from gptq_generate import CONFIG, tokenizer

FORMATS = ("gemm",)
AWQ_CONFIG = dict(CONFIG, q_lora_rank=CONFIG["hidden_size"], kv_lora_rank=CONFIG["hidden_size"],
                  intermediate_size=CONFIG["hidden_size"], moe_intermediate_size=CONFIG["hidden_size"],
                  qk_rope_head_dim=64, first_k_dense_replace=CONFIG["num_hidden_layers"])
"""GPTQModel 7.7's AWQ smooths DeepseekV3's projections in groups that assume one input width (q_b_proj with
kv_b_proj: "Expected consistent in_features across layers"; then a shape error in the MLP): every width here is
hidden_size, which its grouping gets through, and every output a multiple of 64 (its clip search's batches:
kv_a_proj_with_mqa's kv_lora_rank + qk_rope_head_dim = 320). Its MoE layer fails in the scale search
(`assert len(layers) == 1`), so both layers are dense: the routed experts are GPTQ's, MLX's and bitsandbytes'
to prove, the format here."""


def main(out: Path) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig, __version__

    torch.manual_seed(0)
    work = out / "_bf16"
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**AWQ_CONFIG)).to(torch.bfloat16)
    model.save_pretrained(work)
    tokenizer(CONFIG["vocab_size"]).save_pretrained(work)
    calibration = [{"input_ids": torch.randint(0, CONFIG["vocab_size"], (1, 64)).tolist()[0]} for _ in range(8)]
    for fmt in FORMATS:
        qcfg = QuantizeConfig(bits=4, group_size=32, quant_method="awq", format=fmt, sym=False)
        q = GPTQModel.load(str(work), qcfg, device="cpu")
        q.quantize(calibration, batch_size=1)
        q.save(str(out / fmt))
        for extra in ("quant_log.csv", "generation_config.json"):
            (out / fmt / extra).unlink(missing_ok=True)
        reference(out / fmt, fmt)
    shutil.rmtree(work)
    (out / "PROVENANCE.json").write_text(json.dumps({
        "writer": f"gptqmodel {__version__} (AWQ)", "torch": torch.__version__,
        "transformers": transformers.__version__,
        "settings": {"bits": 4, "group_size": 32, "sym": False, "formats": list(FORMATS)}, "config": AWQ_CONFIG,
        "script": "tests/writers/awq_generate.py",
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}, indent=2) + "\n")


def reference(path: Path, fmt: str) -> None:
    """GPTQModel's `dequantize_gemm(qweight, qzeros, scales, bits, group_size)` of every module in the file."""
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    tensors = load_file(str(path / "model.safetensors"))
    out = {}
    for name in sorted(n[: -len(".qweight")] for n in tensors if n.endswith(".qweight")):
        w = dequantize_gemm(tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"], tensors[f"{name}.scales"], 4, 32)
        w = w.T.contiguous()
        out[name] = {"dtype": str(w.dtype).removeprefix("torch."), "shape": list(w.shape),
                     "sha256": hashlib.sha256(w.view(torch.int16).numpy().tobytes()).hexdigest()}
    (path / "reference.json").write_text(json.dumps({"format": fmt, "modules": out}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
