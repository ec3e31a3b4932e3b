"""``split-conv-bands``: a conv whose taps read padding on many outputs, computed region by region
with only the taps each region needs.

Along one spatial axis (input size ``H``, output size ``OH``, stride ``s``, dilation ``d``, pad
before ``p0``, ``R`` taps), output row ``y`` reads input rows ``y·s − p0 + r·d``; its *live* taps
are the ``r`` whose row lies in ``[0, H)``, a contiguous range ``[r0(y), r1(y)]``. Consecutive
output rows with the same range form a *band*. On a band every live tap reads real rows for every
output and every other tap reads padding for every output, so on the band::

    Conv(x, W; pads p)[.., ya:yb, ..] = Conv(x[.., i0:i1, ..], W[.., r0:r1+1, ..]; pads 0)

with ``i0 = ya·s − p0 + r0·d`` and ``i1 = (yb−1)·s − p0 + r1·d + 1`` (the input rows that band
reads); bias and activation act per output element, so a FusedConv splits the same way. The
regions are the products of the row and column bands; the op becomes one conv per region on a
Slice of its input, joined by a Concat along the width per row band and one along the height.
(`crop-dead-taps` handles the one-region case in place.)

Dilated "atrous" convs need this: DeepLabV3's ASPP applies 3x3 convs with dilation 12 and 24 to a
32x32 map, where 44 % and 75 % of the multiply-adds read padding; ONNX Runtime's NCHWc conv
skips them per output row. It pays only where the work removed outweighs the copies added: the
pass splits when the multiply-adds saved exceed :data:`MACS_PER_BYTE` times the bytes the split
adds: each region's input window (its Slice), the output twice (the Concat), and every region's
own weights beyond the original's (a 3x3 conv in 3x3 regions reads 49 taps of weights, not 9). An
ordinary 3x3 conv with pads 1 saves its border taps only (9 % on ResNet-50's 14x14 maps, for 5.4x
its weight bytes) and is left as it is; DeepLabV3's dilation-12 conv saves 0.99 G multiply-adds for
66 MB (15 per byte), its dilation-24 conv 1.7 G for 42 MB.

Applies to ``Conv`` and ``FusedConv`` with a constant float weight and no residual operand, after
``fuse-act`` (so the BatchNorms and activations are already in the convs). Declined (unchanged):
a band with no live tap (its outputs would be the bias alone), or savings below the copy cost.

Before (``macs_per_byte = 0``: this tiny conv would not pay for its copies)::

    graph @g(%x: tensor<1x2x4x3xf32>) {
      %w = const dense<0.5> : tensor<1x2x3x1xf32>
      %y = Conv(%x, %w) {dilations = [3, 1], group = 1, pads = [3, 0, 3, 0], strides = [1, 1]} : tensor<1x1x4x3xf32>
      %z = Relu(%y) : tensor<1x1x4x3xf32>
      return %z
    }

After (output row 0 reads taps 1-2, rows 1-2 tap 1 only, row 3 taps 0-1)::

    graph @g(%x: tensor<1x2x4x3xf32>) {
      %w_r0c0 = const dense<0.5> : tensor<1x2x2x1xf32>
      %w_r1c0 = const dense<0.5> : tensor<1x2x1x1xf32>
      %w_r2c0 = const dense<0.5> : tensor<1x2x2x1xf32>
      %y_r0c0 = Conv(%x, %w_r0c0) {dilations = [3, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x1x3xf32>
      %y_r1c0_in = Slice(%x) {axes = [2, 3], ends = [3, 3], starts = [1, 0], steps = [1, 1]} : tensor<1x2x2x3xf32>
      %y_r1c0 = Conv(%y_r1c0_in, %w_r1c0) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x2x3xf32>
      %y_r2c0 = Conv(%x, %w_r2c0) {dilations = [3, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x1x3xf32>
      %y_bands_out = Concat(%y_r0c0, %y_r1c0, %y_r2c0) {axis = 2} : tensor<1x1x4x3xf32>
      %z = Relu(%y_bands_out) : tensor<1x1x4x3xf32>
      return %z
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Op as IROp
from ._common import CONVS, is_output, pass_options
from .crop_dead_taps import conv_window, row_taps
from .manager import PassContext, register_pass

MACS_PER_BYTE = 10
"""Multiply-adds a fp32 conv kernel does in the time a copy moves one byte: ~100 GMAC/s against
~10 GB/s on two AVX-512 cores (ResNet-50's 4.1 GMAC in ~40 ms; a Slice or Concat kernel streams
~10 GB/s). A roofline balance, not a model's: the split pays when the multiply-adds it saves take
longer than the copies it adds."""


def bands(size: int, out: int, kernel: int, stride: int, dilation: int, pad: int) -> list[tuple[int, int, int, int]] | None:
    """[(ya, yb, r0, r1)]: maximal runs of output rows [ya, yb) whose live taps are [r0, r1], in
    order; None if some output row has no live tap."""
    out_bands: list[tuple[int, int, int, int]] = []
    for y, taps in enumerate(row_taps(size, out, kernel, stride, dilation, pad)):
        if taps is None:
            return None
        r0, r1 = taps
        if out_bands and out_bands[-1][1] == y and out_bands[-1][2:] == (r0, r1):
            out_bands[-1] = (out_bands[-1][0], y + 1, r0, r1)
        else:
            out_bands.append((y, y + 1, r0, r1))
    return out_bands


@dataclass(frozen=True)
class SplitConvBandsOptions:
    macs_per_byte: float = MACS_PER_BYTE     # 0: split wherever a tap is dead somewhere


def input_span(band: tuple[int, int, int, int], stride: int, dilation: int, pad: int) -> tuple[int, int]:
    """[start, end) of the input rows that ``band`` (ya, yb, r0, r1) reads along its axis."""
    ya, yb, r0, r1 = band
    return ya * stride - pad + r0 * dilation, (yb - 1) * stride - pad + r1 * dilation + 1


def split_plan(op: IROp, macs_per_byte: float = MACS_PER_BYTE) -> tuple[list, list] | str:
    """(row bands, column bands) of ``op`` when splitting pays, or why not."""
    x, w = op.operands[0], op.operands[1]
    if is_output(op.result):
        return "its result is a graph output"
    if len(op.operands) > 3:
        return "a residual operand"
    win = conv_window(op)
    if isinstance(win, str):
        return win
    k, s, d, p = win
    axes = [bands(x.type.shape[2 + i], op.result.type.shape[2 + i], k[i], s[i], d[i], p[i]) for i in range(2)]
    if any(b is None for b in axes):
        return "an output row reads padding only"
    rows, cols = axes
    if len(rows) == 1 and len(cols) == 1:
        return "one region (crop-dead-taps' case)"
    per_tap = w.type.shape[0] * w.type.shape[1] * x.type.shape[0]
    full = per_tap * k[0] * k[1] * op.result.type.shape[2] * op.result.type.shape[3]
    kept = sum(per_tap * (yb - ya) * (r1 - r0 + 1) * (xb - xa) * (c1 - c0 + 1)
               for ya, yb, r0, r1 in rows for xa, xb, c0, c1 in cols)
    item = np.dtype(x.type.dtype).itemsize
    spans = [[input_span(b, s[i], d[i], p[i]) for b in axis] for i, axis in enumerate((rows, cols))]
    moved = item * x.type.shape[0] * x.type.shape[1] * sum((re - rs) * (ce - cs) for rs, re in spans[0]
                                                           for cs, ce in spans[1])
    moved += 2 * item * math.prod(op.result.type.shape)
    taps = sum((r1 - r0 + 1) * (c1 - c0 + 1) for _, _, r0, r1 in rows for _, _, c0, c1 in cols)
    moved += w.data.itemsize * w.type.shape[0] * w.type.shape[1] * (taps - k[0] * k[1])   # each region's weights
    if full - kept <= macs_per_byte * moved:
        return f"saves {full - kept} multiply-adds for {moved} bytes of copies"
    return rows, cols


def _split(graph: Graph, op: IROp, rows: list, cols: list) -> None:
    _, s, d, p = conv_window(op)
    x, w, rest = op.operands[0], op.operands[1], list(op.operands[2:])
    name = op.result.name
    strips = []
    for i, (_, _, r0, r1) in enumerate(rows):
        parts = []
        for j, (_, _, c0, c1) in enumerate(cols):
            tag = f"{name}_r{i}c{j}"
            (r_start, r_end), (c_start, c_end) = (input_span(rows[i], s[0], d[0], p[0]),
                                                  input_span(cols[j], s[1], d[1], p[1]))
            starts, ends = [r_start, c_start], [r_end, c_end]
            xs = x if starts == [0, 0] and ends == list(x.type.shape[2:]) else graph.create_op(
                "Slice", [x], {"starts": starts, "ends": ends, "axes": [2, 3], "steps": [1, 1]},
                name=tag + "_in", result_names=[tag + "_in"], before=op).result
            wk = graph.add_const(np.ascontiguousarray(w.data[:, :, r0:r1 + 1, c0:c1 + 1]), f"{w.name}_r{i}c{j}")
            attrs = dict(op.attrs, pads=[0, 0, 0, 0],
                         dilations=[d[0] if r1 > r0 else 1, d[1] if c1 > c0 else 1])
            if attrs.get("kernel_shape"):
                attrs["kernel_shape"] = [r1 - r0 + 1, c1 - c0 + 1]
            conv = graph.create_op(op.kind, [xs, wk, *rest], attrs, name=tag, result_names=[tag], before=op)
            parts.append(conv.result)
        strips.append(parts[0] if len(parts) == 1 else
                      graph.create_op("Concat", parts, {"axis": 3}, name=f"{name}_r{i}",
                                      result_names=[f"{name}_r{i}"], before=op).result)
    joined = strips[0] if len(strips) == 1 else graph.create_op(
        "Concat", strips, {"axis": 2}, name=name + "_bands", before=op).result
    op.result.replace_all_uses_with(joined)
    graph.erase_op(op)


@register_pass("split-conv-bands", options=SplitConvBandsOptions)
def split_conv_bands(graph: Graph, ctx: PassContext) -> bool:
    """Compute a Conv/FusedConv whose taps read padding on many outputs region by region, each
    region with only its live taps (Slice -> Conv -> Concat), where the saved multiply-adds
    outweigh the copies."""
    opts = pass_options(ctx, "split-conv-bands", SplitConvBandsOptions)
    changed = False
    for op in list(graph.ops):
        if op.kind not in CONVS or op.graph is not graph:
            continue
        plan = split_plan(op, opts.macs_per_byte)
        if isinstance(plan, str):
            continue
        if ctx is not None:
            ctx.log(f"split-conv-bands: {op.describe()} into {len(plan[0])}x{len(plan[1])} regions")
        _split(graph, op, *plan)
        changed = True
    if changed:
        graph.remove_unused_consts()
    return changed
