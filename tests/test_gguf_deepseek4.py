"""DeepSeek-V4 as llama.cpp's GGUF (arch `deepseek4`, the dialect in model.arch.deepseek_v4.gguf), proven against
llama.cpp's own converter: tests/data/gguf_archs/deepseek4 was written by llama.cpp 0c1e5709's
`convert_hf_to_gguf.py --outtype q8_0` (DeepseekV4Model) from a tiny DeepSeek-V4 that transformers 5.25's
DeepseekV4ForCausalLM built, written in the release's own names and format (FP8 with F8_E8M0 scales, FP4 routed
experts, one MTP stage: tests/writers/gguf_deepseek4_generate.py, PROVENANCE.json). The file is held to gguf-py's
reading of it, its names to gguf-py's DEEPSEEK4 table and to what the converter wrote each release tensor into
(recorded by the generator), its metadata to the converter's, its parameters to transformers' model, and to its
source through `--against` (`--values`: every tensor but the I32 hash table byte for byte, the MXFP4 experts
exactly); each fault is one finding and a failing exit."""

from __future__ import annotations

import hashlib
import json
import shutil
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
from kimi_audit.model.checkpoint import load_checkpoint
from kimi_audit.sources import LocalSource

gguf = pytest.importorskip("gguf")

A = "deepseek4"
DATA = Path(__file__).resolve().parent / "data" / "gguf_archs" / A
FILE = "tiny-Q8_0.gguf"
WRITER = Path(__file__).resolve().parent / "writers" / "gguf_deepseek4_generate.py"
TABLE = "blk.0.ffn_gate_tid2eid.weight"
"""The hash-routed layer's token -> expert table: I32, a buffer, not a parameter."""
runner = CliRunner()


def codes(report: Any) -> list[str]:
    return [f.code for f in report.findings]


def provenance() -> dict[str, Any]:
    return json.loads((DATA / "PROVENANCE.json").read_text())  # type: ignore[no-any-return]


def generator() -> Any:
    sys.path.insert(0, str(WRITER.parent))
    import gguf_deepseek4_generate

    return gguf_deepseek4_generate


def dialect() -> Any:
    arch = gguf_architecture(A)
    assert arch is not None and arch.gguf is not None and arch.model_types == ("deepseek_v4",)
    return arch.gguf


def stored() -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(DATA / FILE).tensors}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint the fixture was converted from, written again by the generator's own code (seeded: the
    bytes PROVENANCE.json's source_files digests say, on this torch and transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf") / "source"
    generator().save_source(folder)
    return folder


def same_source(folder: Path) -> bool:
    return all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == e["sha256"]
               for n, e in provenance()["source_files"].items())


def rewrite(edit: Any, dst: Path) -> Path:
    g = gb.read(DATA / FILE)
    edit(g)
    gb.write(g, dst / FILE)
    return dst / FILE


# --- what llama.cpp's converter wrote -----------------------------------------------------------------------


def test_layout_is_what_gguf_py_reads() -> None:
    """The audit's expected layout, in GGUF's names, is every tensor gguf-py's GGUFReader reads, each of its shape
    (numpy order) and ggml type: the routed experts stacked MXFP4 [E, out, in], the FP8 weights Q8_0, the hash
    table I32 [vocab, top-k], every 1-D tensor F32."""
    report = audit(DATA / FILE)
    theirs = stored()
    layout = report.checkpoint.expected  # type: ignore[union-attr]
    assert set(layout) == set(theirs)
    for name, t in theirs.items():
        e = layout[name]
        assert e.shape == tuple(int(d) for d in reversed(t.shape)), name
        assert e.dtype == t.tensor_type.name, name
    types = {n: t.tensor_type.name for n, t in theirs.items()}
    assert {types[f"blk.{i}.ffn_{p}_exps.weight"] for i in range(3) for p in ("gate", "up", "down")} == {"MXFP4"}
    assert types[TABLE] == "I32" and types["blk.1.attn_q_b.weight"] == "Q8_0"
    assert {types[n] for n, t in theirs.items() if len(t.shape) == 1} == {"F32"}


def test_names_are_gguf_py_names_for_the_arch() -> None:
    """Every tensor is named as gguf-py's MODEL_ARCH.DEEPSEEK4 table names it (TENSOR_NAMES of its MODEL_TENSORS,
    which TensorNameMap is built from; the generator read it from the vendored gguf-py: the installed one predates
    DEEPSEEK4)."""
    names = set(provenance()["gguf_py_names"])
    for name in stored():
        assert name.removesuffix(".weight").removesuffix(".bias") in names, name
    if hasattr(gguf.MODEL_ARCH, "DEEPSEEK4"):  # an installed gguf-py that knows the arch: its map too
        tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK4, 3)
        for name in stored():
            assert tmap.get_name(name, try_suffixes=(".weight", ".bias")) == name.rsplit(".", 1)[0], name


