"""The mutation oracle: clean checkpoints, one header field changed at a time, each audited and held to a reference
reader (tests/test_mutation_oracle.py, bench/mutation_long.py; docs/reference.md, threat model).

A mutation is plain JSON (what tests/data/mutation_corpus/*.json keeps): {"fixture": ..., "op": ..., ...}, made into
files by `materialize`. The clean fixtures are the GGUF files llama.cpp's own tools wrote (tests/data/gguf) and the
tiny safetensors checkpoint (kimi_audit.replica.tiny). The references:

- GGUF: gguf.cpp's load rules and llama.cpp's model loader (tests/gguf_reference.py, each rule cited by file and
  line), then gguf-py's GGUFReader for what every tensor reads as;
- safetensors: safetensors' own parser (`safetensors.deserialize`, the Rust validation safe_open runs), and for the
  index, what transformers loads by: each tensor of weight_map read from the file it names (a name the file does
  not hold, or a tensor no entry names, is not loaded as the checkpoint holds it). total_size is not read.

`check(mutation)` audits the mutant in-process (`kimi_audit.audit`) and returns the properties it breaks:
(a) the reference refuses and the audit passes; (b) the audit passes and a tensor's name, type, shape or bytes
differ from the original's; (c) an exception other than KimiAuditError (a traceback); (d) an exit code outside
{0, 1, 2, 3}; (e) an audit over TIME_LIMIT seconds or growing the peak RSS by more than RSS_LIMIT_MB.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import gguf_builder as gb
import gguf_reference as ref
from gguf_reference import Refused

TESTS = Path(__file__).resolve().parent
GGUF_DATA = TESTS / "data" / "gguf"
CORPUS = TESTS / "data" / "mutation_corpus"
TIME_LIMIT = 5.0
"""Seconds one in-process audit of a mutant may take (a clean fixture audits in milliseconds)."""
RSS_LIMIT_MB = 512
"""How far one audit may raise the process's peak RSS (the fixtures are 1-7 MB)."""

GGUF_FIXTURES = {
    "gguf/tiny-Q2_K.gguf": [GGUF_DATA / "tiny-Q2_K.gguf"],
    "gguf/noscoring-Q2_K.gguf": [GGUF_DATA / "noscoring-Q2_K.gguf"],
    "gguf/Q8_0": sorted((GGUF_DATA / "Q8_0").glob("*.gguf")),
}
ST_FIXTURE = "safetensors/tiny"
INDEX = "model.safetensors.index.json"


# --- the clean fixtures -------------------------------------------------------------------------------------------


@dataclass
class GgufFixture:
    name: str
    paths: list[Path]
    raw: list[bytes]
    parts: list[ref.Part]
    expected: dict[str, tuple[int, ...]]
    view: dict[str, Any]


@cache
def gguf_fixture(name: str) -> GgufFixture:
    paths = GGUF_FIXTURES[name]
    raw = [p.read_bytes() for p in paths]
    parts = [ref.parse(b) for b in raw]
    expected = {t.name: t.ne for p in parts for t in p.tensors}
    return GgufFixture(name, paths, raw, parts, expected, gguf_view(paths))


@dataclass
class StFixture:
    directory: Path
    files: dict[str, bytes]
    headers: dict[str, dict[str, Any]]
    view: dict[str, Any]


_st_root: list[Path] = []


def set_work_root(path: Path) -> None:
    """Where the tiny safetensors checkpoint is built (a test's tmp_path_factory folder; else a temporary folder)."""
    _st_root[:] = [path]


@cache
def st_fixture() -> StFixture:
    from tiny_checkpoint import build_tiny

    root = _st_root[0] if _st_root else Path(tempfile.mkdtemp(prefix="kimi-mutation-"))
    directory = build_tiny(root / "tiny-clean")
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    headers = {n: _st_header(b) for n, b in files.items() if n.endswith(".safetensors")}
    return StFixture(directory, files, headers, st_view(directory))


def _st_header(raw: bytes) -> dict[str, Any]:
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8:8 + n])


# --- what the reference reads: every tensor's name, type, shape and bytes --------------------------------------------


def gguf_view(paths: list[Path]) -> dict[str, Any]:
    """name -> (ggml type, shape, sha256 of its bytes), as gguf-py's GGUFReader reads each part."""
    from gguf import GGUFReader

    out: dict[str, Any] = {}
    for p in paths:
        for t in GGUFReader(p).tensors:
            digest = hashlib.sha256(t.data.tobytes()).hexdigest()
            out.setdefault(t.name, []).append((int(t.tensor_type), [int(d) for d in t.shape], digest))
    return out


