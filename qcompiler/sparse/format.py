"""Sparse encodings of a gemm weight matrix, shared by the cost model, the report and the sparse kernels.

Every encoding here describes one weight matrix ``W`` of shape ``[N, K]``: ``N`` output channels (rows),
``K`` the reduction length (columns), so that ``y[n] = sum_k W[n, k] * x[k]``.

* Gemm ``Y = A @ B^T`` (``transB=1``): ``W = B`` (``[N, K]`` as stored). With ``transB=0``, ``W = B.T``.
  :func:`gemm_matrix` does this.
* Conv (weight ``[O, C/g, kh, kw]``, ``g`` groups): the im2col form of group ``j`` is
  ``W_j = w[j*O/g:(j+1)*O/g].reshape(O/g, C/g*kh*kw)`` - the reduction index is ``k = (c*kh + i)*kw + j``,
  i.e. C-major then kernel row then kernel column, the order of a C-contiguous weight.
  :func:`conv_matrices` returns the ``[g, O/g, K]`` stack; each group is encoded on its own.

Values keep the weight's dtype: ``int8`` for quantized weights, ``float32`` for float ones. Index arrays are
as small as the shape allows: ``uint8`` when the largest index they hold is < 256 (``K <= 256`` for CSR
columns), else ``uint16`` (``K <= 65536``; beyond that ``int32``). Row pointers are ``int32``.

Formats
-------
``CSR``  (compressed sparse rows; Saad, *Iterative Methods for Sparse Linear Systems*, 2003, sec. 3.4)
    ``row_ptr  int32 [N+1]``   non-zeros of row ``n`` are entries ``row_ptr[n] .. row_ptr[n+1]-1``
    ``col_idx  uint8|uint16 [nnz]`` column ``k`` of each entry, ascending within a row
    ``values   int8|float32 [nnz]``
    ``y[n] = sum_{e in row n} values[e] * x[col_idx[e]]``.  Empty rows have ``row_ptr[n] == row_ptr[n+1]``.

``BSR``  (block sparse rows) with blocks of ``br x bc``; ``(1, 4)`` = 1 row by 4 consecutive ``k``
    (blocks along the reduction axis), ``(4, 1)`` = 4 rows by one ``k``. ``K`` is padded with zero columns
    to ``Kp = ceil(K/bc)*bc``, ``N`` with zero rows to ``Np = ceil(N/br)*br``; a block is stored when any
    of its entries is non-zero.
    ``row_ptr  int32 [Np/br + 1]``   blocks of block-row ``i`` are ``row_ptr[i] .. row_ptr[i+1]-1``
    ``col_idx  uint8|uint16 [nnzb]`` block column ``b`` (the block covers ``k = b*bc .. b*bc+bc-1``)
    ``values   [nnzb, br, bc]``      the block's entries, row-major; padding entries are 0
    ``y[i*br + r] = sum_{e in block-row i} sum_c values[e, r, c] * x[col_idx[e]*bc + c]``.

``NM24`` (2:4 structured sparsity, as in NVIDIA Ampere sparse tensor cores; Mishra et al. 2021,
    *Accelerating Sparse Deep Neural Networks*, arXiv:2104.08378). Along ``k`` every group of 4 consecutive
    columns (``K`` zero-padded to ``Kp = ceil(K/4)*4``) holds at most 2 non-zeros; exactly 2 slots are
    stored per group (a slot may hold a 0).
    ``values   [N, Kp/2]``  slot ``s`` of row ``n`` belongs to group ``s // 2``
    ``idx      uint8 [N, ceil(Kp/8)]`` the 2-bit in-group position of each slot, 4 slots per byte,
               slot ``s`` in byte ``s // 4`` bits ``2*(s % 4) .. 2*(s % 4)+1`` (little end first);
               each row starts on a fresh byte.
    ``y[n] = sum_s values[n, s] * x[4*(s//2) + pos(n, s)]``. The two positions of a group are ascending
    and distinct; where a group has fewer than 2 non-zeros the lowest free positions fill it with zeros.

``Dense``: ``values [N, K]`` as is (the baseline every sparse format is compared with).

``encode(W, fmt)`` / ``decode(enc)`` round-trip exactly (bit for bit, any dtype; a float ``-0.0`` is a zero
like any other and decodes as ``+0.0``, which no product or sum can tell apart); ``stored_bytes(enc)``
counts every array the kernel needs (values, indices, pointers), nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMATS = ("dense", "csr", "bsr1x4", "bsr4x1", "2:4")


def index_dtype(max_index: int) -> np.dtype:
    """Smallest unsigned index type holding ``0..max_index`` (uint8, uint16, else int32)."""
    if max_index < 256:
        return np.dtype(np.uint8)
    if max_index < 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


@dataclass(frozen=True)
class Dense:
    values: np.ndarray                       # [N, K]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)

    fmt = "dense"


@dataclass(frozen=True)
class CSR:
    shape: tuple[int, int]
    row_ptr: np.ndarray                      # int32 [N+1]
    col_idx: np.ndarray                      # uint8|uint16 [nnz]
    values: np.ndarray                       # [nnz]

    fmt = "csr"

    @property
    def nnz(self) -> int:
        return int(self.values.size)


@dataclass(frozen=True)
class BSR:
    shape: tuple[int, int]
    block: tuple[int, int]                   # (br, bc): (1, 4) or (4, 1)
    row_ptr: np.ndarray                      # int32 [Np/br + 1]
    col_idx: np.ndarray                      # uint8|uint16 [nnzb], block columns
    values: np.ndarray                       # [nnzb, br, bc]

    @property
    def fmt(self) -> str:
        return f"bsr{self.block[0]}x{self.block[1]}"

    @property
    def nnzb(self) -> int:
        return int(self.values.shape[0])


@dataclass(frozen=True)
class NM24:
    shape: tuple[int, int]
    values: np.ndarray                       # [N, Kp/2]
    idx: np.ndarray                          # uint8 [N, ceil(Kp/8)]

    fmt = "2:4"

    def positions(self) -> np.ndarray:
        """Unpacked in-group positions, uint8 [N, Kp/2] (0..3)."""
        n, slots = self.values.shape
        shifts = (2 * np.arange(4, dtype=np.uint8))
        pos = (self.idx[:, :, None] >> shifts[None, None, :]) & 3
        return pos.reshape(n, -1)[:, :slots].astype(np.uint8)

    def columns(self) -> np.ndarray:
        """Absolute column ``k`` of every slot, int32 [N, Kp/2]."""
        slots = self.values.shape[1]
        return (4 * (np.arange(slots) // 2))[None, :].astype(np.int32) + self.positions().astype(np.int32)


Encoding = Dense | CSR | BSR | NM24


# ---- gemm matrices of graph weights -------------------------------------------------------------
def gemm_matrix(b: np.ndarray, trans_b: int) -> np.ndarray:
    """The ``[N, K]`` weight matrix of an ONNX Gemm's ``B`` operand."""
    b = np.asarray(b)
    if b.ndim != 2:
        raise ValueError(f"Gemm weight must be 2-D, got shape {b.shape}")
    return b if trans_b else b.T


