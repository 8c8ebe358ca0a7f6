"""Kimi-Linear (`kimi_linear`) as data: KDA linear-attention layers beside MLA layers, dense or MoE MLPs.

Mirrors transformers 5.25's modeling_kimi_linear.py, named as Moonshot's release names its tensors (the
checkpoint conversion mapping of transformers 5.25, `kimi_linear`, read backwards):
- a KDA layer (KimiLinearDeltaAttention): `self_attn.{q,k,v}_proj`, the short convolutions
  `self_attn.{q,k,v}_conv1d.weight` [heads × head dim, 1, kernel] (transformers fuses them into one `conv1d`),
  the forget gate `self_attn.{f_a_proj, f_b_proj, dt_bias (F32), A_log}` (transformers: `forget_gate.*`),
  `self_attn.b_proj`, the output gate `self_attn.{g_a_proj, g_b_proj}`, `self_attn.o_norm`, `self_attn.o_proj`;
- an MLA layer: DeepseekV3's latent attention without a rotary buffer (model.arch.deepseek_v3);
- a dense layer's MLP `mlp.{gate,up,down}_proj`; an MoE layer's `block_sparse_moe.gate.weight` (F32),
  `block_sparse_moe.gate.e_score_correction_bias` (F32), `block_sparse_moe.experts.E.{w1,w2,w3}` and
  `block_sparse_moe.shared_experts.{gate,up,down}_proj`.

Dialect `transformers`: transformers 5.x's save_pretrained renames every `mlp.` to `block_sparse_moe.`, so the
dense layers' MLP is written `block_sparse_moe.{gate,up,down}_proj`; the rest as released.

Kimi K3 (July 2026) builds on this architecture, but its configuration class (`KimiK3ForConditionalGeneration`)
is not in transformers 5.25 and its config.json was not read: its attention residual projections, latent MoE
(7168 -> 3584) and vision tower are not described; a K3 config keeps LAYOUT_UNSUPPORTED.
"""

from __future__ import annotations

from kimi_audit.model.arch.deepseek_v3 import _Describe as _MLA
from kimi_audit.model.arch.spec import (
    BLOCK_KEYS,
    DTYPE_KEYS,
    Buffer,
    Factor,
    Group,
    Leaf,
    Linear,
    ModelTree,
    Node,
    Param,
)
from kimi_audit.model.config import ModelConfig

MODEL_TYPES = ("kimi_linear",)
DIALECTS = {"transformers": r"^model\.layers\.\d+\.block_sparse_moe\.(gate|up|down)_proj\."}
"""Dialect -> a pattern only its names match (model.arch.registry.detect_dialect)."""
DIALECT_NOTES = {"transformers": "transformers 5.x's save_pretrained spelling (the dense layers' MLP under "
                                 "`block_sparse_moe.` instead of `mlp.`)"}
GAIN = "Learned gain"


def describe(cfg: ModelConfig) -> ModelTree:
    return _Describe(cfg).tree()


