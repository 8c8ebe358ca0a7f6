"""The family members a replica can be built of: config, shard names and count, what is stored, and which
shard holds each tensor (facts from the releases; see replica.build for the writing).

- kimi-k2-instruct, kimi-k2-base: `model-{i}-of-61.safetensors`, one decoder layer per shard (shard 1 also
  holds the embedding, shard 61 the final norm and lm_head); FP8 block scales.
- kimi-k2-instruct-0905, kimi-k2-thinking: 62 shards `model-00001-of-000062.safetensors`: the embedding
  alone in shard 1, layer i in shard i + 2, the final norm and lm_head with the last layer. Thinking
  stores its routed experts INT4 (compressed-tensors pack-quantized).
- deepseek-v3, deepseek-v32: 163 shards `model-00001-of-000163.safetensors`: the multi-token-prediction
  layer (61) alone in the last one, everything before it cut into 162 shards of about equal bytes.
  No `rotary_emb.inv_freq` is stored.
- deepseek-v4-flash: DeepSeek's names (`layers.N.attn.*`, `embed.weight`, `head.weight`), BF16, no MTP
  module, 46 shards of about equal bytes (Flash-Base's count, unconfirmed; the shard names as DeepSeek-V3's):
  the sources of its config and what it leaves out are in data/deepseek-v4-flash.sources.json.
- kimi-k2-instruct-mlx-4bit: Kimi-K2-Instruct as mlx-lm 0.32 converts it with `-q` (mlx-community's 4-bit:
  affine, 4 bits, groups of 64; config.json as its save_config writes it), its tree from mlx-lm's DeepseekV3
  `sanitize` (model.arch.deepseek_v3 MLX_TREE), cut into shards by its 5 GiB rule (`model-00001-of-00180`).
- kimi-k2.6: 64 shards `model-00001-of-000064.safetensors` (family.md); which tensor sits in which shard is not
  published: the layout cut into 64 shards of about equal bytes. Config and its sources:
  kimi_audit/data/kimi-k2.6.config.json and kimi-k2.6.sources.md. No `rotary_emb.inv_freq` stored (not known).
- kimi-k2-instruct-nvfp4, kimi-k2-instruct-mxfp4-attnfp8: Kimi-K2-Instruct's layout in 61 shards, quantized as
  NVIDIA ModelOpt 0.47 and AMD Quark 0.13 write it: the pinned config with the quantization_config each exporter
  wrote for the tiny model in tests/data/modelopt/nvfp4-kv and tests/data/quark/mxfp4-attnfp8, its ignore list
  spelled for Kimi-K2's modules (these are the exporters' layouts, not the vendors' published configs).
- kimi-k2-instruct-gguf: Kimi-K2-Instruct as llama.cpp's converter and a dynamic 2-bit quantization write it
  (unsloth's `UD-Q2_K_XL/Kimi-K2-Instruct-UD-Q2_K_XL-0000N-of-00008.gguf`): replica.gguf.
- kimi-k3: 96 shards `model-00001-of-000096.safetensors` (family.md: 96 shards, 1.42 TB), the text model cut into
  shards of about equal bytes; its vision tower and projector are not described and not stored. Config and its
  sources: kimi_audit/data/kimi-k3.config.json and kimi-k3.sources.md.

Every assignment keeps a weight and its quantization metadata (FP8 scale, INT4 group scale and shape) in
one shard: the published DeepSeek-V3 splits a few pairs, which audits as SCALE_SHARD_SPLIT infos, and a
clean replica must audit clean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

from kimi_audit.model.arch.spec import MTP
from kimi_audit.model.layout import ExpectedTensor

# As the Kimi-K2 releases' shard headers store rotary_emb.inv_freq: BF16 [56], not [qk_rope_head_dim / 2].
STORED_INV_FREQ_SHAPE = (56,)

Assign = Callable[[Sequence[ExpectedTensor], int], list[int]]
"""(the tensors to store, in layout order; the shard count) -> each one's shard number, 1-based."""


def plain_name(i: int, n: int) -> str:
    return f"model-{i}-of-{n}.safetensors"


def padded_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:06d}.safetensors"


def layer_per_shard(tensors: Sequence[ExpectedTensor], n: int) -> list[int]:
    """Layer i in shard i + 1; the embedding in the first, everything else outside the layers in the last."""
    return [t.layer + 1 if t.layer is not None else 1 if t.name == "model.embed_tokens.weight" else n
            for t in tensors]


def embedding_alone(tensors: Sequence[ExpectedTensor], n: int) -> list[int]:
    """The embedding alone in shard 1, layer i in shard i + 2, the rest (norm, lm_head) in the last."""
    return [t.layer + 2 if t.layer is not None else 1 if t.name == "model.embed_tokens.weight" else n
            for t in tensors]


