"""Pixtral's vision tower and its projector, the one description both of Mistral's multimodal releases read, in the
two spellings they are published in (`Spelling`):

- NATIVE, Mistral's own names (Mistral Large 4, `mistral_large4`): `vision_encoder.{patch_conv, ln_pre}`,
  `vision_encoder.transformer.layers.N.{attention_norm, attention.w{q,k,v,o}, ffn_norm, feed_forward.w{1,2,3}}`;
  the projector `pre_mm_projector_norm`, `patch_merger.merging_layer`, `vision_language_adapter.w_{in,out}`.
- TRANSFORMERS, the names of transformers' PixtralVisionModel and Mistral3MultiModalProjector (Mistral Small 4, the
  `mistral3` wrapper): `vision_tower.{patch_conv, ln_pre}`, `vision_tower.transformer.layers.N.{attention_norm,
  attention.{q,k,v,o}_proj, ffn_norm, feed_forward.{gate,down,up}_proj}`; `multi_modal_projector.{norm,
  patch_merger.merging_layer, linear_1, linear_2}`. vLLM reads these
  (vllm-project/vllm@0004c540861d3e59a7c1b3860f594aa8b24293db `models/pixtral.py`, PixtralHFVisionModel;
  @02677fd9d49b6b4b3082967642a0d1ff45c36c0a `models/mistral3.py`, Mistral3MultiModalProjector).

The patch convolution has no bias; the gains are RMSNorms; the projector's two Linear layers carry biases only with
`multimodal_projector_bias`; `linear_1` reads every feature layer `vision_feature_layer` lists.

llama.cpp's `--mmproj` converter writes the NATIVE tower as a `clip` file of projector type `pixtral` (MMPROJ_TOP,
MMPROJ_BLOCK: `v.blk.N.*`, `mm.*`), beside it the [IMG_BREAK] row of the token embedding (IMG_BREAK); the key clip.cpp
reads for it, the values the converter writes and what mtmd refuses are below, model.arch.mistral4's GgufProjector
reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.format.gguf_keys import U32
from kimi_audit.model.arch.mistral_params import PRE_NORM, PROJECTOR_ID
from kimi_audit.model.arch.spec import Factor, Group, Leaf, Linear, Param, ReleaseReader
from kimi_audit.model.config_fields import ModelConfig, read_int

GAIN = "Learned gain"
DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                            "num_channels": 3, "patch_size": 16}
"""PixtralVisionConfig's defaults (transformers 5.25), for keys a vision_config leaves out."""


@dataclass(frozen=True)
class Spelling:
    tower: str
    attention: tuple[str, str, str, str]
    """query, key, value, output projections under `attention.`"""
    mlp: tuple[str, str, str]
    """gate, down, up projections under `feed_forward.`"""
    norm: str
    merger: str
    adapter: tuple[str, str]


NATIVE = Spelling("vision_encoder.", ("wq", "wk", "wv", "wo"), ("w1", "w2", "w3"), "pre_mm_projector_norm",
                  "patch_merger.merging_layer", ("vision_language_adapter.w_in", "vision_language_adapter.w_out"))
TRANSFORMERS = Spelling("vision_tower.", ("q_proj", "k_proj", "v_proj", "o_proj"),
                        ("gate_proj", "down_proj", "up_proj"), "multi_modal_projector.norm",
                        "multi_modal_projector.patch_merger.merging_layer",
                        ("multi_modal_projector.linear_1", "multi_modal_projector.linear_2"))


WRAPPER = "multi_modal_projector."


