"""One thread per output element for the CUDA kernels whose reduction is a few taps: depthwise
convolutions and pooling windows.

dlight's rules hand such a kernel (a reduction of 9 taps for a 3x3 depthwise conv, at every one
of n*c*oh*ow outputs) to ``GeneralReduction``, which binds the reduction to a thread block's
threads: one block per output element, each reducing 9 numbers across threads. On an H100
(2026-11-24) MobileNetV2's 3x3 depthwise convs took 18-28 ms each at batch 64 that way (a
64x144x56x56 layer: 29 M blocks), 0.2-0.36 ms at batch 1; the whole network 130 ms against
``torch.compile``'s 2.7.

:func:`schedule` writes the obvious kernel instead: the output block's loops fused and split over
``blockIdx.x`` x ``threadIdx.x`` (256 threads), the reduction block computed at the thread (its
accumulator in a register: ``local`` scope), its taps unrolled; every other block -- the padding
stage, the requantization or activation epilogue -- inlined into its neighbour. Each thread reads
its window from global memory (neighbouring threads read neighbouring columns, so the loads are
coalesced; the overlap between windows is served by L1).

It applies to a PrimFunc with exactly one reduction block whose reduction extent (the product of
its reduce loops) is at most :data:`MAX_TAPS` and that dlight cannot read as a GEMM; GEMMs (1x1
and grouped convs, gemms: dlight's Matmul or :mod:`.wmma`) and larger reductions (global
pools over a big plane) stay with dlight.
"""
from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import get_reduction_blocks
from tvm.target import Target

from .wmma import gemm_extents

MAX_TAPS = 64            # a 7x7 window is 49; a 1x1 conv's K or a global pool is left to dlight
THREADS = 256


def _reduce_extent(block) -> int | None:
    ext = [v.dom.extent for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce]
    if not all(isinstance(e, tirx.IntImm) for e in ext):
        return None
    return math.prod(int(e) for e in ext)


def schedule(func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc | None:
    """``func`` scheduled one thread per output element, or None when it is not a small-window
    reduction (then dlight's rules take it)."""
    if target.kind.name != "cuda" or not isinstance(func, tirx.PrimFunc):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(get_root_block(sch))
        red = get_reduction_blocks(sch, blocks)
        if not red or len(red) != 1:
            return None
        main = red[0]
        taps = _reduce_extent(sch.get(main))
        if taps is None or taps > MAX_TAPS:
            return None
    except Exception:  # noqa: BLE001 - not a single reduction dlight can read
        return None
    try:
        gemm = gemm_extents(func)     # asked only of small reductions: the GEMM analysis reindexes a copy
    except Exception:  # noqa: BLE001 - dlight's analysis raises on what is no GEMM
        gemm = None
    if gemm is not None:            # a GEMM (1x1 conv, gemm, grouped conv): dlight's Matmul / our WMMA rule
        return None
    try:
        writers = [b for b in blocks if not sch.get_consumers(b)]       # the blocks writing the output
        if len(writers) != 1:
            return None
        last = writers[0]
        # every block but the reduction and the output's writer: inlined (producers such as the
        # padding stage into their readers, epilogue stages into the output block)
        for b in blocks:
            if b.same_as(main) or b.same_as(last):
                continue
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 - not inlinable as a producer: try as a consumer
                sch.reverse_compute_inline(b)
        if last.same_as(main):
            # no epilogue (a max pool): the reduction would accumulate in the output buffer, a
            # read-modify-write of global memory per tap (nvcc kept 6 of a 3x3 window's 10 stores);
            # accumulate in a register and store once, as the epilogue case does
            last = sch.cache_write(main, 0, "local")
        loops = sch.get_loops(last)
        bx, tx = sch.split(sch.fuse(*loops), factors=[None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.compute_at(main, tx)
        sch.set_scope(main, 0, "local")
        for loop in sch.get_loops(main)[2:]:
            sch.unroll(loop)
    except Exception:  # noqa: BLE001 - a shape the primitives refuse: not for this rule (as dlight)
        return None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)
