"""x86 lowering of the weight-only 4-bit ops (qcompiler/codegen/kernels/nbits.py) against the
reference interpreter:

* MatMulNBits (whole blocks: the (block, byte, nibble) loop nest; a K no block divides: one k
  loop; padded columns and rows; a rank-3 input; int4 and uint4; float32 and float16 scales; with
  and without a bias): bit-exact where every partial sum is exact in float32 (integer inputs, scales
  powers of two: the decode, packing and epilogue checked alone), and otherwise within the float32
  rounding of the kernel's summation order, |ours - ref| <= K 2^-24 Σ_k |a ŵ| + 2^-24 |ref|
  (the reference sums in float64 and rounds once);
* GatherBlockQuantized bit-exact (one dequantization per element, as the reference's), and within
  one float32 step where an Add reads it (LLVM contracts the dequantization and the add into an FMA);
* the library holds the weights packed: model.so of a 1536 x 384 layer (blocks of 32, uint4, float32
  scales: 5.1 bits a weight) below the packed bytes plus 200 KB and 0.18 of the float32 weights.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.ir.types import dequantize
from qcompiler.quant import reference

SPEC = TargetSpec("x86")


def run_tvm(g: Graph, feeds: dict) -> list[np.ndarray]:
    vm = tvm.runtime.vm.VirtualMachine(build_module(g, SPEC), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[v.name])) for v in g.inputs])
    return [o.numpy() for o in (list(out) if len(g.outputs) > 1 else [out])]


def _weight(n, k, blk, storage, scale_dtype, exact, rng):
    nb = -(-k // blk)
    lo, hi = (0, 15) if storage == "uint4" else (-8, 7)
    if exact:
        s = 2.0 ** rng.integers(-3, 2, n * nb) * rng.choice([-1, 1], n * nb)
    else:
        s = rng.uniform(0.005, 0.05, n * nb) * rng.choice([-1, 1], n * nb)
    if scale_dtype == "float16":
        s = s.astype(np.float16).astype(np.float32)
    z = rng.integers(lo, hi + 1, n * nb) if storage == "uint4" else np.zeros(n * nb, int)
    qp = QuantParams(storage, s, z, axis=1, block_size=blk, scale_dtype=scale_dtype)
    return rng.integers(lo, hi + 1, (n, k)).astype(np.uint8 if storage == "uint4" else np.int8), qp


def matmul_graph(shape, n, blk, storage="uint4", scale_dtype="float32", bias=True, exact=False, seed=0):
    rng = np.random.default_rng(seed)
    k = shape[-1]
    q, qp = _weight(n, k, blk, storage, scale_dtype, exact, rng)
    g = Graph("nbits")
    x = g.add_input("x", TensorType(shape, "float32"))
    ops = [x, g.add_const(q, "w", quant=qp)]
    if bias:
        b = rng.integers(-4, 5, n) if exact else rng.standard_normal(n)
        ops.append(g.add_const(b.astype(np.float32), "b"))
    y = g.create_op("MatMulNBits", ops).result
    g.outputs = [g.create_op("Relu", [y]).result]          # an epilogue fused into the write-back
    g.verify()
    xv = (rng.integers(-3, 4, shape) if exact else rng.standard_normal(shape)).astype(np.float32)
    return g, {"x": xv}


CASES = {                       # input shape, N, block, storage, scale dtype, bias
    "whole blocks": ((64, 384), 96, 32, "uint4", "float32", True),
    "rank 3, 128 per block": ((1, 24, 256), 48, 128, "uint4", "float32", True),
    "int4 f16 scales": ((16, 64), 32, 16, "int4", "float16", False),
    "ragged K, padded N and M": ((7, 200), 30, 64, "uint4", "float32", True),
    "one row": ((1, 96), 40, 32, "int4", "float32", True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matmul_nbits_exact_sums_bit_exact(case):
    shape, n, blk, st, sd, bias = CASES[case]
    g, feeds = matmul_graph(shape, n, blk, st, sd, bias, exact=True)
    assert np.array_equal(run_tvm(g, feeds)[0], reference.run(g, feeds)[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_matmul_nbits_within_float32_sum_order(case):
    shape, n, blk, st, sd, bias = CASES[case]
    g, feeds = matmul_graph(shape, n, blk, st, sd, bias, seed=1)
    ours, ref = run_tvm(g, feeds)[0], reference.run(g, feeds)[0]
    w = g.value("w")
    mag = np.abs(feeds["x"].astype(np.float64)) @ np.abs(dequantize(w.data, w.type.quant).astype(np.float64)).T
    k = shape[-1]
    bound = k * 2.0 ** -24 * mag + 2.0 ** -24 * np.abs(ref)
    assert np.all(np.abs(ours.astype(np.float64) - ref) <= bound), float(np.max(np.abs(ours - ref) - bound))


@pytest.mark.parametrize("storage,scale_dtype", [("uint4", "float32"), ("int4", "float16")])
def test_gather_block_quantized_bit_exact(storage, scale_dtype):
    rng = np.random.default_rng(3)
    q, qp = _weight(50, 80, 32, storage, scale_dtype, False, rng)
    g = Graph("emb")
    ids = g.add_input("ids", TensorType((2, 5), "int64"))
    e = g.create_op("GatherBlockQuantized", [g.add_const(q, "t", quant=qp), ids]).result
    g.outputs = [e, g.create_op("Add", [e, g.add_const(np.float32(0.5), "c")]).result]
    feeds = {"ids": np.array([[0, 49, -1, 7, 3], [-50, 2, 2, 10, 48]])}
    (ours, ours_add), (ref, ref_add) = run_tvm(g, feeds), reference.run(g, feeds)
    assert np.array_equal(ours, ref)
    # fused into the Add's kernel, LLVM contracts (q - z) * s + 0.5 into one FMA: one rounding fewer
    assert np.all(np.abs(ours_add - ref_add) <= np.spacing(np.abs(ref_add)))


def test_library_holds_packed_weights(tmp_path):
    g, _ = matmul_graph((8, 384), 1536, 32, bias=False)
    w = g.value("w").type
    packed = w.stored_bytes                                   # 4 bits a weight + scales + zero points
    write_artifact(g, SPEC, str(tmp_path / "a"))
    so = (tmp_path / "a" / "model.so").stat().st_size
    assert so < packed + 200_000 and so < 0.18 * 4 * w.size, (so, packed, 4 * w.size)


def conv_graph(c, o, k, *, group=1, stride=1, pad=0, blk=32, storage="uint4", scale_dtype="float32", exact=False,
               seed=0, hw=10):
    rng = np.random.default_rng(seed)
    cg = c // group
    nbc = -(-cg // blk)
    lo, hi = (0, 15) if storage == "uint4" else (-8, 7)
    n_s = o * nbc * k * k
    s = 2.0 ** rng.integers(-3, 2, n_s) if exact else rng.uniform(0.005, 0.05, n_s)
    s = s * rng.choice([-1, 1], n_s)
    if scale_dtype == "float16":
        s = s.astype(np.float16).astype(np.float32)
    z = rng.integers(lo, hi + 1, n_s) if storage == "uint4" else np.zeros(n_s, int)
    qp = QuantParams(storage, s, z, axis=1, block_size=blk, scale_dtype=scale_dtype)
    q = rng.integers(lo, hi + 1, (o, cg, k, k)).astype(np.uint8 if storage == "uint4" else np.int8)
    g = Graph("cnbits")
    x = g.add_input("x", TensorType((1, c, hw, hw), "float32"))
    b = g.add_const((rng.integers(-4, 5, o) if exact else rng.standard_normal(o)).astype(np.float32), "b")
    y = g.create_op("ConvNBits", [x, g.add_const(q, "w", quant=qp), b],
                    {"strides": [stride, stride], "pads": [pad] * 4, "dilations": [1, 1], "group": group}).result
    g.outputs = [g.create_op("Relu", [y]).result]
    g.verify()
    xv = (rng.integers(-3, 4, (1, c, hw, hw)) if exact else rng.standard_normal((1, c, hw, hw))).astype(np.float32)
    return g, {"x": xv}


CONV_CASES = {                  # C, O, k, group, stride, pad, block, storage, scale dtype
    "3x3 pad 1": (32, 24, 3, 1, 1, 1, 32, "uint4", "float32"),
    "1x1, 2 blocks": (64, 64, 1, 1, 1, 0, 32, "int4", "float16"),
    "grouped, strided": (64, 32, 3, 2, 2, 1, 16, "uint4", "float32"),
    "short block": (48, 16, 3, 1, 1, 0, 128, "int4", "float32"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_nbits_exact_sums_bit_exact(case):
    c, o, k, grp, st, pad, blk, storage, sd = CONV_CASES[case]
    g, feeds = conv_graph(c, o, k, group=grp, stride=st, pad=pad, blk=blk, storage=storage, scale_dtype=sd, exact=True)
    assert np.array_equal(run_tvm(g, feeds)[0], reference.run(g, feeds)[0])


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_nbits_within_float32_sum_order(case):
    from qcompiler.ir.windows import conv_sum
    c, o, k, grp, st, pad, blk, storage, sd = CONV_CASES[case]
    g, feeds = conv_graph(c, o, k, group=grp, stride=st, pad=pad, blk=blk, storage=storage, scale_dtype=sd, seed=2)
    ours, ref = run_tvm(g, feeds)[0], reference.run(g, feeds)[0]
    op = g.ops[0]
    w = op.operands[1]
    mag = conv_sum(np.abs(feeds["x"]), np.abs(dequantize(w.data, w.type.quant)), {**op.attrs}, ref.shape[2:])
    kk = c // grp * k * k
    bound = kk * 2.0 ** -24 * mag + 2.0 ** -24 * np.abs(ref)
    assert np.all(np.abs(ours.astype(np.float64) - ref) <= bound), float(np.max(np.abs(ours - ref) - bound))
