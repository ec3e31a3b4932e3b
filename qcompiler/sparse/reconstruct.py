"""One-shot pruning with weight reconstruction: the SparseGPT
solver (Frantar & Alistarh 2023, *SparseGPT: Massive Language Models Can Be Accurately Pruned in
One-Shot*, ICML 2023, Algorithm 1; the exact per-weight form is Optimal Brain Compression, Frantar
& Alistarh 2022, after Hassibi & Stork's Optimal Brain Surgeon, 1993).

A layer ``y = W x`` (a conv as its im2col gemm: ``W [g, N, K]`` as :mod:`qcompiler.sparse.format`
stores it, ``x`` a patch ``[K]`` of the input, one row of ``X [R, K]`` per sample and output
position) pruned to ``Ŵ`` costs, per output row ``w``, on the calibration inputs::

    E(ŵ) = ||X wᵀ − X ŵᵀ||² = (w − ŵ) H (w − ŵ)ᵀ,      H = XᵀX + λI,  λ = 0.01 · mean diag(XᵀX)
                                                      (over the prunable columns: not a bias's)

(the damping keeps H invertible where inputs are dead or collinear). OBS: zeroing weight ``j``
and re-fitting all others optimally costs ``w_j² / [H⁻¹]_jj`` and moves them by
``−(w_j / [H⁻¹]_jj) [H⁻¹]_{:,j}``. SparseGPT visits the columns left to right and, at column ``j``,
re-fits only the columns to its right, ``F_j = {j+1..K−1}``: the same set for every row, so one
sequence of inverses serves all ``N`` rows, and it is read off the upper Cholesky factor ``U`` of
``H⁻¹ = UᵀU`` (row ``j`` of ``U`` is ``[H_{F}⁻¹]_{j,j:} / sqrt([H_{F}⁻¹]_jj)`` for ``F = {j..K−1}``)::

    for j in 0..K−1:   err = (w_j − q_j) / U_jj       (q_j = 0 where pruned, w_j where kept)
                       w_{j:} −= err · U_{j,j:}       (w_j becomes q_j; the columns > j compensate)

and ``Σ_j err_j² = (w − ŵ) H (w − ŵ)ᵀ``. Lazy batching: the updates stay inside a block of
``B = 128`` columns; the columns after it get them all at once when the block is done,
``W_{:, i2:} −= Err · U_{i1:i2, i2:}`` (one GEMM). With a fixed mask the result is this sequential
least-squares solution (each pruned column's error re-fitted by the columns after it, those before
it already final); it is the global least-squares optimum ``min ||X(w − ŵ)ᵀ||`` over the kept
weights where every pruned column of a row precedes its kept ones, and above it otherwise (an
update may move weight into a column pruned later: with a mask that ignores the saliency, a row
can even end worse than plain zeroing; ``tests/passes/test_prune_reconstruct.py`` checks both).

Masks (True = pruned), chosen on the partly updated weights by the saliency ``w_j² / U_jj²``:

* ``unstructured``: in adaptive mask blocks of ``B`` columns, the lowest saliencies of the block;
  the layer's ``round(s · g·N·K)`` spread over its blocks pro rata (cumulative rounding), so the
  layer's count is exact, as :mod:`qcompiler.passes.prune`'s is;
* ``N:M``: at the first column of every group of ``M`` consecutive ``k`` of a row (the grouping of
  :func:`qcompiler.passes.prune.nm_mask` and the 2:4 format: ``k ≡ 0 mod M`` starts a group, a short
  last group keeps ``min(N, size)``), the ``M − N`` lowest of the group;
* ``block4``: 1x4 blocks along ``k`` (saliency summed over the block), the layer's
  ``round(s · g·N·ceil(K/4))`` spread over the mask blocks like unstructured.

The Gram matrix and the factor ``U`` are :mod:`qcompiler.quant.gram`'s (shared with GPTQ's
rounding); all the solving is float64.

    g = Gram(groups=1, k=K); g.add(rows)            # rows [g, r, K], any number of times
    w_hat, pruned, loss = reconstruct(W, g.h, Pattern.of("2:4"))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant.gram import BLOCK, DAMP, damped, damping, inverse_upper_factor



@dataclass(frozen=True)
class Pattern:
    """What to prune: ``kind`` unstructured | nm | block4; ``sparsity`` for unstructured and
    block4; ``n``/``m`` for N:M."""
    kind: str
    sparsity: float = 0.5
    n: int = 2
    m: int = 4

    @classmethod
    def of(cls, pattern: str, sparsity: float | None = None) -> "Pattern":
        """``"unstructured"``, ``"block4"`` (with ``sparsity``) or ``"N:M"``."""
        a, sep, b = pattern.partition(":")
        if sep:
            return cls("nm", 1 - int(a) / int(b), int(a), int(b))
        if pattern not in ("unstructured", "block4"):
            raise ValueError(f"unknown pattern '{pattern}' (unstructured, N:M, block4)")
        return cls(pattern, 0.5 if sparsity is None else sparsity)


def _cumulative_counts(total: int, units: np.ndarray) -> np.ndarray:
    """``total`` spread over parts of sizes ``units`` pro rata, cumulatively rounded (sums to total)."""
    cum = np.cumsum(units)
    t = np.rint(total * cum / max(cum[-1], 1)).astype(np.int64)
    return np.diff(np.concatenate([[0], t]))


def _lowest(scores: np.ndarray, count: int) -> np.ndarray:
    """Mask of the ``count`` lowest entries (ties broken by argpartition: deterministic)."""
    mask = np.zeros(scores.size, bool)
    if count >= scores.size:
        mask[:] = True
    elif count > 0:
        mask[np.argpartition(scores.reshape(-1), count - 1)[:count]] = True
    return mask.reshape(scores.shape)


def _nm_group(scores: np.ndarray, n: int) -> np.ndarray:
    """Per row of ``scores [g, size, N]`` (a group of columns): True for all but the ``n`` highest
    along the group (ties: the lower index kept, as :func:`qcompiler.passes.prune.nm_mask`)."""
    size = scores.shape[1]
    prune = np.ones(scores.shape, bool)
    if n >= size:
        return ~prune
    keep = np.argsort(-scores, axis=1, kind="stable")[:, :n]
    np.put_along_axis(prune, keep, False, axis=1)
    return prune


def reconstruct(w: np.ndarray, h: np.ndarray, pattern: Pattern, *, mask: np.ndarray | None = None,
                block: int = BLOCK, damp: float = DAMP, fixed: int = 0,
                target: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prune ``w [g, N, K]`` with the Gram matrices ``h [g, K, K]`` (undamped); returns
    ``(ŵ float64, pruned mask, loss [g, N])`` with ``loss = Σ_j err_j² = (w' − ŵ)(H + λI)(w' − ŵ)ᵀ``
    per row. ``mask``: prune exactly these (True) instead of choosing. ``fixed``: the last columns
    are never pruned nor counted, only re-fitted (a bias as a column of constant-1 inputs).
    ``target``: ``P = Σ y xᵀ`` [g, N, K] of target outputs ``y`` (the unpruned model's, ``w x_t``)
    and the inputs ``x`` of ``h``: ``w`` is first re-fitted to reproduce ``y`` from ``x``,
    ``w' = (P + λw)(H + λI)⁻¹`` (a ridge fit towards ``w``; ``w' = w`` where ``x = x_t``), then
    pruned (without ``target``, ``w' = w``). λ is ``damp`` times the mean diagonal of the prunable columns of ``h``."""
    g, nrows, k = np.shape(w)
    kp = k - fixed                                                     # the prunable columns
    wt = np.array(np.transpose(w, (0, 2, 1)), np.float64, order="C")   # g, K, N: a column is contiguous
    if pattern.kind == "nm":
        block = max(pattern.m, block // pattern.m * pattern.m)       # groups never straddle blocks
    lam = damping(h[:, :kp, :kp], damp)                              # the inputs' scale, not the bias column's
    u = inverse_upper_factor(damped(h, lam))
    if target is not None:                               # w'ᵀ = UᵀU (Pᵀ + λ wᵀ)
        wt = u.transpose(0, 2, 1) @ (u @ (np.transpose(target, (0, 2, 1)) + lam[:, None, None] * wt))
    d = np.diagonal(u, axis1=1, axis2=2)[:, :, None]                   # g, K, 1
    starts = list(range(0, k, block))
    counts = None
    if mask is None and pattern.kind in ("unstructured", "block4"):
        width = [max(0, min(block, kp - s)) for s in starts]
        per = [nrows * (x if pattern.kind == "unstructured" else -(-x // 4)) for x in width] * g
        total = int(round(pattern.sparsity * sum(per)))
        counts = _cumulative_counts(total, np.array(per)).reshape(g, len(starts))
    pruned = np.zeros(wt.shape, bool)
    if mask is not None:
        pruned[:, :kp] = np.transpose(mask, (0, 2, 1))
    loss = np.zeros((g, nrows))
    for bi, i1 in enumerate(starts):
        i2 = min(i1 + block, k)
        w1, u1, d1 = wt[:, i1:i2], u[:, i1:i2, i1:i2], d[:, i1:i2]    # views: w1 is updated in place
        m1, live = pruned[:, i1:i2], max(0, min(i2, kp) - i1)         # m1: a view, filled in place
        if mask is None and counts is not None and live:
            m1[:, :live] = _block_mask(w1[:, :live], d1[:, :live], counts[:, bi], pattern.kind)
        err1 = np.zeros(w1.shape)
        for i in range(live):
            if mask is None and pattern.kind == "nm" and i % pattern.m == 0:
                grp = slice(i, min(i + pattern.m, live))
                m1[:, grp] = _nm_group((w1[:, grp] / d1[:, grp]) ** 2, pattern.n)
            col = m1[:, i]
            if not col.any():
                continue
            err = np.where(col, w1[:, i], 0.0) / d1[:, i]                # (w − q) / U_jj, per row
            w1[:, i:] -= u1[:, i, i:, None] * err[:, None, :]
            w1[:, i][col] = 0.0
            err1[:, i] = err
        loss += (err1 ** 2).sum(axis=1)
        if i2 < k:
            wt[:, i2:] -= u[:, i1:i2, i2:].transpose(0, 2, 1) @ err1
    wt[pruned] = 0.0
    return wt.transpose(0, 2, 1), pruned.transpose(0, 2, 1)[:, :, :kp], loss


def _block_mask(w1: np.ndarray, d1: np.ndarray, counts: np.ndarray, kind: str) -> np.ndarray:
    """The mask of one mask block ``[g, width, N]``: per group its ``counts[g]`` lowest saliencies
    (unstructured: weights; block4: 1x4 blocks along k, zero-padded)."""
    sal = (w1 / d1) ** 2
    out = np.zeros(w1.shape, bool)
    width, nrows = w1.shape[1:]
    for gi in range(w1.shape[0]):
        if kind == "unstructured":
            out[gi] = _lowest(sal[gi], int(counts[gi]))
        else:
            pad = np.zeros((-(-width // 4) * 4, nrows))
            pad[:width] = sal[gi]
            blocks = _lowest(pad.reshape(-1, 4, nrows).sum(1), int(counts[gi]))
            out[gi] = np.repeat(blocks, 4, axis=0)[:width]
    return out
