"""GGUF arch `kimi-k3` (model.arch.kimi_k3.gguf), proven against llama.cpp's own converter: tests/data/gguf_archs/
kimi-k3 was written by llama.cpp 0c1e5709's `convert_hf_to_gguf.py --outtype q8_0` (KimiK3Model) from a tiny
checkpoint in the release's names (tests/writers/gguf_kimi_k3_generate.py, PROVENANCE.json): `tiny-Q8_0.gguf` from
the release's compressed-tensors MXFP4 experts (repacked into ggml MXFP4), `tiny-bf16-experts-Q8_0.gguf` from BF16
experts (stacked, Q8_0). Each is held to gguf-py's GGUFReader, its names to gguf-py's TensorNameMap and tensor list
for MODEL_ARCH.KIMI_K3 (llama.cpp's vendored gguf-py: the installed gguf 0.19 predates the arch), its parameters
to the converter's input, its metadata to the converter's, and the source it was converted from through
`--against` (and `--values`); each fault is one finding and a non-zero exit."""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.format.gguf import GgufArray, read_gguf_part
from kimi_audit.model.arch.kimi_k3.gguf import TEXT
from kimi_audit.model.arch.registry import gguf_architecture
from kimi_audit.sources import LocalSource

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent / "data" / "gguf_archs" / "kimi-k3"
WRITER = Path(__file__).resolve().parent / "writers" / "gguf_kimi_k3_generate.py"
ARCH = "kimi-k3"
FILES = {"mxfp4": "tiny-Q8_0.gguf", "bf16": "tiny-bf16-experts-Q8_0.gguf"}
"""The experts' storage in the source -> the GGUF the converter wrote from it (PROVENANCE.json gguf_of)."""
LAYERS = 3
CONVERTER_RENAMES = (("e_score_correction_bias", "e_score_correction.bias"), (".dt_bias", ".dt_proj.bias"))
"""What the converter renames before gguf-py's TensorNameMap reads a name (tests/test_gguf_archs.py's)."""
FORMATTED = ("attn_res_score", "ffn_res_score", "output_res_score", "ssm_g")
"""The GGUF tensors KimiK3Model names itself (format_tensor_name: the fused residual scores, the KDA layers' gate
resolved by layer kind), which gguf-py's TensorNameMap therefore has no release name for."""
LLAMA_CPP_DEFAULT = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"
"""Where the llama-cpp-python 0.3.36 sdist the fixture was written from is unpacked (LLAMA_CPP overrides)."""
runner = CliRunner()


def codes(report: Any) -> list[str]:
    return [f.code for f in report.findings]


def provenance() -> dict[str, Any]:
    return json.loads((DATA / "PROVENANCE.json").read_text())  # type: ignore[no-any-return]


def generator() -> Any:
    sys.path.insert(0, str(WRITER.parent))
    import gguf_kimi_k3_generate

    return gguf_kimi_k3_generate


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each source checkpoint, written again by the generator's own code (seeded: the same bytes on this torch,
    safetensors and compressed-tensors, which PROVENANCE.json's source_files digests say)."""
    pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    writer = generator()
    out: dict[str, Path] = {}
    for experts in FILES:
        folder = tmp_path_factory.mktemp("k3") / experts
        writer.save_source(folder, experts)
        out[experts] = folder
    return out


def same_source(experts: str, folder: Path) -> bool:
    want = provenance()["source_files"][experts]
    return all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == e["sha256"] for n, e in want.items())


def test_provenance_names_this_generator_and_both_files() -> None:
    prov = provenance()
    assert prov["written_by"] == "tests/writers/gguf_kimi_k3_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(WRITER.read_bytes()).hexdigest()
    assert prov["llama.cpp"]["commit"].startswith("0c1e5709") and prov["llama.cpp"]["converter_class"] == "KimiK3Model"
    assert prov["gguf_of"] == FILES and set(prov["files"]) == set(FILES.values())


