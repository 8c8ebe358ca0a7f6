"""DeepSeek-V4.1 (`model_type: deepseek_v41`, DeepseekV41ForCausalLM) as data: its text model.

config.json nests the text model in `text_config` (`deepseek_v41_text`) beside a `vision_config`. The text model
keeps DeepSeek-V4's names and parts (model.arch.deepseek_v4: `embed`, `layers.N.{attn_norm, ffn_norm, hc_attn_*,
hc_ffn_*}`, the attention's `wq_a`, `q_norm`, `wq_b`, `wkv`, `kv_norm`, `wo_a`, `wo_b`, `attn_sink`, the
bias-routed MoE, `norm`, `head`) and changes the rest, as vLLM's loader of the release reads it
(vllm-project/vllm `vllm/models/deepseek_v4_1/`: `nvidia/model.py`, `attention.py`, `compressor.py`,
`common/engram.py`; tests/data/loader_names/deepseek_v41.vllm.json cites the commits):
- `compress_ratios` per layer is 0 (sliding window), 1 or 2; the KV compressor (`attn.compressor.{wkv, norm}`,
  `wgate` at ratio 2, no `ape`; unquantized) exists only on `kv_source_layer_ids`, the indexer
  (`attn.indexer.{wq_b, weights_proj}`) only on `index_source_layer_ids`, and on a layer that is both its keys'
  `attn.indexer.{wk [index head dim, head dim], k_norm}` (BF16, unquantized); no indexer compressor;
- every MoE layer is bias-routed (no hash layers);
- Engram on `engram_layer_ids`: `engram.embed.weight` F8_E4M3 [engram_num_embeddings[i], engram_head_dim] with
  its per-row F8_E8M0 `engram.embed.scale` [rows, head dim / 32], `engram.wkv` [hidden × (hc + 1), n-gram
  columns × engram head dim] (FP8), `engram.q_weight` and `engram.k_weight` [hc, hidden] BF16;
- no learned output hyper-connection (`hc_head`).
Not described: the vision tower (`vision.*`), its aligner (`aligner.*`), the image embeddings (`image_*`), the
vision routing bias (`ffn.gate.bias_vl`) and the MTP/DSpark stages (`mtp.*`): each one TENSORS_UNDESCRIBED.
Quantization as DeepSeek-V4's release writes it (FP8 in 32 × 32 blocks, `expert_dtype` inside
quantization_config); transformers 5.25 has no deepseek_v41.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_audit.errors import ConfigError
from kimi_audit.model.arch import deepseek_v4
from kimi_audit.model.arch.deepseek_v4 import GAIN, NORM, SWA
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    Architecture,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
    register,
)
from kimi_audit.model.config_fields import I64_MAX, ModelConfig, nested_text, read_eps, read_int, scheduled

MODEL_TYPES = ("deepseek_v41",)
ENGRAM_SCALE_BLOCK = 32
"""Columns of an Engram table row per F8_E8M0 scale (its scale is [rows, 8] for 256 columns)."""


def read(cfg: dict[str, Any]) -> ModelConfig:
    """The nested text config: its layer schedules (`compress_ratios`, `kv_source_layer_ids`,
    `index_source_layer_ids`, `engram_layer_ids`) and dims, every key required (no configuration class gives
    defaults)."""
    text = nested_text(cfg, MODEL_TYPES[0])

    def g(key: str) -> Any:
        return read_int(text, key, {})

    n = g("num_hidden_layers")
    ratios = text.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < n or any(type(r) is not int or r not in (0, 1, 2)
                                                                for r in ratios[:n]):
        raise ConfigError(f"config.json text_config.compress_ratios must give 0, 1 or 2 for each of the {n} layers")

    def layers(key: str) -> list[int]:
        ids = text.get(key, [])
        if not isinstance(ids, list) or len(ids) > n or any(type(i) is not int or not 0 <= i < n for i in ids) \
                or len(set(ids)) != len(ids):
            got = f"{len(ids):,} ids" if isinstance(ids, list) else repr(ids)
            raise ConfigError(f"config.json text_config.{key} must list distinct layers of 0..{n - 1}, got {got}")
        return ids

    kv, ix, engram = layers("kv_source_layer_ids"), layers("index_source_layer_ids"), layers("engram_layer_ids")
    rows = text.get("engram_num_embeddings", [])
    if not isinstance(rows, list) or len(rows) != len(engram) or any(
            type(r) is not int or not 1 <= r <= I64_MAX for r in rows):
        raise ConfigError("config.json text_config.engram_num_embeddings must give a positive row count for each "
                          "of engram_layer_ids")
    first = min(kv, default=n), min(ix, default=n)  # (each layer once: the id lists are sets of layers)
    for i in range(n):
        if ratios[i] and not (first[0] <= i and first[1] <= i):
            raise ConfigError(f"config.json text_config: compressed layer {i} has no kv or index source at or "
                              "below it (kv_source_layer_ids, index_source_layer_ids)")
    fields = {k: g(k) for k in ("hidden_size", "moe_intermediate_size", "q_lora_rank", "num_attention_heads",
                                "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "vocab_size")}
    head_dim = g("head_dim")
    fields.update(intermediate_size=fields["moe_intermediate_size"], qk_nope_head_dim=head_dim,
                  v_head_dim=head_dim, num_hidden_layers=n, layers_at="layers.",
                  tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
                  rms_norm_eps=read_eps(text, 1e-6))
    dims = {k: g(k) for k in ("head_dim", "hc_mult", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim")}
    if dims["o_groups"] < 1 or (fields["num_attention_heads"] * head_dim) % dims["o_groups"]:
        raise ConfigError("config.json text_config.o_groups must divide num_attention_heads × head_dim")
    if engram:
        dims.update(engram_head_dim=g("engram_head_dim"),
                    engram_columns=(g("engram_max_ngram_size") - 1) * g("engram_n_heads"))
        if dims["engram_head_dim"] % ENGRAM_SCALE_BLOCK or dims["engram_columns"] < 1:
            raise ConfigError("config.json text_config: engram_head_dim must be a multiple of 32 and "
                              "engram_max_ngram_size at least 2")
    dims.update({f"engram_rows_{layer}": r for layer, r in zip(engram, rows)})
    kv_set, ix_set, engram_set = set(kv), set(ix), set(engram)
    kinds = tuple(f"moe_{SWA}_r{ratios[i]}" + ("_kv" if i in kv_set else "") + ("_index" if i in ix_set else "")
                  + (f"_engram{i}" if i in engram_set else "") for i in range(n))
    return scheduled({**text, "model_type": MODEL_TYPES[0]}, fields, dims, kinds, ARCHITECTURE.quant)


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe(deepseek_v4._Describe):
    def tree(self) -> ModelTree:
        base = super().tree()  # V4's, less its output hyper-connection (`hc_head`): V4.1 has none
        after = tuple(n for n in base.after if not (isinstance(n, Leaf) and n.key == "hc_head"))
        return ModelTree(base.before, base.blocks, after)

    def layer(self, kind: str) -> tuple[Node, ...]:
        parts = kind.split("_")
        nodes = super().layer(f"moe_{SWA}")
        attention = self.v41_attention(int(parts[2][1:]), "kv" in parts, "index" in parts)
        nodes = tuple(attention if isinstance(n, Group) and n.key == "attention" else n for n in nodes)
        engram = next((int(p.removeprefix("engram")) for p in parts if p.startswith("engram")), None)
        return nodes if engram is None else (self.engram(engram), *nodes)

    def v41_attention(self, ratio: int, kv_source: bool, index_source: bool) -> Group:
        base = super().attention(SWA)
        h, hd = self.f("hidden_size", "hidden"), self.d("head_dim", "head dim")
        keys = (BLOCK_KEYS, "compress_ratios", "kv_source_layer_ids")
        extra: list[Node] = []
        if kv_source and ratio:
            lin = [Leaf("wkv", "wkv", "Compressor key-value projection", "compressor_wkv",
                        (Linear("attn.compressor.wkv", (hd,), (h,)),), (*keys, DTYPE_KEYS))]
            if ratio > 1:
                lin.append(Leaf("wgate", "wgate", "Compressor gate projection", "compressor_wgate",
                                (Linear("attn.compressor.wgate", (hd,), (h,)),), (*keys, DTYPE_KEYS)))
            extra.append(Group("compressor", "KV compressor", (*lin, Leaf(
                "norm", "norm", "Compressor RMSNorm", "compressor_norm",
                (Param(GAIN, "attn.compressor.norm.weight", (hd,), NORM),), keys))))
        if index_source:
            ih, idim = self.d("index_n_heads", "indexer heads"), self.d("index_head_dim", "indexer head dim")
            ikeys = (BLOCK_KEYS, "index_source_layer_ids", "index_n_heads", "index_head_dim")
            index: list[Node] = [
                Leaf("wq_b", "wq_b", "Indexer query projection", "indexer_wq_b",
                     (Linear("attn.indexer.wq_b", (ih, idim), (self.f("q_lora_rank", "q latent"),)),),
                     (*ikeys, DTYPE_KEYS)),
                Leaf("weights_proj", "weights_proj", "Indexer head weights", "indexer_weights_proj",
                     (Linear("attn.indexer.weights_proj", (ih,), (h,)),), (*ikeys, DTYPE_KEYS))]
            if kv_source:
                index += [Leaf("wk", "wk", "Indexer key projection (from the compressor's latent)", "indexer_wk",
                               (Linear("attn.indexer.wk", (idim,), (hd,)),), (*ikeys, "kv_source_layer_ids")),
                          Leaf("k_norm", "k_norm", "Indexer key RMSNorm", "indexer_k_norm",
                               (Param(GAIN, "attn.indexer.k_norm.weight", (idim,), NORM),), ikeys)]
            extra.append(Group("indexer", "Lightning indexer", tuple(index)))
        title = "Sliding-window attention" if not ratio else f"Compressed sparse attention (ratio {ratio})"
        return replace(base, title=title, children=(*base.children, *extra))

    def engram(self, layer: int) -> Group:
        c = self.cfg
        h, hc = self.f("hidden_size", "hidden"), self.d("hc_mult", "streams")
        rows = Factor(c.dim(f"engram_rows_{layer}"), "hash buckets", ("engram_num_embeddings",))
        ehd = self.d("engram_head_dim", "engram head dim")
        cols = Factor(c.dim("engram_columns") * ehd.value, "n-gram columns × engram head dim",
                      ("engram_max_ngram_size", "engram_n_heads", "engram_head_dim"))
        out = Factor((c.dim("hc_mult") + 1) * c.hidden_size, "(streams + 1) × hidden", ("hc_mult", "hidden_size"))
        groups = Factor(ehd.value // ENGRAM_SCALE_BLOCK, "scale groups of 32", ("engram_head_dim",))
        keys = (BLOCK_KEYS, "engram_layer_ids")
        return Group("engram", "Engram (n-gram memory)", (
            Leaf("embed", "engram.embed", "Engram hash table (FP8, a scale per 32 columns)", "engram_embed",
                 (Param("Table", "engram.embed.weight", (rows, ehd), "F8_E4M3"),
                  Param("Row scales", "engram.embed.scale", (rows, groups), "F8_E8M0", scale=True)), keys),
            Leaf("wkv", "engram.wkv", "Engram key-value projection", "engram_wkv",
                 (Linear("engram.wkv", (out,), (cols,)),), (*keys, DTYPE_KEYS)),
            Leaf("gate", "engram.q_weight", "Engram gate weights", "engram_gate",
                 (Param("Query weight", "engram.q_weight", (hc, h), c.dtype),
                  Param("Key weight", "engram.k_weight", (hc, h), c.dtype)), keys)))


ARCHITECTURE = register(Architecture(
    name="DeepSeek-V4.1", model_types=MODEL_TYPES, read=read, describe=describe,
    class_names=("DeepseekV41ForCausalLM",),
    quant=replace(deepseek_v4.ARCHITECTURE.quant,
                  plain_suffixes=(*deepseek_v4.ARCHITECTURE.quant.plain_suffixes, ".indexer.wk")),
    undescribed={r"vision\.": "DeepSeek-V4.1's vision tower (vision_config is not read)",
                 r"aligner\.": "DeepSeek-V4.1's vision aligner", r"image_": "DeepSeek-V4.1's image embeddings",
                 r"layers\.\d+\.ffn\.gate\.bias_vl$": "DeepSeek-V4.1's vision routing biases (ffn.gate.bias_vl)",
                 r"mtp\.": "DeepSeek-V4.1's MTP/DSpark stages"},
    float32_routers=deepseek_v4.ARCHITECTURE.float32_routers, buffered=deepseek_v4.ARCHITECTURE.buffered,
    value_roles=deepseek_v4.ARCHITECTURE.value_roles))
