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

    ConvNBits(x, w[, bias])     x float32 NCHW; w [O, C/g, kh, kw] blocked along axis 1 (the input
                                channels of each tap: scales [O, ceil(C/g/B), kh, kw], ONNX opset 21's
                                blocked DequantizeLinear of a conv weight); Conv's attributes
        y = Conv(x, ŵ, bias)                                    float32

Importing :mod:`qcompiler.ir` registers them. The reference (:mod:`qcompiler.quant.reference`)
dequantizes ŵ and sums in float64, rounding once to float32; the kernels sum in float32 in their own
order (within ``K · 2^-24 · Σ_k |a ŵ|`` of it).

Packing (:func:`pack`), ONNX's and ONNX Runtime's: along the last axis, element 2i in the low nibble
of byte i, 2i+1 in the high nibble, a 4-bit value as its two's-complement nibble (int4) or itself
(uint4); ONNX's INT4/UINT4 tensors over the flattened tensor, ``MatMulNBits``' B ``[N, ceil(K/B),
B/2]`` per block of a row (:func:`to_matmul_nbits`, :func:`from_matmul_nbits`).
"""
from __future__ import annotations

import numpy as np

from .ops import InferError, _conv, register_op
from .types import QuantParams, TensorType

WEIGHT_STORAGE = ("int4", "uint4", "int8", "uint8")


def _blocked_weight(kind: str, w: TensorType, what: str = "weight", rank: int = 2) -> None:
    q = w.quant
    if q is None or w.rank != rank or q.storage not in WEIGHT_STORAGE or not q.blocked or q.axis % rank != 1:
        raise InferError(f"{kind} {what} must be a {rank}-D int4/uint4 (or 8-bit) tensor quantized in blocks along "
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


def _conv_nbits(ts, a):
    X, W = ts[0], ts[1]
    _blocked_weight("ConvNBits", W, rank=4)
    if X.quant is not None or X.dtype != "float32" or X.rank != 4:
        raise InferError(f"ConvNBits needs a float32 NCHW input, got {X}")
    if len(ts) == 3 and (ts[2].quant is not None or ts[2].dtype != "float32"):
        raise InferError(f"ConvNBits bias must be float32, got {ts[2]}")
    return _conv([X, TensorType(W.shape, "float32"), *ts[2:]], a)


register_op("MatMulNBits", _matmul_nbits, num_operands=(2, 3),
            doc="float32 a [..., K] times the dequantized blocked 4-bit weight w [N, K] transposed, plus bias")
register_op("GatherBlockQuantized", _gather_block_quantized, {"gather_axis": 0}, (2, 2),
            doc="rows of a blocked 4-bit table [V, D], dequantized to float32")
register_op("ConvNBits", _conv_nbits, {"strides": None, "dilations": None, "pads": None, "group": 1}, (2, 3),
            doc="float32 2-D convolution by the dequantized 4-bit weight [O, C/g, kh, kw] (blocks along C)")


# ---- packing ---------------------------------------------------------------------------------------
def pack(q: np.ndarray) -> np.ndarray:
    """4-bit values (int8 -8..7 or uint8 0..15) two per byte along the last axis (odd lengths padded
    with a zero nibble): ``[..., ceil(L/2)]`` uint8."""
    u = (np.asarray(q).astype(np.int16) & 0xF).astype(np.uint8)
    if u.shape[-1] % 2:
        u = np.concatenate([u, np.zeros(u.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def unpack(b: np.ndarray, length: int, signed: bool) -> np.ndarray:
    """The inverse of :func:`pack`: ``[..., length]`` int8 (signed, sign-extended) or uint8."""
    b = np.asarray(b, np.uint8)
    u = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[:-1] + (-1,))[..., :length]
    return ((u.astype(np.int8) ^ 8) - 8).astype(np.int8) if signed else u.astype(np.uint8)


def to_matmul_nbits(q: np.ndarray, qp: QuantParams) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``q [N, K]`` blocked along axis 1 as ``MatMulNBits``' (B uint8 [N, nb, B/2], scales [N·nb]
    float32 or float16, zero points uint8 [N·ceil(nb/2)] packed or None for int4 (z = 8))."""
    n, k = q.shape
    blk = qp.block_size
    nb = -(-k // blk)
    u = q.astype(np.int16) + (8 if qp.storage == "int4" else 0)
    full = np.zeros((n, nb * blk), np.uint8)
    full[:, :k] = u
    b = pack(full.reshape(n, nb, blk))
    scales = qp.scale_array().astype(np.float16 if qp.scale_dtype == "float16" else np.float32)
    zp = None if qp.storage == "int4" else pack(np.asarray(qp.zero_point, np.uint8).reshape(n, nb)).reshape(-1)
    return b, scales, zp


def from_matmul_nbits(b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, n: int, k: int,
                      block: int) -> tuple[np.ndarray, QuantParams]:
    """``MatMulNBits``' 4-bit B, scales and zero points (packed uint8, or absent: 8) as ``(q [N, K],
    QuantParams)``: uint4 with zero points, or int4 (``q − 8``) where every zero point is 8."""
    nb = -(-k // block)
    u = unpack(np.asarray(b, np.uint8).reshape(n, nb, -1), block, signed=False).reshape(n, nb * block)[:, :k]
    z = np.full((n, nb), 8, np.int64) if zp is None else \
        unpack(np.asarray(zp, np.uint8).reshape(n, -1), nb, signed=False).astype(np.int64)
    sd = "float16" if np.asarray(scales).dtype == np.float16 else "float32"
    s = np.asarray(scales, np.float32).reshape(-1)
    if np.all(z == 8):
        return (u.astype(np.int16) - 8).astype(np.int8), QuantParams("int4", s, np.zeros(s.size, np.int64), axis=1,
                                                                   block_size=block, scale_dtype=sd)
    return u, QuantParams("uint4", s, z.reshape(-1), axis=1, block_size=block, scale_dtype=sd)
