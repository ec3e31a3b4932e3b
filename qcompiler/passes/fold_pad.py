"""``fold-pad``: fold an explicit constant ``Pad`` on the spatial axes into its consumers' padding.

TF-style exporters write ``Pad`` before strided convolutions and pools (TF's ``SAME`` padding is
asymmetric, ``pads = [0, 0, 0, 0, 0, 0, 1, 1]``, which older converters spell as a separate op), so
every such Pad would be a kernel of its own that copies the whole activation. A Pad of ``x`` (rank
``r``, ``pads = [b_0 … b_{r-1}, e_0 … e_{r-1}]``, constant value v, zero pads on the batch and
channel axes 0 and 1, no negative pads) followed by a windowed op with pads ``p`` equals that op on
``x`` with pads ``p + q`` (q: the Pad's spatial begin/end pads), when the op's own padding value is
v and the windows and divisors are the same:

* ``Conv`` / ``FusedConv`` (any group, stride, dilation): they pad with 0, so v = 0 folds exactly::

      Conv(Pad(x, q, 0), W; pads = p) = Conv(x, W; pads = p + q)

  (every output position sees the same input/zero taps, the output shape is unchanged; a
  FusedConv's residual and activation act on that same output).
* ``MaxPool`` pads with −∞ (the kernels: the dtype minimum), so v = −∞ or v ≤ the dtype's minimum
  folds. The folded pads must stay below the kernel size (ONNX Runtime requires it; no window then
  lies entirely in padding, where −∞ and the dtype minimum would differ) and the pool must not be
  dilated. A Pad with v = 0 is declined (exact only for non-negative inputs).
* ``AveragePool`` with ``count_include_pad = 1`` divides by the window clipped to the padded
  input, which is the same before and after (the padded extent ``size + q_b + q_e + p_b + p_e`` is
  unchanged), so v = 0 folds. With ``count_include_pad = 0`` the Pad's zeros are counted by the
  original (they are input to it) and the fold is exact only when the pool has no pads of its own
  and ``ceil_mode = 0`` (every window then lies in the padded input, divisor = kernel size): it
  folds with ``count_include_pad = 1``; otherwise declined. Folded pads stay below the kernel size.

In every case the consumer's output shape is re-inferred and must equal the old one (with
``ceil_mode = 1`` the last window's rule depends on where the input ends, so this can decline).

Declined (the Pad stays): mode ``reflect``/``edge``; negative pads; pads on axis 0 or 1; a value
other than the one the consumer pads with; a consumer with ``auto_pad`` other than ``NOTSET`` (the
importer resolves auto_pad into ``pads``, so IR from ONNX never has one); a Pad whose result is a
graph output or feeds an op that cannot take it, or feeds an op in another operand than the data
input. A Pad's pads are an attribute in the IR: the importer only accepts constant ``pads`` inputs,
so a Pad with computed pads never reaches this pass. With several users the Pad folds into all of
them (and disappears) or into none; :attr:`FoldPadOptions.partial` folds into each user that can
take it and keeps the Pad for the others.

The consumer keeps its identity (name, result name, location: quantization overrides and
``bn_stats`` are keyed by op name), only its operand 0 and its pads change, so the rules are a
``(pattern, fn)`` table matched with :func:`qcompiler.passes.rewrite.match` whose functions return
the new attributes (or the reason to decline) rather than a replacement value for the driver.

The pass runs before quantize: after quantization a Pad on quantized values pads with the zero
point, which QLinearConv's own padding also does, and a quantized MaxPool pads with the storage
minimum, so folded graphs quantize as before (AveragePool folds always give count_include_pad = 1,
which QLinearAveragePool accepts with pads).

Before::

    graph @g(%x: tensor<1x3x8x8xf32>) {
      %w = const dense<0.5> : tensor<4x3x3x3xf32>
      %p = Pad(%x) {mode = "constant", pads = [0, 0, 0, 0, 0, 0, 1, 1], value = 0.0} : tensor<1x3x9x9xf32>
      %y = Conv(%p, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [2, 2]} : tensor<1x4x4x4xf32>
      return %y
    }

After::

    graph @g(%x: tensor<1x3x8x8xf32>) {
      %w = const dense<0.5> : tensor<4x3x3x3xf32>
      %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 1, 1], strides = [2, 2]} : tensor<1x4x4x4xf32>
      return %y
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Op as IROp
from ..ir.ops import full_attrs, infer_types
from ._common import CONVS, is_output, pass_options
from .manager import PassContext, register_pass
from .rewrite import Any, Op, match


@dataclass(frozen=True)
class FoldPadOptions:
    partial: bool = False    # fold into the users that can take the Pad, keep it for the others


def _pad_spatial(pad: IROp) -> tuple[list[int], list[int]] | str:
    """The Pad's (begin, end) pads on the spatial axes, or why it cannot fold at all."""
    a = full_attrs("Pad", **pad.attrs)
    r, pads = pad.operands[0].type.rank, list(a["pads"] or [])
    if a["mode"] != "constant":
        return f"mode '{a['mode']}'"
    if len(pads) != 2 * r or r < 3:
        return f"pads {pads} for rank {r}"
    if any(p < 0 for p in pads):
        return f"negative pads {pads}"
    if pads[0] or pads[1] or pads[r] or pads[r + 1]:
        return f"pads on the batch or channel axis {pads}"
    return pads[2:r], pads[r + 2:]


