"""Hand-written CPU schedules (``s_tir.Schedule``; x86, and arm with 4-lane vectors) for the kernels of :mod:`..kernels`.

The kernel builder names the schedule (``ctx.schedule(kind, **params)``) and its blocks
(``pad``, ``conv``, ``pool``, ``dense``, ``matmul``, ``rmax``/``rsum``/``rmean``/``rvar``/``reduce``
and the kernel's output ``out``), so every rule knows the loop nest it gets:

* ``conv2d`` / ``depthwise`` / ``conv_transpose`` / ``pool``: NCHW{b}c direct convolution in the
  style of TVM's x86 ``conv2d_NCHWc``: the loop nest is (n·ko·y) parallel, then output-width
  tiles of ``reg_n`` columns; inside a tile the reduction runs over (input-channel blocks, kernel
  rows, kernel columns, input channels) with ``reg_n × b`` accumulators in registers
  (``cache_write`` to :data:`..intrin.ACC_SCOPE`: a stack tile, not a workspace call per
  tile), the ``b`` output channels being one vector. The epilogue (bias, residual, activation,
  cast) is inlined into the register write-back.
* ``conv2d_winograd``: the int8 3x3 Winograd conv, one parallel loop over output tile rows or
  output-channel blocks holding one transform, 16 tensorized gemms and the output transform
  (:func:`conv2d_winograd`).
* ``dense`` / ``dense_dot`` / ``dense_amx``: gemms, packed weights, row tiles of ``mb`` rows by column
  blocks, the smaller operand re-read (:func:`_tiles_order`); int8 on dot products or AMX tiles.
* ``matmul``: batched, rows parallel, columns vectorized. ``row_stats``: dynamic int8's row ranges.
  ``rowwise``: reductions over trailing axes per row. ``generic``: parallel outer, vectorized inner.

A stage ahead of a parallel main loop (a packing stage, the other Winograd transform) shares that
loop's thread-pool launch, split across the threads (:func:`_one_launch`); a kernel runs on the
thread pool only where its estimated time pays for the launch (:mod:`.threads`).
After TVM's lowering the threads claim each parallel loop's iterations in chunks, the stage ahead
counting its chunks instead of TVM's barrier (:mod:`.work_claiming`). Every rule falls back to
``generic`` if a primitive refuses (a shape the rule did not foresee).
"""
from __future__ import annotations

import logging
import math
import os

import tvm
from tvm import s_tir

from ..intrin import ACC_SCOPE
from . import threads, write_back
from .blocked_sum import split_sum

log = logging.getLogger(__name__)
STRICT = os.environ.get("QC_STRICT_SCHEDULE") == "1"
MIN_PARALLEL = 2048            # don't spawn threads for kernels smaller than this many outputs


def apply(func: tvm.tirx.PrimFunc, kind: str, params: dict, vw: int, cpu: str | None = None) -> tvm.tirx.PrimFunc:
    """Schedule ``func`` with rule ``kind`` for LLVM CPU ``cpu`` (its thread rule:
    :func:`.threads.thread_rule`); returns the scheduled PrimFunc marked as such."""
    rule = RULES.get(kind, generic)
    sch = s_tir.Schedule(func)
    with threads.thread_rule(sch, cpu):
        try:
            rule(sch, vw=vw, **params)
        except Exception as e:  # noqa: BLE001 - any refusal falls back to the generic rule
            if STRICT and rule is not generic:
                raise
            log.debug("schedule rule %s failed (%s); using the generic rule", kind, e)
            sch = s_tir.Schedule(func)
            try:
                generic(sch, vw=vw)
            except Exception:  # noqa: BLE001
                if STRICT:
                    raise
                sch = s_tir.Schedule(func)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


# ---- helpers ---------------------------------------------------------------------------------
def _block(sch, name):
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001
        return None


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _is_reduction(sch, blk) -> bool:
    return any(int(iv.iter_type) == 2 for iv in sch.get(blk).iter_vars)