def st_view(directory: Path) -> dict[str, Any]:
    """name -> (dtype, shape, sha256 of its bytes), as safetensors' own parser reads every shard."""
    import safetensors

    out: dict[str, Any] = {}
    for p in sorted(directory.glob("*.safetensors")):
        for name, t in safetensors.deserialize(p.read_bytes()):
            out.setdefault(name, []).append((t["dtype"], list(t["shape"]), hashlib.sha256(t["data"]).hexdigest()))
    return out


# --- mutations into files ------------------------------------------------------------------------------------------

PACK_WIDTH = {"<B": 8, "<b": 8, "<H": 16, "<h": 16, "<I": 32, "<i": 32, "<Q": 64, "<q": 64}


def _pack(fmt: str, value: Any) -> bytes:
    if fmt in ("<f", "<d"):
        return struct.pack(fmt, float(value))
    bits = PACK_WIDTH[fmt]
    v = int(value) % (1 << bits)
    if fmt[1].islower():
        v = v - (1 << bits) if v >= 1 << (bits - 1) else v
    return struct.pack(fmt, v)


def _patch(buf: bytes, part: ref.Part, edits: list[list[Any]]) -> bytes:
    out = bytearray(buf)
    for name, value in edits:
        at, fmt = part.fields[name]
        out[at:at + struct.calcsize(fmt)] = _pack(fmt, value)
    return bytes(out)


