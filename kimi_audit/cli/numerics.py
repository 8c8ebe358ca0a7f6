"""The `rmsnorm` and `tensor` commands: numpy numerics on the real weights, fetched by byte range.

Imported by cli.py, they register themselves on its `app`. Every tensor is read with range reads
through the Source interface (local directory or Hub): a 3 KB gain is 3 KB on the wire. The numerics
(numpy, ml_dtypes) are imported inside the commands, so `--help` and the other commands never load them.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from kimi_audit.cli.application import app, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.errors import KimiAuditError
from kimi_audit.format.header import TensorInfo
from kimi_audit.model.checkpoint import load_config
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.layout import FP8_DTYPE, SCALE_SUFFIX, expected_layout, layer_block, scheme_of
from kimi_audit.model.quant import Fp8Block, PackQuantized, Scheme
from kimi_audit.numerics.tensor_io import DEFAULT_MAX_TENSOR_BYTES, TensorFetcher, check_memory
from kimi_audit.sources import open_source
from kimi_audit.sources.base import Source
from kimi_audit.text import printable

if TYPE_CHECKING:
    from kimi_audit.checks.rmsnorm import LayerResult
    from kimi_audit.numerics.kernels import TensorStats


# ------------------------------------------------------------------ rmsnorm


def _parse_token_ids(text: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise KimiAuditError(f"--from-embeddings takes integers separated by commas, got {text!r}") from None
    if not ids:
        raise KimiAuditError("--from-embeddings needs at least one token id")
    return ids


def _layers(cfg: ModelConfig, layers: list[int] | None, all_layers: bool) -> list[int]:
    total = cfg.total_layers
    if all_layers:
        return list(range(total))
    chosen = layers or [0]
    for n in chosen:
        if not 0 <= n < total:
            raise KimiAuditError(f"--layer {n}: the model has layers 0..{total - 1}")
    return chosen


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "-" if v is None else format(v, spec)


@app.command()
@user_errors
def rmsnorm(
    source: str = typer.Argument(PINNED_REPO_ID,
                                 help="Local checkpoint directory or Hub repo id `owner/name[@revision]`."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision."),
    layer: list[int] | None = typer.Option(None, "--layer", "-l", help="Layer index (repeatable; default 0)."),
    all_layers: bool = typer.Option(False, "--all", help="Every layer (the MTP layer included)."),
    input_file: Path | None = typer.Option(None, "--input",
                                           help="A .npy array [B, T, q_lora_rank] (float; cast to bf16)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random bf16 input."),
    tokens: int = typer.Option(16, "--tokens", "-t", min=1, max=1 << 16, help="Positions T of the random input."),
    batch: int = typer.Option(1, "--batch", "-b", min=1, max=1 << 12, help="Batch B of the random input."),
    from_embeddings: str | None = typer.Option(
        None, "--from-embeddings",
        help="Token ids (e.g. '1,2,3'): their embedding rows -> the layer's input_layernorm -> dequantized "
             "q_a_proj, i.e. the real query latent (of block 0 for layer 0)."),
    show: int = typer.Option(6, "--show", min=0, help="Positions listed per layer in the table."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Run DeepseekV3RMSNorm (numpy, bit-identical to torch) with each layer's real q_a_layernorm gain.

    Fails (exit 1) when a gain or an output holds NaN/Inf, or a gain is all zeros.
    """
    from kimi_audit.checks.rmsnorm import (
        EMBED,
        Q_A_LAYERNORM,
        check_input_memory,
        load_input,
        normalize_and_check,
        query_latent,
        random_input,
    )

    if input_file is not None and from_embeddings is not None:
        raise KimiAuditError("--input and --from-embeddings are exclusive")
    src = open_source(source, revision)
    _, cfg = load_config(src)
    if cfg.q_lora_rank is None:
        raise KimiAuditError(f"{src.label}: the model has no q_a_layernorm (q_lora_rank is null)")
    width = cfg.q_lora_rank
    fetch = TensorFetcher(src)
    layers = _layers(cfg, layer, all_layers)
    ids: list[int] | None = None
    emb = None
    if from_embeddings is not None:
        ids = _parse_token_ids(from_embeddings)
        check_input_memory((1, len(ids), max(width, cfg.hidden_size)), len(layers))
        emb, _, _ = fetch.read_rows(EMBED, ids)
        shared_x = None
        input_desc: dict[str, Any] = {"kind": "embeddings", "token_ids": ids, "shape": [1, len(ids), width]}
    elif input_file is not None:
        shared_x = load_input(input_file, width, len(layers))
        input_desc = {"kind": "file", "path": str(input_file), "shape": list(shared_x.shape)}
    else:
        check_input_memory((batch, tokens, width), len(layers))  # before anything is allocated or read
        shared_x = random_input(seed, batch, tokens, width)
        input_desc = {"kind": "random", "seed": seed, "shape": [batch, tokens, width], "dtype": "BF16"}

    results: list[LayerResult] = []
    for n in layers:
        name = f"model.layers.{n}.{Q_A_LAYERNORM}"
        gain, t, shard = fetch.read(name)
        if t.shape != (width,):
            raise KimiAuditError(f"{name} has shape {list(t.shape)}, expected [{width}]")
        x = shared_x if emb is None else query_latent(fetch, cfg, n, emb)
        assert x is not None  # one of the two inputs is set
        results.append(normalize_and_check(n, layer_block(cfg, n), name, shard, x, gain, cfg.rms_norm_eps))

    ok = all(r.ok for r in results)
    if as_json:
        doc = {
            "source": src.label,
            "revision": src.revision,
            "eps": cfg.rms_norm_eps,
            "input": input_desc,
            "bytes_read": fetch.bytes_read,
            "layers": [r.to_json() for r in results],
            "ok": ok,
        }
        sys.stdout.write(json.dumps(_clean(doc), indent=2, allow_nan=False, default=_json_default) + "\n")
    else:
        _render_rmsnorm(src, cfg, input_desc, results, show, fetch.bytes_read)
    raise typer.Exit(0 if ok else 1)


