"""Write tests/data/llmcompressor-kimi-linear with llmcompressor's own `oneshot`, on the CPU: a tiny Kimi-Linear
(transformers' KimiLinearForCausalLM) quantized FP8_BLOCK, as llmcompressor's Kimi-Linear FP8 releases are. Its
save spells the routed experts `gate_proj/up_proj/down_proj` where the release (and transformers' loader) has
`w1/w3/w2` (family.md: a writer defect): the fixture of that fault, as the writer itself leaves it.

Not run by the test suite (llmcompressor needs its own torch and transformers). Run in its own venv:

    python -m venv /tmp/w-llmc && /tmp/w-llmc/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1
    /tmp/w-llmc/bin/python tests/writers/llmcompressor_kimi_linear_generate.py tests/data/llmcompressor-kimi-linear

No calibration data (FP8_BLOCK weights are quantized from the weights alone). Every file's sha256 and the versions
that ran are in PROVENANCE.json.
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
    "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
    "q_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 32,
    "num_experts_per_tok": 2, "num_local_experts": 4, "n_shared_experts": 1, "linear_head_dim": 32,
    "linear_num_heads": 4, "linear_conv_kernel_dim": 4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "tie_word_embeddings": False,
}
IGNORE = ["lm_head", "re:.*block_sparse_moe.gate$"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    import compressed_tensors
    import llmcompressor
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, KimiLinearConfig

    out = Path(sys.argv[1])
    target = out / "fp8-block"
    if target.exists():
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(SEED)
        src = Path(tmp) / "src"
        AutoModelForCausalLM.from_config(KimiLinearConfig(**CONFIG), dtype=torch.bfloat16).save_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_BLOCK", ignore=IGNORE))
        model.save_pretrained(target, save_compressed=True)
    for extra in ("recipe.yaml", "generation_config.json"):
        (target / extra).unlink(missing_ok=True)
    provenance = {
        "written_by": "tests/writers/llmcompressor_kimi_linear_generate.py", "script_sha256": sha256(Path(__file__)),
        "llmcompressor": llmcompressor.__version__, "compressed-tensors": compressed_tensors.__version__,
        "torch": torch.__version__, "transformers": transformers.__version__, "source_config": CONFIG, "seed": SEED,
        "files": {f"fp8-block/{p.name}": sha256(p) for p in sorted(target.iterdir())},
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
