"""Write tests/data/gguf with llama.cpp's own tools: the converter (`convert_hf_to_gguf.py`), `llama-quantize` and
`llama-gguf-split`, from a tiny Kimi-K2-shaped DeepseekV3 checkpoint saved by transformers.

Not run by the test suite (llama.cpp is built from the `llama-cpp-python` source package, which vendors it; cmake
on this CPU). Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    LLAMA_BIN=$LLAMA_CPP/build/bin \
    python tests/writers/gguf_generate.py tests/data/gguf

with torch and transformers importable (the converter reads the safetensors through them). The converter's
tensor path and metadata are its own; only its vocabulary is replaced: the tiny model has no tokenizer, and the
converter's DeepseekV2Model.set_vocab needs a released one (it hashes the pre-tokenizer), so `synthetic_vocab`
writes a byte-level token list of the config's vocab_size (what the audit checks of it: its length). Everything
written is recorded in PROVENANCE.json (tool versions, llama.cpp's commit, this script's sha256, each file's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 0
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 256, "kv_lora_rank": 256,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": 512,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_theta": 50000.0,
}
"""Kimi-K2-Instruct's config keys scaled down (every dimension a multiple of 256 where K-quants need one)."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_source(out: Path, scoring_func: str | None) -> None:
    """The tiny model as transformers saves it, with the router's correction bias DeepSeek's release stores
    (transformers keeps it as a buffer) and the release's `scoring_func` key (transformers' config has none)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(SEED)
    cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="4MB")
    gen = torch.Generator().manual_seed(SEED + 1)
    for shard in sorted(out.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in list(tensors):
            if name.endswith("mlp.gate.weight"):
                bias = name.replace(".weight", ".e_score_correction_bias")
                tensors.setdefault(bias, torch.rand(CONFIG["n_routed_experts"], generator=gen, dtype=torch.float32))
        save_file(tensors, shard, metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        for shard in sorted(out.glob("*.safetensors")):
            for name in load_file(shard):
                data["weight_map"][name] = shard.name
        index.write_text(json.dumps(data, indent=2))
    config = json.loads((out / "config.json").read_text())
    config.update({k: CONFIG[k] for k in ("architectures", "rope_scaling", "routed_scaling_factor")})
    if scoring_func is not None:
        config["scoring_func"] = scoring_func
        config["topk_method"] = "noaux_tc"
    (out / "config.json").write_text(json.dumps(config, indent=2))


def synthetic_vocab(self) -> None:  # type: ignore[no-untyped-def]
    """A byte-level BPE vocabulary of the config's vocab_size (the converter's own writer calls)."""
    import gguf

    n = self.hparams["vocab_size"]
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    tokens = printable + [f"tok{i}" for i in range(len(printable), n)]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("kimi-k2")
    self.gguf_writer.add_token_list(tokens)
    self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
    self.gguf_writer.add_token_merges(["t o", "to k"])
    self.gguf_writer.add_bos_token_id(0)
    self.gguf_writer.add_eos_token_id(1)


def convert(llama_cpp: Path, src: Path, outfile: Path) -> None:
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion.deepseek import DeepseekV2Model  # type: ignore[import-not-found]

    DeepseekV2Model.set_vocab = synthetic_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(outfile), "--outtype", "bf16"]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    out = Path(sys.argv[1])
    llama_cpp = Path(os.environ["LLAMA_CPP"])
    bin_dir = Path(os.environ["LLAMA_BIN"])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.gguf"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        save_source(t / "hf", "sigmoid")
        save_source(t / "hf-noscoring", None)
        convert(llama_cpp, t / "hf", t / "tiny-BF16.gguf")
        convert(llama_cpp, t / "hf-noscoring", t / "noscoring-BF16.gguf")
        quantize = str(bin_dir / "llama-quantize")
        run(quantize, str(t / "tiny-BF16.gguf"), str(t / "tiny-Q8_0.gguf"), "Q8_0")
        run(quantize, str(t / "tiny-BF16.gguf"), str(out / "tiny-Q2_K.gguf"), "Q2_K")
        run(quantize, str(t / "noscoring-BF16.gguf"), str(out / "noscoring-Q2_K.gguf"), "Q2_K")
        (out / "Q8_0").mkdir(exist_ok=True)
        for old in (out / "Q8_0").glob("*.gguf"):
            old.unlink()
        run(str(bin_dir / "llama-gguf-split"), "--split", "--split-max-tensors", "16", str(t / "tiny-Q8_0.gguf"),
            str(out / "Q8_0" / "tiny-Q8_0"))
        shutil.copy(t / "hf" / "config.json", out / "source.config.json")
    commit = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    import gguf  # the vendored gguf-py the converter ran with
    import torch
    import transformers

    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
    provenance = {
        "written_by": "tests/writers/gguf_generate.py",
        "script_sha256": sha256(Path(__file__)),
        "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                      "tools": ["convert_hf_to_gguf.py", "llama-quantize", "llama-gguf-split"]},
        "gguf-py": getattr(gguf, "__version__", "vendored"),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "source_config": CONFIG, "seed": SEED,
        "files": {str(p.relative_to(out)): sha256(p) for p in files},
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
