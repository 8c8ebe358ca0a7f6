"""Write tests/data/gguf_archs with llama.cpp's own converter (`convert_hf_to_gguf.py`): one tiny model per GGUF
architecture of the lineage beside `deepseek2` (tests/writers/gguf_generate.py), each built with transformers' own
class for it, seeded, saved by `save_pretrained` and converted to Q8_0:

- `deepseek32`: DeepseekV32ForCausalLM (converter class DeepseekV32Model, conversion/deepseek.py);
- `glm-dsa`: GlmMoeDsaForCausalLM (GlmMoeDsaModel, conversion/glm.py), one layer sharing its indexer;
- `kimi-linear`: KimiLinearForCausalLM (KimiLinearModel, conversion/kimi_linear.py).

Not run by the test suite. Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    python tests/writers/gguf_archs_generate.py tests/data/gguf_archs

with torch and transformers importable. The converter's tensor path and metadata are its own; only its vocabulary
is replaced (`synthetic_vocab`: the tiny models have no tokenizer). The transformers save is written beside each
GGUF's conversion (config.json and model.safetensors, BF16) with the router correction bias the releases store
added where transformers keeps it as a buffer, and Kimi-Linear's dense MLP renamed from transformers'
`block_sparse_moe.{gate,up,down}_proj` back to the release's `mlp.` (llama.cpp's converter at 0c1e5709 maps no
other: "Can not map tensor 'model.layers.0.block_sparse_moe.down_proj.weight'"), so `audit GGUF --against source`
runs on the files the converter read. The source is not committed (1.1 MB each): `save_source` rewrites it,
seeded, and PROVENANCE.json records its files' sha256 beside the tool versions, llama.cpp's commit, this script's sha256, each GGUF's and the source config.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SEED = 0
MLA = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 3,
    "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32,
    "v_head_dim": 32, "vocab_size": 256, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_theta": 10000.0,
}
"""The MLA models' shared dimensions: every row a multiple of 32 (Q8_0's block)."""
CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek32": {**MLA, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 64,
                   "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "glm-dsa": {**MLA, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 64, "rms_norm_eps": 1e-5,
                "indexer_types": ["full", "shared", "full"]},
    "kimi-linear": {
        "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 64, "q_lora_rank": None,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "vocab_size": 256,
        "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "linear_num_heads": 2, "linear_head_dim": 32, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "full_attention"], "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 1,
        "moe_router_activation_func": "sigmoid",
    },
}
"""Each architecture's tiny config (the keys transformers' config class takes; EXTRA, which the config classes have
no field for, are added to the saved config.json as the releases have them: DeepSeek-V3.2's `scoring_func` and
`topk_method`, Kimi-Linear's `moe_router_activation_func`, which the converter writes `expert_gating_func` from and
llama.cpp's kimi-linear loader requires)."""
CLASSES = {"deepseek32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
           "glm-dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
           "kimi-linear": ("KimiLinearConfig", "KimiLinearForCausalLM")}
EXTRA = ("scoring_func", "topk_method", "moe_router_activation_func")
PRE = {"deepseek32": "deepseek-v3", "glm-dsa": "glm4", "kimi-linear": "kimi-k2"}
"""The pre-tokenizer name each synthetic vocabulary carries (the release's)."""
KIMI_LINEAR_ATTN = {"short_conv_kernel_size": 4, "head_dim": 32, "num_heads": 2, "kda_layers": [1, 2],
                    "full_attn_layers": [3]}
