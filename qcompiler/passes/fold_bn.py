"""``fold-bn``: fold inference BatchNormalization (and per-channel affine constants) into weights.

In inference BatchNormalization is a per-channel affine map on axis 1 (Ioffe & Szegedy, *Batch
Normalization*, 2015, Alg. 1 with the population statistics; Jacob et al., *Quantization and
Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference*, 2018, §3.2)::

    BN(y) = γ (y − μ) / √(σ² + ε) + β = s·y + t,   s = γ / √(σ² + ε),   t = β − μ·s

When ``y = W ⊛ x + b`` is a layer linear in its weights with output channels on axis 1, the
affine map folds into it (per output channel c)::

    W'[c] = s[c]·W[c],   b'[c] = s[c]·b[c] + t[c] = (b[c] − μ[c])·s[c] + β[c]

* Conv: W is (Cout, Cin/g, k…), the output channel is W's axis 0.
* ConvTranspose: W is (Cin, Cout/g, k…); output channel ``c = gi·Cout/g + j`` is W's axis 1
  within group gi, so W is viewed as (g, Cin/g, Cout/g, k…) and scaled by s viewed as (g, 1, Cout/g).
* Gemm ``α·op(A)·op(B) + β_g·C``: the output's columns are the channels; op(B)'s columns (B's rows
  when transB) are scaled, and ``C' = s·β_g·C + t`` with ``β_g`` set to 1 (C is created when absent).
* MatMul ``A·B`` with A and B 2-D and B constant (BN's axis 1 is then B's last axis): becomes
  ``Gemm(A, B·diag(s), t)``.

The producer must have constant weights (and bias) and its result must feed only the BN (a
second user would see the folded values). The same fold applies to ``Mul``/``Add`` by a
per-channel constant (shape broadcasting along axis 1 only: ``s = c, t = 0`` or ``s = 1, t = c``),
the form exporters give to bias adds and to BNs they decomposed.

What cannot fold forward may fold into the Conv that consumes it (optional,
:attr:`FoldBNOptions.fold_into_consumer`; the BN or Mul/Add must feed only that conv). With input
channel ``i(o, ci) = (o // (Cout/g))·Cin/g + ci`` seen by weight ``W[o, ci]``::

    Conv(s·x + t) = Conv'(x),   W'[o, ci] = W[o, ci]·s[i],   b'[o] = b[o] + Σ_{ci,k} W[o, ci, k]·t[i]

which needs t = 0 when the conv pads (the padded zeros would have become t): a scale folds into
any conv, a shift only into an unpadded one. Any BN left becomes ``Mul(x, s) + t`` with s and t
shaped (C, 1, …) (:attr:`FoldBNOptions.lower_unfolded`).

Before folding, the BN statistics are recorded on the graph for bias absorption in cross-layer
equalization (Nagel et al., *Data-Free Quantization*, 2019, §4.2), keyed by the name of the op
carrying the folded weights and indexed by its output channel::

    graph.meta["bn_stats"]["conv1"] = {"gamma": [...], "beta": [...], "mean": [...], "var": [...], "eps": 1e-5}

A later per-channel Mul/Add folded into the same op updates γ and β to ``s·γ`` and ``s·β + t``.

Before::

    graph @g(%x: tensor<1x2x4x4xf32>) {
      %w = const dense<1.0> : tensor<2x2x1x1xf32>
      %gamma = const dense<[2.0, 1.0]> : tensor<2xf32>
      %beta = const dense<[0.5, -0.5]> : tensor<2xf32>
      %mean = const dense<[1.0, 0.0]> : tensor<2xf32>
      %var = const dense<[3.0, 0.0]> : tensor<2xf32>
      %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32> loc("conv1")
      %z = BatchNormalization(%y, %gamma, %beta, %mean, %var) {epsilon = 1.0} : tensor<1x2x4x4xf32>
      return %z
    }

After::

    graph @g(%x: tensor<1x2x4x4xf32>) {
      %w_folded = const dense<[1.0, 1.0, 1.0, 1.0]> : tensor<2x2x1x1xf32>
      %conv1_bias = const dense<[-0.5, -0.5]> : tensor<2xf32>
      %z = Conv(%x, %w_folded, %conv1_bias) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32>
      return %z
    }

and ``graph.meta["bn_stats"]["conv1"] == {"gamma": [2.0, 1.0], "beta": [0.5, -0.5], "mean": [1.0,
0.0], "var": [3.0, 0.0], "eps": 1.0}``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Op as IROp, Value
from ..ir.ops import full_attrs
from ._common import both_orders, pass_options, single_use
from .manager import PassContext, register_pass
from .rewrite import Any, Const, Op, rewrite

PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class FoldBNOptions:
    fold_affine: bool = True          # also fold per-channel constant Mul/Add (not only BN)
    fold_into_consumer: bool = True   # fold into the input side of the consuming Conv when legal
    lower_unfolded: bool = True       # a BN that cannot fold becomes Mul + Add


def bn_scale_shift(bn: IROp) -> tuple[np.ndarray, np.ndarray]:
    """(s, t) in float64 with BN(y) = s·y + t per channel."""
    gamma, beta, mean, var = (v.data.astype(np.float64) for v in bn.operands[1:])
    eps = full_attrs("BatchNormalization", **bn.attrs)["epsilon"]
    s = gamma / np.sqrt(var + eps)
    return s, beta - mean * s


def record_bn_stats(graph: Graph, op_name: str, bn: IROp) -> None:
    gamma, beta, mean, var = ([float(x) for x in v.data.reshape(-1)] for v in bn.operands[1:])
    eps = float(full_attrs("BatchNormalization", **bn.attrs)["epsilon"])
    graph.meta.setdefault("bn_stats", {})[op_name] = {"gamma": gamma, "beta": beta, "mean": mean,
                                                      "var": var, "eps": eps}


def _update_bn_stats(graph: Graph, op_name: str, s: np.ndarray, t: np.ndarray) -> None:
    st = graph.meta.get("bn_stats", {}).get(op_name)
    if st is not None:
        st["gamma"] = [float(g * a) for g, a in zip(st["gamma"], s)]
        st["beta"] = [float(b * a + c) for b, a, c in zip(st["beta"], s, t)]


def channel_vector(c: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """The constant ``c`` as one float64 per channel (axis 1) of a ``out_shape`` tensor, or None
    when c varies along another axis or would broadcast ``out_shape`` to a bigger shape."""
    r = len(out_shape)
    if r < 2 or c.ndim > r:
        return None
    sh = (1,) * (r - c.ndim) + tuple(c.shape)
    if any(d != 1 for i, d in enumerate(sh) if i != 1) or sh[1] not in (1, out_shape[1]):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (out_shape[1],))


# ---- folding an affine map into a producer --------------------------------------------------------
def _float_consts(*vs: Value | None) -> bool:
    """Every given operand is a float constant (None: an absent optional operand)."""
    return all(v is None or (v.is_const and v.data.dtype.kind == "f") for v in vs)


def _cast(a: np.ndarray, like: np.ndarray) -> np.ndarray:
    return a.astype(like.dtype)


def fold_into_producer(graph: Graph, p: IROp, s: np.ndarray, t: np.ndarray) -> IROp | None:
    """Make ``p`` compute ``s·p(x) + t`` per output channel by rewriting its weights; return the
    op that now carries the result (``p`` itself, or a Gemm replacing a MatMul), None if illegal."""
    ops = p.operands
    if p.kind in ("Conv", "ConvTranspose"):
        w, b = ops[1], (ops[2] if len(ops) > 2 else None)
        if not _float_consts(w, b):
            return None
        W = w.data.astype(np.float64)
        if p.kind == "Conv":
            W2 = W * s.reshape((-1,) + (1,) * (W.ndim - 1))
        else:
            g = full_attrs("ConvTranspose", **p.attrs)["group"]
            cin, cg = W.shape[0], W.shape[1]
            view = W.reshape((g, cin // g, cg) + W.shape[2:])
            W2 = (view * s.reshape((g, 1, cg) + (1,) * (W.ndim - 2))).reshape(W.shape)
        new_ops = [ops[0], graph.add_const(_cast(W2, w.data), w.name + "_folded")]
        if b is not None:
            new_ops.append(graph.add_const(_cast(b.data.astype(np.float64) * s + t, b.data), b.name + "_folded"))
        elif np.any(t):
            new_ops.append(graph.add_const(_cast(t, w.data), p.name + "_bias"))
        p.set_operands(new_ops)
        return p
    if p.kind == "Gemm":
        a = full_attrs("Gemm", **p.attrs)
        w, c = ops[1], (ops[2] if len(ops) > 2 else None)
        if not _float_consts(w, c):
            return None
        W = w.data.astype(np.float64)
        W2 = W * (s[:, None] if a["transB"] else s[None, :])
        C2 = t if c is None else a["beta"] * c.data.astype(np.float64) * s + t
        new_c = graph.add_const(_cast(C2, w.data), (c.name + "_folded") if c else p.name + "_bias")
        p.set_operands([ops[0], graph.add_const(_cast(W2, w.data), w.name + "_folded"), new_c])
        p.attrs["beta"] = 1.0
        return p
    if p.kind == "MatMul":
        A, w = ops
        if A.type.rank != 2 or w.type.rank != 2 or not _float_consts(w):
            return None
        W2 = graph.add_const(_cast(w.data.astype(np.float64) * s[None, :], w.data), w.name + "_folded")
        C2 = graph.add_const(_cast(t, w.data), p.name + "_bias")
        return graph.create_op("Gemm", [A, W2, C2], full_attrs("Gemm"), before=p, name=p.name or "gemm")
    return None


# ---- rules ----------------------------------------------------------------------------------------
def _bn_into_producer(g: Graph, m):
    bn, p = m.root, m["p"]
    s, t = bn_scale_shift(bn)
    if p.result.shape[1:2] != (len(s),):
        return None
    new = fold_into_producer(g, p, s, t)
    if new is None:
        return None
    record_bn_stats(g, new.name, bn)
    return new.result


def _affine_into_producer(kind: str):
    def fn(g: Graph, m):
        p = m["p"]
        vec = channel_vector(m["c"].data, p.result.shape)
        if vec is None or m.root.result.shape != p.result.shape or m["c"].dtype != p.result.dtype:
            return None
        s, t = (vec, np.zeros_like(vec)) if kind == "Mul" else (np.ones_like(vec), vec)
        new = fold_into_producer(g, p, s, t)
        if new is None:
            return None
        if new is p:
            _update_bn_stats(g, p.name, s, t)
        return new.result
    fn.__name__ = f"fold_{kind.lower()}_into_producer"
    return fn


def fold_into_consumer(graph: Graph, conv: IROp, x: Value, s: np.ndarray, t: np.ndarray) -> bool:
    """Make ``conv`` compute ``Conv(s·x + t)`` from ``x`` by rewriting its weights and bias (s and t
    per input channel); False when illegal (not a Conv, weights not constant, or a shift t under
    zero padding, where the padded zeros would have become t)."""
    bias = conv.operands[2] if len(conv.operands) > 2 else None
    if conv.kind != "Conv" or not _float_consts(conv.operands[1], bias):
        return False
    a = full_attrs("Conv", **conv.attrs)
    if any(a["pads"] or []) and np.any(t):
        return False
    w = conv.operands[1]
    W = w.data.astype(np.float64)
    cout, cg = W.shape[:2]
    chan = (np.arange(cout) // (cout // a["group"]))[:, None] * cg + np.arange(cg)[None, :]   # (Cout, Cin/g)
    spatial = (1,) * (W.ndim - 2)
    new_ops = [x, graph.add_const(_cast(W * s[chan].reshape(W.shape[:2] + spatial), w.data), w.name + "_folded")]
    shift = (W * t[chan].reshape(W.shape[:2] + spatial)).reshape(cout, -1).sum(axis=1)
    if bias is not None:
        new_ops.append(graph.add_const(_cast(bias.data.astype(np.float64) + shift, bias.data), bias.name + "_folded"))
    elif np.any(shift):
        new_ops.append(graph.add_const(_cast(shift, w.data), conv.name + "_bias"))
    conv.set_operands(new_ops)
    return True


def _into_consumer(kind: str):
    def fn(g: Graph, m):
        root, x = m.root, m["x"]
        if not single_use(root.result) or root.result.uses[0][1] != 0 or root.result.shape != x.shape:
            return None
        if kind == "BatchNormalization":
            s, t = bn_scale_shift(root)
        else:
            vec = channel_vector(m["c"].data, x.shape)
            if vec is None or m["c"].dtype != x.dtype:
                return None
            s, t = (vec, np.zeros_like(vec)) if kind == "Mul" else (np.ones_like(vec), vec)
        return x if fold_into_consumer(g, root.result.uses[0][0], x, s, t) else None
    fn.__name__ = f"fold_{kind.lower()}_into_consumer"
    return fn


def _lower_bn(g: Graph, m):
    bn, x = m.root, m["x"]
    s, t = bn_scale_shift(bn)
    shape = (-1,) + (1,) * (x.type.rank - 2)
    dt = bn.operands[1].data
    mul = g.create_op("Mul", [x, g.add_const(_cast(s.reshape(shape), dt), bn.name + "_scale")], before=bn,
                      name=bn.name + "_scale")
    add = g.create_op("Add", [mul.result, g.add_const(_cast(t.reshape(shape), dt), bn.name + "_shift")], before=bn,
                      name=bn.name + "_shift")
    return add.result


def _bn(x) -> Op:
    return Op("BatchNormalization", x, Const(), Const(), Const(), Const())


def _producer() -> Op:
    return Op(PRODUCERS, name="p", single_use=True, variadic=True)


@register_pass("fold-bn", options=FoldBNOptions)
def fold_bn(graph: Graph, ctx: PassContext) -> bool:
    """Fold BatchNormalization (and per-channel constant Mul/Add) into Conv, ConvTranspose, Gemm and
    MatMul weights; record the BN statistics in graph.meta["bn_stats"]; lower the rest to Mul+Add."""
    opts = pass_options(ctx, "fold-bn", FoldBNOptions)
    producer = [(_bn(_producer()), _bn_into_producer)]
    consumer = [(_bn(Any("x")), _into_consumer("BatchNormalization"))]
    if opts.fold_affine:
        for kind in ("Mul", "Add"):
            producer += both_orders(kind, _producer(), Const("c"), _affine_into_producer(kind))
            consumer += both_orders(kind, Any("x"), Const("c"), _into_consumer(kind))
    changed = rewrite(graph, producer)
    if opts.fold_into_consumer:
        changed |= rewrite(graph, consumer)
    if opts.lower_unfolded:
        changed |= rewrite(graph, [(_bn(Any("x")), _lower_bn)])
    if changed:
        graph.remove_unused_consts()
    return changed