def _xor_bytes(buf: bytes, lo: int, hi: int, seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray(buf)
    for _ in range(n):
        i = rng.randrange(lo, hi)
        out[i] ^= rng.randrange(1, 256)
    return bytes(out)


def _gguf_value(vtype: str, value: Any, item: str | None) -> tuple[int, Any, int | None]:
    return ref.TYPE_IDS[vtype], value, None if item is None else ref.TYPE_IDS[item]


@cache
def _gguf_parsed(path: Path) -> gb.Gguf:
    return gb.read(path)


def _gguf_struct(m: dict[str, Any], fx: GgufFixture, i: int) -> bytes:
    g = copy.deepcopy(_gguf_parsed(fx.paths[i]))
    op = m["op"]
    if op == "kv_set":
        g.kv[m["key"]] = _gguf_value(m["type"], m["value"], m.get("item"))
        if m["key"] == "general.alignment" and m.get("relayout"):
            g.alignment = int(m["value"])
    elif op == "kv_del":
        g.kv.pop(m["key"])
    elif op == "clear":
        g.kv.clear()
        g.tensors.clear()
    elif op == "tensor_del":
        g.tensors = [t for t in g.tensors if t.name != m["tensor"]]
    elif op == "tensor_rename":
        g.tensor(m["tensor"]).name = m["value"]
    elif op == "gap":
        pos, after = 0, False
        for t in g.tensors:
            t.offset = pos + (m["bytes"] if after else 0)
            pos = -(-(t.offset + len(t.data)) // g.alignment) * g.alignment
            after = after or t.name == m["after"]
    else:
        raise ValueError(f"unknown GGUF op {op!r}")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "x.gguf"
        gb.write(g, out)
        return out.read_bytes()


def materialize(m: dict[str, Any], work: Path) -> Path:
    """Write the mutant into the new folder `work`; return what to audit (a .gguf file, a split set, a checkpoint)."""
    work.mkdir(parents=True)
    if m["fixture"] == ST_FIXTURE:
        return _st_materialize(m, work)
    fx = gguf_fixture(m["fixture"])
    i = m.get("part", 0)
    buf = fx.raw[i]
    op = m["op"]
    if op == "field":
        buf = _patch(buf, fx.parts[i], [[m["field"], m["value"]]])
    elif op == "fields":
        buf = _patch(buf, fx.parts[i], m["edits"])
    elif op == "bytes":
        buf = _xor_bytes(buf, 0, fx.parts[i].data_offset, m["seed"], m["n"])
    else:
        buf = _gguf_struct(m, fx, i)
    for j, p in enumerate(fx.paths):
        if j == i:
            (work / p.name).write_bytes(buf)
        else:
            os.link(p, work / p.name)
    return work / fx.paths[0].name if len(fx.paths) == 1 else work


def _dump_header(header: dict[str, Any]) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _st_materialize(m: dict[str, Any], work: Path) -> Path:
    fx = st_fixture()
    op = m["op"]
    name = m.get("file", INDEX)
    files = dict(fx.files)
    if op == "bytes":
        raw = files[name]
        lo, hi = (8, 8 + struct.unpack_from("<Q", raw)[0]) if name.endswith(".safetensors") else (0, len(raw))
        files[name] = _xor_bytes(raw, lo, hi, m["seed"], m["n"])
    elif op == "st_len":
        files[name] = struct.pack("<Q", m["value"] % 2**64) + files[name][8:]
    elif op.startswith("st_"):
        header = json.loads(json.dumps(fx.headers[name]))
        if op == "st_entry":
            header[m["tensor"]][m["key"]] = m["value"]
        elif op == "st_swap":
            a, b = header[m["a"]], header[m["b"]]
            a["data_offsets"], b["data_offsets"] = b["data_offsets"], a["data_offsets"]
        elif op == "st_del":
            del header[m["tensor"]]
        elif op == "st_meta":
            if m["value"] is None:
                header.pop("__metadata__", None)
            else:
                header["__metadata__"] = m["value"]
        else:
            raise ValueError(f"unknown safetensors op {op!r}")
        old = files[name]
        data = old[8 + struct.unpack_from("<Q", old)[0]:]
        head = _dump_header(header)
        files[name] = struct.pack("<Q", len(head)) + head + data
    elif op.startswith("index_"):
        index = json.loads(files[INDEX])
        if op == "index_map":
            if m["value"] is None:
                del index["weight_map"][m["tensor"]]
            else:
                index["weight_map"][m["tensor"]] = m["value"]
        elif op == "index_total":
            index["metadata"]["total_size"] = m["value"]
        else:
            raise ValueError(f"unknown index op {op!r}")
        files[INDEX] = json.dumps(index, indent=2).encode()
    else:
        raise ValueError(f"unknown safetensors op {op!r}")
    for n, raw in files.items():
        if raw is fx.files[n]:
            os.link(fx.directory / n, work / n)
        else:
            (work / n).write_bytes(raw)
    return work


# --- the reference's verdict ----------------------------------------------------------------------------------------


@dataclass
class Reference:
    verdict: str
    """refuse, accept, or unknown (a change the rules here do not decide: a hyperparameter's value)."""
    reason: str = ""


# Keys whose value (not type) the model's tensors are derived from: another value is a model the rules here do not
# build, so a change of one is neither refused nor accepted by them.
VALUE_KEYS_PREFIX = ("deepseek2.", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                     "tokenizer.ggml.eos_token_id", "general.architecture", "split.")


def gguf_reference(target: Path, fx: GgufFixture) -> Reference:
    paths = sorted(target.glob("*.gguf")) if target.is_dir() else [target]
    try:
        parts = [ref.parse(p.read_bytes()) for p in paths]
        ref.loader_check(parts, fx.expected)
    except Refused as e:
        return Reference("refuse", str(e))
    for mine, theirs in zip(parts, fx.parts):
        for key, kv in mine.kv.items():
            old = theirs.kv.get(key)
            if key.startswith(VALUE_KEYS_PREFIX) and old is not None and (kv.vtype, kv.value, kv.item, kv.count) != (
                    old.vtype, old.value, old.item, old.count):
                return Reference("unknown", f"{key}: {old.value!r} -> {kv.value!r}")
    return Reference("accept")


def st_reference(target: Path) -> Reference:
    import safetensors

    held: dict[str, str] = {}
    for p in sorted(target.glob("*.safetensors")):
        try:
            for name, _ in safetensors.deserialize(p.read_bytes()):
                held[name] = p.name
        except Exception as e:  # safetensors' SafetensorError: the Rust validation (safetensors/src/tensor.rs)
            return Reference("refuse", f"safetensors refuses {p.name}: {str(e)[:200]}")
    try:
        index = json.loads((target / INDEX).read_bytes())
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except Exception as e:
        return Reference("refuse", f"transformers cannot read the index: {type(e).__name__}")
    if weight_map != held:
        diff = sorted(set(weight_map.items()) ^ set(held.items()))[:2]
        return Reference("refuse", f"weight_map does not name the file holding each tensor: {diff}")
    return Reference("accept")


# --- the oracle ------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    mutation: dict[str, Any]
    reference: Reference
    exit_code: int | None = None
    verdict: str = ""
    codes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{json.dumps(self.mutation)}: reference {self.reference.verdict} ({self.reference.reason}); "
                f"kimi-audit {self.verdict or '-'} exit {self.exit_code} {self.codes[:4]}; "
                + "; ".join(self.violations))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check(m: dict[str, Any], scratch: Path) -> Outcome:
    """Materialize `m` in a new folder under `scratch`, audit it in-process, hold it to the reference; remove it."""
    from kimi_audit import audit
    from kimi_audit.errors import KimiAuditError

    work = Path(tempfile.mkdtemp(dir=scratch))
    shutil.rmtree(work)
    try:
        target = materialize(m, work)
        st = m["fixture"] == ST_FIXTURE
        reference = st_reference(target) if st else gguf_reference(target, gguf_fixture(m["fixture"]))
        out = Outcome(m, reference)
        before = _peak_mb()
        start = time.perf_counter()
        try:
            report = audit(target)
            out.exit_code = report.exit_code()
            out.verdict = report.verdict()
            out.codes = sorted({f.code for f in report.findings})
        except KimiAuditError as e:
            out.exit_code = 2
            out.verdict = "ERROR"
            out.codes = [e.code]
        except Exception as e:  # (c): anything else is a traceback on the command line
            out.violations.append(f"(c) traceback: {type(e).__name__}: {str(e)[:200]}")
        out.seconds = time.perf_counter() - start
        if out.seconds > TIME_LIMIT:
            out.violations.append(f"(e) the audit took {out.seconds:.1f} s")
        grew = _peak_mb() - before
        if grew > RSS_LIMIT_MB:
            out.violations.append(f"(e) the audit raised the peak RSS by {grew:.0f} MB")
        if out.exit_code is not None and out.exit_code not in (0, 1, 2, 3):
            out.violations.append(f"(d) exit code {out.exit_code}")
        if out.exit_code == 0 or out.verdict == "PASS":
            if reference.verdict == "refuse":
                out.violations.append(f"(a) PASS where the reference refuses: {reference.reason}")
            elif "undecidable" not in m:  # (b) not asserted where no header can tell: the mutation says why
                _check_view(out, target, st)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_view(out: Outcome, target: Path, st: bool) -> None:
    try:
        if st:
            view, original = st_view(target), st_fixture().view
        else:
            paths = sorted(target.glob("*.gguf")) if target.is_dir() else [target]
            view, original = gguf_view(paths), gguf_fixture(out.mutation["fixture"]).view
    except Exception as e:
        out.violations.append(f"(a) PASS where the reference reader fails: {type(e).__name__}: {str(e)[:160]}")
        return
    changed = sorted(n for n in set(view) | set(original) if view.get(n) != original.get(n)
                     and not (st and n.endswith(NOT_LOADED_SUFFIXES)))
    if changed:
        out.violations.append(f"(b) PASS but {len(changed)} tensors read differently than the original's: "
                              f"{changed[:3]}")


NOT_LOADED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Tensors a checkpoint may store that transformers never loads: DeepseekV3's rotary embedding registers inv_freq
as a non-persistent buffer (register_buffer(..., persistent=False)) and recomputes it, so a stored copy of another
dtype or shape is not a tensor the model reads (the audit names it: BUFFER_DTYPE, BUFFER_SHAPE)."""


def run_cli(target: Path, timeout: float = 120) -> tuple[int, str, str]:
    """`python -m kimi_audit audit TARGET --json --no-progress`: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "kimi_audit", "audit", str(target), "--json", "--no-progress"],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
    return proc.returncode, proc.stdout, proc.stderr