"""Moonshot's `linear_attn_config` (the converter reads the MLA layers from it), matching `layer_types`."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_source(arch: str, out: Path) -> None:
    """The tiny model as transformers saves it (BF16), the router correction bias added where transformers keeps
    it as a buffer (DeepSeek's and Moonshot's releases store it), the release-only config keys added."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(SEED)
    config_cls, model_cls = (getattr(transformers, n) for n in CLASSES[arch])
    cfg = {k: v for k, v in CONFIGS[arch].items() if k not in EXTRA}
    model = model_cls(config_cls(**cfg)).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="50MB")
    gen = torch.Generator().manual_seed(SEED + 1)
    shard = out / "model.safetensors"
    tensors = load_file(shard)
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts")
    for name in list(tensors):
        dense = re.match(r"^(model\.layers\.\d+\.)block_sparse_moe\.((gate|up|down)_proj\.weight)$", name)
        if arch == "kimi-linear" and dense:  # the release's spelling: the converter maps no other
            tensors[f"{dense.group(1)}mlp.{dense.group(2)}"] = tensors.pop(name)
        if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            bias = name.replace(".weight", ".e_score_correction_bias")
            tensors.setdefault(bias, torch.rand(experts, generator=gen, dtype=torch.float32))
    save_file(tensors, shard, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update({k: CONFIGS[arch][k] for k in EXTRA if k in CONFIGS[arch]})
    if arch == "kimi-linear":
        config["linear_attn_config"] = KIMI_LINEAR_ATTN
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def synthetic_vocab(pre: str) -> Any:
    def set_vocab(self: Any) -> None:
        """A byte-level BPE vocabulary of the config's vocab_size (the converter's own writer calls)."""
        import gguf

        n = self.hparams["vocab_size"]
        printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
        tokens = printable + [f"tok{i}" for i in range(len(printable), n)]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre(pre)
        self.gguf_writer.add_token_list(tokens)
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_token_merges(["t o", "to k"])
        self.gguf_writer.add_bos_token_id(0)
        self.gguf_writer.add_eos_token_id(1)
    return set_vocab


def convert(llama_cpp: Path, arch: str, src: Path, outfile: Path) -> None:
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion.deepseek import DeepseekV32Model  # type: ignore[import-not-found]
    from conversion.glm import GlmMoeDsaModel  # type: ignore[import-not-found]
    from conversion.kimi_linear import KimiLinearModel  # type: ignore[import-not-found]

    cls = {"deepseek32": DeepseekV32Model, "glm-dsa": GlmMoeDsaModel, "kimi-linear": KimiLinearModel}[arch]
    cls.set_vocab = synthetic_vocab(PRE[arch])
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(outfile), "--outtype", "q8_0"]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def main() -> None:
    out = Path(sys.argv[1])
    llama_cpp = Path(os.environ["LLAMA_CPP"])
    archs = sys.argv[2:] or list(CONFIGS)
    commit = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for arch in archs:
        folder = out / arch
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.gguf"):
            old.unlink()
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "source"
            save_source(arch, source)
            (source / "generation_config.json").unlink(missing_ok=True)
            convert(llama_cpp, arch, source, folder / "tiny-Q8_0.gguf")
            sources = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(source.iterdir())}
        import torch
        import transformers

        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
        provenance = {
            "written_by": "tests/writers/gguf_archs_generate.py",
            "script_sha256": sha256(Path(__file__)),
            "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                          "tools": ["convert_hf_to_gguf.py --outtype q8_0"],
                          "converter_class": {"deepseek32": "DeepseekV32Model", "glm-dsa": "GlmMoeDsaModel",
                                              "kimi-linear": "KimiLinearModel"}[arch]},
            "gguf-py": "vendored (llama.cpp's gguf-py)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "transformers_class": CLASSES[arch][1], "source_config": CONFIGS[arch], "seed": SEED,
            "source_renames": ("the dense layers' block_sparse_moe.{gate,up,down}_proj (transformers' save) renamed "
                               "mlp.* (the release's, which the converter maps)") if arch == "kimi-linear" else None,
            "source_files": sources,
            "source_note": "not committed: save_source(arch, folder) rewrites it (tests/test_gguf_archs.py does)",
            "vocabulary": f"synthetic (tokenizer.ggml.pre {PRE[arch]!r}): the tiny model has no tokenizer",
            "files": {str(p.relative_to(folder)): {"sha256": sha256(p), "bytes": p.stat().st_size} for p in files},
        }
        (folder / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
