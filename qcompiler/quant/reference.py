"""A numpy interpreter of the (quantized) IR: the oracle for the integer kernels.

Integer ops compute exactly what the int8 kernels must compute, bit for bit (see
:mod:`qcompiler.ir.ops` for each op's formula and :mod:`.requant` for the requantization)::

    QLinearConv  acc = Σ (xq - z_x) * wq + bq        (padding contributes real 0: xq = z_x)
                 q   = clamp(z_out + rrs(acc * m[c], s[c]), lo, hi)
                 (activation HardSwish: the float32 epilogue of :mod:`.hardswish` instead)
    float8       acc = Σ xq * wq in float64, rounded once to float32 (exact for E4M3: :mod:`.fp8`)
                 y   = clamp(fma(acc, f32(s_x s_w[c]), b[c]))   (float32; the kernels' float32 sums
                 differ from it by their own summation order's rounding)

Accumulators are formed with float64 matrix products of integers (|products| < 2^15, sums far
below 2^53, so exact, and BLAS-fast) and checked to fit int32. Float ops (those the quantizer
left in float, between DequantizeLinear and QuantizeLinear) run in numpy too: the kernels of
:mod:`qcompiler.ir.interp` plus Conv/Gemm/pooling here (float64 accumulation, float32 results).

    outs = run(graph, {"input": x})           # list of arrays, one per graph output
    vals = run_values(graph, {"input": x})    # every value by name (per-layer comparisons)
    evaluate_op(op, arrays)                   # one op on given operands (e.g. another engine's)

The feeds may hold more samples than the graph's static batch (N = k * B): every kernel is
batch-agnostic, and Reshape scales a leading dimension that equals the declared batch.
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import numpy as np

from ..ir.graph import Graph, Op
from ..ir.interp import KERNELS as FLOAT_KERNELS, TYPED_KERNELS, EvalError, registrar
from ..ir.ops import REGISTRY
from ..ir.types import INT_RANGES, dequantize, is_fp8, np_dtype, quantize
from ..ir.windows import chunked_matmul, conv_sum, windows
from . import hardswish
from .dynamic import dynamic_gemm, quant_params
from .requant import activation_clamp, dequant_scales, dequantized, float_clamp, requantize

Kernel = Callable[[Op, list, dict], list]
KERNELS: dict[str, Kernel] = {}
INT32_MIN, INT32_MAX = INT_RANGES["int32"]


kernel = registrar(KERNELS)


def run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    vals = _run(graph, feeds, keep_all=False)
    return [vals[v.name] for v in graph.outputs]


def run_values(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return _run(graph, feeds, keep_all=True)


def _run(graph: Graph, feeds, keep_all: bool) -> dict[str, np.ndarray]:
    env: dict[str, np.ndarray] = {v.name: v.data for v in graph.consts.values()}
    for v in graph.inputs:
        if v.name not in feeds:
            raise EvalError(f"no feed for graph input %{v.name}")
        env[v.name] = np.asarray(feeds[v.name], np_dtype(v.dtype))
    last_use: dict[str, int] = {}
    ops = graph.ops
    for i, op in enumerate(ops):
        for v in op.operands:
            last_use[v.name] = i
    outputs = {v.name for v in graph.outputs}
    for i, op in enumerate(ops):
        outs = evaluate_op(op, [env[v.name] for v in op.operands])
        for r, a in zip(op.results, outs):
            env[r.name] = a
        if not keep_all:
            for v in op.operands:
                if last_use.get(v.name) == i and v.name not in outputs and not v.is_const:
                    env.pop(v.name, None)
    return env


def evaluate_op(op: Op, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate one op on numpy operands (quantized operands as their stored integers)."""
    attrs = {**(REGISTRY[op.kind].defaults if op.kind in REGISTRY else {}), **op.attrs}
    xs = [np.asarray(a) for a in arrays]
    quantized = any(v.type.quant is not None for v in op.operands)
    fn = (_QUANT_AWARE.get(op.kind) if quantized else None) or KERNELS.get(op.kind)
    if fn is not None:
        outs = fn(op, xs, attrs)
    elif op.kind in FLOAT_KERNELS:
        outs = FLOAT_KERNELS[op.kind](xs, attrs)
    elif op.kind in TYPED_KERNELS:             # ConvInteger, MatMulInteger (pre-quantized models)
        outs = TYPED_KERNELS[op.kind](op, xs, attrs)
    elif not quantized:
        outs = _ort_float(op, xs)
    else:
        raise EvalError(f"{op.describe()}: the reference interpreter has no kernel for '{op.kind}'")
    return [np.asarray(o).astype(np_dtype(r.type.dtype), copy=False) for o, r in zip(outs, op.results)]


