"""The input Gram matrix of a layer and the Cholesky factor its solvers use: what SparseGPT's
pruning (:mod:`qcompiler.sparse.reconstruct`) and GPTQ's rounding (:mod:`qcompiler.quant.gptq`)
share.

A layer ``y = W x`` (a conv as its im2col gemm: ``x`` a patch ``[K]`` of the input, one row of
``X [R, K]`` per sample and output position) has, per group, ``H = XᵀX = Σ x xᵀ``; its solvers
damp it (``H + λI``, ``λ = 0.01 · mean diag H``: invertible where inputs are dead or collinear) and
read the sequence of inverses ``[H_F⁻¹]`` over ``F = {j..K−1}`` off the upper Cholesky factor ``U``
of ``H⁻¹ = UᵀU``. The Gram matrix is streamed: float32 products of chunks of at most
:data:`CHUNK_ROWS` rows (the activations' own precision; each chunk's sum is ~1e-6 relative) added
up in float64.

    g = Gram(groups=1, k=K); g.add(rows)            # rows [g, r, K], any number of times
    u = inverse_upper_factor(damped(g.h, damping(g.h)))
"""
from __future__ import annotations

import numpy as np

BLOCK = 128
"""Columns per lazy-update block of the solvers."""
DAMP = 0.01
CHUNK_ROWS = 8192


# ---- the Gram matrix ----------------------------------------------------------------------------------
class Gram:
    """``H = Σ x xᵀ`` over rows per group, streamed: float32 products of chunks, float64 sums; with
    ``outputs``, also ``P = Σ y xᵀ`` [g, N, K] of the target outputs ``y`` [N] of each row (the
    unpruned model's layer outputs for the same samples and positions): what fitting ``ŵ x ≈ y``
    needs, at ``2·N·K`` per row where the inputs' cross Gram ``Σ t xᵀ`` would cost ``K²``."""

    def __init__(self, groups: int, k: int, outputs: int | None = None):
        self.h = np.zeros((groups, k, k))
        self.sums = np.zeros((groups, k))
        self.p = np.zeros((groups, outputs, k)) if outputs else None
        self.out_sums = np.zeros((groups, outputs)) if outputs else None
        self.rows = 0

    def add(self, rows: np.ndarray, outputs: np.ndarray | None = None) -> None:
        """Add rows ``[g, r, K]`` (any float dtype), and their target outputs ``[g, r, N]``."""
        rows = np.asarray(rows, np.float32)
        for s in range(0, rows.shape[1], CHUNK_ROWS):
            part = rows[:, s:s + CHUNK_ROWS]
            if part.shape[0] == 1:                    # one group: a.T @ a is BLAS syrk (half the work)
                c = np.ascontiguousarray(part[0])
                self.h[0] += c.T @ c
            else:
                self.h += np.matmul(part.transpose(0, 2, 1), part)
            if outputs is not None:
                self.p += np.matmul(np.asarray(outputs[:, s:s + CHUNK_ROWS], np.float32).transpose(0, 2, 1), part)
        self.sums += rows.sum(axis=1, dtype=np.float64)
        if outputs is not None:
            self.out_sums += np.asarray(outputs).sum(axis=1, dtype=np.float64)
        self.rows += rows.shape[1]

    def with_ones(self) -> np.ndarray:
        """``H`` of the rows with a constant 1 appended (``[g, K+1, K+1]``): a bias as the last input."""
        g, k = self.sums.shape
        out = np.empty((g, k + 1, k + 1))
        out[:, :k, :k], out[:, :k, k], out[:, k, :k], out[:, k, k] = self.h, self.sums, self.sums, self.rows
        return out

    def targets(self, ones: bool = False) -> np.ndarray:
        """``P`` (``[g, N, K]``), or with the constant-1 input appended ``[P, Σ y]`` (``[g, N, K+1]``)."""
        return np.concatenate([self.p, self.out_sums[:, :, None]], axis=2) if ones else self.p


