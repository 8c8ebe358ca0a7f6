"""KimiK25ForConditionalGeneration as data: Kimi-K2.5 (Jan 2026), K2.6 (Apr 2026) and K2.7-Code.

The text model is Kimi-K2's DeepseekV3 (model.arch.deepseek_v3, read from config.json's nested
`text_config`) under `language_model.`; beside it the MoonViT vision tower (`vision_tower.`: a patch
embedding, learned 2-D position embeddings, encoder blocks with a fused `wqkv`, LayerNorms with biases, a
GELU MLP) and the projector (`mm_projector.`: a LayerNorm, then two Linear layers over merged patches).

Names are the release's, which vLLM (model_executor/models/kimi_k25.py) and SGLang load: transformers
5.25's `conversion_mapping.py` ("kimi_k25") maps them onto its own modules on load (`vision_tower.encoder.blocks.N.wqkv`
-> `model.vision_tower.layers.N.attn.{q,k,v}_proj`, `norm0/norm1` -> `norm1/norm2`, `mlp.fc0/fc1` ->
`mlp.fc1/fc2`, `wo` -> `attn.proj`, `mm_projector.proj.0/2` -> `in_proj/out_proj`). Its `save_pretrained`
reverses those renames imperfectly: the TRANSFORMERS dialect below.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.format.gguf_keys import U32
from kimi_audit.model.arch import deepseek_v3
from kimi_audit.model.arch.deepseek_v3 import gguf as deepseek2
from kimi_audit.model.arch.renamed import RenamedReader
from kimi_audit.model.arch.spec import (
    DTYPE_KEYS,
    QUANT_KEYS,
    Architecture,
    Dialect,
    Factor,
    GgufProjector,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
    ReleaseReader,
    prefixed,
    register,
)
from kimi_audit.model.config_fields import ModelConfig, VisionConfig, layer_count, nested_text
from kimi_audit.model.kinds import GAIN
from kimi_audit.model.quant.scheme import ReleaseQuant

MODEL_TYPES = ("kimi_k25",)
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
    "pos_emb_height": 64, "pos_emb_width": 64, "merge_kernel_size": [2, 2],
}
"""Kimi_K25VisionConfig's defaults (transformers 5.25, models/kimi_k25/configuration_kimi_k25.py)."""
PROJECTION_HIDDEN_DEFAULT = 1152
"""Kimi_K25Config.projection_hidden_size's default (the same file)."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    """The nested `text_config` is a DeepseekV3 config (Kimi-K2's); its `quantization_config` may sit inside it
    or at the top (both are read; the top one wins), and so may the dtype."""
    text = {**nested_text(cfg, MODEL_TYPES[0]), "model_type": deepseek_v3.MODEL_TYPES[0]}
    parsed = deepseek_v3.read_family(text, deepseek_v3.REFERENCE_DEFAULTS, indexer=False, norm_f32=False,
                                     release=RELEASE)
    return replace(parsed, model_type=MODEL_TYPES[0], prefix=TEXT_PREFIX, vision=_vision(cfg))


def _vision(cfg: dict[str, Any]) -> VisionConfig:
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise ConfigError("config.json vision_config is not an object")
    v = {**VISION_DEFAULTS, **{k: raw[k] for k in VISION_DEFAULTS if k in raw}}
    for key in VISION_DEFAULTS:
        if key != "merge_kernel_size" and (type(v[key]) is not int or v[key] <= 0):
            raise ConfigError(f"config.json vision_config.{key} must be a positive integer, got {v[key]!r}")
        if key != "merge_kernel_size":
            layer_count(key, v[key])
    merge = v["merge_kernel_size"]
    if not (isinstance(merge, list) and len(merge) == 2 and all(type(m) is int and m > 0 for m in merge)):
        raise ConfigError(f"config.json vision_config.merge_kernel_size {merge!r} is not [rows, cols]")
    proj = cfg.get("projection_hidden_size", PROJECTION_HIDDEN_DEFAULT)
    if proj is None:
        proj = v["hidden_size"]
    if type(proj) is not int or proj <= 0:
        raise ConfigError(f"config.json projection_hidden_size must be a positive integer, got {proj!r}")
    return VisionConfig(v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"], v["patch_size"],
                        v["pos_emb_height"], v["pos_emb_width"], (merge[0], merge[1]), proj)


TEXT_PREFIX = "language_model."
RELEASE = ReleaseQuant(unprefixed=TEXT_PREFIX, unreached=(r"vision_tower\..*", r"mm_projector\..*"))
"""Kimi-K2.5's quantizer saw the text model alone. Its published `ignore` says `lm_head` for `language_model.lm_head`
(family.md, December 2026 update, 'Published totals'), so an exact name is read in both spellings; and its config
targets every `Linear` with no word of the vision tower or projector, which a public header dump of the release
lists in BF16 (`vision_tower.encoder.blocks.N.wqkv.weight`, `mm_projector.proj.0.weight` ...): those modules are
left unquantized whatever the config targets."""

TRANSFORMERS = Dialect(
    "transformers 5.x save_pretrained",
    (("language_model.model.layers.", "language_model.model.blocks."),
     ("vision_tower.patch_embed.proj.", "vision_tower.encoder.patch_embed.proj."),
     ("mm_projector.pre_norm.", "model.mm_projector.pre_norm.")),
    "what transformers 5.25 writes when it re-saves a kimi_k25 model: its checkpoint conversion's renames "
    "(`blocks` -> `layers`, `vision_tower.encoder` -> `model.vision_tower`, `mm_projector` -> "
    "`model.mm_projector`) reversed onto names they never came from")


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    return (TRANSFORMERS,)


VISION_KEYS = ("vision_config", "torch_dtype")


def describe(cfg: ModelConfig) -> ModelTree:
    """The text model's tree under `language_model.`, the vision tower and projector after it."""
    text = deepseek_v3.describe(cfg)
    assert cfg.vision is not None
    after = (*(prefixed(n, TEXT_PREFIX) for n in text.after), vision_tower(cfg, cfg.vision), projector(cfg, cfg.vision))
    return ModelTree(tuple(prefixed(n, TEXT_PREFIX) for n in text.before), text.blocks, after)


def _f(value: int, label: str, key: str) -> Factor:
    return Factor(value, label, (key,))


def layer_norm(key: str, title: str, role: str, component: str, width: Factor, dtype: str) -> Leaf:
    return Leaf(key, component.rpartition(".")[2] or key, title, role,
                (Param("Learned gain", f"{component}.weight", (width,), dtype),
                 Param("Bias", f"{component}.bias", (width,), dtype)), VISION_KEYS)


def vision_tower(cfg: ModelConfig, v: VisionConfig) -> Group:
    """MoonViT (Kimi_K25VisionModel): names as the release stores them."""
    d = _f(v.hidden_size, "vision width", "vision_config.hidden_size")
    inter = _f(v.intermediate_size, "vision MLP width", "vision_config.intermediate_size")
    three_d = Factor(3 * v.hidden_size, "q, k, v", ("vision_config.hidden_size",), f"(3 × {v.hidden_size:,})")
    p = _f(v.patch_size, "patch", "vision_config.patch_size")
    rgb = Factor(3, "RGB", ())
    keys = (*VISION_KEYS, DTYPE_KEYS)
    enc = "vision_tower.encoder.blocks."
    block = Group("blocks", "Vision encoder blocks", (
        layer_norm("norm0", "Pre-attention LayerNorm", "vision_norm", enc + "norm0", d, cfg.dtype),
        Leaf("wqkv", "wqkv", "Fused query/key/value projection", "vision_wqkv",
             (Linear(enc + "wqkv", (three_d,), (d,), bias=True),), keys),
        Leaf("wo", "wo", "Attention output projection", "vision_wo",
             (Linear(enc + "wo", (d,), (d,), bias=True),), keys),
        layer_norm("norm1", "Pre-MLP LayerNorm", "vision_norm", enc + "norm1", d, cfg.dtype),
        Leaf("fc0", "mlp.fc0", "MLP up-projection", "vision_fc0",
             (Linear(enc + "mlp.fc0", (inter,), (d,), bias=True),), keys),
        Leaf("fc1", "mlp.fc1", "MLP down-projection", "vision_fc1",
             (Linear(enc + "mlp.fc1", (d,), (inter,), bias=True),), keys),
    ), repeat=_f(v.num_hidden_layers, "vision blocks", "vision_config.num_hidden_layers"), index_at="blocks.",
        role="vision_blocks")
    patch: tuple[Node, ...] = (
        Leaf("patch_embed", "patch_embed.proj", "Patch embedding (Conv2d)", "vision_patch_embed",
             (Param("Kernel", "vision_tower.patch_embed.proj.weight", (d, rgb, p, p), cfg.dtype),
              Param("Bias", "vision_tower.patch_embed.proj.bias", (d,), cfg.dtype)), VISION_KEYS),
        Leaf("pos_emb", "patch_embed.pos_emb", "Learned 2-D position embedding", "vision_pos_emb",
             (Param("Table", "vision_tower.patch_embed.pos_emb.weight",
                    (_f(v.pos_emb_height, "rows", "vision_config.pos_emb_height"),
                     _f(v.pos_emb_width, "columns", "vision_config.pos_emb_width"), d), cfg.dtype),), VISION_KEYS),
    )
    return Group("vision_tower", "Vision tower (MoonViT)", (
        *patch, block,
        layer_norm("final_layernorm", "Final LayerNorm", "vision_norm", "vision_tower.encoder.final_layernorm", d,
                   cfg.dtype)), role="vision_tower")


def projector(cfg: ModelConfig, v: VisionConfig) -> Group:
    """Kimi_K25MultimodalProjection: LayerNorm over each patch, then in/out projections over merged patches."""
    ph = _f(v.projection_hidden_size, "projector width", "projection_hidden_size")
    merged = Factor(v.merged_size, "merged patches", ("projection_hidden_size", "vision_config.merge_kernel_size"),
                    f"({v.projection_hidden_size:,} × {v.merge_kernel[0]} × {v.merge_kernel[1]})")
    h = _f(cfg.hidden_size, "hidden", "text_config.hidden_size")
    keys = ("projection_hidden_size", "torch_dtype", QUANT_KEYS)
    return Group("mm_projector", "Multimodal projector", (
        layer_norm("pre_norm", "Projector LayerNorm", "vision_norm", "mm_projector.pre_norm", ph, cfg.dtype),
        Leaf("proj_0", "proj.0", "Projector in-projection", "projector_in",
             (Linear("mm_projector.proj.0", (merged,), (merged,), bias=True),), keys),
        Leaf("proj_2", "proj.2", "Projector out-projection", "projector_out",
             (Linear("mm_projector.proj.2", (h,), (merged,), bias=True),), keys),
    ), role="mm_projector")


def _text(name: str) -> str | None:
    return name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else None


PROJECTOR_NAMES = (
    ("vision_tower.patch_embed.proj.", "v.patch_embd."), ("vision_tower.patch_embed.pos_emb.", "v.position_embd."),
    ("vision_tower.encoder.final_layernorm.", "v.post_ln."), ("mm_projector.pre_norm.", "mm.input_norm."),
    ("mm_projector.proj.0.", "mm.1."), ("mm_projector.proj.2.", "mm.2."))
BLOCK_NAMES = (("norm0.", "ln1."), ("wqkv.", "attn_qkv."), ("wo.", "attn_out."), ("norm1.", "ln2."),
               ("mlp.fc0.", "ffn_up."), ("mlp.fc1.", "ffn_down."))
"""The release's vision and projector names -> the mmproj file's, as KimiK25Model (llama.cpp 0c1e5709
conversion/kimivl.py) renames `proj.0/2` to `proj.linear_1/2` and gguf-py's tensor_mapping.py maps them
(MODEL_ARCH.MMPROJ: `v.blk.N.*`, `mm.input_norm`, `mm.1`, `mm.2`; tests/test_gguf_k25.py holds them to the
converter's own output). The wqkv rows are permuted for 2-D RoPE, not renamed."""


def projector_name(name: str) -> str | None:
    for release, gguf in PROJECTOR_NAMES:
        if name.startswith(release):
            return gguf + name[len(release):]
    blocks = "vision_tower.encoder.blocks."
    if name.startswith(blocks):
        number, _, rest = name[len(blocks):].partition(".")
        for release, gguf in BLOCK_NAMES:
            if rest.startswith(release):
                return f"v.blk.{number}.{gguf}{rest[len(release):]}"
    return None


POS_EMB = "v.position_embd.weight"


def projector_config(kv: Mapping[str, Any], text: Mapping[str, Any],
                     stored: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The kimi_k25 config.json an mmproj file's `clip.vision.*` keys imply (clip.cpp reads the same keys), beside
    the paired text model's; the text width the projector's own `clip.vision.projection_dim` (MmprojModel writes
    the text model's hidden_size there), `projection_hidden_size` the tower's width (mm.input_norm's). The
    position table's rows and columns are `vision.pos_emb_height/width` (KimiK25Model.set_gguf_parameters writes
    them), which clip.cpp never reads: it takes them from the table (tools/mtmd/models/kimik25.cpp
    resize_position_embeddings_3d), and so does this where a key is not a positive UINT32."""
    v = "clip.vision."
    merge = kv.get(v + "projector.scale_factor", 2)
    width = kv.get(v + "embedding_length")
    table = stored.get(POS_EMB, ())
    pos = [kv.get(f"vision.pos_emb_{k}") for k in ("height", "width")]
    pos = [p if type(p) is int and p > 0 else (table[i] if len(table) == 3 else 64) for i, p in enumerate(pos)]
    vision = {"hidden_size": width, "intermediate_size": kv.get(v + "feed_forward_length"),
              "num_hidden_layers": kv.get(v + "block_count"), "patch_size": kv.get(v + "patch_size"),
              "pos_emb_height": pos[0], "pos_emb_width": pos[1], "merge_kernel_size": [merge, merge]}
    hidden = kv.get(v + "projection_dim", text.get("hidden_size"))
    return {"model_type": MODEL_TYPES[0], "text_config": {**text, "hidden_size": hidden},
            "vision_config": vision, "projection_hidden_size": width}


SCALE_FACTOR = "clip.vision.projector.scale_factor"


def projector_refuses(kv: Mapping[str, Any]) -> list[tuple[str, str]]:
    """kimik25's merge factor: clip.cpp reads it optionally (load_hparams, line 1595) and its graph asserts it over 1
    (build_patch_merge_permute, line 902: GGML_ASSERT(scale_factor > 1))."""
    merge = kv.get(SCALE_FACTOR, 2)
    if type(merge) is int and merge <= 1:
        return [(SCALE_FACTOR, f"is {merge}: clip.cpp's kimik25 graph asserts the patch merge factor is over 1 "
                 "(build_patch_merge_permute, tools/mtmd/clip.cpp line 902) and aborts")]
    return []


RELEASE_OF = {gguf: release for release, gguf in PROJECTOR_NAMES}
BLOCK_OF = {gguf: release for release, gguf in BLOCK_NAMES}


def release_name(gguf_name: str) -> str | None:
    """projector_name's inverse: the release tensor an mmproj tensor is written from."""
    for gguf, release in RELEASE_OF.items():
        if gguf_name.startswith(gguf):
            return release + gguf_name[len(gguf):]
    if gguf_name.startswith("v.blk."):
        number, _, rest = gguf_name[len("v.blk."):].partition(".")
        for gguf, release in BLOCK_OF.items():
            if rest.startswith(gguf) and number.isdigit():
                return f"vision_tower.encoder.blocks.{number}.{release}{rest[len(gguf):]}"
    return None


def projector_values(gguf_name: str, read: ReleaseReader,
                     cfg: Mapping[str, Any]) -> tuple[tuple[int, ...], Iterator[Any]] | str | None:
    """The values KimiK25Model (llama.cpp 0c1e5709 conversion/kimivl.py, modify_tensors lines 121-156) writes into
    an mmproj tensor: the release's tensor as it is, but `wqkv` (weight and bias), whose query and key thirds are
    permuted per head from interleaved to split 2-D RoPE (`permute`: each head's rows as (head_dim/4, 2, 2),
    the first two axes swapped), with n_head `vision_config.num_attention_heads` (16 where absent, as there)."""
    name = release_name(gguf_name)
    if name is None:
        return None
    shape = read.shape(name)
    if ".wqkv." not in name:
        return shape, read.bands(name)
    vision = cfg.get("vision_config")
    heads = vision.get("num_attention_heads", 16) if isinstance(vision, dict) else 16
    qkv = shape[0] // 3 if shape else 0
    if type(heads) is not int or heads <= 0 or shape[0] % 3 or qkv % heads or (qkv // heads) % 4:
        return (f"{name} has {shape[0] if shape else 0} rows: not 3 x {heads} heads of a multiple of 4 rows, which "
                "the converter's 2-D RoPE permutation needs (it fails on it)")
    return shape, _permuted(read, name, heads, qkv)


def _permuted(read: ReleaseReader, name: str, heads: int, qkv: int) -> Iterator[Any]:
    head = qkv // heads
    for h in range(2 * heads):  # the query's heads, then the key's
        rows = read.rows(name, h * head, (h + 1) * head)
        split = rows.reshape(head // 4, 2, 2, *rows.shape[1:]).swapaxes(0, 1)
        yield split.reshape(rows.shape)
    yield read.rows(name, 2 * qkv, 3 * qkv)


PROJECTOR = GgufProjector(("kimik25",), projector_config, projector_name, "mm.2.weight", key_types={
    **{f"clip.vision.{k}": U32 for k in ("projector.scale_factor", "image_min_pixels", "image_max_pixels")}},
    refuses=projector_refuses, release_values=projector_values)
"""Kimi-K2.5's mmproj (projector type `kimik25`): the keys clip.cpp's kimik25 branch reads with get_u32
(tools/mtmd/clip.cpp, llama.cpp 0c1e5709, clip_model_loader load_hparams, lines 1592-1600) beyond every vision
projector's (model.gguf_beside)."""


def _converted(name: str, layers: int, stored: Container[str]) -> tuple[str, ...]:
    """The text model's tensors as deepseek2's converter writes them (DeepseekV2Model strips `language_model.`:
    conversion/base.py ModelBase.modify_tensors); the vision tower's into the mmproj file where one is read beside
    it, else nowhere in this GGUF."""
    text = _text(name)
    if text is not None:
        return deepseek2.GGUF_DIALECT.converted(text, layers, stored)
    mmproj = projector_name(name)
    return (mmproj,) if mmproj is not None and mmproj in stored else ()


def _release_values(gguf_name: str, read: ReleaseReader, experts: int, heads: int, nope: int) -> Any:
    text = RenamedReader(read, TEXT_PREFIX.__add__)
    return deepseek2.GGUF_DIALECT.release_values(gguf_name, text, experts, heads, nope)


GGUF = replace(
    deepseek2.GGUF_DIALECT, text_of=deepseek_v3.MODEL_TYPES[0], projector=PROJECTOR, converted=_converted,
    release_values=_release_values,
    metadata=lambda cfg: deepseek2.GGUF_DIALECT.metadata(nested_text(dict(cfg), MODEL_TYPES[0])))
"""llama.cpp converts KimiK25ForConditionalGeneration twice (conversion/__init__.py: "deepseek" and "kimivl"): its
text model as `deepseek2` (DeepseekV2Model's register list), which deepseek_v3's dialect reads back, and its
vision tower as an mmproj file (KimiK25Model, `--mmproj`): PROJECTOR."""


PROJECTOR_GAINS = ((".ln1.weight", GAIN), (".ln2.weight", GAIN), ("v.post_ln.weight", GAIN))
"""The mmproj's LayerNorm gains under names without `norm.weight` (`ln1`, `ln2`, `v.post_ln`): read by
`audit --values` as the model's gains are."""


ARCHITECTURE = register(Architecture(
    name="Kimi-K2.5", model_types=MODEL_TYPES, read=read, describe=describe, dialects=dialects,
    class_names=("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration"), nests_text=True,
    float32_routers=deepseek_v3.ROUTER_FP32, buffered=deepseek_v3.ARCHITECTURE.buffered,
    value_roles=(*deepseek_v3.ARCHITECTURE.value_roles, *PROJECTOR_GAINS), quant=RELEASE, gguf=GGUF))
