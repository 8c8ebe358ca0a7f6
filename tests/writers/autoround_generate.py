"""Write tests/data/autoround with Intel AutoRound's own quantizer and exporter (`AutoRound(...).quantize_and_save`),
on the CPU, from a tiny Kimi-K2-shaped DeepseekV3 that transformers builds.

Not run by the test suite (auto-round needs its own torch and transformers). Run in its own venv:

    python -m venv /tmp/w-autoround && /tmp/w-autoround/bin/pip install torch==2.13.0 auto-round==0.16.1 \
        transformers accelerate safetensors
    /tmp/w-autoround/bin/python tests/writers/autoround_generate.py tests/data/autoround

RTN (`iters=0`) on a few texts of a word-level tokenizer made here (AutoRound's default calibration set is on the
Hub). Variants, each a folder as the exporter writes it (its tokenizer files left out):
- w4g32-gptq: 4 bits, groups of 32, symmetric, AutoRound's own format (packing `auto_round:auto_gptq`);
- w4g32-awq: the same, exported `auto_round:auto_awq` (its config says float16 beside BF16 tensors);
- int2-mixed: 2 bits with 4-bit attention and 8-bit shared experts per layer (`layer_config`), as
  OPEA/DeepSeek-R1-int2-mixed-sym-inc.
Beside each, dequantized.json: every quantized module's weight as AutoRound's own code computes it (the GPTQ
packing: transformers' from_pretrained with auto-round's integration, the weight each QuantLinear's forward computes;
the AWQ packing, which that integration cannot load on the CPU: its export module's `dequantize_gemm`): the sha256
of the bytes of [out, in] in the module's dtype. Every file's sha256 and the
versions that ran are in PROVENANCE.json.
"""

from __future__ import annotations

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
VARIANTS = {
    "w4g32-gptq": {"bits": 4, "format": "auto_round", "layer_config": {}},
    "w4g32-awq": {"bits": 4, "format": "auto_round:auto_awq", "layer_config": {}},
    "int2-mixed": {"bits": 2, "format": "auto_round", "layer_config": {
        **{f"model.layers.{n}.self_attn.{m}": {"bits": 4} for n in range(3)
           for m in ("q_a_proj", "q_b_proj", "kv_b_proj", "o_proj")},
        **{f"model.layers.{n}.mlp.shared_experts.{m}": {"bits": 8} for n in (1, 2)
           for m in ("gate_proj", "up_proj", "down_proj")}}},
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(CONFIG["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1", eos_token="t2")


def write(target: Path, bits: int, fmt: str, layer_config: dict) -> None:  # type: ignore[type-arg]
    import torch
    from auto_round import AutoRound
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).to(torch.bfloat16)
    texts = [" ".join(f"t{(7 * i + j) % CONFIG['vocab_size']}" for j in range(64)) for i in range(16)]
    ar = AutoRound(model, tokenizer(), bits=bits, group_size=32, sym=True, iters=0, device_map="cpu",
                   dataset=texts, nsamples=8, seqlen=32, layer_config=layer_config or None)
    tmp = target.with_name(target.name + ".tmp")
    ar.quantize_and_save(str(tmp), format=fmt)
    (written,) = [p.parent for p in tmp.rglob("config.json")]
    shutil.move(str(written), str(target))
    shutil.rmtree(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (target / name).unlink(missing_ok=True)


def dequantized_awq(folder: Path) -> dict[str, str]:
    """The AWQ packing: auto-round's own export module's `dequantize_gemm` (its inference cannot load the packing
    on the CPU), [in, out] transposed to [out, in], in the scales' dtype."""
    import torch
    from auto_round.export.export_to_awq.utils import dequantize_gemm
    from safetensors.torch import load_file

    q = json.loads((folder / "config.json").read_text())["quantization_config"]
    tensors = load_file(folder / "model.safetensors")
    out: dict[str, str] = {}
    for name in sorted(n for n in tensors if n.endswith(".qweight")):
        module = name[: -len(".qweight")]
        extra = q.get("extra_config", {}).get(module, {})
        w = dequantize_gemm(tensors[name], tensors[module + ".qzeros"], tensors[module + ".scales"],
                            extra.get("bits", q["bits"]), extra.get("group_size", q["group_size"]))
        out[module] = hashlib.sha256(w.t().contiguous().view(torch.uint16).numpy().tobytes()).hexdigest()
    return out


def dequantized(folder: Path) -> dict[str, str]:
    import torch
    from transformers import AutoModelForCausalLM

    if "auto_awq" in (folder / "config.json").read_text():
        return dequantized_awq(folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder), device_map="cpu")
    out: dict[str, str] = {}
    seen: list[torch.Tensor] = []
    matmul = torch.matmul

    def capture(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # the weight forward computes, as it is
        seen.append(w)
        return matmul(x, w)

    torch.matmul = capture  # type: ignore[assignment]
    try:
        for name, module in model.named_modules():
            if hasattr(module, "qweight") and hasattr(module, "scales"):
                inp = getattr(module, "in_features", None) or module.infeatures
                seen.clear()
                with torch.inference_mode():
                    module(torch.zeros(1, inp, dtype=module.scales.dtype))
                w = seen[-1].t().contiguous()
                out[name] = hashlib.sha256(w.view(torch.uint16).numpy().tobytes()).hexdigest()
    finally:
        torch.matmul = matmul  # type: ignore[assignment]
    return dict(sorted(out.items()))


def main() -> None:
    import auto_round
    import torch
    import transformers

    out = Path(sys.argv[1])
    files: dict[str, str] = {}
    for name, v in VARIANTS.items():
        target = out / name
        if target.exists():
            shutil.rmtree(target)
        write(target, v["bits"], v["format"], v["layer_config"])
        (target / "dequantized.json").write_text(json.dumps(dequantized(target), indent=1) + "\n")
        files.update({f"{name}/{p.name}": sha256(p) for p in sorted(target.iterdir())})
    provenance = {
        "written_by": "tests/writers/autoround_generate.py", "script_sha256": sha256(Path(__file__)),
        "auto-round": auto_round.__version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "source_config": CONFIG, "seed": SEED, "files": files,
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