def test_names_are_the_converters(source: Path) -> None:
    """What the dialect says the converter writes each release tensor into (`converted`) is what DeepseekV4Model
    wrote it into (its modify_tensors and generate_extra_tensors, recorded by the generator): the routed experts
    into their layer's stacked tensor, the hash table as `ffn_gate_tid2eid`, and nothing for an FP8 or FP4 scale,
    the MTP stage's tensors or a hash layer's routing bias."""
    recorded = provenance()["converter_names"]
    hf = load_checkpoint(LocalSource(source))
    names, layers = set(stored()), hf.config.num_hidden_layers
    release = [n for h in hf.headers.values() for n in h.columns.names]
    assert set(release) == set(hf.expected) and set(recorded) <= set(release)  # the release as its layout says
    for name in release:
        want = tuple(dict.fromkeys(recorded.get(name, ()))) if not name.endswith(".scale") else ()
        assert dialect().converted(name, layers, names) == want, name
    assert {t for ts in recorded.values() for t in ts} == names  # every GGUF tensor from a release tensor
    for tree, spelled in dialect().layer:
        for i in range(layers):
            if f"blk.{i}.{spelled}" in names:
                assert dialect().rename(f"layers.{i}.{tree}") == f"blk.{i}.{spelled}"


def f32(value: object) -> object:
    return struct.unpack("<f", struct.pack("<f", value))[0] if isinstance(value, float) else value


def plain(value: object) -> object:
    return [f32(v) for v in value.values or ()] if isinstance(value, GgufArray) else f32(value)


def test_metadata_is_what_the_converter_writes_from_the_config(source: Path) -> None:
    """The dialect's `metadata`, applied to the config.json the converter read, gives every `deepseek4.*` key it
    wrote, value for value (floats as GGUF stores them, arrays element for element)."""
    written = read_gguf_part(LocalSource(DATA), FILE).kv
    ours = dialect().metadata(json.loads((source / "config.json").read_text()))
    assert {k: plain(v) for k, v in ours.items()} == {k: plain(v) for k, v in written.items() if k.startswith(f"{A}.")}


def test_llama_cpp_output_audits_clean() -> None:
    """PASS with no finding. Its parameters are the file's elements (gguf-py's count) but the hash table's, a
    buffer; and the converter's input, every release tensor it writes in elements (PROVENANCE.json)."""
    report = audit(DATA / FILE)
    assert report.verdict() == "PASS" and codes(report) == []
    assert report.model["model_type"] == "deepseek_v4"
    theirs = stored()
    elements = sum(int(t.n_elements) for t in theirs.values())
    assert elements == provenance()["source_elements"]["converted"]
    assert report.stats.parameters == elements - int(theirs[TABLE].n_elements)


def test_parameters_equal_the_source_model_as_transformers_builds_it() -> None:
    """The parameters are transformers' DeepseekV4ForCausalLM of the source config: its parameters plus the routing
    biases it keeps as buffers (the release stores them; the converter writes them as exp_probs_b)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**generator().CONFIG))
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert biases == 2 * 4  # the two bias-routed layers' (the hash-routed layer routes by its table)
    assert audit(DATA / FILE).stats.parameters == params + biases


def against(gguf_file: Path, folder: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["audit", str(gguf_file), "--against", str(folder), "--no-progress", "--json",
                                 *extra])
    return result.exit_code, json.loads(result.stdout)


def errors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["code"], f.get("tensor")) for f in doc["findings"] if f["severity"] == "error"]


def test_against_its_source(source: Path) -> None:
    """`audit GGUF --against SOURCE --values`: PASS; every tensor compared (Q8_0, BF16, F32 and the I32 hash table
    byte for byte; the MXFP4 experts dequantized, equal: the repack is lossless), none left out."""
    if not same_source(source):
        pytest.skip("this torch or transformers wrote another source than the generator's")
    code, doc = against(DATA / FILE, source, "--values")
    assert code == 0 and errors(doc) == [] and doc["result"]["verdict"] == "PASS"
    found = {f["code"]: f for f in doc["findings"]}
    assert found["AGAINST_CHECKED"]["actual"] == len(stored()) and TABLE in stored()
    assert "MXFP4 0/" in found["AGAINST_CHECKED"]["message"] and "AGAINST_NOT_COMPARED" not in found


# --- faults: one finding each, and a failing exit -----------------------------------------------------------


def test_a_missing_tensor(tmp_path: Path) -> None:
    """The CSA layer's indexer compressor position bias dropped: TENSOR_MISSING, that tensor alone."""
    name = "blk.1.indexer_compressor_ape.weight"
    report = audit(rewrite(lambda g: g.tensors.remove(g.tensor(name)), tmp_path))
    assert report.verdict() == "FAIL" and codes(report) == ["TENSOR_MISSING"] and report.findings[0].tensor == name


