"""qcompiler.sparse.format: every encoding decodes to the exact matrix it encoded (bit for bit, int8
and float32), stored_bytes equals the size predicted from the counts, and the layouts are what the
docstring says (checked entry by entry on small matrices)."""
import numpy as np
import pytest

from qcompiler.sparse.format import (BSR, CSR, FORMATS, NM24, conv_matrices, conv_weight, count_blocks, decode,
                                     encode, gemm_matrix, index_dtype, is_24, predicted_bytes, stored_bytes)

SHAPES = [(1, 1), (1, 4), (3, 5), (7, 13), (16, 300), (5, 8), (9, 257), (4, 256), (6, 3)]


def _sparse(rng, shape, density, dtype):
    w = rng.standard_normal(shape) * (rng.random(shape) < density)
    return (np.round(w * 40).clip(-127, 127) if dtype == np.int8 else w).astype(dtype)


def _make_24(w):
    """Zero all but the 2 largest |w| of every group of 4 along k (reference for the tests)."""
    w = w.copy()
    for r in range(w.shape[0]):
        for g0 in range(0, w.shape[1], 4):
            grp = np.abs(w[r, g0:g0 + 4].astype(np.float64))
            for j in np.argsort(-grp, kind="stable")[2:]:
                w[r, g0 + j] = 0
    return w


def _nnzb(w, fmt):
    return count_blocks(w, (1, 4) if fmt == "bsr1x4" else (4, 1)) if fmt.startswith("bsr") else None


@pytest.mark.parametrize("dtype", [np.int8, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
def test_round_trip_and_size(shape, density, dtype):
    rng = np.random.default_rng(hash((shape, density)) % 2**32)
    w = _sparse(rng, shape, density, dtype)
    if shape[0] > 2:
        w[1] = 0                                         # an empty row in the middle
    for fmt in FORMATS:
        x = _make_24(w) if fmt == "2:4" else w
        enc = encode(x, fmt)
        back = decode(enc)
        assert back.dtype == x.dtype and back.shape == x.shape
        nz = x != 0                                       # bit for bit where non-zero; -0.0 may come back +0.0
        assert np.array_equal(back, x) and np.array_equal(back[nz].view(np.uint8), x[nz].view(np.uint8)), fmt
        assert stored_bytes(enc) == predicted_bytes(fmt, *shape, int(np.count_nonzero(x)), _nnzb(x, fmt),
                                                    x.dtype.itemsize), fmt


def test_csr_layout():
    w = np.array([[0, 3, 0, 0, -2], [0, 0, 0, 0, 0], [7, 0, 0, 0, 1]], np.int8)
    e = encode(w, "csr")
    assert isinstance(e, CSR)
    assert e.row_ptr.tolist() == [0, 2, 2, 4] and e.row_ptr.dtype == np.int32
    assert e.col_idx.tolist() == [1, 4, 0, 4] and e.col_idx.dtype == np.uint8
    assert e.values.tolist() == [3, -2, 7, 1] and e.values.dtype == np.int8
    assert stored_bytes(e) == 4 * 4 + 4 + 4


def test_index_dtypes():
    assert index_dtype(255) == np.uint8 and index_dtype(256) == np.uint16 and index_dtype(65536) == np.int32
    assert encode(np.ones((2, 256), np.float32), "csr").col_idx.dtype == np.uint8      # K <= 256
    assert encode(np.ones((2, 257), np.float32), "csr").col_idx.dtype == np.uint16
    assert encode(np.ones((2, 1024), np.int8), "bsr1x4").col_idx.dtype == np.uint8     # 256 block columns


def test_bsr_layout_and_padding():
    w = np.zeros((5, 6), np.float32)                      # K = 6: last 1x4 block padded; N = 5: 4x1 padded
    w[0, 5] = 1.5
    w[4, 0] = -2.0
    e = encode(w, "bsr1x4")
    assert isinstance(e, BSR) and e.block == (1, 4)
    assert e.row_ptr.tolist() == [0, 1, 1, 1, 1, 2]
    assert e.col_idx.tolist() == [1, 0]
    assert e.values[0].tolist() == [[0, 1.5, 0, 0]] and e.values[1].tolist() == [[-2.0, 0, 0, 0]]
    f = encode(w, "bsr4x1")
    assert f.row_ptr.tolist() == [0, 1, 2]                # block rows 0..3 and 4..7 (padded)
    assert f.col_idx.tolist() == [5, 0]
    assert f.values[:, :, 0].tolist() == [[1.5, 0, 0, 0], [-2.0, 0, 0, 0]]
    for x in (e, f):
        assert np.array_equal(decode(x), w)


def test_24_layout():
    w = np.array([[0, 5, 0, -3, 0, 0, 0, 0, 9, 0]], np.int8)     # K = 10: groups [0..3], [4..7], [8, 9, pad, pad]
    assert is_24(w)
    e = encode(w, "2:4")
    assert isinstance(e, NM24)
    assert e.values.tolist() == [[5, -3, 0, 0, 9, 0]]
    assert e.positions().tolist() == [[1, 3, 0, 1, 0, 1]]
    assert e.idx.shape == (1, 2) and e.idx.dtype == np.uint8
    assert int(e.idx[0, 0]) == 1 | 3 << 2 | 0 << 4 | 1 << 6 and int(e.idx[0, 1]) == 0 | 1 << 2
    assert e.columns().tolist() == [[1, 3, 4, 5, 8, 9]]
    assert stored_bytes(e) == 6 + 2


def test_24_rejects_dense_groups():
    w = np.array([[1, 2, 3, 0]], np.float32)
    assert not is_24(w)
    with pytest.raises(ValueError, match="row 0, columns 0..3 hold 3 non-zeros"):
        encode(w, "2:4")


def test_conv_and_gemm_matrices():
    w = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    m = conv_matrices(w, 1)
    assert m.shape == (1, 2, 12) and m[0, 1, (2 * 2 + 1) * 2 + 0] == w[1, 2, 1, 0]    # k = (c*kh + i)*kw + j
    g = conv_matrices(np.zeros((6, 2, 3, 3)), 3)
    assert g.shape == (3, 2, 18)
    assert np.array_equal(conv_weight(m, w.shape), w)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(gemm_matrix(b, 1), b) and np.array_equal(gemm_matrix(b, 0), b.T)
    with pytest.raises(ValueError):
        conv_matrices(np.zeros((5, 1, 3, 3)), 2)


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown sparse format"):
        encode(np.zeros((2, 2)), "coo")
