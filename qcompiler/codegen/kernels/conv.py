"""Convolutions and pooling in the blocked NCHW{b}c layout.

Conv (any group count whose per-group channel counts admit a block), depthwise conv,
ConvTranspose, MaxPool/AveragePool and the global pools produce a float32 accumulator in
NCHW{b}c; bias, residual and activation are left to the kernel's epilogue (a :class:`Lazy` over
the accumulator) that the x86 schedule fuses into the register-tile write-back.

Weights are re-laid out at compile time:

* conv ``(K, C/g, R, S)`` → ``(K/bo, C/g/bi, R, S, bi, bo)``: the innermost ``bo`` output channels
  are one or two vector registers (two when K/g allows: each broadcast input value then feeds two
  FMAs), the ``bi`` input channels an unrolled scalar-broadcast loop;
* depthwise ``(C, 1, R, S)`` → ``(C/b, R, S, b)``;
* ConvTranspose ``(C, K/g, R, S)`` → ``(C, R, S, K/g)``.

The int8 depthwise conv (:func:`depthwise_int_exact_f32`) runs on this float kernel exactly: the
stored integers are converted to float32 once, in the padding stage, and the window sum is formed
with float32 FMAs. Every product ``x·w`` and every partial sum is an integer of magnitude at most
``max|x| · Σ_taps |w|`` (max|x| = 255 for uint8, 128 for int8); when that bound is below 2^24 every
such integer is a float32 and every rounding is the identity, so the float sum equals the int32 sum
bit for bit, in any summation order (IEEE 754 addition/FMA of representable integers whose exact
result is representable is exact). The bound is checked per channel at compile time; otherwise the
caller keeps the int16-product kernel. One FMA per 16 multiply-adds replaces the int16 path's
load/vpmullw/widen/vpaddd sequence.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ..target import Family
from .elementwise import activation
from .tensor import Buf, Lazy, LTensor, _simplify, broadcast_index, cast, compute, const, dtype_of

F32 = "float32"


def pick_block(n: int, vw: int, allow_small_full: bool = False) -> int:
    """The channel block: the vector width if it divides ``n``, else the largest power of two
    that does (or ``n`` itself when ``n`` < vector width and ``allow_small_full``)."""
    if allow_small_full and n <= vw:
        return n
    b = vw
    while b > 1 and n % b:
        b //= 2
    return b


STORE_FMAS = 10
"""What storing one output element from a padded accumulator costs, in vector multiply-adds: the
write-back to the output's own block is a copy out of the register tile's layout, ~5 cycles per
element measured on Zen 4 (a 24->36 1x1 conv at 56x56 stored NCHW4c from 16 lanes: +0.095 ms for
113k elements on 2 threads), where two FMA ports retire 10 multiply-adds."""


def padded_channels(k: int, vw: int, k_red: int) -> int:
    """The output channels a group-1 conv's accumulator computes: ``k``, or ``k`` rounded up to the
    vector width ``kp`` (zero weights, the padding lanes never stored), where the channel block
    ``b`` that divides ``k`` fills at most a quarter of a vector and the vector multiply-adds saved
    per output pixel, ``k_red · (k/b - kp/vw)`` (``k_red`` = input channels x taps), exceed what
    storing its ``k`` elements from the padded tile costs (:data:`STORE_FMAS` each). ONNX Runtime's
    NCHWc convs pad every filter count to the block. The output is stored in the block b (the
    layout its readers got before; MTCNN-RNet's 28-channel conv written plain NCHW made its
    MaxPool scalar, 1 -> 16 us), except where b < 4 lanes: then the graph stores the padded
    channels themselves (:mod:`..channel_padding`). SSDLite's 672->546 classification-head conv on AVX-512 ran on
    2-lane blocks (546 = 2·273): 6.6 ms of a 14.8 ms model, against 1.4 ms for ORT's; padded to
    560 it runs on full vectors (1.4 ms). A 24->36 1x1 conv (4-lane blocks over 24 input
    channels) saves less than its stores cost and stays (0.205 ms; padded, 0.30)."""
    b = pick_block(k, vw)
    kp = -(-k // vw) * vw
    saved = k_red * (k // b - kp // vw)
    return kp if b <= vw // 4 and saved > STORE_FMAS * k else k


def _attrs2d(a, rank=4):
    s = list(a["strides"] or [1, 1])
    d = list(a.get("dilations") or [1, 1])
    p = list(a["pads"] or [0, 0, 0, 0])
    return s, d, p


def pack_input(x: LTensor, bi: int, pads, name: str = "pad", fill=0.0):
    """x as a padded NCHW{bi}c tensor (a stage named ``name``), or x's own storage when it already is one."""
    pt, pl, pb, pr = pads
    if isinstance(x, Buf) and x.block == bi and not any(pads):
        return x.tensor, False
    n, c, h, w = x.shape
    shape = (n, c // bi, h + pt + pb, w + pl + pr, bi)

    def body(i, co, y, xx, ci):
        v = x.at((i, co * bi + ci, y - pt, xx - pl))
        if not any(pads):
            return v
        return tirx.if_then_else(tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + w), v, const(fill, dtype_of(v)))
    return compute(shape, body, name), True


