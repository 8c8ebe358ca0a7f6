"""Mistral Small 4 as published: Mistral3ForConditionalGeneration (`model_type: mistral3`) around a `mistral4` text
model (model.arch.mistral4, read from config.json's nested `text_config`) with a Pixtral vision tower and its
projector (model.arch.pixtral, transformers' spelling).

Names are the release's, which its loaders read as they are: the text model under `language_model.`
(`language_model.model.layers.N.*`, `language_model.model.embed_tokens.weight`, `language_model.lm_head.weight`:
fg11991/sglang@55ed0a8d17f0fda31b3c15975ea4d0239a5ef7a4 `python/sglang/srt/models/mistral4.py`, which strips that
prefix and unstacks `mlp.experts.gate_up_proj`/`down_proj`; vLLM's Mistral3ForConditionalGeneration,
vllm-project/vllm@02677fd9d49b6b4b3082967642a0d1ff45c36c0a `models/mistral3.py`, builds `language_model` from the
`mistral4` text_config and loads these names unrenamed), `vision_tower.*` and `multi_modal_projector.*` (mlx-vlm's
`sanitize`, Blaizzy/mlx-vlm@045d5b77a740ba8a108bc1629a724400c5059885 `models/mistral3/mistral3.py`, keeps them).
transformers 5.25's save_pretrained writes the same names (tests/test_mistral3.py). The spelling transformers 4.52
to 4.57 saved, its module paths (`model.language_model.`, `model.vision_tower.`, `model.multi_modal_projector.`,
`lm_head.`), which vLLM's mapper still reads, is a dialect.

The top-level `tie_word_embeddings` ties the output head where config.json sets it (transformers 5.25 reads it
there); otherwise the text model's own value does, as vLLM reads it. A `mistral3` around any other text model
(Mistral Small 3.x: `mistral`) is outside this family: no layout is derived. The release's FP8 is not described
(model.arch.mistral4): QUANT_UNSUPPORTED.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import mistral4, pixtral
from kimi_audit.model.arch.spec import Architecture, Dialect, ModelTree, prefixed, register
from kimi_audit.model.config_fields import ModelConfig, nested_text, unsupported_config

MODEL_TYPES = ("mistral3",)
TEXT_PREFIX = "language_model."
VISION_ABSENT: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                 "num_channels": 3, "patch_size": 14}
"""Mistral3Config's vision sub-config where config.json has none (transformers 5.25 sub_configs_defaults)."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    text = nested_text(cfg, MODEL_TYPES[0])
    if text.get("model_type") not in mistral4.MODEL_TYPES:
        return unsupported_config(cfg)
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        raise ConfigError(f"config.json tie_word_embeddings must be true or false, got {tie!r}")
    parsed = mistral4.read({**text, "tie_word_embeddings": tie})
    dims = {**dict(parsed.dims), **pixtral.read_dims(cfg, VISION_ABSENT)}
    return replace(parsed, model_type=MODEL_TYPES[0], prefix=TEXT_PREFIX, dims=tuple(sorted(dims.items())))


def describe(cfg: ModelConfig) -> ModelTree:
    """The text model's tree under `language_model.`, the vision tower and projector after it."""
    text = mistral4.describe(cfg)
    after = (*(prefixed(n, TEXT_PREFIX) for n in text.after), pixtral.tower(cfg, pixtral.TRANSFORMERS),
             pixtral.projector(cfg, pixtral.TRANSFORMERS))
    return ModelTree(tuple(prefixed(n, TEXT_PREFIX) for n in text.before), text.blocks, after)


TRANSFORMERS_4_52 = Dialect(
    "transformers-4.52 save_pretrained (transformers 4.52 to 4.57)",
    (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
     ("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector.")),
    "the module paths transformers 4.52 to 4.57 saved a mistral3 model under (vLLM's Mistral3ForConditionalGeneration "
    "maps them back: 'mapping for new names in checkpoint saved after transformers v4.52')")


def dialects(cfg: ModelConfig) -> tuple[Dialect, ...]:
    return (TRANSFORMERS_4_52,)


ARCHITECTURE = register(Architecture(
    name="Mistral Small 4 (mistral3 wrapper)", model_types=MODEL_TYPES, read=read, describe=describe, dialects=dialects,
    class_names=("Mistral3ForConditionalGeneration",), float32_routers=mistral4.ARCHITECTURE.float32_routers,
    buffered=mistral4.ARCHITECTURE.buffered, value_roles=mistral4.ARCHITECTURE.value_roles))