def _json_default(v: Any) -> Any:
    raise TypeError(type(v))


def _clean(v: Any) -> Any:
    """JSON has no NaN/Inf: non-finite floats become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _render_rmsnorm(src: Source, cfg: ModelConfig, input_desc: dict[str, Any], results: list[LayerResult], show: int,
                    bytes_read: int) -> None:
    from kimi_audit.checks.rmsnorm import max_abs

    rev = f" @ {src.revision}" if src.revision else ""
    shape = "×".join(str(d) for d in input_desc["shape"])
    what = {"random": f"seeded bf16 N(0,1), seed {input_desc.get('seed')}", "file": input_desc.get("path"),
            "embeddings": f"embedding rows of tokens {input_desc.get('token_ids')} → input_layernorm → q_a_proj"}
    stdout.print(f"[bold]RMSNorm[/bold] (DeepseekV3RMSNorm, eps={cfg.rms_norm_eps:g}) on {src.label}{rev}")
    stdout.print(f"input [{shape}]: {what[input_desc['kind']]}; {bytes_read:,} bytes fetched")
    stdout.print("γ: the layer's q_a_layernorm gain; out RMS: min–max over positions of RMS(y); "
                 "|RMS(y/γ)−1|: the largest over positions", highlight=False)
    table = Table(show_lines=False)
    for col, just in (("layer", "right"), ("block", "left"), ("γ min", "right"), ("γ max", "right"),
                      ("γ mean", "right"), ("out RMS", "right"), ("|RMS(y/γ)−1|", "right"), ("check", "left")):
        table.add_column(col, justify=just, no_wrap=col == "out RMS")  # type: ignore[arg-type]
    for r in results:
        fin = [v for v in r.output_rms if math.isfinite(v)]
        span = f"{min(fin):.4f}–{max(fin):.4f}" if fin else "-"
        check = "[green]ok[/green]" if r.ok else "[red]" + "; ".join(r.problems) + "[/red]"
        table.add_row(str(r.layer), r.block, _fmt(r.gain.min), _fmt(r.gain.max), _fmt(r.gain.mean),
                      span, _fmt(max_abs(r.unit_deviation), ".3g"), check)
    stdout.print(table)
    if show:
        for r in results:
            vals = " ".join(_fmt(v, ".4f") for v in r.output_rms[:show])
            more = f" … ({len(r.output_rms):,} positions)" if len(r.output_rms) > show else ""
            stdout.print(f"layer {r.layer} output RMS per position: {vals}{more}", highlight=False)
    bad = [r for r in results if not r.ok]
    if bad:
        stdout.print(f"[red]{len(bad)} of {len(results)} layers failed the check[/red]")
    else:
        stdout.print(f"[green]{len(results)} layer(s): gains finite and non-zero, outputs finite[/green]")


# ------------------------------------------------------------------ tensor


def _stats_rows(table: Table, label: str, st: TensorStats) -> None:
    table.add_row(label, "count", f"{st.count:,}")
    for k in ("min", "max", "mean", "std"):
        table.add_row("", k, _fmt(getattr(st, k), ".6g"))
    table.add_row("", "NaN / +Inf / −Inf", f"{st.nan:,} / {st.posinf:,} / {st.neginf:,}")
    table.add_row("", "zeros", f"{st.zeros:,}")
    if st.saturated is not None:
        table.add_row("", "FP8 saturated |x| = 448", f"{st.saturated:,}")


def _resolve(fetch: TensorFetcher, name: str) -> str:
    """A tensor's name as given; a Linear module's name: its stored weight (`.weight`, INT4 `.weight_packed`)."""
    if fetch.listed(name):
        return name
    for suffix in (".weight", ".weight_packed"):
        if fetch.listed(name + suffix):
            return name + suffix
    return name  # not found: the read says so


def _quantized_module(src: Source, name: str, t: TensorInfo) -> tuple[str, Scheme, int | None, int | None] | None:
    """(module, scheme, out, in) for an FP8 `weight` or an INT4 `weight_packed`, else None. out x in comes from
    the layout config.json implies (None for an INT4 module the layout lacks: then from weight_shape)."""
    if t.dtype == FP8_DTYPE and name.endswith(".weight") and len(t.shape) == 2:
        try:
            _, cfg = load_config(src)
        except KimiAuditError:  # no usable config: DeepSeek's 128 x 128 blocks
            return name[: -len(".weight")], Fp8Block(), t.shape[0], t.shape[1]
        scheme = cfg.quant.quantized if cfg.quant is not None else None
        block = cfg.quantization.block if cfg.quantization else (128, 128)
        return name[: -len(".weight")], scheme if isinstance(scheme, Fp8Block) else Fp8Block(block), *t.shape
    if not name.endswith(".weight_packed"):
        return None
    module = name[: -len(".weight_packed")]
    _, cfg = load_config(src)
    packed = scheme_of(cfg, module)
    if not isinstance(packed, PackQuantized):
        raise KimiAuditError(f"{name}: config.json does not describe {module} as compressed-tensors pack-quantized "
                             f"({packed.describe()})")
    e = expected_layout(cfg).get(name)
    if e is None or not e.shape[0]:
        return module, packed, None, None
    return module, packed, e.shape[0], e.logical // e.shape[0]


@app.command()
@user_errors
def tensor(
    source: str = typer.Argument(..., help="Local checkpoint directory or Hub repo id `owner/name[@revision]`."),
    name: str = typer.Argument(..., help="Tensor name (model.layers.0.self_attn.q_a_layernorm.weight) or Linear "
                                         "module name (model.layers.5.mlp.experts.7.gate_proj)."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision."),
    dequant: bool = typer.Option(False, "--dequant", help="For an FP8 or INT4 weight: statistics of the "
                                 "dequantized values (FP8: bf16 block dequant; INT4: compressed-tensors' own)."),
    max_bytes: int = typer.Option(DEFAULT_MAX_TENSOR_BYTES, "--max-bytes", min=1,
                                  help="Refuse to fetch a tensor larger than this."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Fetch one tensor by byte range and print its value statistics (and its scales').

    A module name stands for its stored weight: `.weight`, or `.weight_packed` for compressed-tensors INT4.
    Fails (exit 1) on NaN/Inf values, scales that are not finite and > 0, a quantization tensor absent, or an
    INT4 weight_shape that disagrees with the config's [out, in].
    """
    import numpy as np

    from kimi_audit.numerics.dtypes import NumericsError
    from kimi_audit.numerics.kernels import tensor_stats, to_float32

    src = open_source(source, revision)
    fetch = TensorFetcher(src)
    name = _resolve(fetch, name)
    arr, t, shard = fetch.read(name, max_bytes)
    st = tensor_stats(arr, dtype=t.dtype)
    problems: list[str] = []
    if st.nan or st.inf:
        problems.append(f"{name}: {st.nan:,} NaN and {st.inf:,} Inf values")
    scale_st = deq_st = None
    scale_name: str | None = None
    weight_shape: list[int] | None = None
    quant = _quantized_module(src, name, t)
    if quant is not None:
        module, scheme, out, inp = quant
        kind = "FP8" if isinstance(scheme, Fp8Block) else f"INT{getattr(scheme, 'bits', '')}"
        stored: dict[str, np.ndarray] = {name[len(module):]: arr}
        complete = True
        for s in scheme.stored(out or 1, inp or 1):
            full = module + s.suffix
            if s.suffix in stored:
                continue
            if not fetch.listed(full):
                problems.append(f"{name} is {kind} but {full} is absent")
                complete = False
                continue
            a, ti, _ = fetch.read(full, max_bytes)
            stored[s.suffix] = a
            if s.suffix in (SCALE_SUFFIX, ".weight_scale"):
                scale_name, scale_st = full, tensor_stats(a, dtype=ti.dtype)
                s32 = to_float32(a)
                bad = int(np.count_nonzero(~(np.isfinite(s32) & (s32 > 0))))
                if bad:
                    problems.append(f"{full}: {bad:,} of {s32.size:,} scales are not finite and > 0")
            elif s.suffix == ".weight_shape":
                weight_shape = [int(v) for v in a.reshape(-1)]
                if out is None and len(weight_shape) == 2:
                    out, inp = weight_shape
                elif weight_shape != [out, inp]:
                    problems.append(f"WEIGHT_SHAPE_MISMATCH: {full} holds {weight_shape}, the config implies "
                                    f"[{out}, {inp}]")
                    complete = False
        if dequant and complete and out is not None and inp is not None:
            per = 2 if isinstance(scheme, Fp8Block) else 8  # the result, plus INT4's codes and float32 products
            check_memory(per * out * inp, f"dequantizing {module} ({out * inp:,} values)")
            try:
                deq_st = tensor_stats(scheme.dequantize(stored, out, inp))
            except NumericsError as e:
                problems.append(f"{module}: cannot dequantize: {e}")
    elif dequant:
        stderr.print(Text(printable(f"note: {name} is {t.dtype}, not a quantized weight: nothing to dequantize")))

    if as_json:
        doc = {
            "source": src.label,
            "revision": src.revision,
            "tensor": name,
            "module": None if quant is None else quant[0],
            "scheme": None if quant is None else quant[1].key,
            "shard": shard,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "bytes": t.nbytes,
            "stats": st.to_json(),
            "scale": None if scale_st is None else {"tensor": scale_name, "stats": scale_st.to_json()},
            "weight_shape": weight_shape,
            "dequantized": None if deq_st is None else deq_st.to_json(),
            "ok": not problems,
            "problems": problems,
        }
        sys.stdout.write(json.dumps(_clean(doc), indent=2, allow_nan=False, default=_json_default) + "\n")
    else:
        rev = f" @ {src.revision}" if src.revision else ""
        stdout.print(Text(printable(name), style="bold") + Text(printable(f" in {shard} ({src.label}{rev})")))
        stdout.print(Text(f"{t.dtype} {list(t.shape)}, {t.nbytes:,} bytes"))
        if quant is not None:
            shape_note = f"; weight_shape {weight_shape}" if weight_shape is not None else ""
            stdout.print(Text(printable(f"module {quant[0]}: {quant[1].describe()}{shape_note}")))
        table = Table(show_header=True)
        table.add_column("values")
        table.add_column("statistic")
        table.add_column("", justify="right")
        packed = quant is not None and isinstance(quant[1], PackQuantized)
        _stats_rows(table, f"{t.dtype} packed words" if packed else t.dtype, st)
        if scale_st is not None:
            _stats_rows(table, f"scales {scale_st.dtype} {list(scale_st.shape)}", scale_st)
        if deq_st is not None:
            _stats_rows(table, f"dequantized {deq_st.dtype}", deq_st)
        stdout.print(table)
        for p in problems:
            stdout.print(Text(printable(p), style="red"))
    raise typer.Exit(1 if problems else 0)
