"""Writes tests/data/gptq/: a tiny DeepseekV3 (Kimi-K2 shaped: MLA with q_lora, one dense and one MoE layer)
quantized by GPTQModel itself, in both of its checkpoint formats (`gptq`, whose zero points are stored minus
one, and `gptq_v2`), with GPTQModel's own dequantization of every module beside it (reference.json: the sha256
of each weight).

GPTQModel 7.7 needs torch >= 2.14.1 (the test venv pins 2.13.0), so it runs in its own venv:

    python3 -m venv /tmp/gptqvenv && /tmp/gptqvenv/bin/pip install gptqmodel==7.7.0
    GPTQMODEL_CPU_WORKERS=2 /tmp/gptqvenv/bin/python tests/writers/gptq_generate.py tests/data/gptq

The output (a few hundred KB) is committed with PROVENANCE.json (versions, settings, this script's sha256).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers

CONFIG = {
    "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "q_lora_rank": 128, "kv_lora_rank": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "num_hidden_layers": 2,
    "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "vocab_size": 256, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "max_position_embeddings": 256,
}
FORMATS = ("gptq", "gptq_v2")


def main(out: Path) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig, __version__

    torch.manual_seed(0)
    work = out / "_bf16"
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**CONFIG)).to(torch.bfloat16)
    model.save_pretrained(work)
    tokenizer(CONFIG["vocab_size"]).save_pretrained(work)  # GPTQModel.load wants one; the ids are given below
    calibration = [{"input_ids": torch.randint(0, CONFIG["vocab_size"], (1, 64)).tolist()[0]} for _ in range(8)]
    for fmt in FORMATS:
        qcfg = QuantizeConfig(bits=4, group_size=32, desc_act=False, sym=True, format=fmt)
        q = GPTQModel.load(str(work), qcfg, device="cpu")
        q.quantize(calibration, batch_size=1)
        q.save(str(out / fmt))
        for extra in ("quant_log.csv", "generation_config.json"):
            (out / fmt / extra).unlink(missing_ok=True)
        reference(out / fmt, fmt)
    shutil.rmtree(work)
    script = Path(__file__).read_bytes()
    (out / "PROVENANCE.json").write_text(json.dumps({
        "writer": f"gptqmodel {__version__}", "torch": torch.__version__, "transformers": transformers.__version__,
        "settings": {"bits": 4, "group_size": 32, "desc_act": False, "sym": True, "formats": list(FORMATS)},
        "config": CONFIG, "script": "tests/writers/gptq_generate.py",
        "script_sha256": hashlib.sha256(script).hexdigest()}, indent=2) + "\n")


def tokenizer(vocab: int) -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer of `vocab` tokens (`t0` ... ), built with the tokenizers library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1",
                                                eos_token="t2", bos_token="t3")


def reference(path: Path, fmt: str) -> None:
    """GPTQModel's own dequantization of every quantized module, loaded back by GPTQModel (its torch kernel,
    which converts `gptq` zero points to `gptq_v2` on load): `dequantize_weight()` of each TorchQuantLinear,
    [in, out], transposed to the module's [out, in]; reference.json holds its dtype, shape and the sha256 of
    its bytes (the arrays themselves would be megabytes)."""
    from gptqmodel import BACKEND, GPTQModel

    m = GPTQModel.load(str(path), device="cpu", backend=BACKEND.TORCH)
    out = {}
    for name, module in m.model.named_modules():
        if hasattr(module, "dequantize_weight") and hasattr(module, "qweight"):
            w = module.dequantize_weight().T.contiguous()
            assert list(w.shape) == [module.out_features, module.in_features], name
            out[name] = {"dtype": str(w.dtype).removeprefix("torch."), "shape": list(w.shape),
                         "sha256": hashlib.sha256(w.view(torch.int16).numpy().tobytes()).hexdigest()}
    (path / "reference.json").write_text(json.dumps({"format": fmt, "modules": out}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