@pytest.mark.parametrize("key", ["attention.sliding_window", "hyper_connection.count", "attention.compress_ratios"])
def test_a_required_key_removed(key: str, tmp_path: Path) -> None:
    """A key llama.cpp's loader requires removed (one the layout needs, or not): GGUF_KEY_MISSING, that key."""
    report = audit(rewrite(lambda g: g.kv.pop(f"{A}.{key}"), tmp_path))
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_MISSING"]
    assert report.findings[0].tensor == f"{A}.{key}"


MISTYPED = {
    "hyper_connection.epsilon": (4, 1, None),  # UINT32 where the loader reads a float
    "swiglu_clamp_exp": (9, [10, 10, 10], 5),  # an INT32 array where get_key_or_arr reads floats
    "attention.compress_ratios": (4, 0, None),  # one UINT32 where get_arr reads an array
    "expert_weights_norm": (4, 1, None),  # UINT32 where the loader reads a bool
}


@pytest.mark.parametrize("key", sorted(MISTYPED))
def test_a_key_of_the_wrong_type(key: str, tmp_path: Path) -> None:
    """A key stored in a type llama.cpp's typed getter refuses: GGUF_KEY_TYPE, that key alone."""
    report = audit(rewrite(lambda g: g.set(f"{A}.{key}", *MISTYPED[key]), tmp_path))
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_TYPE"]
    assert report.findings[0].tensor == f"{A}.{key}"


REFUSED = {
    "softmax gating": ("expert_gating_func", (4, 1, None)),
    "ratio 64": ("attention.compress_ratios", (9, [0, 4, 64, 0], 5)),
    "ratios short": ("attention.compress_ratios", (9, [0, 4], 5)),
}
"""What the DeepSeek-V4 loader refuses: a gating function but sqrtsoftplus, a compress ratio but 0, 4 and 128,
fewer ratios than blocks."""


@pytest.mark.parametrize("fault", sorted(REFUSED))
def test_a_value_the_loader_refuses(fault: str, tmp_path: Path) -> None:
    key, value = REFUSED[fault]
    report = audit(rewrite(lambda g: g.set(f"{A}.{key}", *value), tmp_path))
    assert report.verdict() == "FAIL" and codes(report) == ["GGUF_KEY_VALUE"]
    assert report.findings[0].tensor == f"{A}.{key}"


def test_against_a_config_value_that_differs(source: Path, tmp_path: Path) -> None:
    """The source's config.json says another sliding window than the GGUF holds: one AGAINST_METADATA, that key,
    exit 1."""
    folder = tmp_path / "source"
    shutil.copytree(source, folder)
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 32}))
    code, doc = against(DATA / FILE, folder)
    assert code == 1 and errors(doc) == [("AGAINST_METADATA", f"{A}.attention.sliding_window")]


@pytest.mark.parametrize("name", ["blk.1.attn_q_b.weight", "blk.2.ffn_down_exps.weight", "output_hc_fn.weight",
                                  "blk.0.ffn_gate_tid2eid.weight"])
def test_against_a_value_changed(name: str, source: Path, tmp_path: Path) -> None:
    """One tensor's bytes changed (a Q8_0 weight, an MXFP4 expert's codes, an F32 hyper-connection, the I32
    hash-routing table, once not compared): one AGAINST_VALUES naming it, exit 1."""
    if not same_source(source):
        pytest.skip("this torch or transformers wrote another source than the generator's")

    def edit(g: Any) -> None:
        t = g.tensor(name)
        half = len(t.data) // 2
        swapped = t.data[half:] + t.data[:half]  # its second half first: the same bytes, elsewhere
        t.data = swapped if swapped != t.data else b"\x01" + t.data[1:]  # (the tiny hash table is all expert 0)

    code, doc = against(rewrite(edit, tmp_path), source, "--values")
    assert code == 1 and errors(doc) == [("AGAINST_VALUES", name)]
