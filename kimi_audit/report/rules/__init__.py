"""Every finding code as a rule: severity, a one-line meaning (docs/reference.md's "Finding codes" tables), a
fuller description and what to do about it. SARIF's `tool.driver.rules` and `audit --ignore` read it;
`tests/test_sarif.py` checks that every code the package can emit is here and in docs/reference.md.
"""

from __future__ import annotations

from kimi_audit.report.rules.gguf import GGUF_RULES
from kimi_audit.report.rules.mistral import MISTRAL_RULES
from kimi_audit.report.rules.rule import Rule
from kimi_audit.report.rules.same_model import SAME_MODEL_RULES

__all__ = ["RULES", "Rule", "rule"]


FORMAT_HELP = ("The shard is not a well-formed safetensors file. Re-save it with a conforming writer "
               "(safetensors.torch.save_file / huggingface_hub upload of the original file) and compare its "
               "sha256 with the published one; a truncated download is fixed by downloading it again.")
INDEX_HELP = ("Regenerate model.safetensors.index.json from the shards' headers (every tensor name mapped to "
              "the shard that holds it), or download the missing shards.")
LAYOUT_HELP = ("Compare the checkpoint with the layout its config.json implies (`kimi-audit explain SOURCE "
               "COMPONENT`); either config.json or the conversion that wrote the shards is wrong.")
SCALE_HELP = ("Every F8_E4M3 weight [out, in] needs `<name>_scale_inv` F32 [ceil(out/128), ceil(in/128)] "
              "(DeepSeek's block FP8); re-run the FP8 conversion, or fix quantization_config.")
VALUES_HELP = ("Inspect the tensor with `kimi-audit tensor SOURCE NAME`; bad gains or scales silently "
               "corrupt every forward pass, so re-export the checkpoint from a good copy.")
GATE_HELP = "Release gate: audit the artifact you mean to release, or correct the expected value in CI."
VERIFY_HELP = ("Download the file again (`kimi-audit download`, or `hf download` at the same commit) and run "
               "`kimi-audit verify` on the copy; never load a checkpoint whose bytes differ from its reference.")
WEIGHTS_HELP = ("The weight's bytes are corrupt or were written wrong: download the shard again and verify it; "
                "if the published file itself holds them, re-export the checkpoint from a good copy.")

