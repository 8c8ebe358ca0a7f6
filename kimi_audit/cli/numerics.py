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
from kimi_audit.model.checkpoint import load_model
from kimi_audit.model.config_fields import ModelConfig
from kimi_audit.model.layout import layer_block, role_name
from kimi_audit.numerics.tensor_io import DEFAULT_MAX_TENSOR_BYTES, TensorFetcher
from kimi_audit.report.tensor import json_text, render_rmsnorm, render_tensor
from kimi_audit.sources import open_source
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
    seed: int | None = typer.Option(None, "--seed", help="Seed of the random bf16 input (default 0)."),
    tokens: int | None = typer.Option(None, "--tokens", "-t", min=1, max=1 << 16,
                                      help="Positions T of the random input (default 16)."),
    batch: int | None = typer.Option(None, "--batch", "-b", min=1, max=1 << 12,
                                     help="Batch B of the random input (default 1)."),
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
        check_input_memory,
        load_input,
        normalize_and_check,
        query_latent,
        random_input,
    )

    if input_file is not None and from_embeddings is not None:
        raise KimiAuditError("--input and --from-embeddings are exclusive")
    if layer and all_layers:
        raise KimiAuditError("--layer and --all are exclusive: --all is every layer")
    given = [o for o, v in (("--seed", seed), ("--tokens", tokens), ("--batch", batch)) if v is not None]
    if given and (input_file is not None or from_embeddings is not None):
        raise KimiAuditError(f"{', '.join(given)} shape the random input; "
                             f"{'--input' if input_file is not None else '--from-embeddings'} gives the input")
    src = open_source(source, revision)
    _, cfg, spelled = load_model(src)
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
        emb, _, _ = fetch.read_rows(role_name(cfg, None, "embedding") or cfg.prefix + EMBED, ids)
        shared_x = None
        input_desc: dict[str, Any] = {"kind": "embeddings", "token_ids": ids, "shape": [1, len(ids), width]}
    elif input_file is not None:
        shared_x = load_input(input_file, width, len(layers))
        input_desc = {"kind": "file", "path": str(input_file), "shape": list(shared_x.shape)}
    else:
        seed, batch, tokens = seed or 0, batch or 1, tokens or 16
        check_input_memory((batch, tokens, width), len(layers))  # before anything is allocated or read
        shared_x = random_input(seed, batch, tokens, width)
        input_desc = {"kind": "random", "seed": seed, "shape": [batch, tokens, width], "dtype": "BF16"}

    results: list[LayerResult] = []
    for n in layers:
        found = role_name(cfg, n, "q_a_layernorm")
        if found is None:
            raise KimiAuditError(f"{src.label}: layer {n} has no query latent RMSNorm (q_a_layernorm)")
        name = spelled(found)
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
    from kimi_audit.checks.tensor import check_tensor

    src = open_source(source, revision)
    result = check_tensor(src, name, dequant=dequant, max_bytes=max_bytes)
    for note in result.notes:
        stderr.print(Text(printable("note: " + note)))
    doc = result.doc
    if as_json:
        sys.stdout.write(json_text(doc))
    else:
        scheme = result.scheme
        dtype = str(doc["dtype"])
        render_tensor(stdout, doc, f"{dtype} packed words" if scheme is not None and scheme.param_dtype else dtype,
                      None if scheme is None else scheme.describe())
    raise typer.Exit(0 if result.ok else 1)