def conv_matrices(w: np.ndarray, group: int = 1) -> np.ndarray:
    """The im2col weight matrices ``[g, O/g, C/g*kh*kw]`` of a conv weight ``[O, C/g, *kernel]``."""
    w = np.asarray(w)
    o = w.shape[0]
    if group < 1 or o % group:
        raise ValueError(f"conv with {o} output channels cannot have group={group}")
    return w.reshape(group, o // group, -1)


def conv_weight(mats: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`conv_matrices`."""
    return np.asarray(mats).reshape(shape)


# ---- encode / decode ------------------------------------------------------------------------------
def _check_2d(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"a weight matrix is 2-D [N, K], got shape {w.shape}")
    return w


def _pad(w: np.ndarray, rows: int, cols: int) -> np.ndarray:
    n, k = w.shape
    np_, kp = -(-n // rows) * rows, -(-k // cols) * cols
    if (np_, kp) == (n, k):
        return w
    out = np.zeros((np_, kp), w.dtype)
    out[:n, :k] = w
    return out


def encode_csr(w: np.ndarray) -> CSR:
    w = _check_2d(w)
    n, k = w.shape
    mask = w != 0
    rows, cols = np.nonzero(mask)                        # row-major: ascending k within a row
    row_ptr = np.zeros(n + 1, np.int32)
    np.cumsum(mask.sum(axis=1), out=row_ptr[1:])
    return CSR((n, k), row_ptr, cols.astype(index_dtype(max(k - 1, 0))), w[rows, cols].copy())


def encode_bsr(w: np.ndarray, block: tuple[int, int] = (1, 4)) -> BSR:
    w = _check_2d(w)
    br, bc = block
    if block not in ((1, 4), (4, 1)):
        raise ValueError(f"BSR blocks are 1x4 or 4x1, got {br}x{bc}")
    n, k = w.shape
    wp = _pad(w, br, bc)
    nbr, nbc = wp.shape[0] // br, wp.shape[1] // bc
    blocks = wp.reshape(nbr, br, nbc, bc).transpose(0, 2, 1, 3)      # [nbr, nbc, br, bc]
    keep = (blocks != 0).any(axis=(2, 3))
    bi, bj = np.nonzero(keep)
    row_ptr = np.zeros(nbr + 1, np.int32)
    np.cumsum(keep.sum(axis=1), out=row_ptr[1:])
    return BSR((n, k), (br, bc), row_ptr, bj.astype(index_dtype(max(nbc - 1, 0))), blocks[bi, bj].copy())


def is_24(w: np.ndarray) -> bool:
    """True when every group of 4 consecutive ``k`` (zero-padded) has at most 2 non-zeros."""
    w = _check_2d(w)
    wp = _pad(w, 1, 4)
    return bool(((wp != 0).reshape(wp.shape[0], -1, 4).sum(axis=2) <= 2).all())


def encode_24(w: np.ndarray) -> NM24:
    w = _check_2d(w)
    n, k = w.shape
    wp = _pad(w, 1, 4)
    groups = wp.reshape(n, -1, 4)                        # [N, G, 4]
    nz = groups != 0
    if (nz.sum(axis=2) > 2).any():
        r, g = np.argwhere(nz.sum(axis=2) > 2)[0]
        raise ValueError(f"not 2:4 sparse: row {r}, columns {4 * g}..{4 * g + 3} hold "
                         f"{int(nz[r, g].sum())} non-zeros")
    # stable sort puts the non-zero positions first (ascending), then the lowest free ones
    order = np.argsort(~nz, axis=2, kind="stable")[:, :, :2]
    pos = np.sort(order, axis=2).astype(np.uint8)        # [N, G, 2], ascending, distinct
    vals = np.take_along_axis(groups, pos.astype(np.intp), axis=2).reshape(n, -1)
    slots = pos.reshape(n, -1)                           # [N, Kp/2]
    nbytes = -(-slots.shape[1] // 4)
    padded = np.zeros((n, nbytes * 4), np.uint8)
    padded[:, :slots.shape[1]] = slots
    quads = padded.reshape(n, nbytes, 4)
    idx = (quads[:, :, 0] | (quads[:, :, 1] << 2) | (quads[:, :, 2] << 4) | (quads[:, :, 3] << 6)).astype(np.uint8)
    return NM24((n, k), vals.copy(), idx)


def encode(w: np.ndarray, fmt: str) -> Encoding:
    """Encode ``W [N, K]`` in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "dense":
        return Dense(_check_2d(w).copy())
    if fmt == "csr":
        return encode_csr(w)
    if fmt == "bsr1x4":
        return encode_bsr(w, (1, 4))
    if fmt == "bsr4x1":
        return encode_bsr(w, (4, 1))
    if fmt == "2:4":
        return encode_24(w)
    raise ValueError(f"unknown sparse format '{fmt}' (one of {', '.join(FORMATS)})")


def decode(enc: Encoding) -> np.ndarray:
    """The dense ``[N, K]`` matrix an encoding stands for (exact inverse of :func:`encode`)."""
    if isinstance(enc, Dense):
        return enc.values.copy()
    n, k = enc.shape
    if isinstance(enc, CSR):
        out = np.zeros((n, k), enc.values.dtype)
        rows = np.repeat(np.arange(n), np.diff(enc.row_ptr))
        out[rows, enc.col_idx.astype(np.intp)] = enc.values
        return out
    if isinstance(enc, BSR):
        br, bc = enc.block
        nbr = len(enc.row_ptr) - 1
        kp = -(-k // bc) * bc
        blocks = np.zeros((nbr, kp // bc, br, bc), enc.values.dtype)
        bi = np.repeat(np.arange(nbr), np.diff(enc.row_ptr))
        blocks[bi, enc.col_idx.astype(np.intp)] = enc.values
        return blocks.transpose(0, 2, 1, 3).reshape(nbr * br, kp)[:n, :k].copy()
    if isinstance(enc, NM24):
        kp = -(-k // 4) * 4
        out = np.zeros((n, kp), enc.values.dtype)
        np.put_along_axis(out, enc.columns().astype(np.intp), enc.values, axis=1)
        return out[:, :k]
    raise TypeError(f"not a sparse encoding: {type(enc).__name__}")


def arrays(enc: Encoding) -> dict[str, np.ndarray]:
    """The arrays a kernel takes, by name (what :func:`stored_bytes` counts)."""
    if isinstance(enc, Dense):
        return {"values": enc.values}
    if isinstance(enc, (CSR, BSR)):
        return {"row_ptr": enc.row_ptr, "col_idx": enc.col_idx, "values": enc.values}
    if isinstance(enc, NM24):
        return {"values": enc.values, "idx": enc.idx}
    raise TypeError(f"not a sparse encoding: {type(enc).__name__}")


def stored_bytes(enc: Encoding) -> int:
    """Bytes of every array of the encoding (values + indices + pointers)."""
    return int(sum(a.nbytes for a in arrays(enc).values()))


def predicted_bytes(fmt: str, n: int, k: int, nnz: int, nnzb: int | None = None, elem_bytes: int = 1) -> int:
    """:func:`stored_bytes` of ``fmt`` from counts alone (``nnzb``: non-zero blocks, for BSR).

    Exact for every format: ``stored_bytes(encode(W, fmt)) == predicted_bytes(fmt, ...)``.
    """
    if fmt == "dense":
        return n * k * elem_bytes
    if fmt == "csr":
        return 4 * (n + 1) + nnz * (index_dtype(max(k - 1, 0)).itemsize + elem_bytes)
    if fmt in ("bsr1x4", "bsr4x1"):
        br, bc = (1, 4) if fmt == "bsr1x4" else (4, 1)
        if nnzb is None:
            raise ValueError("BSR size needs the number of non-zero blocks")
        nbr, nbc = -(-n // br), -(-k // bc)
        return 4 * (nbr + 1) + nnzb * (index_dtype(max(nbc - 1, 0)).itemsize + br * bc * elem_bytes)
    if fmt == "2:4":
        kp = -(-k // 4) * 4
        return n * (kp // 2) * elem_bytes + n * (-(-(kp // 2) // 4))
    raise ValueError(f"unknown sparse format '{fmt}'")


def count_blocks(w: np.ndarray, block: tuple[int, int]) -> int:
    """Number of ``br x bc`` blocks of ``W`` (zero-padded) holding a non-zero."""
    w = _check_2d(w)
    br, bc = block
    wp = _pad(w, br, bc)
    return int((wp != 0).reshape(wp.shape[0] // br, br, wp.shape[1] // bc, bc).any(axis=(1, 3)).sum())
