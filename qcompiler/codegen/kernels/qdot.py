"""int8 convolution and gemm on dot-product instructions: x86 VNNI ``vpdpbusd`` or ``vpmaddwd``,
ARM ``sdot`` (+dotprod).

The accumulation ``acc[c] = Σ_k x[k] · w[c, k]`` is tensorized with the intrinsics of
:mod:`..x86.intrin` and :mod:`..arm.intrin`: the reduction runs in groups of ``q`` consecutive
input channels (q = 4 for VNNI and sdot, 2 for pmaddwd) and ``L`` output channels per
instruction (16, 8 or 4 int32 lanes on x86; 4 = one 128-bit NEON register for sdot, with blocks
of 8 output channels = two registers where the channel count and output width allow).

Operands, packed so that one group is one 32-bit word and one weight tile one vector register:

* activations ``P`` (n, C'/bi, H + pads, W + pads, bi): NCHW{bi}c with ``bi`` a multiple of q and
  the input channels of each group padded to C'/g = ceil(C/g / q)·q. VNNI reads uint8; an int8
  activation x is stored as ``x ^ 0x80 = x + 128`` (mod 256) and its zero point becomes z + 128,
  so that ``Σ (x - z) w`` is unchanged. sdot reads int8, the mirror image: a uint8 activation
  x is stored as ``x ^ 0x80 = x - 128`` (as int8) and its zero point becomes z - 128. The
  pmaddwd path stores the activations widened to int16 (its weights stay int8 and are widened
  as they are loaded: :mod:`..x86.intrin`). An input already in the A operand type
  (uint8 for VNNI, int8 for sdot), blocked by a multiple of 4 channels, with no padding, is read
  in place.
* weights (K'/bo, C'/g/bi, R, S, bi/q, bo, q), packed at compile time: ``bo`` output channels
  (one or two registers of L lanes) by q input channels, zero for padded channels; the output
  channels of each group are padded to a multiple of 4 when L would not divide them.

A one-channel conv (grayscale stem) whose kernel width S ≡ 1 (mod q) groups q horizontal taps
instead of padding its channel to q (:func:`fold_taps`).

On ``vpmaddwd`` (no VNNI) 3x3 stride-1 convs of >= 16 channels go to the Winograd kernel of
:mod:`..x86.qwinograd` instead (2.25x fewer multiplies, the same integer accumulator).

Depthwise convs stay on the plain int16-product kernel (:func:`.conv.conv2d_accumulate`): they
have no channel reduction, and a per-lane ``vpdpbusd`` over groups of 4 kernel taps (activations
replicated per tap into a (…, x_out, tap group, c, 4) layout) was measured on rapidocr-det at
1 thread and NOT adopted: 3x3 layers 1195/532/845 us against 1176/457/870 us for the int16 kernel,
5x5 505 against 310 us (the tap packing costs what the dot product saves).

The caller folds the zero point into the bias with the *effective* zero point returned here
(``bias - z_eff · Σ_k w[c, k]``), exactly as the plain kernels do; padding stores z_eff so that it
cancels. Intel's VNNI guide ("Lower numerical precision deep learning inference and training",
Intel white paper, 2018) and TVM's ``conv2d_NCHWc_int8`` use the same 4-channel grouping.
"""
from __future__ import annotations

import os

import numpy as np
from tvm import te, tirx

from ..arm.intrin import register_lane
from ..intrin import DotIsa
from ..isa import dot_intrin, int8_isa
from ..x86.intrin import has_amx_int8
from .tensor import Buf, cast, compute, divisor_at_most, padded_extent, repeat_last

I32 = "int32"
INDEXED_SDOT = True      # arm: indexed sdot over the input-channel block (scripts/arm_sdot_mca.py compares)


def isa_of(ctx) -> DotIsa | None:
    return int8_isa(ctx.spec)


