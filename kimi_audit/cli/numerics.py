"""The `rmsnorm` and `tensor` commands: numpy numerics on the real weights, fetched by byte range.

Imported by cli.py, they register themselves on its `app`. Every tensor is read with range reads
through the Source interface (local directory or Hub): a 3 KB gain is 3 KB on the wire. The numerics
(numpy, ml_dtypes) are imported inside the commands, so `--help` and the other commands never load them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.text import Text

from kimi_audit.cli.application import app, stderr, stdout, user_errors
from kimi_audit.constants import PINNED_REPO_ID
from kimi_audit.errors import KimiAuditError
from kimi_audit.findings import Severity, error
from kimi_audit.format.header import TensorInfo
from kimi_audit.model.checkpoint import load_config
from kimi_audit.model.config import ModelConfig
from kimi_audit.model.kinds import PACKED_WEIGHT, PARAMETER, WEIGHT, module_name, role_of
from kimi_audit.model.layout import expected_layout, layer_block, scheme_of
from kimi_audit.model.quant.deepseek import Fp8Block
from kimi_audit.model.quant.scheme import FP8_DTYPE, Scheme, Unquantized, fp8_block
from kimi_audit.numerics.tensor_io import DEFAULT_MAX_TENSOR_BYTES, TensorFetcher, check_memory
from kimi_audit.report.tensor import json_text, render_rmsnorm, render_tensor
from kimi_audit.sources import open_source
from kimi_audit.sources.base import Source
from kimi_audit.text import printable

if TYPE_CHECKING:
    from kimi_audit.checks.rmsnorm import LayerResult


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
        emb, _, _ = fetch.read_rows(cfg.prefix + EMBED, ids)
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
        name = f"{cfg.layer_prefix}{n}.{Q_A_LAYERNORM}"
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
        sys.stdout.write(json_text(doc))
    else:
        render_rmsnorm(stdout, src.label, src.revision, cfg.rms_norm_eps, input_desc, results, show,
                       fetch.bytes_read)
    raise typer.Exit(0 if ok else 1)


# ------------------------------------------------------------------ tensor


def _resolve(fetch: TensorFetcher, name: str) -> str:
    """A tensor's name as given; a Linear module's name: its stored weight (`.weight`, INT4 `.weight_packed`)."""
    if fetch.listed(name):
        return name
    for suffix in (".weight", ".weight_packed"):
        if fetch.listed(name + suffix):
            return name + suffix
    return name  # not found: the read says so


def _quantized_module(src: Source, name: str, t: TensorInfo) -> tuple[str, Scheme, int | None, int | None] | None:
    """(module, scheme, out, in) for a quantized module's stored weight (the first tensor its scheme stores: an FP8
    or INT8 `weight`, packed `weight_packed` words, DeepSeek-V4's FP4 `weight` bytes), else None. The scheme is the
    one the config's plan gives the module (FP8 weights it does not describe as such: DeepSeek's blocks); out x in
    comes from the layout config.json implies (None for a packed module the layout lacks: then from
    weight_shape)."""
    role = role_of(name)
    fp8 = role == WEIGHT and t.dtype == FP8_DTYPE and len(t.shape) == 2
    if role not in (WEIGHT, PACKED_WEIGHT):
        return None
    module = module_name(name)
    try:
        _, cfg = load_config(src)
    except KimiAuditError:
        if not fp8 and role != PACKED_WEIGHT:
            return None
        if not fp8:
            raise
        return module, Fp8Block(), t.shape[0], t.shape[1]  # no usable config: DeepSeek's blocks
    scheme = scheme_of(cfg, module)
    main = scheme.stored(1, 1)[0]
    if fp8 and main.dtype != FP8_DTYPE:  # FP8 weights the config does not describe as such: DeepSeek's blocks
        return module, Fp8Block(fp8_block(cfg.quant)), t.shape[0], t.shape[1]
    if role == WEIGHT and (isinstance(scheme, Unquantized) or t.dtype != main.dtype):
        return None  # a plain tensor under a quantized module's name: its own dtype is what the layout checks
    if module + main.suffix != name:
        raise KimiAuditError(f"{name}: config.json does not describe {module} as stored in {t.dtype} "
                             f"{name[len(module) + 1:]} ({scheme.describe()})")
    e = expected_layout(cfg).get(name)
    if e is None or not e.shape[0]:
        if main.kind == PARAMETER and len(t.shape) == 2:
            return module, scheme, t.shape[0], t.shape[1]
        return module, scheme, None, None
    return module, scheme, e.shape[0], e.logical // e.shape[0]


@app.command()
@user_errors
def tensor(
    source: str = typer.Argument(..., help="Local checkpoint directory or Hub repo id `owner/name[@revision]`."),
    name: str = typer.Argument(..., help="Tensor name (model.layers.0.self_attn.q_a_layernorm.weight) or Linear "
                                         "module name (model.layers.5.mlp.experts.7.gate_proj)."),
    revision: str | None = typer.Option(None, "--revision", "-r", help="Hub revision."),
    dequant: bool = typer.Option(False, "--dequant", help="For a quantized weight (FP8, INT4/INT8, NVFP4, MXFP4, "
                                 "DeepSeek-V4 FP4): statistics of the dequantized values, computed as the format's "
                                 "writer decompresses them."),
    max_bytes: int = typer.Option(DEFAULT_MAX_TENSOR_BYTES, "--max-bytes", min=1,
                                  help="Refuse to fetch a tensor larger than this."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Fetch one tensor by byte range and print its value statistics (and its scales').

    A module name stands for its stored weight: `.weight`, or `.weight_packed` for compressed-tensors' packed
    formats.
    Fails (exit 1) on NaN/Inf values, scales that are not finite and > 0, a quantization tensor absent, or an
    INT4 weight_shape that disagrees with the config's [out, in].
    """
    import numpy as np

    from kimi_audit.checks.values import (
        GLOBAL_SCALE,
        GROUP_SCALE,
        SCALE,
        VALUES,
        WEIGHT_SHAPE,
        check_values,
        scale_values,
        value_kind,
    )
    from kimi_audit.numerics.dtypes import NumericsError
    from kimi_audit.numerics.kernels import tensor_stats

    src = open_source(source, revision)
    fetch = TensorFetcher(src)
    name = _resolve(fetch, name)
    arr, t, shard = fetch.read(name, max_bytes)
    st = tensor_stats(arr, dtype=t.dtype)
    findings = check_values(name, value_kind(name, t.dtype) or VALUES, arr, shard=shard)
    scale_st = deq_st = None
    scale_name: str | None = None
    weight_shape: list[int] | None = None
    quant = _quantized_module(src, name, t)
    if quant is not None:
        module, scheme, out, inp = quant
        kind = scheme.name
        stored: dict[str, np.ndarray] = {name[len(module):]: arr}
        complete = True
        for s in scheme.stored(out or 1, inp or 1):
            full = module + s.suffix
            if s.suffix in stored:
                continue
            if not fetch.listed(full):
                findings.append(error("SCALE_MISSING", f"{name} is {kind} but {full} is absent", tensor=full))
                complete = False
                continue
            a, ti, s_shard = fetch.read(full, max_bytes)
            stored[s.suffix] = a
            what = value_kind(full, ti.dtype)
            if what in (SCALE, GROUP_SCALE, GLOBAL_SCALE):
                if scale_name is None and what != GLOBAL_SCALE:
                    scale_name, scale_st = full, tensor_stats(scale_values(a, ti.dtype), dtype=ti.dtype)
                findings += check_values(full, what, a, shard=s_shard)
            elif what == WEIGHT_SHAPE:
                weight_shape = [int(v) for v in a.reshape(-1)]
                if out is None and len(weight_shape) == 2:
                    out, inp = weight_shape
                else:
                    bad = check_values(full, WEIGHT_SHAPE, a, expected_shape=(out or 0, inp or 0), shard=s_shard)
                    findings += bad
                    complete = complete and not bad
        if dequant and complete and out is not None and inp is not None:
            check_memory(scheme.dequant_bytes_per_value * out * inp, f"dequantizing {module} ({out * inp:,} values)")
            try:
                deq_st = tensor_stats(scheme.dequantize(stored, out, inp))
            except NumericsError as e:
                findings.append(error("SHAPE_MISMATCH", f"{module}: cannot dequantize: {e}", tensor=module))
    elif dequant:
        stderr.print(Text(printable(f"note: {name} is {t.dtype}, not a quantized weight: nothing to dequantize")))

    problems = [f"{f.code}: {f.message}" for f in findings if f.severity == Severity.ERROR]
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
    if as_json:
        sys.stdout.write(json_text(doc))
    else:
        packed = quant is not None and bool(quant[1].param_dtype)
        render_tensor(stdout, doc, f"{t.dtype} packed words" if packed else t.dtype,
                      None if quant is None else quant[1].describe())
    raise typer.Exit(1 if problems else 0)