def _spatial_nest(sch, blk, vw: int, parallel: bool = True):
    """Fuse the loops of a spatial block, vectorize the innermost run of ``vw`` and parallelize the rest."""
    loops = sch.get_loops(blk)
    if not loops:
        return
    total = math.prod(_extent(sch, lp) for lp in loops)
    last = _extent(sch, loops[-1])
    if last % vw == 0 or last <= 4 * vw and last >= vw // 2:
        inner = loops[-1]
        if last % vw == 0 and last > vw:
            outer_last, inner = sch.split(loops[-1], [None, vw])
            outer = list(loops[:-1]) + [outer_last]
        else:
            outer = list(loops[:-1])
        sch.vectorize(inner)
    else:
        outer = list(loops)
    if parallel and outer and total >= MIN_PARALLEL:
        f = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        threads.parallel(sch, f)


def _inline_spatial(sch, keep=()):
    """compute_inline every non-output spatial block (e.g. an unpadded pack stage) except those in
    ``keep`` and the "hoist*" stages: values a kernel computes once, smaller than its output (a
    broadcast operand), that inlining would recompute for every output element."""
    for blk in sch.get_child_blocks(sch.get_sblock("root")) if _block(sch, "root") else []:
        name = sch.get(blk).name_hint
        if name in keep or name.startswith("hoist") or _is_reduction(sch, blk):
            continue
        try:
            sch.compute_inline(blk)
        except Exception:  # noqa: BLE001 - the output block, or one read twice: leave it
            pass


def _vectorize_inner(sch, blk, depth: int):
    """Vectorize the innermost loop of ``blk`` below its first ``depth`` loops (the ones it was
    computed at), if it has one with more than one iteration."""
    loops = sch.get_loops(blk)[depth:]
    if loops and _extent(sch, loops[-1]) > 1:
        sch.vectorize(loops[-1])


def _output_block(sch, candidates):
    for name in candidates:
        b = _block(sch, name)
        if b is not None:
            return b, name
    return None, None


# ---- NCHWc register-blocked reductions ----------------------------------------------------------
def _nchwc(sch, name: str, vw: int, reg_n: int, pad: bool, n_red: int, unroll_last_red: bool):
    """Shared by conv2d, depthwise, conv_transpose and pool: block ``name`` has loops
    (n, ko, y, x, ki, *red) with ``n_red`` reduction loops."""
    blk = sch.get_sblock(name)
    loops = sch.get_loops(blk)
    n, ko, y, x, ki = loops[:5]
    red = loops[5:5 + n_red]
    xo, xi = sch.split(x, [None, reg_n])
    sch.reorder(n, ko, y, xo, *red, xi, ki)
    blocked = split_sum(sch, blk, [n, ko, y], xo, red, [xi, ki], unroll_last_red)   # long float sums
    if blocked is not None:
        par, xo, first = blocked
        xi, ki = sch.get_loops(blk)[-2:]
    else:
        if unroll_last_red and _extent(sch, red[-1]) <= 16:
            sch.unroll(red[-1])
        par, first = sch.fuse(n, ko, y), red[0]
        threads.parallel(sch, par)
    acc = sch.cache_write(blk, 0, ACC_SCOPE)
    sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
    _write_back(sch, vw, par)
    _vectorize_inner(sch, acc, 2)
    sch.vectorize(ki)
    sch.unroll(xi)
    init = sch.decompose_reduction(blk, first)
    sch.vectorize(sch.get_loops(init)[-1])
    if pad:
        _pack_nest(sch, vw, par)


def _parallel_stage(sch, blk, par):
    """A packing stage ``blk`` (at the root, ahead of the kernel's main loop ``par``) on the
    threads: where ``par`` runs on the thread pool the stage joins its launch, its leading 3 loops
    split across the threads; otherwise they run parallel only when the stage alone pays for a
    thread launch (:func:`_split_ahead`). Every top-level parallel loop of a kernel is a launch of
    its own, whose idle workers must be woken again: a 32x16x16 int16 pack (~2 us) in a launch of
    its own before a parallel conv cost mnistnet int8 77.0 against 72.2 us with it serial (2
    threads, Zen 3). Returns the stage's innermost loop."""
    launch = _join_launch(sch, par, blk)
    loops = sch.get_loops(blk)
    _split_ahead(sch, launch, blk, loops[1:4] if launch is not None else loops[:3])
    return sch.get_loops(blk)[-1]


