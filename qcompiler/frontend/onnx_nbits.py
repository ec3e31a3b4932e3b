"""ONNX Runtime's weight-only 4-bit operators (com.microsoft), imported into and exported from
the IR's ``MatMulNBits`` / ``GatherBlockQuantized`` (:mod:`qcompiler.ir.nbits_ops`: one typed,
blocked 4-bit weight operand instead of ORT's three tensors):

* ``MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias])``, attributes ``K``, ``N``, ``bits``
  (4), ``block_size``: B uint8 ``[N, ceil(K/B), B/2]`` (element k of column n in byte k//2 of its
  block, low nibble first), scales ``[N·ceil(K/B)]``, zero points packed two per byte
  ``[N·ceil(ceil(K/B)/2)]`` (absent: 8) -> ``MatMulNBits(a, w[N, K])`` with uint4 zero points, or
  int4 (``q − 8``, zero point 0) where every zero point is 8 (:func:`qcompiler.quant.blockwise.from_matmul_nbits`).
  ``accuracy_level`` is ignored (the IR computes in float32, what level 0 asks); float zero points,
  ``g_idx`` (act-order column permutations), 2/8 bits and a non-float32 input are refused.
* ``GatherBlockQuantized(data, indices, scales[, zero_points])``, attributes ``gather_axis`` 0,
  ``quantize_axis`` the last, ``bits`` 4, ``block_size``: data an INT4/UINT4 tensor ``[V, D]`` (what
  ONNX Runtime's quantizer writes), scales ``[V, ceil(D/B)]`` -> ``GatherBlockQuantized(w, idx)``.

The export writes them back the same way (ONNX Runtime's quantizer's layout: INT4/UINT4 tensors
need IR version 10), float16 scales as float32 (exact; the operators' scales have the input's
type), so ONNX Runtime runs a ``--weights int4`` build: ``qcompile convert M.onnx -o M4.onnx
--weights int4``.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..ir.types import QuantParams
from ..ir.nbits_ops import from_matmul_nbits, pack, to_matmul_nbits
from .onnx_registry import converter, opt_input

MICROSOFT = "com.microsoft"


def _bits(b, n, a) -> int:
    bits = int(a.get("bits", 4))
    if bits != 4:
        raise b.fail(n, f"{n.op_type} with {bits}-bit weights", "qcompiler imports 4-bit MatMulNBits/GatherBlockQuantized")
    return int(a.get("block_size", 128))


def _float32_scales(b, n, scales: np.ndarray) -> np.ndarray:
    if scales.dtype not in (np.float32, np.float16):
        raise b.fail(n, f"has {scales.dtype} scales", "qcompiler imports float32 or float16 scales")
    return scales


@converter("MatMulNBits")
def _matmul_nbits(b, n, a):
    blk = _bits(b, n, a)
    k, nn = int(a["K"]), int(a["N"])
    x = b.val(n.input[0])
    if x.dtype != "float32":
        raise b.fail(n, f"multiplies a {x.dtype} input", "qcompiler imports MatMulNBits of float32 activations")
    if opt_input(n, 4):
        raise b.fail(n, "has a g_idx input (act-order column permutation)", "quantize without act-order (g_idx)")
    packed = b.need_const(n, 1, "the 4-bit weight B")
    scales = _float32_scales(b, n, b.need_const(n, 2, "the scales"))
    zp = b.need_const(n, 3, "the zero points") if opt_input(n, 3) else None
    if zp is not None and zp.dtype != np.uint8:
        raise b.fail(n, f"has {zp.dtype} zero points", "qcompiler imports packed uint8 zero points (or none)")
    nb = -(-k // blk)
    if packed.dtype != np.uint8 or packed.size != nn * nb * (blk // 2) or scales.size != nn * nb:
        raise b.fail(n, f"B {list(packed.shape)} {packed.dtype} / scales {list(scales.shape)} do not fit K={k}, "
                     f"N={nn}, block_size={blk}", "fix the model (B must be uint8 [N, ceil(K/B), B/2])")
    q, qp = from_matmul_nbits(packed, scales, zp, nn, k, blk)
    operands = [x, b.g.add_const(q, n.input[1], quant=qp)]
    if opt_input(n, 5):
        bias = b.need_const(n, 5, "the bias").astype(np.float32)
        operands.append(b.g.add_const(bias.reshape(-1), n.input[5]))
    b.emit(n, "MatMulNBits", operands, {})


@converter("GatherBlockQuantized")
def _gather_block_quantized(b, n, a):
    blk = _bits(b, n, a)
    data = b.need_const(n, 0, "the 4-bit table")
    if data.dtype.name not in ("int4", "uint4") or data.ndim != 2:
        raise b.fail(n, f"has a {data.dtype.name} table of rank {data.ndim}",
                     "qcompiler imports INT4/UINT4 tables [V, D] (what ONNX Runtime's quantizer writes)")
    if int(a.get("gather_axis", 0)) != 0 or int(a.get("quantize_axis", 1)) % 2 != 1:
        raise b.fail(n, "gathers along axis 1 or quantizes along axis 0", "quantize the rows (axes 0 and 1)")
    signed = data.dtype.name == "int4"
    q = data.astype(np.int8 if signed else np.uint8)
    scales = _float32_scales(b, n, b.need_const(n, 2, "the scales"))
    zp = b.need_const(n, 3, "the zero points").astype(np.int64).reshape(-1) if opt_input(n, 3) else None
    s = scales.astype(np.float32).reshape(-1)
    sd = "float16" if scales.dtype == np.float16 else "float32"
    if zp is None:                         # ORT's default zero point: 0 (int4 and uint4 alike, measured)
        zp = np.zeros(s.size, np.int64)
    qp = QuantParams("int4" if signed else "uint4", s, zp, axis=1, block_size=blk, scale_dtype=sd)
    table = b.g.add_const(q, n.input[0], quant=qp)
    b.emit(n, "GatherBlockQuantized", [table, b.val(n.input[1])], {"gather_axis": 0})


# ---- export -------------------------------------------------------------------------------------
def _raw(w, op, q: np.ndarray, signed: bool, hint: str) -> str:
    """A 4-bit tensor as ONNX's INT4/UINT4 (packed over the flattened tensor)."""
    name = w.fresh(hint)
    w.raw.append(helper.make_tensor(name, onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4, list(q.shape),
                                    pack(q.reshape(-1)).tobytes(), raw=True))
    return name


