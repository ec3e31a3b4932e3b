"""Sparse-weight gemm and convolution: ``Y = W_sparse · X`` with W in CSR, BSR (1x4 or 4x1 blocks) or
2:4, for fp32 and int8 (uint8/int8 activations, int8 weights, int32 accumulation, the requantization
epilogue of :mod:`.quant`).

The weight arrays are those of :mod:`qcompiler.sparse.format` (``row_ptr`` int32, ``col_idx``
uint8/uint16, ``values`` int8/float32, 2:4 ``idx`` with four 2-bit positions per byte), passed to the
kernel as they are (compile-time constants): the artifact stores the compact encoding, not a dense
copy. A conv is a gemm on its im2col matrix (format.conv_matrices: ``W_j [O/g, C/g·kh·kw]`` per group
``j``; the groups' encodings are concatenated row-wise and row ``n`` reads the rows of X of group
``n // (O/g)``)::

    X[b, j·Kp + (c·kh + r)·kw + s, y·OW + x] = x[b, j·C/g + c, y·sh - pt + r·dh, x·sw - pl + s·dw]
    Y[b, n, p] = Σ_{e in row n} values[e] · X[b, group(n)·Kp + col(e), p]

(a 1x1 conv with unit strides and no padding needs no im2col: ``X[b] = x[b].reshape(C, H·W)``,
re-laid out in column tiles like any X; padding pixels hold 0, or the zero point for int8, exactly
as in the dense kernels.) A gemm ``A (M x K) · W^T`` is the same with ``X[0] = A^T`` (P = M).

Kernel (one ``te.extern`` stage between the X stage and the fused epilogue): on CPUs the loop nest
is ``parallel for (b, P tile, row n)`` → ``for e in row n`` → ``vectorized for t < T``:
``acc[t] += values[e] · X[k(e), p0 + t]``, i.e. the sparse row is broadcast against contiguous
vectors of X (the batch or spatial axis; T = 4 vectors, 2 for BSR 4x1), the accumulators of one
tile stay in registers, and the P tiles are outside the rows so that the threads reuse one tile of
X (T x K) across all rows (rows outside tiles re-read all of X per row: measured 1.7x slower on
the 56x56 conv's sparse stage). BSR 1x4 unrolls the 4 columns of a block (one index per 4 MACs), BSR 4x1 keeps
4 rows of accumulators (one X vector load per 4 MACs), 2:4 decodes one index byte per 4 slots (no
row pointers). int8 BSR 1x4 on x86 with VNNI runs on ``vpdpbusd`` instead (:meth:`_Kernel.cpu_vnni`:
X packed with 4 consecutive k of a column in one uint8x4 word, a block's 4 weights one broadcast
word, 16 columns x 4 MACs per instruction, the dense qdot kernels' instruction; int8 activations
stored x ^ 0x80 with zero point z + 128, as in :mod:`.qdot`). With P == 1 (a batch-1 gemm, a GEMV) the row is instead split into ``V``
interleaved partial sums vectorized over the non-zeros (gathers of x), summed at the end. On CUDA
one thread computes one (b, n, p) output (a warp reads consecutive p of the same X row,
coalesced; the row's weights broadcast). The x86 schedule of the X and epilogue stages is
:data:`..x86.rules.SPARSE` (parallel outer, vectorized inner; the im2col pixel loop split by the output
width so that it reads contiguous input rows).

Exactness: the int8 accumulator is ``Σ x·w`` over the stored integers, the same integer as the
dense kernels' (zeros contribute nothing), and the zero point, the bias and the requantization
are the dense kernels' own epilogue (:func:`.requant.requantized`): results are bit-exact. Two ways to form that sum: while ``max|x| · max_n Σ_k |w[n, k]| < 2^24`` (checked at
compile time, :func:`.conv.exact_f32_bound`) X is stored as float32 and the sum runs on float32
FMAs (every partial sum is an integer below 2^24, so exact; 16 lanes per FMA instead of a
widen-multiply-widen-add chain per 16 int16 products); past the bound, products are formed in
int16 (|x·w| <= 255·128) and summed in int32 (wrap-around is modular and the true sum fits).
fp32 sums the same non-zero products in another order (error ~ K·eps·Σ|x·w|).

References: Saad, *Iterative Methods for Sparse Linear Systems* (2003), sec. 3.4 (CSR/BSR SpMV);
Gale et al., "Sparse GPU Kernels for Deep Learning" (SC 2020) — row-wise SpMM with the dense
operand's columns vectorized; Mishra et al., arXiv:2104.08378 (2:4).
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ...ir.types import INT_RANGES
from ...sparse import format as sfmt
from ..intrin import ACC_SCOPE
from ..target import Family
from . import qdot
from .conv import F32_EXACT, _attrs2d, _epilogue, exact_f32_bound
from .linalg import gemm_epilogue
from .requant import requantized
from .tensor import Buf, Lazy, cast, compute, const

I16, I32, F32 = "int16", "int32", "float32"
FORMATS = ("csr", "bsr1x4", "bsr4x1", "2:4")
KINDS = frozenset({"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "QLinearConv", "QLinearGemm"})
CUDA_THREADS = 256


# ---- which layers are sparse --------------------------------------------------------------------
def layer_entry(graph, op) -> dict:
    """``op``'s entry of ``graph.meta["sparsity"]`` (the ``encode-sparse`` pass's record; {} if none).

    Accepted: ``meta["sparsity"]["layers"][op_name]`` (a dict, or a bare format string), entries
    keyed without ``"layers"``, or a list of entries with a ``"name"`` (or the layer's ``"weight"``
    name)."""
    meta = graph.meta.get("sparsity") if hasattr(graph, "meta") else None
    if not meta:
        return {}
    layers = meta.get("layers", meta) if isinstance(meta, dict) else meta
    if isinstance(layers, dict):
        entries = [dict(v, name=k) if isinstance(v, dict) else {"name": k, "format": v} for k, v in layers.items()]
    else:
        entries = [e for e in layers if isinstance(e, dict)]
    wname = op.operands[1].name if len(op.operands) > 1 and op.operands[1] is not None else None
    for e in entries:
        if e.get("name") == op.name or e.get("op") == op.name or (wname and e.get("weight") == wname):
            return e
    return {}


def layer_format(graph, op) -> str | None:
    """The sparse format ``graph.meta["sparsity"]`` assigns to ``op`` (None: dense): the entry's
    ``"encoding"]["format"]`` (``"dense"``, ``"csr"``, ``"bsr1x4"``, ``"bsr4x1"``, ``"2:4"``) or a
    ``"format"`` on the entry itself (:func:`layer_entry`)."""
    if op.kind not in KINDS:
        return None
    e = layer_entry(graph, op)
    fmt = e.get("format") or (e.get("encoding") or {}).get("format")
    return fmt if fmt in FORMATS else None


# ---- encodings ----------------------------------------------------------------------------------
def encode_groups(mats: np.ndarray, fmt: str):
    """Encode each group's ``[N/g, K]`` matrix and concatenate them row-wise into one encoding of
    ``[N, K]`` rows (row pointers offset, values stacked); BSR 4x1 groups must hold a multiple of
    4 rows (else the blocks would straddle groups)."""
    if fmt == "2:4" and not all(sfmt.is_24(m) for m in mats):
        raise NotImplementedError("graph.meta['sparsity'] asks for 2:4 but the weight is not 2:4 sparse "
                                  "(prune with --sparsity-pattern 2:4)")
    encs = [sfmt.encode(m, fmt) for m in mats]
    if len(encs) == 1:
        return encs[0]
    n = sum(e.shape[0] for e in encs)
    k = encs[0].shape[1]
    if isinstance(encs[0], sfmt.NM24):
        return sfmt.NM24((n, k), np.concatenate([e.values for e in encs]), np.concatenate([e.idx for e in encs]))
    if fmt == "bsr4x1" and mats.shape[1] % 4:
        raise NotImplementedError(f"bsr4x1 of a grouped conv with {mats.shape[1]} rows per group")
    ptrs, off = [np.zeros(1, np.int32)], 0
    for e in encs:
        ptrs.append((e.row_ptr[1:] + off).astype(np.int32))
        off += int(e.row_ptr[-1])
    rp = np.concatenate(ptrs)
    ci = np.concatenate([e.col_idx for e in encs])
    vals = np.concatenate([e.values for e in encs])
    if isinstance(encs[0], sfmt.CSR):
        return sfmt.CSR((n, k), rp, ci, vals)
    return sfmt.BSR((n, k), encs[0].block, rp, ci, vals)


def padded_k(fmt: str, k: int) -> int:
    """Rows of X per group the kernel reads (K padded to the 4-column blocks/groups)."""
    return -(-k // 4) * 4 if fmt in ("bsr1x4", "2:4") else k


# ---- the accumulation kernel --------------------------------------------------------------------
def spmm(ctx, X: te.Tensor, enc, *, groups: int, kp: int, integer: bool, name="sparse") -> te.Tensor:
    """``Y[b, n, p] = Σ_k W[n, k] X[b, group(n)·kp + k, p]`` as a ``te.extern`` stage.

    ``X`` is (nb, P/T, groups·kp, T) (tiles of T columns, :func:`_packed`), or (nb, groups·kp/4,
    P) int32 words of 4 uint8 for the VNNI BSR 1x4 kernel. Returns Y (nb, Nr, P padded to whole
    tiles): int32 for integer X, float32 for a float32 X (also with int8 weights: the
    exact-float32 integer mode); Nr = N rounded up to the 4-row blocks for BSR 4x1 (rows >= N
    hold zeros).
    """
    fmt = enc.fmt
    n_rows, _ = enc.shape
    packed = len(X.shape) == 4                 # (nb, P/T, rows, T): tiles of T columns, contiguous
    nb = int(X.shape[0])
    p_len = int(X.shape[1]) * int(X.shape[3]) if packed else int(X.shape[-1])
    rows_per_group = n_rows // groups
    arrs = sfmt.arrays(enc)
    vnni = X.dtype == I32
    if vnni:                                   # BSR 1x4 on vpdpbusd: a block's 4 int8 weights = one word
        arrs = dict(arrs, values=np.ascontiguousarray(arrs["values"]).reshape(-1).view(np.int32))
    if fmt == "2:4":
        params = [ctx.param(arrs["values"], "sp_values", keep_dtype=True), ctx.param(arrs["idx"], "sp_idx")]
    else:
        params = [ctx.param(arrs["row_ptr"], "sp_row_ptr"), ctx.param(arrs["col_idx"], "sp_col_idx"),
                  ctx.param(arrs["values"], "sp_values", keep_dtype=True)]
    rb = 4 if fmt == "bsr4x1" else 1
    nr = -(-n_rows // rb) * rb
    acc_dtype = I32 if integer and X.dtype != F32 else F32
    lanes = getattr(qdot.isa_of(ctx), "lanes", 0) if vnni else 0
    family = ctx.spec.family
    vw = ctx.vw
    ptile = int(X.shape[3]) if packed else 0
    read = (lambda buf, b, k, p: buf[b, p // ptile, k, p % ptile]) if packed else (lambda buf, b, k, p: buf[b, k, p])

    def mac(acc, w, x):
        if acc_dtype == I32:
            return acc + cast(cast(x, I16) * cast(w, I16), I32)
        return acc + cast(w, F32) * cast(x, F32)

    def body(ins, outs):
        xb, *wb = ins
        (yb,) = outs
        k = _Kernel(fmt, wb, xb, yb, read, mac, acc_dtype, groups, rows_per_group, kp // 4 if vnni else kp,
                    rb, nr, nb, p_len)
        k.ptile = ptile
        stmts = []
        for part in ([k.cuda] if family is Family.CUDA else [lambda: k.cpu_vnni(lanes)] if vnni else k.cpu(vw)):
            with IRBuilder() as ib:
                part()
            stmts.append(ib.get())
        return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)

    return te.extern((nb, nr, p_len), [X, *params], body, name=name, dtype=acc_dtype)


class _Kernel:
    """IR-builder emitters of the loop nests described in the module docstring."""

    def __init__(self, fmt, wb, xb, yb, read, mac, acc_dtype, groups, rows_per_group, kp, rb, nr, nb, p_len):
        self.groups = groups
        self.ptile = 0
        self.fmt, self.wb, self.xb, self.yb = fmt, wb, xb, yb
        self.read, self.mac, self.dt = read, mac, acc_dtype
        self.rpg, self.kp, self.rb, self.nr, self.nb, self.p = rows_per_group, kp, rb, nr, nb, p_len

    def zero(self):
        return tirx.const(0, self.dt)

    def xrow(self, n, k):
        """Row of X for column k of weight row n (the group offset added)."""
        k = cast(k, I32)
        return (n // self.rpg) * self.kp + k if self.groups > 1 else k

    def row_terms(self, n, each):
        """Call ``each(r, w, k, loop_emitter)`` for every stored weight of block row ``n`` by
        emitting the format's loop over it; ``r`` is the row within the block (BSR 4x1)."""
        fmt, wb = self.fmt, self.wb
        if fmt == "2:4":
            vals, idx = wb
            slots = int(vals.shape[1])
            full = slots // 4
            with T.serial(0, full) as q:
                byte = cast(idx[n, q], I32)
                for u in range(4):
                    pos = tirx.bitwise_and(tirx.shift_right(byte, tirx.const(2 * u, I32)), tirx.const(3, I32))
                    each(0, vals[n, q * 4 + u], (q * 2 + u // 2) * 4 + pos)
            for u in range(slots - full * 4):          # the last byte's 2 used slots
                s = full * 4 + u
                pos = tirx.bitwise_and(tirx.shift_right(cast(idx[n, full], I32), tirx.const(2 * u, I32)),
                                       tirx.const(3, I32))
                each(0, vals[n, s], (s // 2) * 4 + pos)
            return
        rp, ci, vals = wb
        with T.serial(rp[n], rp[n + 1]) as e:
            col = cast(ci[e], I32)
            if fmt == "csr":
                each(0, vals[e], col)
            elif fmt == "bsr1x4":
                for c in range(4):
                    each(0, vals[e, 0, c], col * 4 + c)
            else:                                       # bsr4x1
                for r in range(4):
                    each(r, vals[e, r, 0], col)

    def cpu(self, vw: int) -> list:
        """The CPU loop nests, as callbacks emitting one statement each."""
        nblk = self.nr // self.rb
        if self.p == 1 and self.rb == 1:
            return [lambda: self.cpu_gemv(vw)]
        if self.ptile:
            tile = self.ptile
        else:
            tile = min(self.p, 4 * vw if self.rb == 1 else 2 * vw)
        nfull, tail = divmod(self.p, tile)

        def nest(size, count, base):
            # P tiles outside, rows inside: the threads share one tile of X (tile x K) across rows
            with T.parallel(0, self.nb * count * nblk) as q:
                b, t, nbk = q // (count * nblk), (q // nblk) % count, q % nblk
                self._tile(b, nbk, base + t * size, size, t if self.ptile else None)
        return [lambda size=size, count=count, base=base: nest(size, count, base)
                for size, count, base in ((tile, nfull, 0), (tail, 1, nfull * tile)) if size and count]

    def _tile(self, b, nbk, p0, size, t_packed=None):
        rb = self.rb
        acc = T.alloc_buffer((rb, size), self.dt, scope=ACC_SCOPE)
        for r in range(rb):
            with T.vectorized(0, size) as t:
                T.buffer_store(acc, self.zero(), [r, t])
        row0 = nbk * rb

        def each(r, w, k):
            with T.vectorized(0, size) as t:
                xv = (self.xb[b, t_packed, self.xrow(row0 + r, k), t] if t_packed is not None
                      else self.read(self.xb, b, self.xrow(row0 + r, k), p0 + t))
                T.buffer_store(acc, self.mac(acc[r, t], w, xv), [r, t])
        self.row_terms(nbk, each)
        for r in range(rb):
            with T.vectorized(0, size) as t:
                T.buffer_store(self.yb, acc[r, t], [b, row0 + r, p0 + t])

    def cpu_vnni(self, lanes: int):
        """BSR 1x4 int8 on ``vpdpbusd``: X holds 4 consecutive k of one column p as one int32
        word (uint8 bytes), a block's 4 weights are one int32 word broadcast to all lanes, and one
        instruction adds the 4 products of each of ``lanes`` columns (Intel SDM, VPDPBUSD).
        Tiles of 4 registers of columns (P is padded to a multiple of ``lanes``)."""
        from ..x86.intrin import VNNI_LLVM
        rp, ci, vals = self.wb
        regs = _vnni_tile(self.p, lanes)[1]
        tile = regs * lanes
        ntiles = self.p // tile
        vec, bytes_ = f"int32x{lanes}", f"int8x{4 * lanes}"
        intrin = VNNI_LLVM[lanes]
        nblk = self.nr
        with T.parallel(0, self.nb * ntiles * nblk) as q:
            b, t, n = q // (ntiles * nblk), (q // nblk) % ntiles, q % nblk
            acc = T.alloc_buffer((tile,), I32, scope=ACC_SCOPE)
            with T.vectorized(0, tile) as i:
                T.buffer_store(acc, self.zero(), [i])
            with T.serial(rp[n], rp[n + 1]) as e:
                w = tirx.reinterpret(bytes_, tirx.Broadcast(vals[e], lanes))
                k4 = self.xrow(n, ci[e])
                for r in range(regs):
                    at = tirx.Ramp(r * lanes, 1, lanes)
                    x = tirx.reinterpret(bytes_, self.xb.vload([b, k4, t * tile + r * lanes], vec))
                    T.buffer_store(acc, tirx.call_llvm_pure_intrin(vec, intrin, acc.vload([r * lanes], vec), x, w),
                                   [at])
            with T.vectorized(0, tile) as i:
                T.buffer_store(self.yb, acc[i], [b, n, t * tile + i])

    def cpu_gemv(self, vw: int):
        """P == 1: V interleaved partial sums over the row's non-zeros (vectorized gathers)."""
        nrows = self.nr
        with T.parallel(0, self.nb * nrows) as q:
            b, n = q // nrows, q % nrows
            if self.fmt == "2:4":
                acc = T.alloc_buffer((1,), self.dt, scope=ACC_SCOPE)
                T.buffer_store(acc, self.zero(), [0])
                self.row_terms(n, lambda r, w, k: T.buffer_store(
                    acc, self.mac(acc[0], w, self.read(self.xb, b, self.xrow(n, k), 0)), [0]))
                T.buffer_store(self.yb, acc[0], [b, n, 0])
                return
            rp, ci, vals = self.wb
            v = vw
            per = 4 if self.fmt == "bsr1x4" else 1
            acc = T.alloc_buffer((v * per,), self.dt, scope=ACC_SCOPE)
            with T.vectorized(0, v * per) as t:
                T.buffer_store(acc, self.zero(), [t])
            start, count = rp[n], rp[n + 1] - rp[n]
            with T.serial(0, count // v) as j:
                with T.vectorized(0, v) as t:
                    e = start + j * v + t
                    for c in range(per):
                        col = cast(ci[e], I32) * per + c
                        w = vals[e] if per == 1 else vals[e, 0, c]
                        T.buffer_store(acc, self.mac(acc[c * v + t], w, self.read(self.xb, b, self.xrow(n, col), 0)),
                                       [c * v + t])
            with T.serial(start + (count // v) * v, rp[n + 1]) as e:
                for c in range(per):
                    col = cast(ci[e], I32) * per + c
                    w = vals[e] if per == 1 else vals[e, 0, c]
                    T.buffer_store(acc, self.mac(acc[0], w, self.read(self.xb, b, self.xrow(n, col), 0)), [0])
            with T.serial(1, v * per) as t:
                T.buffer_store(acc, acc[0] + acc[t], [0])
            T.buffer_store(self.yb, acc[0], [b, n, 0])

    def cuda(self):
        """One thread per output (b, block row, p); a block of CUDA_THREADS threads."""
        nblk = self.nr // self.rb
        total = self.nb * nblk * self.p
        with T.thread_binding(0, -(-total // CUDA_THREADS), "blockIdx.x") as bx:
            with T.thread_binding(0, CUDA_THREADS, "threadIdx.x") as tx:
                i = bx * CUDA_THREADS + tx
                with T.If(i < total):
                    with T.Then():
                        p = i % self.p
                        nbk = (i // self.p) % nblk
                        b = i // (self.p * nblk)
                        acc = T.alloc_buffer((self.rb,), self.dt, scope="local")
                        for r in range(self.rb):
                            T.buffer_store(acc, self.zero(), [r])
                        row0 = nbk * self.rb
                        self.row_terms(nbk, lambda r, w, k: T.buffer_store(
                            acc, self.mac(acc[r], w, self.read(self.xb, b, self.xrow(row0 + r, k), p)), [r]))
                        for r in range(self.rb):
                            T.buffer_store(self.yb, acc[r], [b, row0 + r, p])


# ---- builders: the layers graph.meta["sparsity"] marks (lower.py) --------------------------------
def _zp(ctx, i) -> int:
    return int(ctx.op.operands[i].type.quant.zero_point[0])


def _int_mode(x_dtype: str, w: np.ndarray) -> str:
    """The dtype X is stored in for an int8 layer: float32 (the exact-float32 mode: every partial
    sum is an integer below 2^24 in magnitude, max|x|·max_n Σ_k |w[n, k]| < 2^24, so FMAs on
    float32 compute the integer sum exactly, at 16 lanes per FMA instead of int16 products
    widened to int32) or the stored activation dtype (int16 products, int32 sums)."""
    return F32 if exact_f32_bound(x_dtype, w) < F32_EXACT else x_dtype


def column_tile(ctx, p: int, fmt: str) -> int:
    """T, the columns of one tile of X (and of the kernel's register accumulators): 4 vectors
    (2 for BSR 4x1's 4 rows), fewer when P is small; 1 for a GEMV."""
    if p == 1:
        return 1
    vw = 8 if ctx.spec.family is Family.CUDA else ctx.vw
    return min((2 if fmt == "bsr4x1" else 4) * vw, -(-p // vw) * vw)


def _packed(nb: int, rows: int, p: int, tile: int, elem) -> te.Tensor:
    """X as (nb, ceil(P/T), rows, T): the T columns of a tile contiguous for every row, so the
    tile x rows block the threads share is one contiguous run (fewer TLB misses than rows P apart:
    the CSR stage alone on the 56x56 conv's X measured 1.5x faster; the whole conv kernel, whose
    im2col stage then computes pixel coordinates per lane, within the noise of the loaded
    machine, 2.75 vs 2.58 ms int8, 3.79 vs 3.43 ms fp32 at 90 %). Columns >= P repeat column P-1."""
    return compute((nb, -(-p // tile), rows, tile),
                   lambda b, t, k, i: elem(b, k, tirx.min(t * tile + i, p - 1)), name="xcol")


def _gemm_x(ctx, A, k: int, kp: int, fill, dtype: str, fmt: str) -> te.Tensor:
    """X = A^T packed in tiles, rows k >= K holding ``fill``."""
    m = A.shape[0]
    f = const(fill, dtype)

    def elem(b, kk, i):
        if kp == k:
            return cast(A.at((i, kk)), dtype)
        return tirx.if_then_else(kk < k, cast(A.at((i, tirx.min(kk, k - 1))), dtype), f)
    return _packed(1, kp, m, column_tile(ctx, m, fmt), elem)


def _gemm_operands(ctx, a, ins):
    """(A as a logical (M, K) tensor, W [N, K]) of a Gemm/FusedGemm/MatMul with a constant 2-D
    weight, or None when the layer is not a plain dense layer."""
    from .linalg import _transposed
    from .tensor import linearize, unravel
    A = ins[0]
    b = ctx.const_data(1)
    if b is None or b.ndim != 2:
        return None
    if ctx.op.kind == "MatMul":
        if A.rank < 2:
            return None
        k = A.shape[-1]
        mm = int(np.prod(A.shape[:-1]))
        src = A
        A2 = A if A.rank == 2 else Lazy((mm, k), A.dtype, lambda idx: src.at(unravel(linearize(idx, (mm, k)), src.shape)))
        return A2, np.ascontiguousarray(b.T)
    if a.get("transA"):
        A = _transposed(A)
    return A, np.ascontiguousarray(sfmt.gemm_matrix(b, a.get("transB", 0)))


def gemm(ctx, a, ins, outs, fmt: str):
    """Gemm / FusedGemm / MatMul (float) with a sparse constant weight; None if not applicable."""
    got = _gemm_operands(ctx, a, ins)
    if got is None:
        return None
    A, w = got
    kk = w.shape[1]
    kp = padded_k(fmt, kk)
    enc = encode_groups(w[None].astype(np.float32), fmt)
    Y = spmm(ctx, _gemm_x(ctx, A, kk, kp, 0.0, F32, fmt), enc, groups=1, kp=kp, integer=False)
    ctx.schedule("sparse")
    out_shape = outs[0].shape
    lead = out_shape[:-1]

    def acc_at(idx):
        from .tensor import linearize
        row = linearize(idx[:-1], lead) if len(lead) > 1 else idx[0]
        return Y[0, idx[-1], row]
    if ctx.op.kind == "MatMul":
        return [Lazy(out_shape, outs[0].dtype, acc_at)]
    C = ins[2] if len(ins) > 2 else None
    return [gemm_epilogue(a, C, acc_at, out_shape, outs[0].dtype)]


def qgemm(ctx, a, ins, outs, fmt: str):
    """QLinearGemm with a sparse int8 weight: the accumulator of :func:`spmm`, then the zero-point
    fold and requantization of :func:`.requant.requantized` (bit-exact with the dense kernel)."""
    A = ins[0]
    w = ctx.const_data(1)                                   # N x K
    if w is None:
        return None
    za = _zp(ctx, 0)
    bias = ctx.const_data(2)
    m = outs[0].shape[0]
    kk = w.shape[1]
    kp = padded_k(fmt, kk)
    isa = _vnni_isa(ctx, fmt, A.dtype)
    if isa is not None:
        za = qdot.effective_zp(isa, A.dtype, za)
        fill = const(za, A.dtype) if A.dtype == "uint8" else const(za - 128, A.dtype)
        X = _pack4(isa, lambda b, k, p: tirx.if_then_else(k < kk, A.at((p, tirx.min(k, kk - 1))), fill),
                   1, kp, m, A.dtype)
    else:
        X = _gemm_x(ctx, A, kk, kp, za, _int_mode(A.dtype, w), fmt)
    Y = spmm(ctx, X, encode_groups(w[None], fmt), groups=1, kp=kp, integer=True)
    ctx.schedule("sparse")
    return [requantized(ctx, a, outs[0], w, bias, za, lambda idx: cast(Y[0, idx[1], idx[0]], I32))]


def _conv_x(ctx, a, x, w_shape, out_shape, kp: int, fill, dtype: str, fmt: str, vnni=None) -> te.Tensor:
    """The im2col matrix, packed in tiles (:func:`_packed`), or with ``vnni`` (the DotIsa) packed 4
    k per word for :meth:`_Kernel.cpu_vnni`. A 1x1 unit-stride unpadded conv has no k x k
    expansion: its X is the input re-laid out."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w_shape
    g = c // cg
    (sh, sw), (dh, dw), (pt, pl, _, _) = _attrs2d(a)
    oh, ow = out_shape[2:]
    kg = cg * kh * kw
    f = const(fill, dtype)

    def elem(b, k, p):
        j, kk = (k // kp, k % kp) if g > 1 else (0, k)
        ci, r, s = kk // (kh * kw), (kk // kw) % kh, kk % kw
        y, xx = p // ow, p % ow
        iy, ix = y * sh - pt + r * dh, xx * sw - pl + s * dw
        ok = [iy >= 0, iy < h, ix >= 0, ix < wd] if (pt or pl or kh > 1 or kw > 1) else []
        if kp != kg:
            ok.append(kk < kg)
        ch = j * cg + tirx.min(ci, cg - 1)
        v = cast(x.at((b, ch, tirx.max(tirx.min(iy, h - 1), 0), tirx.max(tirx.min(ix, wd - 1), 0))), dtype)
        return tirx.if_then_else(tirx.all(*ok), v, f) if ok else v
    if vnni is not None:
        return _pack4(vnni, elem, n, g * kp, oh * ow, x.dtype)
    return _packed(n, g * kp, oh * ow, column_tile(ctx, oh * ow, fmt), elem)


def _pack4(isa, elem, nb: int, k: int, p: int, src_dtype: str) -> te.Tensor:
    """X for :meth:`_Kernel.cpu_vnni`: (nb, k/4, P padded to the VNNI tile) int32 words whose
    bytes are the 4 consecutive-k elements ``elem(b, k, p)`` as vpdpbusd's uint8 operand."""
    ppad = _vnni_tile(p, isa.lanes)[0]

    def body(b, k4, q):
        pq = tirx.min(q, p - 1)
        word = tirx.const(0, "uint32")
        for c in range(4):
            byte = cast(qdot._to_a(isa, elem(b, k4 * 4 + c, pq), src_dtype), "uint32")
            word = tirx.bitwise_or(word, tirx.shift_left(byte, tirx.const(8 * c, "uint32")))
        return tirx.reinterpret(I32, word)
    return compute((nb, k // 4, ppad), body, name="xcol")


def _vnni_tile(p: int, lanes: int) -> tuple[int, int]:
    """(P padded to whole vectors, registers per tile: the largest r <= 4 dividing them)."""
    ppad = -(-p // lanes) * lanes
    regs = max(r for r in range(1, 5) if (ppad // lanes) % r == 0)
    return ppad, regs


def _vnni_isa(ctx, fmt: str, x_dtype: str):
    """The x86 VNNI DotIsa when BSR 1x4 int8 runs on vpdpbusd, else None."""
    isa = qdot.isa_of(ctx)
    ok = (fmt == "bsr1x4" and isa is not None and isa.kind == "vnni" and x_dtype in ("uint8", "int8")
          and ctx.spec.family is Family.X86)
    return isa if ok else None


def _conv_acc(ctx, a, x, w, outs, fmt, fill, dtype, integer, vnni=None):
    o, cg = w.shape[:2]
    g = x.shape[1] // cg
    out_shape = outs[0].shape
    kp = padded_k(fmt, cg * w.shape[2] * w.shape[3])
    X = _conv_x(ctx, a, x, w.shape, out_shape, kp, fill, dtype, fmt, vnni)
    enc = encode_groups(sfmt.conv_matrices(w, g), fmt)
    Y = spmm(ctx, X, enc, groups=g, kp=kp, integer=integer)
    ow = out_shape[3]
    ctx.schedule("sparse")
    return Lazy(out_shape, I32 if integer else F32,
                lambda idx: cast(Y[idx[0], idx[1], idx[2] * ow + idx[3]], I32 if integer else F32))


def conv2d(ctx, a, ins, outs, fmt: str):
    """Conv / FusedConv (float) with a sparse constant weight: im2col + :func:`spmm`, then the
    dense kernel's epilogue (bias, residual, activation)."""
    x, w = ins[0], ctx.const_data(1)
    if w is None or x.rank != 4:
        return None
    acc = _conv_acc(ctx, a, x, w.astype(np.float32), outs, fmt, 0.0, F32, False)
    return [_epilogue(ctx, a, acc, ins, outs)]


def qconv2d(ctx, a, ins, outs, fmt: str):
    """QLinearConv with a sparse int8 weight; padding holds the zero point, folded as in
    :func:`.quant.qconv2d` (bit-exact with the dense kernel)."""
    x, w = ins[0], ctx.const_data(1)
    if w is None or x.rank != 4:
        return None
    zx = _zp(ctx, 0)
    bias = ctx.const_data(2)
    isa = _vnni_isa(ctx, fmt, x.dtype)
    if isa is not None:                  # vpdpbusd reads uint8: int8 x is stored x ^ 0x80, z + 128
        acc = _conv_acc(ctx, a, x, w, outs, fmt, zx, x.dtype, True, vnni=isa)   # padding: x = z_x
        zx = qdot.effective_zp(isa, x.dtype, zx)
    else:
        acc = _conv_acc(ctx, a, x, w, outs, fmt, zx, _int_mode(x.dtype, w), True)
    return [requantized(ctx, a, outs[0], w, bias, zx, acc.at)]


BUILDERS = {"Gemm": gemm, "FusedGemm": gemm, "MatMul": gemm, "Conv": conv2d, "FusedConv": conv2d,
            "QLinearGemm": qgemm, "QLinearConv": qconv2d}


def build(ctx, fmt: str, a, ins, outs):
    """The sparse kernel of ``ctx.op`` in ``fmt``, or None when it does not apply (the caller
    then builds the dense kernel)."""
    if fmt not in FORMATS or ctx.op.kind not in BUILDERS:
        return None
    w = ctx.const_data(1)
    if ctx.op.kind in ("QLinearGemm", "QLinearConv") and (w is None or w.dtype != np.int8):
        return None
    if fmt == "bsr4x1" and w is not None and w.ndim == 4 and ins[0].rank == 4:
        g = ins[0].shape[1] // w.shape[1]
        if g > 1 and (w.shape[0] // g) % 4:
            return None                      # 4-row blocks would straddle groups: the dense kernel
    return BUILDERS[ctx.op.kind](ctx, a, ins, outs, fmt)
