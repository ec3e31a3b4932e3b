"""Dynamic int8 on x86: DynamicQuantParams + DynamicQLinearGemm (an activation quantized at run time,
per row or per tensor) against the numpy oracle (qcompiler.quant.reference / quant.dynamic), on
this host's CPU and on the generated code of the portable AVX2 level (vpmaddwd), and the oracle
itself against an independent float64 derivation.

Exactness: the run-time parameters [s, 1/s, z] and the uint8 activations are equal bit for bit
(one division and one multiply-round each, no contraction possible); the float32 result
``f32(acc) * f32(s s_w)`` is bit for bit without a bias, and with one within an ulp of the product
and one of the result (LLVM may contract ``acc * f + b`` into one FMA, which rounds once instead
of twice)."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, TensorType
from qcompiler.ir.types import quantize
from qcompiler.quant import qparams as qpm
from qcompiler.quant import reference
from qcompiler.quant.dynamic import quant_params, quantize_rows

from test_x86_int8 import run_tvm

HOST = TargetSpec("x86")
AVX2 = TargetSpec("x86", cpu="x86-64-v3")


def dynamic_graph(m: int, k: int, n: int, granularity: str, *, bias: bool = True, act: str = "",
                  per_channel: bool = True, seed: int = 0, params_output: bool = False):
    rng = np.random.default_rng(seed)
    g = Graph("dyn")
    a = g.add_input("a", TensorType((m, k), "float32"))
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.2, (n, 1))).astype(np.float32)
    qp = qpm.per_channel_symmetric(w, 0) if per_channel else qpm.symmetric(float(w.min()), float(w.max()))
    p = g.create_op("DynamicQuantParams", [a], {"granularity": granularity}, name="qparams").result
    ops = [a, p, g.add_const(quantize(w, qp), "w_q", quant=qp)]
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    if bias:
        ops.append(g.add_const(b, "b"))
    y = g.create_op("DynamicQLinearGemm", ops, {"activation": act,
                                                 "activation_params": [-0.5, 0.75] if act == "Clip" else []},
                    name="gemm").result
    g.outputs = [p, y] if params_output else [y]
    g.verify()
    return g, w, b


def activations(m: int, k: int, seed: int = 1) -> np.ndarray:
    """Rows of different ranges: a shifted one (all positive: zero point 0), an outlier row, a zero row."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 3.0, (m, 1))).astype(np.float32)
    x[0] = np.abs(x[0]) + 0.5
    if m > 2:
        x[1, :3] *= 40.0
        x[2] = 0.0
    return x


