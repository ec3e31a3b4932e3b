"""``equalize``: cross-layer range equalization (Nagel et al., *Data-Free Quantization Through Weight
Equalization and Bias Correction*, ICCV 2019, §4.1).

Two layers joined by a positively homogeneous map f (``f(s·x) = s·f(x)`` for s > 0 per channel:
ReLU, LeakyRelu, no activation, MaxPool/AveragePool/GlobalAveragePool, Identity, a Flatten of a
1×1 map) compute the same function after channel i of the first layer's output is divided by
s_i > 0 and the matching input channel of the second layer is multiplied by it::

    y = W2 · f(W1 x + b1) + b2 = (W2 S) · f(S⁻¹ W1 x + S⁻¹ b1) + b2,   S = diag(s)

With r1_i the range (max |w|) of the first layer's output channel i and r2_i the range of the
second layer's input channel i, the choice that makes both ranges √(r1_i·r2_i) (the paper's
optimum for per-tensor quantization of both weights, eq. 9) is::

    s_i = √(r1_i · r2_i) / r2_i,   W1[i] /= s_i,   b1[i] /= s_i,   W2[:, i] *= s_i

Groups are honoured: a depthwise conv's channel i is both its output channel i and its input
channel i, so in pointwise → depthwise → pointwise both pairs are equalized and the sweep over all
pairs repeats until no s_i differs from 1 by more than ``tol`` (or ``max_iter`` sweeps).

Beyond the paper's ReLU chains:

* **HardSwish** is not positively homogeneous, but it has an exact rescaled form: with z = y/S,
  ``HardSwish(y)/S = z · HardSigmoid(S·z; 1/6, 1/2)``. A first layer with a fused HardSwish is
  equalized like a linear one and its activation becomes ``Mul(z, S) -> HardSigmoid -> Mul(z, ·)``
  (S the product of its s over all sweeps; a later run recognises the form and updates S). This is
  what lets MobileNetV3-style networks (rapidocr-cls: 18 HardSwish layers) be equalized at all.
* **Fan-out** to several layers is allowed when every path commutes with the scaling: pooling,
  Relu, Identity, a flattening/reshape of a 1×1 map, and Mul by a tensor that does not itself
  depend on the scaled one (a squeeze-excite gate). All consumers take s (r2 = the largest of
  their input-channel ranges), e.g. a depthwise conv feeding both its SE branch (via
  GlobalAveragePool) and its projection (via the gate Mul).
* ``residual=True`` (off by default): a residual stream (the first layer, layers that add it back
  through their Z input or an Add) shares one s. Exact, but measured worse on both real models
  (rapidocr-cls per-tensor + analytic bias correction 19.6 → 17.6 dB, and no convergence in 50
  sweeps), so it is an option only.

A chain is skipped (the scaling would not commute or would be seen elsewhere) when the first
layer has a residual input Z (FusedConv's 4th operand: Z would need scaling too), an activation
other than ReLU/LeakyRelu/HardSwish/none (Clip(0, 6) does not commute with scaling: run
``relu6-to-relu`` first), a tensor on the way is a graph output or meets any other op (residual
adds, Concat), or a weight/bias is not constant. Layers: Conv, FusedConv, Gemm, FusedGemm (2-D,
transA = 0).

Side effects on ``graph.meta``: the BatchNorm statistics that fold-bn recorded for the first
layer are rescaled (the pre-activation output is now N(β/s, (γ/s)²): ``gamma /= s``, ``beta /= s``)
so that ``absorb-bias`` and ``bias-correct`` stay valid; ``graph.meta["equalize"]`` records, for
the ``record`` most imbalanced first layers (largest max/min ratio of per-channel ranges), their
per-output-channel weight ranges before and after (for the report plot of qcompiler/plan/dfq.py),
the pairs, the HardSwish layers rescaled and the number of sweeps.

Before::

    graph @g(%x: tensor<1x2x3x3xf32>) {
      %w1 = const dense<[4.0, 0.0, 0.0, 1.0]> : tensor<2x2x1x1xf32>
      %w2 = const dense<[1.0, 4.0]> : tensor<1x2x1x1xf32>
      %h = FusedConv(%x, %w1) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32> loc("c1")
      %y = Conv(%h, %w2) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32> loc("c2")
      return %y
    }

After::

    graph @g(%x: tensor<1x2x3x3xf32>) {
      %w1_eq = const dense<[2.0, 0.0, 0.0, 2.0]> : tensor<2x2x1x1xf32>
      %w2_eq = const dense<[2.0, 2.0]> : tensor<1x2x1x1xf32>
      %h = FusedConv(%x, %w1_eq) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x3xf32>
      %y = Conv(%h, %w2_eq) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x3x3xf32>
      return %y
    }
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph, Op, Value
from ..ir.ops import full_attrs
from ._common import CONVS, is_output, pass_options, single_use
from .manager import PassContext, register_pass

GEMMS = ("Gemm", "FusedGemm")
SCALE_FREE_ACTS = ("", "Relu", "LeakyRelu")               # f(s·x) = s·f(x) for s > 0
THROUGH = ("Relu", "LeakyRelu", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
           "Identity", "Flatten", "Reshape")
HSWISH_ALPHA = 1.0 / 6.0                                  # HardSwish(x) = x · HardSigmoid(x; 1/6, 1/2)


@dataclass(frozen=True)
class EqualizeOptions:
    tol: float = 1e-3        # stop when every |s_i − 1| <= tol in a sweep
    max_iter: int = 50       # sweeps over all pairs
    residual: bool = False   # also equalize residual streams as one tensor (see _region; measured worse)
    record: int | None = None  # most imbalanced layers whose ranges go to graph.meta["equalize"] (None: all)


# ---- layers: weights viewed per channel (shared with absorb-bias and bias-correct) -----------------
def is_layer(op: Op) -> bool:
    """A Conv/Gemm-like op with constant float weights (and bias) this family of passes handles."""
    ops = op.operands
    if op.kind not in CONVS + GEMMS or len(ops) < 2 or not ops[1].is_const or ops[1].data.dtype.kind != "f":
        return False
    if len(ops) > 2 and not ops[2].is_const:
        return False
    if op.kind in GEMMS:
        a = full_attrs(op.kind, **op.attrs)
        if a["transA"] or ops[1].type.rank != 2 or ops[0].type.rank != 2:
            return False
        if len(ops) > 2 and ops[2].data.size not in (1, op.result.shape[1]) and ops[2].data.size != 0:
            return False
    return True


def weight_oc(op: Op) -> np.ndarray:
    """The weight as (Cout, Cin/g, k…) in float64: a Gemm's W is transposed to (N, K) when transB = 0
    and multiplied by alpha (so Gemm(x) = x·Wᵀ + b like a 1×1 conv)."""
    w = op.operands[1].data.astype(np.float64)
    if op.kind in GEMMS:
        a = full_attrs(op.kind, **op.attrs)
        w = (w if a["transB"] else w.T) * a["alpha"]
    return w


def groups(op: Op) -> int:
    return int(full_attrs(op.kind, **op.attrs)["group"]) if op.kind in CONVS else 1


def in_channel_index(op: Op, w: np.ndarray) -> np.ndarray:
    """(Cout, Cin/g) array: the input channel that weight slice W[o, ci] reads."""
    cout, cg = w.shape[:2]
    return (np.arange(cout) // (cout // groups(op)))[:, None] * cg + np.arange(cg)[None, :]


def out_ranges(op: Op) -> np.ndarray:
    """max |W| per output channel."""
    w = weight_oc(op)
    return np.abs(w).reshape(w.shape[0], -1).max(axis=1)


def in_ranges(op: Op) -> np.ndarray:
    """max |W| per input channel (a depthwise conv's input channel i is its own filter i)."""
    w = weight_oc(op)
    per = np.abs(w).reshape(w.shape[0], w.shape[1], -1).max(axis=2)          # (Cout, Cin/g)
    idx = in_channel_index(op, w)
    r = np.zeros(int(idx.max()) + 1)
    np.maximum.at(r, idx.ravel(), per.ravel())
    return r


def bias_of(op: Op) -> np.ndarray:
    """The effective bias per output channel (Gemm: beta·C broadcast), zeros when absent."""
    n = op.result.shape[1]
    if len(op.operands) < 3 or op.operands[2].data.size == 0:
        return np.zeros(n)
    b = op.operands[2].data.astype(np.float64).reshape(-1)
    if op.kind in GEMMS:
        b = b * full_attrs(op.kind, **op.attrs)["beta"]
    return np.broadcast_to(b, (n,)).copy()


def set_weights(graph: Graph, op: Op, w_oc: np.ndarray | None = None, b: np.ndarray | None = None,
                suffix: str = "_eq") -> None:
    """Store new weights (given as (Cout, Cin/g, k…)) and/or bias (per output channel) on ``op`` as
    new constants in the dtypes and layouts of the old ones (Gemm: beta becomes 1)."""
    ops = list(op.operands)
    w_old = ops[1]
    if w_oc is not None:
        w = w_oc
        if op.kind in GEMMS:
            a = full_attrs(op.kind, **op.attrs)
            w = (w if a["transB"] else w.T) / a["alpha"]
        ops[1] = _new_const(graph, w_old, w.astype(w_old.data.dtype), suffix)
    if b is not None:
        if op.kind in GEMMS and "beta" in full_attrs(op.kind, **op.attrs):
            op.attrs["beta"] = 1.0
        if len(ops) > 2:
            ops[2] = _new_const(graph, ops[2], b.astype(ops[2].data.dtype), suffix)
        else:
            ops.append(graph.add_const(b.astype(w_old.data.dtype), (op.name or "layer") + "_bias" + suffix))
    op.set_operands(ops)


def _new_const(graph: Graph, old: Value, data: np.ndarray, suffix: str) -> Value:
    """A constant holding ``data``: ``old`` updated in place when only this op uses it and an
    earlier call of the same pass made it, else a new one named after ``old``."""
    if old.name.endswith(suffix) and len(old.uses) == 1:
        old.data = data
        return old
    return graph.add_const(data, old.name + suffix)


# ---- pairs ------------------------------------------------------------------------------------------
def activation(op: Op) -> str:
    return op.attrs.get("activation", "") if op.kind.startswith("Fused") else ""


def _flat_channels(op: Op) -> bool:
    """A Flatten/Reshape of an (N, C, 1, …) map to (N, C): channels stay channels."""
    shp = op.operands[0].shape
    return len(shp) >= 2 and all(d == 1 for d in shp[2:]) and op.result.shape == shp[:2]


def _through_ok(op: Op) -> bool:
    if len(op.results) != 1:
        return False
    if op.kind == "Reshape":                      # shape as attribute or constant operand
        return all(v.is_const for v in op.operands[1:]) and _flat_channels(op)
    if op.kind not in THROUGH or len(op.operands) != 1:
        return False
    if op.kind == "Flatten":
        return _flat_channels(op)
    return True


def follow(op1: Op) -> tuple[Op, list[Op]] | None:
    """The layer that op1's output reaches through single-use, channel-preserving ops (as its
    data input), and those ops; None when the output fans out, is a graph output or meets
    anything else."""
    v: Value = op1.result
    between: list[Op] = []
    while True:
        if not single_use(v):
            return None
        user, slot = v.uses[0]
        if is_layer(user) and slot == 0:
            return user, between
        if slot != 0 or not _through_ok(user):
            return None
        between.append(user)
        v = user.result


def pairs(graph: Graph, acts: tuple[str, ...] = SCALE_FREE_ACTS) -> list[tuple[Op, Op, list[Op]]]:
    """(first, second, between) for every single-consumer chain where the first layer has no
    residual input and an activation in ``acts``, and channel counts match (absorb-bias's chains)."""
    out = []
    for op1 in graph.ops:
        if not is_layer(op1) or len(op1.operands) > 3 or activation(op1) not in acts:
            continue
        got = follow(op1)
        if got is None:
            continue
        op2, between = got
        if any(b.kind in ("Relu", "LeakyRelu") and b.kind not in acts for b in between):
            continue
        if op1.result.shape[1] != len(in_ranges(op2)):
            continue
        out.append((op1, op2, between))
    return out


# ---- chains with fan-out and the rescaled HardSwish ---------------------------------------------------
def _channel_vector(c: Value, channels: int, rank: int) -> bool:
    """``c`` broadcasts against an (N, C, …) tensor of ``rank`` along the channel axis only."""
    shp = (1,) * (rank - c.type.rank) + tuple(c.shape)
    return c.type.rank <= rank and shp[1] == channels and all(d == 1 for i, d in enumerate(shp) if i != 1)


def scaled_hardswish(z: Value) -> tuple[Op, Op, Op] | None:
    """``(Mul(z, S), HardSigmoid, Mul(z, ·))`` when the only uses of ``z`` compute
    ``z · hardsigmoid(S·z)`` (α = 1/6, β = 1/2) with a constant per-channel S: the form in which
    this pass leaves a HardSwish it rescaled (S = 1 is HardSwish itself)."""
    if len(z.uses) != 2 or is_output(z) or z.type.rank < 2:
        return None
    for m_s, _ in z.uses:
        other = [v for v in m_s.operands if v is not z]
        if m_s.kind != "Mul" or len(other) != 1 or not other[0].is_const or not single_use(m_s.result):
            continue
        if not _channel_vector(other[0], z.shape[1], z.type.rank):
            continue
        hs = m_s.result.uses[0][0]
        a = full_attrs(hs.kind, **hs.attrs) if hs.kind == "HardSigmoid" else {}
        if not a or abs(a["alpha"] - HSWISH_ALPHA) > 1e-6 or a["beta"] != 0.5 or not single_use(hs.result):
            continue
        m_o = hs.result.uses[0][0]
        if m_o.kind == "Mul" and {id(v) for v in m_o.operands} == {id(z), id(hs.result)} \
                and m_o.result.shape == z.shape:
            return m_s, hs, m_o
    return None


@dataclass
class Chain:
    """Layers whose output channels (one shared scale per channel: ``producers``, the first one
    ``first``; the others add a residual that is already in the group) reach ``consumers`` (at
    their data input) only through ops that commute with a positive per-channel scale
    (``between``)."""
    first: Op
    consumers: list[Op]
    between: list[Op]
    hardswish: str = ""            # "fused": the first layer's HardSwish; "scaled": x·hsig(S·x) after it
    producers: list[Op] = field(default_factory=list)

    def __post_init__(self):
        if not self.producers:
            self.producers = [self.first]


def _joins(op: Op) -> bool:
    """A layer that adds a residual Z (FusedConv's 4th operand) under a scale-free activation: when
    Z is scaled per channel, scaling its weights and bias the same way scales its output."""
    return is_layer(op) and len(op.operands) == 4 and activation(op) in SCALE_FREE_ACTS


def _starts(op: Op | None) -> bool:
    """A layer that can head a chain: no residual input, a scale-free activation."""
    return op is not None and is_layer(op) and len(op.operands) <= 3 and activation(op) in SCALE_FREE_ACTS


def _region(first: Op, start: Value, channels: int, residual: bool = False
            ) -> tuple[list[Op], list[Op], list[Op]] | None:
    """(producers, consumers, between) of the values reachable from ``start`` through ops that
    commute with a per-channel scale: pooling, Relu, Identity, a flattening of a 1×1 map, Mul by
    anything that does not itself depend on ``start`` (an SE gate), and residual additions — a
    layer whose residual input Z is in the region, or an Add of two region values, joins it (its
    weights are scaled like the first layer's: the residual stream is equalized as one tensor).
    None when a value leaves the graph or meets anything else."""
    producers, consumers, between = [first], [], []
    inside, todo = {id(start)}, [start]
    while todo:
        v = todo.pop()
        if is_output(v) or not v.uses:
            return None
        for user, slot in v.uses:
            if is_layer(user) and slot == 0:
                if user not in consumers:
                    consumers.append(user)
                continue
            if residual and is_layer(user) and slot == 3 and _joins(user):
                if user.operands[0] is v or user.result.shape[1] != channels:
                    return None
                producers.append(user)
            elif residual and user.kind == "Add" and len(user.operands) == 2 and user.result.shape == v.shape:
                if user in between:               # reached through both operands
                    continue
                o = user.operands[1 - slot]
                if id(o) not in inside and _starts(o.producer) and single_use(o):
                    producers.append(o.producer)  # the other branch of a residual block
                    inside.add(id(o))
                between.append(user)
            elif (slot == 0 and _through_ok(user)) or (user.kind == "Mul" and user.result.shape == v.shape):
                if user.kind == "Mul" and id(user.result) in inside:      # Mul(h, h): scaled twice
                    return None
                between.append(user)
            else:
                return None
            inside.add(id(user.result))
            todo.append(user.result)
    if any(op.kind == "Add" and not all(id(x) in inside for x in op.operands) for op in between):
        return None                                # an Add needs both operands scaled alike
    if not consumers or any(len(in_ranges(c)) != channels for c in consumers):
        return None
    if any(c in producers for c in consumers):
        return None
    return producers, consumers, between


def chains(graph: Graph, residual: bool = False) -> list[Chain]:
    """Every first layer (no residual input; activation none/ReLU/LeakyReLU, HardSwish, or the
    rescaled HardSwish pattern) whose output channels reach only layers, through ops that commute
    with per-channel scaling (residual additions included: see :func:`_region`)."""
    out, taken = [], set()
    for op1 in graph.ops:
        if not is_layer(op1) or len(op1.operands) > 3:
            continue
        act, start, hsw = activation(op1), op1.result, ""
        pattern = scaled_hardswish(op1.result) if act == "" else None
        if act == "HardSwish":
            hsw = "fused"
        elif pattern is not None:
            hsw, start = "scaled", pattern[2].result
        elif act not in SCALE_FREE_ACTS:
            continue
        got = _region(op1, start, op1.result.shape[1], residual)
        if got is not None and not any(p in taken for p in got[0]):
            taken.update(got[0])
            out.append(Chain(op1, got[1], list(pattern or ()) + got[2], hsw, got[0]))
    return out


# ---- the pass --------------------------------------------------------------------------------------
def _scale_bn_stats(graph: Graph, name: str, s: np.ndarray) -> None:
    st = graph.meta.get("bn_stats", {}).get(name)
    if st is not None and len(st["gamma"]) == len(s):
        st["gamma"] = [float(g / a) for g, a in zip(st["gamma"], s)]
        st["beta"] = [float(b / a) for b, a in zip(st["beta"], s)]


def _scale_inputs(graph: Graph, op2: Op, s: np.ndarray) -> None:
    w2 = weight_oc(op2)
    idx = in_channel_index(op2, w2)
    set_weights(graph, op2, w2 * s[idx].reshape(idx.shape + (1,) * (w2.ndim - 2)))


def equalize_chain(graph: Graph, ch: Chain) -> np.ndarray:
    """Equalize one chain in place (r1, r2 = the largest output/input-channel range over its
    producers/consumers); returns s."""
    r1 = np.max([out_ranges(p) for p in ch.producers], axis=0)
    r2 = np.max([in_ranges(c) for c in ch.consumers], axis=0)
    ok = (r1 > 0) & (r2 > 0)
    s = np.where(ok, np.sqrt(np.where(ok, r1 * r2, 1.0)) / np.where(ok, r2, 1.0), 1.0)
    for op1 in ch.producers:
        w1 = weight_oc(op1) / s.reshape((-1,) + (1,) * (op1.operands[1].type.rank - 1))
        set_weights(graph, op1, w1, bias_of(op1) / s if len(op1.operands) > 2 else None)
        _scale_bn_stats(graph, op1.name, s)
    for c in ch.consumers:
        _scale_inputs(graph, c, s)
    return s


def equalize_pair(graph: Graph, op1: Op, op2: Op) -> np.ndarray:
    """Equalize one single-consumer pair in place; returns s."""
    return equalize_chain(graph, Chain(op1, [op2], []))


def rescale_hardswish(graph: Graph, op1: Op, S: np.ndarray) -> None:
    """Give ``op1`` (HardSwish fused, or followed by x·hsig(S₀·x)) the activation x·hsig(S·S₀·x),
    which is HardSwish of the unscaled pre-activation divided by S·S₀."""
    z, shape = op1.result, (1, len(S)) + (1,) * (op1.result.type.rank - 2)
    pattern = scaled_hardswish(z) if activation(op1) == "" else None
    if pattern is not None:
        m_s = pattern[0]
        i = 1 if m_s.operands[0] is z else 0
        old = m_s.operands[i]
        total = (np.broadcast_to(old.data.astype(np.float64).reshape(-1), (len(S),)) * S).reshape(shape)
        m_s.set_operand(i, _new_const(graph, old, total.astype(np.float32), "_eq"))
        return
    uses, name = list(z.uses), z.name
    op1.attrs["activation"], op1.attrs["activation_params"] = "", []
    graph.rename(z, graph.unique_name(name + "_pre"))
    scale = graph.add_const(S.reshape(shape).astype(np.float32), op1.name + "_hswish_scale")
    m_s = graph.create_op("Mul", [z, scale], name=op1.name + "_hswish_scale", after=op1)
    hs = graph.create_op("HardSigmoid", [m_s.result], {"alpha": HSWISH_ALPHA, "beta": 0.5},
                         name=op1.name + "_hswish_gate", after=m_s)
    out = graph.create_op("Mul", [z, hs.result], name=op1.name + "_hswish", result_names=[name], after=hs)
    for user, slot in uses:
        user.set_operand(slot, out.result)


@register_pass("equalize", options=EqualizeOptions)
def equalize(graph: Graph, ctx: PassContext) -> bool:
    """Cross-layer range equalization of layer pairs joined by ReLU/pooling (Nagel et al. 2019)."""
    opts = pass_options(ctx, "equalize", EqualizeOptions)
    found = chains(graph, opts.residual)
    if not found:
        return False
    firsts = {p.name: out_ranges(p) for ch in found for p in ch.producers}
    cum = {ch.first.name: np.ones(ch.first.result.shape[1]) for ch in found if ch.hardswish}
    sweeps = 0
    for sweeps in range(1, opts.max_iter + 1):
        worst = 0.0
        for ch in found:
            s = equalize_chain(graph, ch)
            if ch.hardswish:
                cum[ch.first.name] *= s
            worst = max(worst, float(np.max(np.abs(s - 1.0))))
        if worst <= opts.tol:
            break
    rescaled = []
    for ch in found:
        if ch.hardswish and np.max(np.abs(cum[ch.first.name] - 1.0)) > 1e-6:
            rescale_hardswish(graph, ch.first, cum[ch.first.name])
            rescaled.append(ch.first.name)
    graph.remove_unused_consts()

    def imbalance(r):
        pos = r[r > 0]
        return float(pos.max() / pos.min()) if len(pos) else 1.0
    top = sorted(firsts, key=lambda n: -imbalance(firsts[n]))[:opts.record]
    by_name = {p.name: p for ch in found for p in ch.producers}
    graph.meta["equalize"] = {
        "pairs": [[p.name, c.name] for ch in found for p in ch.producers for c in ch.consumers],
        "sweeps": sweeps,
        "hardswish": rescaled,
        "layers": {n: {"before": [float(x) for x in firsts[n]],
                       "after": [float(x) for x in out_ranges(by_name[n])]} for n in top}}
    ctx.log(f"equalize: {len(found)} chains, {sweeps} sweeps, {len(rescaled)} HardSwish rescaled")
    return True
