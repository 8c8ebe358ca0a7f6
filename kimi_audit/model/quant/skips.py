"""Which Linear modules a format's loader leaves unquantized: the output head by default, and a skip list as
transformers matches it. One helper every format calls (GPTQ, AWQ, bitsandbytes, DeepSeek's FP8), so that the
default and the matching are spelled once.

- The default: transformers' `get_keys_to_not_convert` keeps a causal LM's output embeddings (`lm_head`) in the
  model's dtype (quantizers/base.py); GPTQModel and AutoAWQ leave it plain unless their config's `lm_head` says
  otherwise. `output_head` names it in the release's spelling (`ReleaseQuant.alias`: DeepSeek-V4's `head`, and
  under a multimodal text prefix).
- The matching: transformers 5.25's `should_convert_module` (quantizers/quantizers_utils.py) skips a module when
  a skip-list key matches its name (1) as a regex from the start up to a module boundary (`layer.1` skips
  `layer.1.attn`, not `layer.11.attn`), the boundary being a following dot or the end, or a preceding dot (a key
  that ends in one), or (2) as a plain suffix (`fc1` skips `model.decoder.layers.23.fc1`). `skip_patterns` says
  the same in RE2 (model.patterns: no look-around), matched from the start of a module name by QuantPlan.
  transformers' bitsandbytes and AWQ integrations match module names; its torchao quantizer matches parameter
  names (`...down_proj.weight`) with the same function, which no format here reads (its suffix rule would need
  the key to end in `.weight`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.patterns import NamePatterns, compile_patterns
from kimi_audit.model.quant.scheme import ReleaseQuant

__all__ = ["OUTPUT_HEAD", "output_head", "skip_list", "skip_patterns", "skipped"]

OUTPUT_HEAD = "lm_head"
"""transformers' name of a causal LM's output embeddings, the module every loader leaves plain by default."""


def output_head(release: ReleaseQuant, q: Mapping[str, Any] | None = None) -> frozenset[str]:
    """The output head's names in the release's spelling; none where `q`, a quantization_config whose writer
    may quantize it (GPTQModel's, AutoAWQ's), says it did (`lm_head: true`)."""
    return frozenset() if q is not None and q.get(OUTPUT_HEAD) else frozenset(release.alias({OUTPUT_HEAD}))


def skip_list(q: Mapping[str, Any], key: str) -> list[str] | None:
    """quantization_config's skip list under `key` (None where the key is absent or null); ConfigError where it
    is not a list of strings."""
    value = q.get(key)
    if value is not None and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        raise ConfigError(f"config.json quantization_config {key} must be a list of module names")
    return value


def skip_patterns(keys: Sequence[str]) -> list[str]:
    """RE2 patterns that match (from the start of a module name) exactly the names transformers'
    should_convert_module skips for `keys`."""
    out: list[str] = []
    for k in keys:
        out.append(f"(?:{k})(?:\\.|$)")
        if k.endswith(".") and not k.endswith("\\."):  # the boundary before the name: a key ending in a dot
            out.append(f"(?:{k[:-1]}\\.)")
        elif k.endswith("\\."):
            out.append(f"(?:{k})")
        out.append(f".*{re.escape(k)}$")
    return out


def skipped(keys: Sequence[str] | None, where: str, *extra: str) -> NamePatterns | None:
    """`skip_patterns` of `keys` (and any `extra` RE2 patterns) as one program; None for none."""
    return compile_patterns([*extra, *skip_patterns(keys or ())], where)
