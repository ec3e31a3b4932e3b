"""``pad-channels``: convolutions whose kernels compute padded output channels store them padded.

A conv with ``K`` output channels that no 4-lane block divides (ShuffleNetV2's 58-channel
branches, SSDLite's 546-channel head, Silero's 258) is stored by the code generator in the widest
power-of-two block dividing ``K``: NCHW2c for 58. Every kernel that touches such a tensor then
works on 2-lane vectors: a depthwise 3x3 conv on 58 channels ran 5x slower per multiply-add than
on 116, the int8 1x1 conv reading it packs every input into 4-channel groups first, and each
write-back scatters a 16-lane accumulator into eight 2-lane pieces. ONNX Runtime's NCHWc layout
pads every filter count up to its 16-channel block instead (``nchwc_transformer.cc``).

The conv kernels already *compute* a padded accumulator for such ``K`` (``K'`` = ``K`` rounded up
to the vector: :func:`qcompiler.codegen.kernels.conv.padded_channels`,
:func:`qcompiler.codegen.kernels.qdot.dot_channels`); this pass makes the graph store what they
compute. With ``channels(op) = K' > K`` for a conv ``op``:

* ``op`` gets ``K' - K`` more output channels with zero weights and zero bias (int8: weight scale
  of the last channel, multiplier 0, so each holds the output zero point: the real value 0);
* a group-1 conv reading the padded value gets zero weights for the extra input channels
  (``Σ_c w[k, c] x[c]`` over ``c < K'`` is the same sum);
* a depthwise conv reading it (group = ``K``) becomes a depthwise conv of ``K'`` groups with zero
  weights for the new ones, and its output is padded in turn;
* a channel-wise reader (an activation, PRelu, Add/Mul of a per-channel constant, a pool,
  per-tensor Quantize/DequantizeLinear, Requantize) computes the padded channels too (its per-channel constants extended with their
  last value), so it still fuses into the conv's epilogue, and its readers are treated alike;
* every other reader (a Concat, an Add of two images, a graph output) reads
  ``Slice(padded, 0:K)`` on the channel axis, which the code generator fuses into the reader.

The padded channels hold finite values (``act(0)``) that no reader weighs, so the model computes
the same numbers: exactly, for the integer kernels; for float32 the sums gain zero terms only.
Declined: a conv without constant weights, with a residual operand (FusedConv's Z), or with a
per-channel HardSwish epilogue.

Before (the default ``channels``: ``K`` not a multiple of 4 rounds up to 16)::

    graph @g(%x: tensor<1x4x8x8xf32>) {
      %w = const dense<0.5> : tensor<6x4x1x1xf32>
      %wd = const dense<0.25> : tensor<6x1x3x3xf32>
      %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x6x8x8xf32>
      %z = Conv(%y, %wd) {dilations = [1, 1], group = 6, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x6x8x8xf32>
      %o = Concat(%z, %x) {axis = 1} : tensor<1x10x8x8xf32>
      return %o
    }

After (``w_padded``: ``w`` and ten zero rows; ``wd_padded``: ``wd`` and ten zero filters)::

    graph @g(%x: tensor<1x4x8x8xf32>) {
      %y_padded = Conv(%x, %w_padded) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x16x8x8xf32>
      %z_padded = Conv(%y_padded, %wd_padded) {dilations = [1, 1], group = 16, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x16x8x8xf32>
      %z = Slice(%z_padded) {axes = [1], ends = [6], starts = [0], steps = [1]} : tensor<1x6x8x8xf32>
      %o = Concat(%z, %x) {axis = 1} : tensor<1x10x8x8xf32>
      return %o
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir.graph import Graph, Op, Value
from ..ir.types import QuantParams, TensorType, f32
from ._common import CONVS, is_output, pass_options
from .manager import PassContext, register_pass

KINDS = (*CONVS, "QLinearConv")


def vector_channels(op: Op, vector: int = 16, block: int = 4) -> int:
    """The default ``channels``: ``K`` rounded up to ``vector`` when ``block`` does not divide it."""
    k = op.results[0].shape[1]
    return k if k % block == 0 else -(-k // vector) * vector


@dataclass(frozen=True)
class PadChannelsOptions:
    """``channels(op)``: the output channels the kernel of conv ``op`` computes (its ``K`` when
    nothing is padded). The code generator passes its kernels' own rule."""
    channels: Callable[[Op], int] = vector_channels


