"""A release in Mistral's own format as llama.cpp converts it: tests/data/mistral_format/gguf holds what llama.cpp
0c1e57098's `convert_hf_to_gguf.py --mistral-format` wrote from tests/data/mistral_format/bf16 (params.json, Mistral's
names, a Pixtral vision encoder): the text model as `deepseek2` (MistralMoeModel over DeepseekV2Model) and, with
`--mmproj`, its vision tower as a `clip` projector of type `pixtral` (PixtralModel). PROVENANCE.json pins the writer
(tests/writers/mistral_format_generate.py), the converter command and each file.

Proven here against implementations that are not this tool's: gguf-py's GGUFReader reads both files as the tool
does, gguf-py's TensorNameMap names the source's tensors as the tool does, and the converter's own files are the
pair the tool lays out and holds to the source, metadata and values included. Each fault a stranger can make of the
pair is one finding and a non-zero exit."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from typer.testing import CliRunner

import gguf_builder as gb
from kimi_audit import audit
from kimi_audit.cli import app
from kimi_audit.findings import Finding, Severity
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.model.arch import mistral4, pixtral
from kimi_audit.model.arch.registry import gguf_converts, gguf_projector
from kimi_audit.sources import LocalSource

DATA = Path(__file__).resolve().parent / "data" / "mistral_format"
SOURCE = DATA / "bf16"
GGUF = DATA / "gguf"
PROVENANCE = json.loads((DATA / "PROVENANCE.json").read_text())
sys.path.insert(0, str(Path(__file__).resolve().parent / "writers"))

import mistral_format_generate as generate  # noqa: E402

TEXT = GGUF / generate.GGUF_FILES["text"][0]
MMPROJ = GGUF / generate.GGUF_FILES["mmproj"][0]
VISION = ("vision_encoder.", "pre_mm_projector_norm.", "patch_merger.", "vision_language_adapter.")


def source_names() -> list[str]:
    raw = (SOURCE / "consolidated.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return sorted(k for k in json.loads(raw[8: 8 + n]) if k != "__metadata__")


def folder(tmp_path: Path, *files: Path) -> Path:
    d = tmp_path / "gguf"
    d.mkdir(parents=True)
    for f in files:
        shutil.copy(f, d / f.name)
    return d


def errors(report: object) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR]  # type: ignore[attr-defined]


def test_provenance_pins_the_writer_the_converter_and_every_file() -> None:
    writer = Path(__file__).resolve().parent / "writers" / "mistral_format_generate.py"
    assert PROVENANCE["writer_sha256"] == hashlib.sha256(writer.read_bytes()).hexdigest()
    assert PROVENANCE["llama_cpp_commit"].startswith("0c1e57098")
    row = PROVENANCE["gguf"]
    assert set(row["files"]) == {p.name for p in GGUF.iterdir()} == {TEXT.name, MMPROJ.name}
    for name, digest in row["files"].items():
        assert hashlib.sha256((GGUF / name).read_bytes()).hexdigest() == digest, name
        assert row["commands"][name].startswith("convert_hf_to_gguf.py bf16 --mistral-format")
    assert row["commands"][MMPROJ.name].endswith("--mmproj")
    for name, digest in PROVENANCE["variants"]["bf16"]["files"].items():
        assert hashlib.sha256((SOURCE / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("path", [TEXT, MMPROJ], ids=["text", "mmproj"])
def test_gguf_py_reads_both_files_as_the_tool_does(path: Path) -> None:
    """Every tensor (name, type, shape, offset) and every key's value the same as gguf-py's GGUFReader."""
    part = read_gguf_part(LocalSource(GGUF), path.name)
    theirs = GGUFReader(path)
    gb.assert_tensors_read_as_gguf_py(part, theirs)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        ours = part.kv[key]
        values = getattr(ours, "values", None)
        contents = field.contents()
        assert (list(values) if values is not None else ours) == contents or (
            values is None and getattr(ours, "count", None) == len(contents)), key


def test_gguf_py_names_the_source_tensors_as_the_tool_does() -> None:
    """gguf-py's TensorNameMap (deepseek2 for the text model, MMPROJ for the tower) names each source tensor it maps
    as the tool's dialect does; the rest (routed experts stacked, wkv_b split, the adapter PixtralModel renames) the
    converter's own files decide: every GGUF tensor is written from a source tensor the tool names, none else."""
    text_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, 2)
    vision_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 1)
    stored = {t.name for p in (TEXT, MMPROJ) for t in GGUFReader(p).tensors}
    written: set[str] = set()
    for name in source_names():
        ours = mistral4.converted(name, 2, stored)
        theirs = (vision_map if name.startswith(VISION) else text_map).get_name(name, try_suffixes=(".weight",))
        if theirs is not None:
            assert ours[0] == theirs, name
        assert ours and set(ours) <= stored, name
        assert mistral4.native_name(mistral4.tree_name(name)) == name
        written.update(ours)
    assert written == stored
    assert mistral4.converted("tok_embeddings.weight", 2, stored) == ("token_embd.weight", pixtral.IMG_BREAK_GGUF)


