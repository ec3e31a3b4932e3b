"""``fuse-act``: fuse activation epilogues and residual adds into the producing Conv / Gemm.

The fused ops compute, per output element (the semantics of onnxruntime's com.microsoft
FusedConv/FusedGemm, see :mod:`qcompiler.ir.ops`)::

    FusedConv(X, W, B, Z) = act(Conv(X, W, B) + Z)
    FusedGemm(A, B, C)    = act(Gemm(A, B, C))

with ``act`` one of Relu, Clip(min, max) (ReLU6 is Clip(0, 6)), LeakyRelu(α), HardSigmoid(α, β),
HardSwish, Sigmoid, Tanh, stored as the ``activation``/``activation_params`` attributes. One
kernel then applies the epilogue while the accumulator is in registers (and a quantizer sees one
op with one output range instead of a pre-activation tensor that would need its own scale).

Rules (each checks that the intermediate result has a single use and is no graph output):

1. ``MatMul(A, B) + c`` with A, B 2-D and c a constant that broadcasts to (M, N) without growing it
   becomes ``Gemm(A, B, c)`` (α = β = 1).
2. ``Conv(X, W, B) + Z`` becomes ``FusedConv(X, W, B, Z)`` when Z has exactly the conv's output shape
   and dtype (a broadcasting Z is not a residual; a zero bias is added when B is absent). The Add
   must come *before* any activation: Conv→Add→Relu fuses completely, while Conv→Relu→Add fuses the
   Relu only (the activation is applied before the add there, and FusedConv adds Z before it).
3. ``act(Conv)``, ``act(Gemm)`` and ``act`` of a FusedConv/FusedGemm without activation become the
   fused op with that activation.

A fused op keeps the name of the Conv/Gemm it replaces (so ``graph.meta["bn_stats"]`` keys stay
valid). The inverse is ``expand-fused``.

Before::

    graph @g(%x: tensor<1x2x4x4xf32>, %skip: tensor<1x2x4x4xf32>) {
      %w = const dense<0.5> : tensor<2x2x1x1xf32>
      %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32>
      %s = Add(%y, %skip) : tensor<1x2x4x4xf32>
      %z = Relu(%s) : tensor<1x2x4x4xf32>
      return %z
    }

After::

    graph @g(%x: tensor<1x2x4x4xf32>, %skip: tensor<1x2x4x4xf32>) {
      %w = const dense<[0.5, 0.5, 0.5, 0.5]> : tensor<2x2x1x1xf32>
      %conv_zero_bias = const dense<[0.0, 0.0]> : tensor<2xf32>
      %z = FusedConv(%x, %w, %conv_zero_bias, %skip) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32>
      return %z
    }
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.activations import ACTIVATION_KINDS, activation_of
from ..ir.graph import Graph, Op as IROp
from ..ir.ops import broadcast_shapes, full_attrs
from ..ir.types import np_dtype
from ._common import both_orders, pass_options
from .manager import PassContext, register_pass
from .rewrite import Any, Const, Op, rewrite

FUSED = {"Conv": "FusedConv", "Gemm": "FusedGemm", "FusedConv": "FusedConv", "FusedGemm": "FusedGemm"}


@dataclass(frozen=True)
class FuseActOptions:
    activations: tuple[str, ...] = ACTIVATION_KINDS   # which activations to fuse
    residual: bool = True                              # Conv + Z -> FusedConv(..., Z)
    matmul_to_gemm: bool = True                        # 2-D MatMul + constant -> Gemm


def _no_activation(op: IROp) -> bool:
    return op.kind in ("Conv", "Gemm") or not op.attrs.get("activation")


def _to_fused(op: IROp) -> None:
    """Turn a Conv/Gemm into its fused kind in place (keeping its name and result value)."""
    if op.kind in ("Conv", "Gemm"):
        op.attrs = full_attrs(FUSED[op.kind], **op.attrs)
        op.kind = FUSED[op.kind]


def _matmul_add(g: Graph, m):
    a, b, c = m["a"], m["b"], m["c"]
    out = (a.shape[0], b.shape[1]) if a.type.rank == 2 and b.type.rank == 2 else None
    if out is None or c.type.rank > 2 or c.dtype != a.dtype or m.root.result.shape != out:
        return None
    try:
        if broadcast_shapes(c.shape, out) != out:
            return None
    except ValueError:
        return None
    return g.create_op("Gemm", [a, b, c], full_attrs("Gemm"), before=m.root, name=m["mm"].name or "gemm").result


def _residual(g: Graph, m):
    conv, z = m["conv"], m["z"]
    y = conv.result
    if z.shape != y.shape or z.dtype != y.dtype or m.root.result.shape != y.shape or z is y:
        return None
    ops = list(conv.operands)
    if len(ops) == 2:
        ops.append(g.add_const(np.zeros(y.shape[1], np_dtype(y.dtype)), (conv.name or "conv") + "_zero_bias"))
    _to_fused(conv)
    conv.set_operands(ops + [z])     # Z may be defined after the conv: the pass re-sorts at the end
    return y


def _activation(allowed: tuple[str, ...]):
    def fn(g: Graph, m):
        act = activation_of(m.root)
        if act is None or act[0] not in allowed:
            return None
        p = m["p"]
        _to_fused(p)
        p.attrs["activation"], p.attrs["activation_params"] = act
        return p.result
    return fn


def rules(opts: FuseActOptions) -> list:
    out = []
    if opts.matmul_to_gemm:
        out += both_orders("Add", Op("MatMul", Any("a"), Any("b"), name="mm", single_use=True), Const("c"), _matmul_add)
    if opts.residual:
        conv = Op(("Conv", "FusedConv"), name="conv", single_use=True, variadic=True,
                  where=lambda o: _no_activation(o) and len(o.operands) <= 3)
        out += both_orders("Add", conv, Any("z"), _residual)
    producer = Op(tuple(FUSED), name="p", single_use=True, variadic=True, where=_no_activation)
    out.append((Op(ACTIVATION_KINDS, producer), _activation(tuple(opts.activations))))
    return out


@register_pass("fuse-act", options=FuseActOptions)
def fuse_act(graph: Graph, ctx: PassContext) -> bool:
    """Fuse activations and residual adds into Conv/Gemm (FusedConv/FusedGemm); 2-D MatMul + bias
    constant -> Gemm."""
    opts = pass_options(ctx, "fuse-act", FuseActOptions)
    changed = rewrite(graph, rules(opts))
    if changed:
        graph.toposort()
        graph.remove_unused_consts()
    return changed
