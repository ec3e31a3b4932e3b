"""Sparse kernels (qcompiler/codegen/kernels/sparse.py) against the dense kernels on the SAME pruned
weights: one-layer graphs (QLinearGemm, QLinearConv, Gemm, Conv) compiled twice, once dense and once
with ``graph.meta["sparsity"]`` naming a format for the layer (CSR, BSR 1x4, BSR 4x1, 2:4), run on the
same inputs. int8 outputs must be BIT-EXACT (and equal to the integer reference interpreter); fp32
within 1e-5·max|ref|. Sparsities 50-95 %, shapes with tails (K, N, batch and spatial sizes that are
not multiples of the vector width or of 4), grouped and strided/padded convs, GEMV (batch 1).
Also: a real pruned layer of fashion_mobilenet, aarch64 builds run under qemu, and CUDA builds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm

from qcompiler.codegen.kernels import sparse as ksparse
from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.ir.ops import infer_types
from qcompiler.quant import reference
from qcompiler.quant.requant import conv_multipliers

SPEC = TargetSpec("x86")
FORMATS = ("csr", "bsr1x4", "bsr4x1", "2:4")
U8 = QuantParams("uint8", (0.02,), (117,))
I8 = QuantParams("int8", (0.03,), (-5,))


def prune(w: np.ndarray, sparsity: float, pattern: str, rng) -> np.ndarray:
    """Zero the smallest-magnitude weights of the [N, K] view (rows = output channels):
    unstructured (random ties broken by magnitude), 2:4 along K, or whole 1x4 blocks along K."""
    w = w.copy()
    m = w.reshape(w.shape[0], -1)
    if pattern == "2:4":
        k = m.shape[1] // 4 * 4
        g = m[:, :k].reshape(m.shape[0], -1, 4)
        order = np.argsort(np.abs(g.astype(np.float64)) + rng.random(g.shape) * 1e-3, axis=2)
        np.put_along_axis(g, order[:, :, :2], 0, axis=2)
        m[:, :k] = g.reshape(m.shape[0], k)
        m[:, k:][:, ::2] = 0
    elif pattern == "block4":
        kb = -(-m.shape[1] // 4)
        keep = rng.random((m.shape[0], kb)) >= sparsity
        m *= np.repeat(keep, 4, axis=1)[:, :m.shape[1]].astype(m.dtype)
    else:
        m[rng.random(m.shape) < sparsity] = 0
    return m.reshape(w.shape)


def meta(g: Graph, op_name: str, fmt: str) -> Graph:
    g.meta["sparsity"] = {op_name: {"format": fmt}}
    return g


def run(g: Graph, feeds: dict, spec=SPEC) -> np.ndarray:
    ex = build_module(g, spec)
    vm = tvm.runtime.vm.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[v.name])) for v in g.inputs]).numpy()


# ---- graph builders ------------------------------------------------------------------------------
def qgemm_graph(m, k, n, w, rng, storage="uint8"):
    qa = U8 if storage == "uint8" else I8
    g = Graph("sg")
    a = g.add_input("a", TensorType((m, k), storage, qa))
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, n))
    wv = g.add_const(w, "w", QuantParams("int8", ws, (0,) * n, axis=0))
    bq = g.add_const(rng.integers(-3000, 3000, n).astype(np.int32), "b",
                     QuantParams("int32", tuple(float(np.float32(qa.scale[0]) * np.float32(v)) for v in ws), (0,) * n, axis=0))
    qo = QuantParams("uint8", (0.05,), (100,))
    ms, ss = conv_multipliers(qa.scale[0], ws, qo.scale[0])
    op = g.create_op("QLinearGemm", [a, wv, bq], {"multiplier": ms, "shift": ss, "activation": "Relu",
                                                 "activation_params": []},
                     result_types=[TensorType((m, n), "uint8", qo)], name="layer")
    g.outputs = [op.result]
    return g


def qconv_graph(shape, w, rng, *, group=1, s=(1, 1), p=(0, 0, 0, 0), storage="uint8"):
    qx = U8 if storage == "uint8" else I8
    g = Graph("sc")
    x = g.add_input("x", TensorType(shape, storage, qx))
    o = w.shape[0]
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, o))
    wv = g.add_const(w, "w", QuantParams("int8", ws, (0,) * o, axis=0))
    bq = g.add_const(rng.integers(-3000, 3000, o).astype(np.int32), "b",
                     QuantParams("int32", tuple(float(np.float32(qx.scale[0]) * np.float32(v)) for v in ws), (0,) * o, axis=0))
    qo = QuantParams(storage, (0.05,), (90,) if storage == "uint8" else (3,))
    ms, ss = conv_multipliers(qx.scale[0], ws, qo.scale[0])
    attrs = {"strides": list(s), "dilations": [1, 1], "pads": list(p), "group": group, "activation": "",
             "activation_params": [], "multiplier": ms, "shift": ss}
    out = infer_types("QLinearConv", [x.type, wv.type, bq.type], attrs)[0].shape
    op = g.create_op("QLinearConv", [x, wv, bq], attrs, result_types=[TensorType(out, storage, qo)], name="layer")
    g.outputs = [op.result]
    return g


def fgemm_graph(m, k, n, w, rng):
    g = Graph("fg")
    a = g.add_input("a", TensorType((m, k), "float32"))
    op = g.create_op("Gemm", [a, g.add_const(w, "w"), g.add_const(rng.standard_normal(n).astype(np.float32), "b")],
                     {"transB": 1}, name="layer")
    g.outputs = [op.result]
    return g


def fconv_graph(shape, w, rng, *, group=1, s=(1, 1), p=(0, 0, 0, 0)):
    g = Graph("fc")
    x = g.add_input("x", TensorType(shape, "float32"))
    op = g.create_op("Conv", [x, g.add_const(w, "w"), g.add_const(rng.standard_normal(w.shape[0]).astype(np.float32), "b")],
                     {"strides": list(s), "pads": list(p), "group": group}, name="layer")
    g.outputs = [op.result]
    return g


def qinput(shape, storage, rng):
    lo, hi = (0, 256) if storage == "uint8" else (-128, 128)
    return rng.integers(lo, hi, shape).astype(storage)


def check_int8(g, feeds, fmt, what):
    dense = run(g, feeds)
    want = reference.run(g, feeds)[0]
    assert np.array_equal(dense, want), f"{what}: the dense kernel is not the reference"
    sparse = run(meta(g, "layer", fmt), feeds)
    diff = sparse.astype(np.int64) - dense
    assert np.array_equal(sparse, dense), f"{what} {fmt}: {int((diff != 0).sum())} of {dense.size} differ"


def check_fp32(g, feeds, fmt, what):
    dense = run(g, feeds)
    sparse = run(meta(g, "layer", fmt), feeds)
    err = float(np.abs(sparse - dense).max())
    assert err <= 1e-5 * float(np.abs(dense).max()), f"{what} {fmt}: max err {err}"


PATTERN = {"csr": "unstructured", "bsr4x1": "unstructured", "bsr1x4": "block4", "2:4": "2:4"}


# ---- x86 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m, k, n, sparsity, storage", [
    (1, 70, 37, 0.5, "uint8"),         # GEMV, tails everywhere
    (5, 64, 48, 0.8, "int8"),
    (16, 130, 19, 0.9, "uint8"),
    (3, 33, 9, 0.95, "uint8"),         # empty rows likely
    (2, 2100, 12, 0.4, "uint8"),       # 255·Σ|w| >= 2^24: int16 products, int32 sums (not exact in fp32)
])
def test_qgemm_sparse_bit_exact(fmt, m, k, n, sparsity, storage):
    rng = np.random.default_rng(m * 1000 + k)
    w = prune(rng.integers(-127, 128, (n, k)).astype(np.int8), sparsity, PATTERN[fmt], rng)
    g = qgemm_graph(m, k, n, w, rng, storage)
    assert ksparse._int_mode(storage, w) == ("float32" if k < 2000 else storage)
    check_int8(g, {"a": qinput((m, k), storage, rng)}, fmt, f"QLinearGemm {m}x{k}x{n} @{sparsity}")


CONVS = [  # (input shape, O, kernel, group, strides, pads, sparsity)
    ((2, 16, 9, 10), 24, (1, 1), 1, (1, 1), (0, 0, 0, 0), 0.7),       # 1x1: X read in place (fp32) / uint8
    ((1, 8, 11, 7), 12, (3, 3), 1, (1, 1), (1, 1, 1, 1), 0.5),
    ((1, 6, 12, 12), 10, (3, 3), 2, (2, 2), (1, 0, 1, 2), 0.8),       # grouped, strided, asymmetric pads
    ((1, 3, 10, 9), 5, (2, 3), 1, (2, 1), (0, 1, 0, 1), 0.9),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape, o, k, group, s, p, sparsity", CONVS)
def test_qconv_sparse_bit_exact(fmt, shape, o, k, group, s, p, sparsity):
    rng = np.random.default_rng(o * 100 + shape[1])     # bsr4x1 with O/g % 4 != 0: the dense kernel
    w = prune(rng.integers(-127, 128, (o, shape[1] // group, *k)).astype(np.int8), sparsity, PATTERN[fmt], rng)
    for storage in ("uint8", "int8"):
        g = qconv_graph(shape, w, rng, group=group, s=s, p=p, storage=storage)
        check_int8(g, {"x": qinput(shape, storage, rng)}, fmt, f"QLinearConv {storage} {shape}->{o} {k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp32_gemm_and_conv_sparse(fmt):
    rng = np.random.default_rng(3)
    for m, k, n, sp in ((1, 70, 37, 0.6), (9, 128, 40, 0.9)):
        w = prune(rng.standard_normal((n, k)).astype(np.float32), sp, PATTERN[fmt], rng)
        check_fp32(fgemm_graph(m, k, n, w, rng), {"a": rng.standard_normal((m, k)).astype(np.float32)}, fmt,
                   f"Gemm {m}x{k}x{n}")
    for shape, o, kk, group, s, p, sp in CONVS:
        if fmt == "bsr4x1" and (o // group) % 4:
            continue
        w = prune(rng.standard_normal((o, shape[1] // group, *kk)).astype(np.float32), sp, PATTERN[fmt], rng)
        check_fp32(fconv_graph(shape, w, rng, group=group, s=s, p=p),
                   {"x": rng.standard_normal(shape).astype(np.float32)}, fmt, f"Conv {shape}->{o} {kk}")


# ---- aarch64 under qemu, CUDA build ------------------------------------------------------------
def _arm_cases():
    rng = np.random.default_rng(11)
    wg = prune(rng.integers(-127, 128, (21, 70)).astype(np.int8), 0.8, "unstructured", rng)
    w24 = prune(rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8), 0.5, "2:4", rng)
    wb = prune(rng.integers(-127, 128, (12, 6, 3, 3)).astype(np.int8), 0.7, "block4", rng)
    wf = prune(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), 0.8, "unstructured", rng)
    return [
        ("qgemm-csr", qgemm_graph(5, 70, 21, wg, rng), "csr", {"a": qinput((5, 70), "uint8", rng)}),
        ("qgemm-gemv-bsr4x1", qgemm_graph(1, 70, 21, wg, rng), "bsr4x1", {"a": qinput((1, 70), "uint8", rng)}),
        ("qconv-2:4", qconv_graph((1, 8, 9, 7), w24, rng, p=(1, 1, 1, 1)), "2:4",
         {"x": qinput((1, 8, 9, 7), "uint8", rng)}),
        ("qconv-bsr1x4-int8", qconv_graph((1, 6, 8, 8), wb, rng, s=(2, 2), p=(1, 1, 1, 1), storage="int8"),
         "bsr1x4", {"x": qinput((1, 6, 8, 8), "int8", rng)}),
        ("conv-fp32-csr", fconv_graph((1, 8, 10, 6), wf, rng, p=(1, 1, 1, 1)), "csr",
         {"x": rng.standard_normal((1, 8, 10, 6)).astype(np.float32)}),
    ]


ARM_SPEC = TargetSpec("arm", cpu="cortex-a76", features=("+dotprod",))


def arm_runner(tmp_path):
    """``run_arm(artifact_dir, x, like) -> y``: runs a one-input artifact under qemu-aarch64 with the
    TVM runtime only (examples/deploy_cpp, built here), the output read as ``like``'s dtype/shape;
    skips the test where aarch64 code cannot run."""
    import subprocess

    from qcompiler.codegen.arm import toolchain as arm
    missing = arm.emulation_problems()
    if missing:
        pytest.skip("cannot run aarch64 code here: " + "; ".join(missing))
    repo = Path(__file__).resolve().parents[2]
    build = tmp_path / "deploy"
    r = subprocess.run(["make", "-s", "-C", str(repo / "examples" / "deploy_cpp"), "ARCH=aarch64", f"BUILD={build}",
                        f"TVM_RT={arm.runtime_dir()}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

    def run_arm(out, x, like):
        (tmp_path / "x.bin").write_bytes(np.ascontiguousarray(x).tobytes())
        r = subprocess.run(arm.qemu_command(build / "run_model", out, tmp_path / "x.bin", "-o", tmp_path / "y"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return np.fromfile(tmp_path / "y0.bin", like.dtype).reshape(like.shape)
    return run_arm


@pytest.mark.qemu
def test_sparse_on_arm_under_qemu(tmp_path):
    """A few sparse layers cross-built for aarch64 (cortex-a76, 4-lane NEON vectors) and run under
    qemu-aarch64 with the TVM runtime only (examples/deploy_cpp): equal to the x86 dense kernel
    (int8 bit-exact; fp32 within 1e-5·max|ref|)."""
    from qcompiler.codegen.artifact import write_artifact
    run_arm = arm_runner(tmp_path)
    for name, g, fmt, feeds in _arm_cases():
        dense = run(g, feeds)
        out = write_artifact(meta(g, "layer", fmt), ARM_SPEC, tmp_path / name.replace(":", "") / "OUT")
        got = run_arm(out, next(iter(feeds.values())), dense)
        if dense.dtype == np.float32:
            assert np.abs(got - dense).max() <= 1e-5 * np.abs(dense).max(), name
        else:
            assert np.array_equal(got, dense), f"{name}: {int((got != dense).sum())} of {dense.size} differ"


@pytest.mark.parametrize("fmt", FORMATS)
def test_sparse_cuda_builds(tmp_path, fmt):
    """CUDA (sm_90) artifacts of sparse int8 and fp32 layers build on this GPU-less host, with
    device code compiled (fatbin, no CUDA source); run only where a GPU is present (not here)."""
    import shutil

    from qcompiler.codegen.cuda import aot as cuda_aot
    from qcompiler.codegen.artifact import write_artifact
    if not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    rng = np.random.default_rng(5)
    pattern = PATTERN[fmt]
    wq = prune(rng.integers(-127, 128, (16, 8, 3, 3)).astype(np.int8), 0.7, pattern, rng)
    wf = prune(rng.standard_normal((24, 40)).astype(np.float32), 0.7, pattern, rng)
    spec = TargetSpec("cuda", arch=("sm_90",))
    for name, g in (("q", qconv_graph((1, 8, 9, 7), wq, rng, p=(1, 1, 1, 1))), ("f", fgemm_graph(3, 40, 24, wf, rng))):
        out = write_artifact(meta(g, "layer", fmt), spec, tmp_path / name / "OUT")
        data = (out / "model.so").read_bytes()
        assert ("sass", "sm_90") in cuda_aot.fatbin_contents(data)
        assert b"__global__" not in data


# ---- real model: fashion_mobilenet pruned, quantized, encoded --------------------------------------
def test_fashion_mobilenet_pruned_int8_sparse_equals_dense(tmp_path):
    """fashion_mobilenet pruned to 80 % (unstructured, magnitude; depthwise convs skipped by prune),
    quantized on 64 real Fashion-MNIST images, formats chosen by ``encode-sparse`` (objective size:
    every pruned layer gets a sparse format), compiled once with the sparse kernels and once dense:
    the uint8 outputs on 64 other real test images are identical, and equal to the integer reference.
    Also one real layer alone in every format."""
    import realmodels as rm

    from qcompiler.passes import PassContext, PassManager, run_passes
    from qcompiler.passes.encode_sparse import EncodeSparseOptions
    from qcompiler.passes.prune import PruneOptions
    from qcompiler.passes.quantize import QuantizeOptions
    d = rm.fashion_test()
    path = rm.MODELS_DIR / "fashion_mobilenet.onnx"
    if d is None or not path.exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz missing")
    x = d[0].astype(np.float32)
    g, inp = rm.import_batched(str(path), (1, *x.shape[1:]), 32)
    run_passes(g)
    PassManager("prune", ctx=PassContext(options={"prune": PruneOptions(sparsity=0.8)})).run(g)
    calib = [{inp: x[s:s + 32]} for s in (0, 32)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(g)
    PassManager("encode-sparse", ctx=PassContext(options={"encode-sparse": EncodeSparseOptions(objective="size")})).run(g)
    chosen = {op.name: ksparse.layer_format(g, op) for op in g.ops if op.kind in ksparse.KINDS}
    sparse_layers = [n for n, f in chosen.items() if f]
    print("\nsparse layers:", {n: chosen[n] for n in sparse_layers})
    assert len(sparse_layers) >= 5
    feeds = {inp: x[64:96]}
    got = run(g, feeds)
    record = g.meta.pop("sparsity")
    dense = run(g, feeds)
    g.meta["sparsity"] = record
    assert np.array_equal(got, dense)
    assert np.array_equal(got, reference.run(g, feeds)[0])
    # one real pruned layer (the largest pointwise conv) alone in every format, int8 and fp32
    op = max((o for o in g.ops if o.kind == "QLinearConv" and chosen.get(o.name)),
             key=lambda o: o.operands[1].data.size)
    w = op.operands[1].data
    rng = np.random.default_rng(0)
    shape = (1, *op.operands[0].type.shape[1:])
    a = op.attrs
    for fmt in FORMATS:
        if fmt == "2:4":
            continue                                         # unstructured weights are not 2:4
        gq = qconv_graph(shape, w, rng, group=a.get("group", 1), s=a.get("strides") or (1, 1), p=a.get("pads") or (0,) * 4)
        check_int8(gq, {"x": qinput(shape, "uint8", rng)}, fmt, f"fashion {op.name}")
