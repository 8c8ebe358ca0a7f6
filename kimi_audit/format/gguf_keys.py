"""The GGUF value types llama.cpp reads metadata keys with: a key stored in any other type stops the load.

gguf.cpp stores each key with its type; llama.cpp's loader reads the keys it needs through typed getters that
compare the stored type with the one asked for and throw on any other (llama.cpp 0c1e5709,
src/llama-model-loader.cpp `GKV::get_kv`: "key %s has wrong type %s but expected type %s"; `get_key_or_arr`
takes a scalar or an INT32 / UINT32 / BOOL array; src/llama-vocab.cpp refuses a token list, merges or token types
that are not arrays of STRING / INT32, lines 2008, 2466-2498). This module holds the container-wide keys (the
architecture, the tokenizer); an architecture's own keys are its GGUF dialect's (`GgufDialect.key_types`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimi_audit.findings import Finding, error
from kimi_audit.format.columns import label

VALUE_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
                    8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}
"""gguf.cpp's gguf_type."""
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
UNDESCRIBED = "LAYOUT_UNSUPPORTED"
"""The finding of hyperparameters llama.cpp loads and no layout of this tool describes (a warning: exit 3)."""

KeyType = tuple[tuple[int, int | None], ...]
"""The (value type, array element type or None) pairs a key may be stored as."""
U32: KeyType = ((UINT32, None),)
F32: KeyType = ((FLOAT32, None),)
FLAG: KeyType = ((BOOL, None),)
STR: KeyType = ((STRING, None),)
STRINGS: KeyType = ((ARRAY, STRING),)
U32_OR_PER_LAYER: KeyType = ((UINT32, None), (ARRAY, UINT32), (ARRAY, INT32), (ARRAY, BOOL))
"""`get_key_or_arr`: one value for every layer, or an array of them (llama_model_loader::get_arr)."""
F32_OR_PER_LAYER: KeyType = ((FLOAT32, None), (ARRAY, FLOAT32))
"""`get_key_or_arr` into floats: one value, or an array of FLOAT32 (get_arr refuses any other element type)."""


def per_layer(t: KeyType) -> bool:
    """A key read with `get_key_or_arr`: a scalar, or an array of one value per layer."""
    return any(item is None for _, item in t) and any(kind == ARRAY for kind, _ in t)


def one_value(value: Any, key: str) -> Any:
    """A `get_key_or_arr` key's one value: a scalar, or an array whose values agree. An array whose values differ
    by layer llama.cpp loads, but no layout this tool derives has per-layer widths: GgufKeyError whose finding is
    LAYOUT_UNSUPPORTED (inconclusive, not a fault)."""
    from kimi_audit.errors import GgufKeyError

    values = getattr(value, "values", value)
    if not isinstance(values, (list, tuple)):
        return values
    if len(set(values)) != 1:
        raise GgufKeyError(f"{key} differs by layer ({list(values)[:6]}): llama.cpp loads such a model, kimi-audit "
                           "describes none, and no tensor was checked against a layout", key, UNDESCRIBED)
    return values[0]


def wrong_lengths(kv: Mapping[str, Any], table: Mapping[str, KeyType], layers: int) -> list[tuple[str, int]]:
    """(key, its length) for each `get_key_or_arr` key stored as an array of another length than the layers:
    llama_model_loader::get_key_or_arr throws "key %s has wrong array length; expected %u, got %u"
    (src/llama-model-loader.cpp lines 473-478)."""
    out = []
    for key, t in table.items():
        count = getattr(kv.get(key), "count", None)
        if per_layer(t) and isinstance(count, int) and count != layers:
            out.append((key, count))
    return out

LOADER_KEYS: Mapping[str, KeyType] = {
    "general.architecture": STR,
    "general.name": STR,
    "general.file_type": U32,
    "tokenizer.ggml.model": STR,
    "tokenizer.ggml.pre": STR,
    "tokenizer.ggml.tokens": STRINGS,
    "tokenizer.ggml.merges": STRINGS,
    "tokenizer.ggml.token_type": ((ARRAY, INT32),),
    "tokenizer.ggml.scores": ((ARRAY, FLOAT32), (ARRAY, INT32)),
    **{f"tokenizer.ggml.{t}_token_id": U32 for t in ("bos", "eos", "eot", "eom", "unknown", "seperator",
                                                        "padding", "mask")},
    **{f"tokenizer.ggml.add_{t}_token": FLAG for t in ("bos", "eos", "sep")},
}
"""The keys llama.cpp reads for every model (llama-model-loader.cpp, llama-model.cpp:1313 general.name,
llama-vocab.cpp) -> their types."""
SPLIT_KEYS: Mapping[str, KeyType] = {"split.no": ((2, None),), "split.count": ((2, None),),
                                     "split.tensors.count": ((INT32, None),)}
