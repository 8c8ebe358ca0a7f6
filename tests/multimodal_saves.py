"""A tiny multimodal model saved by transformers 5.25 (Mistral Large 4, GLM-5.3-Flash), read back two ways: what
its shards hold, name by name, and the expected layout of its saved config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoModelForImageTextToText

from kimi_audit.model.config import model_config_from_dict
from kimi_audit.model.layout import expected_layout


def save(config: Any, d: Path) -> tuple[Path, int]:
    """The model of `config` in BF16 (transformers' float32 modules kept), saved sharded into `d`; with the sum
    of its parameters' numel."""
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(d, max_shard_size="20KB")
    assert len(list(d.glob("*.safetensors"))) >= 2
    return d, sum(p.numel() for p in model.parameters())


def stored(d: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor the shards hold: name -> (shape, dtype)."""
    out = {}
    for shard in d.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                s = f.get_slice(name)
                out[name] = (tuple(s.get_shape()), s.get_dtype())
    return out


def layout_of(d: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """The expected layout of the saved config.json: name -> (shape, dtype)."""
    layout = expected_layout(model_config_from_dict(json.loads((d / "config.json").read_text())))
    return {n: (t.shape, t.dtype) for n, t in layout.items()}


def loads_back(d: Path, numel: int) -> None:
    """transformers' loader reads the files with no missing, unexpected or mismatched key."""
    model, info = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert sum(p.numel() for p in model.parameters()) == numel
