"""GLM-4.x GGUFs, proven against llama.cpp's own converter: tests/data/gguf_archs/glm4moe and glm4moe-lite were
written by llama.cpp 0c1e5709's `convert_hf_to_gguf.py --outtype q8_0` from tiny models transformers built with its
own classes, their NextN layer kept as the converter keeps it by default (tests/writers/gguf_glm4_generate.py,
PROVENANCE.json):
- `glm4moe` (Glm4MoeForCausalLM, Glm4MoeModel: model.arch.glm4_moe's dialect): GQA with biases and q/k norms;
- `glm4moe-lite` (Glm4MoeLiteForCausalLM, Glm4MoeLiteModel: GGUF arch `deepseek2`, model.arch.deepseek_v3's dialect
  with the NextN layer kept, read back as model.arch.glm4_moe_lite).
Each is held to gguf-py's GGUFReader (tests/test_gguf_archs.py reads every folder), its names to llama.cpp's own
gguf-py TensorNameMap and tensor lists (the installed gguf 0.19 has no NextN names for deepseek2) and to the
converter's names recorded in tests/data/loader_names/glm4_moe.llamacpp.json, its parameters to transformers'
model, its metadata to the converter's, and the source it was converted from through `--against` and `--values`;
each fault is one finding and a non-zero exit."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.model.arch.deepseek_v3.gguf import NEXTN_LAYER
from kimi_audit.model.arch.registry import architecture, gguf_architecture
from kimi_audit.sources import LocalSource
from test_gguf_archs import f32, plain, rewrite

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "gguf_archs"
WRITER = ROOT / "writers" / "gguf_glm4_generate.py"
NAMES = json.loads((ROOT / "data" / "loader_names" / "glm4_moe.llamacpp.json").read_text())
FILE = "tiny-Q8_0.gguf"
ARCHS = ("glm4moe", "glm4moe-lite")
PREFIX = {"glm4moe": "glm4moe", "glm4moe-lite": "deepseek2"}
"""Each file's `general.architecture` (its keys' prefix)."""
MODEL_TYPES = {"glm4moe": "glm4_moe", "glm4moe-lite": "glm4_moe_lite"}
BLOCKS = 4
"""The files' blocks: three main layers and the NextN layer."""
LLAMA_CPP_DEFAULT = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"
"""Where the llama-cpp-python 0.3.36 sdist the fixtures were written from is unpacked (LLAMA_CPP overrides)."""
runner = CliRunner()


def codes(report: Any) -> list[str]:
    return [f.code for f in report.findings]


def provenance(arch: str) -> dict[str, Any]:
    return json.loads((DATA / arch / "PROVENANCE.json").read_text())  # type: ignore[no-any-return]


def generator() -> Any:
    sys.path.insert(0, str(WRITER.parent))
    import gguf_glm4_generate

    return gguf_glm4_generate


def stored(arch: str) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(DATA / arch / FILE).tensors}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny checkpoint, written again by the generator's own code (seeded: the same bytes on this torch and
    transformers, which PROVENANCE.json's source_files digests say)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    writer = generator()
    out: dict[str, Path] = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp("glm") / arch
        writer.save_source(arch, folder)
        out[arch] = folder
    return out


def same_source(arch: str, folder: Path) -> bool:
    want = provenance(arch)["source_files"]
    return all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == e["sha256"] for n, e in want.items())


@pytest.mark.parametrize("arch", ARCHS)
def test_provenance_pins_the_generator_and_what_it_shares(arch: str) -> None:
    """The generator and the script it imports from (gguf_archs_generate.py) by sha256, llama.cpp's commit and the
    converter class, every file small."""
    prov = provenance(arch)
    assert prov["written_by"] == "tests/writers/gguf_glm4_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(WRITER.read_bytes()).hexdigest()
    for script, digest in prov["shared_with"].items():
        assert hashlib.sha256((ROOT.parent / script).read_bytes()).hexdigest() == digest, script
    assert prov["llama.cpp"]["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert prov["llama.cpp"]["converter_class"] == {"glm4moe": "Glm4MoeModel", "glm4moe-lite": "Glm4MoeLiteModel"}[arch]
    assert prov["gguf_architecture"] == PREFIX[arch]
    for name, entry in prov["files"].items():
        path = DATA / arch / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], name
        assert path.stat().st_size == entry["bytes"] < 1_000_000


