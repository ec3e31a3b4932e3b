"""Blocked summation for the float reductions of the NCHWc conv schedule (:func:`.schedules._nchwc`).

A conv's output is a dot product of K = C_in·kh·kw terms. Summed in one chain in float32 (unit
roundoff u = 2^-24), its error is bounded by (K-1)·u·Σ|x_i·w_i| (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., 2002, §3.1 and §4.2); summed in blocks of b terms, each block from
zero, and the block sums then added, the bound is (b-1 + K/b)·u·Σ|x_i·w_i| (Higham §4.2; Castaldo,
Whaley and Chronopoulos, "Reducing floating point error in dot product using the superblock family
of algorithms", SIAM J. Sci. Comput. 2008). ONNX Runtime's MLAS sgemm, the conv behind a 1x1 or
im2col conv, adds its K in strides of 256 into C (``MLAS_SGEMM_STRIDEK``): at K = 1152 (an
EfficientNet-B0 squeeze-excite or projection conv) one chain was 3-6x further from a float64
result than ONNX Runtime, and on a network that amplifies it (the squeeze-excite sigmoids of a
random-weight EfficientNet-B0 on a saturated photo) the logits differed from ONNX Runtime's by
2.5e-4 of their range (engineering log, 2026-11-29).

So the input-channel-block loop is split into blocks of at most :data:`BLOCK` terms
(``rfactor``): the partial-sum block fills a register tile from zero over one block of input
channels, kernel rows and columns; the conv block adds that tile to its accumulator tile once per
block: reg_n·b extra vector adds per BLOCK·reg_n·b multiply-adds, no measurable time. Integer
(exact) sums and reductions of at most BLOCK terms keep one chain.
"""
from __future__ import annotations

import math

from ..intrin import ACC_SCOPE
from . import threads

BLOCK = 256
"""Most terms a partial sum holds: MLAS's K stride, and >= sqrt(K) (the bound's minimum) up to K = 65536."""


def block_channels(blocks: int, per_block: int) -> int:
    """Input-channel blocks per partial sum: the largest divisor of ``blocks`` (the loop's extent)
    whose terms (times ``per_block``, the terms of one channel block) fit in :data:`BLOCK`; at
    least 1 (a single channel block of more than BLOCK terms is a partial sum alone)."""
    return max(d for d in range(1, blocks + 1) if blocks % d == 0 and (d * per_block <= BLOCK or d == 1))


def split_sum(sch, blk, outer: list, xo, red: list, inner: list, unroll_last_red: bool):
    """Blocked summation of NCHWc reduction block ``blk`` (loops ``outer`` (n, ko, y), ``xo``,
    ``red`` (input-channel blocks first), ``inner`` (xi, ki), in that order). Returns None where it
    does not apply (an integer sum, or one block), otherwise (the fused parallel loop, ``xo``, the
    block loop) of ``blk``, which now adds one partial-sum tile per block; the partial-sum
    block is computed at the block loop into a register tile, its own loops vectorized as the
    unblocked nest's are."""
    if not str(sch.get(blk).writes[0].source.dtype).startswith(("float", "bfloat")):
        return None
    ext = lambda lp: int(sch.get(lp).extent)  # noqa: E731
    per = math.prod(ext(lp) for lp in red[1:])
    blocks = ext(red[0])
    f = block_channels(blocks, per)
    if f == blocks:
        return None
    bo, bi = sch.split(red[0], [None, f])
    sch.reorder(*outer, xo, bo, bi, *red[1:], *inner)
    part = sch.rfactor(bo, 0)
    *outer_w, _, _, _, _ = sch.get_loops(blk)
    par = sch.fuse(*outer_w)
    threads.parallel(sch, par)
    _, xo_w, bo_w, _, _ = sch.get_loops(blk)
    sch.compute_at(part, bo_w, preserve_unit_loops=True)
    sch.set_scope(part, 0, ACC_SCOPE)
    loops = sch.get_loops(part)[3:]
    n = len(outer) + 3                       # (bo, *outer, x, ki), then (bi, *red[1:])
    spatial, reds = loops[:n], loops[n:]
    xi, ki = spatial[-2:]
    sch.reorder(*reds, xi, ki)
    sch.vectorize(ki)
    sch.unroll(xi)
    if unroll_last_red and ext(reds[-1]) <= 16:
        sch.unroll(reds[-1])
    init = sch.decompose_reduction(part, reds[0])
    sch.vectorize(sch.get_loops(init)[-1])
    return par, xo_w, bo_w