def read_dims(cfg: dict[str, Any], absent: dict[str, Any]) -> dict[str, int]:
    """The vision sub-config's dims (`absent`: the wrapper's own vision defaults, where config.json has no
    vision_config), the patch merge, the projector's bias and how many feature layers it concatenates."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError("config.json vision_config is not an object")
    defaults = DEFAULTS if raw is not None else absent
    try:
        dims = {f"vision_{k}": read_int(raw or {}, k, defaults) for k in defaults}
    except ConfigError as e:  # the key is vision_config's, not the text model's of the same name
        raise ConfigError(str(e).replace("config.json '", "config.json 'vision_config.", 1)) from None
    dims["vision_merge"] = read_int(cfg, "spatial_merge_size", {"spatial_merge_size": 2})
    bias = cfg.get("multimodal_projector_bias", False)
    if not isinstance(bias, bool):
        raise ConfigError(f"config.json multimodal_projector_bias must be true or false, got {bias!r}")
    dims["projector_bias"] = int(bias)
    layers = cfg.get("vision_feature_layer", -1)
    if isinstance(layers, list) and layers and all(type(i) is int for i in layers):
        dims["vision_feature_layers"] = len(layers)
    elif type(layers) is int:
        dims["vision_feature_layers"] = 1
    else:
        raise ConfigError(f"config.json vision_feature_layer must be a layer index or a list of them, got {layers!r}")
    if cfg.get(IMG_BREAK) is True:
        dims["vision_img_break"] = 1
    norm, merger = cfg.get(PRE_NORM, True), cfg.get(PROJECTOR_ID, "patch_merge")
    if not isinstance(norm, bool) or not isinstance(merger, str):
        raise ConfigError(f"params.json vision_encoder.{PRE_NORM} must be true or false and {PROJECTOR_ID} a string, "
                          f"got {norm!r} and {merger!r}")
    dims["vision_pre_norm"], dims["vision_patch_merge"] = int(norm), int(merger == "patch_merge")
    keys = {"vision_merge": "spatial_merge_size", "vision_feature_layers": "vision_feature_layer"}
    for k, v in dims.items():
        if v < 1 and k not in ("projector_bias", "vision_pre_norm", "vision_patch_merge"):
            raise ConfigError(f"config.json {keys.get(k, k.replace('vision_', 'vision_config.'))} must be positive, "
                              f"got {v}")
    return dims


def _v(cfg: ModelConfig, key: str, label: str) -> Factor:
    return Factor(cfg.dim(f"vision_{key}"), label, (f"vision_config.{key}",))


def _gain(cfg: ModelConfig, key: str, title: str, component: str, width: Factor) -> Leaf:
    return Leaf(key, component.removesuffix(".weight"), title, "pixtral_norm",
                (Param(GAIN, component, (width,), cfg.dtype),), ("vision_config",))


def tower(cfg: ModelConfig, s: Spelling) -> Group:
    d, inter = _v(cfg, "hidden_size", "vision width"), _v(cfg, "intermediate_size", "vision MLP width")
    p, ch = _v(cfg, "patch_size", "patch"), _v(cfg, "num_channels", "channels")
    at = f"{s.tower}transformer.layers."
    keys = ("vision_config", "dtype")
    q, k, v, o = s.attention
    gate, down, up = s.mlp
    attention = ((q, "wq", "query"), (k, "wk", "key"), (v, "wv", "value"), (o, "wo", "output"))
    mlp = ((gate, "w1", "MLP gate projection", inter, d), (down, "w2", "MLP down projection", d, inter),
           (up, "w3", "MLP up projection", inter, d))
    block = Group("layers", "Vision transformer blocks", (
        _gain(cfg, "attention_norm", "Pre-attention RMSNorm", f"{at}attention_norm.weight", d),
        *(Leaf(n, n, f"Attention {t} projection", f"pixtral_{r}", (Linear(f"{at}attention.{n}", (d,), (d,)),), keys)
          for n, r, t in attention),
        _gain(cfg, "ffn_norm", "Pre-MLP RMSNorm", f"{at}ffn_norm.weight", d),
        *(Leaf(n, n, t, f"pixtral_{r}", (Linear(f"{at}feed_forward.{n}", (out,), (inp,)),), keys)
          for n, r, t, out, inp in mlp)),
        repeat=_v(cfg, "num_hidden_layers", "vision blocks"), index_at="layers.", role="vision_blocks")
    return Group(s.tower.rstrip("."), "Vision tower (Pixtral)", (
        Leaf("patch_conv", "patch_conv", "Patch embedding (Conv2d)", "pixtral_patch_conv",
             (Param("Kernel", f"{s.tower}patch_conv.weight", (d, ch, p, p), cfg.dtype),), ("vision_config",)),
        _gain(cfg, "ln_pre", "Pre-transformer RMSNorm", f"{s.tower}ln_pre.weight", d),
        block), role="vision_tower")


def projector(cfg: ModelConfig, s: Spelling) -> Group:
    d, h = _v(cfg, "hidden_size", "vision width"), Factor(cfg.hidden_size, "hidden", ("hidden_size",))
    m, width, n = cfg.dim("vision_merge"), cfg.dim("vision_hidden_size"), cfg.dim("vision_feature_layers")
    merged = Factor(width * m * m, "vision width × merged patches", ("vision_config.hidden_size", "spatial_merge_size"),
                    f"({width:,} × {m} × {m})")
    features = d if n == 1 else Factor(width * n, "vision width × feature layers",
                                       ("vision_config.hidden_size", "vision_feature_layer"), f"({width:,} × {n})")
    bias = bool(cfg.dim("projector_bias"))
    keys = ("multimodal_projector_bias", "dtype")
    w_in, w_out = s.adapter
    return Group("projector", "Multimodal projector", (
        *((_gain(cfg, s.norm.rpartition(".")[2], "Projector RMSNorm", f"{s.norm}.weight", d),)
          if cfg.dim("vision_pre_norm") else ()),
        *((Leaf("merging_layer", "patch_merger.merging_layer", "Patch merger", "pixtral_merge",
                (Linear(s.merger, (d,), (merged,)),), ("spatial_merge_size", "dtype")),)
          if cfg.dim("vision_patch_merge") else ()),
        Leaf(w_in.rpartition(".")[2], w_in.removeprefix(WRAPPER), "Projector in-projection", "pixtral_projector_in",
             (Linear(w_in, (h,), (features,), bias),), keys),
        Leaf(w_out.rpartition(".")[2], w_out.removeprefix(WRAPPER), "Projector out-projection", "pixtral_projector_out",
             (Linear(w_out, (h,), (h,), bias),), keys),
        *((img_break(cfg),) if "vision_img_break" in dict(cfg.dims) else ())), role="mm_projector")


# --- the tower as llama.cpp's `--mmproj` converter writes it (projector type `pixtral`) ---------------------------

IMG_BREAK, IMG_BREAK_GGUF = "img_break_embedding", "v.token_embd.img_break"
"""The row of the text model's token embedding an mmproj holds as its own tensor (`v.token_embd.img_break`): a
config key only an mmproj's config sets (the release holds that row inside `tok_embeddings`), which adds it to the
projector's tree."""
MMPROJ_TOP = (("vision_encoder.patch_conv.", "v.patch_embd."), ("vision_encoder.ln_pre.", "v.pre_ln."),
              ("pre_mm_projector_norm.", "mm.input_norm."), ("patch_merger.merging_layer.", "mm.patch_merger."),
              ("vision_language_adapter.w_in.", "mm.1."), ("vision_language_adapter.w_out.", "mm.2."),
              (f"{IMG_BREAK}.weight", IMG_BREAK_GGUF))
