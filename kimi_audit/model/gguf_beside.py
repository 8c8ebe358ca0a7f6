"""The GGUF files beside a model that are not models: an importance matrix (llama-imatrix's output) is named for
what it is; a multimodal projector (an `mmproj-*.gguf`, `clip`) is the model's second reader.

One projector beside the model joins its audit: its `clip.*` keys held to the types clip.cpp reads them with, its
tensors to the vision tower its keys imply (the architecture's `GgufProjector`, found by `clip.projector_type`),
its header read like any part's; and the pair to what llama.cpp's mtmd requires of it: the projector's output
width (clip_n_mmproj_embd, its output tensor's rows) equal to the text model's embedding width, or mtmd refuses
the pair (tools/mtmd/mtmd.cpp lines 603-608: "mismatch between text model (n_embd = %d) and mmproj (n_embd =
%d)"). Several projectors beside one model are alternatives (F16, BF16, F32): each is paired, none is laid out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimi_audit.findings import Finding, error, info
from kimi_audit.format.columns import label
from kimi_audit.format.gguf import GgufPart
from kimi_audit.format.gguf_keys import LOADER_KEYS, mistyped
from kimi_audit.format.gguf_split import IMATRIX, NOT_MODELS, not_a_model
from kimi_audit.format.header import ShardHeader
from kimi_audit.model.arch.registry import gguf_projector
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.gguf import with_stored_types
from kimi_audit.model.layout import ExpectedLayout, expected_layout, payload_bytes
from kimi_audit.model.quant.gguf import GGML_ANY

PROJECTOR_TYPE = "clip.projector_type"
PROJECTION_DIM = "clip.vision.projection_dim"
EMBEDDING = "embedding_length"


def beside(others: Mapping[str, GgufPart], raw: Mapping[str, Any], cfg: ModelConfig, layout: ExpectedLayout,
           model_kv: Mapping[str, Any]) -> tuple[ExpectedLayout, dict[str, ShardHeader], list[Finding]]:
    """The layout with the one projector's tensors added, the projector's header, and what the files beside the
    model are and what is wrong with them."""
    findings: list[Finding] = []
    projectors = [n for n, p in others.items() if not_a_model(p.kv) != IMATRIX]
    for name, part in others.items():
        if not_a_model(part.kv) == IMATRIX:
            findings.append(info("GGUF_NOT_A_MODEL", f"{name}: {NOT_MODELS[IMATRIX]}, {part.header.tensor_count:,} "
                                 "tensors (*.in_sum2, *.counts): not a model, not audited as one", shard=name))
    headers: dict[str, ShardHeader] = {}
    for name in projectors:
        part = others[name]
        arch = gguf_projector(part.kv.get(PROJECTOR_TYPE))
        p = None if arch is None or arch.gguf is None else arch.gguf.projector
        if p is None:
            findings.append(info("GGUF_NOT_A_MODEL", f"{name}: {NOT_MODELS['mmproj']}, projector type "
                                 f"{part.kv.get(PROJECTOR_TYPE)!r}, which kimi-audit does not describe: its tensors "
                                 "are not checked", shard=name))
            continue
        wrong = mistyped(part.kv, part.types, {**LOADER_KEYS, **p.key_types})
        findings += [error("GGUF_KEY_TYPE", f"{name}: {label(key)} is stored as {have}, but clip.cpp reads it as "
                           f"{want}: mtmd stops at this key", tensor=key, shard=name, expected=want, actual=have)
                     for key, have, want in wrong]
        findings += _paired(name, part, p.output, model_kv)
        if len(projectors) > 1 or wrong or not cfg.layout_supported or not part.header.columns.names:
            continue
        headers[name] = part.header
        own = model_config_from_dict(p.config(part.kv, raw))
        layout = _joined(layout, _projector_layout(own, p.names, part.header))
    if len(projectors) > 1:
        findings.append(info("GGUF_NOT_A_MODEL", f"{len(projectors)} projectors beside the model ("
                             f"{', '.join(projectors[:3])}): each paired with it, none laid out; audit one with "
                             "--include to check its tensors", shard=projectors[0], covers=len(projectors)))
    return layout, headers, findings


def _paired(name: str, part: GgufPart, output: str, model_kv: Mapping[str, Any]) -> list[Finding]:
    """The projector's output width (its output tensor's rows, as clip_n_mmproj_embd reads them; else
    clip.vision.projection_dim) against the model's `ARCH.embedding_length`."""
    arch = model_kv.get("general.architecture")
    key = f"{arch}.{EMBEDDING}"
    text = model_kv.get(key)
    shapes = dict(zip(part.header.columns.names, part.header.columns.shapes))
    stored = shapes.get(output)
    width = stored[0] if stored else part.kv.get(PROJECTION_DIM)
    declared = part.kv.get(PROJECTION_DIM)
    if type(text) is not int or type(width) is not int:
        return []
    out: list[Finding] = []
    if width != text:
        out.append(error("GGUF_PROJECTOR_WIDTH", f"{name}: the projector writes {width:,}-wide embeddings "
                         f"({output}'s rows, {PROJECTION_DIM} {declared}), the model's {key} is {text:,}: llama.cpp's "
                         "mtmd refuses the pair (\"mismatch between text model and mmproj\"): the projector of "
                         "another model", tensor=PROJECTION_DIM, shard=name, expected=text, actual=width))
    elif type(declared) is int and declared != width:
        out.append(error("GGUF_PROJECTOR_WIDTH", f"{name}: {PROJECTION_DIM} is {declared:,}, {output} has {width:,} "
                         "rows: the file contradicts itself", tensor=PROJECTION_DIM, shard=name, expected=width,
                         actual=declared))
    return out


def _projector_layout(cfg: ModelConfig, names: Any, header: ShardHeader) -> ExpectedLayout:
    """The architecture's layout of the projector's config, only the tensors the projector holds, in its names;
    weights (two dimensions and more) in the ggml type stored where it is one a weight is kept in, the rest F32
    (the converter forces 1-D tensors to F32)."""
    full = expected_layout(cfg)
    keep = [(names(n), p) for p, n in enumerate(full.names) if names(n) is not None]
    specs: list[Any] = []
    made: dict[int, int] = {}
    spec_of = []
    for _, p in keep:
        s = full.spec_of[p]
        if s not in made:
            spec = full.specs[s]
            made[s] = len(specs)
            specs.append(spec._replace(dtype=GGML_ANY, nbytes=None) if len(spec.shape) > 1 else
                         spec._replace(dtype="F32", nbytes=payload_bytes("F32", spec.shape)))
        spec_of.append(made[s])
    layout = ExpectedLayout([str(n) for n, _ in keep], spec_of, specs, [None] * len(keep))
    return with_stored_types(layout, {header.shard: header})


def _joined(a: ExpectedLayout, b: ExpectedLayout) -> ExpectedLayout:
    n, k = len(a.names), len(a.specs)
    return ExpectedLayout(a.names + b.names, a.spec_of + [s + k for s in b.spec_of], a.specs + b.specs,
                          a.layer_of + b.layer_of, a.meta_at + [m + n for m in b.meta_at],
                          a.meta_owner + [m + n for m in b.meta_owner])