def _join_launch(sch, par, blk):
    """Where the main loop ``par`` runs on the thread pool: a unit loop around it, the launch
    :func:`_one_launch` annotates, with stage ``blk`` (every iteration of ``par`` needs all of it)
    computed under it ahead of ``par``; returns that loop. Otherwise None, ``blk`` left alone."""
    if int(sch.get(par).kind) != int(tvm.tirx.ForKind.PARALLEL):
        return None
    launch = sch.add_unit_loop(par)
    sch.compute_at(blk, launch, preserve_unit_loops=True)
    return launch


def _split_ahead(sch, launch, blk, loops):
    """Stage ``blk`` ahead of the main loop, over its leading ``loops`` (fused): split across the
    main loop's ``launch`` (:func:`_one_launch`) where there is one, else parallel where the stage
    alone pays for a launch (:func:`_pays_alone`), else serial."""
    if launch is None and not _pays_alone(sch, sch.get_loops(blk)):
        return
    lead = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if launch is not None:
        _one_launch(sch, launch, lead)
    else:
        threads.parallel(sch, lead)


def _pays_alone(sch, loops) -> bool:
    """A spatial stage whose elements at ELEM_NS pay for a thread launch of their own."""
    return threads.pays_alone(math.prod(_extent(sch, lp) for lp in loops))


def _write_back(sch, vw, at=None):
    """The epilogue stage "out" (if any) joins the accumulator's write-back (:func:`.write_back.join`),
    or, laid out so that it cannot, gets a parallel, vectorized nest of its own."""
    out = _block(sch, "out")
    if out is not None and not write_back.join(sch, out, at):
        _spatial_nest(sch, out, vw)


def conv2d(sch, vw, reg_n, pad):
    _nchwc(sch, "conv", vw, reg_n, pad, n_red=4, unroll_last_red=True)


def depthwise(sch, vw, reg_n, pad):
    _nchwc(sch, "conv", vw, reg_n, pad, n_red=2, unroll_last_red=False)


def conv_transpose(sch, vw, reg_n, pad):
    _nchwc(sch, "conv", vw, reg_n, pad, n_red=3, unroll_last_red=False)


def pool(sch, vw, reg_n, pad):
    """A large pooling window (a global pool) reduces over (rh, rw) fused into one loop: LLVM fully
    unrolls a constant 10x10 or 20x20 nest of vector adds (a global average pool of rapidocr-det
    was 10 KB of code), not one loop of 100-400 iterations. Small windows (3x3) keep the nest, whose
    index arithmetic stays free of the fused loop's divisions."""
    blk = sch.get_sblock("pool")
    red = sch.get_loops(blk)[5:7]
    if len(red) == 2 and _extent(sch, red[0]) * _extent(sch, red[1]) > 32:
        sch.fuse(*red)
        _nchwc(sch, "pool", vw, 1, False, n_red=1, unroll_last_red=False)
        return
    _nchwc(sch, "pool", vw, 1, False, n_red=2, unroll_last_red=False)


def row_stats(sch, vw):
    """DynamicQuantParams: the range reductions ("xpmin"/"xpmax": rows x L lanes, reduced over
    K / L), lanes innermost and vectorized; then the [s, 1/s, z] rows ("out"), serial."""
    for name in ("xpmin", "xpmax"):
        b = sch.get_sblock(name)
        i, l, *red = sch.get_loops(b)
        sch.reorder(i, *red, l)
        sch.vectorize(l)
        init = sch.decompose_reduction(b, red[0])
        sch.vectorize(sch.get_loops(init)[-1])
    _spatial_nest(sch, sch.get_sblock("out"), vw, parallel=False)


def _tiles_order(io, no, rows: int, cols: int):
    """A gemm's tile loops, outer first: the operand read again on each outer iteration is the
    smaller one. M < N (a transformer's 128 tokens by 768..3072 columns): column blocks outer, each
    weight strip read once (row tiles outer read BERT-base's 85 MB of int8 weights 16 times a call)."""
    return (no, io) if rows < cols else (io, no)