def exact_float(bound: float) -> type:
    """The cheapest float type in which integer sums of magnitude <= ``bound`` are exact in any
    order: float32 below 2^24, else float64 (below 2^53)."""
    if bound < 2 ** 24:
        return np.float32
    if bound < 2 ** 53:
        return np.float64
    raise EvalError(f"integer sums up to {bound:.3g} are not exact in float64")


def _out_spatial(op: Op) -> tuple[int, ...]:
    return tuple(op.result.type.shape[2:])


def _channel(v: np.ndarray, ndim: int, axis: int = 1) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(v).reshape(shape)


def _acc_int32(acc: np.ndarray, op: Op) -> np.ndarray:
    acc = acc.astype(np.int64)                  # integral already (exact float sums)
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise EvalError(f"{op.describe()}: int32 accumulator overflow ({acc.min()}..{acc.max()})")
    return acc


def _requant_out(op: Op, acc: np.ndarray, a: dict, channel_axis: int | None = 1,
                 ties_even: bool = False) -> np.ndarray:
    qp = op.result.type.quant

    def per_channel(v, dtype=np.int64):
        v = np.asarray(v, dtype)
        if channel_axis is None:
            return v
        if v.size == 1:
            return v.reshape(())
        return _channel(v, acc.ndim, channel_axis)
    if a.get("activation") == "HardSwish":          # fused float32 HardSwish (qcompiler.quant.hardswish)
        lo, hi = INT_RANGES[qp.storage]
        sig, g, b = a["hardswish"]
        hs = [per_channel(sig, np.float32), per_channel(g, np.float32), b]
        return hardswish.requantize(acc, hs, qp.zero_point[0], lo, hi)
    m, s = per_channel(a["multiplier"]), per_channel(a["shift"])
    lo, hi = activation_clamp(a.get("activation", ""), a.get("activation_params") or [], qp)
    return requantize(acc, m, s, qp.zero_point[0], lo, hi, ties_even)


# ---- quantize / dequantize -----------------------------------------------------------------------
@kernel("QuantizeLinear")
def _quantize(op, xs, a):
    return [quantize(xs[0], op.result.type.quant)]


@kernel("DequantizeLinear")
def _dequantize(op, xs, a):
    return [dequantize(xs[0], op.operands[0].type.quant)]


# ---- integer compute ops ----------------------------------------------------------------------
def _zp(op: Op, i: int) -> int:
    return op.operands[i].type.quant.zero_point[0]


