"""``const-fold``: evaluate ops whose operands are all constants and replace them by constants.

For an op ``y = f(c1, ..., cn)`` with every ``ci`` a constant and a numpy kernel for ``f`` in
:mod:`qcompiler.ir.interp`, ``y`` becomes the constant ``f(c1, ..., cn)`` computed at compile time
(the classic constant propagation of compilers, here over tensors: weight transposes and
reshapes, bias reshapes, shape arithmetic left by exporters). The new constant takes the result's
name and its declared dtype.

Folding must not inflate the model: a result is folded only if it has no more elements than its
operands together, or at most :attr:`ConstFoldOptions.max_new_elements` (an ``Expand`` of a scalar
to a large tensor stays an op). Ops whose results are graph outputs stay (the output keeps its
producer and name). ``DequantizeLinear`` of a quantized constant (the int8 weights and int32 biases
of a pre-quantized QDQ model) stays: the IR keeps the given quantization parameters visible for the
passes that map Q/DQ pairs onto integer kernels; the float code generator dequantizes such weights
itself (qcompiler.codegen.lower).

Before::

    graph @g(%x: tensor<1x4x2x2xf32>) {
      %b = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
      %b4 = Reshape(%b) {shape = [1, 4, 1, 1]} : tensor<1x4x1x1xf32>
      %y = Add(%x, %b4) : tensor<1x4x2x2xf32>
      return %y
    }

After::

    graph @g(%x: tensor<1x4x2x2xf32>) {
      %b4 = const dense<[1.0, 2.0, 3.0, 4.0]> : tensor<1x4x1x1xf32>
      %y = Add(%x, %b4) : tensor<1x4x2x2xf32>
      return %y
    }

(the unused ``%b`` is removed by the pass as well.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Op
from ..ir.interp import can_evaluate, evaluate
from ..ir.types import np_dtype
from ._common import is_output, pass_options
from .manager import PassContext, register_pass


@dataclass(frozen=True)
class ConstFoldOptions:
    max_new_elements: int = 1 << 16    # fold a result bigger than its operands only up to this size


KEEP = frozenset({"QuantizeLinear", "DequantizeLinear"})    # quantization stays visible (see above)


def _foldable(op: Op, opts: ConstFoldOptions) -> bool:
    if op.kind in KEEP:
        return False
    if not op.operands or not all(v.is_const for v in op.operands) or not can_evaluate(op.kind):
        return False
    if any(is_output(r) for r in op.results):
        return False
    out_size = sum(r.type.size for r in op.results)
    return out_size <= max(sum(v.type.size for v in op.operands), opts.max_new_elements)


def fold_op(graph: Graph, op: Op) -> bool:
    """Replace ``op`` by constants holding its results; False if evaluation failed."""
    try:
        arrays = evaluate(op, [v.data for v in op.operands])
    except (ValueError, TypeError, IndexError, FloatingPointError):
        return False
    if len(arrays) != len(op.results) or any(a.shape != r.type.shape for a, r in zip(arrays, op.results)):
        return False
    names = [r.name for r in op.results]
    consts = [graph.add_const(a.astype(np_dtype(r.type.dtype)), name=r.name + "_folded")
              for a, r in zip(arrays, op.results)]
    graph.replace_op(op, consts)
    for c, name in zip(consts, names):
        graph.rename(c, name)
    return True


@register_pass("const-fold", options=ConstFoldOptions)
def const_fold(graph: Graph, ctx: PassContext) -> bool:
    """Evaluate ops whose operands are all constants (numpy kernels of qcompiler.ir.interp)."""
    opts = pass_options(ctx, "const-fold", ConstFoldOptions)
    n = 0
    with np.errstate(all="ignore"):
        for op in graph.ops:                 # topological: folded results feed later folds
            if _foldable(op, opts) and fold_op(graph, op):
                n += 1
    n_dead = graph.remove_unused_consts() if n else 0
    ctx.log(f"const-fold: folded {n} ops ({n_dead} constants became unused)")
    return n > 0