def dense(sch, vw, mb, unroll_last=False):
    """Block "dense" has loops (i, no, ni, *reductions): one, or (block, byte, nibble) of the 4-bit
    weights (:mod:`..kernels.nbits`, ``unroll_last``: the nibble loop unrolled, one load for both)."""
    blk = sch.get_sblock("dense")
    i, no, ni, *red = sch.get_loops(blk)
    rk = red[0]
    rows, cols = _extent(sch, i), _extent(sch, no) * _extent(sch, ni)
    io, ii = sch.split(i, [None, mb])
    a, b = _tiles_order(io, no, rows, cols)
    sch.reorder(a, b, *red, ii, ni)
    par = sch.fuse(a, b)
    if _extent(sch, par) > 1:
        threads.parallel(sch, par)
    acc = sch.cache_write(blk, 0, ACC_SCOPE)
    sch.reverse_compute_at(acc, par, preserve_unit_loops=True)
    _write_back(sch, vw)
    _vectorize_inner(sch, acc, 1)
    sch.vectorize(ni)
    sch.unroll(ii)
    if unroll_last and len(red) > 1:
        sch.unroll(red[-1])
    init = sch.decompose_reduction(blk, rk)
    sch.vectorize(sch.get_loops(init)[-1])


def conv2d_dot(sch, vw, reg_n, pad, lanes, intrin, span=False):
    """int8 conv on a dot-product intrinsic (:mod:`..kernels.qdot`): block "conv" has loops
    (n, ko, y, x, ki, icb, rh, rw, ic, iq); the loop nest is that of :func:`_nchwc` with the output
    channels split into registers of ``lanes`` and the (lanes x iq) tile tensorized.

    ``span`` (ARM indexed sdot, :func:`..arm.intrin.register_lane`): the intrinsic also covers
    the ``ic`` groups of the input-channel block, ``(ic x lanes x iq)``, so ic moves inside the
    register tile: one load of A per output column and input-channel block, reused by all the
    tile's output-channel registers through the sdot lane index."""
    blk = sch.get_sblock("conv")
    n, ko, y, x, ki, icb, rh, rw, ic, iq = sch.get_loops(blk)
    xo, xi = sch.split(x, [None, reg_n])
    kio, kil = sch.split(ki, [None, lanes])
    if span:
        sch.reorder(n, ko, y, xo, icb, rh, rw, xi, kio, ic, kil, iq)
    else:
        sch.reorder(n, ko, y, xo, icb, rh, rw, ic, xi, kio, kil, iq)
    par = sch.fuse(n, ko, y)
    threads.parallel(sch, par)
    if pad:
        _pack_nest(sch, vw, par)             # before tensorize: compute_at needs the plain consumer
    acc = sch.cache_write(blk, 0, ACC_SCOPE)
    sch.reverse_compute_at(acc, xo, preserve_unit_loops=True)
    _write_back(sch, vw, par)
    _vectorize_inner(sch, acc, 2)
    sch.unroll(xi)
    sch.unroll(kio)          # ic stays a loop: its body is reg_n x kio dot products already, and
    init = sch.decompose_reduction(blk, icb)    # unrolling it (<= 8) only multiplied the code
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ic if span else kil, intrin)


