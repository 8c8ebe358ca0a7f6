"""Kimi-K2.5 as people run it with llama.cpp: the text model as a GGUF (`deepseek2`) and its vision tower as an
`mmproj-*.gguf` (`clip`, projector type `kimik25`), with the importance matrix llama-imatrix writes beside a
quant. tests/data/gguf_k25 was written by llama.cpp 0c1e5709's own converter from a tiny kimi_k25 checkpoint
(tests/writers/gguf_k25_generate.py; PROVENANCE.json pins the script, the tools and every file): the pair is one
audit (the projector a second reader of the same checks), the projector held to the text model's width as mtmd
holds it, the text GGUF held to its kimi_k25 source, and files that are not models named for what they are."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from kimi_audit import audit
from kimi_audit.errors import GgufSetError
from kimi_audit.findings import Severity
from kimi_audit.format.gguf import read_gguf_part
from kimi_audit.model.arch.kimi_k25 import projector_name
from kimi_audit.sources import LocalSource

DATA = Path(__file__).resolve().parent / "data" / "gguf_k25"
TEXT = DATA / "Kimi-K25-tiny-Q8_0.gguf"
MMPROJ = DATA / "mmproj-Kimi-K25-tiny-F16.gguf"
WIDE = DATA / "wide" / "mmproj-Kimi-K25-wide-F16.gguf"
IMATRIX = DATA / "imatrix.gguf"
SOURCE = DATA / "source"


def folder(tmp_path: Path, *files: Path, names: tuple[str, ...] = ()) -> Path:
    d = tmp_path / "gguf"
    d.mkdir(parents=True)
    for i, f in enumerate(files):
        shutil.copy(f, d / (names[i] if i < len(names) else f.name))
    return d


def errors(report: object) -> list[tuple[str, str | None]]:
    return [(f.code, f.tensor) for f in report.findings if f.severity is Severity.ERROR]  # type: ignore[attr-defined]


def test_provenance_pins_the_generator_and_every_file() -> None:
    prov = json.loads((DATA / "PROVENANCE.json").read_text())
    script = Path(__file__).resolve().parent / "writers" / "gguf_k25_generate.py"
    assert prov["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert prov["llama.cpp"]["commit"].startswith("0c1e5709")
    for name, digest in prov["files"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_the_converter_wrote_what_the_dialect_names() -> None:
    """Every tensor of the mmproj is the kimi_k25 module's name of a release tensor (no name guessed), and its
    metadata says what it is: clip, a vision encoder, projector type kimik25."""
    part = read_gguf_part(LocalSource(DATA), MMPROJ.name)
    kv = part.kv
    assert (kv["general.architecture"], kv["general.type"], kv["clip.projector_type"]) == ("clip", "mmproj", "kimik25")
    assert kv["clip.has_vision_encoder"] is True
    source = set(json.loads((SOURCE / "model.safetensors.index.json").read_text())["weight_map"])
    named = {projector_name(n) for n in source} - {None}
    assert set(part.header.columns.names) == named


def test_the_pair_audits_clean_as_one_model(tmp_path: Path) -> None:
    """The text GGUF and its mmproj in one folder: one audit, the projector's tensors laid out and checked
    (every one of the source's parameters is in the pair), no error."""
    alone = audit(folder(tmp_path / "a", TEXT))
    pair = audit(folder(tmp_path / "b", TEXT, MMPROJ))
    source = audit(SOURCE)
    assert errors(pair) == [] and errors(alone) == []
    assert pair.stats.parameters == source.stats.parameters > alone.stats.parameters
    assert MMPROJ.name in pair.checkpoint.headers  # type: ignore[union-attr]


def test_a_projector_of_another_width_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """The projector of a model whose text width is 128 beside this 64-wide one: mtmd refuses the pair
    (tools/mtmd/mtmd.cpp 603-608); one GGUF_PROJECTOR_WIDTH naming clip.vision.projection_dim, nothing else."""
    r = audit(folder(tmp_path, TEXT, WIDE))
    assert errors(r) == [("GGUF_PROJECTOR_WIDTH", "clip.vision.projection_dim")]
    f = next(f for f in r.findings if f.code == "GGUF_PROJECTOR_WIDTH")
    assert (f.expected, f.actual, f.shard) == (64, 128, WIDE.name)
    assert "deepseek2.embedding_length" in f.message and "mm.2.weight" in f.message


def test_a_projector_tensor_of_the_wrong_shape_is_found(tmp_path: Path) -> None:
    """The projector's tensors are held to the vision config its own keys imply: a block count its file
    contradicts leaves blocks missing."""
    d = folder(tmp_path, TEXT)
    data = bytearray(MMPROJ.read_bytes())
    key = b"clip.vision.block_count"
    at = data.index(key) + len(key) + 4  # the value type (u32), then the value
    assert data[at: at + 4] == (3).to_bytes(4, "little")
    data[at: at + 4] = (4).to_bytes(4, "little")
    (d / MMPROJ.name).write_bytes(bytes(data))
    missing = [t for c, t in errors(audit(d)) if c == "TENSOR_MISSING"]
    assert missing and all(str(t).startswith("v.blk.3.") for t in missing)


def test_against_a_kimi_k25_source_is_no_architecture_error(tmp_path: Path) -> None:
    """llama.cpp converts KimiK25ForConditionalGeneration's text model to deepseek2 (DeepseekV2Model's register
    list): the text GGUF, alone or with its projector, against the kimi_k25 checkpoint it came from: every
    tensor accounted for, the metadata the converter writes from text_config, no error."""
    for files in ((TEXT,), (TEXT, MMPROJ)):
        r = audit(folder(tmp_path / str(len(files)), *files), against=SOURCE)
        assert errors(r) == [], files
        assert not [f for f in r.findings if f.code == "AGAINST_ARCHITECTURE"]


def test_against_an_architecture_the_tool_does_not_describe(tmp_path: Path) -> None:
    """A source of an undescribed model_type: AGAINST_ARCHITECTURE says the tool does not know what llama.cpp
    converts it to, not that llama.cpp does not convert it."""
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg["text_config"], "model_type": "glm4_moe_lite",
                                                 "architectures": ["Glm4MoeLiteForCausalLM"]}))
    r = audit(folder(tmp_path, TEXT), against=src)
    f = next(f for f in r.findings if f.code == "AGAINST_ARCHITECTURE")
    assert "does not describe" in f.message and "does not convert" not in f.message


