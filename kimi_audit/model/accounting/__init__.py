"""The parameter accounting tree: every parameter of a DeepseekV3-family checkpoint, by component.

The tree mirrors the model as modeling_deepseek.py builds it (and as the design cards show it:
"61 transformer blocks › 60 MoE blocks › Latent attention › Query compression › Query latent RMSNorm"):

    model
    ├── embedding (model.embed_tokens)
    ├── transformer blocks
    │   ├── dense block(s): norms, latent attention, MLP
    │   └── MoE blocks: norms, latent attention, router, routed experts, shared experts
    ├── multi-token-prediction layers (only when num_nextn_predict_layers > 0)
    ├── final norm (model.norm)
    └── lm_head (absent when tie_word_embeddings)

Latent attention is split into query compression (q_a_proj, q_a_layernorm, q_b_proj), key-value
compression (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) and the output projection (o_proj).

Every node carries two counts:
  * `derived`: computed from config.json values alone, by the formulas of the model code (the node's
    `formula` spells them out, e.g. "1,536 × 60 MoE blocks = 92,160");
  * `found`: the elements of the checkpoint tensors that map to the node (from the shard headers).
A node is flagged (`mismatch`) when they differ, when the number of tensors differs, when a found
tensor has another dtype than the config implies, or when any descendant is flagged. Tensors the
config does not account for land in an extra "unaccounted" node, which is always a mismatch.

A Linear module counts out × in parameters, however it is stored: FP8 e4m3 weights element for element,
INT4 weights (compressed-tensors pack-quantized, Kimi-K2-Thinking) through their `weight_packed` I32 words,
eight parameters a word. Quantization metadata (FP8 block scales `weight_scale_inv`, INT4 group scales
`weight_scale` and `weight_shape`, zero points, group indices) and stored buffers (`rotary_emb.inv_freq`)
are not parameters: they are listed apart (`Accounting.excluded`) and counted in no node. Every node also
carries its stored elements by tensor dtype, metadata included (`Node.stored`; `Accounting.stored` over
the whole checkpoint, buffers too), beside its parameters by dtype (`Node.by_dtype`: INT4 for packed words).

Multi-token-prediction layers (DeepSeek-V3's `model.layers.61`) are their own node: their embedding and
output head copy the main model's, so `Accounting.mtp` gives the total with MTP, main-only and with those
copies counted once ("671B main + 14B MTP = 685B").

Activated parameters per token (`Activation`) are counted as follows:
  * every parameter outside the routed experts of the main stack counts in full: embedding, all
    attention and norm parameters, routers (gate weight and correction bias), dense MLPs, shared
    experts, the final norm and lm_head. The embedding is counted in full although a token reads
    one row of it, as the published figures do (`without_embedding` gives the other convention);
  * of the routed experts of each MoE block, `num_experts_per_tok` of `n_routed_experts` count;
  * multi-token-prediction layers are not counted (they do not take part in next-token inference).
The published figures (`summary.PUBLISHED`) are reference constants for comparison only; nothing here is
derived from them.

The package, by concept: tree.py (nodes, parts, factors, found tensors, the Accounting), summary.py (rows by
dtype, listed-apart metadata, activation, MTP, published figures), builder.py (leaves and groups from found
tensors), model.py (the walk over the architecture's description that makes the tree), account.py (the entry
points: build_accounting, accounting_of_checkpoint). Renderers are in kimi_audit.report.accounting.
"""