def _shifted_input(op: Op, xs, k: int):
    """(x - z_x) in the cheapest float type that keeps Σ over ``k`` products exact, and the chunk
    of products whose sums are exact in float32 when that type is float64 (else None)."""
    x, w = xs[0], xs[1]
    z = _zp(op, 0)
    lo, hi = INT_RANGES[op.operands[0].type.quant.storage]
    wmax = max(-int(w.min()), int(w.max())) if w.size else 0
    term = max(hi - z, z - lo) * float(wmax)
    dt = exact_float(k * term)
    chunk = int((2 ** 24 - 1) // term) if dt is np.float64 and term >= 1 else None
    xt = np.float32 if chunk is not None else dt          # chunked sums take float32 operands
    return x.astype(xt) - xt(z), dt, chunk


def _add_bias(acc: np.ndarray, op: Op, xs, axis: int = 1) -> np.ndarray:
    """acc (exact integers in a float type) + the int32 bias, as int64 checked to fit int32."""
    b = xs[2].astype(np.int64) if len(xs) == 3 else np.zeros(1, np.int64)
    lo, hi = (float(acc.min()), float(acc.max())) if acc.size else (0.0, 0.0)
    out = acc.astype(np.int64)
    out += _channel(b, acc.ndim, axis)
    if lo + b.min() < INT32_MIN or hi + b.max() > INT32_MAX:     # the cheap bound fails: look closely
        _acc_int32(out, op)
    return out


@kernel("QLinearConv")
def _qconv(op, xs, a):
    if is_fp8(op.operands[0].dtype):
        return [_fp8_result(op, conv_sum(_f64(xs[0]), _f64(xs[1]), a, _out_spatial(op)), xs, a)]
    w = xs[1]
    x, dt, chunk = _shifted_input(op, xs, int(np.prod(w.shape[1:])))
    acc = _add_bias(conv_sum(x, w, a, _out_spatial(op), dt, chunk), op, xs)
    return [_float_or_requant(op, acc, a)]


@kernel("QLinearGemm")
def _qgemm(op, xs, a):
    if is_fp8(op.operands[0].dtype):
        return [_fp8_result(op, _f64(xs[0]) @ _f64(xs[1]).T, xs, a)]
    A, dt, chunk = _shifted_input(op, xs, xs[1].shape[1])
    acc = _add_bias(chunked_matmul(A, xs[1].astype(dt).T, chunk), op, xs)
    return [_float_or_requant(op, acc, a)]


def _f64(q: np.ndarray) -> np.ndarray:
    return np.asarray(q).astype(np.float32).astype(np.float64)      # float8 -> its (exact) value


def _fp8_result(op: Op, acc: np.ndarray, xs, a: dict) -> np.ndarray:
    """A float8 QLinearConv/QLinearGemm's result from the float64 sum of its products (exact for E4M3,
    see :mod:`.fp8`), channels on axis 1: ``clamp(fma(f32(acc), f32(s_x s_w[c]), b[c]))``, the
    multiply-add rounded once to float32 as the kernels' contracted FMA rounds it (formed in float64:
    the product of two float32 is exact there, the add rounds to float64 first, which differs from
    one rounding only where that float64 lands exactly between two float32)."""
    f = dequant_scales(op.operands[0].type.quant.scale[0], op.operands[1].type.quant.scale)
    y = acc.astype(np.float32).astype(np.float64) * _channel(f.astype(np.float64), acc.ndim)
    if len(xs) == 3:
        y = y + _channel(xs[2].astype(np.float32).astype(np.float64), y.ndim)
    y = y.astype(np.float32)
    lo, hi = float_clamp(a["activation"], a["activation_params"] or [])
    return np.clip(y, np.float32(lo), np.float32(hi))


def _float_or_requant(op: Op, acc: np.ndarray, a: dict) -> np.ndarray:
    """A QLinearConv/QLinearGemm's result from its int32 accumulator (bias included, channels on
    axis 1): requantized, or for a float32 result (``multiplier = []``) the dequantizing epilogue."""
    if op.result.type.quant is None:
        return dequantized(acc, op.operands[0].type.quant.scale[0], op.operands[1].type.quant.scale,
                           a["activation"], a["activation_params"] or [])
    return _requant_out(op, acc, a)


def _samples(op, A: np.ndarray) -> list[np.ndarray]:
    """``A`` split into the declared row count: more samples than declared stack their rows (see
    Reshape), and a per-tensor range is each sample's own."""
    m = op.operands[0].shape[0]
    return [A] if A.shape[0] == m or A.shape[0] % m else np.split(A, A.shape[0] // m)


@kernel("DynamicQuantParams")
def _dynamic_quant_params(op, xs, a):
    return [np.concatenate([quant_params(p, a["granularity"]) for p in _samples(op, xs[0])])]


@kernel("DynamicQLinearGemm")
def _dynamic_qgemm(op, xs, a):
    A, P, w = xs[0], xs[1], xs[2]
    bias = xs[3] if len(xs) > 3 else None
    parts = _samples(op, A)
    rows = parts[0].shape[0]
    per_tensor = op.operands[1].shape[0] == 1          # one params row per sample, else one per row of A
    outs = [dynamic_gemm(part, P[i:i + 1] if per_tensor else P[i * rows:(i + 1) * rows], w,
                         op.operands[2].type.quant.scale, bias, a["activation"], a["activation_params"] or [])
            for i, part in enumerate(parts)]
    return [np.concatenate(outs)]


@kernel("QLinearAdd")
def _qadd(op, xs, a):
    ma, mb = (np.int64(m) for m in a["multiplier"])
    acc = (xs[0].astype(np.int64) - _zp(op, 0)) * ma + (xs[1].astype(np.int64) - _zp(op, 1)) * mb
    qp = op.result.type.quant
    lo, hi = activation_clamp(a["activation"], a["activation_params"] or [], qp)
    return [requantize(acc, 1, a["shift"][0], qp.zero_point[0], lo, hi)]


@kernel("QLinearMul")
def _qmul(op, xs, a):
    """acc = (aq - z_a) * (bq - z_b) (|acc| <= 255^2), requantized by M = s_a s_b / s_out."""
    acc = (xs[0].astype(np.int64) - _zp(op, 0)) * (xs[1].astype(np.int64) - _zp(op, 1))
    qp = op.result.type.quant
    lo, hi = activation_clamp(a["activation"], a["activation_params"] or [], qp)
    return [requantize(acc, a["multiplier"][0], a["shift"][0], qp.zero_point[0], lo, hi)]


@kernel("QLinearGlobalAveragePool")
def _qgap(op, xs, a):
    x = xs[0].astype(np.int64) - _zp(op, 0)
    acc = x.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return [_requant_out(op, _acc_int32(acc, op), a, None, ties_even=True)]


@kernel("QLinearAveragePool")
def _qavgpool(op, xs, a):
    x = xs[0].astype(np.int64) - _zp(op, 0)
    acc = sum(win for _, win in windows(x, a["kernel_shape"], a, _out_spatial(op), 0))
    return [_requant_out(op, _acc_int32(acc, op), a, None, ties_even=True)]


@kernel("Requantize")
def _requantize(op, xs, a):
    return [_requant_out(op, xs[0].astype(np.int64) - _zp(op, 0), a, None)]


# ---- ops on quantized values that keep the quant params ---------------------------------------
def _q_relu_clip(op, xs, a):
    act = op.kind
    lo, hi = activation_clamp(act, [a["min"], a["max"]] if act == "Clip" else [], op.operands[0].type.quant)
    return [np.clip(xs[0], lo, hi)]


def _q_pad(op, xs, a):
    qp = op.operands[0].type.quant
    a = dict(a, value=quantize(np.float32(a["value"]), qp).item()) if a["mode"] == "constant" else a
    return FLOAT_KERNELS["Pad"](xs, a)


_QUANT_AWARE = {"Relu": _q_relu_clip, "Clip": _q_relu_clip, "Pad": _q_pad}


# ---- float ops the interp module does not cover --------------------------------------------------
_ACT_KEYS = {"Clip": ("min", "max"), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta")}


def apply_activation(y: np.ndarray, act: str, params) -> np.ndarray:
    if not act:
        return y
    attrs = {**REGISTRY[act].defaults, **dict(zip(_ACT_KEYS.get(act, ()), params))}
    return FLOAT_KERNELS[act]([y], attrs)[0]


@kernel("Conv", "FusedConv")
def _conv(op, xs, a):
    x = xs[0]
    y = conv_sum(x, xs[1], a, _out_spatial(op))
    if len(xs) >= 3:
        y = y + _channel(xs[2].astype(np.float64), y.ndim)
    y = y.astype(np.float32)
    if len(xs) == 4:
        y = y + xs[3]
    return [apply_activation(y, a.get("activation", ""), a.get("activation_params") or [])]


@kernel("Gemm", "FusedGemm")
def _gemm(op, xs, a):
    A = xs[0].T if a["transA"] else xs[0]
    B = xs[1].T if a["transB"] else xs[1]
    y = a["alpha"] * (A.astype(np.float64) @ B.astype(np.float64))
    if len(xs) == 3:
        y = y + a["beta"] * xs[2].astype(np.float64)
    return [apply_activation(y.astype(np.float32), a.get("activation", ""), a.get("activation_params") or [])]


@kernel("MatMulNBits")
def _matmul_nbits(op, xs, a):
    """Weight-only 4-bit (:mod:`qcompiler.ir.nbits_ops`): the weight dequantized as ONNX's
    DequantizeLinear does (exact in float32), the products summed in float64, rounded once."""
    w = dequantize(xs[1], op.operands[1].type.quant).astype(np.float64)
    y = (xs[0].astype(np.float64) @ w.T).astype(np.float32)
    return [y + xs[2].astype(np.float32) if len(xs) == 3 else y]


@kernel("ConvNBits")
def _conv_nbits(op, xs, a):
    """A conv by the exactly dequantized 4-bit weight (float64 sum, one rounding)."""
    w = dequantize(xs[1], op.operands[1].type.quant)
    y = conv_sum(xs[0], w, a, _out_spatial(op))
    if len(xs) == 3:
        y = y + _channel(xs[2].astype(np.float64), y.ndim)
    return [y.astype(np.float32)]


@kernel("GatherBlockQuantized")
def _gather_block_quantized(op, xs, a):
    table, idx = xs[0], xs[1].astype(np.int64)
    v = table.shape[0]
    if idx.size and (idx.min() < -v or idx.max() >= v):
        raise EvalError(f"{op.describe()}: index out of range [-{v}, {v})")
    rows = np.where(idx < 0, idx + v, idx)
    qp = op.operands[0].type.quant
    s, z = qp.element_params(table.shape)
    return [(table[rows].astype(np.int64) - z[rows]).astype(np.float32) * s[rows]]


@kernel("MaxPool")
def _maxpool(op, xs, a):
    x = xs[0]
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    out = None
    for _, win in windows(x, a["kernel_shape"], a, _out_spatial(op), low):
        out = win.copy() if out is None else np.maximum(out, win)
    return [out]


@kernel("AveragePool")
def _avgpool(op, xs, a):
    x = xs[0].astype(np.float64)
    sp = _out_spatial(op)
    total = sum(win for _, win in windows(x, a["kernel_shape"], a, sp, 0.0))
    # window counts: explicit pads count with count_include_pad, the ceil_mode extension never does
    nsp = x.ndim - 2
    p = a.get("pads") or [0] * (2 * nsp)
    ones = np.ones((1, 1) + x.shape[2:])
    if a["count_include_pad"]:
        ones = np.pad(ones, [(0, 0), (0, 0)] + [(p[i], p[nsp + i]) for i in range(nsp)], constant_values=1.0)
        a = dict(a, pads=[0] * (2 * nsp))
    count = sum(win for _, win in windows(ones, a["kernel_shape"], a, sp, 0.0))
    return [(total / count).astype(np.float32)]


@kernel("GlobalAveragePool")
def _gap(op, xs, a):
    x = xs[0]
    return [x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)]


@kernel("GlobalMaxPool")
def _gmp(op, xs, a):
    x = xs[0]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]


@kernel("Reshape")
def _reshape(op, xs, a):
    x, shape = xs[0], list(a["shape"])
    declared = op.operands[0].type.shape
    n = int(np.prod(shape))
    if x.size != n and declared and x.ndim and shape and n and x.shape[0] != declared[0] and x.size % n == 0:
        # more samples than the static batch: scale the leading dimension by as many (a row view
        # (B·S, K) of a batch grows its rows, its inverse (1, S, N) its batch)
        shape[0] *= x.size // n
    return [x.reshape(shape)]


# ---- float ops without a numpy kernel (Resize, ConvTranspose, LayerNormalization, ...) ----------
_SESSIONS: "weakref.WeakKeyDictionary[Op, object]" = weakref.WeakKeyDictionary()


def _ort_float(op: Op, xs: list) -> list:
    """Run one float op in onnxruntime (a one-node model of its declared types); feeds with more
    samples than the declared batch run in slices of it."""
    sess = _SESSIONS.get(op)
    if sess is None:
        import onnxruntime as ort
        from ..frontend.onnx_export import export_onnx
        from ..ir.types import TensorType
        g = Graph("op")
        ins = [g.add_input(f"in{i}", TensorType(v.shape, v.dtype)) for i, v in enumerate(op.operands)]
        new = g.create_op(op.kind, ins, dict(op.attrs), result_types=[r.type for r in op.results])
        g.outputs = list(new.results)
        so = ort.SessionOptions()
        so.log_severity_level = 4       # fatal only: errors become our own messages
        # no busy-waiting worker threads after each run: they would take the cores from the numpy
        # kernels that run next (vit-s16's float MatMuls between its ORT-run LayerNorms: 0.16 s a call)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        sess = _SESSIONS[op] = ort.InferenceSession(export_onnx(g).SerializeToString(), so,
                                                     providers=["CPUExecutionProvider"])
    declared = [v.shape for v in op.operands]
    if all(x.shape == d for x, d in zip(xs, declared)):
        return sess.run(None, {f"in{i}": x for i, x in enumerate(xs)})
    b = declared[0][0]
    n = xs[0].shape[0]
    if not declared[0] or n % b:
        raise EvalError(f"{op.describe()}: operand shapes {[x.shape for x in xs]} do not fit {declared}")
    parts = []
    for s in range(0, n, b):
        feeds = {f"in{i}": (x[s:s + b] if x.shape != d else x) for i, (x, d) in enumerate(zip(xs, declared))}
        parts.append(sess.run(None, feeds))
    return [np.concatenate([p[i] for p in parts]) for i in range(len(op.results))]


# ---- comparing another engine's integers with the oracle -----------------------------------------
def layer_diffs(graph: Graph, values: dict[str, np.ndarray]) -> dict[str, int]:
    """For each integer op (and each op on quantized values) whose operands and result are all in
    ``values`` (another engine's tensors by IR value name, e.g. onnxruntime running
    :func:`~qcompiler.frontend.qdq_export.export_qdq`), the largest |difference| in LSB between that
    result and the oracle run on the *same* operands: each layer checked in isolation, so one
    layer's rounding does not hide or blame another's."""
    out = {}
    for op in graph.ops:
        if not op.results or op.result.type.quant is None:
            continue
        names = [v.name for v in op.operands if not v.is_const] + [op.result.name]
        if not all(n in values for n in names):
            continue
        want = evaluate_op(op, [v.data if v.is_const else values[v.name] for v in op.operands])[0]
        got = np.asarray(values[op.result.name])
        out[op.name] = int(np.max(np.abs(want.astype(np.int64) - got.astype(np.int64)))) if got.size else 0
    return out
