"""``crop-dead-taps``: drop the kernel rows and columns of a convolution that only ever read padding.

A tap (kernel row ``r`` on a spatial axis of input size ``H``, stride ``s``, dilation ``d``, pads
``(p0, p1)``, output size ``OH``) reads input row ``y·s − p0 + r·d`` for output row ``y``. If that
row is outside ``[0, H)`` for every ``y`` in ``[0, OH)``, the tap multiplies zeros on every output:
it contributes nothing. Dilated "atrous" convs produce such taps. DeepLabV3's ASPP applies 3x3
convs with dilation 12, 24 and 36 to a 32x32 map; at 36, the outer rows and columns read padding
for every output, and the conv is a 1x1 conv in a 9x costlier form (and a 104x104 padded copy).
The live taps along an axis are a contiguous range ``[r0, r1]`` (the read rows move monotonically
with ``r``), and::

    Conv(x, W; pads = (p0, p1), dilation d) = Conv(x, W[.., r0:r1+1]; pads = (p0 − r0·d, p1 − (R−1−r1)·d))

on each axis: output row ``y`` reads the same input rows with the same weights, and the output
size ``⌊(H + p0 + p1 − d·(R−1) − 1)/s⌋ + 1`` is unchanged, because both the pads and the kernel
extent shrink by the same amount. An axis whose new kernel size is 1 gets dilation 1 (the same
sum). Applies to ``Conv`` and ``FusedConv`` with a constant weight (any group, stride or
dilation) before quantization. It declines when every tap is dead, or when a new pad would be
negative (a stride that skips the live rows), so the IR stays as it is. Padding with zeros is what
Conv does, so it is exact.

Before::

    graph @g(%x: tensor<1x2x4x4xf32>) {
      %w = const dense<0.5> : tensor<3x2x3x3xf32>
      %y = Conv(%x, %w) {dilations = [6, 6], group = 1, pads = [6, 6, 6, 6], strides = [1, 1]} : tensor<1x3x4x4xf32>
      return %y
    }

After::

    graph @g(%x: tensor<1x2x4x4xf32>) {
      %w_cropped = const dense<0.5> : tensor<3x2x1x1xf32>
      %y = Conv(%x, %w_cropped) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x3x4x4xf32>
      return %y
    }
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Op as IROp
from ..ir.ops import full_attrs, infer_types
from ._common import CONVS
from .manager import PassContext, register_pass



def row_taps(size: int, out: int, kernel: int, stride: int, dilation: int, pad_begin: int) -> list[tuple[int, int] | None]:
    """For each output index along one axis, the first and last kernel index that reads an input
    element (not padding) there, or None if every tap reads padding (the live taps of one output
    are contiguous: the row read moves monotonically with the tap). Shared with
    :mod:`.split_conv_bands`."""
    out_taps: list[tuple[int, int] | None] = []
    for y in range(out):
        rows = y * stride - pad_begin + np.arange(kernel) * dilation
        live = np.nonzero((rows >= 0) & (rows < size))[0]
        out_taps.append((int(live[0]), int(live[-1])) if live.size else None)
    return out_taps


def live_taps(size: int, out: int, kernel: int, stride: int, dilation: int, pad_begin: int) -> tuple[int, int] | None:
    """The first and last kernel index along one axis that reads an input element (not padding)
    for some output index; None if none does."""
    live = [t for t in row_taps(size, out, kernel, stride, dilation, pad_begin) if t is not None]
    return (min(t[0] for t in live), max(t[1] for t in live)) if live else None


def conv_window(op: IROp) -> tuple[tuple[int, int], list[int], list[int], list[int]] | str:
    """(kernel size, strides, dilations, pads) of a 2-D Conv/FusedConv with a constant float
    weight, or why it is not one (shared with :mod:`.split_conv_bands`)."""
    x, w = op.operands[0], op.operands[1]
    if not w.is_const or w.data.dtype.kind != "f" or x.type.rank != 4:
        return "not a 2-D conv with a constant float weight"
    a = full_attrs(op.kind, **op.attrs)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "", None):
        return f"auto_pad {a['auto_pad']}"
    return (tuple(w.type.shape[2:]), list(a["strides"] or [1, 1]), list(a["dilations"] or [1, 1]),
            list(a["pads"] or [0, 0, 0, 0]))


def crop_plan(op: IROp) -> tuple[np.ndarray, dict] | str:
    """The cropped weight and the op's new attributes, or why not (including "nothing to
    crop")."""
    win = conv_window(op)
    if isinstance(win, str):
        return win
    x, w = op.operands[0], op.operands[1]
    k, strides, dils, pads = win
    slices, new_pads, new_dils = [], list(pads), list(dils)
    for i in range(2):
        live = live_taps(x.type.shape[2 + i], op.result.type.shape[2 + i], k[i], strides[i], dils[i], pads[i])
        if live is None:
            return "every tap reads only padding"
        r0, r1 = live
        new_pads[i] = pads[i] - r0 * dils[i]
        new_pads[i + 2] = pads[i + 2] - (k[i] - 1 - r1) * dils[i]
        if new_pads[i] < 0 or new_pads[i + 2] < 0:
            return f"cropping axis {i} would need negative pads {new_pads}"
        if r1 == r0:
            new_dils[i] = 1
        slices.append(slice(r0, r1 + 1))
    if all(s.start == 0 and s.stop == k[i] for i, s in enumerate(slices)):
        return "no dead taps"
    attrs = dict(op.attrs, pads=new_pads, dilations=new_dils)
    if "kernel_shape" in attrs and attrs["kernel_shape"]:
        attrs["kernel_shape"] = [s.stop - s.start for s in slices]
    cropped = np.ascontiguousarray(w.data[(slice(None), slice(None), *slices)])
    data = [None, cropped] + [v.data for v in op.operands[2:]]
    types = [v.type for v in op.operands]
    try:
        (t,) = infer_types(op.kind, types[:1] + [w.type.with_shape(cropped.shape)] + types[2:], attrs, data)
    except Exception as e:   # noqa: BLE001 - the new attributes do not type: decline
        return f"cropped attributes do not type: {e}"
    if t.shape != op.result.type.shape:
        return f"output shape {t.shape} != {op.result.type.shape}"
    return cropped, attrs


@register_pass("crop-dead-taps")
def crop_dead_taps(graph: Graph, ctx: PassContext) -> bool:
    """Drop the kernel rows/columns of Conv/FusedConv that read only padding for every output
    (dilated convs on small maps), adjusting pads so that every output is the same sum."""
    changed = False
    for op in list(graph.ops):
        if op.kind not in CONVS or op.graph is not graph:
            continue
        plan = crop_plan(op)
        if isinstance(plan, str):
            continue
        cropped, attrs = plan
        w = op.operands[1]
        op.set_operand(1, graph.add_const(cropped, w.name + "_cropped"))
        op.attrs = attrs
        if ctx is not None:
            ctx.log(f"crop-dead-taps: {op.describe()} kernel {list(w.type.shape[2:])} -> {list(cropped.shape[2:])}")
        changed = True
    if changed:
        graph.remove_unused_consts()
    return changed