def conv2d_winograd(sch, vw, reg_n, lanes, intrin, by_channel=False):
    """int8 3x3 conv by Winograd F(2x2, 3x3) (:mod:`.qwinograd`): one parallel loop, over
    output tile rows or (``by_channel``, where the transformed weights outnumber the transformed
    input: K > tiles) over blocks of output channels. Inside it the transform the loop splits (the
    input's "wino_in" for tile rows, the weights' "wino_w" for channel blocks), the 16 gemms
    ("wgemm", loops (n, ty, ε, ko, tx, ki, c2, iq): a register tile of ``reg_n`` tiles x ``ki``
    channels, the (lanes x iq) step tensorized) and the output transform with the requantization
    ("out", the 2x2 outputs of a tile unrolled). The other transform, the smaller one, runs before
    the loop: every iteration needs all of it. Where the kernel runs on the thread pool the two
    loops share one launch (:func:`_one_launch`): the threads split that transform, wait for each
    other, and go on to their part of the main loop. Both transforms unroll their 16 positions so
    that the window's loads are shared, and vectorize the contiguous channels."""
    out = sch.get_sblock("out")
    n, cob, y, x, *cb = sch.get_loops(out)         # NCHW{b}c (NCHW: a graph output)
    yo, ya = sch.split(y, [None, 2])
    xo, xb = sch.split(x, [None, 2])
    if by_channel and cb:
        sch.reorder(n, cob, yo, xo, ya, xb, *cb)
        par = sch.fuse(n, cob)
    else:
        by_channel = False
        sch.reorder(n, yo, cob, xo, ya, xb, *cb)
        par = sch.fuse(n, yo)
    threads.parallel(sch, par)
    sch.unroll(ya)
    sch.unroll(xb)
    if cb:
        sch.vectorize(cb[0])

    blk = sch.get_sblock("wgemm")
    sch.compute_at(blk, par, preserve_unit_loops=True)
    eps, ko, tx, ki, c2, iq = sch.get_loops(blk)[-6:]
    txo, txi = sch.split(tx, [None, reg_n])
    kio, kil = sch.split(ki, [None, lanes])
    sch.reorder(eps, ko, txo, c2, txi, kio, kil, iq)

    vin, wt = sch.get_sblock("wino_in"), sch.get_sblock("wino_w")
    inside, ahead = (wt, vin) if by_channel else (vin, wt)
    sch.compute_at(inside, par, preserve_unit_loops=True)
    launch = _join_launch(sch, par, ahead)
    eps_v, tx_v, c_v = sch.get_loops(vin)[-3:]
    cv = _extent(sch, c_v)
    vl = 16 if cv % 16 == 0 else 8 if cv % 8 == 0 else 1
    co_v, ci_v = sch.split(c_v, [None, vl])
    sch.reorder(tx_v, co_v, eps_v, ci_v)
    sch.unroll(eps_v)
    if vl > 1:
        sch.vectorize(ci_v)
    if by_channel:                                 # (n, ty, tx) of the input transform, then (co, ε, ci)
        _split_ahead(sch, launch, vin, sch.get_loops(vin)[-6:-3])

    acc = sch.cache_write(blk, 0, ACC_SCOPE)
    sch.reverse_compute_at(acc, txo, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(acc)[-1])
    sch.unroll(txi)
    sch.unroll(kio)
    init = sch.decompose_reduction(blk, c2)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(kil, intrin)

    e_w, ko_w, c2_w, ki_w, iq_w = sch.get_loops(wt)[-5:]     # the weight transform's
    sch.reorder(ko_w, c2_w, e_w, ki_w, iq_w)
    sch.unroll(e_w)
    sch.vectorize(sch.fuse(ki_w, iq_w))
    outer = sch.fuse(ko_w, c2_w)
    if not by_channel:
        _split_ahead(sch, launch, wt, [outer])


def _one_launch(sch, launch, before):
    """Loop ``before`` (a stage every iteration of the kernel's parallel loop needs whole, placed
    under the unit loop ``launch`` ahead of that loop) runs split across the same thread-pool launch
    as the loop: ``launch`` becomes TVM's ``parallel_launch_point`` (one TVMBackendParallelLaunch
    whose lambda holds both loops; each parallel loop inside it takes the thread's static share)
    and ``before`` ends with ``TVMBackendParallelBarrier``. No statement may sit between them outside
    a parallel loop: every thread of the launch runs it. A second launch instead wakes the sleeping
    workers again. (After lowering, :mod:`.work_claiming` makes both loops claim chunks and the
    barrier a count of the stage's finished chunks.)"""
    sch.parallel(before)
    sch.annotate(before, "pragma_parallel_barrier_when_finish", 1)
    sch.annotate(launch, "pragma_parallel_launch_point", 1)