def _up(v: int, m: int) -> int:
    return -(-v // m) * m


def dot_channels(kg: int, isa: DotIsa) -> int:
    """The output channels (per group) the dot-product accumulator computes: ``kg`` where a
    register of ``lanes``, ``lanes/2`` or ``lanes/4`` >= 4 divides it; otherwise ``kg`` rounded up
    with zero weights, its output then stored out of the padded tile either way, to whichever of 4
    (the narrowest register) and ``lanes`` takes fewer vector instructions. SSDLite's 546-channel
    head on VNNI zmm ran as 548 channels in 137 xmm registers; padded to 560 it is 35 zmm."""
    if isa.lanes_for(kg):
        return kg
    return min((_up(kg, 4), _up(kg, isa.lanes)), key=lambda kp: (kp // isa.lanes_for(kp), kp))


def wrap_int32(v: np.ndarray) -> np.ndarray:
    """int64 values reduced modulo 2^32 into int32 (the kernels' accumulators wrap alike)."""
    return ((np.asarray(v, np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)


def _to_a(isa: DotIsa, v, src_dtype: str):
    """A stored uint8/int8 activation as the intrinsic's A operand type (the sign bit flipped
    between uint8 and int8: ``x ^ 0x80`` is x + 128 resp. x - 128 modulo 256)."""
    if isa.kind == "vnni":
        if src_dtype == "uint8":
            return v
        return tirx.bitwise_xor(tirx.reinterpret("uint8", v), tirx.const(0x80, "uint8"))
    if isa.kind == "sdot":
        if src_dtype == "int8":
            return v
        return tirx.reinterpret("int8", tirx.bitwise_xor(v, tirx.const(0x80, "uint8")))
    return v.astype("int16")


def effective_zp(isa: DotIsa, src_dtype: str, z):
    """The zero point of the stored A operand: z + 128 for int8 on VNNI, z - 128 for uint8 on
    sdot (both in the operand type's range), else z."""
    if isa.kind == "vnni" and src_dtype == "int8":
        return z + 128
    if isa.kind == "sdot" and src_dtype == "uint8":
        return z - 128
    return z


def applicable(isa: DotIsa | None, x, w: np.ndarray | None) -> bool:
    return (isa is not None and w is not None and w.dtype == np.int8
            and x.dtype in ("uint8", "int8"))


def _in_block(cgp: int, q: int, have: int) -> int:
    """Input-channel block of the packed activations: the input's own block if it serves,
    else q times the largest divisor d of cgp/q with q·d <= 16."""
    if have and have % q == 0 and cgp % have == 0:
        return have
    n = cgp // q
    d = max(v for v in range(1, 16 // q + 1) if n % v == 0)
    return q * d


def conv2d(ctx, a, x, w: np.ndarray, out_shape, zx, isa: DotIsa):
    """The int32 accumulator of a (grouped, strided, dilated, padded) convolution on dot-product
    instructions; ``zx`` an int, or an int32 expression read at run time (DynamicQuantizeLinear's
    zero point). Returns (acc(idx) accessor in logical NCHW, effective zero point)."""
    from .conv import _attrs2d
    if a["group"] == 1 and w.shape[1] == 1 and w.shape[3] > 1:
        x, w, a = fold_taps(x, w, a, zx, isa.group)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    g = a["group"]
    kg = k // g
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    oh, ow = out_shape[2:]
    q = isa.group
    cgp = _up(cg, q)
    kgp = dot_channels(kg, isa)
    lanes = isa.lanes_for(kgp)
    zeff = effective_zp(isa, x.dtype, zx)
    pads = (pt, pl, pb, pr)
    bi = _in_block(cgp, q, x.block if cgp == cg and x.block else 0)
    bo, reg_n = _blocking(ctx, isa, kgp, lanes, ow, bi // q)
    if (isinstance(x, Buf) and x.block == bi and not any(pads) and x.dtype == isa.a_dtype
            and cgp == cg):
        P, padded = x.tensor, False
    else:
        P, padded = _pack(x, isa, g, cg, cgp, bi, pads, zx), True
    wpad = np.zeros((g, kgp, cgp, r, s), np.int64)
    wpad[:, :kg, :cg] = w.reshape(g, kg, cg, r, s)
    wpk = wpad.reshape(g * kgp // bo, bo, cgp // bi, bi // q, q, r, s).transpose(0, 2, 5, 6, 3, 1, 4)
    wp = ctx.param(wpk.astype(isa.b_dtype), "qw_dot")
    icb, ic = te.reduce_axis((0, cgp // bi), "icb"), te.reduce_axis((0, bi // q), "ic")
    rh, rw = te.reduce_axis((0, r), "rh"), te.reduce_axis((0, s), "rw")
    iq = te.reduce_axis((0, q), "iq")
    per_group = cgp // bi

    def body(i, ko, y, xx, ki):
        base = ((ko * bo) // kgp) * per_group if g > 1 else 0
        return te.sum(cast(P[i, base + icb, y * sh + rh * dh, xx * sw + rw * dw, ic * q + iq], I32)
                      * cast(wp[ko, icb, rh, rw, ic, ki, iq], I32), axis=[icb, rh, rw, ic, iq])
    acc = compute((n, g * kgp // bo, oh, ow, bo), body, name="conv")
    if isa.kind == "sdot" and bi > q and INDEXED_SDOT:    # one A load per column and block
        ctx.schedule("conv2d_dot", reg_n=reg_n, pad=padded, block=bo, lanes=lanes,
                     intrin=register_lane(bi // q), span=True)
    else:
        ctx.schedule("conv2d_dot", reg_n=reg_n, pad=padded, block=bo,
                     lanes=lanes, intrin=dot_intrin(isa, lanes))
    if kgp == kg:
        return Buf(acc, out_shape, I32, bo).at, zeff
    accb = Buf(acc, (n, g * kgp, oh, ow), I32, bo)
    return (lambda idx: accb.at((idx[0], (idx[1] // kg) * kgp + idx[1] % kg, idx[2], idx[3]))), zeff


def fold_taps(x, w: np.ndarray, a, zx: int, q: int):
    """A one-channel conv (a grayscale stem) as a q-channel conv over q horizontally shifted copies
    of its input, so that the q-wide dot product multiplies q kernel taps instead of one channel
    and q - 1 zero-weight padding channels (mnistnet's 1->32 3x3 stem on vpmaddwd: 6 instead of 9
    pairs per output)::

        x_q[n, j, y, p] = x[n, 0, y, p - pl + j·dw]   (z_x outside the row)      j < q
        w_q[k, j, rh, t] = w[k, 0, rh, q·t + j]        (0 where q·t + j >= S)     t < ceil(S / q)

    with the left/right padding folded into x_q (the conv keeps its top/bottom padding), and
    width dilation q·dw. Output column o reads x_q at p = o·sw + t·q·dw, channel j, i.e. x at
    o·sw + (q·t + j)·dw - pl: the original tap q·t + j, so the sum is the same integer sum over the
    same products in another order (exact); the taps q·t + j >= S have zero weights. The folded
    window, q·dw·(ceil(S/q) - 1) + 1, is no wider than the original dw·(S - 1) + 1, so every
    column the output reads lies inside x_q (as wide as the padded input; the caller's output
    shape stands). Any S > 1 gains: ceil(S/q) dot products per row of taps instead of S (vpdpbusd,
    q = 4, on a 3x3 stem: 1 instead of 3; vpmaddwd, q = 2: 2 instead of 3). Returns (x_q, w_q, attrs)."""
    from .conv import _attrs2d
    from .tensor import Lazy
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    _, (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    st = (s - 1) // q + 1
    width = wd + pl + pr
    fill = tirx.const(zx, x.cdtype) if isinstance(zx, int) else cast(zx, x.cdtype)

    def xq(idx):
        # a Select of a load at the clamped column (always in bounds), not an if_then_else: the
        # condition depends on j, the packing stage's vector lane, and TVM scalarizes an
        # if_then_else whose condition differs between lanes (a branch per element: a third of
        # fashion_mobilenet's int8 stem kernel)
        i, j, y, p = idx
        col = p - pl + j * dw
        safe = tirx.max(tirx.min(col, wd - 1), 0)
        return tirx.Select(tirx.all(col >= 0, col < wd), x.at((i, 0, y, safe)), fill)
    wq = np.zeros((k, q, r, st), w.dtype)
    for t in range(st):
        for j in range(q):
            if q * t + j < s:
                wq[:, j, :, t] = w[:, 0, :, q * t + j]
    attrs = dict(a, pads=[pt, 0, pb, 0], dilations=[dh, q * dw], kernel_shape=[r, st])
    return Lazy((n, q, h, width), x.dtype, xq), wq, attrs


def _blocking(ctx, isa: DotIsa, kgp: int, lanes: int, ow: int, groups: int) -> tuple[int, int]:
    """(bo, reg_n): output channels per block (one or two registers of ``lanes``) and output
    columns per register tile (``groups``: input-channel groups of 4 one sdot tile covers).

    sdot: bo = 8 (two registers) whenever the channels allow, and as many columns as the 32
    NEON registers hold: reg_n·bo/4 accumulators + groups·bo/4 weight registers + 2 for A
    <= 32 (at most 16 columns). llvm-mca (LLVM 14, -mcpu=cortex-a76) on the inner loop of a
    64->64 3x3 conv at 28x28: 1.50 cycles per sdot with bo = 4 and the x86 register budget,
    1.10 with bo = 8, 0.98 with bo = 8 and this budget, 0.56 with the indexed sdot
    (:func:`..arm.intrin.register_lane`) on top (the bound is 0.5: two sdot pipes).

    x86: the input operand of ``vpdpbusd`` (the unsigned bytes) and both of ``vpmaddwd`` (16-bit
    words) have no broadcast memory form, so each column's four input bytes are broadcast into a
    register of their own, and LLVM hoists all of a tile's broadcasts above its dot products. The
    tile is therefore chosen with the broadcasts counted: reg_n columns of ``r`` registers hold
    reg_n·r accumulators + reg_n broadcasts + r weights <= the register file (32 on AVX-512, 16
    on AVX2), the tile with the most accumulators winning (two registers on a tie: fewer
    broadcasts per dot product). The earlier tile counted accumulators only (28 columns of one zmm):
    LLVM then spilled 25 of the 28 broadcasts to the stack and reloaded each for its one
    ``vpdpbusd`` (mobilenet_v2's 24->144 1x1 conv at 56x56: a store and a load per dot product).
    ``QC_DOT_TILE=0``: the earlier tile (A/B runs)."""
    from .conv import register_tile
    if isa.kind == "sdot":
        bo = 2 * lanes if kgp % (2 * lanes) == 0 else lanes
        regs = bo // lanes
        cap = min(16, (32 - 2 - groups * regs) // regs)
        return bo, max(d for d in range(1, min(ow, cap) + 1) if ow % d == 0)
    if os.environ.get("QC_DOT_TILE") == "0":
        return register_tile(ow, ctx, lanes, kgp % (2 * lanes) == 0 and ow >= 8)
    file = 32 if ctx.vw >= 16 else 16
    best = None
    for r in (1, 2):
        if r == 2 and (kgp % (2 * lanes) or ow < 8):
            continue
        cap = max(1, (file - r) // (r + 1))
        n = max(d for d in range(1, min(ow, cap) + 1) if ow % d == 0)
        if best is None or (n * r, r) >= (best[1] * best[0], best[0]):
            best = (r, n)
    return best[0] * lanes, best[1]


def _pack(x, isa: DotIsa, g, cg, cgp, bi, pads, zx):
    """x as (n, g·cgp/bi, H+pads, W+pads, bi) in the A operand type; padding holds z_x (stored as x
    is: z_eff)."""
    pt, pl, pb, pr = pads
    n, c, h, w = x.shape
    if isinstance(zx, int):
        zeff = effective_zp(isa, x.dtype, zx)
        fill = tirx.const(zeff if isa.kind != "vnni" else zeff & 0xFF, isa.a_dtype)
    else:
        fill = _to_a(isa, cast(zx, x.dtype), x.dtype)
    per_group = cgp // bi

    def body(i, cb, y, xx, ci):
        # ci is the stage's vector lane: the padding channels (j >= cg) are a Select of a load at
        # the clamped channel (always in bounds), since TVM scalarizes an if_then_else whose
        # condition differs between lanes (a branch per element, as in fold_taps); the spatial
        # padding is the same for every lane and stays an if_then_else (its load may be out of bounds)
        if cgp == cg:
            ch = cb * bi + ci
        else:
            j = (cb % per_group) * bi + ci
            ch = (cb // per_group) * cg + tirx.min(j, cg - 1)
        v = _to_a(isa, x.at((i, ch, y - pt, xx - pl)), x.dtype)
        if cgp != cg:
            v = tirx.Select(j < cg, v, fill)
        if any(pads):
            v = tirx.if_then_else(tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + w), v, fill)
        return v
    return compute((n, g * cgp // bi, h + pt + pb, w + pl + pr, bi), body, name="pad")


def dense(ctx, A, w: np.ndarray, za: int, isa: DotIsa):
    """The int32 accumulator of ``A (m x K) · w^T`` (w: N x K int8) on dot-product instructions
    (AMX tiles where the x86 CPU has them: :func:`dense_amx`). Returns (acc(i, j) accessor,
    effective zero point)."""
    if amx_applies(ctx, isa, A.shape[0], A.shape[1]):
        return dense_amx(ctx, A, w, za, isa)
    m, kk = A.shape
    nn = w.shape[0]
    q = isa.group
    kp = _up(kk, q)
    lanes = isa.lanes
    while lanes > 4 and lanes // 2 >= nn:
        lanes //= 2
    npad = _up(nn, lanes)
    zeff = effective_zp(isa, A.dtype, za)
    # rows without a divisor near the register tile (a sequence length of 197) are padded to a
    # multiple of it in the packing stage, repeating the last row; the accessor never reads them
    mpad = padded_extent(m, _ROW_TILE[isa.kind == "sdot"])
    if isinstance(A, Buf) and not A.block and A.dtype == isa.a_dtype and kp == kk and mpad == m:
        Ap = A.tensor if A.phys_shape == (m, kk) else None
    else:
        Ap = None
    if Ap is None:
        fill = tirx.const(0, isa.a_dtype)
        row = repeat_last(m, mpad)
        Ap = compute((mpad, kp), lambda i, j: tirx.if_then_else(
            j < kk, _to_a(isa, A.at((row(i), tirx.min(j, kk - 1))), A.dtype), fill) if kp != kk
            else _to_a(isa, A.at((row(i), j)), A.dtype), name="pad")
    wpad = np.zeros((npad, kp), np.int64)
    wpad[:nn, :kk] = w
    wp = ctx.param(wpad.reshape(npad // lanes, lanes, kp // q, q).transpose(0, 2, 1, 3).astype(isa.b_dtype),
                   "qw_dense_dot")
    kb, kq = te.reduce_axis((0, kp // q), "kb"), te.reduce_axis((0, q), "kq")
    d = compute((mpad, npad // lanes, lanes), lambda i, no, ni: te.sum(
        cast(Ap[i, kb * q + kq], I32) * cast(wp[no, kb, ni, kq], I32), axis=[kb, kq]), name="dense")
    mb, nb = _dense_blocking(isa, mpad, npad // lanes)
    ctx.schedule("dense_dot", mb=mb, lanes=lanes, intrin=dot_intrin(isa, lanes), nb=nb)
    return (lambda i, j: d[i, j // lanes, j % lanes]), zeff


_ROW_TILE = (8, 4)          # rows of a dense register tile: x86, arm sdot (see _dense_blocking)
AMX_COLS = 32               # columns of one call's tile pair (two 16-column B tiles)


def amx_weights(w: np.ndarray, kp: int, npad: int) -> np.ndarray:
    """w (N x K int8) as ``amx_gemm.c``'s B: K x N zero-padded to kp x npad, then for each block of
    16 columns j and 64 rows kb one 16 x 64-byte tile whose row r holds B[kb·64 + 4r + t, 16j + n]
    at byte 4n + t; shape (npad/16, kp/64, 16, 16, 4)."""
    nn, kk = w.shape
    b = np.zeros((kp, npad), np.int8)
    b[:kk, :nn] = w.T
    return np.ascontiguousarray(b.reshape(kp // 64, 16, 4, npad // 16, 16).transpose(3, 0, 1, 4, 2))


AMX_MIN_K = 256


def amx_applies(ctx, isa: DotIsa, m: int, kk: int) -> bool:
    """AMX tiles for a gemm of ``m`` rows and K = ``kk``: on an x86 CPU with AMX-INT8 (VNNI's u8 x s8
    form), with at least one whole 16-row tile, K a multiple of the tiles' 64 (no padded columns
    for the packing stage to fill) and at least :data:`AMX_MIN_K`, and not for ``--debug-layers``
    builds (their per-layer functions keep the VNNI kernels).

    The K bound is where the tiles pay for what they cost besides the products: each 32 x 32 output
    block zeroes and stores four tiles, and the int32 accumulator goes through memory to the
    epilogue (the VNNI kernel keeps it in registers). Measured on Emerald Rapids, 2 threads, AMX /
    VNNI (static int8 GEMM, float32 result; M x K x N): 1024x64x128 0.044/0.035 ms, 1024x128x64
    0.040/0.030, 128x256x768 0.080/0.075, 4096x256x64 0.19/0.26, 128x384x1536 0.12/0.18,
    128x768x768 0.14/0.25: slower below K = 256, even there, faster above."""
    return (isa.kind == "vnni" and m >= 16 and kk % 64 == 0 and kk >= AMX_MIN_K
            and not ctx.spec.debug_layers and has_amx_int8(ctx.spec))


def dense_amx(ctx, A, w: np.ndarray, za: int, isa: DotIsa):
    """:func:`dense` on AMX-INT8 tiles: ``tdpbusd`` (u8 x s8 -> s32, the same sums as vpdpbusd) in
    ``x86/amx_gemm.c``'s ``qc_amx_gemm_u8s8``, called from a parallel loop over chunks of 32-column
    blocks (each weight strip read once, every row block passing over it), or of 32-row blocks where
    M >= N (the activation read once). K is a multiple of 64
    (:func:`amx_applies`); A is packed (rows padded to 16 repeating the last) unless it is a plain
    uint8 buffer of that shape; the accumulator is an int32 (rows x columns) buffer the epilogue
    reads."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T
    m, kk = A.shape
    nn = w.shape[0]
    npad, mpad = _up(nn, AMX_COLS), _up(m, 16)
    zeff = effective_zp(isa, A.dtype, za)
    if isinstance(A, Buf) and not A.block and A.dtype == "uint8" and mpad == m and A.phys_shape == (m, kk):
        Ap = A.tensor
    else:
        row = repeat_last(m, mpad)
        Ap = compute((mpad, kk), lambda i, j: _to_a(isa, A.at((row(i), j)), A.dtype), name="pad")
    wp = ctx.param(amx_weights(w, kk, npad), "qw_amx")
    rows_outer = int(m >= nn)              # re-read the smaller operand (schedules._tiles_order's rule)
    outer = -(-mpad // 32) if rows_outer else npad // AMX_COLS
    chunks = min(outer, 64)
    per = -(-outer // chunks)
    chunks = -(-outer // per)

    def body(ins, outs):
        a, b = ins
        (c,) = outs
        with IRBuilder() as ib:
            with (T.parallel(0, chunks) if chunks > 1 else T.serial(0, 1)) as q:
                j0 = q * per
                j1 = tirx.min(j0 + per, outer)
                T.evaluate(tirx.call_extern("int32", "qc_amx_gemm_u8s8", a.access_ptr("r"), b.access_ptr("r"),
                                            c.access_ptr("w"), mpad, npad, kk, j0, j1, rows_outer))
        return ib.get()

    def whole(t, name):
        # elem_offset 0: access_ptr is then tvm_access_ptr over the whole buffer, which TVM's region
        # analysis sees (an address_of(buf[0, 0]) reads one element: the buffer was compacted to the
        # epilogue's read region and the call wrote past it)
        return tirx.decl_buffer(t.shape, t.dtype, name, elem_offset=0)
    acc = te.extern((mpad, npad), [Ap, wp], body, name="amx", dtype=I32,
                    in_buffers=[whole(Ap, "amx_a"), whole(wp, "amx_b")],
                    out_buffers=[tirx.decl_buffer((mpad, npad), I32, "amx_c", elem_offset=0)])
    ctx.schedule("dense_amx")
    return (lambda i, j: acc[i, j]), zeff


def _dense_blocking(isa: DotIsa, m: int, nvec: int) -> tuple[int, int]:
    """(mb, nb): rows and weight registers (of ``nvec``) per register tile of the gemm.

    x86: rows only (mb <= 8), one register of columns. sdot (4 lanes): up to 4 registers of
    columns too, so that a row's sdots feed nb independent accumulators instead of one chain
    (sdot's latency is several cycles, its throughput two per cycle), with mb <= 4 rows:
    mb·nb accumulators + nb weights + mb broadcast A words <= 24 of the 32 NEON registers."""
    if isa.kind == "sdot":
        return divisor_at_most(m, _ROW_TILE[1]), divisor_at_most(nvec, 4)
    return divisor_at_most(m, _ROW_TILE[0]), 1

