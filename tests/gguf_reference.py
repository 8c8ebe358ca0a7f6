"""The mutation oracle's reference for GGUF: what llama.cpp 0c1e5709 refuses when it loads a model.

gguf-py's GGUFReader (the installed `gguf` package) reads a GGUF leniently: it does not hold a file to all of
gguf.cpp's load rules (a tensor offset that is not the running padded size, a general.alignment of another type,
a tensor name of 64 bytes or more, ...), nor to the model loader's typed getters. This module is those rules,
each cited by file and line of llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (the commit that wrote
tests/data/gguf, PROVENANCE.json; its source is the vendor/llama.cpp folder of the llama-cpp-python 0.3.36 sdist):

- ggml/src/gguf.cpp `gguf_init_from_reader` (lines 460-932) and the reader it uses (232-428): one file;
- src/llama-model-loader.cpp (GGUFMeta::GKV, get_key, the split set), src/llama-model-loader.h:47 (data within the
  file), src/llama-model.cpp and src/models/deepseek2.cpp (the typed hyperparameter getters), src/llama-vocab.cpp
  (the tokenizer keys): the model.

`parse(buf)` reads one part under gguf.cpp's rules and raises `Refused` naming the rule; it also records where
every header field sits (`Part.fields`), which the mutator uses on the clean fixtures. `loader_check(parts, ...)`
applies the loader's rules to a set. Every read is bounded by the bytes left, as gguf.cpp's own (272, 288, 295,
352): a count mutated to 2**40 is refused at once, never walked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

GGUF_CPP = "ggml/src/gguf.cpp"
LOADER = "src/llama-model-loader.cpp"

# gguf_type (ggml/include/gguf.h): 0 UINT8 .. 12 FLOAT64; 8 STRING, 9 ARRAY.
TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
              8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}
TYPE_IDS = {v: k for k, v in TYPE_NAMES.items()}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<b", 10: "<Q", 11: "<q", 12: "<d"}

GGUF_VERSION = 3  # ggml/include/gguf.h:42
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024  # gguf.cpp:20
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024  # gguf.cpp:21
GGML_MAX_NAME = 64  # ggml/include/ggml.h:229
GGML_MAX_DIMS = 4  # ggml/include/ggml.h:222
GGML_TYPE_COUNT = 43  # ggml/include/ggml.h:433
GGUF_DEFAULT_ALIGNMENT = 32
INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1

# ggml_type -> (block size, type size): the types of ggml/include/ggml.h:390-433 (4, 5, 31-33, 36-38 are removed:
# blck_size 0, refused by gguf.cpp:740), sizes as ggml.c's type_traits (gguf-py's GGML_QUANT_SIZES of the same
# commit; the installed gguf-py predates Q2_0 = 42).
QK_K = 256
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 2 + 2 + QK_K // 16 + QK_K // 4), 11: (256, 2 + QK_K // 4 + QK_K // 8 + 12),
    12: (256, 2 + 2 + QK_K // 2 + 12), 13: (256, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    14: (256, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16), 15: (256, 4 + QK_K + QK_K // 8),
    16: (256, 2 + QK_K // 4), 17: (256, 2 + QK_K // 4 + QK_K // 32), 18: (256, 2 + QK_K // 4 + QK_K // 8),
    19: (256, 2 + QK_K // 8 + QK_K // 16), 20: (32, 18), 21: (256, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    22: (256, 2 + QK_K // 4 + QK_K // 16), 23: (256, 2 + 2 + QK_K // 2 + QK_K // 64),
    24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, QK_K // 8 + QK_K // 16 + QK_K // 32),
    30: (1, 2), 34: (256, 2 + 4 * 13), 35: (256, 2 + 64), 39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}


class Refused(Exception):
    """The reference refuses the file: the message names the rule and where llama.cpp states it."""


@dataclass
class Kv:
    vtype: int
    value: Any = None
    """A scalar's value or a string (decoded with replacement); None for an array."""
    item: int | None = None
    count: int = 1


@dataclass
class TensorInfo:
    name: str
    ne: tuple[int, ...]
    """The n_dims dimensions as stored (ggml order, fastest first)."""
    type_id: int
    offset: int

    def nbytes(self) -> int:
        blck, size = GGML_TYPES[self.type_id]
        n = 1
        for d in self.ne:
            n *= d
        return n // blck * size


