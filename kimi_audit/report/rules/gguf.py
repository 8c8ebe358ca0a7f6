"""The GGUF container's finding codes (llama.cpp's files: one part, the split set, the metadata as llama.cpp reads
it) and a GGUF set's against the checkpoint it was converted from, as rules (report.rules merges them)."""

from __future__ import annotations

from kimi_audit.report.rules.rule import Rule

GGUF_HELP = ("Download the GGUF set again (every part, from one upload), or re-convert it with llama.cpp's current "
             "convert_hf_to_gguf.py and llama-quantize; llama-gguf-split --merge / --split rewrites a set's parts.")


GGUF_RULES: dict[str, Rule] = {
    # GGUF (llama.cpp): one part's container, the split set, the metadata.
    "GGUF_INVALID": Rule(
        "error", 'not a readable GGUF part: magic, version, a count, a key or a tensor name the format does '
        'not allow, or a header cut short',
        'The part is not a GGUF file llama.cpp can open (wrong magic, a version other than 2 or 3, a '
        'big-endian file, counts larger than the file, a header that ends early or passes 256 MB, a '
        'tensor name over 63 bytes).', GGUF_HELP),
    "GGUF_TYPE_UNKNOWN": Rule("error", "a tensor's ggml type is not one llama.cpp defines (`verify`: or one "
        "its --check-tensors refuses, Q8_1)",
        "The tensor's type id is none of ggml's types (gguf-py GGMLQuantizationType): llama.cpp "
        "refuses the file; or (verify) Q8_1, an intermediate of ggml's dot products that "
        "ggml_validate_row_data refuses as an invalid type.", GGUF_HELP),
    "GGUF_ROW_BLOCK": Rule("error", "a row is not whole blocks of the tensor's ggml type",
        "The tensor's fastest dimension is not a multiple of its type's block (32 for Q8_0, 256 for "
        'the K-quants): llama.cpp refuses it.', GGUF_HELP),
    "GGUF_MISALIGNED": Rule("error", "a tensor's offset is not a multiple of `general.alignment`",
        "The tensor's data does not start at a multiple of the file's alignment (32 by default): "
        'llama.cpp refuses it.', GGUF_HELP),
    "GGUF_OFFSET": Rule("error", "tensors not laid end to end in the order the part lists them",
        "gguf.cpp requires each tensor's data to begin where the previous one's, padded to the alignment, "
        "ends (\"tensor '%s' has offset %zu, expected %zu\") and refuses the part otherwise. Two tensors whose "
        "offsets were swapped (their data under each other's names) or a gap between tensors read as this; one "
        "finding per part, the first tensor named and the rest counted.", GGUF_HELP),
    "GGUF_KEY_VALUE": Rule("error", "a metadata value llama.cpp's loader refuses or asserts against",
        "llama.cpp's loader asserts on the hyperparameters (more experts routed than there are, expert groups that "
        "do not divide the experts, more NextN layers than blocks, a vocab_size token_embd is not created with), "
        "refuses an unknown tokenizer model or token types / scores not one per token, and a DSA model's indexer "
        "types not one per block: the key named, no layout derived from a model llama.cpp would not load. In an "
        "mmproj, what tools/mtmd refuses: a projector type clip.cpp does not know, no vision encoder, image_mean / "
        "image_std of fewer than 3 values, a UINT32 over INT32_MAX, a projector type's own (kimik25: a patch merge "
        "factor not over 1).",
        GGUF_HELP),
    "GGUF_KEY_TYPE": Rule("error", "a metadata key stored in another GGUF type than llama.cpp reads it with",
        "llama.cpp's loader reads each key with a typed getter (llama-model-loader.cpp GKV::get_kv: \"key %s "
        "has wrong type %s but expected type %s\"; tokenizer arrays through gguf_get_arr_str, which asserts): "
        "a key of another type stops the load. The key's value is not used.", GGUF_HELP),
    "GGUF_TRAILING_BYTES": Rule("error", 'bytes after the last tensor: the header does not describe the file',
        "The part holds bytes after its last tensor that llama.cpp never reads. llama.cpp's own writers leave "
        "none: a tensor whose type or shape was changed to one that reads fewer bytes (the last tensor's Q8_0 bytes "
        "read as Q6_K), or split parts joined with cat, which loads only part 1's tensors. llama-gguf-split "
        "--merge joins parts.", GGUF_HELP),
    "GGUF_QUANT_MIXED": Rule("warning", "a part stored in other ggml types than the set's other parts use",
        "Every weight role the part shares with the other parts (each layer's ffn_gate_exps, attn_q_b, ...) is "
        "in a type none of them uses for it: a part from another quant of the same model (part 2 of an IQ2_XXS "
        "set taken from the Q2_K set). Dynamic quants vary types by layer on purpose, hence a warning; held "
        "to the source with --against --values it is AGAINST_QUANT_MIXED, an error.", GGUF_HELP),
    "GGUF_PART_MISSING": Rule("error", 'a part of a split set is not there',
        "The set's split.count names a part that is not in the folder (or the --include selection): "
        'llama.cpp cannot load the model. Its tensors are not reported missing one by one.', GGUF_HELP),
    "GGUF_SPLIT_INVALID": Rule("error", 'split keys missing or disagreeing with each other or the file name',
        "A part's split.no / split.count disagree with its file name or the other parts, two parts "
        'claim the same number, or a part named as split holds no split keys: renamed parts, or a '
        'part from another set; or a projector (general.architecture clip) named as a part of the set.', GGUF_HELP),
    "GGUF_SPLIT_COUNT": Rule("error", '`split.tensors.count` is not the tensors the parts hold',
        'The parts together hold another number of tensors than split.tensors.count says (a stale '
        'count after a repack): llama.cpp refuses the set.', GGUF_HELP),
    "GGUF_KEY_MISSING": Rule("error", 'the metadata lacks a key llama.cpp needs (`general.architecture`, or one '
        'the stored tensors need)',
        'A part with no general.architecture names no model: llama.cpp cannot load it, and no tensor can be '
        'checked against a layout. Or attn_k_b / attn_v_b are stored (the MLA layout of llama.cpp #12801) '
        'but the *_mla key and value lengths are not: llama.cpp reads the head dimensions wrong.', GGUF_HELP),
    "GGUF_NOT_A_MODEL": Rule("info", "a GGUF file beside the model that is not a model (an imatrix, a projector not "
        "laid out): named for what it is",
        "llama-imatrix's output (no architecture; imatrix.* keys or *.in_sum2 / *.counts tensors, what "
        "common_imatrix_load reads) or an mmproj projector kimi-audit does not lay out (a type it does not describe, "
        "or one of several alternatives) sits beside the model: recognized as llama.cpp recognizes it, never by "
        "general.type (a model is any general.architecture but clip), not audited as a model, never a second set "
        "to choose.", GGUF_HELP),
    "GGUF_MISNAMED": Rule("warning", "a file beside the model named as a projector (mmproj-*) or an importance matrix "
        "(imatrix*) that is the other",
        "Its metadata, read as llama.cpp reads it, says the other kind: mtmd refuses an importance matrix passed as "
        "--mmproj, llama-quantize a projector passed as --imatrix. The model itself is audited as usual.",
        GGUF_HELP),
    "GGUF_PROJECTOR_WIDTH": Rule("error", "the mmproj projector's output width is not the model's embedding width",
        "The projector's output tensor (clip.cpp clip_n_mmproj_embd: mm.2's rows for kimik25) or its "
        "clip.vision.projection_dim is not the text model's ARCH.embedding_length: llama.cpp's mtmd refuses the pair "
        "(tools/mtmd/mtmd.cpp: \"mismatch between text model (n_embd = %d) and mmproj (n_embd = %d)\"). The projector "
        "of another model.", "Download the mmproj file published with this model (the same repo and quantization)."),
    "GGUF_GATING": Rule("error", 'the experts carry `exp_probs_b` but `expert_gating_func` is not sigmoid',
        "The routers have DeepSeek's correction bias (sigmoid routing) but the metadata has no "
        'sigmoid expert_gating_func: llama.cpp then routes by softmax and computes other logits, '
        'without a word. The config.json converted had no scoring_func.', GGUF_HELP),
    "GGUF_PRE_MLA": Rule("warning", 'attention stored as one `attn_kv_b` (a conversion before llama.cpp #12801)',
        'The conversion predates llama.cpp #12801 (attn_kv_b instead of attn_k_b / attn_v_b): it '
        "loads, without MLA's smaller KV cache.", GGUF_HELP),
    "GGUF_VOCAB_MISMATCH": Rule("error", "the token list's length is not `token_embd`'s rows",
        'The tokenizer lists another number of tokens than the embedding has rows (the first Kimi-K2 '
        'conversions, llama.cpp #14642): llama.cpp refuses the file.', GGUF_HELP),
    # GGUF against the checkpoint it was converted from (--against).
    "AGAINST_ARCHITECTURE": Rule(
        "error", 'the `--against` checkpoint is no architecture this GGUF is converted from',
        "The --against checkpoint's config.json names an architecture llama.cpp does not convert to "
        "this GGUF's general.architecture: it is not this GGUF's source.", GGUF_HELP),
    "AGAINST_METADATA": Rule(
        "error", "a metadata key differs from what the converter writes from the source's config.json",
        'A key the converter writes from config.json (layers, dimensions, experts, gating, RoPE '
        "scaling) holds another value than the source's config.json gives: converted from another "
        'config, or edited.', GGUF_HELP),
    "AGAINST_UNACCOUNTED": Rule(
        "error", 'source tensors that no GGUF tensor holds',
        'Tensors of the source checkpoint (FP8 scales, rotary buffers and MTP layers excepted: the '
        'converter drops them) are in no tensor of the GGUF set.', GGUF_HELP),
    "AGAINST_TOTAL": Rule(
        "error", "the GGUF's element total is not the source's",
        "The GGUF set holds another number of elements than the source's tensors the converter keeps:"
        ' a different model.', GGUF_HELP),
    "AGAINST_VALUES": Rule(
        "error", "a part's tensors differ from what the converter writes from the source",
        'Tensors stored F32, F16, BF16 or Q8_0 in this part are not the bytes ggml writes for the '
        "source's values (dequantized as its format says): a part from another conversion or upload, "
        'which llama.cpp loads without a word.', GGUF_HELP),
    "AGAINST_UNREAD": Rule(
        "error", "`--against --values`: tensors whose values could not be read to compare",
        "The source's values for these tensors (a GGUF set's, or a quantized release's) could not be read or "
        "dequantized (a sparse hole in a "
        "header-only copy, a shard cut short, a shape its format does not store, not enough memory): their bytes "
        "were not compared, and the comparison is no PASS. One finding, the first tensor and its reason named.",
        GGUF_HELP),
    "AGAINST_HELD": Rule(
        "info", '`--against`: what the GGUF set was held to (metadata, tensors accounted for, element totals)',
        "Said on every --against run, a PASS included: the source, how many metadata keys and tensors were held "
        "to it, and whether the values were compared (--values).", GGUF_HELP),
    "AGAINST_CHECKED": Rule(
        "info", '`--against --values`: how many tensors were compared, and the worst error per quantized type',
        "The tensors compared with the source's values, of all the GGUF tensors and per file (the model's parts, "
        "the mmproj beside it: the vision tower as the converter writes it): F32, F16, BF16 and Q8_0 byte for byte "
        "with what ggml writes; every other ggml type dequantized (gguf-py) and held to its type's relative error "
        "bound, the worst tensor of each type named.", GGUF_HELP),
    "AGAINST_QUANT_MIXED": Rule(
        "error", '`--against --values`: a part in another quant\'s types than the rest of the set',
        "The part's values are the source's, within their types' bounds, but in types none of the other parts "
        "uses for the same roles (GGUF_QUANT_MIXED): a part from another upload of the same model.", GGUF_HELP),
    "AGAINST_NOT_COMPARED": Rule(
        "info", 'tensors not compared with the source, each kind with its reason',
        "These tensors' types are none the installed gguf-py dequantizes (a type newer than it), or the "
        "converter's transform into them is not modelled here (the reason says which): their values were not "
        'compared with the source. Never a tensor skipped without a word.', GGUF_HELP),
}
