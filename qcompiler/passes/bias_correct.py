"""``bias-correct``: analytic bias correction of weight quantization error (Nagel et al., *Data-Free
Quantization Through Weight Equalization and Bias Correction*, ICCV 2019, §4.2).

Quantizing weights W to W̃ = W + ε biases a layer's output: ``E[ỹ] − E[y] = ε · E[x]`` per output
channel, which the next layers amplify (systematic, not averaged away). Subtracting it from the
bias removes the shift in expectation::

    b'[o] = b[o] − Σ_{ci,k} ε[o, ci, k] · E[x[i(o, ci)]],   ε = fake_quant(W) − W

(with ``i(o, ci)`` the input channel a grouped conv's weight reads; the sum over kernel taps
assumes every tap reads the channel's mean, i.e. it ignores the zero padding at borders, as the
paper does).

E[x] comes without data from the BatchNorm statistics fold-bn recorded for the layer producing
x (``graph.meta["bn_stats"]``; kept current by ``equalize`` and ``absorb-bias``): its
pre-activation output is taken as N(β, γ²) per channel, and the activation clips it to [a, b]
(ReLU: [0, ∞), ReLU6: [0, 6], none: (−∞, ∞)). For a normal clipped to [a, b], with
α = (a − β)/γ, ϐ = (b − β)/γ, Φ/φ the standard normal cdf/pdf (the paper's eq. 18 for ReLU)::

    E[clip(x, a, b)] = a·Φ(α) + β·(Φ(ϐ) − Φ(α)) + γ·(φ(α) − φ(ϐ)) + b·(1 − Φ(ϐ))

A HardSwish producer (fused, or in the rescaled form x·hsig(S·x) that ``equalize`` leaves, whose
mean is E[hardswish(S·x)]/S) uses the closed form of :func:`hardswish_normal_mean`.

Between producer and consumer only ops that keep channel means are allowed: Relu/Clip (folded
into the clipping above), Identity, AveragePool/GlobalAveragePool, a Flatten of a 1×1 map.
Layers whose input has no such statistics (the first layer, after a residual add, after MaxPool)
are left alone.

The quantized weights are simulated exactly as the ``quantize`` pass makes them (symmetric int8,
per output channel or per tensor after Gemm's transpose and alpha), so this pass belongs right
before ``quantize`` and must be given the same ``per_channel`` choice (its own option, else the
``quantize`` options in the context). The one difference: ``quantize`` may widen a weight scale
where an int32 bias would overflow (``_fit_bias``), which depends on calibrated input scales and
is not simulated.

Empirical variant (``empirical=True``, the paper's §5 alternative when data is at hand): the
layer inputs are averaged over calibration feeds (``calib``, else the ``quantize`` options') on
the float graph, keeping spatial positions, and the correction is the mean over output positions
of ``ε ⊛ x̄``: exact for the mean output shift, zero padding included, and free of the Gaussian
assumption (every layer is corrected, whatever precedes it). The pass changes the float function on purpose (by about ε·E[x]); it records
``graph.meta["bias_correct"][layer] = max |correction|``.

Example: per tensor, scale 1/127 (rounded up to a float32), w = 0.5 → 63 steps = 0.49606,
ε = −0.00394, and w = 1.0 → 127 steps, ε = +1.2e-7 from the rounded scale; E[x] = β = 2 for the
linear producer c1 with γ = 1 (``BiasCorrectOptions(per_channel=False)``,
``bn_stats["c1"] = {"gamma": [1.0], "beta": [2.0]}``).

Before::

    graph @g(%x: tensor<1x1x3x3xf32>) {
      %w1 = const dense<[1.0]> : tensor<1x1x1x1xf32>
      %w2 = const dense<[0.5, 1.0]> : tensor<2x1x1x1xf32>
      %b2 = const dense<[0.0, 0.0]> : tensor<2xf32>
      %h = Conv(%x, %w1) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32> loc("c1")
      %y = Conv(%h, %w2, %b2) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32> loc("c2")
      return %y
    }

After::

    graph @g(%x: tensor<1x1x3x3xf32>) {
      %w1 = const dense<[1.0]> : tensor<1x1x1x1xf32>
      %w2 = const dense<[0.5, 1.0]> : tensor<2x1x1x1xf32>
      %b2_bc = const dense<[0.007873893, -2.3841858e-07]> : tensor<2xf32>
      %h = Conv(%x, %w1) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32>
      %y = Conv(%h, %w2, %b2_bc) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32>
      return %y
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph, Op
from ..ir.ops import full_attrs
from ..quant import qparams as qpm
from ..quant.calibrate import float_runner
from ._common import pass_options
from .equalize import (CONVS, activation, bias_of, in_channel_index, is_layer, scaled_hardswish, set_weights,
                       weight_oc)
from .manager import PassContext, register_pass

MEAN_KEEPING = ("Identity", "AveragePool", "GlobalAveragePool", "Flatten")


@dataclass(frozen=True)
class BiasCorrectOptions:
    per_channel: bool | None = None     # None: as the quantize options in the context say (default True)
    empirical: bool = False             # E[ε ⊛ x] from calibration data instead of BN statistics
    calib: Any = None                   # feeds for empirical (None: the quantize options' calib)


def _per_channel(ctx: PassContext | None, opts: BiasCorrectOptions) -> bool:
    if opts.per_channel is not None:
        return opts.per_channel
    q = ctx.option("quantize") if ctx is not None else None
    if q is None:
        return True
    return bool(q.get("per_channel", True) if isinstance(q, dict) else getattr(q, "per_channel", True))


_cdf = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)))


def _pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * np.square(z)) / math.sqrt(2.0 * math.pi)


def clipped_normal_mean(mu: np.ndarray, sigma: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """E[clip(x, lo, hi)] for x ~ N(mu, sigma²) per channel (lo/hi may be ∓inf; sigma 0 allowed)."""
    mu, sigma = np.asarray(mu, np.float64), np.abs(np.asarray(sigma, np.float64))
    safe = np.where(sigma > 0, sigma, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        a = (lo - mu) / safe if np.isfinite(lo) else np.full_like(mu, -np.inf)
        b = (hi - mu) / safe if np.isfinite(hi) else np.full_like(mu, np.inf)
    ca, cb = _cdf(a).astype(np.float64), _cdf(b).astype(np.float64)
    e = mu * (cb - ca) + sigma * (_pdf(a) - _pdf(b))
    if np.isfinite(lo):
        e = e + lo * ca
    if np.isfinite(hi):
        e = e + hi * (1.0 - cb)
    return np.where(sigma > 0, e, np.clip(mu, lo, hi))


def _clip_bounds(kind: str, params) -> tuple[float, float] | None:
    if kind == "":
        return -np.inf, np.inf
    if kind == "Relu":
        return 0.0, np.inf
    if kind == "Clip":
        lo, hi = (list(params) + [-np.inf, np.inf])[:2] if params else (-np.inf, np.inf)
        return float(lo), float(hi)
    return None


def hardswish_normal_mean(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """E[hardswish(x)] for x ~ N(mu, sigma²) per channel: hardswish(x) = 0 below −3, x above 3 and
    (x² + 3x)/6 between, so with a = (−3 − mu)/sigma, b = (3 − mu)/sigma and the partial moments
    E[x; a<z<b] = mu·P + sigma·(φ(a) − φ(b)), E[x²; a<z<b] = (mu² + sigma²)·P + 2·mu·sigma·(φ(a) − φ(b))
    + sigma²·(a·φ(a) − b·φ(b)), P = Φ(b) − Φ(a)::

        E = (E[x²; ·] + 3·E[x; ·]) / 6 + mu·(1 − Φ(b)) + sigma·φ(b)
    """
    mu, sigma = np.asarray(mu, np.float64), np.abs(np.asarray(sigma, np.float64))
    safe = np.where(sigma > 0, sigma, 1.0)
    a, b = (-3.0 - mu) / safe, (3.0 - mu) / safe
    pa, pb, fa, fb = _cdf(a).astype(np.float64), _cdf(b).astype(np.float64), _pdf(a), _pdf(b)
    p, d = pb - pa, fa - fb
    m1 = mu * p + safe * d
    m2 = (mu * mu + safe * safe) * p + 2 * mu * safe * d + safe * safe * (a * fa - b * fb)
    e = (m2 + 3 * m1) / 6 + mu * (1 - pb) + safe * fb
    point = mu * np.clip(mu / 6 + 0.5, 0.0, 1.0)
    return np.where(sigma > 0, e, point)


def _producer_mean(graph: Graph, p: Op, lo: float, hi: float, scale: np.ndarray | None) -> np.ndarray | None:
    """E[act(x)] clipped to [lo, hi] for the layer ``p`` with x ~ N(β, γ²) from its BN statistics;
    ``scale``: p is followed by the rescaled HardSwish x·hsig(S·x) of equalize (mean E[hswish(Sx)]/S)."""
    st = graph.meta.get("bn_stats", {}).get(p.name) if p is not None else None
    if st is None or len(p.operands) > 3 or len(st["beta"]) != p.result.shape[1]:
        return None
    beta, gamma = np.asarray(st["beta"], np.float64), np.asarray(st["gamma"], np.float64)
    act = activation(p)
    if scale is not None or act == "HardSwish":
        s = np.ones_like(beta) if scale is None else scale
        if np.isfinite(lo) or np.isfinite(hi):
            return None
        return hardswish_normal_mean(beta * s, gamma * s) / s
    b = _clip_bounds(act, p.attrs.get("activation_params", []))
    if b is None:
        return None
    lo, hi = max(lo, b[0]), min(hi, b[1])     # clip∘clip = clip to the intersection (nested ranges)
    return clipped_normal_mean(beta, gamma, lo, hi)


def input_mean(graph: Graph, op2: Op) -> np.ndarray | None:
    """E[x] per channel of op2's data input from the producing layer's BN statistics, or None."""
    v = op2.operands[0]
    lo, hi = -np.inf, np.inf
    while v.producer is not None and not is_layer(v.producer):
        p = v.producer
        if p.kind == "Mul" and len(p.operands) == 2:          # equalize's rescaled HardSwish?
            for z in p.operands:
                pat = scaled_hardswish(z) if z.producer is not None and is_layer(z.producer) else None
                if pat is not None and pat[2] is p and activation(z.producer) == "":
                    c = pat[0].operands[1] if pat[0].operands[0] is z else pat[0].operands[0]
                    S = np.broadcast_to(c.data.astype(np.float64).reshape(-1), (z.shape[1],))
                    return _producer_mean(graph, z.producer, lo, hi, S)
            return None
        if p.kind in ("Relu", "Clip") and len(p.operands) == 1:
            a = full_attrs(p.kind, **p.attrs)
            b = _clip_bounds(p.kind, [a.get("min", -np.inf), a.get("max", np.inf)] if p.kind == "Clip" else [])
            lo, hi = max(lo, b[0]), min(hi, b[1])
        elif p.kind in ("Flatten", "Reshape") and all(d == 1 for d in p.operands[0].shape[2:]) \
                and p.result.shape == p.operands[0].shape[:2]:
            pass
        elif p.kind not in MEAN_KEEPING:
            return None
        v = p.operands[0]
    return _producer_mean(graph, v.producer, lo, hi, None)


def simulated_weight_error(op: Op, per_channel: bool) -> np.ndarray:
    """ε = W̃ − W as (Cout, Cin/g, k…) with W̃ the int8 weights the quantize pass will make."""
    w = weight_oc(op).astype(np.float32)
    qp = qpm.per_channel_symmetric(w, 0) if per_channel else qpm.symmetric(float(w.min()), float(w.max()))
    return qpm.fake_quantize(w, qp).astype(np.float64) - w.astype(np.float64)


# ---- empirical variant (optional) ---------------------------------------------------------------
def mean_inputs(graph: Graph, calib, layers: list[Op], outputs: list | None = None) -> dict[str, np.ndarray]:
    """Per layer, its data input averaged over the calibration batches and samples (a (1, C, …)
    map: spatial positions kept, so the border taps that read zero padding are accounted for), each
    layer over its own leading axis: a GEMM over the B·S rows of a (B, S, K) activation (a
    transformer's or an unrolled LSTM's linear layer, :func:`~qcompiler.passes.quantize_plan.prepare`)
    gets the mean row (a (1, K) vector), whose correction is the mean shift of each output row.
    ``outputs``: a list that receives, per calibration feed, the graph outputs of the same run (the
    float reference :func:`~qcompiler.passes.quantize_bias.bias_correction_helps` compares with),
    so the float graph is run once for both.

    The float graph runs in onnxruntime, op by op as the calibration does
    (:func:`~qcompiler.quant.calibrate.float_runner`): the same float32 values as the numpy reference
    interpreter to a few ulps, at the speed of a compiled runtime (DeepLabV3 at 520x520 on 32
    feeds: 22 s in the reference, 3 s). A graph ONNX cannot hold (or onnxruntime cannot run)
    falls back to the reference."""
    want = list(dict.fromkeys([op.operands[0].name for op in layers] + [v.name for v in graph.outputs]))

    def average(per_feed) -> tuple[dict[str, np.ndarray], list]:
        sums: dict[str, np.ndarray] = {}
        rows: dict[str, int] = {}
        outs = []
        for vals in per_feed:
            for op in layers:
                x = np.asarray(vals[op.operands[0].name], np.float64)
                sums[op.name] = sums.get(op.name, 0.0) + x.sum(axis=0, keepdims=True)
                rows[op.name] = rows.get(op.name, 0) + (x.shape[0] if x.ndim else 1)
            if outputs is not None:
                outs.append([vals[v.name] for v in graph.outputs])
        return {k: v / max(rows[k], 1) for k, v in sums.items()}, outs

    try:
        means, outs = average(map(float_runner(graph, want), calib))
    except Exception:  # noqa: BLE001 - a graph ONNX cannot hold or onnxruntime cannot run: the reference
        from ..quant import reference
        means, outs = average(reference.run_values(graph, feeds) for feeds in calib)
    if outputs is not None:
        outputs.extend(outs)
    return means


def empirical_error(op: Op, eps: np.ndarray, xbar: np.ndarray) -> np.ndarray:
    """Mean over output positions of ε ⊛ x̄ (exact for the mean output error of a linear layer)."""
    if op.kind in CONVS:
        from ..ir.windows import conv_sum
        y = conv_sum(xbar, eps, full_attrs(op.kind, **op.attrs), tuple(op.result.shape[2:]))
        return y.reshape(y.shape[1], -1).mean(axis=1)
    return eps @ xbar.reshape(-1)


def _calib(ctx: PassContext | None, opts: BiasCorrectOptions):
    if opts.calib is not None:
        return opts.calib
    q = ctx.option("quantize") if ctx is not None else None
    data = (q.get("calib") if isinstance(q, dict) else getattr(q, "calib", None)) if q is not None else None
    if data is None:
        raise ValueError("bias-correct: empirical=True needs calibration feeds (BiasCorrectOptions.calib or "
                         "the quantize options' calib)")
    return data


@register_pass("bias-correct", options=BiasCorrectOptions)
def bias_correct(graph: Graph, ctx: PassContext) -> bool:
    """b -= (W_q − W)·E[x], E[x] from BN statistics (run right before quantize, same per_channel)."""
    opts = pass_options(ctx, "bias-correct", BiasCorrectOptions)
    per_channel = _per_channel(ctx, opts)
    layers = [op for op in graph.ops if is_layer(op)]
    means = mean_inputs(graph, _calib(ctx, opts), layers) if opts.empirical else {}
    changed = False
    for op in layers:
        eps = simulated_weight_error(op, per_channel)
        if opts.empirical:
            err = empirical_error(op, eps, means[op.name])
        else:
            ex = input_mean(graph, op)
            idx = in_channel_index(op, eps)
            if ex is None or idx.max() >= len(ex):
                continue
            err = (eps * ex[idx].reshape(idx.shape + (1,) * (eps.ndim - 2))).reshape(eps.shape[0], -1).sum(axis=1)
        set_weights(graph, op, b=bias_of(op) - err, suffix="_bc")
        graph.meta.setdefault("bias_correct", {})[op.name] = float(np.max(np.abs(err))) if err.size else 0.0
        changed = True
    if changed:
        graph.remove_unused_consts()
    return changed