@pytest.mark.parametrize("arch", ARCHS)
def test_the_converters_output_audits_clean(arch: str) -> None:
    """PASS with no finding; the parameters are the file's elements (the NextN layer's included), the model its
    GLM model type; the NextN layer is there (blk.3.nextn.*, `nextn_predict_layers` 1 of 4 blocks)."""
    report = audit(DATA / arch / FILE)
    assert report.verdict() == "PASS" and codes(report) == []
    assert report.stats.parameters == sum(int(t.n_elements) for t in stored(arch).values())
    assert report.model["model_type"] == MODEL_TYPES[arch]
    kv = read_gguf_part(LocalSource(DATA / arch), FILE).kv
    assert (kv[f"{PREFIX[arch]}.block_count"], kv[f"{PREFIX[arch]}.nextn_predict_layers"]) == (BLOCKS, 1)
    assert "blk.3.nextn.eh_proj.weight" in stored(arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_are_transformers_model_and_the_nextn_head(arch: str) -> None:
    """The file's elements are transformers' model of the source (main layers and the NextN decoder layer: its
    sum(numel)), the router correction biases it keeps as buffers (the releases store them) and the NextN head the
    release stores beside its decoder layer (eh_proj, enorm, hnorm, shared_head.norm; GLM-4.7-Flash's copies)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    writer = generator()
    config_cls, model_cls = (getattr(transformers, n) for n in writer.CLASSES[arch])
    cfg = {k: v for k, v in writer.CONFIGS[arch].items() if k not in writer.EXTRA}
    with torch.device("meta"):
        model = model_cls(config_cls(**{**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + writer.NEXTN}))
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    head = writer.mtp_head(arch, cfg["hidden_size"], cfg["vocab_size"], torch.Generator().manual_seed(0))
    assert audit(DATA / arch / FILE).stats.parameters == params + biases + sum(t.numel() for t in head.values())


def vendored_gguf_py() -> Path:
    """llama.cpp's own gguf-py at the fixtures' commit (the installed gguf 0.19 maps no NextN tensor of deepseek2)."""
    root = Path(os.environ.get("LLAMA_CPP", LLAMA_CPP_DEFAULT))
    if not (root / "gguf-py" / "gguf" / "constants.py").is_file():
        pytest.skip(f"no llama.cpp source at {root} (set LLAMA_CPP): its gguf-py's GLM4_MOE/DEEPSEEK2 tables are there")
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


def name_map(arch: str, names: list[str]) -> dict[str, Any]:
    """llama.cpp's gguf-py TensorNameMap for `arch` with the files' block count, and its tensor list, run in a
    process of its own (the installed gguf stays this one's)."""
    path = vendored_gguf_py()
    done = subprocess.run([sys.executable, "-c", NAME_MAP, arch, str(BLOCKS), json.dumps(names)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(path)}, check=True)
    theirs: dict[str, Any] = json.loads(done.stdout)
    assert Path(theirs["file"]).resolve().is_relative_to(path.resolve())
    return theirs


def converter_spelling(name: str) -> str:
    """What ModelBase.map_tensor_name looks a release name up as (conversion/base.py line 593)."""
    return name.replace("e_score_correction_bias", "e_score_correction.bias")


@pytest.mark.parametrize("arch", ARCHS)
def test_names_are_the_converters(arch: str) -> None:
    """Every tensor of the file is one the dialect's names give (the layout of the PASS above), in gguf-py's tensor
    list for the arch, and what gguf-py's TensorNameMap (the table the converter renames with) makes of its
    release name (the routed experts as the converter stacks them: mlp.experts.{gate,up,down}_proj)."""
    record = gguf_architecture(PREFIX[arch])
    assert record is not None and record.gguf is not None
    dialect = record.gguf
    files = set(stored(arch))
    spelled = {tree: name for tree, name in dialect.top + tuple(
        (f"model.layers.{i}.{a}", f"blk.{i}.{b}") for i in range(BLOCKS) for a, b in dialect.layer)
        if name in files}
    assert set(spelled.values()) == files
    theirs = name_map(PREFIX[arch], sorted(converter_spelling(t) for t in spelled))
    for tree, name in spelled.items():
        assert name.removesuffix(".weight").removesuffix(".bias") in theirs["listed"], name
        assert theirs["mapped"][converter_spelling(tree)] == name, tree
        assert dialect.rename(tree) == name


def test_the_recorded_converter_names_are_the_dialects_and_gguf_pys() -> None:
    """tests/data/loader_names/glm4_moe.llamacpp.json, the converter's names transcribed with its commit, is the
    glm4moe dialect's table (and its NextN names deepseek2's), and each entry is what llama.cpp's own gguf-py maps
    the release name to, for GLM4_MOE and (the NextN layer's) DEEPSEEK2."""
    record = architecture("glm4_moe")
    assert record is not None and record.gguf is not None
    assert NAMES["source"].startswith("ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f ")
    table = {**NAMES["glm4moe_layer"], **NAMES["nextn_layer"]}
    assert dict(record.gguf.layer) == table and dict(record.gguf.top) == NAMES["top"]
    assert dict(NEXTN_LAYER) == NAMES["nextn_layer"]
    for arch, layer in (("glm4moe", table), ("deepseek2", NAMES["nextn_layer"])):
        names = {converter_spelling(f"model.layers.3.{a}"): f"blk.3.{b}" for a, b in layer.items()}
        theirs = name_map(arch, sorted(names))
        assert theirs["mapped"] == names, arch
    assert set(NAMES["loader_optional"]) <= set(table.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_metadata_is_what_the_converter_writes_from_the_config(arch: str, sources: dict[str, Path]) -> None:
    """The source architecture's dialect `metadata`, applied to the config.json the converter read, gives every
    `{arch}.*` key the converter wrote, value for value (floats as GGUF stores them): the NextN layer in
    block_count and nextn_predict_layers, GLM-4.x's rope.dimension_count = head_dim × 0.5."""
    record = architecture(MODEL_TYPES[arch])
    assert record is not None and record.gguf is not None
    written = read_gguf_part(LocalSource(DATA / arch), FILE).kv
    config = json.loads((sources[arch] / "config.json").read_text())
    ours = record.gguf.metadata(config)
    assert {k: f32(plain(v)) for k, v in ours.items()} == {k: plain(v) for k, v in written.items()
                                                         if k.startswith(f"{PREFIX[arch]}.")}


def against(gguf_path: Path, source: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["audit", str(gguf_path), "--against", str(source), "--no-progress", "--json",
                                 *extra])
    return result.exit_code, json.loads(result.stdout)


def errors(doc: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(f["code"], f.get("tensor")) for f in doc["findings"] if f["severity"] == "error"]


def needs_same_source(arch: str, sources: dict[str, Path]) -> None:
    if not same_source(arch, sources[arch]):
        pytest.skip("this torch/transformers wrote another source than the generator's")


@pytest.mark.parametrize("arch", ARCHS)
def test_against_its_source(arch: str, sources: dict[str, Path]) -> None:
    """`audit GGUF --against SOURCE` and with `--values`: PASS, every release tensor accounted for (the NextN
    layer's in its blk.3), the element totals equal, every GGUF tensor compared (Q8_0/F32 byte for byte)."""
    code, doc = against(DATA / arch / FILE, sources[arch])
    assert code == 0 and errors(doc) == [] and doc["result"]["verdict"] == "PASS"
    needs_same_source(arch, sources)
    code, doc = against(DATA / arch / FILE, sources[arch], "--values")
    assert code == 0 and errors(doc) == [] and doc["result"]["verdict"] == "PASS"
    checked = next(f for f in doc["findings"] if f["code"] == "AGAINST_CHECKED")
    assert checked["actual"] == len(stored(arch))
    assert not any(f["code"] == "AGAINST_NOT_COMPARED" for f in doc["findings"])


def copy_source(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def without_nextn(arch: str) -> Any:
    """The file as `convert_hf_to_gguf.py --no-mtp` writes it: no blk.3, block_count 3, no nextn_predict_layers."""
    def edit(g: Any) -> None:
        g.tensors[:] = [t for t in g.tensors if not t.name.startswith("blk.3.")]
        g.set(f"{PREFIX[arch]}.block_count", 4, 3)
        g.kv.pop(f"{PREFIX[arch]}.nextn_predict_layers")
    return edit


@pytest.mark.parametrize("arch", ARCHS)
def test_a_file_without_its_nextn_layer(arch: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """Converted with `--no-mtp` (the NextN layer and its key gone, block_count the main layers): PASS, as llama.cpp
    loads it; held to its source, the NextN layer is one the file does not keep (llama.cpp's probe,
    blk.3.nextn.eh_proj): no tensor unaccounted, the totals equal, and the metadata the converter writes with
    --no-mtp (checks.against.converted_metadata; it was two AGAINST_METADATA). A file that keeps the key but not
    its layer is still held to the default's block_count."""
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, without_nextn(arch))
    report = audit(out)
    assert report.verdict() == "PASS" and codes(report) == []
    code, doc = against(out, sources[arch])
    assert code == 0 and errors(doc) == []

    def key_kept(g: Any) -> None:
        without_nextn(arch)(g)
        g.set(f"{PREFIX[arch]}.nextn_predict_layers", 4, 1)

    rewrite(DATA / arch / FILE, out, key_kept)
    code, doc = against(out, sources[arch])
    assert code == 1 and f"{PREFIX[arch]}.block_count" in {t for c, t in errors(doc) if c == "AGAINST_METADATA"}


DROPPED = {"glm4moe": ("blk.2.attn_k.weight", "blk.1.exp_probs_b.bias", "blk.3.nextn.eh_proj.weight",
                       "blk.2.attn_q.bias", "blk.0.attn_k_norm.weight", "blk.3.nextn.shared_head_norm.weight"),
           "glm4moe-lite": ("blk.2.attn_k_b.weight", "blk.3.nextn.embed_tokens.weight",
                            "blk.3.nextn.shared_head_head.weight", "blk.3.ffn_up_exps.weight")}
"""A tensor of each file the fault test drops: an attention projection, a router bias, a q bias and k norm of one
layer (the others keep theirs), the NextN layer's projection, norm, copies and experts."""


@pytest.mark.parametrize("arch,name", [(a, n) for a in ARCHS for n in DROPPED[a]])
def test_a_dropped_tensor(arch: str, name: str, tmp_path: Path) -> None:
    """One TENSOR_MISSING naming it, exit 1."""
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, lambda g: g.tensors.remove(g.tensor(name)))
    report = audit(out)
    assert [(f.code, f.tensor) for f in report.findings] == [("TENSOR_MISSING", name)]
    assert report.exit_code() == 1


def test_every_bias_dropped_is_found_against_the_source(sources: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp creates the q/k/v biases only where stored (TENSOR_NOT_REQUIRED): a file without any is a GLM
    without attention_bias to the audit alone (PASS, as llama.cpp loads it); held to its source, whose biases the
    converter writes, one AGAINST_UNACCOUNTED covering the 12 (three a layer, four layers)."""
    out = tmp_path / FILE
    rewrite(DATA / "glm4moe" / FILE, out,
            lambda g: g.tensors.__setitem__(slice(None), [t for t in g.tensors if not t.name.endswith(".bias")
                                                          or "exp_probs_b" in t.name]))
    assert codes(audit(out)) == []
    code, doc = against(out, sources["glm4moe"])
    assert code == 1 and [c for c, _ in errors(doc)] == ["AGAINST_UNACCOUNTED"]
    assert next(f for f in doc["findings"] if f["code"] == "AGAINST_UNACCOUNTED")["covers"] == 12


KEY_FAULTS = {
    ("glm4moe", "no shared count"): (lambda g: g.kv.pop("glm4moe.expert_shared_count"), "GGUF_KEY_MISSING",
                                     "glm4moe.expert_shared_count"),
    ("glm4moe", "no rms eps"): (lambda g: g.kv.pop("glm4moe.attention.layer_norm_rms_epsilon"), "GGUF_KEY_MISSING",
                                "glm4moe.attention.layer_norm_rms_epsilon"),
    ("glm4moe", "no experts"): (lambda g: g.kv.pop("glm4moe.expert_count"), "GGUF_KEY_MISSING",
                                "glm4moe.expert_count"),
    ("glm4moe", "nextn as float"): (lambda g: g.set("glm4moe.nextn_predict_layers", 6, 1.0), "GGUF_KEY_TYPE",
                                    "glm4moe.nextn_predict_layers"),
    ("glm4moe", "norm flag as uint32"): (lambda g: g.set("glm4moe.expert_weights_norm", 4, 1), "GGUF_KEY_TYPE",
                                         "glm4moe.expert_weights_norm"),
    ("glm4moe", "softmax gating"): (lambda g: g.set("glm4moe.expert_gating_func", 4, 1), "GGUF_GATING",
                                    "glm4moe.expert_gating_func"),
    ("glm4moe", "nextn over blocks"): (lambda g: g.set("glm4moe.nextn_predict_layers", 4, 5), "GGUF_KEY_VALUE",
                                       "glm4moe.nextn_predict_layers"),
    ("glm4moe-lite", "no kv lora rank"): (lambda g: g.kv.pop("deepseek2.attention.kv_lora_rank"), "GGUF_KEY_MISSING",
                                          "deepseek2.attention.kv_lora_rank"),
    ("glm4moe-lite", "nextn as float"): (lambda g: g.set("deepseek2.nextn_predict_layers", 6, 1.0), "GGUF_KEY_TYPE",
                                         "deepseek2.nextn_predict_layers"),
    ("glm4moe-lite", "no gating"): (lambda g: g.kv.pop("deepseek2.expert_gating_func"), "GGUF_GATING",
                                    "deepseek2.expert_gating_func"),
}
"""What the loaders refuse or misread: a key they require absent (glm4-moe.cpp's get_key of expert_shared_count and
the norm epsilon; its GGML_ASSERT on experts; deepseek2's kv_lora_rank), a key stored in another type than they read
it with, softmax routing beside exp_probs_b (glm4moe's 1; a deepseek2 file without the key is routed by softmax
unless it is GLM-4.7-Flash's own 47 layers and 154,880 tokens, which the tiny one is not), more NextN layers than
blocks (llama-model.cpp asserts)."""


@pytest.mark.parametrize("arch,fault", sorted(KEY_FAULTS))
def test_a_key_fault(arch: str, fault: str, tmp_path: Path) -> None:
    """One error naming the key, exit 1."""
    edit, code, key = KEY_FAULTS[arch, fault]
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, edit)
    report = audit(out)
    assert [(f.code, f.tensor) for f in report.findings] == [(code, key)]
    assert report.exit_code() == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_expert_count_changed(arch: str, tmp_path: Path) -> None:
    """expert_count 8 over 4 stacked experts: one CONFIG_DISAGREES naming the key, what it sizes counted beneath."""
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, lambda g: g.set(f"{PREFIX[arch]}.expert_count", 4, 8))
    report = audit(out)
    assert report.verdict() == "FAIL" and codes(report) == ["CONFIG_DISAGREES"]
    one = report.findings[0]
    assert one.tensor == f"{PREFIX[arch]}.expert_count" and (one.expected, one.actual) == (8, 4) and one.covers >= 4


def test_key_length_changed(tmp_path: Path) -> None:
    """glm4moe.attention.key_length (the head_dim) 16 over heads of 32: one CONFIG_DISAGREES naming the key, the
    attention tensors it sizes (q/k/v/o and their biases through heads × head_dim, the q/k norms) beneath, exit 1."""
    out = tmp_path / FILE
    rewrite(DATA / "glm4moe" / FILE, out, lambda g: g.set("glm4moe.attention.key_length", 4, 16))
    report = audit(out)
    assert [(f.code, f.tensor, f.expected, f.actual) for f in report.findings] == [
        ("CONFIG_DISAGREES", "glm4moe.attention.key_length", 16, 32)]
    assert report.findings[0].covers == 9 * BLOCKS and report.exit_code() == 1


CONFIG_FAULTS = {("glm4moe", "routed_scaling_factor"): (1.5, "glm4moe.expert_weights_scale"),
                 ("glm4moe", "partial_rotary_factor"): (1.0, "glm4moe.rope.dimension_count"),
                 ("glm4moe", "rope_theta"): (5e5, "glm4moe.rope.freq_base"),
                 ("glm4moe", "norm_topk_prob"): (False, "glm4moe.expert_weights_norm"),
                 ("glm4moe-lite", "routed_scaling_factor"): (1.5, "deepseek2.expert_weights_scale"),
                 ("glm4moe-lite", "rms_norm_eps"): (1e-6, "deepseek2.attention.layer_norm_rms_epsilon")}
"""A config.json value the GGUF disagrees with, and the key the converter writes it to (the nested rope
parameters through rope.dimension_count = head_dim × partial_rotary_factor and rope.freq_base)."""


@pytest.mark.parametrize("arch,key", sorted(CONFIG_FAULTS))
def test_a_config_value_that_disagrees(arch: str, key: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """The source's config.json says otherwise than the GGUF: one AGAINST_METADATA naming the key, exit 1."""
    value, gguf_key = CONFIG_FAULTS[arch, key]
    src = copy_source(sources[arch], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (config["rope_parameters"] if key in config["rope_parameters"] else config)[key] = value
    (src / "config.json").write_text(json.dumps(config))
    code, doc = against(DATA / arch / FILE, src)
    assert code == 1 and errors(doc) == [("AGAINST_METADATA", gguf_key)]


SOURCE_VALUE_FAULTS = {
    ("glm4moe", "model.layers.3.eh_proj.weight"): "blk.3.nextn.eh_proj.weight",
    ("glm4moe", "model.layers.1.self_attn.k_proj.bias"): "blk.1.attn_k.bias",
    ("glm4moe", "model.layers.2.mlp.experts.3.down_proj.weight"): "blk.2.ffn_down_exps.weight",
    ("glm4moe-lite", "model.layers.3.shared_head.head.weight"): "blk.3.nextn.shared_head_head.weight",
    ("glm4moe-lite", "model.layers.3.mlp.gate.e_score_correction_bias"): "blk.3.exp_probs_b.bias",
}
"""A source tensor changed (its first value doubled) -> the GGUF tensor the converter writes it into."""


@pytest.mark.parametrize("arch,name", sorted(SOURCE_VALUE_FAULTS))
def test_a_source_value_changed(arch: str, name: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """One AGAINST_VALUES naming the GGUF tensor (the NextN layer's, a bias, a stacked expert), exit 1."""
    import torch
    from safetensors.torch import load_file, save_file

    needs_same_source(arch, sources)
    src = copy_source(sources[arch], tmp_path / "src")
    tensors = load_file(str(src / "model.safetensors"))
    flat = tensors[name].view(-1)
    flat[0] = flat[0] * 2 + torch.tensor(0.5, dtype=flat.dtype)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, doc = against(DATA / arch / FILE, src, "--values")
    assert code == 1 and errors(doc) == [("AGAINST_VALUES", SOURCE_VALUE_FAULTS[arch, name])]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_gguf_value_changed(arch: str, sources: dict[str, Path], tmp_path: Path) -> None:
    """One byte of a Q8_0 block of the GGUF changed: one AGAINST_VALUES naming it, exit 1."""
    needs_same_source(arch, sources)
    name = "blk.3.nextn.eh_proj.weight"
    out = tmp_path / FILE

    def edit(g: Any) -> None:
        t = g.tensor(name)
        t.data = t.data[:5] + bytes([t.data[5] ^ 0x40]) + t.data[6:]

    rewrite(DATA / arch / FILE, out, edit)
    code, doc = against(out, sources[arch], "--values")
    assert code == 1 and errors(doc) == [("AGAINST_VALUES", name)]


def test_against_the_other_glm(sources: dict[str, Path]) -> None:
    """GLM-4.7-Flash's checkpoint is not the glm4moe file's source (nor the reverse): an AGAINST_ error, exit 1."""
    for arch, other in (("glm4moe", "glm4moe-lite"), ("glm4moe-lite", "glm4moe")):
        code, doc = against(DATA / arch / FILE, sources[other])
        assert code == 1 and any(c.startswith("AGAINST_") for c, _ in errors(doc)), arch