MMPROJ_BLOCK = (("attention_norm.", "ln1."), ("attention.wq.", "attn_q."), ("attention.wk.", "attn_k."),
                ("attention.wv.", "attn_v."), ("attention.wo.", "attn_out."), ("ffn_norm.", "ln2."),
                ("feed_forward.w1.", "ffn_gate."), ("feed_forward.w2.", "ffn_down."), ("feed_forward.w3.", "ffn_up."))
"""Mistral's native names (NATIVE) -> the mmproj file's, as PixtralModel (llama.cpp 0c1e5709 conversion/pixtral.py:
`vision_language_adapter.w_in/w_out` -> `mm.1/mm.2`) and gguf-py's tensor_mapping.py (MODEL_ARCH.MMPROJ: the
`# pixtral` and `# mistral` entries, `v.blk.N.*`) write them; tests/test_mistral_gguf.py holds them to gguf-py's
TensorNameMap and to the converter's own output."""
BLOCKS = f"{NATIVE.tower}transformer.layers."


def mmproj_name(name: str) -> str | None:
    """A release tensor's (NATIVE) name in the mmproj file; None for a tensor the projector does not hold."""
    for release, gguf in MMPROJ_TOP:
        if name.startswith(release):
            return gguf + name[len(release):]
    if name.startswith(BLOCKS):
        number, _, rest = name[len(BLOCKS):].partition(".")
        for release, gguf in MMPROJ_BLOCK:
            if rest.startswith(release) and number.isdigit():
                return f"v.blk.{number}.{gguf}{rest[len(release):]}"
    return None