def test_the_pair_audits_clean_with_the_sources_parameters_as_the_converter_writes_them(tmp_path: Path) -> None:
    """The text GGUF and its projector in one folder: one audit, the projector laid out from its clip.vision keys
    and paired with the text model, no error; its parameters the source's (text and vision) and the [IMG_BREAK] row
    the converter copies into the projector (conversion/llava.py LlavaVisionModel.modify_tensors)."""
    pair = audit(folder(tmp_path, TEXT, MMPROJ))
    source = audit(SOURCE)
    assert errors(pair) == [] and errors(source) == []
    assert MMPROJ.name in pair.checkpoint.headers  # type: ignore[union-attr]
    assert not [f for f in pair.findings if f.code == "GGUF_NOT_A_MODEL"]
    row = PROVENANCE["variants"]["bf16"]
    assert pair.stats.parameters == source.stats.parameters + generate.PARAMS["dim"] == (
        row["text_gguf"]["elements"] + row["mmproj_gguf"]["elements"])
    assert gguf_projector("pixtral") is mistral4.ARCHITECTURE


@pytest.mark.parametrize("values", [False, True], ids=["metadata", "values"])
def test_against_its_mistral_format_source_passes(tmp_path: Path, values: bool) -> None:
    """The pair held to the params.json release it came from: the deepseek2 metadata MistralMoeModel writes, every
    source tensor accounted for, the totals equal; with --values all 49 GGUF tensors compared byte for byte."""
    r = audit(folder(tmp_path, TEXT, MMPROJ), against=SOURCE, values=values)
    assert errors(r) == []
    held = next(f for f in r.findings if f.code == "AGAINST_HELD")
    assert "55 source tensors accounted for in 49 GGUF tensors" in held.message
    if values:
        checked = next(f for f in r.findings if f.code == "AGAINST_CHECKED")
        assert checked.actual == 49 and f"16 of {MMPROJ.name}" in checked.message
        assert not [f for f in r.findings if f.code == "AGAINST_NOT_COMPARED"]
    alone = audit(folder(tmp_path / "alone", TEXT), against=SOURCE, values=values)
    assert errors(alone) == []


def test_only_mistrals_own_format_is_held_to_a_deepseek2_gguf() -> None:
    """llama.cpp converts a mistral4 release in Mistral's format (--mistral-format); Mistral4ForCausalLM in
    transformers' spelling is no converter's input: AGAINST_ARCHITECTURE, not a tensor-by-tensor failure."""
    native = {"model_type": "mistral4", "load_format": "mistral"}
    assert gguf_converts(native, "deepseek2") is mistral4.GGUF
    assert gguf_converts({"model_type": "mistral4"}, "deepseek2") is None


# --- the pair as a stranger breaks it: one finding each, a non-zero exit, no traceback ----------------------------

def mutated(tmp_path: Path, mutate: Callable[[gb.Gguf], object]) -> Path:
    d = folder(tmp_path, TEXT)
    g = gb.read(MMPROJ)
    mutate(g)
    gb.write(g, d / MMPROJ.name)
    return d


