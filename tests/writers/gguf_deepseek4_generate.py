"""Write tests/data/gguf_archs/deepseek4 with llama.cpp's own converter (`convert_hf_to_gguf.py --outtype q8_0`,
conversion/deepseek.py DeepseekV4Model, GGUF arch `deepseek4`) from a tiny DeepSeek-V4 in the release's own format.

The source is built by transformers 5.25's own class (DeepseekV4ForCausalLM, seeded), saved by `save_pretrained`,
then written as DeepSeek's release stores its tensors (model.arch.deepseek_v4 cites vLLM's loader of the release
and transformers' conversion mapping): the names without transformers' `model.` prefix (`embed`, `norm`,
`hc_head_*`, `layers.N.attn.kv_norm`), one multi-token-prediction stage `mtp.0.*` (transformers builds none; the
release stores one, the converter drops it), and the release's dtypes: FP8 E4M3 Linear weights with an F8_E8M0
`.scale` per 128 × 128 block, the routed experts FP4 E2M1 two a byte (I8) with an F8_E8M0 `.scale` per 32 inputs
(`expert_dtype: fp4`), the output head, the compressors and the indexer's head weights BF16, the norms, the
embedding and the router BF16, the hyper-connections, sinks, compressor position biases and routing biases F32,
the hash table I64. config.json as the release writes it: `compress_ratios` (one per layer and the MTP stage's),
`num_hash_layers`, `qk_rope_head_dim`, YaRN `rope_scaling`, the FP8 quantization_config.

Not run by the test suite. Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    python tests/writers/gguf_deepseek4_generate.py tests/data/gguf_archs

with torch and transformers importable. Only the converter's vocabulary is replaced (gguf_archs_generate's
`synthetic_vocab`: the tiny model has no tokenizer). The source is not committed: `save_source` rewrites it,
seeded, and PROVENANCE.json records its files' sha256 beside the tool versions, llama.cpp's commit, this script's
sha256, the GGUF's, the source config and the source tensors' total elements (the converter's input).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_archs_generate import sha256, synthetic_vocab

ARCH = "deepseek4"
SEED = 0
FILE = "tiny-Q8_0.gguf"
CONFIG: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 3,
    "num_attention_heads": 2, "head_dim": 64, "q_lora_rank": 32, "num_experts_per_tok": 2, "n_routed_experts": 4,
    "n_shared_experts": 1, "o_groups": 2, "o_lora_rank": 32, "index_n_heads": 2, "index_head_dim": 32,
    "index_topk": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "sliding_window": 16,
    "compress_ratios": [0, 4, 128, 0], "num_hash_layers": 1, "qk_rope_head_dim": 16, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "routed_scaling_factor": 1.5, "norm_topk_prob": True, "scoring_func": "sqrtsoftplus", "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
}
"""The tiny model (DeepseekV4Config's keys, DeepSeek's legacy ones included): a hash-routed sliding-window layer,
a compressed sparse layer (ratio 4, with the lightning indexer) and a heavily compressed one (ratio 128); hc_mult
4 as llama.cpp's graph asserts; every row a multiple of 32 (Q8_0's and MXFP4's block)."""
RELEASE_CONFIG: dict[str, Any] = {
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256, "beta_fast": 32,
                     "beta_slow": 1},
    "expert_dtype": "fp4", "topk_method": "noaux_tc",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
"""What the release's config.json adds (DeepSeek-V4-Flash's keys, the YaRN window scaled to the tiny context)."""
RENAMES = ((r"^model\.layers\.", "layers."), (r"^model\.embed_tokens\.", "embed."), (r"^model\.norm\.", "norm."),
           (r"^model\.hc_head\.hc_", "hc_head_"), (r"\.attn\.norm\.", ".attn.kv_norm."))
"""transformers' save -> the release's names (model.arch.deepseek_v4's `transformers` dialect, read backwards)."""
F32 = ("hc_attn_", "hc_ffn_", "hc_head_", "attn.attn_sink", ".ape", "ffn.gate.bias")
PLAIN = ("head.weight", ".compressor.wkv.weight", ".compressor.wgate.weight", ".indexer.weights_proj.weight")
FP8 = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
       "indexer.wq_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight", "shared_experts.w3.weight",
       "e_proj.weight", "h_proj.weight")
EXPERT = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")
FP8_BLOCK, FP4_GROUP = 128, 32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def release_name(name: str) -> str:
    for pattern, into in RENAMES:
        name = re.sub(pattern, into, name)
    return name


