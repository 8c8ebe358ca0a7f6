"""The lineage's other GGUF architectures, proven against llama.cpp's own converter: tests/data/gguf_archs/<arch>
was written by llama.cpp 0c1e5709's `convert_hf_to_gguf.py --outtype q8_0` from a tiny model transformers built
with its own class (tests/writers/gguf_archs_generate.py, PROVENANCE.json): `deepseek32` (DeepseekV32ForCausalLM,
a dialect of model.arch.deepseek_v3) and `glm-dsa` (GlmMoeDsaForCausalLM, model.arch.glm_moe_dsa, one layer
sharing its indexer) and `kimi-linear` (KimiLinearForCausalLM, model.arch.kimi_linear: KDA layers beside an MLA
layer, a dense layer then MoE). Each is held to gguf-py's GGUFReader, its names to gguf-py's TensorNameMap, its
parameters to transformers' model, its metadata to the converter's, and the source it was converted from through
`--against`."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.format.gguf import GgufArray, read_gguf_part
from kimi_audit.model.arch.registry import gguf_architecture
from kimi_audit.sources import LocalSource

gguf = pytest.importorskip("gguf")

DATA = Path(__file__).resolve().parent / "data" / "gguf_archs"
WRITER = Path(__file__).resolve().parent / "writers" / "gguf_archs_generate.py"
FILE = "tiny-Q8_0.gguf"
ARCHS = ("deepseek32", "glm-dsa", "kimi-linear")
"""The archs the audit reads (a dialect each)."""
CLASSES = {"deepseek32": "DeepseekV32ForCausalLM", "glm-dsa": "GlmMoeDsaForCausalLM",
           "kimi-linear": "KimiLinearForCausalLM"}
MODEL_TYPES = {"deepseek32": "deepseek_v32", "glm-dsa": "glm_moe_dsa", "kimi-linear": "kimi_linear"}
DROPPED = {"deepseek32": "blk.2.indexer.attn_k.weight", "glm-dsa": "blk.2.indexer.attn_k.weight",
           "kimi-linear": "blk.1.ssm_conv1d_k.weight"}
"""A tensor of each file the fault test drops: a full layer's indexer key projection, a KDA layer's key
convolution."""
CONVERTER_RENAMES = (("e_score_correction_bias", "e_score_correction.bias"), (".dt_bias", ".dt_proj.bias"))
"""What the converters rename before gguf-py's TensorNameMap reads a name: the router bias (deepseek's and
Kimi-Linear's), KDA's dt_bias (KimiLinearModel.modify_tensors)."""
runner = CliRunner()


def codes(report: Any) -> list[str]:
    return [f.code for f in report.findings]


def gguf_arch(name: str) -> Any:
    """gguf-py's MODEL_ARCH for `name`; gguf 0.19 from PyPI predates DEEPSEEK32, whose tensor table at 0c1e5709 is
    GLM_DSA's less ATTN_KV_B (which neither converter writes since #12801)."""
    by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
    return by_name.get(name, gguf.MODEL_ARCH.GLM_DSA if name == "deepseek32" else None)


