"""Write tests/data/llmcompressor with llmcompressor's own `oneshot` (compressed-tensors' compressors), on the CPU,
from a tiny Kimi-K2-shaped DeepseekV3 that transformers builds.

Not run by the test suite (llmcompressor needs its own torch, transformers and compressed-tensors). Run in its own
venv:

    python -m venv /tmp/w-llmc && /tmp/w-llmc/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1
    /tmp/w-llmc/bin/python tests/writers/llmcompressor_generate.py tests/data/llmcompressor

Calibrated on a few token sequences of a word-level tokenizer made here (no Hub). Variants, each a folder as
`save_pretrained(save_compressed=True)` writes it (its recipe.yaml and generation config left out):
- fp8-kv: FP8_DYNAMIC weights with an FP8 KV cache (`kv_cache_scheme`: the per-layer `self_attn.k_scale` and
  `v_scale` the vLLM-oriented FP8 releases store);
- w4a16-asym: W4A16 asymmetric (int4 with zero points, groups of 32 here, 128 in the releases);
- glm5-w4a16-asym: the same of a tiny GLM-5 (transformers' GlmMoeDsa), as llmcompressor's GLM-5 W4A16 releases:
  its `Linear` target takes the indexer's weights_proj too.
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
GLM5 = {
    "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 2, "n_shared_experts": 1,
    "n_routed_experts": 4, "kv_lora_rank": 64, "q_lora_rank": 96, "qk_rope_head_dim": 32, "v_head_dim": 32,
    "qk_nope_head_dim": 32, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "tie_word_embeddings": False,
    "index_n_heads": 2, "index_head_dim": 32, "architectures": ["GlmMoeDsaForCausalLM"],
}
"""GLM-5 (glm_moe_dsa) scaled down: the V3.2 indexer in every layer, its weights_proj an nn.Linear."""
KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
IGNORE = ["lm_head", "re:.*mlp.gate$"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(CONFIG["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1", eos_token="t2")


def main() -> None:
    import compressed_tensors
    import llmcompressor
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.core import reset_session
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import (
        AutoModelForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        GlmMoeDsaConfig,
        GlmMoeDsaForCausalLM,
    )

    out = Path(sys.argv[1])
    asym = {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}}}
    recipes = {
        "fp8-kv": (QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=IGNORE, kv_cache_scheme=KV),
                   "src"),
        "w4a16-asym": (QuantizationModifier(ignore=IGNORE, config_groups=asym), "src"),
        "glm5-w4a16-asym": (QuantizationModifier(ignore=IGNORE, config_groups=asym), "glm5"),
    }
    n = CONFIG["vocab_size"]
    ds = Dataset.from_dict({"input_ids": [[(7 * i + j) % n for j in range(32)] for i in range(8)],
                            "attention_mask": [[1] * 32] * 8})
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(SEED)
        DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).to(torch.bfloat16).save_pretrained(Path(tmp) / "src")
        torch.manual_seed(SEED)
        GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**GLM5)).to(torch.bfloat16).save_pretrained(Path(tmp) / "glm5")
        for name, (recipe, source) in recipes.items():
            src = Path(tmp) / source
            target = out / name
            if target.exists():
                shutil.rmtree(target)
            reset_session()  # one oneshot per session
            model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
            oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=8, max_seq_length=32,
                    processor=tokenizer())
            model.save_pretrained(target, save_compressed=True)
            for extra in ("recipe.yaml", "generation_config.json"):
                (target / extra).unlink(missing_ok=True)
            files.update({f"{name}/{p.name}": sha256(p) for p in sorted(target.iterdir())})
    provenance = {
        "written_by": "tests/writers/llmcompressor_generate.py", "script_sha256": sha256(Path(__file__)),
        "llmcompressor": llmcompressor.__version__, "compressed-tensors": compressed_tensors.__version__,
        "torch": torch.__version__, "transformers": transformers.__version__, "source_config": CONFIG,
        "glm5_config": GLM5, "seed": SEED, "files": files,
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
