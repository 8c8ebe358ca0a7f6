"""config.json readers of the architectures that schedule their layers themselves: deepseek_v4 (DeepSeek-V4
Flash/Pro, V4.1) and kimi_linear (Kimi-Linear). Each turns a config into the ModelConfig fields it shares with
DeepseekV3, its own dimensions (`ModelConfig.dims`) and the block kind of every decoder layer; the module tree
itself is model.arch.deepseek_v4 / model.arch.kimi_linear.

An absent key means what transformers 5.25's configuration class builds for it (configuration_deepseek_v4.py,
configuration_kimi_linear.py), legacy spellings folded in as its `__post_init__` folds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kimi_audit.errors import ConfigError

Read = tuple[dict[str, Any], dict[str, int], tuple[str, ...]]
"""(ModelConfig fields, architecture dimensions, block kind per decoder layer)."""

LINEAGE_BASE: dict[str, Any] = {
    "hidden_size": 0, "intermediate_size": 0, "moe_intermediate_size": 0, "q_lora_rank": None, "kv_lora_rank": 0,
    "num_attention_heads": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
    "num_hidden_layers": 0, "first_k_dense_replace": 0, "moe_layer_freq": 1, "n_routed_experts": None,
    "n_shared_experts": None, "num_experts_per_tok": None, "topk_method": None, "vocab_size": 0,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "attention_bias": False, "rms_norm_eps": 1e-6,
}
"""What a field means where an architecture has no such thing (ModelConfig's DeepseekV3 fields)."""

# Block kinds: the MLP kind, then the attention kind (model_summary counts `moe*` as MoE layers).
SWA, CSA, HCA = "swa", "csa", "hca"
V4_ATTENTION = {"sliding_attention": SWA, "compressed_sparse_attention": CSA, "heavily_compressed_attention": HCA}
V4_RATIO = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
"""DeepSeek's legacy `compress_ratios` (one int per layer) as layer types (_COMPRESS_RATIO_TO_LAYER_TYPE)."""
V4_MLP = {"moe": "moe", "hash_moe": "moe_hash"}

V4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "head_dim": 512, "q_lora_rank": 1024, "num_experts_per_tok": 6,
    "n_routed_experts": 256, "n_shared_experts": 1, "hc_mult": 4, "o_groups": 8, "o_lora_rank": 1024,
    "index_n_heads": 64, "index_head_dim": 128, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6, "num_hash_layers": 3,
}
"""transformers 5.25 DeepseekV4Config's defaults (the V4-Flash dimensions; `default_num_hash_layers` 3)."""
V4_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}

KL_DEFAULTS: dict[str, Any] = {
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "n_shared_experts": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "n_routed_experts": 256, "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
    "first_k_dense_replace": 1,
}
"""transformers 5.25 KimiLinearConfig's defaults (checkpoint moonshotai/Kimi-Linear-48B-A3B-Instruct)."""
KL_ALIASES = {"n_routed_experts": ("num_experts", "num_local_experts"),
              "num_experts_per_tok": ("num_experts_per_token",), "n_shared_experts": ("num_shared_experts",)}
"""KimiLinearConfig.attribute_map: the names Moonshot's config.json (and transformers' save) writes them under."""


def _get(cfg: dict[str, Any], key: str, defaults: dict[str, Any], aliases: tuple[str, ...] = (),
         optional: bool = False) -> Any:
    for k in (key, *aliases):
        if k in cfg:
            v = cfg[k]
            if v is None and optional:
                return None
            if type(v) is not int or v < 0:
                raise ConfigError(f"config.json {k!r} must be a non-negative integer, got {v!r}")
            return v
    return defaults[key]


