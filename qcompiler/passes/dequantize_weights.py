"""``dequantize-weights``: turn DequantizeLinear / QuantizeLinear of constants into constants.

A pre-quantized (QDQ) model imports with its int8 weights and int32 biases as quantized constants
behind a ``DequantizeLinear`` (qcompiler.frontend.onnx_qdq), and the default pipeline keeps them so
(const-fold skips Q/DQ): the given scales stay visible for a pass that maps Q/DQ pairs onto integer
kernels. The *float* build does not want them: its conv/gemm kernels take constant float weights.
This pass evaluates each such op with the numpy kernels of :mod:`qcompiler.ir.interp` (ONNX's
``(q - zero_point) * scale`` in float32, as ONNX Runtime computes it) and then const-folds what
became constant (e.g. a Transpose of a dequantized weight). Quantization of activations stays.
It is not in the default pipeline; the code generator runs it on a copy of the graph it lowers
(qcompiler.codegen.lower) when the graph has such ops.

Before::

    %w = const ... : tensor<4x3x3x3x!quant.uniform<i8:f32:0, {0.01:0, 0.02:0, 0.01:0, 0.03:0}>>
    %wd = DequantizeLinear(%w) : tensor<4x3x3x3xf32>
    %y = Conv(%x, %wd) {...} : tensor<1x4x8x8xf32>

After::

    %wd = const ... : tensor<4x3x3x3xf32>
    %y = Conv(%x, %wd) {...} : tensor<1x4x8x8xf32>
"""
from __future__ import annotations

from ..ir.graph import Graph, Op
from ..ir.types import quantize
from ._common import is_output
from .const_fold import ConstFoldOptions, _foldable, fold_op
from .manager import PassContext, register_pass

KINDS = ("DequantizeLinear", "QuantizeLinear")


def constant_quant_ops(graph: Graph) -> list[Op]:
    """The Q/DQ ops of ``graph`` whose operand is a constant."""
    return [op for op in graph.ops if op.kind in KINDS and op.operands[0].is_const and not is_output(op.result)]


def quantized_constants(graph: Graph) -> int:
    """Replace each QuantizeLinear of a constant (a QAT export's float weights: Q(w) -> DQ) by a
    constant of its quantized type holding the stored integers (ONNX's rounding, as
    :func:`qcompiler.ir.types.quantize` computes it); returns how many."""
    n = 0
    for op in graph.ops:
        if op.kind == "QuantizeLinear" and op.operands[0].is_const and not is_output(op.result):
            qp = op.result.type.quant
            c = graph.add_const(quantize(op.operands[0].data, qp), op.result.name, quant=qp)
            op.result.replace_all_uses_with(c)
            graph.erase_op(op)
            n += 1
    return n


@register_pass("dequantize-weights")
def dequantize_weights(graph: Graph, ctx: PassContext) -> bool:
    """Fold DequantizeLinear/QuantizeLinear of constants (the float build of a QDQ model), then const-fold."""
    n = quantized_constants(graph)
    n += sum(fold_op(graph, op) for op in constant_quant_ops(graph))
    if not n:
        return False
    opts, m = ConstFoldOptions(), 0
    for op in graph.ops:
        if _foldable(op, opts) and fold_op(graph, op):
            m += 1
    graph.remove_unused_consts()
    ctx.log(f"dequantize-weights: folded {n} Q/DQ ops of constants, then {m} ops")
    return True
