"""Write tests/data/modelopt with NVIDIA Model Optimizer's own quantizer and exporter (`mtq.quantize`,
`export_hf_checkpoint`), on the CPU, from a tiny Kimi-K2-shaped DeepseekV3 that transformers builds.

Not run by the test suite (nvidia-modelopt needs its own torch and transformers). Run in its own venv:

    python -m venv /tmp/w-modelopt && /tmp/w-modelopt/bin/pip install torch==2.13.0 \
        'nvidia-modelopt[hf]==0.47.0' transformers accelerate safetensors
    /tmp/w-modelopt/bin/python tests/writers/modelopt_generate.py tests/data/modelopt

Variants, each a folder as the exporter writes it (config.json with `quant_method: modelopt`,
hf_quant_config.json, model.safetensors), its tokenizer-free generation_config.json left out:
- nvfp4-kv: NVFP4_DEFAULT_CFG (W4A4, NVFP4) with FP8_KV_CFG (the FP8 KV cache's k/v scales);
- fp8: FP8_DEFAULT_CFG (per-tensor FP8 weights and inputs);
- mixed: NVFP4 routed experts, FP8 everything else quantized (the `MIXED_PRECISION` export the Kimi-K3 and
  DeepSeek releases use).
Beside each, dequantized.json: every quantized module's weight as ModelOpt's own NVFP4QTensor / FP8QTensor
dequantize it (the sha256 of its bf16 bytes). Every file's sha256 and the versions that ran are in
PROVENANCE.json.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import sys
from pathlib import Path

SEED = 0
CONFIG = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 3,
    "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 96,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 256,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "architectures": ["DeepseekV3ForCausalLM"],
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model():  # type: ignore[no-untyped-def]
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    return DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).to(torch.bfloat16).eval()


def calibrate(m) -> None:  # type: ignore[no-untyped-def]
    import torch

    for s in range(4):
        m(torch.randint(0, CONFIG["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(s)))


def mixed_cfg():  # type: ignore[no-untyped-def]
    """FP8 for every quantized Linear module, NVFP4 for the routed experts (later entries win)."""
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    nvfp4 = [e for e in mtq.NVFP4_DEFAULT_CFG["quant_cfg"] if e.get("quantizer_name") in
             ("*weight_quantizer", "*input_quantizer")]
    for e in nvfp4:
        cfg["quant_cfg"].append({**e, "quantizer_name": "*mlp.experts.*" + e["quantizer_name"][1:]})
    return cfg


def dequantized(folder: Path) -> dict[str, str]:
    """Module -> sha256 of its weight as ModelOpt's own NVFP4QTensor / FP8QTensor dequantize it (bf16 bytes)."""
    import torch
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    out: dict[str, str] = {}
    for name, w in sorted(tensors.items()):
        if not name.endswith(".weight") or name[: -len(".weight")] + ".weight_scale" not in tensors:
            continue
        module = name[: -len(".weight")]
        scale = tensors[module + ".weight_scale"]
        if w.dtype == torch.uint8:
            shape = torch.Size((w.shape[0], w.shape[1] * 2))
            deq = NVFP4QTensor(shape, torch.bfloat16, w).dequantize(
                scale=scale, double_scale=tensors[module + ".weight_scale_2"], block_sizes={-1: 16})
        else:
            deq = FP8QTensor(w.shape, torch.bfloat16, w).dequantize(scale=scale)
        bits = deq.to(torch.bfloat16).contiguous().view(torch.uint16).numpy()
        out[module] = hashlib.sha256(bits.tobytes()).hexdigest()
    return out


def main() -> None:
    import modelopt
    import modelopt.torch.quantization as mtq
    import torch
    import transformers
    from modelopt.torch.export import export_hf_checkpoint

    out = Path(sys.argv[1])
    nvfp4_kv = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    nvfp4_kv["quant_cfg"] = nvfp4_kv["quant_cfg"] + mtq.FP8_KV_CFG["quant_cfg"]
    variants = {"nvfp4-kv": nvfp4_kv, "fp8": mtq.FP8_DEFAULT_CFG, "mixed": mixed_cfg()}
    files: dict[str, str] = {}
    for name, cfg in variants.items():
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        m = mtq.quantize(model(), cfg, calibrate)
        with torch.inference_mode():
            export_hf_checkpoint(m, export_dir=target)
        (target / "generation_config.json").unlink(missing_ok=True)
        (target / "dequantized.json").write_text(json.dumps(dequantized(target), indent=1) + "\n")
        files.update({f"{name}/{p.name}": sha256(p) for p in sorted(target.iterdir())})
    provenance = {
        "written_by": "tests/writers/modelopt_generate.py", "script_sha256": sha256(Path(__file__)),
        "nvidia-modelopt": modelopt.__version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "source_config": CONFIG, "seed": SEED, "files": files,
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
