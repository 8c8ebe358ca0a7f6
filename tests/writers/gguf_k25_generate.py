"""Write tests/data/gguf_k25 with llama.cpp's own converter: Kimi-K2.5 as people run it, the text model as a GGUF
(`deepseek2`, DeepseekV2Model) and its vision tower as an `mmproj-*.gguf` (`clip`, KimiK25Model, projector type
`kimik25`), from a tiny kimi_k25-shaped checkpoint; and the importance matrix llama-imatrix writes beside a quant.

Not run by the test suite. Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    [LLAMA_BIN=$LLAMA_CPP/build/bin] \
    python tests/writers/gguf_k25_generate.py tests/data/gguf_k25

with torch, transformers and safetensors importable. The source is written with safetensors directly, in the
names the release stores and the converter reads (`language_model.model.layers.N.*`, `vision_tower.*`,
`mm_projector.*`: kimi_audit's own expected layout of the config, each tensor seeded random BF16, the router
biases F32), with a `preprocessor_config.json` (the converter reads image_mean/std and in_patch_limit from it).
The text converter's vocabulary is replaced as in gguf_generate.py (the tiny model has no tokenizer).

Files:
- `source/`: the tiny source's config.json, preprocessor_config.json and its safetensors (what --against reads);
- `Kimi-K25-tiny-Q8_0.gguf`: the text model, `convert_hf_to_gguf.py --outtype q8_0`;
- `mmproj-Kimi-K25-tiny-F16.gguf`: its projector, `convert_hf_to_gguf.py --mmproj --outtype f16`;
- `wide/mmproj-Kimi-K25-wide-F16.gguf`: the projector of the same model with a text hidden size of 128 (a
  projector from another model: mtmd refuses it beside the 64-wide text model);
- `imatrix.gguf`: llama-imatrix's output for the text model when LLAMA_BIN holds a built `llama-imatrix`; else
  written with gguf-py's GGUFWriter in the keys and tensors tools/imatrix/imatrix.cpp writes
  (IMatrixCollector::save_imatrix: general.type `imatrix`, `imatrix.datasets`, `imatrix.chunk_count`,
  `imatrix.chunk_size`, per weight `NAME.in_sum2` [n_embd, n_mat] and `NAME.counts` [1, n_mat], F32).
PROVENANCE.json records which, and LLAMA_BIN_BUILD how the tools were built (the committed imatrix.gguf: llama.cpp's
own cmake, CMAKE_BUILD_TYPE=Release with -O0 and GGML_NATIVE=OFF, targets llama-imatrix llama-quantize
llama-gguf-split: an optimized build did not finish on a 2-core machine).
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
from typing import Any

SEED = 0
TEXT: dict[str, Any] = {
    "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 2, "n_shared_experts": 1, "n_routed_experts": 4, "kv_lora_rank": 32, "q_lora_rank": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 32, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": 0,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
VISION: dict[str, Any] = {
    "model_type": "kimi_k25_vision", "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 2, "patch_size": 2, "pos_emb_height": 4, "pos_emb_width": 4, "pos_emb_time": 4,
    "init_pos_emb_height": 4, "init_pos_emb_width": 4, "init_pos_emb_time": 4, "merge_kernel_size": [2, 2],
    "hidden_act": "gelu_pytorch_tanh",
}
"""Kimi-K2.6's vision_config keys (transformers' names) scaled down, with the release's `init_pos_emb_*` the
converter reads beside them. Three vision blocks at least: the converter maps `mm_projector.proj.linear_{bid}` by
block number, so a tower of fewer blocks than 3 cannot name `mm.2`."""
PREPROCESSOR = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 1024}


def config(hidden: int) -> dict[str, Any]:
    return {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {**TEXT, "hidden_size": hidden}, "vision_config": VISION, "projection_hidden_size": 32,
            "projection_layer_norm_eps": 1e-5, "tie_word_embeddings": False}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_source(out: Path, cfg: dict[str, Any]) -> None:
    """The tiny kimi_k25 checkpoint: every tensor kimi_audit's layout of `cfg` expects, seeded random, in the
    release's names, two shards and an index."""
    import torch
    from safetensors.torch import save_file

    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.kinds import BUFFER
    from kimi_audit.model.layout import expected_layout

    gen = torch.Generator().manual_seed(SEED)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in expected_layout(model_config_from_dict(cfg)).items():
        if t.kind == BUFFER:
            continue
        value = 0.05 * torch.randn(t.shape, generator=gen)
        if name.endswith("e_score_correction_bias"):
            value = torch.rand(t.shape, generator=gen)
        shard = ("model-00002-of-00002.safetensors" if name.startswith(("vision_tower.", "mm_projector."))
                 else "model-00001-of-00002.safetensors")
        shards.setdefault(shard, {})[name] = value.to(dt[t.dtype]).contiguous()
    out.mkdir(parents=True)
    weight_map = {}
    for shard, members in shards.items():
        save_file(members, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(members, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                  indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))


def synthetic_vocab(self: Any) -> None:
    """A byte-level BPE vocabulary of the config's vocab_size (the converter's own writer calls)."""
    import gguf

    n = self.hparams["vocab_size"]
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)][:n]
    tokens = printable + [f"tok{i}" for i in range(len(printable), n)]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("kimi-k2")
    self.gguf_writer.add_token_list(tokens)
    self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
    self.gguf_writer.add_token_merges(["t o", "to k"])
    self.gguf_writer.add_bos_token_id(0)
    self.gguf_writer.add_eos_token_id(1)


