"""Building the parameter accounting tree: found tensors filed by slot, leaves and groups, the parts of
a Linear module as its quantization scheme stores it, and the rows listed apart.

`Builder` files every found tensor under its (block kind, component) slot (quantization metadata under
its module), and makes leaves whose derived counts come from the architecture description's factors
(model.arch) beside the found ones. A Linear module's part asks the config's quantization plan (model.quant) for the
scheme of its first instance: the part counts out × in parameters however they are stored (INT4 packed
words stand for them), and carries the scheme's metadata tensors (FP8 block scales, INT4 group scales and
weight_shape) apart, never counted. model.py walks the model with these pieces; tensors no
leaf claims become the "unaccounted" node; metadata and buffers the excluded rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from kimi_audit.format.table import Located
from kimi_audit.model.accounting.summary import DtypeRow, ExcludedRow, sum_rows
from kimi_audit.model.accounting.tree import UNACCOUNTED, FoundTensor, Node, Part, StoredPart, collapse, tensor_slot
from kimi_audit.model.arch.spec import Factor
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.kinds import BUFFER, PACKED, PARAMETER, SCALE
from kimi_audit.model.layout import ExpectedLayout, ExpectedTensor, layer_block, scheme_of
from kimi_audit.model.quant.dispatch import writer_of
from kimi_audit.model.quant.scheme import fits
from kimi_audit.model.roles import kind_of, varies_by_writer

Mult = tuple[tuple[int, str], ...]
Slot = tuple[str | None, str]


def module_of(component: str) -> str:
    """The module a tensor belongs to: its name without the last dotted part (`mlp.experts.gate_proj`)."""
    return component.rpartition(".")[0]


def writer_variance(p: Part) -> bool:
    """A part whose float dtype writers vary (model.roles.varies_by_writer, as checks.layout reads it)."""
    return varies_by_writer(p.component, p.dtype, len(p.factors), bool(p.scheme))


class _Rows:
    """Counts by dtype, derived and found, added up as a node is built."""

    def __init__(self) -> None:
        self.derived: dict[str, int] = {}
        self.found: dict[str, int] = {}

    def add(self, dtype: str, derived: int = 0, found: int = 0) -> None:
        self.derived[dtype] = self.derived.get(dtype, 0) + derived
        self.found[dtype] = self.found.get(dtype, 0) + found

    def rows(self) -> tuple[DtypeRow, ...]:
        return sum_rows(DtypeRow(d, self.derived[d], self.found[d]) for d in self.derived)


def _expected_counts(expected: Mapping[str, ExpectedTensor]) -> dict[tuple[str, str, str, str], list[int]]:
    """(kind, block or "", component, dtype) -> [tensors, elements] over the layout (by its columns when it
    is an ExpectedLayout: one visit per Spec, not per tensor)."""
    out: dict[tuple[str, str, str, str], list[int]] = {}
    if isinstance(expected, ExpectedLayout):
        pairs: Iterable[tuple[tuple[str, str, str, str, tuple[int, ...]], int]] = (
            ((s.kind, s.block or "", s.component, s.dtype, s.shape), n)
            for s, n in ((expected.specs[i], n) for i, n in Counter(expected.spec_of).items()))
    else:
        pairs = Counter((e.kind, e.block or "", e.component, e.dtype, e.shape) for e in expected.values()).items()
    for (kind, block, comp, dtype, shape), n in pairs:
        row = out.setdefault((kind, block, comp, dtype), [0, 0])
        row[0] += n
        row[1] += n * math.prod(shape)
    return out


class Builder:
    """Leaves and groups of the tree of one config, with the found tensors of `actual` in its leaves."""

    def __init__(self, cfg: ModelConfig, actual: Located, expected: Mapping[str, ExpectedTensor]) -> None:
        self.cfg = cfg
        self.expected = expected
        self.params: dict[Slot, list[FoundTensor]] = {}
        """Parameter tensors and packed words, by slot."""
        self.scales: dict[Slot, list[FoundTensor]] = {}
        """Quantization metadata, by slot."""
        self.meta: dict[Slot, list[FoundTensor]] = {}
        """Quantization metadata, by (block, its module)."""
        self.buffers: dict[Slot, list[FoundTensor]] = {}
        self.used: set[Slot] = set()
        self.used_meta: set[Slot] = set()
        blocks = [layer_block(cfg, i) for i in range(cfg.total_layers)]
        tables = {PARAMETER: self.params, PACKED: self.params, SCALE: self.scales, BUFFER: self.buffers}
        for name, (t, shard) in actual.items():
            e = expected.get(name)
            shape = tuple(t.shape)
            logical = -1
            if e is not None:
                kind = e.kind
                slot: Slot = (e.block, e.component)
                if kind == PACKED:  # packed words of any shape stand for their module (as checks.stats counts)
                    logical = e.logical
            else:
                kind = kind_of(name)
                slot = tensor_slot(cfg, name, blocks)[:2]
                if kind == PACKED:
                    logical = 0  # no module the config knows of: it stands for nothing
            found = FoundTensor(name, t.dtype, shape, shard, logical if kind in (PARAMETER, PACKED) else 0)
            tables[kind].setdefault(slot, []).append(found)
            if kind == SCALE:
                self.meta.setdefault((slot[0], module_of(slot[1])), []).append(found)
        self.layers_of: dict[str, list[int]] = {}
        for layer in range(cfg.total_layers):
            self.layers_of.setdefault(layer_block(cfg, layer), []).append(layer)
        self.counts = _expected_counts(expected)

    # leaves and groups

    def leaf(self, key: str, name: str, title: str, role: str, block: str | None, parts: list[Part],
             mult: Mult, keys: Iterable[str], note: str = "") -> Node:
        n_inst = math.prod(v for v, _ in mult)
        tensors: list[FoundTensor] = []
        meta: list[FoundTensor] = []
        params, stored = _Rows(), _Rows()
        dtype_ok = True
        modules: dict[str, None] = {}
        for p in parts:
            slot = (block, p.component)
            self.used.add(slot)
            mine = self.params.get(slot, [])
            tensors += mine
            variance = writer_variance(p)
            uniform = variance and len({t.dtype for t in mine}) == 1  # variance is one dtype for every sibling
            explained = (self.cfg.dtype, "F32") if uniform else ()
            dtype_ok = dtype_ok and all(fits(p.dtype, t.dtype, t.shape) or t.dtype in explained for t in mine)
            # a dtype the format leaves to the writer (a GGUF weight's ggml type): derived as each was stored
            chose = {id(t) for t in mine if t.dtype != p.dtype and fits(p.dtype, t.dtype, t.shape)}
            for t in mine:
                if id(t) in chose:
                    params.add(t.dtype, t.parameters)
            rest = p.numel * n_inst - sum(t.parameters for t in mine if id(t) in chose)
            if rest:
                params.add(p.logical_dtype, rest)
            written = {t.dtype for t in mine}
            as_written = written.pop() if variance and len(written) == 1 else None  # the writer's one dtype
            for s in p.stored():
                # a dtype the format leaves to the writer (a GGUF weight's ggml type): derived as each was stored
                chosen = [t for t in mine if t.dtype != s.dtype and fits(s.dtype, t.dtype, t.shape)]
                for t in chosen:
                    stored.add(t.dtype, t.numel)
                rest = s.numel * n_inst - sum(t.numel for t in chosen)
                if rest:
                    stored.add(as_written or self.writers_width(block, s) or s.dtype, rest)
            for t in mine:
                same = fits(p.dtype, t.dtype, t.shape) or t.dtype in explained
                params.add(t.dtype if id(t) in chose or not same else p.logical_dtype, found=t.parameters)
                stored.add(t.dtype, found=t.numel)
            if p.scheme:
                modules[module_of(p.component)] = None
        for m in modules:
            self.used_meta.add((block, m))
            for t in self.meta.get((block, m), []):
                meta.append(t)
                stored.add(t.dtype, found=t.numel)
        all_keys = list(dict.fromkeys(k for p in parts for f in p.factors for k in f.keys))
        all_keys += [k for k in keys if k not in all_keys]
        return Node(
            key=key, name=name, title=title, role=role,
            derived=sum(p.numel for p in parts) * n_inst, found=sum(t.parameters for t in tensors),
            derived_tensors=len(parts) * n_inst, found_tensors=len(tensors), mult=mult,
            parts=tuple(parts), tensors=tuple(tensors), scales=tuple(meta), config_keys=tuple(all_keys),
            dtype_ok=dtype_ok, layers=tuple(self.layers_of.get(block, ())) if block else (),
            by_dtype=params.rows(), stored=stored.rows(), note=note,
        )

    def writers_width(self, block: str | None, s: StoredPart) -> str:
        """The one dtype every found tensor of this quantization metadata is stored in, where it is a format's
        writer's width rather than the release's (model.quant.dispatch.writer_of: compressed-tensors' own I64
        `weight_shape`): derived as that writer stores it, as the audit reads it (WRITER_DTYPE); "" otherwise."""
        found = self.scales.get((block, s.component), []) if s.kind == SCALE else []
        dtypes = {t.dtype for t in found}
        e = self.expected.get(found[0].name) if len(dtypes) == 1 else None
        dtype = dtypes.pop() if e is not None else ""
        return dtype if e is not None and dtype != s.dtype and writer_of(e.scheme, e.name, dtype) else ""

    def group(self, key: str, name: str, title: str, children: list[Node | None], mult: Mult = (),
              role: str = "group", note: str = "") -> Node:
        kids = [c for c in children if c is not None]
        keys = list(dict.fromkeys(k for c in kids for k in c.config_keys))
        layers = sorted({layer for c in kids for layer in c.layers})
        return Node(
            key=key, name=name, title=title, role=role,
            derived=sum(c.derived for c in kids), found=sum(c.found for c in kids),
            derived_tensors=sum(c.derived_tensors for c in kids),
            found_tensors=sum(c.found_tensors for c in kids),
            mult=mult, children=tuple(kids), config_keys=tuple(keys), layers=tuple(layers),
            by_dtype=sum_rows(r for c in kids for r in c.by_dtype),
            stored=sum_rows(r for c in kids for r in c.stored), note=note,
        )

    def unaccounted(self) -> Node | None:
        leftover = sorted((t for slot, ts in self.params.items() if slot not in self.used for t in ts),
                          key=lambda t: t.name)
        if not leftover:
            return None
        params, stored = _Rows(), _Rows()
        for t in leftover:
            params.add(t.dtype, found=t.parameters)
            stored.add(t.dtype, found=t.numel)
        return Node(
            key=UNACCOUNTED, name=UNACCOUNTED, title="Tensors the config does not account for", role=UNACCOUNTED,
            derived=0, found=sum(t.parameters for t in leftover), derived_tensors=0, found_tensors=len(leftover),
            tensors=tuple(leftover), by_dtype=params.rows(), stored=stored.rows(),
        )

    # parts

    def full_name(self, block: str | None, module: str) -> str:
        """The full name of the module's first instance in that block (what the quantization plan is asked)."""
        layers = self.layers_of.get(block, []) if block else []
        if not layers:
            return module
        return self.cfg.layer_name(layers[0]) + module.replace(".experts.", ".experts.0.", 1)

    def linear_parts(self, block: str | None, module: str, out: list[Factor], inp: list[Factor],
                     bias: bool = False, stack: list[Factor] | None = None) -> list[Part]:
        """The Linear module's weight (out × in parameters, as its scheme stores them, times a stacked module's
        leading dimensions) and its bias."""
        stack = stack or []
        lead = tuple(f.value for f in stack)
        scheme = scheme_of(self.cfg, self.full_name(block, module))
        stored = scheme.stored(math.prod(f.value for f in out), math.prod(f.value for f in inp))
        main = next(s for s in stored if s.kind in (PARAMETER, PACKED))
        meta = tuple(StoredPart(module + s.suffix, s.dtype, lead + s.shape, s.kind, 0)
                     for s in stored if s is not main)
        param_dtype = scheme.param_dtype
        label = f"Weight ({param_dtype}, packed in {main.dtype} words)" if main.kind == PACKED else "Weight"
        parts = [Part(label, module + main.suffix, tuple(stack + out + inp), main.dtype, main.kind, lead + main.shape,
                      param_dtype, scheme.describe(), meta)]
        if bias:
            parts.append(Part("Bias", f"{module}.bias", tuple(out), self.cfg.dtype))
        return parts

    # what is listed apart

    def excluded(self) -> tuple[ExcludedRow, ...]:
        derived: dict[tuple[str, str, str], list[int]] = {}
        dtypes: dict[tuple[str, str, str], set[str]] = {}
        for (kind, block, comp, dtype), (n, elements) in self.counts.items():
            if kind in (SCALE, BUFFER):
                row = derived.setdefault((kind, block, comp), [0, 0])
                row[0] += n
                row[1] += elements
                dtypes.setdefault((kind, block, comp), set()).add(dtype)
        found: dict[tuple[str, str, str], list[FoundTensor]] = {}
        for kind, table in ((SCALE, self.scales), (BUFFER, self.buffers)):
            for (b, comp), ts in table.items():
                found.setdefault((kind, b or "", comp), []).extend(ts)
        rows = []
        order = {SCALE: 0, BUFFER: 1}
        for key in sorted(list(derived) + [k for k in found if k not in derived], key=lambda k: order[k[0]]):
            kind, block, comp = key
            ts = found.get(key, [])
            d = derived.get(key, [0, 0])
            if ts:
                pattern = ", ".join(collapse(sorted(t.name for t in ts)))
                dtype = "/".join(sorted({t.dtype for t in ts}))
            else:
                layers = self.layers_of.get(block, [])
                name = self.cfg.layer_name
                pattern = comp if not layers else ", ".join(collapse(name(i) + comp for i in layers))
                dtype = "/".join(sorted(dtypes.get(key, ())))
            rows.append(ExcludedRow(kind, pattern, dtype, d[0], len(ts), d[1], sum(t.numel for t in ts)))
        return tuple(rows)

    def stored_totals(self, root: Node) -> tuple[DtypeRow, ...]:
        """Stored elements by dtype over every tensor: the tree's (parameters, packed words and their
        metadata), plus buffers and metadata no leaf claims."""
        extra = _Rows()
        for ts in self.buffers.values():  # optional: only those stored, on both sides
            for t in ts:
                extra.add(t.dtype, t.numel, found=t.numel)
        for slot, ts in self.meta.items():
            if slot not in self.used_meta:
                for t in ts:
                    extra.add(t.dtype, found=t.numel)
        return sum_rows(root.stored + extra.rows())
