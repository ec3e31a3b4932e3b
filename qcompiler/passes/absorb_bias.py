"""``absorb-bias``: high-bias absorption across ReLU (Nagel et al., *Data-Free Quantization Through
Weight Equalization and Bias Correction*, ICCV 2019, §4.1.1).

Equalization divides a channel's weights *and bias* by s_i; where s_i < 1 the bias grows and so
does the activation range that the next quantizer must cover. If a constant c ≥ 0 per channel is
below almost every pre-activation value x, then ``relu(x − c) = relu(x) − c`` and the constant
moves into the next layer's bias::

    y = W2 · relu(W1 x + b1) + b2 = W2 · relu(W1 x + b1 − c) + (b2 + W2 c)

With the BatchNorm statistics that fold-bn recorded for the first layer (x ≈ N(β, γ²) per
channel, kept current by ``equalize``), the paper takes ``c = max(0, β − 3|γ|)``: the identity then
holds for all but ~0.13 % of a Gaussian channel's values (where x < c the result differs by
``W2 (c − max(x, 0))``, so the pass preserves outputs within a tolerance, not exactly).

Exactness and padding: ``b2 += Σ_{ci,k} W2[o, ci, k] · c[ci]`` assumes every window of the second
conv reads c in every tap. A zero-padded conv reads 0 (not −c) at the border, so its border
outputs would be off by the taps falling on padding: the paper ignores this. Here the pass
applies only where the shift is exact up to the Gaussian tail: the second layer is a Gemm or an
*unpadded* conv (in MobileNetV2 the depthwise → project pair, never the padded expand →
depthwise pair). Between the two layers only Relu (fused into the first layer or standalone),
Identity and a channel-preserving Flatten of a 1×1 map are allowed (pooling would be exact too
for max pooling, but average pooling with padding is not; both are skipped for simplicity).

Checked against data when there is some. The Gaussian assumption holds for the data the BatchNorm
statistics were gathered on, not necessarily for the inputs the model meets: on rapidocr-cls, one
channel (Conv@7 ch 11) has β − 3γ = 0.80 but pre-activations down to −4.7 on 256 text lines, so
the paper's c changes the outputs by 1.8e-3·max|y| there. With calibration data (the option
``calib``, or the quantize pass's ``calib`` when the pipeline quantizes, as ``qcompile --dtype int8
--equalize`` does) the pass observes each candidate channel's smallest pre-activation m over the
data and absorbs ``c = max(0, min(β − 3|γ|, m))``: exact on every calibration sample, and
data-free (the paper's rule) only when no data is given. Recorded per layer in
``graph.meta["absorb_bias_check"]`` (the BatchNorm c and the observed m).

``graph.meta["bn_stats"][first]["beta"]`` is lowered by c (the pre-activation mean moves), and
``graph.meta["absorb_bias"][first]`` records the absorbed c.

Example: c = max(0, β − 3γ) = [2.0, 0.0] from β = [2.5, 0.1], γ = [1/6, 1.0].

Before::

    graph @g(%x: tensor<1x2x3x3xf32>) {
      %w1 = const dense<[1.0, 0.0, 0.0, 1.0]> : tensor<2x2x1x1xf32>
      %b1 = const dense<[2.5, 0.1]> : tensor<2xf32>
      %w2 = const dense<[1.0, 2.0]> : tensor<1x2x1x1xf32>
      %b2 = const dense<[0.5]> : tensor<1xf32>
      %h = FusedConv(%x, %w1, %b1) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32> loc("c1")
      %y = Conv(%h, %w2, %b2) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32> loc("c2")
      return %y
    }

After::

    graph @g(%x: tensor<1x2x3x3xf32>) {
      %w1 = const dense<[1.0, 0.0, 0.0, 1.0]> : tensor<2x2x1x1xf32>
      %w2 = const dense<[1.0, 2.0]> : tensor<1x2x1x1xf32>
      %b1_absorbed = const dense<[0.5, 0.1]> : tensor<2xf32>
      %b2_absorbed = const dense<[2.5]> : tensor<1xf32>
      %h = FusedConv(%x, %w1, %b1_absorbed) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32>
      %y = Conv(%h, %w2, %b2_absorbed) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32>
      return %y
    }

(with ``graph.meta["bn_stats"]["c1"] = {"gamma": [1/6, 1.0], "beta": [2.5, 0.1], ...}``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph, Op
from ..ir.ops import full_attrs
from ._common import pass_options, quantize_calib
from .equalize import CONVS, activation, bias_of, in_channel_index, pairs, set_weights, weight_oc
from .manager import PassContext, register_pass


@dataclass(frozen=True)
class AbsorbBiasOptions:
    sigmas: float = 3.0       # c = max(0, β − sigmas·|γ|)
    calib: Any = None         # feeds to check c against (None: the quantize pass's calib, else data-free)


class _ChannelMin:
    """Observer: the smallest value per channel (axis 1) over every update."""
    def __init__(self):
        self.min: np.ndarray | None = None
        self.count = 0

    def update(self, a) -> None:
        a = np.asarray(a, np.float64)
        m = a.min(axis=tuple(i for i in range(a.ndim) if i != 1))
        self.min = m if self.min is None else np.minimum(self.min, m)
        self.count += 1


def _observed_minimum(graph: Graph, layers: list[Op], calib) -> dict[str, np.ndarray]:
    """Per layer in ``layers``, its smallest pre-activation per output channel over ``calib``: the
    graph is cloned, the layers' fused Relu dropped, and their results observed by onnxruntime."""
    from ..quant.calibrate import observe
    h = graph.clone()
    names = {op.name for op in layers}
    values = {}
    for op in h.ops:
        if op.name in names:
            if op.attrs.get("activation"):
                op.attrs["activation"] = ""
            values[op.name] = op.result.name
    obs = observe(h, calib, list(values.values()), lambda _: _ChannelMin())
    return {n: obs[v].min for n, v in values.items() if obs[v].min is not None}