@pytest.mark.parametrize("spec", [HOST, AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("m,k,n,gran", [(128, 384, 96, "token"), (197, 64, 30, "token"), (5, 20, 9, "tensor"),
                                        (16, 384, 64, "tensor")])
def test_params_and_gemm_without_bias_bit_exact(spec, m, k, n, gran):
    g, _, _ = dynamic_graph(m, k, n, gran, bias=False, params_output=True)
    x = activations(m, k)
    want = reference.run(g, {"a": x})
    got = run_tvm(g, {"a": x}, spec)
    np.testing.assert_array_equal(got[0], want[0])          # [s, 1/s, z] per row (or once)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("spec", [HOST, AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("gran,act", [("token", ""), ("token", "Relu"), ("tensor", "Clip")])
def test_gemm_with_bias_and_clamp(spec, gran, act):
    g, _, b = dynamic_graph(100, 128, 40, gran, act=act, per_channel=gran == "token")
    x = activations(100, 128)
    want = reference.run(g, {"a": x})[0]
    got = run_tvm(g, {"a": x}, spec)[0]
    assert np.all(np.abs(got - want) <= fma_tolerance(want, b)), float(np.max(np.abs(got - want)))


def fma_tolerance(y: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|fma(p, 1, b) - (round(p) + b)| <= ulp(p)/2 + ulp(y)/2 for the product p = y - b (before the
    clamp: a clamped element is exact either way): one ulp of each, to be safe."""
    y = np.asarray(y, np.float32)
    return np.spacing(np.abs(y - b)) + np.spacing(np.abs(y))


def test_oracle_matches_float64_derivation():
    """The oracle's integer form (Σ q w - z Σ w, then one product with s s_w) equals the float64
    product of the dequantized operands, (q - z) s @ (w s_w)^T + b, to float32 rounding; the rows'
    parameters follow ONNX Runtime's DynamicQuantizeLinear (0 in range, 255 steps)."""
    g, w, b = dynamic_graph(64, 96, 24, "token", params_output=True)
    x = activations(64, 96)
    p, y = reference.run(g, {"a": x})
    s, r, z = p[:, :1], p[:, 1:2], p[:, 2:3]
    lo, hi = np.minimum(x.min(axis=1, keepdims=True), 0), np.maximum(x.max(axis=1, keepdims=True), 0)
    expect_s = np.where(hi > lo, (hi - lo) / 255, 1).astype(np.float32)
    np.testing.assert_array_equal(s, expect_s)
    assert np.all(z == np.clip(np.rint(-lo / s), 0, 255))             # the zero point: real 0 exactly
    q = quantize_rows(x, r, z)
    assert q[2].max() == q[2].min() == z[2, 0]                         # the zero row: all zero point
    wq = g.consts["w_q"]
    w_deq = wq.data.astype(np.float64) * np.asarray(wq.type.quant.scale)[:, None]
    x_deq = (q.astype(np.float64) - z) * s
    want = x_deq @ w_deq.T + b
    np.testing.assert_allclose(y, want, rtol=0, atol=4e-6 * np.abs(want).max())
    # and the quantization error itself is that of 8 bits per row: within half a step of x per element
    assert np.all(np.abs(x_deq - x) <= 0.5 * s * (1 + 1e-5))
    sq = qpm.sqnr_db(x @ w.T + b, y)
    assert sq > 35.0, sq


def test_tensor_granularity_is_one_range_per_sample():
    """The oracle run on two stacked samples (the batch-agnostic evaluation the report uses) gives
    each sample its own per-tensor range, as the kernel does for each call."""
    g, _, _ = dynamic_graph(8, 32, 8, "tensor")
    x1, x2 = activations(8, 32, seed=2), activations(8, 32, seed=3) * 10
    both = reference.run(g, {"a": np.concatenate([x1, x2])})[0]
    np.testing.assert_array_equal(both[:8], reference.run(g, {"a": x1})[0])
    np.testing.assert_array_equal(both[8:], reference.run(g, {"a": x2})[0])


def test_params_of_quant_params_helper():
    x = activations(6, 10)
    p = quant_params(x, "tensor")
    assert p.shape == (1, 3) and p[0, 0] == np.float32((max(x.max(), 0) - min(x.min(), 0)) / np.float32(255))


# ---- AMX tiles (qcompiler/codegen/x86/amx_gemm.c): the same integers as the VNNI kernels ----------
SPR = TargetSpec("x86", cpu="sapphirerapids")


def _host_has_amx() -> bool:
    from qcompiler.codegen.x86.intrin import has_amx_int8
    return has_amx_int8(HOST)


def test_amx_is_chosen_for_whole_tiles_only(monkeypatch):
    """A Sapphire Rapids target lowers a gemm of >= 16 rows and K % 64 == 0, K >= 256 to the AMX call
    (checked on the generated TIR, any host); K = 20, K = 128 or 8 rows keep the vpdpbusd loops;
    QC_X86_AMX=0 too."""
    from qcompiler.codegen.lower import lower
    monkeypatch.delenv("QC_X86_AMX", raising=False)

    def calls_amx(g, spec=SPR):
        mod = lower(g, spec)
        return any("qc_amx_gemm_u8s8" in mod[gv].script() for gv in mod.functions if "dynamicqlineargemm" in gv.name_hint)
    assert calls_amx(dynamic_graph(128, 384, 96, "token")[0])
    assert not calls_amx(dynamic_graph(128, 20, 96, "token")[0])
    assert not calls_amx(dynamic_graph(128, 128, 96, "token")[0])
    assert not calls_amx(dynamic_graph(8, 384, 96, "token")[0])
    assert not calls_amx(dynamic_graph(128, 384, 96, "token")[0], TargetSpec("x86", cpu="icelake-server"))
    monkeypatch.setenv("QC_X86_AMX", "0")
    assert not calls_amx(dynamic_graph(128, 384, 96, "token")[0])


@pytest.mark.skipif(not _host_has_amx(), reason="this CPU has no AMX-INT8 tiles")
@pytest.mark.parametrize("m,k,n", [(16, 256, 9), (130, 256, 40), (48, 320, 100), (128, 768, 96), (200, 256, 20)])
def test_amx_tail_rows_and_columns_bit_exact(m, k, n, monkeypatch):
    """Row counts that are not a multiple of the 32-row tile pair (a 16-row tail, rows padded to 16),
    column counts that are not a multiple of 32, both loop orders (M < N: column blocks outer;
    M >= N: row blocks outer): equal to the oracle and to the VNNI kernel."""
    g, _, _ = dynamic_graph(m, k, n, "token", bias=False)
    x = activations(m, k)
    want = reference.run(g, {"a": x})[0]
    np.testing.assert_array_equal(run_tvm(g, {"a": x}), [want])
    monkeypatch.setenv("QC_X86_AMX", "0")
    np.testing.assert_array_equal(run_tvm(g, {"a": x}), [want])


@pytest.mark.parametrize("amx", [False, True], ids=["plain-fallback", "amx"])
def test_amx_gemm_c_both_paths_exact(tmp_path, amx):
    """``amx_gemm.c`` called directly: the tile kernel (where this CPU has AMX) and the plain loop it
    falls back to (a compiler without AMX intrinsics, or tile state refused by the OS: built here
    with -DQC_NO_AMX) give A·B exactly, in both loop orders, with a 16-row tail."""
    import ctypes
    import platform
    import shutil
    import subprocess
    from pathlib import Path

    from qcompiler.codegen.kernels.qdot import amx_weights
    if platform.machine() != "x86_64" or not shutil.which("gcc"):
        pytest.skip("x86-64 with gcc only")
    if amx and not _host_has_amx():
        pytest.skip("this CPU has no AMX-INT8 tiles")
    src = Path(__file__).resolve().parents[2] / "qcompiler" / "codegen" / "x86" / "amx_gemm.c"
    lib = tmp_path / "amx.so"
    subprocess.run(["gcc", "-x", "c", "-O2", "-shared", "-fPIC", "-DQC_API=", *([] if amx else ["-DQC_NO_AMX"]),
                    str(src), "-o", str(lib)], check=True, capture_output=True)
    fn = ctypes.CDLL(str(lib)).qc_amx_gemm_u8s8
    fn.restype = ctypes.c_int32
    rng = np.random.default_rng(5)
    for m, k, n, rows_outer in [(48, 256, 64, 0), (80, 320, 32, 1), (16, 256, 96, 0)]:
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        w = rng.integers(-127, 128, (n, k)).astype(np.int8)
        b = amx_weights(w, k, n)
        c = np.zeros((m, n), np.int32)
        outer = -(-m // 32) if rows_outer else n // 32
        ptr = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)]
        rc = fn(*ptr, m, n, k, 0, outer, rows_outer)
        assert rc == (0 if amx else 1)
        np.testing.assert_array_equal(c, a.astype(np.int64) @ w.T.astype(np.int64))