def _pack_nest(sch, vw, par):
    """The activation packing stage "pad" ahead of main loop ``par``: on the threads as
    :func:`_parallel_stage` decides, inner loop vectorized."""
    p = sch.get_sblock("pad")
    if len(sch.get_loops(p)) > 3:
        inner = _parallel_stage(sch, p, par)
        if _extent(sch, inner) > 1:
            sch.vectorize(inner)
    else:
        _spatial_nest(sch, p, vw)


def dense_amx(sch, vw):
    """int8 gemm on AMX tiles: the extern call ("amx") is parallel by construction; the packing
    stage "pad" and the epilogue "out" get parallel, vectorized nests."""
    for name in ("pad", "out"):
        blk = _block(sch, name)
        if blk is not None:
            _spatial_nest(sch, blk, vw)


def dense_dot(sch, vw, mb, lanes, intrin, nb=1):
    """int8 gemm on a dot-product intrinsic: block "dense" has loops (i, no, ni, kb, kq); rows
    blocked by ``mb``, the (ni x kq) tile tensorized; the packing stage "pad", if any, apart.
    ``nb`` > 1 (arm sdot): ``nb`` registers of columns per tile as well, unrolled inside the rows."""
    blk = sch.get_sblock("dense")
    i, no, ni, kb, kq = sch.get_loops(blk)
    rows, cols = _extent(sch, i), _extent(sch, no) * _extent(sch, ni)
    io, ii = sch.split(i, [None, mb])
    noi = None
    if nb > 1:
        no, noi = sch.split(no, [None, nb])
    a, b = _tiles_order(io, no, rows, cols)
    sch.reorder(a, b, kb, ii, *([noi] if noi is not None else []), ni, kq)
    if noi is not None:
        sch.unroll(noi)
    par = sch.fuse(a, b)
    if _extent(sch, par) > 1:
        threads.parallel(sch, par)
    if _block(sch, "pad") is not None:
        _pack_nest(sch, vw, par)             # before tensorize: compute_at needs the plain consumer
    acc = sch.cache_write(blk, 0, ACC_SCOPE)
    sch.reverse_compute_at(acc, par, preserve_unit_loops=True)
    _write_back(sch, vw)
    _vectorize_inner(sch, acc, 1)
    sch.unroll(ii)
    init = sch.decompose_reduction(blk, kb)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ni, intrin)


