"""What tests/data/gptq and tests/data/awq (written by their writers in their own venvs, tests/writers/) are
compared with: the unquantized model their PROVENANCE.json's config describes, built by transformers here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kimi_audit


def unquantized_parameters(provenance: Path, out: Path) -> int:
    """The parameters of the generator's config, as transformers builds and saves the model unquantized."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = json.loads(provenance.read_text())["config"]
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg)).to(torch.bfloat16)
    model.save_pretrained(out)
    return kimi_audit.audit(out).stats.parameters


def check_provenance(data: Path, script: str) -> dict:
    """The generator's sha256 and every written file's, as PROVENANCE.json records them."""
    import hashlib

    prov = json.loads((data / "PROVENANCE.json").read_text())
    path = Path(__file__).resolve().parent / "writers" / script
    assert prov["script_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), "regenerate: the script changed"
    for name, digest in prov["files"].items():
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == digest, name
    return prov


def transformers_parameters(cfg: dict, arch: str = "DeepseekV3") -> int:
    """transformers' model of `cfg` (`arch`: DeepseekV3, GlmMoeDsa): its parameters plus the router biases it keeps
    as buffers (the writers' exports store them as parameters)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = getattr(transformers, f"{arch}ForCausalLM")(getattr(transformers, f"{arch}Config")(**cfg))
    params = sum(p.numel() for p in model.parameters())
    return params + sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))


def dequantized_as_the_writer(folder: Path) -> set[str]:
    """Every module of folder/dequantized.json (the writer's own dequantization, the sha256 of its bytes) is what its
    scheme's `dequantize` gives, byte for byte; returns the scheme names met."""
    import hashlib

    from kimi_audit.model.config import model_config_from_dict
    from kimi_audit.model.layout import expected_layout, scheme_of
    from kimi_audit.numerics.tensor_io import TensorFetcher
    from kimi_audit.sources import LocalSource

    want = json.loads((folder / "dequantized.json").read_text())
    cfg = model_config_from_dict(json.loads((folder / "config.json").read_text()))
    layout = expected_layout(cfg)
    fetch = TensorFetcher(LocalSource(folder))
    names = set()
    for module, digest in want.items():
        scheme = scheme_of(cfg, module)
        suffixes = [s.suffix for s in scheme.stored(1, 4096)]
        e = layout[module + suffixes[0]]
        out, inp = scheme.module_shape(e.shape, e.logical)  # type: ignore[misc]
        got = scheme.dequantize({s: fetch.read(module + s)[0] for s in suffixes}, out, inp)
        assert hashlib.sha256(got.tobytes()).hexdigest() == digest, (module, scheme.name)
        names.add(scheme.name)
    return names


def without(src: Path, dst: Path, name: str) -> Path:
    """A copy of the export `src` without tensor `name`: its shard written again as a writer would (header,
    payload), the index (if any) without the name."""
    import shutil
    import struct

    shutil.copytree(src, dst)
    index = dst / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"][name] if index.exists() else "model.safetensors"
    if index.exists():
        doc = json.loads(index.read_text())
        del doc["weight_map"][name]
        index.write_text(json.dumps(doc))
    path = dst / shard
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    del header[name]
    out, pos, parts = {}, 0, []
    for key, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        parts.append(data[b:end])
        out[key] = {**e, "data_offsets": [pos, pos + end - b]}
        pos += end - b
    if meta is not None:
        out["__metadata__"] = meta
    head = json.dumps(out).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(parts))
    return dst