def _new_pads(consumer: IROp, pad: IROp) -> dict | str:
    """The consumer's attributes with the Pad's spatial pads added, or why not."""
    got = _pad_spatial(pad)
    if isinstance(got, str):
        return got
    begin, end = got
    if consumer.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "", None):
        return f"auto_pad {consumer.attrs['auto_pad']}"
    attrs = full_attrs(consumer.kind, **consumer.attrs)
    n = len(begin)
    old = list(attrs["pads"] or [0] * (2 * n))
    if len(old) != 2 * n:
        return f"consumer pads {old}"
    attrs["pads"] = [int(o + p) for o, p in zip(old, begin + end)]
    types = [v.type for v in consumer.operands]
    types[0] = pad.operands[0].type
    try:
        (t,) = infer_types(consumer.kind, types, attrs, [None] + [v.data for v in consumer.operands[1:]])
    except Exception as e:   # noqa: BLE001 - the new attributes do not type: decline
        return f"folded attributes do not type: {e}"
    if t.shape != consumer.result.shape:
        return f"output shape {t.shape} != {consumer.result.shape}"
    return attrs


def _pad_value(pad: IROp) -> float:
    return float(full_attrs("Pad", **pad.attrs)["value"])


def _within_kernel(attrs: dict) -> str | None:
    k, p = attrs["kernel_shape"], attrs["pads"]
    n = len(k)
    if any(p[i] >= k[i] or p[i + n] >= k[i] for i in range(n)):
        return f"folded pads {p} not below the kernel {k}"
    return None


# ---- rules: fn(graph, match) -> the consumer's new attributes, or the reason to decline -----------
def _into_conv(g: Graph, m):
    if _pad_value(m["pad"]) != 0.0:
        return f"pad value {_pad_value(m['pad'])} (convolutions pad with 0)"
    return _new_pads(m.root, m["pad"])


def _into_maxpool(g: Graph, m):
    v, lowest = _pad_value(m["pad"]), None
    try:
        dtype = np.dtype(m.root.result.dtype)
        lowest = float(np.finfo(dtype).min) if dtype.kind == "f" else None
    except TypeError:
        pass
    if not (v == -math.inf or (lowest is not None and v <= lowest)):
        return f"pad value {v} (MaxPool pads with -inf)"
    if any(d != 1 for d in (m.root.attrs.get("dilations") or [])):
        return "dilated MaxPool"
    attrs = _new_pads(m.root, m["pad"])
    return attrs if isinstance(attrs, str) else (_within_kernel(attrs) or attrs)


def _into_avgpool(g: Graph, m):
    if _pad_value(m["pad"]) != 0.0:
        return f"pad value {_pad_value(m['pad'])} (AveragePool pads with 0)"
    a = full_attrs("AveragePool", **m.root.attrs)
    if not a["count_include_pad"] and (any(a["pads"] or []) or a["ceil_mode"]):
        return "count_include_pad = 0 with pads or ceil_mode (the divisor would change)"
    attrs = _new_pads(m.root, m["pad"])
    if isinstance(attrs, str):
        return attrs
    attrs["count_include_pad"] = 1
    return _within_kernel(attrs) or attrs


def _padded(kind) -> Op:
    return Op(kind, Op("Pad", Any("x"), name="pad"), name="consumer", variadic=True)


RULES = [(_padded(CONVS), _into_conv), (_padded("MaxPool"), _into_maxpool),
         (_padded("AveragePool"), _into_avgpool)]


def plan(graph: Graph, consumer: IROp, index: int) -> dict | str:
    """New attributes for ``consumer`` reading the Pad's input instead of its operand ``index``
    (a Pad's result), or why it cannot."""
    if index != 0:
        return f"{consumer.describe()} takes the Pad as operand {index}, not its data input"
    for pattern, fn in RULES:
        m = match(pattern, consumer)
        if m is not None:
            return fn(graph, m)
    return f"{consumer.describe()} cannot absorb a Pad"


@register_pass("fold-pad", options=FoldPadOptions)
def fold_pad(graph: Graph, ctx: PassContext) -> bool:
    """Fold constant spatial Pad ops into the padding of the Conv/FusedConv (value 0), MaxPool
    (value -inf) and AveragePool (value 0, count_include_pad) that consume them."""
    opts = pass_options(ctx, "fold-pad", FoldPadOptions)
    changed, again = False, True
    while again:
        again = False
        for pad in graph.find_ops("Pad"):
            if pad.graph is not graph:
                continue
            r = pad.result
            plans = [(op, plan(graph, op, i)) for op, i in list(r.uses)]
            ok = [(op, a) for op, a in plans if isinstance(a, dict)]
            why = [f"{op.describe()}: {a}" for op, a in plans if isinstance(a, str)]
            if is_output(r):
                why.append("its result is a graph output")
            if not ok or (why and not opts.partial):
                if why and ctx is not None:
                    ctx.log(f"fold-pad: {pad.describe()} kept ({'; '.join(why)})")
                continue
            x = pad.operands[0]
            for op, attrs in ok:
                op.attrs = attrs
                op.set_operand(0, x)
            if not r.uses and not is_output(r):
                graph.erase_op(pad)
            again = changed = True
    return changed