def one_error(d: Path, *args: str, against: Path | None = None, values: bool = False) -> Finding:
    """The one error the audit of `d` finds, after the command line says the same with a non-zero exit."""
    extra = [*(["--against", str(against)] if against else []), *(["--values"] if values else [])]
    r = CliRunner().invoke(app, ["audit", str(d), *extra])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    report = audit(d, against=against, values=values)
    found = [f for f in report.findings if f.severity is Severity.ERROR]
    assert len(found) == 1, errors(report)
    return found[0]


def drop(g: gb.Gguf) -> None:
    g.tensors.remove(g.tensor("v.blk.0.attn_k.weight"))


def test_a_projector_tensor_dropped_is_one_missing_tensor(tmp_path: Path) -> None:
    f = one_error(mutated(tmp_path, drop))
    assert (f.code, f.tensor) == ("TENSOR_MISSING", "v.blk.0.attn_k.weight")


@pytest.mark.parametrize(("vtype", "value", "code"), [(GGUFValueType.INT32, 2, "GGUF_KEY_TYPE"),
                                                      (GGUFValueType.UINT32, 0, "GGUF_KEY_VALUE")],
                         ids=["mistyped", "zero"])
def test_the_pixtral_merge_key_as_clip_cpp_reads_it(tmp_path: Path, vtype: int, value: int, code: str) -> None:
    """clip.vision.spatial_merge_size, the key clip.cpp's pixtral branch reads (get_u32): stored as another type it
    stops mtmd; 0, it divides by it. One finding naming the key."""
    f = one_error(mutated(tmp_path, lambda g: g.set(pixtral.SPATIAL_MERGE, vtype, value)))
    assert (f.code, f.tensor, f.shard) == (code, pixtral.SPATIAL_MERGE, MMPROJ.name)


def wide(g: gb.Gguf) -> None:
    """The projector of a model 256 wide: its out-projection, in-projection and [IMG_BREAK] row that wide, and
    clip.vision.projection_dim saying so (F32, every other tensor as written)."""
    rng = np.random.default_rng(0)
    g.set("clip.vision.projection_dim", GGUFValueType.UINT32, 256)
    for name, ne in (("mm.1.weight", [64, 256]), ("mm.2.weight", [256, 256]), (pixtral.IMG_BREAK_GGUF, [256])):
        t = g.tensor(name)
        t.ne, t.type_id = ne, int(gguf.GGMLQuantizationType.F32)
        t.data = (rng.standard_normal(int(np.prod(ne))) * 0.02).astype("<f4").tobytes()


def test_a_projector_of_another_width_is_one_error_naming_the_key(tmp_path: Path) -> None:
    """mtmd refuses a projector whose output width (mm.2.weight's rows, clip_n_mmproj_embd) is not the text
    model's embedding length (tools/mtmd/mtmd.cpp): one GGUF_PROJECTOR_WIDTH."""
    f = one_error(mutated(tmp_path, wide))
    assert (f.code, f.tensor, f.expected, f.actual) == ("GGUF_PROJECTOR_WIDTH", "clip.vision.projection_dim", 128, 256)


@pytest.mark.parametrize(("tensor", "gguf_name", "part"), [
    ("vision_encoder.transformer.layers.0.feed_forward.w3.weight", "v.blk.0.ffn_up.weight", MMPROJ),
    ("layers.1.experts.2.w2.weight", "blk.1.ffn_down_exps.weight", TEXT)], ids=["vision", "expert"])
def test_a_source_value_changed_is_one_values_finding(tmp_path: Path, tensor: str, gguf_name: str,
                                                      part: Path) -> None:
    """One BF16 value of the source changed: --values finds the one GGUF tensor the converter writes it into, in
    the file that holds it."""
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src)
    shard = src / "consolidated.safetensors"
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin = json.loads(raw[8: 8 + n])[tensor]["data_offsets"][0]
    raw[8 + n + begin: 8 + n + begin + 2] = b"\x40\x40"  # 3.0
    shard.write_bytes(bytes(raw))
    f = one_error(folder(tmp_path, TEXT, MMPROJ), against=src, values=True)
    assert (f.code, f.tensor, f.shard) == ("AGAINST_VALUES", gguf_name, part.name)