def matmul(sch, vw, mb=1):
    """Batched matmul: rows (batch x M / mb) parallel; a register tile of ``mb`` rows (unrolled)
    x one vector of columns accumulates over K; a B padding stage ("bpad"), if any, computed
    whole before it; padded columns cut off per row tile, while it is cached."""
    blk = sch.get_sblock("matmul")
    loops = sch.get_loops(blk)
    *spatial, i, j, rk = loops
    nj = _extent(sch, j)
    b = vw if nj % vw == 0 else (nj if nj <= vw else 1)
    mb = mb if b > 1 else 1
    io, ii = sch.split(i, [None, mb]) if mb > 1 else (i, None)
    rows = sch.fuse(*spatial, io) if spatial else io
    if _extent(sch, rows) > 1:
        threads.parallel(sch, rows)
    if b > 1:
        jo, ji = sch.split(j, [None, b])
        sch.reorder(rows, jo, rk, *([ii] if ii is not None else []), ji)
        acc = sch.cache_write(blk, 0, ACC_SCOPE)
        sch.reverse_compute_at(acc, jo, preserve_unit_loops=True)
        _vectorize_inner(sch, acc, 1)
        sch.vectorize(ji)
        if ii is not None:
            sch.unroll(ii)
        init = sch.decompose_reduction(blk, rk)
        sch.vectorize(sch.get_loops(init)[-1])
    pad = _block(sch, "bpad")
    if pad is not None:
        _spatial_nest(sch, pad, vw)
    out = _block(sch, "out")
    if out is not None and b > 1:       # whisper's 1500 keys: 6x1500x1504 scores copied whole took 30 %
        sch.reverse_compute_at(out, rows)
        last = sch.get_loops(out)[-1]
        w = next(w for w in (vw, vw // 2, vw // 4, 1) if _extent(sch, last) % w == 0)
        if w > 1:
            sch.vectorize(sch.split(last, [None, w])[1])
    elif out is not None:
        _spatial_nest(sch, out, vw)


def rowwise(sch, vw, rows):
    """Reductions over trailing axes, computed per output row inside the parallel row loop."""
    out, _ = _output_block(sch, ["out"])
    if out is None:
        raise ValueError("rowwise: no output block")
    loops = sch.get_loops(out)
    if rows == 0 or rows > len(loops):
        raise ValueError("rowwise: no row loops")
    r = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
    parts = []
    for name in ("reduce", "reduce_part", "rvar", "rvar_part", "rsum", "rsum_part", "rexp",
                 "rmean", "rmean_part", "rmax", "rmax_part"):
        b = _block(sch, name)
        if b is not None:
            sch.compute_at(b, r, preserve_unit_loops=True)
            if name.endswith("_part"):
                # (..., lane, ro): the lanes innermost, one vector of partial results per row
                lane, ro = sch.get_loops(b)[-2:]
                sch.reorder(ro, lane)
                sch.vectorize(lane)
                parts.append((b, ro))
            if name == "rexp":
                lp = sch.get_loops(b)[1:]
                c = sch.fuse(*lp) if len(lp) > 1 else lp[0]
                if _extent(sch, c) >= vw:
                    sch.vectorize(sch.split(c, [None, vw])[1])
    cols = sch.get_loops(out)[1:]
    if cols:
        c = sch.fuse(*cols) if len(cols) > 1 else cols[0]
        ext = _extent(sch, c)
        if ext >= vw:
            # a tail that does not fill a vector becomes a predicated (masked) vector iteration
            _, ci = sch.split(c, [None, vw])
            sch.vectorize(ci)
    if _extent(sch, r) > 1:
        threads.parallel(sch, r)
    for b, ro in parts:                      # last: parallel() wants whole reduction blocks
        init = sch.decompose_reduction(b, ro)
        sch.vectorize(sch.get_loops(init)[-1])


def se_mul(sch, vw, r):
    """The squeeze-excite multiply of :func:`.se_mul.se_mul`: output (n, co, h, w, ci)
    with its per-channel operands stored [n, co, 2, r, ci]; the vector loop runs over ``r`` output
    columns × the channel block (one contiguous run of the output, of x and of the operands), the
    rest fused and parallel when large enough. The small per-channel stages keep the generic rule."""
    _inline_spatial(sch, keep=("out",))
    out = sch.get_sblock("out")
    for blk in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(blk).name_hint != "out":
            _spatial_nest(sch, blk, vw)
    n, co, h, w, ci = sch.get_loops(out)
    total = math.prod(_extent(sch, lp) for lp in (n, co, h, w, ci))
    wo, wi = sch.split(w, [None, r])
    sch.vectorize(sch.fuse(wi, ci))
    f = sch.fuse(n, co, h, wo)
    if total >= MIN_PARALLEL:
        threads.parallel(sch, f)


def generic(sch, vw, **_):
    _inline_spatial(sch, keep=("out",))
    root = sch.get_sblock("root")
    for blk in sch.get_child_blocks(root):
        if _is_reduction(sch, blk):
            loops = sch.get_loops(blk)
            nsp = sum(1 for iv in sch.get(blk).iter_vars if int(iv.iter_type) == 0)
            sp = loops[:nsp]
            if sp:
                total = math.prod(_extent(sch, lp) for lp in sp)
                if total > 1:
                    f = sch.fuse(*sp) if len(sp) > 1 else sp[0]
                    if total >= 64:
                        threads.parallel(sch, f)
        else:
            _spatial_nest(sch, blk, vw)


RULES = {"conv2d": conv2d, "depthwise": depthwise, "conv_transpose": conv_transpose, "pool": pool,
         "dense": dense, "conv2d_dot": conv2d_dot, "conv2d_winograd": conv2d_winograd, "dense_dot": dense_dot,
         "dense_amx": dense_amx, "matmul": matmul, "row_stats": row_stats, "rowwise": rowwise, "se_mul": se_mul,
         "generic": generic}