def provenance(arch: str) -> dict[str, Any]:
    return json.loads((DATA / arch / "PROVENANCE.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("arch", sorted(p.name for p in DATA.iterdir() if p.is_dir()))
def test_provenance_pins_the_generator_and_every_file(arch: str) -> None:
    """Each folder pins the generator that wrote it (`written_by`, a script of tests/writers/: gguf_archs_generate.py
    or an architecture's own beside it) by its sha256, and every file it wrote."""
    prov = provenance(arch)
    writer = WRITER.parents[2] / prov["written_by"]
    assert writer.parent == WRITER.parent
    assert prov["script_sha256"] == hashlib.sha256(writer.read_bytes()).hexdigest()
    assert prov["llama.cpp"]["commit"].startswith("0c1e5709")
    for name, entry in prov["files"].items():
        path = DATA / arch / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], name
        assert path.stat().st_size == entry["bytes"] < 1_500_000


@pytest.mark.parametrize("arch", sorted(p.name for p in DATA.iterdir() if p.is_dir()))
def test_reader_equals_gguf_py(arch: str) -> None:
    """(a) Every tensor's name, ggml type, shape and offset, and every key, as gguf-py's GGUFReader reads them."""
    ours = read_gguf_part(LocalSource(DATA / arch), FILE)
    theirs = gguf.GGUFReader(DATA / arch / FILE)
    gb.assert_tensors_read_as_gguf_py(ours, theirs)
    assert ours.kv["general.architecture"] == provenance(arch).get("gguf_architecture", arch)  # (its folder's name)
    for key, f in theirs.fields.items():
        if key.startswith("GGUF.") or key.startswith("tokenizer.ggml."):
            continue
        value = f.contents()
        mine = ours.kv[key]
        if isinstance(mine, GgufArray):
            assert list(mine.values or ()) == value, key
        else:
            assert mine == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_output_audits_clean(arch: str) -> None:
    """(b) PASS with no finding; the parameters are the file's elements."""
    report = audit(DATA / arch / FILE)
    assert report.verdict() == "PASS" and codes(report) == []
    elements = sum(int(t.n_elements) for t in gguf.GGUFReader(DATA / arch / FILE).tensors)
    assert report.stats.parameters == elements
    assert report.model["model_type"] == MODEL_TYPES[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_equal_the_source_model_as_transformers_builds_it(arch: str) -> None:
    """(b) The GGUF's element total is transformers' model of the source config: its parameters plus the router
    biases it keeps as buffers (the releases store them; the converter writes them as exp_probs_b)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    writer = generator()
    config_cls, model_cls = (getattr(transformers, n) for n in writer.CLASSES[arch])
    cfg = {k: v for k, v in writer.CONFIGS[arch].items() if k not in writer.EXTRA}
    with torch.device("meta"):
        model = model_cls(config_cls(**cfg))
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert audit(DATA / arch / FILE).stats.parameters == params + biases


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_names_are_the_converters(arch: str) -> None:
    """(c) Every tensor the dialect expects (the layout of the PASS above: every tensor the file holds) is what
    gguf-py's TensorNameMap, the table convert_hf_to_gguf renames with, makes of its release name."""
    arch_record = gguf_architecture(arch)
    assert arch_record is not None and arch_record.gguf is not None
    dialect = arch_record.gguf
    stored = {t.name for t in gguf.GGUFReader(DATA / arch / FILE).tensors}
    layers = 3
    tmap = gguf.get_tensor_name_map(gguf_arch(arch), layers)
    spelled: dict[str, str] = {}
    for tree, name in dialect.top + tuple((f"model.layers.{i}.{a}", f"blk.{i}.{b}") for i in range(layers)
                                          for a, b in dialect.layer):
        if name in stored:
            spelled[name] = tree
            converted = tree
            for before, after in CONVERTER_RENAMES:
                converted = converted.replace(before, after)
            assert tmap.get_name(converted, try_suffixes=(".weight", ".bias")) == name, tree
            assert dialect.rename(tree) == name
    assert set(spelled) == stored


def f32(value: object) -> object:
    return struct.unpack("<f", struct.pack("<f", value))[0] if isinstance(value, float) else value


def plain(value: object) -> object:
    return list(value.values or ()) if isinstance(value, GgufArray) else value


@pytest.mark.parametrize("arch", ARCHS)
def test_metadata_is_what_the_converter_writes_from_the_config(arch: str, sources: dict[str, Path]) -> None:
    """(d) The dialect's `metadata`, applied to the config.json the converter read, gives every `{arch}.*` key the
    converter wrote, value for value (floats as GGUF stores them)."""
    arch_record = gguf_architecture(arch)
    assert arch_record is not None and arch_record.gguf is not None
    written = read_gguf_part(LocalSource(DATA / arch), FILE).kv
    config = json.loads((sources[arch] / "config.json").read_text())
    ours = arch_record.gguf.metadata(config)
    assert {k: f32(plain(v)) for k, v in ours.items()} == {k: plain(v) for k, v in written.items()
                                                     if k.startswith(f"{arch}.")}


def rewrite(src: Path, dst: Path, edit: Any) -> None:
    g = gb.read(src)
    edit(g)
    gb.write(g, dst)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_missing_tensor(arch: str, tmp_path: Path) -> None:
    """(e) One tensor dropped (DROPPED): TENSOR_MISSING, that tensor alone."""
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, lambda g: g.tensors.remove(g.tensor(DROPPED[arch])))
    report = audit(out)
    assert codes(report) == ["TENSOR_MISSING"] and report.findings[0].tensor == DROPPED[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_expert_count_changed(arch: str, tmp_path: Path) -> None:
    """(e) expert_count 8 over 4 stacked experts: one root cause, the key named, the stacked tensors and routers it
    sizes counted beneath (CONFIG_DISAGREES), not an error per tensor."""
    out = tmp_path / FILE
    rewrite(DATA / arch / FILE, out, lambda g: g.set(f"{arch}.expert_count", 4, 8))
    report = audit(out)
    assert report.verdict() == "FAIL" and codes(report) == ["CONFIG_DISAGREES"]
    one = report.findings[0]
    assert one.tensor == f"{arch}.expert_count" and (one.expected, one.actual) == (8, 4) and one.covers >= 4


def test_glm_shared_layer_has_no_indexer() -> None:
    """glm-dsa.attention.indexer.types [full, shared, full]: layer 1 holds no indexer, and is expected to hold
    none; absent the key, a GLM-5 (context below 1048576) file reads every layer full, as glm-dsa.cpp does."""
    report = audit(DATA / "glm-dsa" / FILE)
    assert report.verdict() == "PASS"
    stored = {t.name for t in gguf.GGUFReader(DATA / "glm-dsa" / FILE).tensors}
    assert "blk.1.indexer.attn_k.weight" not in stored and "blk.2.indexer.attn_k.weight" in stored


# --- against the checkpoint each was converted from ---------------------------------------------------------


def generator() -> Any:
    sys.path.insert(0, str(WRITER.parent))
    import gguf_archs_generate

    return gguf_archs_generate


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny checkpoint, saved again by the generator's own code (seeded: the same bytes on this torch and
    transformers, which PROVENANCE.json's source_files digests say)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    writer = generator()
    out: dict[str, Path] = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp("hf") / arch
        writer.save_source(arch, folder)
        (folder / "generation_config.json").unlink(missing_ok=True)
        out[arch] = folder
    return out


def same_source(arch: str, folder: Path) -> bool:
    want = provenance(arch)["source_files"]
    return all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == e["sha256"] for n, e in want.items())


@pytest.mark.parametrize("arch", ARCHS)
def test_against_its_source(arch: str, sources: dict[str, Path]) -> None:
    """`audit GGUF --against SOURCE`: no AGAINST_* error; with --values, every Q8_0 tensor byte-equal to ggml's
    Q8_0 of the source's values (where this torch wrote the same source bytes as the generator's)."""
    extra = ["--values"] if same_source(arch, sources[arch]) else []
    result = runner.invoke(app, ["audit", str(DATA / arch / FILE), "--against", str(sources[arch]), "--no-progress",
                                 "--json", *extra])
    doc = json.loads(result.stdout)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert result.exit_code == 0 and errors == [] and doc["result"]["verdict"] == "PASS", errors
    if extra:
        checked = next(f for f in doc["findings"] if f["code"] == "AGAINST_CHECKED")
        assert checked["actual"] == len(gguf.GGUFReader(DATA / arch / FILE).tensors)


@pytest.mark.parametrize("arch", ARCHS)
def test_against_another_arch_source(arch: str, sources: dict[str, Path]) -> None:
    """The other DSA model's checkpoint is not this file's source: AGAINST_ARCHITECTURE or AGAINST_METADATA."""
    other = sources[next(a for a in ARCHS if a != arch)]
    result = runner.invoke(app, ["audit", str(DATA / arch / FILE), "--against", str(other), "--no-progress",
                                 "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code != 0
    assert any(f["code"].startswith("AGAINST_") and f["severity"] == "error" for f in doc["findings"])


def test_against_an_array_key_that_differs(sources: dict[str, Path], tmp_path: Path) -> None:
    """glm-dsa.attention.indexer.types, an array, changed in the GGUF: one AGAINST_METADATA whose values are plain
    lists in the JSON report (the reader's GgufArray once made --json a TypeError)."""
    out = tmp_path / FILE
    rewrite(DATA / "glm-dsa" / FILE, out, lambda g: g.set("glm-dsa.attention.indexer.types", 9, [0, 0, 0], 5))
    result = runner.invoke(app, ["audit", str(out), "--against", str(sources["glm-dsa"]), "--no-progress", "--json"])
    doc = json.loads(result.stdout)
    meta = [f for f in doc["findings"] if f["code"] == "AGAINST_METADATA"]
    assert result.exit_code == 1 and meta and isinstance(meta[0]["actual"], list), result.output


# --- kimi-linear: what its loader reads beside deepseek2's keys ---------------------------------------------


def trim_size_one_dims(g: Any) -> None:
    """The KDA tensors as gguf.cpp stores them after llama-quantize or gguf-split: trailing ne of 1 dropped."""
    for t in g.tensors:
        if ".ssm_conv1d_" in t.name or t.name.endswith(".ssm_a"):
            while len(t.ne) > 1 and t.ne[-1] == 1:
                t.ne.pop()


def test_kimi_linear_as_ggml_writes_it(tmp_path: Path) -> None:
    """The same file as llama-quantize or gguf-split writes it (gguf.cpp stores ggml_n_dims dimensions, the
    trailing ne of 1 dropped): each short convolution [64, 1, 4], each ssm_a [2, 1]. llama.cpp loads either
    form (check_tensor_dims reads absent dimensions as 1): PASS, no finding."""
    out = tmp_path / FILE
    rewrite(DATA / "kimi-linear" / FILE, out, trim_size_one_dims)
    assert [len(t.shape) for t in gguf.GGUFReader(out).tensors if t.name == "blk.0.ssm_a"] == [2]
    report = audit(out)
    assert report.verdict() == "PASS" and codes(report) == []


def test_kimi_linear_as_ggml_writes_it_against_its_source(tmp_path: Path, sources: dict[str, Path]) -> None:
    """The trimmed file held to its source with --values: the dropped size-1 dimensions are the same shape to
    llama.cpp, and to the comparison (no AGAINST_VALUES for the eight trimmed tensors)."""
    out = tmp_path / FILE
    rewrite(DATA / "kimi-linear" / FILE, out, trim_size_one_dims)
    if not same_source("kimi-linear", sources["kimi-linear"]):
        pytest.skip("this torch wrote another source than the generator's")
    result = runner.invoke(app, ["audit", str(out), "--against", str(sources["kimi-linear"]), "--values",
                                 "--no-progress", "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, [f for f in doc["findings"] if f["severity"] == "error"]


KL_KEY_FAULTS = {
    "no gating": (lambda g: g.kv.pop("kimi-linear.expert_gating_func"), "GGUF_KEY_MISSING", "expert_gating_func"),
    "softmax gating": (lambda g: g.set("kimi-linear.expert_gating_func", 4, 1), "GGUF_GATING", "expert_gating_func"),
    "no kda head dim": (lambda g: g.kv.pop("kimi-linear.kda.head_dim"), "GGUF_KEY_MISSING", "kda.head_dim"),
    "head_count_kv short": (lambda g: g.set("kimi-linear.attention.head_count_kv", 9, [0, 0], 5), "GGUF_KEY_VALUE",
                            "attention.head_count_kv"),
}
"""What kimi-linear's loader refuses or misreads: `expert_gating_func` absent (a conversion of a config.json
without moe_router_activation_func, as transformers saves it: the loader requires the key), softmax beside
exp_probs_b (other logits than the release routes by), the KDA head dimension absent, a per-layer head_count_kv
not one per block ("wrong array length")."""


@pytest.mark.parametrize("fault", sorted(KL_KEY_FAULTS))
def test_kimi_linear_key_faults(fault: str, tmp_path: Path) -> None:
    """One error, the key named."""
    edit, code, key = KL_KEY_FAULTS[fault]
    out = tmp_path / FILE
    rewrite(DATA / "kimi-linear" / FILE, out, edit)
    report = audit(out)
    assert report.verdict() == "FAIL" and codes(report) == [code]
    assert report.findings[0].tensor == f"kimi-linear.{key}"
