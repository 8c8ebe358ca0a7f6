"""The GGUF files beside a model that are not models: an importance matrix (llama-imatrix's output) is named for
what it is; a multimodal projector (an `mmproj-*.gguf`, `clip`) is the model's second reader; a file whose header
does not parse is its GGUF_INVALID, not a second model to choose.

One projector beside the model joins its audit: its keys held to what tools/mtmd's clip.cpp reads and refuses
(every vision projector's: CLIP_KEY_TYPES, VISION_REQUIRED, CLIP_TYPES; its type's own: the architecture's
`GgufProjector`, found by `clip.projector_type`), each refusal naming the GGUF key; its tensors to the vision tower
its keys imply; its header read like any part's; and the pair to what llama.cpp's mtmd requires of it: the
projector's output width (clip_n_mmproj_embd, its output tensor's rows; clip.vision.projection_dim for a type not
described) equal to the text model's embedding width, or mtmd refuses the pair (tools/mtmd/mtmd.cpp lines 603-608:
"mismatch between text model (n_embd = %d) and mmproj (n_embd = %d)"). Several projectors beside one model are
alternatives (F16, BF16, F32): each is paired, none is laid out. A projector named as a split part of the model's
set is one GGUF_SPLIT_INVALID.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.findings import Finding, error, info, warning
from kimi_audit.format.columns import label
from kimi_audit.format.gguf import GgufPart
from kimi_audit.format.gguf_keys import ARRAY, F32, FLAG, FLOAT32, LOADER_KEYS, STR, U32, KeyType, mistyped
from kimi_audit.format.gguf_split import IMATRIX, MMPROJ, NOT_MODELS, not_a_model, part_number, set_key
from kimi_audit.format.header import ShardHeader
from kimi_audit.model.arch.registry import gguf_projector
from kimi_audit.model.arch.spec import GgufProjector
from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.gguf import with_stored_types
from kimi_audit.model.layout import ExpectedLayout, expected_layout, payload_bytes
from kimi_audit.model.quant.gguf import GGML_ANY

PROJECTOR_TYPE = "clip.projector_type"
VISION_PROJECTOR_TYPE = "clip.vision.projector_type"
HAS_VISION, HAS_AUDIO = "clip.has_vision_encoder", "clip.has_audio_encoder"
PROJECTION_DIM = "clip.vision.projection_dim"
BLOCK_COUNT = "clip.vision.block_count"
VISION_BLOCK = re.compile(r"v\.blk\.(\d+)\.")
"""clip.cpp's names of a vision block's tensors (TN_ATTN_QKV "%s.blk.%d.attn_qkv.%s", prefix `v`)."""
EMBEDDING = "embedding_length"
IMAGE_STATS = ("clip.vision.image_mean", "clip.vision.image_std")
INT32_MAX = 2**31 - 1

CLIP_TYPES = (
    "mlp", "mlp_norm", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ling3vl", "step3vl", "gemma3", "gemma3nv", "gemma3na", "gemma4v", "gemma4a", "gemma4uv", "gemma4ua", "phi4",
    "idefics3", "pixtral", "ultravox", "internvl", "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o", "voxtral",
    "meralion", "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm", "janus_pro", "dots_ocr",
    "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2", "deepseek4v", "lfm2a", "glm4v", "glm5v", "youtuvl",
    "yasa2", "kimik25", "nemotron_v2_vl", "exaone4_5", "hunyuanvl", "minicpmv4_6", "granite_speech", "mimovl",
    "minimax_m3", "granite4_vision", "mimo_audio", "parakeet", "qwen3tts_spkenc", "qwen3tts_gen", "pockettts_spkenc",
    "pockettts_gen", "muse-glimmer")
"""The projector types clip.cpp knows (llama.cpp 0c1e5709, tools/mtmd/clip-impl.h PROJECTOR_TYPE_NAMES); any other
it refuses: "unknown projector type" (clip.cpp lines 1284-1288)."""
VISION_REQUIRED: Mapping[str, KeyType] = {
    **{f"clip.vision.{k}": U32 for k in ("embedding_length", "attention.head_count", "feed_forward_length",
                                        "block_count", "projection_dim", "image_size", "patch_size")},
    "clip.vision.attention.layer_norm_epsilon": F32}
"""The keys clip_model_loader::load_hparams requires of every vision projector (clip.cpp lines 1305-1320: get_u32 /
get_f32 with `required` left true: "Key not found")."""
CLIP_KEY_TYPES: Mapping[str, KeyType] = {
    **VISION_REQUIRED, PROJECTOR_TYPE: STR, VISION_PROJECTOR_TYPE: STR, HAS_VISION: FLAG, HAS_AUDIO: FLAG,
    "clip.use_gelu": FLAG, "clip.use_silu": FLAG, "clip.vision.attention.head_dim": U32,
    "clip.vision.attention.head_count_kv": U32, **dict.fromkeys(IMAGE_STATS, ((ARRAY, FLOAT32),))}
"""Every vision projector's keys and the types clip.cpp reads them with (get_string / get_bool / get_u32 / get_f32
assert the stored type in gguf.cpp's gguf_get_val_*; get_arr_f32 refuses an array of another type, clip.cpp lines
3899-3912); a projector type's own keys are its GgufProjector's."""


def beside(others: Mapping[str, GgufPart], raw: Mapping[str, Any], cfg: ModelConfig, layout: ExpectedLayout,
           model_kv: Mapping[str, Any]) -> tuple[ExpectedLayout, dict[str, ShardHeader], list[Finding]]:
    """The layout with the one projector's tensors added, the projector's header, and what the files beside the
    model are and what is wrong with them."""
    findings: list[Finding] = []
    kinds = {n: not_a_model(p.kv, p.header.columns.names) if p.version else None for n, p in others.items()}
    for name, part in others.items():
        if not part.version:  # its header did not parse: its GGUF_INVALID, not a second model to choose
            findings += part.header.findings
        elif kinds[name] == IMATRIX:
            findings += _renamed(name, part, IMATRIX) or [info(
                "GGUF_NOT_A_MODEL", f"{name}: {NOT_MODELS[IMATRIX]}, {part.header.tensor_count:,} tensors "
                "(*.in_sum2, *.counts): not a model, not audited as one", shard=name)]
        findings += _misnamed(name, kinds[name])
    projectors = [n for n, k in kinds.items() if k == MMPROJ]
    headers: dict[str, ShardHeader] = {}
    for name in projectors:
        part = others[name]
        renamed = _renamed(name, part, MMPROJ)
        if renamed:  # no projector of this model's, whatever it holds: that one cause, no pairing
            findings += renamed
            continue
        arch = gguf_projector(part.kv.get(PROJECTOR_TYPE))
        p = None if arch is None or arch.gguf is None else arch.gguf.projector
        refused = _clip_findings(name, part, p)
        findings += refused
        findings += _paired(name, part, None if p is None else p.output, model_kv)
        if p is None:
            if not refused:
                findings.append(info("GGUF_NOT_A_MODEL", f"{name}: {NOT_MODELS[MMPROJ]}, projector type "
                                     f"{part.kv.get(PROJECTOR_TYPE)!r}, which kimi-audit does not describe: its "
                                     "tensors are not checked", shard=name))
            continue
        if len(projectors) > 1 or refused or not cfg.layout_supported or not part.header.columns.names:
            continue
        kv, miscounted = _block_count(name, part)
        findings += miscounted
        try:
            own = model_config_from_dict(p.config(kv, raw, _shapes(part)))
        except ConfigError as e:  # a value clip.cpp loads but no layout can be built for (a bound of this tool's)
            findings.append(error("GGUF_KEY_VALUE", f"{name}: its clip.vision.* keys imply no vision tower "
                                  f"kimi-audit lays out ({e}): its tensors are not checked", shard=name))
            continue
        headers[name] = part.header
        layout = _joined(layout, _projector_layout(own, p.names, part.header))
    if len(projectors) > 1:
        findings.append(info("GGUF_NOT_A_MODEL", f"{len(projectors)} projectors beside the model ("
                             f"{', '.join(projectors[:3])}): each paired with it, none laid out; audit one with "
                             "--include to check its tensors", shard=projectors[0], covers=len(projectors)))
    return layout, headers, findings


def _block_count(name: str, part: GgufPart) -> tuple[Mapping[str, Any], list[Finding]]:
    """The projector's keys with clip.vision.block_count as its tensors count the blocks (`v.blk.N.`, clip.cpp's
    names), and one CONFIG_DISAGREES where the key says otherwise: one cause, not each tensor of the blocks it
    adds or leaves out."""
    declared = part.kv.get(BLOCK_COUNT)
    numbers = [int(m.group(1)) for n in part.header.columns.names if (m := VISION_BLOCK.match(n))]
    stored = max(numbers, default=-1) + 1
    if not numbers or not isinstance(declared, int) or isinstance(declared, bool) or declared == stored:
        return part.kv, []
    per_block = numbers.count(stored - 1)  # the tensors of a block: the last one's
    covers = sum(1 for b in numbers if b >= declared) if declared < stored else per_block * (declared - stored)
    return {**part.kv, BLOCK_COUNT: stored}, [error(
        "CONFIG_DISAGREES", f"{name}: {BLOCK_COUNT} is {declared:,}, but its tensors are those of {stored:,} "
        f"blocks (v.blk.0 to v.blk.{stored - 1}): one cause, the key and the tensors disagree; the tensors are "
        f"checked as {stored:,} blocks", tensor=BLOCK_COUNT, shard=name, expected=declared, actual=stored,
        covers=covers)]


def _shapes(part: GgufPart) -> dict[str, tuple[int, ...]]:
    return dict(zip(part.header.columns.names, part.header.columns.shapes))


RENAME = {MMPROJ: "mtmd reads it with --mmproj; rename it mmproj-*.gguf",
          IMATRIX: "llama-quantize reads it with --imatrix; rename it imatrix*.gguf"}


NAMED = {MMPROJ: "mmproj", IMATRIX: "imatrix"}
"""The file names that say what a file beside the model is (llama.cpp's tools write `mmproj-*.gguf`,
`imatrix.gguf`)."""


def _misnamed(name: str, kind: str | None) -> list[Finding]:
    """A file whose name says a projector or an importance matrix and whose metadata says the other (mtmd refuses an
    imatrix passed as --mmproj; llama-quantize refuses a projector as --imatrix): a warning naming both."""
    said = next((k for k, word in NAMED.items() if name.lower().rsplit("/", 1)[-1].startswith(word)), None)
    if said is None or kind is None or said == kind or kind not in NAMED:
        return []
    return [warning("GGUF_MISNAMED", f"{name} is named as {NOT_MODELS[said]} but is {NOT_MODELS[kind]}: the tool "
                    "that reads one refuses the other; rename it", shard=name, expected=said, actual=kind)]


def _renamed(name: str, part: GgufPart, kind: str) -> list[Finding]:
    """A projector or an importance matrix named as a split part (`X-00002-of-00002.gguf` beside `X.gguf`): not a
    part of the set, whatever part 1 says (a set missing its part 2 is no set llama.cpp loads)."""
    numbered = part_number(name)
    if numbered is None:
        return []
    return [error("GGUF_SPLIT_INVALID", f"{name} is named part {numbered[0]} of {numbered[1]} of {set_key(name)}'s "
                  f"split set but is {NOT_MODELS[kind]}, with no split keys: not a part of this model's set "
                  f"(llama.cpp's loader never reads it as one; {RENAME[kind]})", shard=name,
                  expected="a part of the set", actual=kind)]


def _clip_findings(name: str, part: GgufPart, p: GgufProjector | None) -> list[Finding]:
    """What tools/mtmd refuses in a projector's keys before any tensor: a key of another type (GGUF_KEY_TYPE), an
    unknown projector type, no vision encoder, image statistics of fewer than 3 values, a value over INT32_MAX
    (GGUF_KEY_VALUE), a required key absent (GGUF_KEY_MISSING); each naming the key."""
    kv = part.kv
    table = {**LOADER_KEYS, **CLIP_KEY_TYPES, **({} if p is None else p.key_types)}
    wrong = mistyped(kv, part.types, table)
    out = [error("GGUF_KEY_TYPE", f"{name}: {label(key)} is stored as {have}, but clip.cpp reads it as {want}: mtmd "
                 "stops at this key", tensor=key, shard=name, expected=want, actual=have) for key, have, want in wrong]
    bad = {key for key, _, _ in wrong}

    def value(key: str, why: str, actual: Any) -> None:
        out.append(error("GGUF_KEY_VALUE", f"{name}: {label(key)} {why}", tensor=key, shard=name,
                         actual=actual if isinstance(actual, int | float | str | bool) else None))

    kind = kv.get(PROJECTOR_TYPE) or kv.get(VISION_PROJECTOR_TYPE)
    if not bad & {PROJECTOR_TYPE, VISION_PROJECTOR_TYPE} and kind not in CLIP_TYPES:
        if kind is None:
            out.append(error("GGUF_KEY_MISSING", f"{name}: no {PROJECTOR_TYPE}: clip.cpp refuses the file (\"unknown "
                             "projector type\", tools/mtmd/clip.cpp line 1288)", tensor=PROJECTOR_TYPE, shard=name))
        else:
            value(PROJECTOR_TYPE, f"is {label(str(kind))!r}, a projector type clip.cpp does not know: it refuses the "
                  "file (\"unknown projector type\", tools/mtmd/clip.cpp line 1288)", str(kind))
    if HAS_VISION not in bad and kv.get(HAS_VISION) is not True:
        if kv.get(HAS_AUDIO) is True:
            return out  # an audio projector: no vision keys to hold it to
        value(HAS_VISION, f"is {kv.get(HAS_VISION)!r}: no vision encoder (and no audio one), so mtmd loads "
              "nothing and refuses the file (\"Failed to load CLIP model\", tools/mtmd/mtmd.cpp line 586)",
              kv.get(HAS_VISION))
    absent = [k for k in VISION_REQUIRED if k not in kv]
    if absent:
        out.append(error("GGUF_KEY_MISSING", f"{name}: no {', '.join(label(k) for k in absent)}: clip.cpp requires "
                         "it of a vision projector (\"Key not found\", tools/mtmd/clip.cpp lines 1305-1320)",
                         tensor=absent[0], shard=name, covers=len(absent)))
    for key in IMAGE_STATS:
        stats = kv.get(key)
        count = getattr(stats, "count", None)
        if key not in bad and key not in kv:
            out.append(error("GGUF_KEY_MISSING", f"{name}: no {key}: clip.cpp needs the 3 values of RGB (\"image_mean/"
                             "image_std arrays must have at least 3 elements\", tools/mtmd/clip.cpp lines 1406-1410)",
                             tensor=key, shard=name))
        elif key not in bad and (count is None or count < 3):
            value(key, f"holds {'no array' if count is None else f'{count} values'}: clip.cpp needs the 3 of RGB "
                  "(\"image_mean/image_std arrays must have at least 3 elements\", tools/mtmd/clip.cpp lines "
                  "1406-1410)", count)
    for key, t in table.items():
        v = kv.get(key)
        if t == U32 and key not in bad and type(v) is int and v > INT32_MAX:
            value(key, f"is {v:,}, over INT32_MAX: clip.cpp refuses it (\"exceeds INT32_MAX\", get_u32)", v)
    if p is not None:
        out += [error("GGUF_KEY_VALUE", f"{name}: {label(key)} {why}", tensor=key, shard=name)
                for key, why in p.refuses(kv) if key not in bad]
    return out


def _paired(name: str, part: GgufPart, output: str | None, model_kv: Mapping[str, Any]) -> list[Finding]:
    """The projector's output width (its output tensor's rows, as clip_n_mmproj_embd reads them; else, for a type
    kimi-audit does not describe, clip.vision.projection_dim) against the model's `ARCH.embedding_length`."""
    arch = model_kv.get("general.architecture")
    key = f"{arch}.{EMBEDDING}"
    text = model_kv.get(key)
    stored = _shapes(part).get(output) if output is not None else None
    width = stored[0] if stored else part.kv.get(PROJECTION_DIM)
    declared = part.kv.get(PROJECTION_DIM)
    if type(text) is not int or type(width) is not int:
        return []
    out: list[Finding] = []
    source = f"{output}'s rows, {PROJECTION_DIM} {declared}" if stored else PROJECTION_DIM
    if width != text:
        out.append(error("GGUF_PROJECTOR_WIDTH", f"{name}: the projector writes {width:,}-wide embeddings "
                         f"({source}), the model's {key} is {text:,}: llama.cpp's "
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
