"""Write tests/data/autoawq with AutoAWQ 0.2.9's own quantizer and `save_quantized`, on the CPU, from a tiny
Kimi-K2-shaped DeepseekV3 saved in BF16 (Kimi-K2's dtype) by transformers.

Not run by the test suite. AutoAWQ 0.2.9 reads DeepseekV3's experts as a ModuleList (transformers 4.x), so it runs
in its own venv with transformers 4.51.3:

    python -m venv /tmp/w-awq && /tmp/w-awq/bin/pip install torch==2.13.0 autoawq==0.2.9 \
        transformers==4.51.3 'datasets<4'
    /tmp/w-awq/bin/python tests/writers/autoawq_generate.py tests/data/autoawq

GEMM, 4 bits, groups of 32, zero points, no clipping search (its clip batch must divide every output width), on
a few texts of a word-level tokenizer made here. What this output shows: AutoAWQ writes the scales float16 whatever
the model's dtype (WQLinear_GEMM), beside a config whose torch_dtype stays bfloat16. Beside it, dequantized.json:
every module's weight as AutoAWQ's own `awq.utils.packing_utils.dequantize_gemm` computes it ([in, out] transposed
to [out, in], float16; the sha256 of its bytes). Every file's sha256 and the versions that ran are in
PROVENANCE.json.
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
    "kv_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "vocab_size": 256,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "architectures": ["DeepseekV3ForCausalLM"],
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    import awq
    import torch
    import transformers
    from awq import AutoAWQForCausalLM
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    out = Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    n = CONFIG["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1", eos_token="t2")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        torch.manual_seed(SEED)
        DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).to(torch.bfloat16).save_pretrained(src)
        tokenizer.save_pretrained(src)
        model = AutoAWQForCausalLM.from_pretrained(str(src), device_map="cpu")
        texts = [" ".join(f"t{(7 * i + j) % n}" for j in range(64)) for i in range(16)]
        model.quantize(tokenizer, quant_config={"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"},
                       calib_data=texts, max_calib_samples=16, max_calib_seq_len=64, apply_clip=False)
        model.save_quantized(str(out))
    (out / "generation_config.json").unlink(missing_ok=True)
    tensors = load_file(out / "model.safetensors")
    deq: dict[str, str] = {}
    for name in sorted(t for t in tensors if t.endswith(".qweight")):
        module = name[: -len(".qweight")]
        w = dequantize_gemm(tensors[name], tensors[module + ".qzeros"], tensors[module + ".scales"], 4, 32)
        deq[module] = hashlib.sha256(w.t().contiguous().view(torch.uint16).numpy().tobytes()).hexdigest()
    (out / "dequantized.json").write_text(json.dumps(deq, indent=1) + "\n")
    provenance = {
        "written_by": "tests/writers/autoawq_generate.py", "script_sha256": sha256(Path(__file__)),
        "autoawq": awq.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "source_config": CONFIG, "seed": SEED,
        "files": {p.name: sha256(p) for p in sorted(out.iterdir())},
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