def balanced_mtp_last(tensors: Sequence[ExpectedTensor], n: int) -> list[int]:
    """The MTP layers alone in the last shard; the rest cut in layout order into n - 1 shards of about equal
    payload, never between a tensor and the quantization metadata after it (`owner`). Shard k holds the
    modules whose first byte falls in the k-th (n - 1)-th of the bytes: none is empty while no module is
    bigger than a shard's share."""
    main = [t for t in tensors if t.block != MTP]
    total = sum(t.nbytes or 0 for t in main)
    cuts = n - 1 if len(main) < len(tensors) else n  # no MTP layer: every shard takes a share
    out: list[int] = []
    pos, shard = 0, 1
    for t in tensors:
        if t.block == MTP:
            out.append(n)
            continue
        if not t.owner:  # a module's first tensor: it may open the next shard
            shard = min(cuts, pos * cuts // total + 1)
        out.append(shard)
        pos += t.nbytes or 0
    return out


MLX_SHARD_BYTES = 5 << 30
"""mlx-lm's shard limit (utils.py MAX_FILE_SIZE_GB = 5, in GiB)."""


def mlx_name(i: int, n: int) -> str:
    """mlx-lm's save_model: `model-00001-of-00180.safetensors`."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def mlx_greedy(tensors: Sequence[ExpectedTensor], n: int) -> list[int]:
    """mlx-lm's make_shards: tensors in order, a new shard whenever the next would take this one past 5 GiB
    (the order here is the layout's, mlx's parameter order by module: embedding, layers, norm, head). `n` is
    what the replica declares; a count the rule does not give is a ValueError (tests/test_mlx.py)."""
    out: list[int] = []
    size = 0
    for t in tensors:
        if not out or size + (t.nbytes or 0) > MLX_SHARD_BYTES:
            out.append(out[-1] + 1 if out else 1)
            size = 0
        else:
            out.append(out[-1])
        size += t.nbytes or 0
    if out and out[-1] != n:
        raise ValueError(f"mlx-lm's 5 GiB rule gives {out[-1]} shards, the replica declares {n}")
    return out


@dataclass(frozen=True)
class ReplicaModel:
    name: str
    title: str
    """The release it replicates, as the demo names it (`replica of the TITLE layout`)."""
    config: str
    """config.json shipped as package data (kimi_audit/data/)."""
    shards: int
    shard_name: Callable[[int, int], str]
    assign: Assign
    inv_freq: tuple[int, ...] | None
    """The shape `rotary_emb.inv_freq` is stored in (None: not stored)."""
    gguf_stem: str = ""
    """A GGUF split set (replica.gguf) of `shards` parts named `{gguf_stem}-0000N-of-0000M.gguf`, not safetensors."""

    def config_bytes(self) -> bytes:
        return resources.files("kimi_audit").joinpath(f"data/{self.config}").read_bytes()


REPLICA_MODELS: dict[str, ReplicaModel] = {m.name: m for m in (
    ReplicaModel("kimi-k2-instruct", "pinned Kimi-K2-Instruct",
                 "kimi-k2-instruct.config.json", 61, plain_name, layer_per_shard, STORED_INV_FREQ_SHAPE),
    ReplicaModel("kimi-k2-base", "Kimi-K2-Base (as Instruct)", "kimi-k2-instruct.config.json",
                 61, plain_name, layer_per_shard, STORED_INV_FREQ_SHAPE),
    ReplicaModel("kimi-k2-instruct-0905", "Kimi-K2-Instruct-0905", "kimi-k2-instruct-0905.config.json",
                 62, padded_name, embedding_alone, STORED_INV_FREQ_SHAPE),
    ReplicaModel("kimi-k2-thinking", "Kimi-K2-Thinking (INT4)", "kimi-k2-thinking.config.json",
                 62, padded_name, embedding_alone, STORED_INV_FREQ_SHAPE),
    ReplicaModel("deepseek-v3", "DeepSeek-V3 (with MTP)", "deepseek-v3.config.json",
                 163, padded_name, balanced_mtp_last, None),
    ReplicaModel("deepseek-v32", "DeepSeek-V3.2 (with MTP)",
                 "deepseek-v32.config.json", 163, padded_name, balanced_mtp_last, None),
    ReplicaModel("deepseek-v4-flash", "DeepSeek-V4-Flash (BF16, no MTP)", "deepseek-v4-flash.config.json",
                 46, padded_name, balanced_mtp_last, None),
    ReplicaModel("kimi-k2-instruct-mlx-4bit", "Kimi-K2-Instruct as mlx-lm converts it (MLX affine 4-bit)",
                 "kimi-k2-instruct-mlx-4bit.config.json", 180, mlx_name, mlx_greedy, None),
    ReplicaModel("kimi-k2.6", "Kimi-K2.6 (kimi_k25: text, vision tower, projector; INT4 experts)",
                 "kimi-k2.6.config.json", 64, padded_name, balanced_mtp_last, None),
    ReplicaModel("kimi-k3", "Kimi K3 (kimi_k3: text model, MXFP4 experts; no vision tower)",
                 "kimi-k3.config.json", 96, padded_name, balanced_mtp_last, None),
    ReplicaModel("kimi-k2-instruct-nvfp4", "Kimi-K2-Instruct as NVIDIA ModelOpt 0.47 exports it (NVFP4, FP8 KV cache)",
                 "kimi-k2-instruct-nvfp4.config.json", 61, plain_name, layer_per_shard, None),
    ReplicaModel("kimi-k2-instruct-mxfp4-attnfp8",
                 "Kimi-K2-Instruct as AMD Quark 0.13 exports it (MXFP4, FP8 attention)",
                 "kimi-k2-instruct-mxfp4-attnfp8.config.json", 61, plain_name, layer_per_shard, None),
    ReplicaModel("kimi-k2-instruct-gguf", "Kimi-K2-Instruct as llama.cpp converts it (GGUF, a 2-bit-like mix, 8 parts)",
                 "kimi-k2-instruct.config.json", 8, padded_name, balanced_mtp_last, None,
                 gguf_stem="UD-Q2_K_XL/Kimi-K2-Instruct-UD-Q2_K_XL"),
)}
DEFAULT_MODEL = "kimi-k2-instruct"


def replica_model(name: str) -> ReplicaModel:
    try:
        return REPLICA_MODELS[name]
    except KeyError:
        raise ValueError(f"no replica of {name!r}; one of {', '.join(REPLICA_MODELS)}") from None