def power_of_two_scale(amax: Any, top: float) -> Any:
    """E8M0 block scales: the least power of two that brings the block's largest magnitude within the format."""
    import torch

    return torch.exp2(torch.ceil(torch.log2(torch.clamp(amax.float() / top, min=2.0 ** -126))))


def fp8(w: Any) -> tuple[Any, Any]:
    """FP8 E4M3 weight and its F8_E8M0 scale per 128 × 128 block, as DeepSeek's release stores a Linear weight."""
    import torch

    out, inp = w.shape
    rows, cols = math.ceil(out / FP8_BLOCK), math.ceil(inp / FP8_BLOCK)
    padded = torch.zeros(rows * FP8_BLOCK, cols * FP8_BLOCK)
    padded[:out, :inp] = w.float()
    blocks = padded.reshape(rows, FP8_BLOCK, cols, FP8_BLOCK)
    scale = power_of_two_scale(blocks.abs().amax(dim=(1, 3)), 448.0)
    q = (blocks / scale[:, None, :, None]).reshape(rows * FP8_BLOCK, cols * FP8_BLOCK)[:out, :inp]
    return q.to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def fp4(w: Any) -> tuple[Any, Any]:
    """FP4 E2M1 codes two a byte (I8 [out, in / 2], element 2i in the low nibble) and an F8_E8M0 scale per 32
    inputs, as DeepSeek-V4's release stores a routed expert (`expert_dtype: fp4`)."""
    import torch

    out, inp = w.shape
    groups = w.float().reshape(out, inp // FP4_GROUP, FP4_GROUP)
    scale = power_of_two_scale(groups.abs().amax(dim=2), 6.0)
    x = groups / scale[:, :, None]
    grid = torch.tensor(E2M1)
    code = (x.abs()[..., None] - grid).abs().argmin(dim=-1) | torch.where(x < 0, 8, 0)
    code = code.reshape(out, inp).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


def as_released(name: str, t: Any) -> dict[str, Any]:
    """One tensor in the release's dtype: {name: tensor} with its `.scale` where quantized."""
    import torch

    stem = name.removesuffix(".weight")
    if EXPERT.search(name):
        w, s = fp4(t)
        return {name: w, f"{stem}.scale": s}
    if name.endswith(FP8):
        w, s = fp8(t)
        return {name: w, f"{stem}.scale": s}
    if name.endswith("tid2eid"):
        return {name: t.to(torch.int64)}
    if any(k in name for k in F32):
        return {name: t.float()}
    return {name: t.to(torch.bfloat16)}


def mtp_stage(tensors: dict[str, Any], gen: Any) -> dict[str, Any]:
    """The release's one MTP stage (vLLM's DeepSeekV4MultiTokenPredictorLayer): `e_proj`, `h_proj`, `enorm`,
    `hnorm`, `norm`, `hc_head_*` and a sliding-window, bias-routed MoE layer, layer 0's parts (less its hash
    table) with layer 1's routing bias."""
    import torch

    h, hc = CONFIG["hidden_size"], CONFIG["hc_mult"]
    out = {f"mtp.0.{n[len('layers.0.'):]}": t.clone() for n, t in tensors.items()
           if n.startswith("layers.0.") and not n.endswith("tid2eid")}
    out["mtp.0.ffn.gate.bias"] = tensors["layers.1.ffn.gate.bias"].clone()
    for p in ("e_proj", "h_proj"):
        out[f"mtp.0.{p}.weight"] = torch.randn(h, h, generator=gen) * 0.02
    for p in ("enorm", "hnorm", "norm"):
        out[f"mtp.0.{p}.weight"] = torch.ones(h)
    out.update({"mtp.0.hc_head_fn": torch.randn(hc, hc * h, generator=gen) * 0.02,
                "mtp.0.hc_head_base": torch.zeros(hc), "mtp.0.hc_head_scale": torch.ones(1)})
    return out


def save_source(out: Path) -> None:
    """The tiny model as DeepSeek's release writes it (model.safetensors, config.json)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(SEED)
    model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**CONFIG))
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        saved = load_file(Path(tmp) / "model.safetensors")
    gen = torch.Generator().manual_seed(SEED + 1)
    tensors = {release_name(n): t for n, t in saved.items()}
    for n in [n for n in tensors if n.endswith(".ffn.gate.bias")]:  # a buffer transformers saves as zeros
        tensors[n] = torch.rand(CONFIG["n_routed_experts"], generator=gen)
    tensors.update(mtp_stage(tensors, gen))
    released: dict[str, Any] = {}
    for name in sorted(tensors):
        released.update(as_released(name, tensors[name]))
    out.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in sorted(released.items())}, out / "model.safetensors",
              metadata={"format": "pt"})
    config = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "dtype": "bfloat16",
              **CONFIG, **RELEASE_CONFIG}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def convert(llama_cpp: Path, src: Path, outfile: Path) -> tuple[dict[str, list[str]], list[str]]:
    """Convert, recording what the converter itself writes each release tensor into (its modify_tensors, and the
    experts and hash tables it writes in generate_extra_tensors; a tensor it drops maps to none) and gguf-py's
    names of MODEL_ARCH.DEEPSEEK4's tensors (TENSOR_NAMES of MODEL_TENSORS, the table TensorNameMap is built
    from): what tests/test_gguf_deepseek4.py holds the dialect's names to."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    import gguf
    from conversion.deepseek import DeepseekV4Model  # type: ignore[import-not-found]

    assert Path(gguf.__file__).is_relative_to(llama_cpp), gguf.__file__  # the vendored gguf-py, not PyPI's
    cls = DeepseekV4Model
    names: dict[str, list[str]] = {}
    modify, experts, hashed = cls.modify_tensors, cls._write_mxfp4_expert_tensor, cls._write_hash_routing_tensors

    def modify_tensors(self: Any, data: Any, name: str, bid: int | None) -> Any:
        out = list(modify(self, data, name, bid))
        names.setdefault(name, []).extend(n for n, _ in out)
        return out

    def write_experts(self: Any, bid: int, proj: str, key: Any) -> list[str]:
        consumed: list[str] = experts(self, bid, proj, key)
        for n in consumed:
            names[n] = [self.format_tensor_name(key, bid)]
        return consumed

    def write_hash(self: Any) -> list[str]:
        consumed: list[str] = hashed(self)
        for n in consumed:
            names[n] = [self.format_tensor_name(gguf.MODEL_TENSOR.FFN_GATE_TID2EID, int(n.split(".")[1]), ".weight")]
        return consumed

    cls.set_vocab = synthetic_vocab("deepseek-v3")
    cls.modify_tensors, cls._write_mxfp4_expert_tensor, cls._write_hash_routing_tensors = (
        modify_tensors, write_experts, write_hash)
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(outfile), "--outtype", "q8_0"]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv
        cls.modify_tensors, cls._write_mxfp4_expert_tensor, cls._write_hash_routing_tensors = modify, experts, hashed
    arch_names = sorted({gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.DEEPSEEK4]
                         for i in range(CONFIG["num_hidden_layers"])})
    return dict(sorted(names.items())), arch_names


