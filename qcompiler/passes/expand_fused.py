"""``expand-fused``: the inverse of fuse-act — FusedConv/FusedGemm back to standard ONNX ops.

By the definitions of the fused ops (:mod:`qcompiler.ir.ops`)::

    FusedConv(X, W, B, Z) = act(Conv(X, W, B) + Z)   ->  Conv(X, W, B) [, Add(·, Z)] [, act(·)]
    FusedGemm(A, B, C)    = act(Gemm(A, B, C))       ->  Gemm(A, B, C) [, act(·)]

where ``act`` is rebuilt from ``activation``/``activation_params`` (Clip's bounds, LeakyRelu's α,
HardSigmoid's α and β). All of these are standard ONNX ops (HardSwish from opset 14), so the ONNX
exporter calls :func:`expand_fused` on a copy of a fused graph. The Conv/Gemm keeps the fused op's
name and result value; the Add and activation ops are named after it (``<name>_add``,
``<name>_act``) and the last one takes over the fused op's uses (and its name, if it is a graph
output).

Before::

    graph @g(%x: tensor<1x2x4x4xf32>, %skip: tensor<1x2x4x4xf32>) {
      %w = const dense<0.5> : tensor<2x2x1x1xf32>
      %b = const dense<0.0> : tensor<2xf32>
      %z = FusedConv(%x, %w, %b, %skip) {activation = "Clip", activation_params = [0.0, 6.0], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32>
      return %z
    }

After::

    graph @g(%x: tensor<1x2x4x4xf32>, %skip: tensor<1x2x4x4xf32>) {
      %w = const dense<[0.5, 0.5, 0.5, 0.5]> : tensor<2x2x1x1xf32>
      %b = const dense<[0.0, 0.0]> : tensor<2xf32>
      %z_replaced = Conv(%x, %w, %b) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32>
      %fusedconv_add_out = Add(%z_replaced, %skip) : tensor<1x2x4x4xf32>
      %z = Clip(%fusedconv_add_out) {max = 6.0, min = 0.0} : tensor<1x2x4x4xf32>
      return %z
    }
"""
from __future__ import annotations

from ..ir.activations import make_activation
from ..ir.graph import Graph, Op
from .manager import PassContext, register_pass

BASE = {"FusedConv": "Conv", "FusedGemm": "Gemm"}
_FUSED_ATTRS = ("activation", "activation_params")


def expand_op(graph: Graph, op: Op) -> None:
    """Rewrite one FusedConv/FusedGemm in place into Conv/Gemm followed by its Add and activation."""
    y = op.result
    z = op.operands[3] if op.kind == "FusedConv" and len(op.operands) == 4 else None
    act, params = op.attrs.get("activation", ""), op.attrs.get("activation_params", [])
    op.kind = BASE[op.kind]
    op.attrs = {k: v for k, v in op.attrs.items() if k not in _FUSED_ATTRS}
    if z is not None:
        op.set_operands(op.operands[:3])
    first = last = None
    if z is not None:
        first = last = graph.create_op("Add", [y, z], after=op, name=f"{op.name}_add")
    if act:
        last = make_activation(graph, act, params, last.result if last else y, after=last or op,
                               name=f"{op.name}_act")
        first = first or last
    if last is not None:
        y.replace_all_uses_with(last.result)   # also redirects the new first op's input ...
        first.set_operand(0, y)                # ... which is put back


def expand_fused(graph: Graph) -> bool:
    """Expand every FusedConv/FusedGemm of ``graph`` into standard ONNX ops; True if any was found."""
    fused = [op for op in graph.ops if op.kind in BASE]
    for op in fused:
        expand_op(graph, op)
    return bool(fused)


@register_pass("expand-fused")
def expand_fused_pass(graph: Graph, ctx: PassContext) -> bool:
    """FusedConv/FusedGemm -> Conv/Gemm [+ Add] [+ activation] (standard ONNX, for export)."""
    return expand_fused(graph)
