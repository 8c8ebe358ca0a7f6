"""Write tests/data/mistral_format: tiny checkpoints in Mistral's own release format (params.json, one
consolidated.safetensors in Mistral's names, a tekken.json tokenizer), seeded, each converted by llama.cpp's own
converter with `--mistral-format`:

- `bf16/`: BF16, two layers (one dense, one MoE with a shared expert), q_lora, and a Pixtral vision encoder
  (`vision_encoder.*`, `pre_mm_projector_norm`, `patch_merger`, `vision_language_adapter`): the text model
  converted as MistralMoeModel (`--outtype q8_0`), the vision encoder as PixtralModel (`--mmproj`);
- `rope/`: the text model with other `yarn` / `llama_4_scaling` values (the two original lengths differ), converted
  to show which keys of them the GGUF holds;
- `fp8/`: the same text model with Mistral's FP8 (`quantization: {qformat_weight: fp8_e4m3}`; `weight` F8_E4M3,
  `qscale_weight` and `qscale_act` F32 scalars). At 0c1e57098 the converter refuses it: MistralMoeModel renames
  `qscale_act` to `input_scale` and `qscale_weight` to `weight_scale` (conversion/mistral.py lines 189-192) but,
  unlike MistralModel.dequant_model (lines 41-51), never turns params.json's `quantization` into the
  `quantization_config` its base's dequantization keys on, so the scales reach the name map unconverted ("Can
  not map tensor 'layers.0.attention.wkv_a_with_mqa.input_scale'"): PROVENANCE.json records the refusal.

Each text GGUF's `deepseek2.*` metadata is recorded in PROVENANCE.json (tests/test_mistral_layout.py holds the
metadata the tool derives from params.json to it).

The names and params.json keys are those llama.cpp@0c1e57098 reads (tests/data/loader_names/
mistral_format.llamacpp.json). Not run by the test suite (it needs mistral-common for the tokenizer). Run as:

    LLAMA_CPP=/path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \
    python tests/writers/mistral_format_generate.py tests/data/mistral_format

with torch, safetensors and mistral-common importable. Each GGUF's tensor count and element count go into
PROVENANCE.json. `bf16/` is committed (under 1 MB) beside PROVENANCE.json, and so are its two GGUFs, under
`gguf/` (GGUF_FILES: the text model and its `--mmproj` projector, both `--outtype q8_0`), each file's sha256 and
the converter command that wrote it in PROVENANCE.json's `gguf` (tests/test_mistral_gguf.py audits the pair and
holds it to `bf16/`); `write_checkpoint` rebuilds any variant seeded (its sha256 in PROVENANCE.json), which
tests/test_mistral_format.py does for `fp8/` and for its fault cases. After a run, tests/writers/tensor_digests.py
adds the per-tensor digests of `bf16/` again (`tensor_sha256`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

SEED = 0
PARAMS: dict[str, Any] = {
    "dim": 128, "n_layers": 2, "head_dim": 64, "hidden_dim": 128, "n_heads": 2, "n_kv_heads": 2,
    "norm_eps": 1e-06, "vocab_size": 276, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32, "qk_nope_head_dim": 32, "v_head_dim": 32,
    "tied_embeddings": False,
    "moe": {"num_experts": 4, "num_experts_per_tok": 2, "expert_hidden_dim": 64, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "route_every_n": 1, "routed_scale": 1.0, "num_expert_groups": 1,
            "num_expert_groups_per_tok": 1},
    "yarn": {"original_max_position_embeddings": 1024, "factor": 4.0, "apply_scale": False, "beta": 32.0,
             "alpha": 2.0},
    "llama_4_scaling": {"original_max_position_embeddings": 1024, "beta": 0.1},
}
"""Every row a multiple of 32 (Q8_0's block); vocab_size is the tokenizer's 256 bytes + 20 special tokens."""
VISION: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_channels": 3, "patch_size": 8, "image_size": 32, "rope_theta": 10000.0, "image_token_id": 10,
    "image_break_token_id": 12, "image_end_token_id": 13, "adapter_bias": False, "spatial_merge_size": 2,
    "mm_projector_id": "patch_merge", "add_pre_mm_projector_layer_norm": True,
}
FP8 = {"qformat_weight": "fp8_e4m3"}
ROPE = {"yarn": {**PARAMS["yarn"], "apply_scale": True},
        "llama_4_scaling": {"original_max_position_embeddings": 2048, "beta": 0.25}}
"""The `rope` variant's blocks: the two original lengths differ, so its GGUF shows which one the converter writes as
attention.temperature_length."""
VARIANTS = ("bf16", "fp8", "rope")
GGUF_DIR = "gguf"
GGUF_FILES = {"text": ("Mistral-tiny-Q8_0.gguf", ()), "mmproj": ("mmproj-Mistral-tiny-Q8_0.gguf", ("--mmproj",))}
"""The committed GGUFs of `bf16/`: (file name under GGUF_DIR, the converter's extra arguments)."""


def params(variant: str) -> dict[str, Any]:
    out = dict(PARAMS)
    if variant == "bf16":
        out["vision_encoder"] = VISION
    if variant == "fp8":
        out["quantization"] = FP8
    if variant == "rope":
        out.update(ROPE)
    return out


def tensors(p: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of `p` in Mistral's names: name -> (shape, kind): `linear` (FP8 where quantized), `norm`,
    `plain`. The names are llama.cpp's (conversion/mistral.py filter_tensors, tensor_mapping.py mistral-large and
    llama-pth entries, conversion/pixtral.py)."""
    d, v, m = p["dim"], p["vocab_size"], p["moe"]
    ql, kvl, rope, nope, vd, h = (p["q_lora_rank"], p["kv_lora_rank"], p["qk_rope_head_dim"],
                                  p["qk_nope_head_dim"], p["v_head_dim"], p["n_heads"])
    out: dict[str, tuple[tuple[int, ...], str]] = {"tok_embeddings.weight": ((v, d), "plain")}
    for i in range(p["n_layers"]):
        at = f"layers.{i}."
        out.update({
            f"{at}attention_norm.weight": ((d,), "norm"), f"{at}ffn_norm.weight": ((d,), "norm"),
            f"{at}attention.wq_a.weight": ((ql, d), "linear"), f"{at}attention.q_a_norm.weight": ((ql,), "norm"),
            f"{at}attention.wq_b.weight": ((h * (nope + rope), ql), "linear"),
            f"{at}attention.wkv_a_with_mqa.weight": ((kvl + rope, d), "linear"),
            f"{at}attention.kv_a_norm.weight": ((kvl,), "norm"),
            f"{at}attention.wkv_b.weight": ((h * (nope + vd), kvl), "linear"),
            f"{at}attention.wo.weight": ((d, h * vd), "linear")})
        if i < m["first_k_dense_replace"]:
            mlps = [(f"{at}feed_forward.", p["hidden_dim"])]
        else:
            out[f"{at}gate.weight"] = ((m["num_experts"], d), "plain")
            mlps = [(f"{at}experts.{e}.", m["expert_hidden_dim"]) for e in range(m["num_experts"])]
            mlps.append((f"{at}shared_experts.", m["expert_hidden_dim"] * m["num_shared_experts"]))
        for stem, inter in mlps:
            out.update({f"{stem}w1.weight": ((inter, d), "linear"), f"{stem}w2.weight": ((d, inter), "linear"),
                        f"{stem}w3.weight": ((inter, d), "linear")})
    out.update({"norm.weight": ((d,), "norm"), "output.weight": ((v, d), "plain")})
    vis = p.get("vision_encoder")
    if vis:
        w, inter, patch = vis["hidden_size"], vis["intermediate_size"], vis["patch_size"]
        out.update({"vision_encoder.patch_conv.weight": ((w, vis["num_channels"], patch, patch), "plain"),
                    "vision_encoder.ln_pre.weight": ((w,), "norm")})
        for i in range(vis["num_hidden_layers"]):
            at = f"vision_encoder.transformer.layers.{i}."
            out.update({f"{at}attention_norm.weight": ((w,), "norm"), f"{at}ffn_norm.weight": ((w,), "norm")})
            out.update({f"{at}attention.w{x}.weight": ((w, w), "plain") for x in "qkvo"})
            out.update({f"{at}feed_forward.w1.weight": ((inter, w), "plain"),
                        f"{at}feed_forward.w2.weight": ((w, inter), "plain"),
                        f"{at}feed_forward.w3.weight": ((inter, w), "plain")})
        merge = vis["spatial_merge_size"]
        out.update({"pre_mm_projector_norm.weight": ((w,), "norm"),
                    "patch_merger.merging_layer.weight": ((w, w * merge * merge), "plain"),
                    "vision_language_adapter.w_in.weight": ((d, w), "plain"),
                    "vision_language_adapter.w_out.weight": ((d, d), "plain")})
    return out


def tekken() -> dict[str, Any]:
    """A tekken v7 tokenizer of the 256 bytes (its 20 special tokens mistral-common's defaults)."""
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None}
             for i in range(256)]
    return {"config": {"pattern": r"\S+|\s+", "num_vocab_tokens": 256, "default_vocab_size": 276,
                       "default_num_special_tokens": 20, "version": "v7"}, "vocab": vocab}


def write_checkpoint(d: Path, variant: str, drop: tuple[str, ...] = (), p: dict[str, Any] | None = None) -> int:
    """The variant's checkpoint into `d` (seeded), less the tensors `drop` names; returns its parameter count
    (every tensor but the FP8 scales)."""
    import torch
    from safetensors.torch import save_file

    p = params(variant) if p is None else p
    g = torch.Generator().manual_seed(SEED)
    fp8 = "quantization" in p
    out: dict[str, torch.Tensor] = {}
    numel = 0
    for name, (shape, kind) in tensors(p).items():
        numel += int(torch.Size(shape).numel())
        if kind == "norm":
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        w = torch.randn(shape, generator=g) * 0.02
        quantized = fp8 and kind == "linear"
        if quantized:
            scale = w.abs().max() / 448.0
            out[name] = (w / scale).to(torch.float8_e4m3fn)
            out[name.replace(".weight", ".qscale_weight")] = scale.reshape(()).float()
            out[name.replace(".weight", ".qscale_act")] = torch.tensor(0.05, dtype=torch.float32)
        else:
            out[name] = w.to(torch.bfloat16)
    for name in drop:
        out.pop(name)
    d.mkdir(parents=True, exist_ok=True)
    save_file(out, str(d / "consolidated.safetensors"))
    (d / "params.json").write_text(json.dumps(p, indent=2) + "\n")
    (d / "tekken.json").write_text(json.dumps(tekken()) + "\n")
    return numel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gguf_counts(path: Path) -> dict[str, Any]:
    """The file's tensor and element counts, its architecture, and (a text model's) every `ARCH.` key as gguf-py
    reads it back: the metadata the converter wrote from params.json."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    out: dict[str, Any] = {"tensors": len(r.tensors), "elements": int(sum(int(t.n_elements) for t in r.tensors)),
                           "architecture": arch}
    if arch != "clip":
        out["metadata"] = {k: f.contents() for k, f in r.fields.items() if k.startswith(f"{arch}.")}
    return out


def command(d: Path, out: Path, *extra: str) -> list[str]:
    """The converter's arguments after its script: the checkpoint folder, --mistral-format, Q8_0, the output."""
    return [str(d), "--mistral-format", "--outtype", "q8_0", "--outfile", str(out), *extra]


def convert(llama: Path, d: Path, out: Path, *extra: str) -> None:
    """The converter on a copy of `d` with an empty `{}` config.json beside params.json: at 0c1e57098
    MistralMoeModel's base, DeepseekV2Model.__init__ (conversion/deepseek.py line 246), loads the folder's
    config.json with `is_mistral_format=False` for one key (`architectures`, its OCR check) and fails with
    FileNotFoundError on a folder of Mistral's format alone; every hyperparameter it converts with is
    params.json's (ModelBase.load_hparams with is_mistral_format)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(llama / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / d.name
        shutil.copytree(d, copy)
        (copy / "config.json").write_text("{}\n")
        subprocess.run([sys.executable, str(llama / "convert_hf_to_gguf.py"), *command(copy, out, *extra)],
                       check=True, env=env, capture_output=True, text=True)


def ggufs(llama: Path, target: Path, d: Path) -> dict[str, Any]:
    """`d` (bf16/) converted into target/GGUF_DIR, both files: what PROVENANCE.json records of them (each file's
    sha256 and the command that wrote it, paths relative to `target`)."""
    out = target / GGUF_DIR
    out.mkdir(exist_ok=True)
    row: dict[str, Any] = {"files": {}, "commands": {}}
    for name, extra in GGUF_FILES.values():
        convert(llama, d, out / name, *extra)
        row["files"][name] = sha256(out / name)
        row["commands"][name] = " ".join(["convert_hf_to_gguf.py", *command(Path(d.name), Path(GGUF_DIR) / name,
                                                                            *extra)])
    return row


def main(target: Path) -> None:
    llama = Path(os.environ["LLAMA_CPP"])
    commit = subprocess.run(["git", "-C", str(llama), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    provenance: dict[str, Any] = {
        "writer": "tests/writers/mistral_format_generate.py", "writer_sha256": sha256(Path(__file__)),
        "converter": "ggml-org/llama.cpp convert_hf_to_gguf.py --mistral-format --outtype q8_0",
        "llama_cpp_commit": commit.strip() or "0c1e57098", "seed": SEED,
        "packages": {k: version(k) for k in ("torch", "safetensors", "mistral_common")}, "variants": {}}
    for variant in VARIANTS:
        d = target / variant
        numel = write_checkpoint(d, variant)
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(tmp) / "text.gguf"
            row: dict[str, Any] = {"parameters": numel}
            try:
                convert(llama, d, text)
                row["text_gguf"] = gguf_counts(text)
            except subprocess.CalledProcessError as e:  # the FP8 variant at 0c1e57098: see the module docstring
                row["text_gguf_refused"] = e.stderr.strip().splitlines()[-1]
            if variant == "bf16":
                provenance["gguf"] = ggufs(llama, target, d)
                row["mmproj_gguf"] = gguf_counts(target / GGUF_DIR / GGUF_FILES["mmproj"][0])
        row["files"] = {f.name: sha256(f) for f in sorted(d.iterdir())}
        provenance["variants"][variant] = row
    (target / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