def signature(o: Outcome) -> str:
    """A violation's class: the property, the fixture and the mutated field with names taken out."""
    import re

    m = o.mutation
    what = m.get("field") or m.get("key") or m.get("op")
    what = re.sub(r"\[[^\]]*\]", "[*]", str(what))
    props = ",".join(sorted({v[:3] for v in o.violations}))
    return f"{props} {m['fixture']} {m['op']}:{what}"


# --- the mutations --------------------------------------------------------------------------------------------------


def _int_values(fmt: str, v: int) -> list[int]:
    bits = PACK_WIDTH[fmt]
    small = [0, 1, 2, 3, 4, 5, 8, 9, 10, 12, 13, 14, 26, 30, 42, 43]
    big = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    near = [v - 1, v + 1, v * 2, v // 2, v + 32, v - 32, v + 4096, -1]
    return sorted({x for x in small + near + big if x.bit_length() <= bits + 1})


def _field_values(fmt: str, v: Any) -> list[Any]:
    if fmt in ("<f", "<d"):
        return [0.0, -1.0, float(v) * 2, float(v) + 1, 1e30]
    return _int_values(fmt, int(v))


def gguf_field_mutation(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(sorted(GGUF_FIXTURES))
    fx = gguf_fixture(name)
    i = rng.randrange(len(fx.parts))
    field_name = rng.choice(sorted(fx.parts[i].fields))
    at, fmt = fx.parts[i].fields[field_name]
    (current,) = struct.unpack_from(fmt, fx.raw[i], at)
    value = rng.choice([x for x in _field_values(fmt, current) if x != current] or [0])
    m: dict[str, Any] = {"fixture": name, "op": "field", "field": field_name, "value": value}
    if i:
        m["part"] = i
    return m


def gguf_bytes_mutation(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(sorted(GGUF_FIXTURES))
    m: dict[str, Any] = {"fixture": name, "op": "bytes", "seed": rng.randrange(2**32),
                         "n": rng.choice([1, 1, 2, 4, 16])}
    i = rng.randrange(len(GGUF_FIXTURES[name]))
    if i:
        m["part"] = i
    return m


ST_DTYPES = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
             "I64", "U64", "F4", "F8_E8M0", "f32", "", 5, None]


def _shape_values(shape: list[int]) -> list[Any]:
    out: list[Any] = [[], [0], [-1], [2**40], shape + [1], [1] + shape, shape[:-1], list(reversed(shape)),
                      [s * 2 for s in shape], "x", [2**64 + 1]]
    for j in range(len(shape)):
        out += [shape[:j] + [shape[j] + 1] + shape[j + 1:], shape[:j] + [shape[j] - 1] + shape[j + 1:]]
    return out


def _offset_values(b: int, e: int) -> list[Any]:
    return [[b, e + 1], [b + 1, e + 1], [b - 1, e - 1], [e, b], [b, e - 1], [0, e - b], [2**40, 2**40 + e - b],
            [b, 2**64 - 1], [-1, e], [b], [b, e, e], [str(b), e]]


def st_entry_mutation(rng: random.Random) -> dict[str, Any]:
    fx = st_fixture()
    name = rng.choice(sorted(fx.headers))
    tensors = sorted(k for k in fx.headers[name] if k != "__metadata__")
    tensor = rng.choice(tensors)
    entry = fx.headers[name][tensor]
    key = rng.choice(["dtype", "shape", "data_offsets"])
    if key == "dtype":
        value: Any = rng.choice([d for d in ST_DTYPES if d != entry["dtype"]])
    elif key == "shape":
        value = rng.choice(_shape_values(list(entry["shape"])))
    else:
        value = rng.choice(_offset_values(*entry["data_offsets"]))
    return {"fixture": ST_FIXTURE, "op": "st_entry", "file": name, "tensor": tensor, "key": key, "value": value}


def st_bytes_mutation(rng: random.Random) -> dict[str, Any]:
    names = sorted(st_fixture().headers) + [INDEX]
    return {"fixture": ST_FIXTURE, "op": "bytes", "file": rng.choice(names), "seed": rng.randrange(2**32),
            "n": rng.choice([1, 1, 2, 4])}


def _equal_size_pair(fx: GgufFixture, i: int) -> tuple[ref.TensorInfo, ref.TensorInfo]:
    by_size: dict[int, ref.TensorInfo] = {}
    for t in fx.parts[i].tensors:
        if t.nbytes() in by_size:
            return by_size[t.nbytes()], t
        by_size[t.nbytes()] = t
    raise AssertionError("no two tensors of one size")


OTHER_TYPE = {"UINT32": ["INT32", "UINT64", "UINT16", "STRING", "FLOAT32"], "FLOAT32": ["FLOAT64", "UINT32"],
              "STRING": ["ARRAY"], "BOOL": ["UINT8", "UINT32"], "UINT16": ["UINT32", "INT32"]}


def _retyped(key: str, kv: ref.Kv, new: str) -> dict[str, Any]:
    m: dict[str, Any] = {"op": "kv_set", "key": key, "type": new}
    if new == "STRING":
        m["value"] = str(kv.value)
    elif new == "ARRAY":
        m.update(item="STRING", value=[str(kv.value)])
    elif new in ("FLOAT32", "FLOAT64"):
        m["value"] = float(kv.value)
    else:
        m["value"] = int(kv.value)
    return m


def structural_mutations() -> list[dict[str, Any]]:
    """The named field classes, every run: the issue's list and each typed key in another type."""
    tiny, split = "gguf/tiny-Q2_K.gguf", "gguf/Q8_0"
    fx = gguf_fixture(tiny)
    a, b = _equal_size_pair(fx, 0)
    out: list[dict[str, Any]] = [
        {"op": "clear"},
        {"op": "kv_del", "key": "general.architecture"},
        {"op": "fields", "edits": [[f"tensor[{a.name}].offset", b.offset], [f"tensor[{b.name}].offset", a.offset]]},
        {"op": "gap", "after": fx.parts[0].tensors[1].name, "bytes": 4096},
        {"op": "gap", "after": fx.parts[0].tensors[1].name, "bytes": 32},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT64", "value": 32},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT16", "value": 32},
        {"op": "kv_set", "key": "general.alignment", "type": "INT32", "value": 32},
        {"op": "kv_set", "key": "general.alignment", "type": "STRING", "value": "32"},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 32},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 0},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 48},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 64},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 64, "relayout": True},
        {"op": "kv_set", "key": "general.alignment", "type": "UINT32", "value": 1, "relayout": True},
        {"op": "kv_set", "key": "tokenizer.ggml.tokens", "type": "ARRAY", "item": "INT32", "value": list(range(512))},
        {"op": "kv_set", "key": "tokenizer.ggml.tokens", "type": "STRING", "value": "a"},
        {"op": "kv_set", "key": "tokenizer.ggml.token_type", "type": "ARRAY", "item": "UINT32", "value": [1] * 512},
        {"op": "kv_set", "key": "tokenizer.ggml.merges", "type": "ARRAY", "item": "INT32", "value": [1, 2]},
        {"op": "kv_set", "key": "general.architecture", "type": "STRING", "value": "llama"},
        {"op": "tensor_del", "tensor": fx.parts[0].tensors[-1].name},
        {"op": "tensor_rename", "tensor": fx.parts[0].tensors[-1].name,
         "value": fx.parts[0].tensors[-1].name[:-1] + "X"},
        {"op": "field", "field": "version", "value": 2},
        {"op": "field", "field": "version", "value": 1},
        {"op": "field", "field": "version", "value": 4},
        {"op": "field", "field": "n_tensors", "value": 2**40},
        {"op": "field", "field": "n_kv", "value": 2**40},
        {"op": "field", "field": "kv[tokenizer.ggml.tokens].count", "value": 2**40},
        {"op": "field", "field": "kv[tokenizer.ggml.tokens][0].len", "value": 2**40},
    ]
    for m in out:
        m["fixture"] = tiny
    first = fx.parts[0]
    for pattern, (want, required, _) in ref.TYPED_KEYS.items():
        key = pattern.replace("{arch}", "deepseek2")
        kv = first.kv.get(key)
        if kv is None:
            continue
        if required:
            out.append({"fixture": tiny, "op": "kv_del", "key": key})
        for new in OTHER_TYPE.get(want.split()[0], []):
            out.append({"fixture": tiny, **_retyped(key, kv, new)})
    out.append({"fixture": tiny, "op": "kv_set", "key": "deepseek2.rope.dimension_count", "type": "STRING",
                "value": "16"})
    for key in ref.TYPED_ARRAYS:
        out.append({"fixture": tiny, "op": "kv_del", "key": key})
    out += [{"fixture": split, **m} for m in [
        {"op": "kv_set", "key": "split.count", "type": "UINT16", "value": 3},
        {"op": "kv_set", "key": "split.count", "type": "UINT16", "value": 5},
        {"op": "kv_set", "key": "split.count", "type": "UINT16", "value": 1},
        {"op": "kv_set", "key": "split.count", "type": "UINT32", "value": 4},
        {"op": "kv_del", "key": "split.count"},
        {"op": "kv_set", "key": "split.no", "type": "UINT16", "value": 1},
        {"op": "kv_set", "key": "split.no", "type": "UINT32", "value": 0},
        {"op": "kv_set", "key": "split.no", "type": "UINT16", "value": 2, "part": 1},
        {"op": "kv_set", "key": "split.no", "type": "UINT16", "value": 0, "part": 3},
        {"op": "kv_set", "key": "split.no", "type": "UINT32", "value": 2, "part": 2},
        {"op": "kv_del", "key": "split.no", "part": 2},
        {"op": "kv_set", "key": "split.count", "type": "UINT16", "value": 7, "part": 2},
        {"op": "kv_set", "key": "split.tensors.count", "type": "INT32", "value": 51},
        {"op": "kv_set", "key": "split.tensors.count", "type": "INT32", "value": 53},
        {"op": "kv_set", "key": "split.tensors.count", "type": "UINT32", "value": 52},
        {"op": "kv_set", "key": "split.tensors.count", "type": "INT64", "value": 52},
        {"op": "kv_del", "key": "split.tensors.count"},
        {"op": "tensor_del", "tensor": gguf_fixture(split).parts[3].tensors[0].name, "part": 3},
    ]]
    return out + st_structural_mutations()