def source_elements(folder: Path) -> dict[str, int]:
    """The converter's input in elements: every source tensor's, and those it writes (no `.scale`, no `mtp.`;
    an FP4 expert counted as its unpacked values)."""
    from safetensors import safe_open

    total = written = 0
    with safe_open(folder / "model.safetensors", "pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            n = math.prod(f.get_slice(name).get_shape())
            n *= 2 if EXPERT.search(name) else 1
            total += n
            if not name.endswith(".scale") and not name.startswith("mtp."):
                written += n
    return {"all": total, "converted": written}


def main() -> None:
    out = Path(sys.argv[1]) / ARCH
    llama_cpp = Path(os.environ["LLAMA_CPP"])
    commit = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.gguf"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        save_source(source)
        converter_names, arch_names = convert(llama_cpp, source, out / FILE)
        sources = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(source.iterdir())}
        elements = source_elements(source)
    import torch
    import transformers

    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
    provenance = {
        "written_by": "tests/writers/gguf_deepseek4_generate.py",
        "script_sha256": sha256(Path(__file__)),
        "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                      "tools": ["convert_hf_to_gguf.py --outtype q8_0"], "converter_class": "DeepseekV4Model"},
        "gguf-py": "vendored (llama.cpp's gguf-py)",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "transformers_class": "DeepseekV4ForCausalLM", "source_config": {**CONFIG, **RELEASE_CONFIG}, "seed": SEED,
        "source_format": "the release's: names as released (transformers' save respelled), FP8 E4M3 + F8_E8M0 "
                         "`.scale` per 128 x 128, routed experts FP4 (I8) + F8_E8M0 `.scale` per 32, one MTP stage",
        "source_files": sources, "source_elements": elements,
        "converter_names": converter_names, "gguf_py_names": arch_names,
        "source_note": "not committed: save_source(folder) rewrites it (tests/test_gguf_deepseek4.py does)",
        "vocabulary": "synthetic (tokenizer.ggml.pre 'deepseek-v3'): the tiny model has no tokenizer",
        "files": {str(p.relative_to(out)): {"sha256": sha256(p), "bytes": p.stat().st_size} for p in files},
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
