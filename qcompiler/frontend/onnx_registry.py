"""The table of ONNX node -> IR op converters, ``CONVERTERS``, and the small helpers every converter
module shares. The converters live in :mod:`.onnx_ops`, :mod:`.onnx_shape_ops`, :mod:`.onnx_control`,
:mod:`.onnx_rnn` and :mod:`.onnx_qdq`; each registers its functions with :func:`converter` on import
(:mod:`.onnx_import` imports them all).

    @converter("Relu", "Sigmoid")
    def _unary(b, n, a):                      # b: the importer's builder, n: the NodeProto, a: its attributes
        b.emit(n, n.op_type, [b.val(n.input[0])], {})
"""
from __future__ import annotations

from typing import Callable

import onnx

Converter = Callable[..., None]
CONVERTERS: dict[str, Converter] = {}


def converter(*kinds):
    def deco(fn):
        for k in kinds:
            CONVERTERS[k] = fn
        return fn
    return deco


def opt_input(n: onnx.NodeProto, i: int) -> str | None:
    return n.input[i] if len(n.input) > i and n.input[i] else None


def nonempty_const(b, n, i):
    """A constant optional input; None when omitted or an empty tensor."""
    name = opt_input(n, i)
    if name is None:
        return None
    v = b.need_const(n, i, f"input {i}")
    return v if v.size else None


def checked_axis(b, n, ax: int, rank: int) -> int:
    if not -rank <= ax < rank:
        raise b.fail(n, f"axis {ax} out of range for rank {rank}", "fix the model's axis attribute")
    return ax % rank


def only_first_output(b, n, what: str):
    for o in n.output[1:]:
        if o and b.used(o):
            raise b.fail(n, f"the {what} output is used", "qcompiler imports inference graphs: "
                         "export in eval/inference mode so this output is not needed")


def blocked_weight(w):
    """The constant blocked 4-bit weight behind the DequantizeLinear producing ``w`` (None if ``w`` is
    not one): what a MatMul or Conv converter imports as MatMulNBits / ConvNBits."""
    p = w.producer
    if p is None or p.kind != "DequantizeLinear" or not p.operands[0].is_const:
        return None
    q = p.operands[0]
    return q if q.type.quant is not None and q.type.quant.blocked and q.dtype in ("int4", "uint4") else None