"""A split part's keys: split.no and split.count read as uint16 (llama-model-loader.cpp:596-603, gguf.cpp's
gguf_get_val_u16 asserts the type), split.tensors.count into an int (llama-model-loader.cpp:663): INT32."""
NO_VOCAB = ("no_vocab", "none")
"""tokenizer.ggml.model values with no token list (llama-vocab.cpp:1949)."""


def loader_required(kv: Mapping[str, Any]) -> tuple[str, ...]:
    """The container-wide keys llama.cpp cannot load a model without: its architecture, its tokenizer model
    (llama-vocab.cpp:1944) and, unless that says there is no vocabulary, its token list (llama-vocab.cpp:2462)."""
    vocab = () if kv.get("tokenizer.ggml.model") in NO_VOCAB else ("tokenizer.ggml.tokens",)
    return ("general.architecture", "tokenizer.ggml.model", *vocab)


def stored_type(value: Any, vtype: int) -> tuple[int, int | None]:
    """A key's (value type, array element type or None) as the part stores it."""
    return (vtype, getattr(value, "item_type", None)) if vtype == ARRAY else (vtype, None)


def type_name(stored: tuple[int, int | None]) -> str:
    vtype, item = stored
    name = VALUE_TYPE_NAMES.get(vtype, str(vtype))
    return f"{name} of {VALUE_TYPE_NAMES.get(item, str(item))}" if item is not None else name


def mistyped(kv: Mapping[str, Any], types: Mapping[str, int],
             table: Mapping[str, KeyType]) -> list[tuple[str, str, str]]:
    """(key, the type stored, the types llama.cpp reads it as) for each key of `table` stored in another type."""
    out = []
    for key, allowed in table.items():
        if key not in types:
            continue
        stored = stored_type(kv.get(key), types[key])
        if stored not in allowed:
            out.append((key, type_name(stored), " or ".join(type_name(t) for t in allowed)))
    return out


TOKENIZER_MODELS = ("no_vocab", "none", "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "test",
                    "plamo2", "gemma4")
"""The tokenizer.ggml.model values llama.cpp 0c1e5709 knows (llama-vocab.cpp:1949-2151; any other: "unknown
tokenizer")."""


def loader_value_findings(kv: Mapping[str, Any], part: str | None) -> list[Finding]:
    """The tokenizer's values llama.cpp's vocabulary loader refuses: an unknown tokenizer model, token types or
    scores not one per token (llama-vocab.cpp:2483-2502, "Index out of array bounds")."""
    out: list[Finding] = []
    model = kv.get("tokenizer.ggml.model")
    if isinstance(model, str) and model not in TOKENIZER_MODELS:
        out.append(error("GGUF_KEY_VALUE", f"{part}: tokenizer.ggml.model is {label(model)}, a tokenizer llama.cpp "
                         f"does not know (it knows {', '.join(TOKENIZER_MODELS)}): \"unknown tokenizer\"",
                         tensor="tokenizer.ggml.model", shard=part))
    tokens = getattr(kv.get("tokenizer.ggml.tokens"), "count", None)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        n = getattr(kv.get(key), "count", None)
        if tokens is not None and n is not None and n != tokens:
            out.append(error("GGUF_KEY_VALUE", f"{part}: {key} holds {n:,} values for {tokens:,} tokens: llama.cpp "
                             "reads one per token (\"Index out of array bounds\")", tensor=key, shard=part,
                             expected=tokens, actual=n))
    return out


def vocab_findings(kv: Mapping[str, Any], arch: str,
                   stored: Mapping[str, tuple[int, ...]]) -> tuple[int | None, list[Finding]]:
    """The vocabulary llama.cpp builds the model with (the token list's length, else `{arch}.vocab_size`; where the
    file says neither, token_embd's rows), and GGUF_VOCAB_MISMATCH where token_embd's rows are another number:
    llama.cpp refuses the file (its embedding is created [n_embd, n_vocab]). One rule for every architecture's
    dialect."""
    tokens = getattr(kv.get("tokenizer.ggml.tokens"), "count", None)
    size = kv.get(f"{arch}.vocab_size")
    vocab = tokens or (size if isinstance(size, int) and not isinstance(size, bool) else None)
    embed = stored.get("token_embd.weight")
    if vocab is None or not embed or embed[0] == vocab:
        return (embed[0] if vocab is None and embed else vocab), []
    return vocab, [error("GGUF_VOCAB_MISMATCH", f"the token list holds {vocab:,} tokens, token_embd has "
                         f"{embed[0]:,} rows: llama.cpp refuses the file", tensor="token_embd.weight",
                         expected=vocab, actual=embed[0])]