@dataclass
class Part:
    version: int
    kv: dict[str, Kv]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    data_size: int
    file_size: int
    fields: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Header field name -> (byte offset, struct format): where a mutation of that one field goes."""


class _Reader:
    """gguf.cpp's gguf_reader (232-428): every read checked against the bytes left."""

    def __init__(self, buf: bytes, fields: dict[str, tuple[int, str]]) -> None:
        self.buf = buf
        self.pos = 0
        self.fields = fields

    def remain(self) -> int:
        return len(self.buf) - self.pos

    def read(self, fmt: str, name: str | None = None) -> Any:
        size = struct.calcsize(fmt)
        if size > self.remain():  # gguf.cpp:272
            raise Refused(f"read past the end of the file ({GGUF_CPP}:272)")
        if name is not None:
            self.fields[name] = (self.pos, fmt)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, name: str | None = None) -> str:
        size = self.read("<Q", None if name is None else f"{name}.len")
        if size > GGUF_MAX_STRING_LENGTH:
            raise Refused(f"string length {size} exceeds maximum ({GGUF_CPP}:348)")
        if size > self.remain():
            raise Refused(f"string length {size} exceeds remaining file size ({GGUF_CPP}:352)")
        raw = self.buf[self.pos:self.pos + size]
        self.pos += size
        return raw.decode("utf-8", "surrogateescape")


def _read_value(r: _Reader, vtype: int, key: str, name: str) -> Any:
    if vtype == 8:
        return r.string()
    if vtype in SCALAR_FMT:
        v = r.read(SCALAR_FMT[vtype], name)
        return v != 0 if vtype == 7 else v  # bool: int8, nonzero is true (gguf.cpp:316-323)
    raise Refused(f"key '{key}' has invalid GGUF type {vtype} ({GGUF_CPP}:609)")


