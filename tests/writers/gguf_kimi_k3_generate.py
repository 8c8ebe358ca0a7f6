"""Write tests/data/gguf_archs/kimi-k3 with llama.cpp's own converter (`convert_hf_to_gguf.py`, KimiK3Model of
conversion/kimi_k3.py): a tiny Kimi K3 checkpoint in the release's own names, converted to Q8_0, twice:

- `tiny-Q8_0.gguf`: the routed experts as the release stores them, compressed-tensors `mxfp4-pack-quantized`
  (`weight_packed` U8 + `weight_scale` U8 E8M0, written by compressed-tensors' own MXFP4 compressor), which the
  converter repacks losslessly into ggml MXFP4 (KimiK3Model._write_mxfp4_experts);
- `tiny-bf16-experts-Q8_0.gguf`: the same model with BF16 experts, which the converter stacks (torch.stack) and
  quantizes to Q8_0 like every other matrix.

transformers 5.25 has no Kimi K3 class, so the checkpoint is written here from the names, shapes and dtypes the
tool's own description gives (model.arch.kimi_k3: rtp-llm's name manifest and SGLang's modules, cited there;
tests/test_kimi_k3.py holds that description to tests/data/loader_names/kimi_k3.json) for TEXT_CONFIG, every value
seeded random (A_log's tail past the heads zero, as the module says the release stores it), plus two vision
tensors the converter skips (text only). Whatever the converter refuses of those names is a finding about them:
it refuses none at llama.cpp 0c1e5709.

Not run by the test suite. Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    .venv/bin/python tests/writers/gguf_kimi_k3_generate.py tests/data/gguf_archs

with torch, safetensors and compressed_tensors importable. The converter's tensor path and metadata are its own;
only its vocabulary is replaced (gguf_archs_generate.synthetic_vocab: KimiK3Model.set_vocab borrows
KimiLinearModel's, which needs the release's tiktoken tokenizer). The source is not committed: `save_source` rewrites
it, seeded, and PROVENANCE.json records its files' sha256 beside the tool versions, llama.cpp's commit, this
script's sha256 and each GGUF's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from gguf_archs_generate import sha256, synthetic_vocab  # noqa: E402

SEED = 0
EXPERTS_RE = r"re:.*block_sparse_moe\.experts\.\d+\.w[123]$"
TEXT_CONFIG: dict[str, Any] = {
    "model_type": "kimi_linear", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32,
    "mla_use_nope": True, "mla_use_output_gate": True,
    "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2], "head_dim": 32, "num_heads": 2,
                           "short_conv_kernel_size": 4, "use_full_rank_gate": True, "gate_lower_bound": -5.0},
    "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 2, "moe_intermediate_size": 32,
    "routed_expert_hidden_size": 32, "latent_moe_use_norm": True, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.5, "num_expert_group": 1, "topk_group": 1,
    "use_grouped_topk": True, "attn_res_block_size": 2, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5, "vocab_size": 128, "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
    "dtype": "bfloat16",
}
"""The published config's keys (kimi_audit/data/kimi-k3.config.json) at toy size: a dense KDA layer, a MoE KDA
layer, a MoE MLA layer; every row a multiple of 32 (Q8_0's and MXFP4's block)."""
FILES = {"mxfp4": "tiny-Q8_0.gguf", "bf16": "tiny-bf16-experts-Q8_0.gguf"}
"""The experts' storage in the source -> the GGUF written from it."""
VISION = {"vision_tower.patch_embed.proj.weight": (8, 3, 2, 2), "mm_projector.proj.0.weight": (8, 8)}
"""Two vision tensors beside the text model (the converter skips them: KimiK3Model.get_tensors)."""


def config(experts: str) -> dict[str, Any]:
    """config.json: the text model nested as the release nests it, the experts' MXFP4 config group as
    compressed-tensors serializes it (`mxfp4`) or none (`bf16`)."""
    text = dict(TEXT_CONFIG)
    if experts == "mxfp4":
        from compressed_tensors.quantization import QuantizationConfig

        from ct_checkpoint import preset_scheme

        fmt, scheme = preset_scheme("mxfp4a16", [EXPERTS_RE])
        qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed")
        text["quantization_config"] = qc.model_dump(mode="json", exclude_none=True)
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "tie_word_embeddings": False,
            "bos_token_id": 0, "eos_token_id": 1, "text_config": text, "vision_config": {"patch_size": 14}}