def _exact_second(op2: Op) -> bool:
    return op2.kind not in CONVS or not any(full_attrs(op2.kind, **op2.attrs)["pads"] or [])


def _has_relu(op1: Op, between: list[Op]) -> bool:
    kinds = [b.kind for b in between]
    if any(k not in ("Relu", "Identity", "Flatten") for k in kinds):
        return False
    return activation(op1) == "Relu" or "Relu" in kinds


@register_pass("absorb-bias", options=AbsorbBiasOptions)
def absorb_bias(graph: Graph, ctx: PassContext) -> bool:
    """Move c = max(0, β − 3γ) (lowered to the smallest pre-activation seen on calibration data,
    when there is some) from a layer's bias across its ReLU into the next layer's bias."""
    opts = pass_options(ctx, "absorb-bias", AbsorbBiasOptions)
    stats = graph.meta.get("bn_stats", {})
    todo = []
    for op1, op2, between in pairs(graph, acts=("", "Relu")):
        st = stats.get(op1.name)
        if st is None or not _has_relu(op1, between) or not _exact_second(op2):
            continue
        beta, gamma = np.asarray(st["beta"], np.float64), np.abs(np.asarray(st["gamma"], np.float64))
        if len(beta) != op1.result.shape[1]:
            continue
        c = np.maximum(0.0, beta - opts.sigmas * gamma)
        if np.any(c > 0):
            todo.append((op1, op2, st, beta, c))
    calib = opts.calib if opts.calib is not None else quantize_calib(ctx)
    if todo and calib is not None:
        seen = _observed_minimum(graph, [t[0] for t in todo], calib)
        check = graph.meta.setdefault("absorb_bias_check", {})
        for i, (op1, op2, st, beta, c) in enumerate(todo):
            m = seen.get(op1.name)
            if m is not None:
                check[op1.name] = {"bn_c": [float(x) for x in c], "observed_min": [float(x) for x in m]}
                todo[i] = (op1, op2, st, beta, np.maximum(0.0, np.minimum(c, m)))
    changed = False
    for op1, op2, st, beta, c in todo:
        if not np.any(c > 0):
            continue
        w2 = weight_oc(op2)
        idx = in_channel_index(op2, w2)
        shift = (w2 * c[idx].reshape(idx.shape + (1,) * (w2.ndim - 2))).reshape(w2.shape[0], -1).sum(axis=1)
        set_weights(graph, op1, b=bias_of(op1) - c, suffix="_absorbed")
        set_weights(graph, op2, b=bias_of(op2) + shift, suffix="_absorbed")
        st["beta"] = [float(x) for x in beta - c]
        graph.meta.setdefault("absorb_bias", {})[op1.name] = [float(x) for x in c]
        changed = True
    if changed:
        graph.remove_unused_consts()
    return changed