def _conv_ok(op: Op) -> bool:
    w = op.operands[1] if len(op.operands) > 1 else None
    return (op.kind in KINDS and op.graph is not None and w is not None and w.is_const
            and len(op.results) == 1 and op.results[0].type.rank == 4 and w.type.rank == 4
            and len(op.operands) <= 3 and op.attrs.get("activation") != "HardSwish"
            and not (op.results[0].type.quant is not None and op.results[0].type.quant.per_channel))


def _depthwise(op: Op, c: int) -> bool:
    w = op.operands[1]
    return int(op.attrs.get("group", 1)) == c and w.shape[0] == c and w.shape[1] == 1


def _pad_axis(a: np.ndarray, axis: int, n: int) -> np.ndarray:
    width = [(0, 0)] * a.ndim
    width[axis] = (0, n - a.shape[axis])
    return np.pad(a, width)


def _const(graph: Graph, v: Value, data: np.ndarray, quant: QuantParams | None) -> Value:
    return graph.add_const(data, v.name + "_padded", quant=quant)


def _extend(qp: QuantParams | None, n: int) -> QuantParams | None:
    """Per-channel params along axis 0 extended to n channels (the last channel's scale, zero point 0)."""
    if qp is None or not qp.per_channel:
        return qp
    k = len(qp.scale)
    return QuantParams(qp.storage, qp.scale + (qp.scale[-1],) * (n - k), qp.zero_point + (0,) * (n - k),
                       qp.axis, qp.expressed)


def _widened(graph: Graph, op: Op, x: Value, n_out: int, group: int) -> Op:
    """A copy of conv ``op`` reading ``x``, with ``n_out`` output channels and ``group`` groups."""
    w, rest = op.operands[1], list(op.operands[2:])
    k = w.shape[0]
    cin = x.shape[1] // group
    wd = _pad_axis(_pad_axis(w.data, 0, n_out), 1, cin)
    wq = _extend(w.type.quant, n_out)
    operands = [x, _const(graph, w, wd, wq)]
    if rest:
        b = rest[0]
        bq = b.type.quant
        if bq is not None and bq.per_channel:
            sx = np.float32(x.type.quant.scale[0])
            bq = QuantParams(bq.storage, tuple(f32(sx * np.float32(s)) for s in wq.scale),
                             (0,) * n_out, bq.axis, bq.expressed)
        operands.append(_const(graph, b, _pad_axis(b.data, 0, n_out), bq))
    attrs = dict(op.attrs, group=group)
    if op.kind == "QLinearConv":
        m, s = list(attrs["multiplier"]), list(attrs["shift"])
        if len(m) == k:
            attrs["multiplier"] = m + [0] * (n_out - k)
        if len(s) == k:
            attrs["shift"] = s + [s[-1]] * (n_out - k)
    return _padded_copy(graph, op, operands, attrs, n_out)


def _padded_copy(graph: Graph, op: Op, operands: list, attrs: dict, n: int) -> Op:
    """``op`` on ``operands`` with ``attrs``, after it, its result ``n`` channels wide (the same
    per-tensor quantization), named ``<name>_padded``."""
    r = op.results[0]
    t = TensorType((r.shape[0], n, *r.shape[2:]), r.dtype, r.type.quant)
    return graph.create_op(op.kind, operands, attrs, result_types=[t], name=op.name + "_padded",
                           result_names=[r.name + "_padded"], after=op)


CHANNELWISE = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Elu",
                         "PRelu", "Add", "Sub", "Mul", "Div", "Identity", "Requantize", "MaxPool", "AveragePool",
                         "GlobalAveragePool", "GlobalMaxPool", "QuantizeLinear", "DequantizeLinear", "Cast"})
"""Ops that compute each channel from the same channel of their one image operand (other operands
constant, per channel or scalar): they carry the padded channels on."""


def _channelwise(user: Op, i: int, c: int) -> bool:
    if user.kind not in CHANNELWISE or len(user.results) != 1:
        return False
    r = user.results[0]
    if r.type.rank != 4 or r.shape[1] != c or (r.type.quant is not None and r.type.quant.per_channel):
        return False
    for j, v in enumerate(user.operands):
        if j != i and not (v.is_const and (v.data.size == 1 or _per_channel(v, c))):
            return False
    return True