class _Describe(_MLA):
    def tree(self) -> ModelTree:
        base = super().tree()
        return ModelTree(base.before, {kind: self.layer(kind) for kind in dict.fromkeys(self.cfg.layer_kinds)},
                         base.after)

    def layer(self, kind: str) -> tuple[Node, ...]:
        mlp, attention = kind.split("_")
        mla = self.attention()
        attn = self.kda() if attention == "kda" else Group(
            mla.key, mla.title, tuple(c for c in mla.children if not isinstance(c, Buffer)))
        return (self.norms(), attn, *(self.moe() if mlp == "moe" else self.dense()))

    def kda(self) -> Group:
        c = self.cfg
        h = self.f("hidden_size", "hidden")
        heads, hd = c.dim("linear_num_heads"), c.dim("linear_head_dim")
        nh = Factor(heads, "linear heads", ("linear_num_heads",))
        d = Factor(hd, "linear head dim", ("linear_head_dim",))
        qkv = Factor(heads * hd, "heads × head dim", ("linear_num_heads", "linear_head_dim"),
                     f"({heads} × {hd})")
        kernel = Factor(c.dim("linear_conv_kernel_dim"), "kernel", ("linear_conv_kernel_dim",))
        one = Factor(1, "channel", ())
        k = (BLOCK_KEYS, DTYPE_KEYS)

        def lin(p: str, title: str, out: Factor, inp: Factor) -> Leaf:
            return Leaf(p, p, title, f"kda_{p}", (Linear(f"self_attn.{p}", (out,), (inp,)),), k)

        def param(p: str, title: str, shape: tuple[Factor, ...], dtype: str, label: str = "Weight") -> Leaf:
            name = p.removesuffix(".weight")
            return Leaf(name, name, title, f"kda_{name}", (Param(label, f"self_attn.{p}", shape, dtype),),
                        (BLOCK_KEYS,))

        return Group("attention", "Kimi delta attention (KDA)", (
            lin("q_proj", "Query projection", qkv, h), lin("k_proj", "Key projection", qkv, h),
            lin("v_proj", "Value projection", qkv, h),
            *(param(f"{x}_conv1d.weight", f"{t} short convolution", (qkv, one, kernel), c.dtype)
              for x, t in (("q", "Query"), ("k", "Key"), ("v", "Value"))),
            lin("f_a_proj", "Forget-gate down-projection", d, h), lin("f_b_proj", "Forget-gate up-projection", qkv, d),
            param("dt_bias", "Forget-gate bias", (qkv,), "F32", "Bias"),
            param("A_log", "Decay (log)", (one, one, nh, one), c.dtype, "Parameter"),
            lin("b_proj", "Beta projection", nh, h),
            lin("g_a_proj", "Output-gate down-projection", d, h), lin("g_b_proj", "Output-gate up-projection", qkv, d),
            param("o_norm.weight", "Gated output RMSNorm", (d,), c.dtype, GAIN),
            lin("o_proj", "Output projection", h, qkv)))

    def dense(self) -> tuple[Node, ...]:
        module = "block_sparse_moe" if self.cfg.dialect == "transformers" else "mlp"
        return (self.mlp("mlp", "MLP (dense)", "mlp", module, self.f("intermediate_size", "intermediate"),
                         (BLOCK_KEYS, "intermediate_size")),)

    def moe(self) -> tuple[Node, ...]:
        c = self.cfg
        assert c.n_routed_experts is not None
        e, h = self.f("n_routed_experts", "experts"), self.f("hidden_size", "hidden")
        inter = self.f("moe_intermediate_size", "moe intermediate")
        router = Group("router", "Router", (
            Leaf("gate", "gate", "Router gate (expert affinities)", "router_gate",
                 (Param("Weight", "block_sparse_moe.gate.weight", (e, h), "F32"),), (BLOCK_KEYS, "num_experts")),
            Leaf("e_score_correction_bias", "e_score_correction_bias", "Expert score correction bias",
                 "e_score_correction_bias",
                 (Param("Bias", "block_sparse_moe.gate.e_score_correction_bias", (e,), "F32"),), (BLOCK_KEYS,))))
        rows = (("w1", "Gate projection", (inter,), (h,)), ("w2", "Down projection", (h,), (inter,)),
                ("w3", "Up projection", (inter,), (h,)))
        experts = Group("experts", "Routed experts", tuple(
            Leaf(p, p, t, f"expert_{p}", (Linear(f"block_sparse_moe.experts.{p}", out, inp),),
                 (BLOCK_KEYS, "moe_intermediate_size", DTYPE_KEYS)) for p, t, out, inp in rows),
            repeat=Factor(c.n_routed_experts, "experts", ("n_routed_experts",)), index_at="experts.")
        out: list[Node] = [router, experts]
        if c.n_shared_experts:
            sh = Factor(c.moe_intermediate_size * c.n_shared_experts, "shared intermediate",
                        ("moe_intermediate_size", "num_shared_experts"))
            out.append(self.mlp("shared_experts", "Shared experts", "shared", "block_sparse_moe.shared_experts", sh,
                                (BLOCK_KEYS, "moe_intermediate_size", "num_shared_experts")))
        return tuple(out)
