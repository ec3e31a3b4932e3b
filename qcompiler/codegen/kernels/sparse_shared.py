"""One shape-generic sparse int8 pointwise-conv kernel shared by every layer that fits it, for
``--sparse-objective size``.

Why: a per-layer kernel costs 1.5-3 KB of machine code, as much as the weights of a 100 K-parameter
model's pointwise conv after pruning; on the Fashion-MNIST MobileNet the per-layer sparse kernels'
code alone kept the int8 artifact above 0.7x of the dense one at 90 % sparsity. Sparse libraries
are shape-generic for that reason (the CSR arrays carry N, the row lengths and the columns; the
kernel reads them at run time): here one PrimFunc with symbolic shapes serves every CSR-encoded
QLinearConv with a 1x1 kernel, unit strides, no padding and one group (the expand and project
convs of MobileNet blocks), with or without a fused residual QLinearAdd, for each combination of
storage dtypes, in any layout (a plain tensor is passed as its NCHW1c view). Everything of the
layer is ONE byte-array argument (:func:`pack`): its numbers ``sc`` (zero points, clamps, the
residual add's multipliers and shift, int64), the per-channel folded bias, multiplier and shift,
and the CSR arrays; the kernel reads them through typed views at offsets it computes from the
output's channel count. The size objective of
``encode-sparse`` knows this: such a layer as CSR adds no code (``sparse.cost.shares_kernel``).

The computation is that of :func:`.sparse.qconv2d` + :func:`.requant.requantized` (+ :func:`.quant.qadd`),
term for term, so the results are bit-exact with the dense and the per-layer sparse kernels::

    X[b, k, p]   = int16(x[b, k, p])                       p = h·W + w (1x1, unit stride: no im2col)
    acc[b, n, p] = Σ_{e in row n} int32(int16(values[e]) · X[b, col[e], p])      (exact, wraps mod 2^32)
    y1 = clamp(z1 + ((int64(acc + fold_n) · m_n + r_n) >> s_n), lo1, hi1)     r = 2^(s-1), 0 if s = 0
    residual:  y = clamp(z2 + (((y1 - zc)·mc + (res - zr)·mr + r2) >> s2), lo2, hi2)

(the int64 arithmetic-shift form of the requantization; the x86 per-layer kernels may use the
equivalent narrow form of :func:`.requant.narrow_shift_ok`, exact both). Loop nest: X re-laid out
as int16 tiles of ``TILE`` columns (columns >= P repeat column P-1), ``parallel for (b, k, tile)``
→ ``vectorized for t < TILE``; then ``parallel for (b, tile, row n)`` → ``for e in row n`` →
``vectorized for t < TILE``: ``acc[t] += values[e]·X[col(e), tile·TILE + t]`` (tiles outside rows,
so threads share an X tile, as :mod:`.sparse`), and the row's epilogue on its tile right there,
``LANES`` int64 lanes at a time (lanes past P recompute column P-1 and store the same value to
it, so no lane needs a branch). Every innermost loop is an explicit fixed-width vector: with
symbolic extents, scalar loops were auto-vectorized by LLVM into vector + remainder + run-time
check versions, 3.3-5.1 KB per function against ~2.5 KB now. Symbolic extents cost some speed
against the per-layer kernels, which is why only the size objective uses it.

Reference: Gale et al., "Sparse GPU Kernels for Deep Learning" (SC 2020) and XNNPACK's sparse
microkernels: row-wise SpMM over a dense operand whose columns are vectorized, shape-generic.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax, te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ...quant.requant import activation_clamp
from ...sparse import format as sfmt
from ...sparse.cost import shares_kernel
from . import qdot
from .requant import wrapping_add
from .tensor import cast

I16, I32, I64 = "int16", "int32", "int64"
TILE = 16                      # columns of X per tile: the int32 accumulators of one row (2 ymm, 4 q regs)
LANES = 4                      # int64 lanes of the requantization epilogue (one ymm, two q regs)
CONV_KINDS = ("QLinearConv",)
ADD_KIND = "QLinearAdd"


@dataclass(frozen=True)
class Key:
    """What the shared PrimFunc is specialized on (everything else is an argument)."""
    x_dtype: str
    out_dtype: str
    col_dtype: str
    ptr_dtype: str
    residual: str | None       # the residual operand's storage dtype (stored in the output's layout)


@dataclass
class Plan:
    key: Key
    x: object                  # the conv's input Value
    res: object | None         # the residual operand Value
    blob: np.ndarray           # the layer's constants packed into one uint8 array (:func:`pack`)
    out_block: int


def wanted(graph, op) -> bool:
    """Whether ``encode-sparse`` chose CSR for ``op`` under the size objective."""
    from .sparse import layer_entry, layer_format
    enc = layer_entry(graph, op).get("encoding") or {}
    return op.kind in CONV_KINDS and layer_format(graph, op) == "csr" and enc.get("objective") == "size"


def plan(low, g, members, stored, storage_dtype, root_block) -> Plan | None:
    """A :class:`Plan` when group ``g`` (``members`` in order) is a CSR pointwise QLinearConv under
    the size objective, optionally followed by a residual QLinearAdd, on the CPU; else None."""
    from ...ir import REGISTRY
    from .requant import folded_bias, per_channel
    if not members or not wanted(low.graph, members[0]):
        return None
    conv = members[0]
    if len(members) > 2 or (len(members) == 2 and members[1].kind != ADD_KIND):
        return None
    a = {**REGISTRY[conv.kind].defaults, **conv.attrs}
    x = conv.operands[0]
    w = conv.operands[1].data if conv.operands[1].is_const else None
    if x not in stored or w is None or not shares_kernel(conv.kind, a, w.shape, str(w.dtype), low.spec.family):
        return None
    if x.dtype not in ("uint8", "int8") or len(x.shape) != 4 or x.shape[0] < 1 or w.shape[1] != x.shape[1]:
        return None
    n = w.shape[0]
    m, s = np.asarray(per_channel(a["multiplier"], n), np.int64), np.asarray(per_channel(a["shift"], n), np.int64)
    if m.min() < -2 ** 31 or m.max() >= 2 ** 31 or s.min() < 0 or s.max() > 62:
        return None
    y1 = conv.results[0]
    q1 = y1.type.quant
    if q1 is None or len(q1.zero_point) != 1:
        return None
    lo1, hi1 = activation_clamp(a.get("activation", "") or "", a.get("activation_params") or [], q1)
    zx = int(conv.operands[0].type.quant.zero_point[0])
    bias = conv.operands[2].data if len(conv.operands) > 2 and conv.operands[2] is not None \
        and conv.operands[2].is_const else None
    fold = qdot.wrap_int32(folded_bias(w, bias, zx))
    enc = sfmt.encode(w.reshape(n, -1), "csr")
    ptr = enc.row_ptr.astype(np.uint16) if enc.row_ptr[-1] <= np.iinfo(np.uint16).max else enc.row_ptr
    sc = [int(q1.zero_point[0]), lo1, hi1]
    res = None
    root = y1
    if len(members) == 2:
        add = members[1]
        aa = {**REGISTRY[add.kind].defaults, **add.attrs}
        ops = list(add.operands)
        if len(ops) != 2 or sum(v is y1 for v in ops) != 1 or (aa.get("activation") or "") not in ("", "Relu", "Clip"):
            return None
        ci = 0 if ops[0] is y1 else 1
        res = ops[1 - ci]
        if res not in stored or tuple(res.shape) != tuple(y1.shape) or len(aa["multiplier"]) != 2:
            return None
        root = add.results[0]
        q2 = root.type.quant
        if q2 is None or len(q2.zero_point) != 1 or len(aa["shift"]) != 1 or not 0 <= int(aa["shift"][0]) <= 62:
            return None
        lo2, hi2 = activation_clamp(aa.get("activation", "") or "", aa.get("activation_params") or [], q2)
        zs = [int(v.type.quant.zero_point[0]) for v in ops]
        mm = [int(v) for v in aa["multiplier"]]
        sc += [zs[ci], mm[ci], zs[1 - ci], mm[1 - ci], int(aa["shift"][0]), int(q2.zero_point[0]), lo2, hi2]
    if root is not g.root:
        return None
    sdt = storage_dtype(root)
    if sdt not in ("uint8", "int8") or tuple(root.shape) != (x.shape[0], n, *x.shape[2:]):
        return None
    xs = stored[x]
    blk = root_block()
    if res is not None:
        rs = stored[res]
        if (rs.block or 0) != blk or rs.dtype not in ("uint8", "int8"):
            return None
    if xs.dtype != x.dtype or (blk and n % blk) or x.shape[1] % (xs.block or 1):
        return None
    key = Key(x.dtype, sdt, str(enc.col_idx.dtype), str(ptr.dtype), stored[res].dtype if res is not None else None)
    blob = pack(np.asarray(sc, np.int64), fold, m.astype(np.int32), ptr, s.astype(np.int8), enc.col_idx,
                enc.values.astype(np.int8))
    return Plan(key, x, res, blob, blk)


def _sizes(key: Key) -> tuple[int, int, int]:
    return 11 if key.residual else 3, np.dtype(key.ptr_dtype).itemsize, np.dtype(key.col_dtype).itemsize


def pack(sc, fold, m, ptr, shift, cols, values) -> np.ndarray:
    """One layer's constants as one byte array (one VM constant and one kernel argument instead of
    seven: each costs ~60 B of constant header, an argument slot in every call and a check in the
    kernel's wrapper), at the byte offsets of :func:`_offsets` (the VM allocates constants 64-byte
    aligned, so every section is aligned to its element size)::

        sc int64[3 | 11] · fold int32[N] · m int32[N] · row_ptr P[N+1] · shift int8[N] · pad · col C[nnz] · values int8[nnz]
    """
    arrays = [np.ascontiguousarray(a) for a in (sc, fold, m, ptr, shift, cols, values)]
    offs = _offsets(len(sc), len(fold), ptr.dtype.itemsize, cols.dtype.itemsize, len(cols), lambda a, b: a // b)
    out = np.zeros(offs[-1] + values.nbytes, np.uint8)
    for a, o in zip(arrays, offs):
        out[o:o + a.nbytes] = a.view(np.uint8)
    return out


def _offsets(n_sc, n, psz, csz, nnz, div) -> tuple:
    """Byte offsets of :func:`pack`'s sections (sc, fold, m, row_ptr, shift, col, values) for ``n``
    rows, ``psz``/``csz``-byte row pointers/columns and ``nnz`` entries; ``div``: integer division
    (Python's, or TIR's for the kernel's symbolic sizes), for the one alignment padding (col)."""
    o_fold = 8 * n_sc
    o_ptr = o_fold + 8 * n
    o_sh = o_ptr + psz * (n + 1)
    o_col = div(o_sh + n + (csz - 1), csz) * csz
    return 0, o_fold, o_fold + 4 * n, o_ptr, o_sh, o_col, o_col + csz * nnz


def _div(a, b):
    """``a // b`` for a, b >= 0 (every index here): C division, without floordiv's sign fix-ups."""
    return tirx.truncdiv(a, b)


def _mod(a, b):
    return tirx.truncmod(a, b)


def _unpack(bb, key: Key, n):
    """Views of the sections of :func:`pack`'s byte array ``bb`` for a layer of ``n`` rows."""
    n_sc, psz, csz = _sizes(key)
    dtypes = (I64, I32, I32, key.ptr_dtype, "int8", key.col_dtype, "int8")

    def view(i, offs):       # offs[i]: a byte offset, a multiple of the section's element size
        size = np.dtype(dtypes[i]).itemsize
        return T.decl_buffer((_div(bb.shape[0] - offs[i], size),), dtypes[i], data=bb.data,
                             elem_offset=_div(offs[i], size))
    rpb = view(3, _offsets(n_sc, n, psz, csz, 0, _div))          # the row pointers give nnz
    offs = _offsets(n_sc, n, psz, csz, T.bind(cast(rpb[n], I32)), _div)
    return tuple(rpb if i == 3 else view(i, offs) for i in range(7))


def _flat(buf):
    """A 1-D view of ``buf``'s data (the kernel computes flat offsets itself)."""
    n = 1
    for d in buf.shape:
        n = n * d
    return T.decl_buffer((n,), buf.dtype, data=buf.data)


def rank5(shape) -> tuple:
    """The NCHW{b}c shape the kernel sees for a stored shape: a plain NCHW tensor is the blocked
    form with b = 1 (same bytes, same flat offsets), passed as a reshaped view."""
    return tuple(shape) if len(shape) == 5 else (*shape, 1)


def build(key: Key):
    """The shared PrimFunc for ``key``: x, the residual and the output are NCHW{b}c with symbolic
    dims (a plain tensor comes as its :func:`rank5` view), read through 1-D views by flat offsets,
    so one function serves every layout."""
    n_blob = tirx.Var("n_blob", I32)
    x = te.placeholder(tuple(tirx.Var(f"x{i}", I32) for i in range(5)), key.x_dtype, name="x")
    y_shape = tuple(tirx.Var(f"y{i}", I32) for i in range(5))
    blob = te.placeholder((n_blob,), "uint8", name="sp")
    ins = [x, blob]
    if key.residual:
        ins.append(te.placeholder(y_shape, key.residual, name="res"))
    one, zero = tirx.const(1, I64), tirx.const(0, I64)

    def rq(v, s, z, lo, hi):
        rnd = tirx.Select(s > zero, tirx.shift_left(one, s - one), zero)
        return tirx.max(tirx.min(tirx.shift_right(v + rnd, s) + z, hi), lo)

    def body(bufs, outs):
        xb, bb = bufs[:2]
        resb = bufs[2] if key.residual else None
        (yb,) = outs
        xs, ys = list(xb.shape), list(yb.shape)
        nb, c_o, hw = xs[0], xs[1], xs[2] * xs[3]
        cbi = xs[4]
        n_o = ys[1]
        cbo = ys[4]
        nrows = n_o * cbo
        k = c_o * cbi
        ntile = _div(hw + (TILE - 1), TILE)
        with IRBuilder() as ib:
            with T.serial(0, 1):                     # a frame for the shared allocations
                xb = _flat(xb)
                yb = _flat(yb)
                resb = _flat(resb) if resb is not None else None
                scb, fb, mb, rpb, sb, cib, vb = _unpack(bb, key, nrows)
                xcol = T.alloc_buffer((nb * ntile * k * TILE,), I16)
                with T.parallel(0, nb * k * ntile) as q:      # X: int16 tiles of TILE columns
                    b, kk, t = _div(q, k * ntile), _mod(_div(q, ntile), k), _mod(q, ntile)
                    base = ((b * c_o + _div(kk, cbi)) * hw) * cbi + _mod(kk, cbi)
                    with T.vectorized(0, TILE) as i:
                        src = base + tirx.min(t * TILE + i, hw - 1) * cbi
                        T.buffer_store(xcol, cast(xb[src], I16), [((b * ntile + t) * k + kk) * TILE + i])
                with T.parallel(0, nb * ntile * nrows) as q:   # rows of W against one X tile
                    b, t, r = _div(q, ntile * nrows), _mod(_div(q, nrows), ntile), _mod(q, nrows)
                    acc = T.alloc_buffer((TILE,), I32)      # "global": a stack array (LowerTVMBuiltin)
                    with T.vectorized(0, TILE) as i:
                        T.buffer_store(acc, tirx.const(0, I32), [i])
                    with T.serial(cast(rpb[r], I32), cast(rpb[r + 1], I32)) as e:
                        wv = cast(vb[e], I16)
                        row = ((b * ntile + t) * k + cast(cib[e], I32)) * TILE
                        with T.vectorized(0, TILE) as i:
                            T.buffer_store(acc, acc[i] + cast(xcol[row + i] * wv, I32), [i])
                    # the epilogue on this row's tile, LANES columns at a time
                    co, cb = _div(r, cbo), _mod(r, cbo)
                    fold_r, m_r, s_r = cast(fb[r], I32), cast(mb[r], I64), cast(sb[r], I64)
                    with T.serial(0, _div(tirx.min(hw - t * TILE, TILE) + (LANES - 1), LANES)) as j:
                        with T.vectorized(0, LANES) as i:
                            p = tirx.min(t * TILE + j * LANES + i, hw - 1)
                            a32 = wrapping_add(acc[j * LANES + i], fold_r)   # not a uint32 add: TVM emits it `nuw`
                            y = rq(cast(a32, I64) * m_r, s_r, scb[0], scb[1], scb[2])
                            off = ((b * n_o + co) * hw + p) * cbo + cb
                            if resb is not None:
                                v = (y - scb[3]) * scb[4] + (cast(resb[off], I64) - scb[5]) * scb[6]
                                y = rq(v, scb[7], scb[8], scb[9], scb[10])
                            T.buffer_store(yb, cast(y, key.out_dtype), [off])
        return ib.get()
    out = te.extern(y_shape, ins, body, name="sparse_shared", dtype=key.out_dtype)
    func = te.create_prim_func(ins + [out])
    return func.with_attr("tirx.is_scheduled", True)


def relax_args(p: Plan, stored) -> list:
    args = [stored[p.x].expr, relax.const(p.blob, "uint8")]
    if p.res is not None:
        args.append(stored[p.res].expr)
    return args