def parse(buf: bytes) -> Part:
    """One GGUF file under gguf_init_from_reader's rules (gguf.cpp:460-932), with no_alloc as the loader calls it."""
    fields: dict[str, tuple[int, str]] = {}
    r = _Reader(buf, fields)
    if r.remain() < 4 or buf[:4] != b"GGUF":  # gguf.cpp:466-487
        raise Refused(f"invalid magic characters ({GGUF_CPP}:482)")
    r.pos = 4
    version = r.read("<I", "version")
    if version == 0:
        raise Refused(f"bad GGUF version 0 ({GGUF_CPP}:494)")
    if version & 0xFFFF == 0:
        raise Refused(f"GGUF version {version} is extremely large ({GGUF_CPP}:506)")
    if version == 1:
        raise Refused(f"GGUFv1 is no longer supported ({GGUF_CPP}:511)")
    if version > GGUF_VERSION:
        raise Refused(f"GGUF version {version} > {GGUF_VERSION} ({GGUF_CPP}:515)")
    n_tensors = r.read("<q", "n_tensors")
    if n_tensors < 0 or n_tensors > SIZE_MAX // 336:  # gguf.cpp:526; sizeof(gguf_tensor_info) is over 300 bytes
        raise Refused(f"number of tensors is {n_tensors} ({GGUF_CPP}:526)")
    n_kv = r.read("<q", "n_kv")
    if n_kv < 0 or n_kv > SIZE_MAX // 56:  # gguf.cpp:537
        raise Refused(f"number of key value pairs is {n_kv} ({GGUF_CPP}:537)")

    kv: dict[str, Kv] = {}
    i = 0
    while i < n_kv:  # gguf.cpp:556; each pair consumes at least 12 bytes, so this ends at the file's end
        at = r.pos
        key = r.string()
        fields[f"kv[{key}].key_len"] = (at, "<Q")
        if not key:
            raise Refused(f"key {i} is empty ({GGUF_CPP}:571)")
        if key in kv:
            raise Refused(f"duplicate key '{key}' ({GGUF_CPP}:575)")
        vtype = r.read("<i", f"kv[{key}].type")
        item = None
        count = 1
        if vtype == 9:  # gguf.cpp:584-588
            item = r.read("<i", f"kv[{key}].item_type")
            count = r.read("<Q", f"kv[{key}].count")
        elem = item if item is not None else vtype
        if elem not in SCALAR_FMT and elem != 8:  # gguf.cpp:606-611 (an array of arrays included)
            raise Refused(f"key '{key}' has invalid GGUF type {elem} ({GGUF_CPP}:609)")
        if item is None:
            if vtype == 8:
                fields[f"kv[{key}].value_len"] = (r.pos, "<Q")
            value = _read_value(r, vtype, key, f"kv[{key}].value")
            kv[key] = Kv(vtype, value)
        else:
            if count > GGUF_MAX_ARRAY_ELEMENTS:
                raise Refused(f"array '{key}' of {count} elements > GGUF_MAX_ARRAY_ELEMENTS ({GGUF_CPP}:280)")
            unit = 8 if item == 8 else struct.calcsize(SCALAR_FMT[item])
            if r.remain() < count * unit:
                raise Refused(f"array '{key}' of {count} elements exceeds the file ({GGUF_CPP}:288-297)")
            if item == 8:
                for j in range(count):
                    if j == 0:
                        fields[f"kv[{key}][0].len"] = (r.pos, "<Q")
                    r.string()
            else:
                r.pos += count * unit
            kv[key] = Kv(9, None, item, count)
        i += 1

    align_kv = kv.get("general.alignment")
    if align_kv is not None and align_kv.vtype != 4:
        raise Refused(f"general.alignment must be UINT32, is {TYPE_NAMES.get(align_kv.vtype)} ({GGUF_CPP}:623)")
    alignment = GGUF_DEFAULT_ALIGNMENT if align_kv is None else align_kv.value
    if alignment == 0 or alignment & (alignment - 1):
        raise Refused(f"alignment {alignment} is not a power of 2 ({GGUF_CPP}:632)")

    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):  # gguf.cpp:642; each info consumes at least 24 bytes
        at = r.pos
        name = r.string()
        fields[f"tensor[{name}].name_len"] = (at, "<Q")
        if len(name.encode("utf-8", "surrogateescape")) >= GGML_MAX_NAME:
            raise Refused(f"tensor name {i} is too long ({GGUF_CPP}:657)")
        if name in seen:
            raise Refused(f"duplicate tensor name '{name}' ({GGUF_CPP}:665)")
        seen.add(name)
        n_dims = r.read("<I", f"tensor[{name}].n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise Refused(f"tensor '{name}' has {n_dims} dimensions > {GGML_MAX_DIMS} ({GGUF_CPP}:679)")
        ne = tuple(r.read("<q", f"tensor[{name}].ne[{j}]") for j in range(n_dims))
        if any(d < 0 for d in ne):
            raise Refused(f"tensor '{name}' has a negative dimension ({GGUF_CPP}:692)")
        full = list(ne) + [1] * (GGML_MAX_DIMS - n_dims)
        n = full[0]
        for d in full[1:]:  # gguf.cpp:702-718
            if d > 1 and INT64_MAX // d < n:
                raise Refused(f"tensor '{name}' shape overflows int64 ({GGUF_CPP}:706)")
            n *= d
        type_id = r.read("<i", f"tensor[{name}].type")
        if type_id < 0 or type_id >= GGML_TYPE_COUNT:
            raise Refused(f"tensor '{name}' has invalid ggml type {type_id} ({GGUF_CPP}:730)")
        blck, size = GGML_TYPES.get(type_id, (0, 0))
        if blck == 0 or full[0] % blck:
            raise Refused(f"tensor '{name}' row of {full[0]} is not a multiple of block size {blck} ({GGUF_CPP}:740)")
        if n // blck > SIZE_MAX // size:
            raise Refused(f"tensor '{name}' size in bytes overflows ({GGUF_CPP}:749)")
        offset = r.read("<Q", f"tensor[{name}].offset")
        tensors.append(TensorInfo(name, ne, type_id, offset))

    pos = r.pos
    if n_tensors > 0:
        pos = -(-pos // alignment) * alignment
        if pos > len(buf):
            raise Refused(f"failed to seek to beginning of data section ({GGUF_CPP}:781)")
    total = 0
    for t in tensors:  # gguf.cpp:791-820
        if t.offset != total:
            raise Refused(f"tensor '{t.name}' has offset {t.offset}, expected {total} ({GGUF_CPP}:796)")
        total += -(-t.nbytes() // alignment) * alignment
    return Part(version, kv, tensors, alignment, pos, total, len(buf), fields)


# --- the model loader ---------------------------------------------------------------------------------------------

VOCAB = "src/llama-vocab.cpp"
MODEL = "src/llama-model.cpp"
DS2 = "src/models/deepseek2.cpp"

# key (arch prefix as {arch}) -> (the one gguf type GKV<T>::get_kv accepts (llama-model-loader.cpp:164-171), required,
# where it is read). get_key_or_arr keys (an array of n_layer is also read there) are marked "or_arr".
TYPED_KEYS: dict[str, tuple[str, bool, str]] = {
    "general.architecture": ("STRING", False, f"{LOADER}:576"),
    "general.name": ("STRING", False, f"{MODEL}:1313"),
    "{arch}.context_length": ("UINT32", True, f"{MODEL}:1321"),
    "{arch}.embedding_length": ("UINT32", True, f"{MODEL}:1322"),
    "{arch}.block_count": ("UINT32", True, f"{MODEL}:1327"),
    "{arch}.expert_count": ("UINT32", False, f"{MODEL}:1331"),
    "{arch}.expert_used_count": ("UINT32 or_arr", False, f"{MODEL}:1333"),
    "{arch}.expert_group_count": ("UINT32", False, f"{MODEL}:1334"),
    "{arch}.expert_group_used_count": ("UINT32", False, f"{MODEL}:1335"),
    "{arch}.feed_forward_length": ("UINT32 or_arr", False, f"{MODEL}:1395"),
    "{arch}.attention.head_count": ("UINT32 or_arr", False, f"{MODEL}:1396"),
    "{arch}.attention.head_count_kv": ("UINT32 or_arr", False, f"{MODEL}:1404"),
    "{arch}.rope.scaling.original_context_length": ("UINT32", False, f"{MODEL}:1411"),
    "{arch}.rope.freq_base": ("FLOAT32", False, f"{MODEL}:1415"),
    "{arch}.rope.scaling.type": ("STRING", False, f"{MODEL}:1418"),
    "{arch}.rope.scaling.factor": ("FLOAT32", False, f"{MODEL}:1425"),
    "{arch}.attention.key_length": ("UINT32", False, f"{MODEL}:1440"),
    "{arch}.attention.value_length": ("UINT32", False, f"{MODEL}:1443"),
    "{arch}.rope.dimension_count": ("UINT32", False, f"{MODEL}:1448"),
    "{arch}.vocab_size": ("UINT32", False, f"{DS2}:5"),
    "{arch}.attention.layer_norm_rms_epsilon": ("FLOAT32", True, f"{DS2}:10"),
    "{arch}.leading_dense_block_count": ("UINT32", False, f"{DS2}:11"),
    "{arch}.attention.q_lora_rank": ("UINT32", True, f"{DS2}:13"),
    "{arch}.attention.kv_lora_rank": ("UINT32", True, f"{DS2}:15"),
    "{arch}.attention.key_length_mla": ("UINT32", False, f"{DS2}:16"),
    "{arch}.attention.value_length_mla": ("UINT32", False, f"{DS2}:17"),
    "{arch}.expert_feed_forward_length": ("UINT32 or_arr", True, f"{DS2}:18"),
    "{arch}.expert_shared_count": ("UINT32", True, f"{DS2}:19"),
    "{arch}.expert_weights_scale": ("FLOAT32", False, f"{DS2}:20"),
    "{arch}.expert_weights_norm": ("BOOL", False, f"{DS2}:21"),
    "{arch}.expert_gating_func": ("UINT32", False, f"{DS2}:22"),
    "{arch}.rope.scaling.yarn_log_multiplier": ("FLOAT32", False, f"{DS2}:34"),
    "tokenizer.ggml.model": ("STRING", True, f"{VOCAB}:1944"),
    "tokenizer.ggml.pre": ("STRING", False, f"{VOCAB}:1945"),
    "tokenizer.ggml.bos_token_id": ("UINT32", False, f"{VOCAB}:2626"),
    "tokenizer.ggml.eos_token_id": ("UINT32", False, f"{VOCAB}:2626"),
    "split.count": ("UINT16", False, f"{LOADER}:596"),
}
# Arrays of one item type, checked where the vocabulary is read.
TYPED_ARRAYS: dict[str, tuple[str, bool, str]] = {
    "tokenizer.ggml.tokens": ("STRING", True, f"{VOCAB}:2461-2468"),
    "tokenizer.ggml.token_type": ("INT32", False, f"{VOCAB}:2495-2499"),
    "tokenizer.ggml.merges": ("STRING", False, f"{VOCAB}:2009"),
}
KNOWN_ARCHS = ("deepseek2",)
"""The architecture of every fixture; any other name leaves the {arch}.* keys unread: with the deepseek2 keys
the file holds, the loader finds none of its own required keys (key not found, llama-model-loader.cpp:429)."""


def _check_typed(kv: dict[str, Kv], arch: str) -> None:
    for pattern, (want, required, where) in TYPED_KEYS.items():
        key = pattern.replace("{arch}", arch)
        got = kv.get(key)
        if got is None:
            if required:
                raise Refused(f"key not found in model: {key} ({LOADER}:429, read at {where})")
            continue
        name, _, or_arr = want.partition(" ")
        if or_arr and got.vtype == 9:
            continue  # an array of n_layer values: the reference rule is not modelled here (the oracle says unknown)
        if got.vtype != TYPE_IDS[name]:
            raise Refused(f"key {key} has wrong type {TYPE_NAMES.get(got.vtype)} but expected type {name} "
                          f"({LOADER}:167-169, read at {where})")
    for key, (item, required, where) in TYPED_ARRAYS.items():
        got = kv.get(key)
        if got is None:
            if required:
                raise Refused(f"cannot find {key} in model file ({where})")
            continue
        if got.vtype != 9 or got.item != TYPE_IDS[item]:
            raise Refused(f"invalid gguf type for {key} ({where})")


def loader_check(parts: list[Part], expected: dict[str, tuple[int, ...]]) -> None:
    """llama_model_loader over a set given its first part (parts in file-name order), then the model's tensors.

    `expected`: the tensors the architecture creates, name -> ne, as the clean fixture holds them (llama-simple loaded
    it when it was written): a tensor absent is "missing tensor" (llama-model-loader.cpp:1159), another shape is
    "tensor has wrong shape" (:917), one more is "wrong number of tensors" (:1398)."""
    first = parts[0]
    count_kv = first.kv.get("split.count")
    if count_kv is not None and count_kv.vtype != 2:
        raise Refused(f"key split.count has wrong type {TYPE_NAMES.get(count_kv.vtype)} but expected type UINT16 "
                      f"({LOADER}:167-169, read at {LOADER}:596)")
    n_split = 0 if count_kv is None else count_kv.value
    loaded = list(first.tensors)
    loaded_parts = [first]
    if n_split > 1:
        no = first.kv.get("split.no")
        if no is None or no.vtype != 2:
            # get_key(kv_split_no, idx) is required (llama-model-loader.cpp:603)
            raise Refused(f"split.no of the first part missing or not UINT16 ({LOADER}:603, 167)")
        if no.value != 0:
            raise Refused(f"illegal split file idx {no.value}: the first split must be loaded ({LOADER}:604)")
        if n_split != len(parts):
            raise Refused(f"split.count {n_split} but {len(parts)} parts: a part is missing or left out "
                          f"({LOADER}:614, 630-633)")
        for idx, part in enumerate(parts[1:], start=1):
            kid = part.kv.get("split.no")
            if kid is None:
                raise Refused(f"missing key split.no in GGUF split {idx} ({LOADER}:638)")
            if kid.vtype != 2:
                raise Refused(f"split.no of part {idx} is not UINT16: gguf_get_val_u16 asserts ({GGUF_CPP}:196)")
            if kid.value != idx:
                raise Refused(f"invalid split file idx {kid.value}, expected {idx} ({LOADER}:643)")
            loaded.extend(part.tensors)
            loaded_parts.append(part)
        count = first.kv.get("split.tensors.count")
        if count is None:
            raise Refused(f"key not found in model: split.tensors.count ({LOADER}:663)")
        if count.vtype != 5:  # `int n_tensors` (llama-model-loader.h:75): GKV<int> is INT32
            raise Refused(f"split.tensors.count has wrong type {TYPE_NAMES.get(count.vtype)} ({LOADER}:663, 167)")
        if count.value != len(loaded):
            raise Refused(f"corrupted model: {count.value} tensors expected but {len(loaded)} found ({LOADER}:669)")
    names: set[str] = set()
    for t in loaded:
        if t.name in names:
            raise Refused(f"invalid model: tensor '{t.name}' is duplicated ({LOADER}:589, 655)")
        names.add(t.name)
    for part in loaded_parts:
        for t in part.tensors:
            end = part.data_offset + t.offset + t.nbytes()
            if end > part.file_size:
                raise Refused(f"tensor '{t.name}' data is not within the file bounds (src/llama-model-loader.h:47)")
    arch_kv = first.kv.get("general.architecture")
    if arch_kv is not None and arch_kv.vtype != 8:
        raise Refused(f"key general.architecture has wrong type {TYPE_NAMES.get(arch_kv.vtype)} but expected type "
                      f"STRING ({LOADER}:167-169, read at {LOADER}:576)")
    arch = "" if arch_kv is None else arch_kv.value
    if arch not in KNOWN_ARCHS:
        raise Refused(f"unknown model architecture: '{arch}' ({MODEL}:371)")
    _check_typed(first.kv, arch)
    for name, ne in expected.items():
        got = next((t for t in loaded if t.name == name), None)
        if got is None:
            raise Refused(f"missing tensor '{name}' ({LOADER}:1159)")
        if got.ne + (1,) * (GGML_MAX_DIMS - len(got.ne)) != ne + (1,) * (GGML_MAX_DIMS - len(ne)):
            raise Refused(f"tensor '{name}' has wrong shape; expected {ne}, got {got.ne} ({LOADER}:917)")
    if len(names) != len(expected):
        raise Refused(f"wrong number of tensors; expected {len(expected)}, got {len(names)} ({LOADER}:1398)")