RULES: dict[str, Rule] = {
    # Format: one shard's header.
    "HEADER_TOO_SHORT": Rule("error", "file shorter than the 8-byte length prefix",
                           "The shard has fewer than 8 bytes, so it has no safetensors header length.", FORMAT_HELP),
    "HEADER_TOO_LARGE": Rule("error", "header length over 100,000,000 bytes (refused before reading)",
                           "The 8-byte prefix declares a header larger than safetensors allows; it is not read.",
                           FORMAT_HELP),
    "HEADER_PAST_EOF": Rule("error", "header length runs past the end of the file",
                          "The declared header length is larger than the file: the file is truncated or corrupt.",
                          FORMAT_HELP),
    "HEADER_SHORT_READ": Rule("error", "the source returned fewer header bytes than the file holds",
                            "A ranged read of the header came back short (a server or file system problem).",
                            "Run the audit again; if it persists, check the source (proxy, mirror, partial file)."),
    "HEADER_NOT_UTF8": Rule("error", "header bytes are not UTF-8",
                          "The JSON header holds bytes that are not valid UTF-8.", FORMAT_HELP),
    "HEADER_INVALID_JSON": Rule("error", "not JSON (also NaN/Infinity literals, absurd nesting or numbers)",
                              "The header is not strict JSON; loaders disagree on such input.", FORMAT_HELP),
    "HEADER_NOT_OBJECT": Rule("error", "JSON is not an object",
                            "The header's JSON is an array, string or number, not a name -> entry object.",
                            FORMAT_HELP),
    "HEADER_DUPLICATE_KEY": Rule("error", "a key appears twice (most parsers silently keep the last)",
                               "Two header entries share a name; which tensor a loader sees depends on its parser.",
                               FORMAT_HELP),
    "HEADER_LEADING_WHITESPACE": Rule("warning", "JSON starts with whitespace",
                                    "The header JSON starts with whitespace, which strict readers reject.",
                                    FORMAT_HELP),
    "HEADER_TRAILING_WHITESPACE": Rule("warning", "padding holds whitespace other than spaces",
                                     "The header's padding holds tabs or newlines; the format pads with spaces.",
                                     FORMAT_HELP),
    "METADATA_INVALID": Rule("error", "`__metadata__` is not a string → string map",
                           "The `__metadata__` entry must map strings to strings.", FORMAT_HELP),
    "TENSOR_ENTRY_INVALID": Rule("error", "entry not an object, or lacks dtype / shape / data_offsets",
                               "A header entry is not a tensor description the format defines.", FORMAT_HELP),
    "TENSOR_EXTRA_FIELD": Rule("warning", "entry has fields outside the schema",
                             "A header entry has fields besides dtype, shape and data_offsets.", FORMAT_HELP),
    "DTYPE_UNKNOWN": Rule("error", "dtype not defined by the format",
                        "A tensor's dtype is not one of the safetensors dtypes.", FORMAT_HELP),
    "SHAPE_INVALID": Rule("error", "shape not a list of non-negative integers, or overflows 64 bits",
                        "A tensor's shape is malformed or its element count overflows.", FORMAT_HELP),
    "OFFSETS_INVALID": Rule("error", "data_offsets not `[begin, end]` with 0 ≤ begin ≤ end",
                          "A tensor's data_offsets are not a valid byte range.", FORMAT_HELP),
    "SIZE_MISMATCH": Rule("error", "end − begin ≠ prod(shape) × dtype size",
                        "A tensor's byte range does not hold exactly its shape's elements of its dtype.",
                        FORMAT_HELP),
    "OFFSETS_OVERLAP": Rule("error", "two tensors share bytes",
                          "Two tensors' byte ranges overlap: writing one changes the other.", FORMAT_HELP),
    "OFFSETS_GAP": Rule("error", "unused bytes between tensors (or before the first)",
                      "The data buffer has bytes no tensor owns; safetensors requires a dense buffer.", FORMAT_HELP),
    "DATA_PAST_EOF": Rule("error", "tensor data runs past the end of the file",
                        "A tensor's bytes end after the end of the file: the shard is truncated.", FORMAT_HELP),
    "TRAILING_BYTES": Rule("error", "bytes after the last tensor",
                         "The file holds bytes after the last tensor's data.", FORMAT_HELP),
    # Checkpoint: files, index, layout.
    "NO_SAFETENSORS": Rule("error", "no `.safetensors` file at all",
                         "The checkpoint holds no .safetensors shard, so nothing can be audited.",
                         "Point the audit at the checkpoint directory (or download its shards)."),
    "SHARD_UNREADABLE": Rule("error", "a shard could not be read",
                           "Reading a shard failed (permissions, I/O or network error); its tensors are covered "
                           "by this finding.", "Check the file or the connection and run the audit again."),
    "CHECKPOINT_TOO_LARGE": Rule("error", "the shards' headers together pass 128 MB: the remaining shards are not read",
                               "The headers alone exceed the audit's budget (Kimi-K2: 17.7 MB), so the rest of "
                               "the shards are not read and their tensors are not checked.",
                               "Such headers are abnormal for this architecture: check where the shards came from."),
    "INDEX_INVALID": Rule("error", "index.json is not JSON, has no weight_map, or a bad total_size",
                        "model.safetensors.index.json cannot be used to locate tensors.", INDEX_HELP),
    "INDEX_TOO_LARGE": Rule("error", "index.json over 64 MB (refused)",
                          "The index is far larger than any real checkpoint's and is not read.", INDEX_HELP),
    "INDEX_DUPLICATE_KEY": Rule("error", "a key appears twice in index.json",
                              "A tensor name appears twice in the index; loaders keep one of the two.", INDEX_HELP),
    "INDEX_UNSAFE_PATH": Rule("error", "a shard name that is absolute, has `..`, or escapes the directory",
                            "The index names a shard outside the checkpoint directory; it is never opened.",
                            "Treat the checkpoint as hostile until the index is regenerated from its shards."),
    "SYMLINK_OUTSIDE": Rule("error", "a symlink in the checkpoint directory that resolves outside it",
                          "A file of the checkpoint links outside its directory; it is never opened "
                          "(HF cache snapshot → blobs links are fine).",
                          "Replace the link with the file itself, or audit the directory it points to."),
    "INDEX_SHARD_ABSENT": Rule("error", "the index maps tensors to a shard that is not there",
                             "A shard the index names is missing (a partial download); its tensors are covered "
                             "by this finding.", "Download the missing shard (`kimi-audit download`)."),
    "INDEX_MISSING": Rule("warning", "several shards and no index",
                        "There are several shards and no model.safetensors.index.json; loaders need it.",
                        INDEX_HELP),
    "SHARD_LOADED_UNINDEXED": Rule("error", "a shard the index never mentions, which the format's loader reads",
                                   "mlx-lm loads every model*.safetensors in the directory and ignores the index: a "
                                   "stray shard's tensors enter the model (and may replace the indexed ones).",
                                   "Remove the stray shard, or add its tensors to the index."),
    "SHARD_SERIES_GAP": Rule("warning", "shards named as a numbered series of which some are neither in the folder "
                             "nor in the index (an error where the config's missing tensors are counted under it)",
                             "`model-00001-of-00003` and `-00002-of-00003` are here, the index names no third: a "
                             "shard left out of the upload and of its index (the layout's missing tensors follow).",
                             "Upload the missing shard and its index entries."),
    "SHARD_NOT_IN_INDEX": Rule("warning", "a shard the index never mentions",
                             "A .safetensors file in the directory holds no tensor the index maps; loaders "
                             "ignore it.", "Remove the stray shard, or add its tensors to the index."),
    "INDEX_ENTRY_MISSING": Rule("error", "a tensor in a shard that the index does not list",
                              "A loader that follows the index never loads this tensor.", INDEX_HELP),
    "INDEX_SHARD_MISMATCH": Rule("error", "a tensor in another shard than the index says",
                               "The index maps the tensor to a shard that does not hold it.", INDEX_HELP),
    "INDEX_TENSOR_ABSENT": Rule("error", "the index lists a tensor that its shard lacks",
                              "Loading by the index fails on this tensor.", INDEX_HELP),
    "INDEX_TOTAL_SIZE": Rule("warning", "`metadata.total_size` ≠ sum of tensor payloads",
                           "The index's metadata.total_size disagrees with the shards' payload bytes.", INDEX_HELP),
    "HUB_PARAMETERS": Rule("warning", "the Hub's parameter count (model info `safetensors.total`) is not what the "
                           "shard headers give by the Hub's own rule",
                           "The Hub computes its count from the shard headers: every stored element, less the "
                           "quantization metadata and E8M0 tensors when the config quantizes. A different total "
                           "means the Hub counted other files than the ones audited.",
                           "Audit the revision the Hub page shows, or re-upload the shards."),
    "INDEX_TOTAL_PARAMETERS": Rule("info", "`metadata.total_parameters` ≠ the model's parameters",
                                   "The index's metadata.total_parameters (llmcompressor writes it) is not the "
                                   "parameter count: an info where it counts the stored elements (packed words and "
                                   "scales), a warning where it is neither.",
                                   "Loaders ignore it; recompute it as the parameters of the unquantized model."),
    "PICKLE_NOT_INSPECTED": Rule("warning", "a `.bin`/`.pt`/… pickle file: never unpickled, not inspected",
                               "Pickle files can run code when loaded; the audit does not open them.",
                               "Delete pickle weights from a safetensors release, or load them only if trusted."),
    "QUANT_CONFIG": Rule("error", "`quantization_config` is not fp8 / e4m3 / [128, 128]",
                       "config.json's quantization_config does not describe DeepSeek block FP8; the per-tensor "
                       "dtype and scale findings it explains are covered by this one.",
                       "Restore quant_method fp8, fmt e4m3, weight_block_size [128, 128] (or the dtypes)."),
    "KV_SCALE_UNDECLARED": Rule(
        "error", "KV-cache scales stored, no KV-cache quantization declared",
        "Attention layers store KV-cache scales (self_attn.k_scale / v_scale, ModelOpt's k_proj.k_scale) but "
        "quantization_config declares no kv_cache_scheme or kv_cache_quant_algo: loaders ignore them or refuse the "
        "checkpoint. One finding covers them all.",
        "Restore the quantization_config the exporter wrote (its kv_cache_scheme), or drop the scales."),
    "QUANT_FORMAT_MISMATCH": Rule(
        "error", "every weight a quantization format plans is stored in another dtype",
        "quantization_config names a format (NVFP4, FP8, INT4 ...) whose stored weight dtype none of the weights it "
        "plans has: the config describes another format than the files hold. The per-tensor findings of those "
        "modules are covered by this one.",
        "Restore the quantization_config (or hf_quant_config.json) the exporter wrote with these files."),
    "QUANT_UNSUPPORTED": Rule("error", "`quantization_config` names a scheme kimi-audit does not implement",
                              "The tensors of Linear modules are not checked (how they are stored is unknown); the "
                              "format, index and other checks still ran.",
                              "Audit with a kimi-audit that implements the scheme, or use fp8 / pack-quantized."),
    "LAYOUT_UNSUPPORTED": Rule("warning", "config.json describes a model outside the DeepseekV3 family",
                               "Only the format, index and file checks ran: no tensor was checked against a layout.",
                               "Point the audit at a DeepseekV3 / Kimi-K2 checkpoint, or read the other checks "
                               "only."),
    "TENSORS_RESPELLED": Rule("error", "a module family stored under another spelling than the release's",
                              "Tensors missing and tensors unexpected that differ in one name segment the same way "
                              "(a writer's `gate_proj` for the release's `w1`): one finding for the family.",
                              "Rename the tensors as the release names them, or write them with the release's "
                              "conventions."),
    "MTP_STAGES_FROM_FILES": Rule("info", "the shards hold more multi-token-prediction stages than config.json "
                                  "declares, and the release's loaders read them all",
                                  "DeepSeek-V4-Flash-0731's config declares one MTP stage; the release stores three "
                                  "DSpark stages (`mtp.0..2`), which DSpark's loaders read. The stored count is "
                                  "audited, said once.",
                                  "None needed; a writer may set num_nextn_predict_layers to the stored count."),
    "TENSORS_UNDESCRIBED": Rule("info", "tensors of a part of the release that the architecture's description "
                                "leaves out: stored, not checked",
                                "The release stores a part no source this tool reads describes (DeepSeek-V4's "
                                "multi-token-prediction module `mtp.N.*`): its tensors are counted in one finding "
                                "and not checked against a layout.",
                                "None needed; check that part with the release's own loader."),
    "TENSOR_DUPLICATE": Rule("error", "the same tensor in two shards",
                           "Two shards hold a tensor of the same name; which one loads is undefined.", LAYOUT_HELP),
    "TENSOR_MISSING": Rule("error", "a tensor the config implies is in no shard",
                         "modeling_deepseek.py creates this parameter; no shard holds it, so it loads "
                         "uninitialised.", LAYOUT_HELP),
    "CONFIG_DISAGREES": Rule("error", "a config value the stored tensors contradict",
                           "Two or more tensors are off in one dimension only, each storing the same value where "
                           "the config's key (an expert count, an intermediate size, the vocabulary; a GGUF's "
                           "metadata key) puts its own: one cause, the key named, the shape findings counted "
                           "beneath.", LAYOUT_HELP),
    "TENSOR_UNEXPECTED": Rule("error", "a tensor the config does not account for",
                            "No module the config builds has this tensor; loaders warn and drop it.", LAYOUT_HELP),
    "DTYPE_MISMATCH": Rule("error", "a parameter with the wrong dtype",
                         "The stored dtype is not the one the layout expects for this parameter.", LAYOUT_HELP),
    "SHAPE_MISMATCH": Rule("error", "a parameter with the wrong shape",
                         "The stored shape is not the one config.json implies for this parameter.", LAYOUT_HELP),
    "SCALE_MISSING": Rule("error", "an FP8 weight without its `weight_scale_inv`",
                        "An F8_E4M3 weight has no block scale: it cannot be dequantized.", SCALE_HELP),
    "SCALE_ORPHAN": Rule("error", "a `weight_scale_inv` without its weight",
                       "A block scale whose weight is not stored.", SCALE_HELP),
    "SCALE_UNEXPECTED": Rule("error", "a scale for a weight that is not FP8 in this layout",
                           "A block scale for a weight the layout keeps in BF16.", SCALE_HELP),
    "SCALE_DTYPE": Rule("error", "a scale with the wrong dtype",
                      "A weight_scale_inv that is not F32.", SCALE_HELP),
    "SCALE_SHAPE": Rule("error", "a scale with the wrong shape",
                      "A weight_scale_inv that is not [ceil(out/128), ceil(in/128)] for its weight.", SCALE_HELP),
    "SCALE_SHARD_SPLIT": Rule("info", "a scale in another shard than its weight (loaders cope; per-shard "
                            "converters do not)",
                            "The published DeepSeek-V3 itself does it and its loaders pair weight and scale through "
                            "the index; converters that dequantize shard by shard do not find this scale.",
                            "Re-shard so that each weight_scale_inv sits in its weight's shard."),
    "BUFFER_DTYPE": Rule("info", "a stored buffer of unexpected dtype: info for `rotary_emb.inv_freq`, an error for "
                         "one holding trained state (DeepSeek-V4's `ffn.gate.tid2eid`)",
                         "A rotary buffer is recomputed on load; a trained buffer is read as it is.", LAYOUT_HELP),
    "BUFFER_SHAPE": Rule("info", "a stored buffer of unexpected shape: info for `rotary_emb.inv_freq`, an error for "
                         "one holding trained state (DeepSeek-V4's `ffn.gate.tid2eid`)",
                         "A rotary buffer is recomputed on load; a trained buffer is read as it is.", LAYOUT_HELP),
    "ROUTER_DTYPE": Rule("info", "a router tensor in another float dtype than the layout's (writer variance)",
                         "F32 router weights in a BF16/F16 checkpoint (transformers keeps them F32 on load), or a "
                         "BF16/F16 e_score_correction_bias (transformers casts it to the config's dtype; it lost "
                         "the precision DeepSeek keeps, which loaders cannot restore).",
                         "Store the router's correction bias in F32, from the original weights, to keep its bits."),
    "WRITER_DTYPE": Rule("info", "a norm's gain or a bias in another float dtype than the release's, which "
                         "config.json's dtype explains (writer variance)",
                         "A 1-D parameter outside the Linear weights (an RMSNorm or LayerNorm gain, a bias) stored in "
                         "the config's dtype or in F32 where the release stores another float dtype, as "
                         "transformers writes DeepSeek-V3.2's F32 norms in a BF16 model; loaders cast it.",
                         "Nothing to do to load it; re-export from the release to keep its exact dtypes."),
    "LAYOUT_DIALECT": Rule("info", "the checkpoint spells the architecture's names in a known writer's dialect",
                           "Every tensor is named as one writer spells the release's tree (transformers 5.x "
                           "re-saving kimi_k25: `language_model.model.blocks.N` for `...layers.N`; deepseek_v4 "
                           "with `model.` before its names; kimi_linear's dense MLP under `block_sparse_moe`); it "
                           "was audited against the same layout so spelled. A mixture of spellings is reported "
                           "tensor by tensor.",
                           "Loaders of the release (vLLM, SGLang) read its own names: re-save with those names "
                           "(or load with transformers) if they do not read this one."),
    "MTP_ABSENT": Rule("warning", "config declares multi-token-prediction layers of which no tensor is stored",
                     "num_nextn_predict_layers > 0 but the MTP layer is not in the shards (transformers drops it); "
                     "speculative decoding with it is not possible. Its tensors are covered by this finding.",
                     "Ship the MTP layer's tensors, or set num_nextn_predict_layers to 0."),
    # Values: audit --values, tensor, rmsnorm.
    "VALUE_NAN": Rule("error", "a gain, router bias, scale or other float tensor up to 256 KiB holds NaN (`verify`: "
                      "any float tensor; a GGUF block's scale, MXFP4's E8M0 0xFF included)",
                    "A tensor holds NaN values.", VALUES_HELP),
    "EXPERT_ID_RANGE": Rule("error", "a hash-routing table (DeepSeek-V4's `tid2eid`) holds an expert id outside "
                            "0..experts-1",
                            "A token routed by that entry reads past the model's stacked experts (llama.cpp gathers "
                            "the experts by these ids).", VALUES_HELP),
    "VALUE_INF": Rule("error", "a gain, router bias, scale or other float tensor up to 256 KiB holds ±Inf "
                      "(`verify`: any float tensor; a GGUF block's scale)",
                    "A tensor holds infinite values.", VALUES_HELP),
    "SCALE_NOT_POSITIVE": Rule("error", "a weight's block, group or global scale, or an input or KV-cache scale, "
                               "≤ 0",
                             "Dequantized weights of that block would be zero or sign-flipped; an activation or "
                             "KV cache scaled by it would be.", VALUES_HELP),
    "SCALE_NEGATIVE": Rule("error", "a bitsandbytes absmax or SCB scale < 0",
                           "An absolute maximum is never negative: the block's dequantized weights would be "
                           "sign-flipped.", VALUES_HELP),
    "QUANT_STATE_INVALID": Rule("error", "a bitsandbytes serialized quant_state that is not what its module needs",
                                "Its JSON must name the quant_type its tensor name gives, a positive blocksize and "
                                "a shape of the module's out x in; bitsandbytes rebuilds the weight from it.",
                                VALUES_HELP),
    "SCALE_ZERO": Rule("error", "an MLX or GPTQ group scale of 0",
                       "Every weight of that group would collapse to one value; neither mx.quantize nor GPTQ writes a "
                       "zero scale.",
                       VALUES_HELP),
    "SCALE_NOT_UE8M0": Rule("error", "`scale_fmt: ue8m0` and a `weight_scale_inv` holds scales that are not exact "
                            "powers of two",
                            "DeepSeek-V3.1 and later expect every FP8 block scale to be a power of two (UE8M0); one "
                            "finding per tensor with the count and the first offending value; a warning for "
                            "self_attn.o_proj, whose scales break this in the published V3.1 release.", VALUES_HELP),
    "WEIGHT_SHAPE_MISMATCH": Rule("error", "an INT4 module's `weight_shape` does not hold the [out, in] its config "
                                  "implies",
                                  "compressed-tensors decompresses weight_packed to weight_shape; any other value "
                                  "than the config's [out, in] gives a wrong-shaped weight.", VALUES_HELP),
    "GAIN_ALL_ZERO": Rule("error", "an RMSNorm gain that is all zeros",
                        "The normalized output is identically zero.", VALUES_HELP),
    "VALUE_UNREADABLE": Rule("error", "a small tensor's bytes could not be read",
                           "The values pass could not fetch this tensor's bytes.",
                           "Check the source and run `audit --values` again."),
    "DATA_NOT_PRESENT": Rule("info", "small tensors lying in a local file's sparse holes: not checked (`audit "
                             "--values`, info); `verify`: a file's sparse holes, data not present (error)",
                             "A sparse hole reads as zeros but holds no data (a header-only or partial copy). `audit "
                             "--values` does not check the small tensors in holes (one info covers them all); "
                             "`verify` neither reads nor hashes a file's holes, and fails it (one error a file).",
                             "Download the whole shards (`kimi-audit download`) and run the command again."),
    "VALUES_SKIPPED": Rule("info", "a \"small\" tensor over 64 MB, not fetched",
                         "The values pass skips small-class tensors over 64 MB.",
                         "Check it with `kimi-audit tensor SOURCE NAME`."),
    "VALUES_CHECKED": Rule("info", "how many small tensors and bytes the pass read",
                         "Summary of the values pass: tensors checked and bytes fetched.", "Nothing to do."),
    # Release gates: audit --expect-params N, --expect-revision SHA.
    "PARAMS_GATE": Rule("error", "the parameter count (scales and buffers excluded) is not N",
                      "--expect-params: the parameters counted from the headers differ from the expected count.",
                      GATE_HELP),
    "REVISION_GATE": Rule("error", "the resolved commit does not start with SHA, or the source has no revision",
                        "--expect-revision: the audited commit is not the expected one (a local directory records "
                        "no commit).", GATE_HELP),
    # Verify: kimi-audit verify, every byte read.
    "FILE_HASH_MISMATCH": Rule("error", "a file's sha256 differs from its reference (HF cache blob name, the Hub's "
                               "LFS sha256, or --manifest); names the tensors that differ when the manifest lists "
                               "them",
                               "The bytes on disk (or served) are not the bytes published: a corrupted download "
                               "(huggingface_hub issue 3643: complete size, wrong content), a tampered or "
                               "re-exported file.", VERIFY_HELP),
    "TENSOR_HASH_MISMATCH": Rule("error", "a tensor's sha256 differs from the manifest's",
                                 "Read in a second pass of a file whose sha256 differs: the tensors whose bytes are "
                                 "not the manifest's (absent or unlisted tensors included).", VERIFY_HELP),
    "FILE_ABSENT": Rule("error", "a file the reference lists (the Hub at the commit, or the manifest) is not there",
                        "The copy lacks a file of the model: an interrupted or filtered download.", VERIFY_HELP),
    "FILE_UNLISTED": Rule("error", "a file in the checkpoint that the reference does not list (a warning against "
                          "the Hub's listing, or with --ignore-unlisted)",
                          "A file the manifest (or the Hub listing at the commit) does not have: left over, added, "
                          "or the reference is of another revision. A manifest that does not cover the checkpoint "
                          "certifies none of it, as model_signing's verify says.",
                          "Remove the stray file, or write the manifest again from the intended copy."),
    "MANIFEST_REVISION": Rule("error", "the manifest records another revision than the checkpoint's",
                              "The manifest was written on a copy of another commit: its digests are not this "
                              "checkpoint's.", "Verify against the manifest of this revision (or the Hub's LFS "
                              "sha256: `kimi-audit verify REPO@REV`)."),
    "MANIFEST_NOT_WRITTEN": Rule("error", "--write-manifest refused: a file was not read whole or differs from a "
                                 "reference",
                                 "A manifest is written only of a copy that verifies: every file read whole (no "
                                 "sparse holes, no read errors) and equal to every reference given.",
                                 "Fix the copy first (download the files named), then write the manifest."),
    "NO_REFERENCE": Rule("info", "files hashed with no reference sha256 to compare with",
                         "A plain directory carries no digests: its files' sha256 were computed and reported, their "
                         "headers and values checked, but nothing says what the bytes should be.",
                         "Verify the copy against the Hub (`kimi-audit verify REPO@REV --local-dir DIR`) or a "
                         "manifest (`--manifest FILE`)."),
    "FILE_CHANGED": Rule("error", "a file changed while verify read it (appended, written, cut or replaced)",
                         "Its size, mtime or inode after the read differ from those it had when verify planned and "
                         "opened it: the bytes hashed are of no one state of the file, so no sha256 is reported.",
                         "Verify again when nothing writes to the checkpoint (a download or copy still running?)."),
    "CACHE_FILE_NOT_BLOB": Rule("error", "a file of an HF cache snapshot is not a link to one of its blobs",
                                "huggingface_hub writes every file of a snapshot as a link into the repo's blobs/ "
                                "(named by the file's sha256); a regular file there was put in a link's place: its "
                                "bytes are not the ones the cache stored.",
                                "Download the file again (`kimi-audit download REPO --include NAME`), or verify the "
                                "snapshot against the Hub (`kimi-audit verify REPO@REV`)."),
    "FP8_NAN": Rule("error", "an F8_E4M3 weight holds NaN codes (bytes 0x7F / 0xFF)",
                    "E4M3 has no infinities; 0x7F and 0xFF are its NaNs, which no quantizer writes: every product "
                    "with them is NaN. Counted, with the first element's offset.", WEIGHTS_HELP),
    "FP8_SATURATED": Rule("info", "FP8 values at ±448, counted (block quantization puts each block's maximum "
                          "there)",
                          "±448 is E4M3's largest finite value; DeepSeek's block quantization scales each "
                          "128×128 block so that its maximum lands there, so about one or two per block is normal.",
                          "Nothing to do; a count far above one per block suggests clipping during quantization."),
    "BLOCK_ALL_ZERO": Rule("error", "an FP8 weight with an all-zero 128×128 block",
                           "Every value of a whole quantization block is zero: a zeroed or unwritten region (a block "
                           "of real weights is never all zeros). Counted, with the first block.", WEIGHTS_HELP),
    # The audit itself.
    "IGNORE_UNUSED": Rule("info", "an `--ignore` rule that matched no finding",
                        "An --ignore CODE[:GLOB] rule accepted nothing: the deviation it names is gone or the "
                        "glob is wrong.", "Remove the stale --ignore rule, or fix its glob."),
}
RULES.update(GGUF_RULES)
RULES.update(SAME_MODEL_RULES)
RULES.update(MISTRAL_RULES)


def rule(code: str) -> Rule:
    """The rule of a code; a generic one for a code this table lacks (tests keep it complete)."""
    return RULES.get(code) or Rule("warning", code, f"Finding {code}.", "See docs/reference.md, Finding codes.")
