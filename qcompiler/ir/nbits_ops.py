"""The weight-only quantized op kinds (``--weights int4``: :mod:`qcompiler.passes.quantize_weights`):
a float activation times a constant weight stored in 4 bits with a scale and zero point per block
of its inputs, and a float embedding table stored so. Named after the ONNX Runtime (com.microsoft)
operators they import from and export to; the weight is one typed operand (its blocks, scales and
zero points in its :class:`~qcompiler.ir.types.QuantParams`) instead of ORT's three tensors::

    MatMulNBits(a, w[, bias])   a float32 [..., K]; w [N, K] int4/uint4 (or 8-bit), blocked along
                                axis 1 (scales [N, ceil(K/B)]); bias float32 [N]
        y[..., n] = Σ_k a[..., k] · ŵ[n, k] (+ bias[n])       float32 [..., N]
        ŵ[n, k]   = f32(q[n, k] − z[n, k // B]) · s[n, k // B]   (ONNX DequantizeLinear, exact in float32)

    GatherBlockQuantized(w, idx)   w [V, D] blocked along axis 1; idx integer [...]
        y[..., d] = ŵ[idx[...], d]                              float32 [..., D]

Importing :mod:`qcompiler.ir` registers them. The reference (:mod:`qcompiler.quant.reference`)
dequantizes ŵ and sums in float64, rounding once to float32; the kernels sum in float32 in their own
order (within ``K · 2^-24 · Σ_k |a ŵ|`` of it).
"""
from __future__ import annotations

from .ops import InferError, register_op
from .types import TensorType

WEIGHT_STORAGE = ("int4", "uint4", "int8", "uint8")


def _blocked_weight(kind: str, w: TensorType, what: str = "weight") -> None:
    q = w.quant
    if q is None or w.rank != 2 or q.storage not in WEIGHT_STORAGE or not q.blocked or q.axis % 2 != 1:
        raise InferError(f"{kind} {what} must be a 2-D int4/uint4 (or 8-bit) tensor quantized in blocks along "
                         f"axis 1, got {w}")


def _matmul_nbits(ts, a):
    A, W = ts[0], ts[1]
    _blocked_weight("MatMulNBits", W)
    if A.quant is not None or A.dtype != "float32" or A.rank < 1 or A.shape[-1] != W.shape[1]:
        raise InferError(f"MatMulNBits needs a float32 input [..., K] with K = {W.shape[1]} (w is N x K), got {A}")
    if len(ts) == 3 and (ts[2].quant is not None or ts[2].dtype != "float32" or ts[2].shape != (W.shape[0],)):
        raise InferError(f"MatMulNBits bias must be float32 of shape ({W.shape[0]},), got {ts[2]}")
    return [TensorType(A.shape[:-1] + (W.shape[0],), "float32")]


def _gather_block_quantized(ts, a):
    W, idx = ts[0], ts[1]
    _blocked_weight("GatherBlockQuantized", W, "table")
    if idx.quant is not None or idx.dtype not in ("int64", "int32"):
        raise InferError(f"GatherBlockQuantized indices must be int64/int32, got {idx}")
    if int(a["gather_axis"]) != 0:
        raise InferError(f"GatherBlockQuantized gathers rows (gather_axis 0), got {a['gather_axis']}")
    return [TensorType(idx.shape + (W.shape[1],), "float32")]


register_op("MatMulNBits", _matmul_nbits, num_operands=(2, 3),
            doc="float32 a [..., K] times the dequantized blocked 4-bit weight w [N, K] transposed, plus bias")
register_op("GatherBlockQuantized", _gather_block_quantized, {"gather_axis": 0}, (2, 2),
            doc="rows of a blocked 4-bit table [V, D], dequantized to float32")