def _per_channel(v: Value, c: int) -> bool:
    """A constant of shape (c, 1, 1) or (1, c, 1, 1): one value per channel of an NCHW operand."""
    return v.type.quant is None and tuple(v.shape)[-3:] == (c, 1, 1) and all(d == 1 for d in v.shape[:-3])


def _carried(graph: Graph, user: Op, i: int, padded: Value) -> Op:
    """Channel-wise ``user`` on ``padded``: per-channel constants extended with their last value."""
    n = padded.shape[1]
    operands = []
    for j, v in enumerate(user.operands):
        if j == i:
            operands.append(padded)
        elif v.data.size == 1:
            operands.append(v)
        else:
            width = [(0, 0)] * v.data.ndim
            width[-3] = (0, n - v.shape[-3])
            operands.append(graph.add_const(np.pad(v.data, width, mode="edge"), v.name + "_padded"))
    return _padded_copy(graph, user, operands, dict(user.attrs), n)


def _absorbs(user: Op, i: int, c: int) -> str | None:
    """How ``user`` takes a padded operand ``i`` of ``c`` real channels: "input" (a group-1 conv:
    zero weights for the extra channels), "depthwise" (more groups), "channelwise" (it carries
    them on), or None (it reads a Slice)."""
    if _channelwise(user, i, c):
        return "channelwise"
    if i != 0 or not _conv_ok(user):
        return None
    if int(user.attrs.get("group", 1)) == 1:
        return "input"
    return "depthwise" if _depthwise(user, c) else None


def _unpadded(graph: Graph, padded: Value, r: Value) -> Value:
    """``Slice(padded)`` on the channel axis back to ``r``'s channels, of ``r``'s type."""
    return graph.create_op("Slice", [padded], {"starts": [0], "ends": [r.shape[1]], "axes": [1], "steps": [1]},
                           result_types=[r.type], name=r.name + "_unpadded", after=padded.producer).results[0]


def _replace(graph: Graph, old: Op, padded: Value, c: int, channels: Callable[[Op], int]) -> None:
    """Route the readers of ``old``'s result to ``padded`` (its first ``c`` channels are the
    result), widening the convs that can take it, then erase ``old``."""
    r = old.results[0]
    name = r.name
    sliced: Value | None = None
    for user, i in list(r.uses):
        how = _absorbs(user, i, c)
        if how == "input":
            w = user.operands[1]
            user.set_operand(1, _const(graph, w, _pad_axis(w.data, 1, padded.shape[1]), w.type.quant))
            user.set_operand(0, padded)
        elif how == "depthwise":
            n = padded.shape[1]
            wide = _widened(graph, user, padded, n, n)
            _replace(graph, user, wide.results[0], user.results[0].shape[1], channels)
        elif how == "channelwise":
            _replace(graph, user, _carried(graph, user, i, padded).results[0], c, channels)
        else:
            sliced = sliced or _unpadded(graph, padded, r)
            user.set_operand(i, sliced)
    if is_output(r):
        sliced = sliced or _unpadded(graph, padded, r)
        r.replace_all_uses_with(sliced)        # (the output keeps its name)
    graph.erase_op(old)
    if sliced is not None and not graph.has_value(name):
        graph.rename(sliced, name)


def padded_convs(graph: Graph, channels: Callable[[Op], int]) -> list[Op]:
    """The group-1 convs of ``graph`` the pass widens: those ``channels`` gives more than their K."""
    return [op for op in graph.ops if _conv_ok(op) and int(op.attrs.get("group", 1)) == 1
            and int(channels(op)) > op.results[0].shape[1]]


@register_pass("pad-channels", options=PadChannelsOptions)
def pad_channels(graph: Graph, ctx: PassContext) -> bool:
    """Store the padded output channels a conv's kernel computes (zero weights), so that its
    readers work on whole vectors; readers that cannot take them read a channel Slice."""
    opts = pass_options(ctx, "pad-channels", PadChannelsOptions)
    changed = 0
    for op in padded_convs(graph, opts.channels):
        if op.graph is not graph:
            continue
        k, n = op.results[0].shape[1], int(opts.channels(op))
        wide = _widened(graph, op, op.operands[0], n, 1)
        _replace(graph, op, wide.results[0], k, opts.channels)
        changed += 1
    if changed:
        graph.remove_unused_consts()
        graph.toposort()
        if ctx is not None:
            ctx.log(f"pad-channels: {changed} convs store padded channels")
    return bool(changed)