def export_matmul_nbits(w, op) -> None:
    x, wq = op.operands[0], op.operands[1]
    qp = wq.type.quant
    nn, k = wq.shape
    b, s, zp = to_matmul_nbits(wq.data, qp)
    ins = [x.name, w.const(b, f"{wq.name}/B"), w.const(s.astype(np.float32), f"{wq.name}/scales"),
           w.const(zp, f"{wq.name}/zero_points") if zp is not None else ""]
    if len(op.operands) == 3:
        ins += ["", op.operands[2].name]
    while ins and ins[-1] == "":
        ins.pop()
    w.node(op, ins, {"K": k, "N": nn, "bits": 4, "block_size": qp.block_size}, domain=MICROSOFT)


def export_gather_block_quantized(w, op) -> None:
    t, idx = op.operands
    qp = t.type.quant
    signed = qp.storage == "int4"
    v, d = t.shape
    ins = [_raw(w, op, t.data, signed, t.name), idx.name,
           w.const(qp.scale_array().reshape(v, -1), f"{t.name}/scales")]
    if not signed:
        ins.append(_raw(w, op, np.asarray(qp.zero_point, np.uint8).reshape(v, -1), False, f"{t.name}/zero_points"))
    elif any(qp.zero_point):
        raise ValueError("an int4 table with non-zero zero points")      # the pass never makes one
    w.node(op, ins, {"gather_axis": 0, "quantize_axis": 1, "bits": 4, "block_size": qp.block_size}, domain=MICROSOFT)


def export_conv_nbits(w, op) -> None:
    """ConvNBits as ONNX opset 21: DequantizeLinear(w INT4/UINT4, scale, zero point; axis 1,
    block_size) -> Conv (float16 scales written as float32, so the Conv stays float32)."""
    x, wq = op.operands[0], op.operands[1]
    qp = wq.type.quant
    signed = qp.storage == "int4"
    sh = qp.scale_shape(wq.shape)
    ins = [_raw(w, op, wq.data, signed, wq.name), w.const(qp.scale_array().reshape(sh), f"{wq.name}/scale")]
    if not signed:
        ins.append(_raw(w, op, np.asarray(qp.zero_point, np.uint8).reshape(sh), False, f"{wq.name}/zero_point"))
    deq = w.fresh(f"{wq.name}/dequantized")
    w.node(op, ins, {"axis": 1, "block_size": qp.block_size}, op_type="DequantizeLinear", outputs=[deq],
           name=f"{op.name}/dequantize")
    a = {k: op.attrs.get(k) for k in ("strides", "dilations", "pads", "group")}
    w.node(op, [x.name, deq] + [v.name for v in op.operands[2:]], a, op_type="Conv")