def conv2d_accumulate(ctx, a, x, w: np.ndarray, out_shape, product, *, fill=0.0, name="w", weight_at=None):
    """The blocked 2-D convolution sum shared by the float and int8 kernels.

    Packs the input into NCHW{b}c (padding with ``fill``) and the constant weight at compile time,
    and sums ``product(input_element, weight_element)`` over the window: depthwise convs in their
    own layout, the rest register-blocked over ``bo`` output channels. Returns (accumulator, bo).
    ``weight_at(w, bo, bi)`` (not depthwise): packs ``w`` (output channels padded) itself and returns
    the weight element at (ko, ico, rh, rw, ici, ki) (4-bit weights: :mod:`.nbits`)."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    g = a["group"]
    kg = k // g
    (sh, sw), (dh, dw), pads = _attrs2d(a)
    oh, ow = out_shape[2:]
    vw = ctx.vw
    if cg == 1 and kg == 1 and g > 1:
        if weight_at is not None:
            raise NotImplementedError("a depthwise conv of packed weights")
        b = x.block if x.block and c % x.block == 0 else pick_block(c, vw)
        P, padded = pack_input(x, b, pads, fill=fill)
        wp = ctx.param(w.reshape(c // b, b, r, s).transpose(0, 2, 3, 1), f"{name}_dw")
        rh, rw = te.reduce_axis((0, r), "rh"), te.reduce_axis((0, s), "rw")
        acc = compute((n, c // b, oh, ow, b), lambda i, co, y, xx, ci: te.sum(
            product(P[i, co, y * sh + rh * dh, xx * sw + rw * dw, ci], wp[co, rh, rw, ci]),
            axis=[rh, rw]), name="conv")
        ctx.schedule("depthwise", reg_n=_reg_n(ow, ctx, b), pad=padded, block=b)   # b/vw vectors a column
        return acc, b
    store = 0            # a padded accumulator stores the block that divides k, as an unpadded one would
    if g == 1 and (kp := padded_channels(k, vw, cg * r * s)) != k:
        w = np.concatenate([w, np.zeros((kp - k, cg, r, s), w.dtype)])
        store, k, kg = pick_block(k, vw), kp, kp
    bo, reg_n = register_tile(ow, ctx, pick_block(kg, vw), kg % (2 * vw) == 0 and ow >= 8)
    bi = x.block if x.block and cg % x.block == 0 else pick_block(cg, vw, allow_small_full=True)
    P, padded = pack_input(x, bi, pads, fill=fill)
    if weight_at is None:
        wp = ctx.param(w.reshape(k // bo, bo, cg // bi, bi, r, s).transpose(0, 2, 4, 5, 3, 1), f"{name}_conv")
        weight = lambda *i: wp[i]            # noqa: E731
    else:
        weight = weight_at(w, bo, bi)
    ico, ici = te.reduce_axis((0, cg // bi), "ico"), te.reduce_axis((0, bi), "ici")
    rh, rw = te.reduce_axis((0, r), "rh"), te.reduce_axis((0, s), "rw")
    per_group = cg // bi

    def body(i, ko, y, xx, ki):
        base = ((ko * bo) // kg) * per_group if g > 1 else 0
        return te.sum(product(P[i, base + ico, y * sh + rh * dh, xx * sw + rw * dw, ici],
                              weight(ko, ico, rh, rw, ici, ki)), axis=[ico, rh, rw, ici])
    acc = compute((n, k // bo, oh, ow, bo), body, name="conv")
    ctx.schedule("conv2d", reg_n=reg_n, pad=padded, block=store or bo)
    return acc, bo


F32_EXACT = 1 << 24          # every integer of magnitude <= 2^24 is a float32


def exact_f32_bound(x_dtype: str, w: np.ndarray) -> int:
    """The largest |partial sum| of ``Σ_taps x·w`` over channels for stored ``x`` of ``x_dtype``:
    max|x| · max_c Σ_taps |w[c]|."""
    xmax = {"uint8": 255, "int8": 128}.get(x_dtype)
    if xmax is None or w.size == 0:
        return F32_EXACT
    return xmax * int(np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1).max())


class _AsF32(LTensor):
    """A stored-integer tensor read as float32 (keeps the producer's channel block)."""

    def __init__(self, x: LTensor):
        self.x, self.shape, self.dtype = x, x.shape, F32

    @property
    def block(self) -> int:
        return self.x.block

    def at(self, idx):
        return cast(self.x.at(idx), F32)


def depthwise_int_exact_f32(ctx, a, x: LTensor, w: np.ndarray, out_shape, zx: int, as_float: bool = False):
    """The integer depthwise sum ``Σ_taps x·w`` (stored x, padding with ``zx``) computed exactly on
    the float32 kernel (see the module docstring), or None when the exactness bound fails. The
    weights stay int8 in the library (a quarter of the bytes) and are widened to float32 at use.
    Returns ``acc_at(idx)``: the int32 accumulator element at logical NCHW ``idx`` (``as_float``: the
    same integer as the float32 the kernel holds)."""
    if exact_f32_bound(x.dtype, w) >= F32_EXACT:
        return None
    (sh, sw), _, _ = _attrs2d(a)
    if w.shape[2] * w.shape[3] > 8 * sh * sw:
        acc, b = conv2d_accumulate(ctx, a, _AsF32(x), w, out_shape,
                                   lambda p, q: p * cast(q, F32), fill=float(zx), name="qw")
    else:
        acc, b = conv2d_accumulate(ctx, a, x, w, out_shape,
                                   lambda p, q: cast(p, F32) * cast(q, F32), fill=zx, name="qw")
    accb = Buf(acc, out_shape, F32, b)
    return accb.at if as_float else (lambda idx: cast(accb.at(idx), "int32"))


def conv2d(ctx, a, ins, outs):
    """Conv / FusedConv: returns the epilogue (bias, residual, activation) over the accumulator."""
    x = ins[0]
    w = ctx.const_data(1)
    if w is None:
        raise NotImplementedError("Conv with a non-constant weight")
    if x.rank != 4:
        raise NotImplementedError(f"Conv of rank {x.rank} (only 2-D convolution is lowered)")
    out_shape = outs[0].shape
    if a["group"] == 1 and _is_cuda(ctx) and isinstance(x, Buf) and x.tensor.dtype == "float16":
        x = _StoredF16(x)
    acc, bo = conv2d_accumulate(ctx, a, x, w, out_shape, lambda p, q: cast(p, F32) * cast(q, F32))
    accb = Buf(acc, out_shape, F32, bo)
    return [_epilogue(ctx, a, accb, ins, outs)]


def _is_cuda(ctx) -> bool:
    return ctx.spec.family is Family.CUDA


class _StoredF16(Buf):
    """A float16-stored activation read as stored (no cast to float32 on load), for the group-1
    conv on CUDA with ``--dtype fp16``: the padding stage then stays float16 and the reduction
    block reads ``C += Cast(float32, A) · Cast(float32, B)`` with A, B float16, the pattern of
    the fp16 ``wmma_sync`` intrinsic that dlight's ``MatmulTensorization`` needs (float16 operands,
    float32 accumulator: WMMA m16n16k16 on sm_70+ when n·oh·ow, co and ci·kh·kw are all > 64).
    Read through :class:`Buf`, the padding stage held float32 and only unpadded (1x1) convs
    tensorized. The same products and float32 sums as before: padding a float16 value and widening
    it later is the same number."""

    def __init__(self, x: Buf):
        super().__init__(x.tensor, x.shape, x.dtype, x.block)

    def at(self, idx):
        return self.tensor[tuple(_simplify(i) for i in self.phys_index(idx))].asobject()


def _reg_n(ow: int, ctx, bo: int | None = None) -> int:
    """Output-width register block: the largest divisor of ``ow`` that keeps the accumulators
    (reg_n x bo/vw vectors) inside the register file (32 zmm on AVX-512, 16 ymm on AVX2)."""
    regs = 28 if ctx.vw >= 16 else 12
    if bo is not None and bo > ctx.vw:
        regs //= bo // ctx.vw
    best = 1
    for d in range(1, min(ow, regs) + 1):
        if ow % d == 0:
            best = d
    return best


def register_tile(ow: int, ctx, one: int, two: bool) -> tuple[int, int]:
    """(bo, reg_n) of a conv's register tile: ``bo`` output channels, one vector register of
    ``one`` lanes or, where ``two`` allows, two (one input broadcast then feeds two multiply-adds),
    by ``reg_n`` output columns, a divisor of ``ow`` (:func:`_reg_n`). Two registers halve the
    columns the register file holds, and a width whose divisors miss that bound leaves a small
    tile: ow = 14 on AVX2 (12 accumulators) gives 2 columns of two registers (4 accumulators, each
    loaded weight used twice) against 7 of one. The tile with more accumulators wins, two registers
    on a tie (fewer broadcasts per multiply). mnistnet's 32->64 3x3 int8 conv at 14x14, one thread
    on Zen 3: 80 -> 66 us (and LLVM no longer spills the 4-accumulator tile's weights)."""
    one_n = _reg_n(ow, ctx, ctx.vw)
    if two:
        two_n = _reg_n(ow, ctx, 2 * ctx.vw)
        if 2 * two_n >= one_n:
            return 2 * one, two_n
    return one, one_n


def _epilogue(ctx, a, acc: LTensor, ins, outs) -> LTensor:
    bias = ins[2] if len(ins) > 2 else None
    z = ins[3] if len(ins) > 3 else None
    act, params = a.get("activation", ""), a.get("activation_params", [])
    if bias is None and z is None and not act:
        return acc

    def fn(idx):
        v = acc.at(idx)
        if bias is not None:
            v = v + bias.at((idx[1],))
        if z is not None:
            v = v + z.at(broadcast_index(idx, z.shape))
        return activation(act, params, v)
    return Lazy(acc.shape, outs[0].dtype, fn)


def conv_transpose(ctx, a, ins, outs):
    x = ins[0]
    w = ctx.const_data(1)
    if w is None or x.rank != 4:
        raise NotImplementedError("ConvTranspose needs a constant weight and 2-D spatial input")
    n, c, h, wd = x.shape
    _, kg, r, s = w.shape
    g = a["group"]
    cg = c // g
    out_shape = outs[0].shape
    k, oh, ow = out_shape[1:]
    (sh, sw), (dh, dw), (pt, pl, _, _) = _attrs2d(a)
    bo = pick_block(kg, ctx.vw)
    wt = ctx.param(w.transpose(0, 2, 3, 1), "w_convt")          # (C, R, S, K/g)
    rc = te.reduce_axis((0, cg), "rc")
    if dh == 1 and dw == 1:
        jy, jx = te.reduce_axis((0, -(-r // sh)), "jy"), te.reduce_axis((0, -(-s // sw)), "jx")

        def body(i, ko, y, xx, ki):
            gi = (ko * bo) // kg
            ry = (y + pt) % sh + jy * sh
            rx = (xx + pl) % sw + jx * sw
            iy = (y + pt) // sh - jy
            ix = (xx + pl) // sw - jx
            ok = tirx.all(ry < r, rx < s, iy >= 0, iy < h, ix >= 0, ix < wd)
            ch = gi * cg + rc
            v = tirx.if_then_else(ok, x.at((i, ch, iy, ix)) * cast(wt[ch, ry, rx, (ko * bo) % kg + ki], F32),
                                  const(0.0, F32))
            return te.sum(v, axis=[rc, jy, jx])
    else:
        jy, jx = te.reduce_axis((0, r), "jy"), te.reduce_axis((0, s), "jx")

        def body(i, ko, y, xx, ki):
            gi = (ko * bo) // kg
            ty, tx = y + pt - jy * dh, xx + pl - jx * dw
            iy, ix = ty // sh, tx // sw
            ok = tirx.all(ty >= 0, tx >= 0, ty % sh == 0, tx % sw == 0, iy < h, ix < wd)
            ch = gi * cg + rc
            v = tirx.if_then_else(ok, x.at((i, ch, iy, ix)) * cast(wt[ch, jy, jx, (ko * bo) % kg + ki], F32),
                                  const(0.0, F32))
            return te.sum(v, axis=[rc, jy, jx])
    acc = compute((n, k // bo, oh, ow, bo), body, name="conv")
    ctx.schedule("conv_transpose", reg_n=_reg_n(ow, ctx), pad=False, block=bo)
    return [_epilogue(ctx, a, Buf(acc, out_shape, F32, bo), ins, outs)]


# ---- pooling -----------------------------------------------------------------------------------
def pool(ctx, a, ins, outs, kind: str):
    x = ins[0]
    if x.rank != 4:
        raise NotImplementedError(f"{kind} of rank {x.rank} (only 2-D pooling is lowered)")
    n, c, h, w = x.shape
    out_shape = outs[0].shape
    oh, ow = out_shape[2:]
    kh, kw = a["kernel_shape"]
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    b = x.block or 1
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")

    def src(i, co, y, xx, ci):
        iy, ix = y * sh - pt + rh * dh, xx * sw - pl + rw * dw
        ok = tirx.all(iy >= 0, iy < h, ix >= 0, ix < w)
        return ok, x.at((i, co * b + ci, iy, ix))

    if kind == "MaxPool":
        def body(*p):
            ok, v = src(*p)
            return te.max(tirx.if_then_else(ok, v, tirx.min_value(F32)), axis=[rh, rw])
        acc = compute((n, c // b, oh, ow, b), body, name="pool")
        res = Buf(acc, out_shape, F32, b) if x.block else _unblock(acc, out_shape)
        ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
        return [res]

    def body(*p):
        ok, v = src(*p)
        return te.sum(tirx.if_then_else(ok, v, const(0.0, F32)), axis=[rh, rw])
    acc = compute((n, c // b, oh, ow, b), body, name="pool")
    # the divisor per output position, known at compile time
    div = np.zeros((oh, ow), np.float32)
    for y in range(oh):
        y0 = y * sh - pt
        y1 = min(y0 + (kh - 1) * dh + 1, h + pb)
        for xx in range(ow):
            x0 = xx * sw - pl
            x1 = min(x0 + (kw - 1) * dw + 1, w + pr)
            if a["count_include_pad"]:
                cnt = (y1 - y0) * (x1 - x0)
            else:
                cnt = (min(y1, h) - max(y0, 0)) * (min(x1, w) - max(x0, 0))
            div[y, xx] = 1.0 / max(cnt, 1)
    accb = Buf(acc, out_shape, F32, b) if x.block else _unblock(acc, out_shape)
    uniform = np.all(div == div.flat[0])
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    if uniform:
        inv = float(div.flat[0])
        return [Lazy(out_shape, outs[0].dtype, lambda idx: accb.at(idx) * const(inv, F32))]
    dt = ctx.param(div, "pool_div", keep_dtype=True)
    return [Lazy(out_shape, outs[0].dtype, lambda idx: accb.at(idx) * dt[idx[2], idx[3]])]


def _unblock(acc, shape):
    """A block-1 NCHW1c accumulator viewed as plain NCHW (same memory order)."""
    return Buf(acc, shape, F32, 0)


def global_pool(ctx, a, ins, outs, kind: str):
    x = ins[0]
    if x.rank < 3:
        raise NotImplementedError(f"{kind} of rank {x.rank}")
    out_shape = outs[0].shape
    if x.rank != 4:
        xs = x.shape
        red = [te.reduce_axis((0, d), f"r{i}") for i, d in enumerate(xs[2:])]
        size = float(np.prod(xs[2:]))
        op = te.max if kind == "GlobalMaxPool" else te.sum
        acc = compute(xs[:2], lambda i, ch: op(x.at((i, ch, *red)), axis=red), name="pool")
        ctx.schedule("generic")
        accb = Buf(acc, out_shape, F32, 0)
        if kind == "GlobalMaxPool":
            return [accb]
        return [Lazy(out_shape, outs[0].dtype, lambda idx: accb.at(idx) * const(1.0 / size, F32))]
    n, c, h, w = x.shape
    b = x.block or 1
    rh, rw = te.reduce_axis((0, h), "rh"), te.reduce_axis((0, w), "rw")
    if kind == "GlobalMaxPool":
        acc = compute((n, c // b, 1, 1, b), lambda i, co, y, xx, ci: te.max(
            x.at((i, co * b + ci, rh, rw)), axis=[rh, rw]), name="pool")
        scale = None
    else:
        acc = compute((n, c // b, 1, 1, b), lambda i, co, y, xx, ci: te.sum(
            x.at((i, co * b + ci, rh, rw)), axis=[rh, rw]), name="pool")
        scale = 1.0 / (h * w)
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    accb = Buf(acc, out_shape, F32, b) if x.block else _unblock(acc, out_shape)
    if scale is None:
        return [accb]
    return [Lazy(out_shape, outs[0].dtype, lambda idx: accb.at(idx) * const(scale, F32))]