def _eps(cfg: dict[str, Any], default: float) -> float:
    v = cfg.get("rms_norm_eps", default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
        raise ConfigError(f"config.json rms_norm_eps must be a non-negative number, got {v!r}")
    return float(v)


def _types(cfg: dict[str, Any], key: str, allowed: set[str], n: int) -> list[str] | None:
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or any(t not in allowed for t in v) or len(v) < n:
        raise ConfigError(f"config.json {key!r} must list one of {sorted(allowed)} for each of the {n} layers")
    return list(v[:n])


def read_deepseek_v4(cfg: dict[str, Any]) -> Read:
    """DeepSeek-V4: every layer MoE (the first `num_hash_layers` hash-routed), attention sliding-window (SWA),
    compressed sparse (CSA, with the lightning indexer) or heavily compressed (HCA), as DeepseekV4Config reads
    `layer_types` / legacy `compress_ratios` and `mlp_layer_types` / legacy `num_hash_layers`."""
    d = V4_DEFAULTS

    def g(key: str) -> Any:
        return _get(cfg, key, d)

    n = g("num_hidden_layers")
    attention = _types(cfg, "layer_types", set(V4_ATTENTION), n)
    if attention is None and cfg.get("compress_ratios") is not None:
        ratios = cfg["compress_ratios"]
        if not isinstance(ratios, list) or any(r not in V4_RATIO for r in ratios) or len(ratios) < n:
            raise ConfigError(f"config.json 'compress_ratios' must give one of {sorted(V4_RATIO)} per layer")
        attention = [V4_RATIO[r] for r in ratios[:n]]
    if attention is None:  # transformers' default: 2 HCA layers, then CSA and HCA interleaved
        attention = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(n - 2, 0))]
    mlp = _types(cfg, "mlp_layer_types", set(V4_MLP), n)
    if mlp is None:
        hashed = g("num_hash_layers")
        mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    rates = dict(V4_RATES)
    if isinstance(cfg.get("compress_rates"), dict):
        rates.update(cfg["compress_rates"])
    for legacy, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                         ("compress_rate_hca", "heavily_compressed_attention")):
        if cfg.get(legacy) is not None:
            rates[kind] = cfg[legacy]
    for kind, r in rates.items():
        if type(r) is not int or r < 1:
            raise ConfigError(f"config.json compress rate of {kind} must be a positive integer, got {r!r}")
    head_dim = g("head_dim")
    fields = {
        "hidden_size": g("hidden_size"), "intermediate_size": g("moe_intermediate_size"),
        "moe_intermediate_size": g("moe_intermediate_size"), "q_lora_rank": g("q_lora_rank"),
        "num_attention_heads": g("num_attention_heads"), "qk_nope_head_dim": head_dim, "v_head_dim": head_dim,
        "num_hidden_layers": n, "n_routed_experts": g("n_routed_experts"), "n_shared_experts": g("n_shared_experts"),
        "num_experts_per_tok": g("num_experts_per_tok"), "vocab_size": g("vocab_size"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)), "rms_norm_eps": _eps(cfg, 1e-6),
    }
    dims = {k: g(k) for k in ("head_dim", "hc_mult", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim",
                              "num_nextn_predict_layers")}
    dims["csa_rate"] = rates["compressed_sparse_attention"]
    dims["hca_rate"] = rates["heavily_compressed_attention"]
    if dims["o_groups"] < 1 or (fields["num_attention_heads"] * head_dim) % dims["o_groups"]:
        raise ConfigError("config.json o_groups must divide num_attention_heads × head_dim")
    kinds = tuple(f"{V4_MLP[m]}_{V4_ATTENTION[a]}" for m, a in zip(mlp, attention))
    return fields, dims, kinds


KL_ATTENTION = {"linear_attention": "kda", "full_attention": "mla"}
KL_MLP = {"dense": "dense", "sparse": "moe"}


def read_kimi_linear(cfg: dict[str, Any]) -> Read:
    """Kimi-Linear: KDA linear-attention layers beside MLA layers (`layer_types`, or Moonshot's
    `linear_attn_config.{kda_layers, full_attn_layers}`, 1-indexed), dense before `first_k_dense_replace`
    (`mlp_layer_types`), as KimiLinearConfig reads them."""
    d = KL_DEFAULTS

    def g(key: str, optional: bool = False) -> Any:
        return _get(cfg, key, d, KL_ALIASES.get(key, ()), optional)

    n = g("num_hidden_layers")
    raw_linear = cfg.get("linear_attn_config")
    linear: dict[str, Any] = raw_linear if isinstance(raw_linear, dict) else {}
    attention = _types(cfg, "layer_types", set(KL_ATTENTION), n)
    if attention is None and "full_attn_layers" in linear and "kda_layers" in linear:
        slots: list[str | None] = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in linear[key]:
                if type(layer) is not int or not 1 <= layer <= n:
                    raise ConfigError(f"config.json linear_attn_config.{key} holds {layer!r}, not a layer 1..{n}")
                slots[layer - 1] = kind
        if None in slots:
            raise ConfigError("config.json linear_attn_config names no attention type for layer "
                              f"{slots.index(None) + 1}")
        attention = [s for s in slots if s is not None]
    if attention is None:
        attention = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    mlp = _types(cfg, "mlp_layer_types", set(KL_MLP), n)
    if mlp is None:
        first = g("first_k_dense_replace")
        mlp = ["dense" if i < first else "sparse" for i in range(n)]
    fields = {k: g(k, optional=k == "q_lora_rank") for k in (
        "hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
        "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
        "n_shared_experts", "num_experts_per_tok", "vocab_size")}
    fields.update(num_hidden_layers=n, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                  attention_bias=bool(cfg.get("attention_bias", False)), rms_norm_eps=_eps(cfg, 1e-5))
    spelled = {"linear_head_dim": "head_dim", "linear_num_heads": "num_heads",
               "linear_conv_kernel_dim": "short_conv_kernel_size"}
    dims = {k: _get(linear, spelled[k], {spelled[k]: g(k)}) for k in spelled}
    kinds = tuple(f"{KL_MLP[m]}_{KL_ATTENTION[a]}" for m, a in zip(mlp, attention))
    return fields, dims, kinds


LINEAGE_READERS: dict[Any, Callable[[dict[str, Any]], Read]] = {
    "deepseek_v4": read_deepseek_v4,
    "kimi_linear": read_kimi_linear,
}