def save_source(out: Path, experts: str = "mxfp4") -> None:
    """The tiny checkpoint (config.json, model.safetensors): every tensor the tool's layout of config(experts)
    expects, by name, shape and dtype; each routed expert made as a BF16 weight of its logical shape and, for
    `mxfp4`, compressed by compressed-tensors' own MXFP4 compressor."""
    import torch
    from safetensors.torch import save_file

    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.kinds import PACKED, SCALE
    from kimi_audit.model.layout import expected_layout

    raw = config(experts)
    layout = expected_layout(model_config_from_dict(raw))
    gen = torch.Generator().manual_seed(SEED)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    heads = TEXT_CONFIG["num_attention_heads"]
    tensors: dict[str, torch.Tensor] = {}
    for name, t in layout.items():
        if t.kind == SCALE:
            continue
        if t.kind == PACKED:  # an MXFP4 expert: its BF16 weight [out, in] compressed
            from ct_checkpoint import compress_module, preset_scheme

            fmt, scheme = preset_scheme("mxfp4a16", [EXPERTS_RE])
            module = name.rsplit(".", 1)[0]
            w = (0.05 * torch.randn((t.shape[0], t.shape[1] * 2), generator=gen)).to(torch.bfloat16)
            tensors.update({f"{module}.{k}": v for k, v in compress_module(w, fmt, scheme).items()})
            continue
        values = 0.05 * torch.randn(t.shape, generator=gen)
        if name.endswith("norm.weight"):
            values = values + 1.0
        if name.endswith(".A_log"):
            values[heads:] = 0.0  # the release's padding past the heads
        tensors[name] = values.to(dtypes[t.dtype])
    for name, shape in VISION.items():
        tensors[name] = (0.05 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))


def convert(llama_cpp: Path, src: Path, outfile: Path) -> None:
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion.kimi_k3 import KimiK3Model  # type: ignore[import-not-found]

    KimiK3Model.set_vocab = synthetic_vocab("kimi-k2")
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(outfile), "--outtype", "q8_0"]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def main() -> None:
    folder = Path(sys.argv[1]) / "kimi-k3"
    llama_cpp = Path(os.environ["LLAMA_CPP"])
    commit = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or os.environ.get("LLAMA_CPP_COMMIT", "")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.gguf"):
        old.unlink()
    sources: dict[str, Any] = {}
    for experts, file in FILES.items():
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "source"
            save_source(source, experts)
            convert(llama_cpp, source, folder / file)
            sources[experts] = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size}
                                for p in sorted(source.iterdir())}
    import compressed_tensors
    import safetensors
    import torch

    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
    provenance = {
        "written_by": "tests/writers/gguf_kimi_k3_generate.py",
        "script_sha256": sha256(Path(__file__)),
        "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                      "tools": ["convert_hf_to_gguf.py --outtype q8_0"], "converter_class": "KimiK3Model"},
        "gguf-py": "vendored (llama.cpp's gguf-py)",
        "torch": torch.__version__, "safetensors": safetensors.__version__,
        "compressed_tensors": compressed_tensors.__version__,
        "transformers_class": None,
        "source_names": "the tool's layout of the config (model.arch.kimi_k3; transformers 5.25 has no Kimi K3)",
        "source_config": {e: config(e) for e in FILES}, "seed": SEED,
        "source_files": sources, "gguf_of": {e: f for e, f in FILES.items()},
        "source_note": "not committed: save_source(folder, experts) rewrites it (tests/test_gguf_kimi_k3.py does)",
        "vocabulary": "synthetic (tokenizer.ggml.pre 'kimi-k2'): the tiny model has no tokenizer",
        "files": {str(p.relative_to(folder)): {"sha256": sha256(p), "bytes": p.stat().st_size} for p in files},
    }
    (folder / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
