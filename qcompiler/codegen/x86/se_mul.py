"""The x86-only squeeze-excite multiply: a QLinearMul of a blocked activation by a per-channel gate
in int32 arithmetic, scheduled by the ``se_mul`` rule of :mod:`.schedules`."""
from __future__ import annotations

from tvm import tirx

from ...ir.types import INT_RANGES
from ...quant.requant import activation_clamp
from ..kernels.tensor import Buf, Lazy, cast, compute

I32 = "int32"


def _qp(ctx, i):
    return ctx.op.operands[i].type.quant


SE_LANES = 16          # output bytes per vector iteration of the squeeze-excite multiply (one zmm of int32)
# x in blocks wider than this keeps the generic kernel: rapidocr-det's only SE multiply (1x192x10x10,
# NCHW32c, 19 K elements) cost 8 KB of model.so in the int32 form (32-lane loop and gate gather),
# past the int8 <= 0.3 x fp32 size bound (tests/quant/test_report.py), for ~3 us
SE_MAX_BLOCK = 16


def split_multiplier(m: int) -> tuple[int, int]:
    """``m = mh·2^16 + ml`` with ``ml`` in [-2^15, 2^15)."""
    ml = ((m + (1 << 15)) & 0xFFFF) - (1 << 15)
    return (m - ml) >> 16, ml


def se_mul(ctx, a, ins, out_type):
    """The squeeze-excite QLinearMul ``x (N x C x H x W, blocked NCHW{b}c) * gate (N x C x 1 x 1)``
    on x86 in int32 arithmetic, SE_LANES output bytes per vector iteration; None where it does not apply
    (the generic :func:`..kernels.quant.qmul` then runs).

    The reference is ``y = clamp(z_o + ((p·M + 2^(S-1)) >> S), lo, hi)`` with
    ``p = (x - z_x)(g - z_g)`` and a per-tensor multiplier ``M`` (int64 in the generic kernel: 8
    lanes of a zmm register). With ``M = Mh·2^16 + Ml``, ``Ml`` in [-2^15, 2^15), and ``S >= 17``::

        p·M + 2^(S-1) = (p·Mh + 2^(S-17))·2^16 + p·Ml
        floor(Z / 2^S) = floor(floor(Z / 2^16) / 2^(S-16))          (nested floor division)
        floor(Z / 2^16) = p·Mh + 2^(S-17) + floor(p·Ml / 2^16)      (the first term is an integer)

    so ``y = clamp(z_o + ((d·Gh + 2^(S-17) + ((d·Gl) >> 16)) >> (S-16)), lo, hi)`` with
    ``d = x - z_x`` and the per-channel ``Gh = (g - z_g)·Mh``, ``Gl = (g - z_g)·Ml`` computed once
    per channel. Every term is an exact int32 when ``P·2^15 < 2^31`` and
    ``P·|Mh| + 2^(S-17) + 2^15 < 2^31`` for ``P = max|x - z_x|·max|g - z_g|`` (checked here at
    compile time from the zero points and storage ranges; 255·255·2^15 < 2^31 always holds). The
    per-channel ``Gh``/``Gl`` are one stage [N, C/b, 2, R, b], replicated over R = SE_LANES/b
    columns, so that one vector iteration over R output columns of a channel block (the ``se_mul`` schedule) reads
    them with plain vector loads instead of a byte gather."""
    if (a.get("activation") or "") == "HardSwish" or ctx.sched[0] != "generic":
        return None
    if len(a["multiplier"]) != 1 or len(a["shift"]) != 1:
        return None
    shape = tuple(out_type.shape)
    if len(shape) != 4:
        return None
    full = [i for i, v in enumerate(ins) if tuple(v.shape) == shape]
    gate = [i for i, v in enumerate(ins) if tuple(v.shape) == (shape[0], shape[1], 1, 1)]
    if len(full) != 1 or len(gate) != 1:
        return None
    ix, ig = full[0], gate[0]
    X = ins[ix]
    b = getattr(X, "block", 0) if isinstance(X, Buf) else 0
    n, c, h, w = shape
    if not b or b > SE_MAX_BLOCK or c % b:
        return None
    m, s = int(a["multiplier"][0]), int(a["shift"][0])
    if s < 17 or s > 47:
        return None
    zx, zg = int(_qp(ctx, ix).zero_point[0]), int(_qp(ctx, ig).zero_point[0])
    lx, hx = INT_RANGES[ctx.op.operands[ix].type.quant.storage]
    lg, hg = INT_RANGES[ctx.op.operands[ig].type.quant.storage]
    big = max(abs(lx - zx), abs(hx - zx)) * max(abs(lg - zg), abs(hg - zg))
    mh, ml = split_multiplier(m)
    if big * (1 << 15) >= 1 << 31 or big * abs(mh) + (1 << (s - 17)) + (1 << 15) >= 1 << 31:
        return None
    r = max(1, SE_LANES // b)
    while w % r:
        r //= 2
    qp = out_type.quant
    lo, hi = activation_clamp(a.get("activation", "") or "", a.get("activation_params") or [], qp)
    G = ins[ig]            # read (a table lookup, possibly) only by the small stage below
    zgc = tirx.const(zg, I32)

    mhc, mlc = tirx.const(mh, I32), tirx.const(ml, I32)
    ghl = compute((n, c // b, 2, r, b), lambda i, co, k, _ri, ci: (cast(G.at((i, co * b + ci, 0, 0)), I32) - zgc)
                  * tirx.Select(k == 0, mhc, mlc), name="hoist_ghl")
    zxc, zo = tirx.const(zx, I32), tirx.const(int(qp.zero_point[0]), I32)
    rnd = tirx.const(1 << (s - 17), I32)
    lo_c, hi_c = tirx.const(lo, I32), tirx.const(hi, I32)
    ctx.schedule("se_mul", r=r)

    def fn(idx):
        i, ch, y, x = idx
        gh, gl = ghl[i, ch // b, 0, x % r, ch % b], ghl[i, ch // b, 1, x % r, ch % b]
        d = cast(X.at(idx), I32) - zxc
        t = tirx.shift_right(d * gl, tirx.const(16, I32))
        v = tirx.shift_right(d * gh + rnd + t, tirx.const(s - 16, I32)) + zo
        return tirx.max(tirx.min(v, hi_c), lo_c)
    return Lazy(shape, out_type.dtype, fn)