def st_structural_mutations() -> list[dict[str, Any]]:
    fx = st_fixture()
    out: list[dict[str, Any]] = []
    shard = sorted(fx.headers)[0]
    header = fx.headers[shard]
    seen: set[str] = set()
    by_size: dict[int, str] = {}
    swap = None
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        b, e = entry["data_offsets"]
        if swap is None and e - b in by_size:
            swap = (by_size[e - b], tensor)
        by_size.setdefault(e - b, tensor)
        if entry["dtype"] in seen:
            continue
        seen.add(entry["dtype"])
        base = {"fixture": ST_FIXTURE, "op": "st_entry", "file": shard, "tensor": tensor}
        out += [{**base, "key": "dtype", "value": d} for d in ST_DTYPES if d != entry["dtype"]]
        out += [{**base, "key": "shape", "value": s} for s in _shape_values(list(entry["shape"]))]
        out += [{**base, "key": "data_offsets", "value": v} for v in _offset_values(b, e)]
        out.append({"fixture": ST_FIXTURE, "op": "st_del", "file": shard, "tensor": tensor})
        out.append({"fixture": ST_FIXTURE, "op": "index_map", "tensor": tensor, "value": None})
        out.append({"fixture": ST_FIXTURE, "op": "index_map", "tensor": tensor, "value": sorted(fx.headers)[1]})
    if swap is not None:
        out.append({"fixture": ST_FIXTURE, "op": "st_swap", "file": shard, "a": swap[0], "b": swap[1],
                    "undecidable": "safetensors places tensors in any order: two of one dtype and size with their "
                                   "data_offsets swapped are a valid file whose header cannot tell them apart"})
    n = struct.unpack_from("<Q", fx.files[shard])[0]
    for v in (0, 1, n - 1, n + 1, n - 8, n + 8, 2**31, 2**40, 2**64 - 1, len(fx.files[shard])):
        out.append({"fixture": ST_FIXTURE, "op": "st_len", "file": shard, "value": v})
    for v in (None, {"format": 1}, [], {"format": "tf"}, "pt"):
        out.append({"fixture": ST_FIXTURE, "op": "st_meta", "file": shard, "value": v})
    out.append({"fixture": ST_FIXTURE, "op": "index_map", "tensor": "model.layers.9.absent.weight", "value": shard})
    for v in (0, 1, -1, 2**64, "x", None, 6866317):
        out.append({"fixture": ST_FIXTURE, "op": "index_total", "value": v})
    return out


def random_mutations(seed: int, n: int) -> Iterator[dict[str, Any]]:
    """n seeded mutations: GGUF header fields (60%), GGUF header bytes, safetensors entries, safetensors bytes."""
    rng = random.Random(seed)
    makers = [gguf_field_mutation] * 12 + [gguf_bytes_mutation] * 3 + [st_entry_mutation] * 3 + [st_bytes_mutation] * 2
    for _ in range(n):
        yield rng.choice(makers)(rng)


def corpus_entry(o: Outcome, bug: str) -> dict[str, Any]:
    """What a corpus file holds: the mutation, the reference's verdict and why, what kimi-audit said when it was
    found, and the bug in words."""
    return {"mutation": o.mutation, "reference": o.reference.verdict, "reference_says": o.reference.reason,
            "found": f"kimi-audit {o.verdict} exit {o.exit_code} {o.codes}; " + "; ".join(o.violations), "bug": bug}


def corpus() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(CORPUS.glob("*.json"))]