def convert(llama_cpp: Path, src: Path, outfile: Path, *args: str) -> None:
    if str(llama_cpp) not in sys.path:
        sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import convert_hf_to_gguf  # type: ignore[import-not-found]
    from conversion.deepseek import DeepseekV2Model  # type: ignore[import-not-found]

    DeepseekV2Model.set_vocab = synthetic_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(outfile), *args]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


IMATRIX_CHUNK = 8


def imatrix_by_tool(bin_dir: Path, model: Path, out: Path) -> bool:
    """llama-imatrix run on the text model over a short text; False where it is not built."""
    tool = bin_dir / "llama-imatrix"
    if not tool.is_file():
        return False
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "calibration.txt"
        text.write_text("to tok to tok ! # $ % & ( ) * + , - . / 0 1 2 3 4 5 6 7 8 9 : ; < = > ? @ A B C D E F\n" * 8)
        # run in the text's folder and name it relatively: imatrix.datasets records the name as given, and a
        # temporary path would make every run's file differ; one thread, so the sums add in one order
        subprocess.run([str(tool), "-m", str(model.resolve()), "-f", text.name, "-o", str(out.resolve()), "-c",
                        str(IMATRIX_CHUNK), "-b", str(IMATRIX_CHUNK), "-ub", str(IMATRIX_CHUNK), "--chunks", "2",
                        "-t", "1"], check=True, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out.is_file()


def imatrix_by_writer(model: Path, out: Path) -> None:
    """The keys and tensors tools/imatrix/imatrix.cpp's IMatrixCollector::save_imatrix writes (llama.cpp
    0c1e5709, tools/imatrix/imatrix.cpp: `general.type` "imatrix" (LLM_KV_GENERAL_TYPE), `imatrix.datasets`,
    `imatrix.chunk_count`, `imatrix.chunk_size`; for each weight a matrix multiplication reads, `NAME.in_sum2`
    (F32, [n_embd, n_mat]) and `NAME.counts` (F32, [1, n_mat])), for every 2-D or stacked weight of `model`."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(model))
    writer = gguf.GGUFWriter(str(out), arch="", endianess=gguf.GGUFEndian.LITTLE)
    # arch "": GGUFWriter writes no general.architecture (add_string skips an empty value), as imatrix.cpp
    writer.add_type(gguf.GGUFType.IMATRIX)
    writer.add_array(gguf.Keys.IMatrix.DATASETS, ["calibration.txt"])
    writer.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, 2)
    writer.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, IMATRIX_CHUNK)
    rng = np.random.default_rng(SEED)
    for t in reader.tensors:
        shape = [int(d) for d in t.shape]  # ggml order: ne[0] first
        if len(shape) < 2 or t.name.startswith(("token_embd", "output_norm")):
            continue
        n_mat = shape[2] if len(shape) > 2 else 1
        writer.add_tensor(f"{t.name}.in_sum2", rng.random((n_mat, shape[0]), dtype=np.float32))
        writer.add_tensor(f"{t.name}.counts", np.full((n_mat, 1), 2 * IMATRIX_CHUNK, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    out = Path(sys.argv[1])
    llama_cpp = Path(os.environ["LLAMA_CPP"])
    bin_dir = Path(os.environ.get("LLAMA_BIN", llama_cpp / "build" / "bin"))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        save_source(out / "source", config(64))
        save_source(t / "wide", config(128))
        text = out / "Kimi-K25-tiny-Q8_0.gguf"
        convert(llama_cpp, out / "source", text, "--outtype", "q8_0")
        convert(llama_cpp, out / "source", out / "mmproj-Kimi-K25-tiny-F16.gguf", "--mmproj", "--outtype", "f16")
        (out / "wide").mkdir()
        convert(llama_cpp, t / "wide", out / "wide" / "mmproj-Kimi-K25-wide-F16.gguf", "--mmproj", "--outtype", "f16")
        by_tool = imatrix_by_tool(bin_dir, text, out / "imatrix.gguf")
        if not by_tool:
            imatrix_by_writer(text, out / "imatrix.gguf")
    commit = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    import gguf
    import torch
    import transformers

    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "PROVENANCE.json")
    provenance = {
        "written_by": "tests/writers/gguf_k25_generate.py",
        "script_sha256": sha256(Path(__file__)),
        "llama.cpp": {"source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp", "commit": commit,
                      "tools": ["convert_hf_to_gguf.py (DeepseekV2Model, KimiK25Model --mmproj)",
                                f"llama-imatrix (cmake, {os.environ.get('LLAMA_BIN_BUILD', 'Release')})" if by_tool else
                                "imatrix.gguf by gguf-py GGUFWriter in tools/imatrix/imatrix.cpp's keys and names "
                                "(llama-imatrix not built)"]},
        "gguf-py": getattr(gguf, "__version__", "vendored"),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "source_config": config(64), "wide_text_hidden_size": 128, "preprocessor_config": PREPROCESSOR,
        "seed": SEED,
        "files": {str(p.relative_to(out)): sha256(p) for p in files},
    }
    (out / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main()