def release_name(gguf_name: str) -> str | None:
    """mmproj_name's inverse: the release tensor an mmproj tensor is written from (the [IMG_BREAK] row: IMG_BREAK)."""
    for release, gguf in MMPROJ_TOP:
        if gguf_name.startswith(gguf):
            return release + gguf_name[len(gguf):]
    if gguf_name.startswith("v.blk."):
        number, _, rest = gguf_name[len("v.blk."):].partition(".")
        for release, gguf in MMPROJ_BLOCK:
            if rest.startswith(gguf) and number.isdigit():
                return f"{BLOCKS}{number}.{release}{rest[len(gguf):]}"
    return None


def img_break(cfg: ModelConfig) -> Leaf:
    """The [IMG_BREAK] token's embedding, a row of the text model's token embedding the mmproj holds alone."""
    h = Factor(cfg.hidden_size, "hidden", ("hidden_size",))
    return Leaf("img_break", IMG_BREAK, "[IMG_BREAK] token embedding (a row of the token embedding)",
                "pixtral_img_break", (Param("Embedding row", f"{IMG_BREAK}.weight", (h,), cfg.dtype),),
                ("image_break_token_id",))


SPATIAL_MERGE = "clip.vision.spatial_merge_size"
KEY_TYPES = {SPATIAL_MERGE: U32}
"""The key clip.cpp's pixtral branch reads beyond every vision projector's (tools/mtmd/clip.cpp, llama.cpp 0c1e5709,
clip_model_loader load_hparams lines 1534-1543: get_u32(KEY_SPATIAL_MERGE_SIZE, n_merge, false), n_merge 1 where
absent; the rope base it sets to 10000 itself, `clip.rope.freq_base` is never read)."""
BREAK_ID = "image_break_token_id"
"""The params.json `vision_encoder` key the converter reads the [IMG_BREAK] row's index from (conversion/llava.py
LlavaVisionModel.__init__, find_vparam; a negative placeholder resolved from the tokenizer's special tokens)."""


def refuses(kv: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A merge size of 0: clip.cpp divides the image's patches by it (clip_n_output_tokens, line 4266) and the
    pixtral graph asserts it over 0 where a patch merger is stored (tools/mtmd/models/pixtral.cpp)."""
    merge = kv.get(SPATIAL_MERGE, 1)
    if type(merge) is int and merge < 1:
        return [(SPATIAL_MERGE, f"is {merge}: clip.cpp divides the image's patches by it (clip_n_output_tokens, "
                 "tools/mtmd/clip.cpp line 4266) and its pixtral graph asserts it over 0: mtmd aborts on an image")]
    return []


def mmproj_values(gguf_name: str, read: ReleaseReader,
                  cfg: Mapping[str, Any]) -> tuple[tuple[int, ...], Iterator[Any]] | str | None:
    """The values PixtralModel (conversion/pixtral.py over llava.py LlavaVisionModel.modify_tensors) writes into an
    mmproj tensor from a release in Mistral's format: every vision and projector tensor as it is (the query and key
    are permuted only for transformers' spelling, `not is_mistral_format`), and `v.token_embd.img_break` the row
    `vision_encoder.image_break_token_id` of `tok_embeddings` (the adapter's `image_break_token_id`)."""
    name = release_name(gguf_name)
    if name is None:
        return None
    if name != f"{IMG_BREAK}.weight":
        return read.shape(name), read.bands(name)
    row, embed = cfg.get(BREAK_ID), "tok_embeddings.weight"
    shape = read.shape(embed)
    if type(row) is not int or row <= 0:
        return (f"the [IMG_BREAK] token's index is {row!r} in params.json: the converter resolves a placeholder from "
                "the tokenizer's special tokens (not modelled), and writes no row for index 0")
    if len(shape) != 2 or row >= shape[0]:
        return f"{embed} has shape {list(shape)}: no row {row} (the [IMG_BREAK] token) for the converter to take"
    return (shape[1],), iter((read.rows(embed, row, row + 1).reshape(shape[1]),))


def repeated(cfg: Mapping[str, Any]) -> int:
    """The elements of the text model the mmproj holds again: the [IMG_BREAK] row, hidden_size wide (the converter
    takes it for any index but 0, a negative placeholder resolved from the tokenizer)."""
    width, row = cfg.get("hidden_size"), cfg.get(BREAK_ID)
    return width if type(width) is int and type(row) is int and row != 0 else 0
