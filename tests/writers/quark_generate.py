"""Write tests/data/quark with AMD Quark's own file-to-file quantization (`ModelQuantizer.direct_quantize_checkpoint`,
the flow amd/Kimi-K2.5-MXFP4-AttnFP8 and amd/Kimi-K2.7-Code-MXFP4 were made with), on the CPU, from a tiny
Kimi-K2-shaped DeepseekV3 that transformers saves in shards.

Not run by the test suite (amd-quark needs its own torch and transformers). Run in its own venv:

    python -m venv /tmp/w-quark && /tmp/w-quark/bin/pip install torch==2.13.0 amd-quark==0.13 \
        transformers accelerate safetensors
    /tmp/w-quark/bin/python tests/writers/quark_generate.py tests/data/quark

Variants, each a folder as Quark writes it (config.json with `quant_method: quark`, the index, the shards):
- mxfp4-attnfp8: OCP MXFP4 weights (E8M0 scales per 32) everywhere, FP8 e4m3 per-channel for `*self_attn*`;
- fp8-tensor: FP8 e4m3 per-tensor weights (file-to-file is weight-only: it calibrates no activation).
Beside each, dequantized.json: every quantized module's weight as Quark's own importer dequantizes it
(`import_model_from_safetensors`, QParamsLinear's weight quantizer: the sha256 of its float32 bytes).
Every file's sha256 and the versions that ran are in PROVENANCE.json.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 0
CONFIG = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 3,
    "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 96,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 256,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "architectures": ["DeepseekV3ForCausalLM"],
}
EXCLUDE = ["lm_head", "*.mlp.gate"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_source(out: Path) -> None:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).to(torch.bfloat16).save_pretrained(out, max_shard_size="400KB")


def configs():  # type: ignore[no-untyped-def]
    from quark.torch.quantization.config.config import (
        FP8E4M3PerChannelSpec,
        FP8E4M3PerTensorSpec,
        OCP_MXFP4Spec,
        QConfig,
        QLayerConfig,
    )

    mx = OCP_MXFP4Spec(ch_axis=-1, is_dynamic=False).to_quantization_spec()
    per_channel = FP8E4M3PerChannelSpec(ch_axis=0, is_dynamic=False).to_quantization_spec()
    per_tensor = FP8E4M3PerTensorSpec(is_dynamic=False).to_quantization_spec()
    return {
        "mxfp4-attnfp8": QConfig(global_quant_config=QLayerConfig(weight=mx),
                                 layer_quant_config={"*self_attn*": QLayerConfig(weight=per_channel)},
                                 exclude=EXCLUDE),
        "fp8-tensor": QConfig(global_quant_config=QLayerConfig(weight=per_tensor), exclude=EXCLUDE),
    }


def dequantized(folder: Path) -> dict[str, str]:
    import torch
    from quark.torch import import_model_from_safetensors

    model = import_model_from_safetensors(None, str(folder), device="cpu")
    out: dict[str, str] = {}
    for name, module in model.named_modules():
        if type(module).__name__ == "QParamsLinear":
            w = module._get_qweight(module.weight).to(torch.float32).contiguous()
            out[name] = hashlib.sha256(w.numpy().tobytes()).hexdigest()
    return dict(sorted(out.items()))


def main() -> None:
    import quark
    import torch
    import transformers
    from quark.torch import ModelQuantizer

    out = Path(sys.argv[1])
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        save_source(src)
        for name, qconfig in configs().items():
            target = out / name
            if target.exists():
                shutil.rmtree(target)
            ModelQuantizer(qconfig).direct_quantize_checkpoint(str(src), str(target), device="cpu")
            (target / "generation_config.json").unlink(missing_ok=True)
            (target / "dequantized.json").write_text(json.dumps(dequantized(target), indent=1) + "\n")
            files.update({f"{name}/{p.name}": sha256(p) for p in sorted(target.iterdir())})
    provenance = {
        "written_by": "tests/writers/quark_generate.py", "script_sha256": sha256(Path(__file__)),
        "amd-quark": getattr(quark, "__version__", "0.13"), "torch": torch.__version__,
        "transformers": transformers.__version__, "source_config": CONFIG, "seed": SEED, "files": files,
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
