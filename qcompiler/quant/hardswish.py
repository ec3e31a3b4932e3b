"""HardSwish fused into the epilogue of QLinearConv / QLinearGemm, evaluated in float32.

A conv (or gemm) followed by HardSwish, or by the scaled form the ``equalize`` pass leaves
(``z · HardSigmoid(S·z)``, see :func:`qcompiler.passes.equalize.scaled_hardswish`), computes per
output channel c

    y = z · clamp(a_c z + b, 0, 1),    a_c = α S_c > 0   (HardSwish: α = 1/6, b = 1/2, S = 1)

Quantizing z to 8 bits before the activation (QLinearConv -> DQ -> HardSwish -> Q) adds a second
rounding, on a grid that must also cover z's negative tail which HardSwish maps near 0, so z's
step is coarser than y's. Here the activation is evaluated on the int32 accumulator with ONE
quantization point (y's), which is what the QDQ export (DQ -> Conv -> HardSwish -> Q) computes in
ONNX Runtime. The issue allows HardSwish "float or lookup table"; the accumulator and the
requantization of every other layer stay integer. With M_c = s_x s_w[c] / s_y (the accumulator's
step in output steps) and ⊗, ⊕ float32 operations, each rounded to nearest even::

    σ_c = f32(M_c),  g_c = f32(a_c s_y),  nb = f32(-b),  pb = f32(1 - b),  bb = f32(b)   (compile time)
    w   = f32(acc) ⊗ σ_c                      the pre-activation z, in output steps
    t   = min(max(w ⊗ g_c, nb), pb) ⊕ bb      the gate clamp(a_c z + b, 0, 1)
    v   = min(max(w ⊗ t, lo - z_y), hi - z_y)
    y_q = z_y + rint(v)                       rint: round half to even (as QuantizeLinear)

No product feeds an addition directly (the gate's add takes the clamped product), so a compiler
that contracts a·b + c into a fused multiply-add (LLVM with fp-contract=fast, nvcc) has nothing to
contract: every backend computes these exact float32 operations, and the kernels equal the
reference (:func:`requantize`, numpy float32) bit for bit. The clamp before rint keeps the
conversion to int32 in range; it commutes with rounding since its bounds are integers.

Error against the exact y / s_y, in output steps: f32(acc) (exact below 2^24), σ_c, w, g_c, the
gate's product and sum, and the final product are each within 2^-24 relative, so
|Δ| <= 8 · 2^-24 · max(hi - lo, b / g_c) where y is not saturated (the gate's open region spans
(1 - b) / g_c + b / g_c steps; beyond hi - lo + 1 steps the output saturates). :func:`plan` rejects
a gate wider than 2^15 output steps, so |Δ| < 2^-6 step: y_q is the correctly rounded y except
within that distance of a rounding boundary, at most 1 LSB from a float HardSwish quantized once
(a float32 conv in ONNX Runtime is itself about that far from the exact sum).

The op keeps ``multiplier``/``shift`` = the fixed-point M_c like any QLinearConv (the layer's
requantization, for reports and tools; the epilogue reads σ_c) and a ``hardswish`` attribute
``[σ, g, [b]]``: σ and g lists of one entry or one per output channel, float32 values (the
attribute's form and the gate of ``activation_params``: :func:`qcompiler.ir.quant_ops.check_attr`,
:func:`qcompiler.ir.quant_ops.gate`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.quant_ops import MAX_GATE_STEPS, gate
from .requant import quantize_multiplier


def plan(M: Sequence[float], s_out: float, slopes: np.ndarray, beta: float
         ) -> tuple[list[int], list[int], list[list[float]]]:
    """``(multiplier, shift, hardswish)`` attributes for per-channel real multipliers
    M_c = s_x s_w[c] / s_y (see the module docstring). Raises ValueError when a channel's gate is
    not representable (a slope absurdly small or large against the output step)."""
    M = np.broadcast_to(np.asarray(M, np.float64).reshape(-1), (len(slopes),))
    s_y = float(np.float32(s_out))
    g = np.asarray(slopes, np.float64) * s_y
    width = (abs(beta) + abs(1 - beta)) / g
    if not np.all(np.isfinite(g)) or np.any(g <= 0) or np.any(width > MAX_GATE_STEPS) \
            or not np.all(np.isfinite(M.astype(np.float32))) or np.any(M.astype(np.float32) <= 0):
        raise ValueError(f"HardSwish gate slopes {np.asarray(slopes)} do not fit a float32 epilogue "
                         f"for output step {s_y}")
    ms, ss = zip(*(quantize_multiplier(float(m)) for m in M))
    ms, ss = list(ms), list(ss)
    if len(set(ss)) == 1 and len(set(ms)) == 1:
        ms, ss = ms[:1], ss[:1]
    sig = _compact([float(np.float32(m)) for m in M])
    gs = _compact([float(np.float32(v)) for v in g])
    return ms, ss, [sig, gs, [float(np.float32(beta))]]


def epilogue_attrs(s_in: float, s_w: Sequence[float], out_qp, activation_params, channels: int) -> dict:
    """``multiplier``, ``shift`` and ``hardswish`` of a QLinearConv/QLinearGemm with input step
    ``s_in``, weight steps ``s_w`` (one or per channel), output params ``out_qp`` and HardSwish
    ``activation_params`` (see :func:`gate`); M_c is formed in float64 from the float32 scales,
    as :func:`qcompiler.quant.requant.conv_multipliers` does."""
    sx, sy = float(np.float32(s_in)), float(np.float32(out_qp.scale[0]))
    M = [sx * float(np.float32(w)) / sy for w in s_w]
    a, b = gate(activation_params, channels)
    ms, ss, hs = plan(M, sy, a, b)
    return {"multiplier": ms, "shift": ss, "hardswish": hs}


def _compact(v: list) -> list:
    return v[:1] if len(set(v)) == 1 else list(v)


def gate_constants(b: float) -> tuple[np.float32, np.float32, np.float32]:
    """``(nb, pb, bb)`` = f32(-b), f32(1 - b), f32(b) of the gate, the same constants in every backend."""
    return np.float32(-float(b)), np.float32(1.0 - float(b)), np.float32(b)


def requantize(acc: np.ndarray, hs, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """The epilogue on an integer accumulator, in numpy float32 exactly as the kernels compute it
    (``hs`` = [σ, g, [b]], σ and g scalars or arrays broadcasting against ``acc``, per channel);
    int64 result."""
    f = np.float32
    sig, g = np.asarray(hs[0], f), np.asarray(hs[1], f)
    nb, pb, bb = gate_constants(hs[2][0])
    z = int(zero_point)
    w = np.asarray(acc).astype(f) * sig
    t = np.minimum(np.maximum(w * g, nb), pb) + bb
    v = np.minimum(np.maximum(w * t, f(lo - z)), f(hi - z))
    return np.rint(v).astype(np.int64) + z