@pytest.mark.parametrize("name", ["imatrix.gguf", "calibration-data.gguf"])
def test_an_imatrix_beside_the_quant_is_named_and_the_quant_audited(tmp_path: Path, name: str) -> None:
    """llama-imatrix's output beside the quant (recognized by its metadata, whatever its name): one info, the
    quant audited, never '2 GGUF sets here: choose one'."""
    r = audit(folder(tmp_path, TEXT, IMATRIX, names=("Kimi-K25-tiny-Q8_0.gguf", name)))
    alone = audit(folder(tmp_path / "alone", TEXT))
    assert errors(r) == []
    info = [f for f in r.findings if f.code == "GGUF_NOT_A_MODEL"]
    assert len(info) == 1 and info[0].shard == name and "imatrix" in info[0].message
    assert r.stats.tensors == alone.stats.tensors


def test_all_three_beside_each_other(tmp_path: Path) -> None:
    """The quant, its projector and an imatrix: the pair audited, the imatrix named."""
    r = audit(folder(tmp_path, TEXT, MMPROJ, IMATRIX))
    assert errors(r) == [] and [f.shard for f in r.findings if f.code == "GGUF_NOT_A_MODEL"] == [IMATRIX.name]


@pytest.mark.parametrize("path", [MMPROJ, IMATRIX], ids=["mmproj", "imatrix"])
def test_a_file_that_is_not_a_model_alone_says_what_it_is(tmp_path: Path, path: Path) -> None:
    with pytest.raises(GgufSetError, match=r"no GGUF model file here: .*(projector|importance matrix)"):
        audit(folder(tmp_path, path))
