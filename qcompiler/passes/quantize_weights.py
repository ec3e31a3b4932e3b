"""``quantize-weights``: weight-only 4-bit quantization (``--weights int4``, any float ``--dtype``).

The activations stay float; each constant weight of a linear layer, and each constant embedding
table, is stored in 4 bits with one scale (and, asymmetric, one zero point) per block of ``B``
inputs (Frantar et al. 2022 §4 "grouping"; ONNX Runtime's ``MatMulNBits``)::

    ŵ[n, k] = s[n, k // B] · (q[n, k] − z[n, k // B])       q uint4 0..15 (int4 −8..7 symmetric, z = 0)

``w [N, K]`` is a MatMul's ``Bᵀ`` (a Gemm's B with ``transB``, alpha folded in); the scales and
zero points follow ONNX Runtime's quantizer exactly (:func:`qcompiler.quant.blockwise.block_params`:
asymmetric ``s = (max(w, 0) − min(w, 0)) / 15``, symmetric ``s = m / −8`` for the block's value
``m`` of largest magnitude), float32 or float16 scales. The integers are round-to-nearest (ONNX
QuantizeLinear), or with ``rounding`` gptq GPTQ's on the same grid: the columns rounded one at a
time, each one's error moved onto the columns not yet rounded through the layer's input Gram
matrix ``H = XᵀX`` from the calibration data, the choice per layer checked on held-out halves of
it (:mod:`qcompiler.quant.gptq`; the scales are fixed before, as GPTQ's "static groups").

Rewritten (``keep_float`` names or kinds stay float):

=====================================================  ==============================================
float op                                               becomes
=====================================================  ==============================================
MatMul(a, B) of a float32 ``a [..., K]`` and a         MatMulNBits(a, w_q) : float32 ``[..., N]``
constant ``B [K, N]``
Gemm/FusedGemm(a, B[, C]) (transA 0, a 2-D, C of 1     MatMulNBits(a, w_q[, c]), a FusedGemm's
or N elements)                                         activation after it
Gather(T, idx) (axis 0) of a constant table            GatherBlockQuantized(t_q, idx): rows
``T [V, D]`` (``embeddings``)                          dequantized, blocks along D
Conv/FusedConv(x, W[, b[, Z]]) of a constant ``W [O,   ConvNBits(x, w_q[, b]) (blocks along C of each
C/g, kh, kw]`` with C/g >= 16 (``convs``)             tap: scales [O, ceil(C/g/B), kh, kw], ONNX's
                                                       blocked DequantizeLinear of axis 1), then
                                                       the FusedConv's residual Add and activation
=====================================================  ==============================================

The ops' semantics: :mod:`qcompiler.ir.nbits_ops`. What was done per layer is recorded in
``graph.meta["weights"]`` (JSON: scheme, and per layer shape, bytes, rounding). Runs after the
default pipeline (not part of it); the codegen's kernels read the 4-bit weights packed two per byte
(:mod:`qcompiler.codegen.kernels.nbits`).

Before::

    graph @g(%x: tensor<1x16xf32>) {
      %w = const dense<[-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]> : tensor<16x1xf32>
      %y = MatMul(%x, %w) : tensor<1x1xf32>
      return %y
    }

Blocks of 128 (ORT's default) cut to K = 16, asymmetric: s = (1.2 + 0.3) / 15 = 0.1, z = round(0.3 /
0.1) = 3, q = round(w / s) + 3 (every w / s is an integer in float32).

After::

    graph @g(%x: tensor<1x16xf32>) {
      %w_q = const dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]> : tensor<1x16x!quant.uniform<u4:f32:{1:128}, {0.1:3}>>
      %y = MatMulNBits(%x, %w_q) : tensor<1x1xf32>
      return %y
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from ..ir.activations import make_activation
from ..ir.graph import Graph, Op
from ..ir.ops import REGISTRY
from ..quant.blockwise import BLOCK_SIZES, block_params, grid_integers, nearest_integers
from ..quant.gptq import GptqRounding, WeightRounding
from ._common import pass_options
from .manager import PassContext, register_pass
from .quantize_plan import gemm_weight_bias

GEMMS = ("MatMul", "Gemm", "FusedGemm")
CONVS = ("Conv", "FusedConv")
MIN_CONV_CHANNELS = 16
"""Convs with fewer input channels per group stay float (a depthwise conv's one, a first conv's 1-3:
a scale every few weights, and little weight to save)."""
SCALE_DTYPES = ("float32", "float16")


@dataclass
class QuantizeWeightsOptions:
    bits: int = 4                            # 4 (int4/uint4 storage)
    block_size: int = 128                    # inputs per block (ONNX Runtime's MatMulNBitsQuantizer default)
    symmetric: bool = False                  # int4 with z = 0; default asymmetric uint4, as ORT's quantizer
    scale_dtype: str = "float32"             # float16: scales stored (and rounded) as float16
    rounding: WeightRounding = WeightRounding.NEAREST   # gptq: error-compensating, needs calib
    calib: Any = None                        # calibration feeds (a quant.data.Dataset or a list of feeds)
    embeddings: bool = True                  # also Gather tables (a transformer's word embeddings)
    convs: bool = True                       # also Conv/FusedConv weights (blocks along the input channels)
    keep_float: frozenset = frozenset()      # op names or kinds left float

    def __post_init__(self):
        where = "quantize-weights options"
        if self.bits != 4:
            raise UserError(f"weight-only quantization stores 4-bit weights, got bits {self.bits}", where,
                            "give bits=4 (--weights int4)")
        if self.block_size not in BLOCK_SIZES:
            raise UserError(f"block size {self.block_size} is not one of {', '.join(map(str, BLOCK_SIZES))}",
                            where, "give --weight-block 32, 64 or 128")
        if self.scale_dtype not in SCALE_DTYPES:
            raise UserError(f"unknown scale dtype '{self.scale_dtype}'", where, "give float32 or float16")
        if str(getattr(self.rounding, "value", self.rounding)) not in [r.value for r in WeightRounding]:
            raise UserError(f"unknown rounding '{self.rounding}'", where, "give nearest or gptq")
        self.rounding = WeightRounding(self.rounding)
        self.keep_float = frozenset(self.keep_float)


def _float_activation(v) -> bool:
    return not v.is_const and v.type.quant is None and v.dtype == "float32"


def why_float(op: Op, opts: QuantizeWeightsOptions) -> str | None:
    """Why a MatMul/Gemm/Gather stays float (None: it is rewritten)."""
    if op.kind in opts.keep_float or op.name in opts.keep_float:
        return "kept float (--keep-float)"
    ops = op.operands
    if op.kind == "Gather":
        if not opts.embeddings:
            return "embeddings left float"
        if not ops[0].is_const or ops[0].dtype != "float32" or ops[0].type.rank != 2 or op.attrs.get("axis", 0) != 0:
            return "not a row Gather of a constant float32 table [V, D]"
        return None
    if not _float_activation(ops[0]):
        return "input is not a float32 activation"
    if op.kind in CONVS:
        if not opts.convs:
            return "convs left float"
        if not ops[1].is_const or ops[1].dtype != "float32" or ops[1].type.rank != 4 or ops[0].type.rank != 4:
            return "not a 2-D conv by a constant float32 weight"
        if ops[1].shape[1] < MIN_CONV_CHANNELS:
            return f"{ops[1].shape[1]} input channels per group (fewer than {MIN_CONV_CHANNELS})"
        if len(ops) >= 3 and not ops[2].is_const:
            return "the bias is not constant"
        return None
    if not ops[1].is_const or ops[1].dtype != "float32" or ops[1].type.rank != 2:
        return "weight is not a constant float32 matrix"
    if op.kind == "MatMul":
        return None
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    if a["transA"] or ops[0].type.rank != 2:
        return "transA = 1 or a non-2-D input"
    if len(ops) > 3:
        return "a residual operand"
    if len(ops) == 3 and not ops[2].is_const:
        return "the bias is not constant"
    if len(ops) == 3 and ops[2].data.size not in (1, op.result.shape[-1]):
        return "the bias does not broadcast along the output channels only"
    return None


def _quantized(w: np.ndarray, op: Op, opts: QuantizeWeightsOptions, rounding: GptqRounding | None):
    """``w [N, K]`` on its blocked grid: (stored integers, params, rounding info)."""
    qp = block_params(w, opts.block_size, opts.symmetric, opts.scale_dtype)
    if rounding is not None:
        w_hat, info = rounding.weights(op, w, qp)
        if w_hat is not None:
            return grid_integers(w_hat, qp), qp, info
    return nearest_integers(w, qp), qp, {"rounding": "nearest"}


def _replace(graph: Graph, op: Op, kind: str, operands: list, after_fn=None, attrs: dict | None = None) -> Op:
    """``kind(operands)`` in place of ``op``, keeping its name and its result's name (``after_fn``:
    ops applied to the new result before it replaces the old one)."""
    name, out = op.name, op.result
    new = graph.create_op(kind, operands, attrs or {}, name=name + "_nbits", result_names=[out.name + "_nbits"],
                          before=op)
    res = new.result if after_fn is None else after_fn(new)
    out_name = out.name
    out.replace_all_uses_with(res)
    graph.erase_op(op)
    graph.rename_op(new, name)
    if res.producer is not None:
        graph.rename(res, out_name)
    return new


def _rewrite_gemm(graph: Graph, op: Op, opts, rounding) -> tuple[Op, dict]:
    w, b = gemm_weight_bias(op)
    q, qp, info = _quantized(w, op, opts, rounding)
    wq = graph.add_const(q, op.operands[1].name + "_q", quant=qp)
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    operands = [op.operands[0], wq]
    if b is not None:
        operands.append(graph.add_const(b, op.operands[2].name + "_f"))
    act = a.get("activation", "") if op.kind == "FusedGemm" else ""

    def after(new: Op):
        if not act:
            return new.result
        return make_activation(graph, act, a.get("activation_params") or [], new.result, name=op.name + "_" + act.lower(),
                               after=new).result
    new = _replace(graph, op, "MatMulNBits", operands, after)
    return new, {**info, "n": int(w.shape[0]), "k": int(w.shape[1])}


def _rewrite_conv(graph: Graph, op: Op, opts, rounding) -> tuple[Op, dict]:
    w = op.operands[1].data.astype(np.float32)
    q, qp, info = _quantized(w, op, opts, rounding)
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    operands = [op.operands[0], graph.add_const(q, op.operands[1].name + "_q", quant=qp)]
    if len(op.operands) >= 3:
        operands.append(graph.add_const(op.operands[2].data.astype(np.float32), op.operands[2].name + "_f"))
    act = a.get("activation", "") if op.kind == "FusedConv" else ""

    def after(new: Op):
        v = new.result
        if len(op.operands) == 4:                    # FusedConv's residual Z, then its activation
            v = graph.create_op("Add", [v, op.operands[3]], name=op.name + "_add", after=new).result
        if act:
            v = make_activation(graph, act, a.get("activation_params") or [], v, name=op.name + "_" + act.lower(),
                                after=v.producer).result
        return v
    new = _replace(graph, op, "ConvNBits", operands, after, {k: a[k] for k in ("strides", "dilations", "pads", "group")})
    return new, {**info, "n": int(w.shape[0]), "k": int(np.prod(w.shape[1:]))}


def _rewrite_gather(graph: Graph, op: Op, opts) -> tuple[Op, dict]:
    t = op.operands[0].data.astype(np.float32)
    qp = block_params(t, opts.block_size, opts.symmetric, opts.scale_dtype)
    tq = graph.add_const(nearest_integers(t, qp), op.operands[0].name + "_q", quant=qp)
    new = _replace(graph, op, "GatherBlockQuantized", [tq, op.operands[1]])
    return new, {"rounding": "nearest", "n": int(t.shape[0]), "k": int(t.shape[1])}


@register_pass("quantize-weights", options=QuantizeWeightsOptions)
def quantize_weights(graph: Graph, ctx: PassContext) -> bool:
    """Weight-only 4-bit: MatMul/Gemm weights and Gather tables stored int4/uint4 in blocks along
    K (MatMulNBits, GatherBlockQuantized); activations float."""
    opts = pass_options(ctx, "quantize-weights", QuantizeWeightsOptions)
    if graph.meta.get("prequantized"):
        raise UserError("the model is already quantized (its own QuantizeLinear/DequantizeLinear, integer ops or "
                        "MatMulNBits)", "--weights int4", "compile it as it is, or compile the float model it came from")
    layers: dict[str, dict] = {}
    todo = []
    for op in graph.ops:
        if op.kind not in GEMMS + CONVS + ("Gather",):
            continue
        why = why_float(op, opts)
        if why is None:
            todo.append(op)
        elif op.kind != "Gather" or op.operands[0].is_const:
            layers[op.name] = {"kind": op.kind, "precision": "float", "reason": why}
    rounding = GptqRounding.asked(opts.rounding, graph, opts.calib, [op for op in todo if op.kind in GEMMS + CONVS],
                                  "quantize-weights")
    for op in todo:
        kind = op.kind
        new, info = (_rewrite_gather(graph, op, opts) if kind == "Gather" else
                     _rewrite_conv(graph, op, opts, rounding) if kind in CONVS else _rewrite_gemm(graph, op, opts, rounding))
        t = new.operands[0 if kind == "Gather" else 1].type
        layers[new.name] = {"kind": new.kind, "from": kind, "precision": t.dtype, "block_size": opts.block_size,
                            "bytes": t.stored_bytes,
                            "fp32_bytes": 4 * t.size, **info}
    graph.remove_unused_consts()
    done = [v for v in layers.values() if v["precision"] != "float"]
    chosen = [v["rounding"] for v in done if v["from"] != "Gather"]
    graph.meta["weights"] = {
        "scheme": {"weights": f"{'int4 symmetric' if opts.symmetric else 'uint4 asymmetric'}, blocks of "
                              f"{opts.block_size} along K, {opts.scale_dtype} scales",
                   "rounding": opts.rounding.value, "gptq": chosen.count("gptq"), "nearest": chosen.count("nearest"),
                   "bytes": sum(v["bytes"] for v in done), "fp32_bytes": sum(v["fp32_bytes"] for v in done)},
        "layers": layers,
    }
    ctx.log(f"quantize-weights: {len(done)} weights 4-bit ({len(chosen)} linear, {len(done) - len(chosen)} tables; "
            f"rounding {opts.rounding.value}: {chosen.count('gptq')} gptq), {len(layers) - len(done)} float")
    return bool(done)