@pytest.mark.parametrize("experts", sorted(FILES))
def test_reader_equals_gguf_py(experts: str) -> None:
    """Every tensor's name, ggml type, shape and offset, and every kimi-k3 key, as gguf-py's GGUFReader reads them;
    the routed experts MXFP4 in the file from the MXFP4 release, Q8_0 in the other."""
    ours = read_gguf_part(LocalSource(DATA), FILES[experts])
    theirs = gguf.GGUFReader(DATA / FILES[experts])
    gb.assert_tensors_read_as_gguf_py(ours, theirs)
    assert ours.kv["general.architecture"] == ARCH
    for key, f in theirs.fields.items():
        if key.startswith(f"{ARCH}."):
            mine = ours.kv[key]
            value = f.contents()
            assert (list(mine.values or ()) if isinstance(mine, GgufArray) else mine) == (
                pytest.approx(value) if isinstance(value, float) else value), key
    types = {t.name: t.tensor_type.name for t in theirs.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == ("MXFP4" if experts == "mxfp4" else "Q8_0")


@pytest.mark.parametrize("experts", sorted(FILES))
def test_llama_cpp_output_audits_clean(experts: str) -> None:
    """PASS with no finding; the parameters are the file's elements as gguf-py counts them."""
    report = audit(DATA / FILES[experts])
    assert report.verdict() == "PASS" and codes(report) == [] and report.exit_code() == 0
    assert report.model["model_type"] == "kimi_k3"
    assert report.stats.parameters == sum(int(t.n_elements) for t in gguf.GGUFReader(DATA / FILES[experts]).tensors)


@pytest.mark.parametrize("experts", sorted(FILES))
def test_parameters_are_the_converters_input_less_what_it_folds(experts: str, sources: dict[str, Path]) -> None:
    """transformers 5.25 has no Kimi K3 class, so the count is held to the converter's input: the source's text
    tensors' sum(numel) (an MXFP4 expert's `weight_packed` two values a byte, its `weight_scale` metadata; the vision
    tensors skipped, as KimiK3Model.get_tensors skips them), less what the converter folds: each residual projection
    (multiplied into its norm) and A_log's tail past the heads (`[:n_head]`). The tool's count of the source
    itself is that input, the vision tensors beside."""
    from safetensors import safe_open

    src = sources[experts]
    heads = json.loads((src / "config.json").read_text())["text_config"]["num_attention_heads"]
    inputs = folded = vision = 0
    with safe_open(str(src / "model.safetensors"), "np") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            n = math.prod(f.get_slice(name).get_shape())
            if not name.startswith("language_model."):
                vision += n
                continue
            if name.endswith(".weight_scale"):
                continue
            inputs += 2 * n if name.endswith(".weight_packed") else n
            if name.endswith("_res_proj.weight"):
                folded += n
            elif name.endswith(".A_log"):
                folded += n - heads
    assert folded and vision
    report = audit(DATA / FILES[experts])
    assert report.stats.parameters == inputs - folded
    assert audit(src).stats.parameters == inputs + vision


def vendored_gguf_py() -> Path:
    """llama.cpp's own gguf-py at the fixture's commit (the installed gguf 0.19 has no MODEL_ARCH.KIMI_K3)."""
    root = Path(os.environ.get("LLAMA_CPP", LLAMA_CPP_DEFAULT))
    if not (root / "gguf-py" / "gguf" / "constants.py").is_file():
        pytest.skip(f"no llama.cpp source at {root} (set LLAMA_CPP): gguf-py's KIMI_K3 tables are there")
    return root / "gguf-py"


NAME_MAP = """
import json, sys
import gguf
arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == sys.argv[1])
n, names = int(sys.argv[2]), json.loads(sys.argv[3])
tmap = gguf.get_tensor_name_map(arch, n)
listed = sorted({gguf.TENSOR_NAMES[t].format(bid=b) for t in gguf.MODEL_TENSORS[arch] for b in range(n)})
print(json.dumps({"mapped": {h: tmap.get_name(h, try_suffixes=(".weight", ".bias")) for h in names}, "listed": listed,
                  "file": gguf.__file__}))
"""


@pytest.mark.parametrize("experts", sorted(FILES))
def test_gguf_names_are_gguf_pys(experts: str) -> None:
    """Every tensor of the file is one the dialect's names give (the layout of the PASS above), is in gguf-py's
    tensor list for MODEL_ARCH.KIMI_K3, and is what gguf-py's TensorNameMap (the table the converter renames with)
    makes of its release name, but for FORMATTED, which the converter names itself and the map has no name for."""
    path = vendored_gguf_py()
    stored = {t.name for t in gguf.GGUFReader(DATA / FILES[experts]).tensors}
    spelled: dict[str, str] = {}
    for tree, name in TEXT.top + tuple((f"model.layers.{i}.{a}", f"blk.{i}.{b}") for i in range(LAYERS)
                                       for a, b in TEXT.layer):
        if name in stored:
            for before, after in CONVERTER_RENAMES:
                tree = tree.replace(before, after)
            spelled[tree] = name
    assert set(spelled.values()) == stored
    env = {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run([sys.executable, "-c", NAME_MAP, ARCH, str(LAYERS), json.dumps(sorted(spelled))],
                          capture_output=True, text=True, env=env, check=True)
    theirs = json.loads(done.stdout)
    assert Path(theirs["file"]).resolve().is_relative_to(path.resolve())
    for tree, name in spelled.items():
        bare = name.removesuffix(".weight").removesuffix(".bias")
        assert bare in theirs["listed"], name
        own = bare.rpartition(".")[2] in FORMATTED
        assert theirs["mapped"][tree] == (None if own else name), tree


def f32(value: object) -> object:
    return struct.unpack("<f", struct.pack("<f", value))[0] if isinstance(value, float) else value


def plain(value: object) -> object:
    return list(value.values or ()) if isinstance(value, GgufArray) else value


@pytest.mark.parametrize("experts", sorted(FILES))
def test_metadata_is_what_the_converter_writes_from_the_config(experts: str, sources: dict[str, Path]) -> None:
    """The dialect's `metadata`, applied to the config.json the converter read, gives every `kimi-k3.*` key the
    converter wrote, value for value (floats as GGUF stores them)."""
    record = gguf_architecture(ARCH)
    assert record is not None and record.gguf is not None and record.model_types == ("kimi_k3",)
    written = read_gguf_part(LocalSource(DATA), FILES[experts]).kv
    config = json.loads((sources[experts] / "config.json").read_text())
    ours = record.gguf.metadata(config)
    assert {k: f32(plain(v)) for k, v in ours.items()} == {k: plain(v) for k, v in written.items()
                                                         if k.startswith(f"{ARCH}.")}


def against(gguf_path: Path, source: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["audit", str(gguf_path), "--against", str(source), "--no-progress", "--json",
                                 *extra])
    return result.exit_code, json.loads(result.stdout)


def errors(doc: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(f["code"], f.get("tensor")) for f in doc["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("experts", sorted(FILES))
def test_against_its_source(experts: str, sources: dict[str, Path]) -> None:
    """`audit GGUF --against SOURCE --values`: PASS, every release tensor accounted for and the element totals
    equal, every GGUF tensor compared (Q8_0/F32 byte for byte: the fused scores, -exp(A_log[:heads]), the KDA
    gate; MXFP4 dequantized, its repack exact: relative error 0)."""
    if not same_source(experts, sources[experts]):
        pytest.skip("this torch/compressed-tensors wrote another source than the generator's")
    code, doc = against(DATA / FILES[experts], sources[experts], "--values")
    assert code == 0 and errors(doc) == [] and doc["result"]["verdict"] == "PASS"
    checked = next(f for f in doc["findings"] if f["code"] == "AGAINST_CHECKED")
    assert checked["actual"] == len(gguf.GGUFReader(DATA / FILES[experts]).tensors)
    assert not any(f["code"] == "AGAINST_NOT_COMPARED" for f in doc["findings"])
    if experts == "mxfp4":
        assert "MXFP4 0/" in checked["message"]


def test_against_the_other_experts_source(sources: dict[str, Path]) -> None:
    """The BF16-experts file held to the MXFP4 source (the same names, metadata and other tensors; the experts the
    MXFP4 release's, not the BF16 weights they were compressed from): one AGAINST_VALUES covering the six stacked
    expert tensors, exit 1."""
    if not same_source("mxfp4", sources["mxfp4"]):
        pytest.skip("this torch/compressed-tensors wrote another source than the generator's")
    code, doc = against(DATA / FILES["bf16"], sources["mxfp4"], "--values")
    assert code == 1 and [c for c, _ in errors(doc)] == ["AGAINST_VALUES"]
    values = next(f for f in doc["findings"] if f["code"] == "AGAINST_VALUES")
    assert values["covers"] == 6 and values["tensor"].endswith("_exps.weight")


def rewrite(src: Path, dst: Path, edit: Any) -> None:
    g = gb.read(src)
    edit(g)
    gb.write(g, dst)


DROPPED = ("blk.1.ssm_g.weight", "blk.0.attn_res_score.weight", "output_res_score.weight",
           "blk.2.ffn_routed_norm.weight", "blk.2.ffn_down_exps.weight", "blk.0.ssm_a", "output.weight")
"""A KDA layer's full-rank gate, a fused residual score (a layer's, the output's), one latent norm of two, stacked
MXFP4 experts, a KDA decay, the output head (which kimi-k3's loader requires: never read as tied)."""


@pytest.mark.parametrize("name", DROPPED)
def test_a_dropped_tensor(name: str, tmp_path: Path) -> None:
    """One TENSOR_MISSING naming it, exit 1."""
    out = tmp_path / FILES["mxfp4"]
    rewrite(DATA / FILES["mxfp4"], out, lambda g: g.tensors.remove(g.tensor(name)))
    report = audit(out)
    assert [(f.code, f.tensor) for f in report.findings] == [("TENSOR_MISSING", name)]
    assert report.exit_code() == 1


def test_the_mla_output_gate_dropped_is_found_against_its_source(sources: dict[str, Path], tmp_path: Path) -> None:
    """The loader creates `attn_gate` only where the file holds it (TENSOR_NOT_REQUIRED), so a file without the
    fixture's one MLA layer's gate is a K3 without output gates to the audit alone (PASS, as llama.cpp loads it);
    held to its source, whose g_proj the converter writes there, it is one AGAINST_UNACCOUNTED naming it."""
    out = tmp_path / FILES["mxfp4"]
    rewrite(DATA / FILES["mxfp4"], out, lambda g: g.tensors.remove(g.tensor("blk.2.attn_gate.weight")))
    assert codes(audit(out)) == []
    code, doc = against(out, sources["mxfp4"])
    gate = "language_model.model.layers.2.self_attn.g_proj.weight"
    assert code == 1 and errors(doc) == [("AGAINST_UNACCOUNTED", gate)]


KEY_FAULTS = {
    "no attn_res block size": (lambda g: g.kv.pop(f"{ARCH}.attn_res.block_size"), "GGUF_KEY_MISSING",
                               "attn_res.block_size"),
    "no situ beta": (lambda g: g.kv.pop(f"{ARCH}.activation.situ_beta"), "GGUF_KEY_MISSING", "activation.situ_beta"),
    "no kda head dim": (lambda g: g.kv.pop(f"{ARCH}.kda.head_dim"), "GGUF_KEY_MISSING", "kda.head_dim"),
    "situ beta as uint32": (lambda g: g.set(f"{ARCH}.activation.situ_beta", 4, 4), "GGUF_KEY_TYPE",
                            "activation.situ_beta"),
    "latent length as float": (lambda g: g.set(f"{ARCH}.expert_latent_length", 6, 32.0), "GGUF_KEY_TYPE",
                               "expert_latent_length"),
    "softmax gating": (lambda g: g.set(f"{ARCH}.expert_gating_func", 4, 1), "GGUF_GATING", "expert_gating_func"),
}
"""What kimi-k3's loader refuses or misreads: a key it requires absent (the attention residuals' block size and the
situ beta, which kimi-k3.cpp's load_arch_hparams gets without `required = false`; the KDA head dimension), a key
stored in another type than it reads it with (float situ_beta, uint32_t n_expert_latent), softmax routing beside
exp_probs_b."""


@pytest.mark.parametrize("fault", sorted(KEY_FAULTS))
def test_a_key_fault(fault: str, tmp_path: Path) -> None:
    """One error naming the key, exit 1."""
    edit, code, key = KEY_FAULTS[fault]
    out = tmp_path / FILES["mxfp4"]
    rewrite(DATA / FILES["mxfp4"], out, edit)
    report = audit(out)
    assert [(f.code, f.tensor) for f in report.findings] == [(code, f"{ARCH}.{key}")]
    assert report.exit_code() == 1


def copy_source(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


CONFIG_FAULTS = {"activation_situ_linear_beta": (20.0, "activation.situ_linear_beta"),
                 "attn_res_block_size": (4, "attn_res.block_size"),
                 "moe_renormalize": (False, "expert_weights_norm")}
"""A text_config value the GGUF disagrees with, and the key the converter writes it to."""


@pytest.mark.parametrize("key", sorted(CONFIG_FAULTS))
def test_a_config_value_that_disagrees(key: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """The source's config.json says otherwise than the GGUF: one AGAINST_METADATA naming the key, exit 1."""
    value, gguf_key = CONFIG_FAULTS[key]
    src = copy_source(sources["mxfp4"], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["text_config"][key] = value
    (src / "config.json").write_text(json.dumps(config))
    code, doc = against(DATA / FILES["mxfp4"], src)
    assert code == 1 and errors(doc) == [("AGAINST_METADATA", f"{ARCH}.{gguf_key}")]


SOURCE_VALUE_FAULTS = {
    "language_model.model.layers.1.mlp_res_proj.weight": "blk.1.ffn_res_score.weight",
    "language_model.model.output_attn_res_norm.weight": "output_res_score.weight",
    "language_model.model.layers.0.self_attn.A_log": "blk.0.ssm_a",
    "language_model.model.layers.1.self_attn.g_proj.weight": "blk.1.ssm_g.weight",
    "language_model.model.layers.2.self_attn.g_proj.weight": "blk.2.attn_gate.weight",
}
"""A source tensor changed (its first value doubled) -> the GGUF tensor the converter writes it into."""


@pytest.mark.parametrize("name", sorted(SOURCE_VALUE_FAULTS))
def test_a_value_changed(name: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """One source tensor's first value changed: one AGAINST_VALUES naming the GGUF tensor the converter writes it
    into (through the fusion, the cut and negated exponential, the gate resolved by layer kind), exit 1."""
    import torch
    from safetensors.torch import load_file, save_file

    if not same_source("mxfp4", sources["mxfp4"]):
        pytest.skip("this torch/compressed-tensors wrote another source than the generator's")
    src = copy_source(sources["mxfp4"], tmp_path / "src")
    tensors = load_file(str(src / "model.safetensors"))
    flat = tensors[name].view(-1)
    flat[0] = flat[0] * 2 + torch.tensor(0.5, dtype=flat.dtype)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, doc = against(DATA / FILES["mxfp4"], src, "--values")
    assert code == 1 and errors(doc) == [("AGAINST_VALUES", SOURCE_VALUE_FAULTS[name])]
    assert next(f for f in doc["findings"] if f["code"] == "AGAINST_VALUES")["covers"] == 1


def test_a_gguf_value_changed(sources: dict[str, Path], tmp_path: Path) -> None:
    """One byte of a Q8_0 block of the GGUF changed: one AGAINST_VALUES naming it, exit 1."""
    if not same_source("mxfp4", sources["mxfp4"]):
        pytest.skip("this torch/compressed-tensors wrote another source than the generator's")
    out = tmp_path / FILES["mxfp4"]

    def edit(g: Any) -> None:
        t = g.tensor("blk.0.ssm_g.weight")
        t.data = t.data[:5] + bytes([t.data[5] ^ 0x40]) + t.data[6:]

    rewrite(DATA / FILES["mxfp4"], out, edit)
    code, doc = against(out, sources["mxfp4"], "--values")
    assert code == 1 and errors(doc) == [("AGAINST_VALUES", "blk.0.ssm_g.weight")]