def conv_rows(x: np.ndarray, kernel, attrs: dict, out_spatial, group: int,
              pick: np.ndarray | None = None) -> np.ndarray:
    """The im2col rows ``[g, r, C/g·kh·kw]`` of conv input ``x [n, C, *in]`` (column order
    ``(c·kh + i)·kw + j``, as :func:`qcompiler.sparse.format.conv_matrices`): one row per sample and
    output position (``r = n·P``, sample-major), or only the rows ``pick`` (indices into those)."""
    from ..ir.windows import windows
    n, c = x.shape[:2]
    p = int(np.prod(out_spatial))
    if pick is None:
        sn, sp = np.repeat(np.arange(n), p), np.tile(np.arange(p), n)
    else:
        sn, sp = np.divmod(np.asarray(pick), p)
    at = (sn, slice(None)) + np.unravel_index(sp, tuple(out_spatial))     # advanced indices first: r, C
    rows = np.stack([win[at] for _, win in windows(x, kernel, attrs, out_spatial, 0.0)], axis=2)   # r, C, taps
    return rows.reshape(len(sn), group, -1).transpose(1, 0, 2)      # g, r, C/g * taps


def gemm_rows(x: np.ndarray, trans_a: bool = False, pick: np.ndarray | None = None) -> np.ndarray:
    """The rows ``[1, r, K]`` a gemm/matmul multiplies its weight with (``x [..., K]``, or ``[K, M]``
    with transA)."""
    rows = x.T if trans_a else x.reshape(-1, x.shape[-1])
    return (rows if pick is None else rows[pick])[None]


# ---- the factor ----------------------------------------------------------------------------------------
def damping(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """``λ = damp · mean diag H`` per group (1 where H is all zero: dead inputs)."""
    mean = np.einsum("gii->g", h) / h.shape[-1]
    return np.where(mean > 0, damp * mean, 1.0)


def damped(h: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``H + λI`` per group (a copy)."""
    out = np.array(h, np.float64)
    np.einsum("gii->gi", out)[...] += lam[:, None]
    return out


def inverse_upper_factor(h: np.ndarray) -> np.ndarray:
    """Upper ``U`` with ``UᵀU = H⁻¹`` per group (what SparseGPT gets from cholesky(cholesky_inverse(
    cholesky(H)), upper=True)): ``U = R⁻¹`` for the upper ``R`` with ``H = R Rᵀ``, by 2x2 blocks
    (all the work in GEMMs; numpy's Cholesky runs at a fifth of its GEMM's rate). With
    ``H = [[A, B], [Bᵀ, C]]``::

        U22 = f(C)             R12 = B U22ᵀ           U11 = f(A − R12 R12ᵀ)
        U12 = −U11 R12 U22     (from R22 R22ᵀ = C, R12 R22ᵀ = B, R11 R11ᵀ + R12 R12ᵀ = A)

    and at 64 columns or fewer one Cholesky: with J the reversal, ``JHJ = LLᵀ`` makes
    ``H = (JLJ)(JLJ)ᵀ``, ``JLJ`` upper, so ``U = (JLJ)⁻¹``."""
    h = np.asarray(h, np.float64)
    k = h.shape[-1]
    if k <= 64:
        low = np.linalg.cholesky(np.ascontiguousarray(h[:, ::-1, ::-1]))
        return np.triu(np.linalg.inv(np.ascontiguousarray(low[:, ::-1, ::-1])))
    m = k // 2
    out = np.zeros_like(h)
    u22 = inverse_upper_factor(h[:, m:, m:])
    r12 = h[:, :m, m:] @ u22.transpose(0, 2, 1)
    u11 = inverse_upper_factor(h[:, :m, :m] - r12 @ r12.transpose(0, 2, 1))
    out[:, :m, :m], out[:, m:, m:] = u11, u22
    out[:, :m, m:] = -(u11 @ r12) @ u22
    return out
