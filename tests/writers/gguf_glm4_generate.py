"""Write tests/data/gguf_archs/glm4moe and glm4moe-lite with llama.cpp's own converter (`convert_hf_to_gguf.py`):
one tiny GLM-4.x model each, built with transformers' own class, seeded, saved by `save_pretrained` and converted
to Q8_0 with its multi-token-prediction (NextN) layer kept, as the converter keeps it by default:

- `glm4moe`: Glm4MoeForCausalLM (GLM-4.5, 4.5-Air, 4.6, 4.7; converter class Glm4MoeModel, conversion/glm.py,
  GGUF arch `glm4moe`): GQA attention with q/k/v biases and q/k norms, partial rotary, a dense layer then MoE;
- `glm4moe-lite`: Glm4MoeLiteForCausalLM (GLM-4.7-Flash; Glm4MoeLiteModel over DeepseekV2Model, GGUF arch
  `deepseek2`): DeepseekV3's latent attention and MoE, with its NextN layer kept (`deepseek2.nextn_predict_layers`).

Not run by the test suite. Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    python tests/writers/gguf_glm4_generate.py tests/data/gguf_archs

with torch and transformers importable. What this shares with tests/writers/gguf_archs_generate.py (the seed, the
synthetic vocabulary the tiny models need, the digests) is imported from it. The source is transformers' model of
`num_hidden_layers + 1` decoder layers saved as it saves it (BF16), config.json then declaring the last one the
NextN layer (`num_hidden_layers` - 1, `num_nextn_predict_layers` 1), with what the releases store beside it and
transformers builds no module for, seeded (`mtp_head`): the NextN layer's `eh_proj`, `enorm`, `hnorm`,
`shared_head.norm` (vLLM's Glm4MoeMultiTokenPredictorLayer, tests/data/loader_names/glm4_moe.vllm.json) and,
for GLM-4.7-Flash, its `embed_tokens` and `shared_head.head` copies; and each router's correction bias in F32
(transformers keeps it as a zero buffer). GLM-4.7-Flash's config.json names no `scoring_func`; llama.cpp's
deepseek2 loader then routes it by sigmoid only for its own 47 layers and 154,880 tokens, so the tiny one's config
adds `scoring_func: sigmoid`, which the converter writes as `expert_gating_func`. The source is not committed
(about 1.5 MB each): `save_source` rewrites it, seeded, and PROVENANCE.json records its files' sha256.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_archs_generate import MLA, SEED, sha256, synthetic_vocab

CONFIGS: dict[str, dict[str, Any]] = {
    "glm4moe": {
        "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 3,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "attention_bias": True,
        "use_qk_norm": True, "vocab_size": 256, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                                          "partial_rotary_factor": 0.5},
    },
    "glm4moe-lite": {**MLA, "rms_norm_eps": 1e-5, "scoring_func": "sigmoid"},
}
"""Each tiny config (every row a multiple of 32, Q8_0's block). GLM-4.5's shape in small: more query heads than
key-value heads, a head_dim of its own, biases and q/k norms (GLM-4.5's 355B has use_qk_norm), half the head
rotated. GLM-4.7-Flash's: the MLA dimensions the deepseek2 fixtures use, its first layer dense (Glm4MoeLiteConfig's
default `mlp_layer_types`; `first_k_dense_replace`, which the class has no field for and keeps, is what the
converter writes `leading_dense_block_count` from: without it, 0)."""
CLASSES = {"glm4moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
           "glm4moe-lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM")}
CONVERTERS = {"glm4moe": "Glm4MoeModel", "glm4moe-lite": "Glm4MoeLiteModel"}
GGUF_ARCHS = {"glm4moe": "glm4moe", "glm4moe-lite": "deepseek2"}
"""The `general.architecture` each converter writes (the folder's name where they differ: GLM-4.7-Flash's is
DeepseekV2Model's)."""
EXTRA = ("scoring_func",)
"""Release keys the configuration classes have no field for, added to the saved config.json."""
NEXTN = 1
PRE = "glm4"
"""The pre-tokenizer name the synthetic vocabulary carries (GLM's, `_set_vocab_glm`)."""
HEAD_COPIES = {"glm4moe": False, "glm4moe-lite": True}
"""Whether the NextN layer stores its own `embed_tokens` and `shared_head.head`: GLM-4.7-Flash's does (its
model.layers.47), GLM-4.6's does not (llama.cpp #16359 made them optional for it)."""


HEAD = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")
COPIES = ("embed_tokens.weight", "shared_head.head.weight")


def head_names(arch: str) -> tuple[str, ...]:
    """The NextN layer's tensors beside its decoder layer (relative to `model.layers.N.`)."""
    return HEAD + (COPIES if HEAD_COPIES[arch] else ())


def mtp_head(arch: str, hidden: int, vocab: int, gen: Any) -> dict[str, Any]:
    """The NextN layer's tensors beside its decoder layer, seeded, BF16: eh_proj [hidden, 2 hidden], the norms'
    gains about 1, the copies [vocab, hidden]."""
    import torch

    shapes = {"eh_proj.weight": (hidden, 2 * hidden), "embed_tokens.weight": (vocab, hidden),
              "shared_head.head.weight": (vocab, hidden)}
    out = {}
    for name in head_names(arch):
        values = torch.randn(*shapes.get(name, (hidden,)), generator=gen) * 0.02
        out[name] = (values + (1 if name not in shapes else 0)).to(torch.bfloat16)
    return out


def save_source(arch: str, out: Path) -> None:
    """The tiny model as transformers saves it (BF16) with its NextN layer, the routers' correction biases F32."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(SEED)
    config_cls, model_cls = (getattr(transformers, n) for n in CLASSES[arch])
    cfg = {k: v for k, v in CONFIGS[arch].items() if k not in EXTRA}
    n = cfg["num_hidden_layers"]
    model = model_cls(config_cls(**{**cfg, "num_hidden_layers": n + NEXTN})).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="50MB")
    gen = torch.Generator().manual_seed(SEED + 1)
    shard = out / "model.safetensors"
    tensors = load_file(shard)
    for name in sorted(tensors):
        if name.endswith("mlp.gate.e_score_correction_bias"):
            tensors[name] = torch.rand(tensors[name].shape[0], generator=gen, dtype=torch.float32)
    head = mtp_head(arch, cfg["hidden_size"], cfg["vocab_size"], gen)
    tensors.update({f"model.layers.{n}.{k}": v for k, v in head.items()})
    save_file(tensors, shard, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update({k: CONFIGS[arch][k] for k in EXTRA if k in CONFIGS[arch]})
    config.update(num_hidden_layers=n, num_nextn_predict_layers=NEXTN)
    if isinstance(config.get("mlp_layer_types"), list):
        config["mlp_layer_types"] = config["mlp_layer_types"][:n]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "generation_config.json").unlink(missing_ok=True)


def convert(llama_cpp: Path, arch: str, src: Path, outfile: Path) -> None:
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion import glm  # type: ignore[import-not-found]

    cls = getattr(glm, CONVERTERS[arch])
    cls.set_vocab = synthetic_vocab(PRE)
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
            convert(llama_cpp, arch, source, folder / "tiny-Q8_0.gguf")
            sources = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in sorted(source.iterdir())}
        import torch
        import transformers

        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
        provenance = {
            "written_by": "tests/writers/gguf_glm4_generate.py",
            "script_sha256": sha256(Path(__file__)),
            "shared_with": {"tests/writers/gguf_archs_generate.py": sha256(Path(__file__).parent /
                                                                           "gguf_archs_generate.py")},
            "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                          "tools": ["convert_hf_to_gguf.py --outtype q8_0"], "converter_class": CONVERTERS[arch]},
            "gguf_architecture": GGUF_ARCHS[arch],
            "gguf-py": "vendored (llama.cpp's gguf-py)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "transformers_class": CLASSES[arch][1], "source_config": CONFIGS[arch], "seed": SEED,
            "nextn": (f"transformers' model of num_hidden_layers + {NEXTN} layers, the last declared the NextN layer; "
                      f"its {', '.join(head_names(arch))} added by save_source"),
            "source_files": sources,
            "source_note": "not committed: save_source(arch, folder) rewrites it (tests/test_gguf_glm4.py does)",
            "vocabulary": f"synthetic (tokenizer.ggml.pre {PRE!r}): the tiny model has no tokenizer",
            "files": {str(p.relative_to(folder)): {"sha256": sha256(p), "bytes": p.stat().st_size} for p in files},
        }
        (folder / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
