"""Mistral's own layout's finding codes (params.json beside or instead of config.json, consolidated shards:
model.mistral_layout, model.arch.mistral_params), as rules (report.rules merges them)."""

from __future__ import annotations

from kimi_audit.report.rules.rule import Rule

PARAMS_HELP = ("Correct params.json (it is what llama.cpp's --mistral-format converter and vLLM's --config-format "
               "mistral read), or download it again with the release's shards.")

MISTRAL_RULES: dict[str, Rule] = {
    "MISTRAL_LAYOUT_BESIDE": Rule(
        "info", "Mistral's own layout of the release beside transformers' one: its consolidated shards not read",
        "The folder holds config.json with its own shards and also params.json with consolidated*.safetensors "
        "(Mistral publishes both layouts in one repo). The audit is config.json's; the consolidated shards its "
        "index does not name are not read, as no loader of that layout reads them.",
        "Audit Mistral's layout on its own: --include 'consolidated*.safetensors' --include params.json "
        "(--include consolidated.safetensors.index.json where there is one)."),
    "PARAMS_DISAGREES": Rule(
        "error", "params.json describes another model than config.json beside it (or cannot be read)",
        "Read through its adapter, params.json gives another value of a dimension config.json sets (layers, width, "
        "experts, the latent ranks, the vocabulary ...): the same repo loads as two different models, depending on "
        "whether a loader reads config.json or params.json. Every differing key is named in one finding.",
        PARAMS_HELP),
    "PARAMS_ROPE_INVALID": Rule(
        "error", "params.json's `yarn` or `llama_4_scaling` block is missing or malformed",
        "llama.cpp's converter requires `yarn` with factor, beta, alpha, apply_scale and "
        "original_max_position_embeddings; vLLM's adapter refuses an unknown yarn key and, for a MoE with shared "
        "experts, requires `llama_4_scaling` with original_max_position_embeddings and beta. A factor under 1, a "
        "length that is not a positive integer, beta below alpha or apply_scale not a boolean builds another RoPE "
        "than the release was trained with. One finding per block, every problem named.", PARAMS_HELP),
    "PARAMS_ROPE_LENGTHS": Rule(
        "warning", "params.json's two original context lengths differ",
        "vLLM scales attention by llama_4_scaling.original_max_position_embeddings; llama.cpp's converter writes "
        "yarn.original_max_position_embeddings as attention.temperature_length: the two serve the model with "
        "different attention scaling beyond that length.", PARAMS_HELP),
}
