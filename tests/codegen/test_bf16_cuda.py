"""``--dtype bf16 --target cuda``: bfloat16 storage of weights and activations, float32 arithmetic.

bfloat16 keeps float32's 8-bit exponent and 8 significand bits (7 stored), so one store rounds by at
most u = 2^-9 ~ 1.95e-3 relative (round to nearest-even), 8x fp16's 2^-12. Errors here therefore
sit ~8x above the fp16 figures in qcompiler/codegen/lower.py ("Precision").

No GPU is needed for the numerics: the module lowered for CUDA (plain NCHW, unscheduled TIR with
bfloat16 buffers) is compiled for the host CPU with LLVM, whose TIR pipeline legalizes bfloat16
(tirx.transform.BF16ComputeLegalize: arithmetic promoted to float32; BF16StorageLegalize: buffers
as uint16, float32 -> bf16 casts rounded to nearest-even), the same values the CUDA kernels'
``__float2bfloat16``/``__bfloat162float`` produce. dlight only reorders and binds loops.

Measured (after the default passes, vs ONNX Runtime fp32 on the original ONNX file, max error /
max|ref|, 2026-11-23): fashion_mobilenet 1.22e-2 worst / 4.9e-3 median over the first 32
Fashion-MNIST test images (top-1 = ONNX Runtime's on 32/32), mnistnet 3.0e-3 worst / 1.9e-3 median
over 8 MNIST digits (8/8), rapidocr-cls 3.6e-3 (synthetic text line). TOL = 2e-2 is ~10 u: 1.6x the
worst measured sample, and below what a wrong rounding (truncation) or a layer left in the wrong
dtype gives. rapidocr-rec (1.03e-1; per-timestep argmax agrees on 38/40 steps) and rapidocr-det
(4.8e-1 on a few edge pixels of the sigmoid map; 183 of 102,400 pixels flip at threshold 0.3, mean
error 1.5e-3) miss it, as they miss 1e-2 already in fp16 (1.75e-2 / 6.6e-2 on this same path):
reported by the slow xfail test below.

On an H100 (2026-11-23, prebuilt sm_90 artifacts, runtime-only TVM) the same samples gave the same
figures to three digits: fashion_mobilenet 1.22e-2 / 4.89e-3 (32/32 top-1), mnistnet 3.00e-3,
rapidocr-cls 3.60e-3; rapidocr-rec 9.1e-2 (39/40 timesteps), rapidocr-det 5.2e-1 (143 pixels flip):
the CPU path is a faithful model of the GPU's bf16 numerics (dlight changes only the order of the
float32 accumulations).

The CUDA build test needs nvcc; it records the CUDA C++ that TVM hands to nvcc (the artifact only
holds the fatbin) and checks that activations and weights are ``nv_bfloat16`` there. The artifact
runs on a GPU in tests/codegen/test_cuda_gpu.py (``test_bf16_fashion_matches_onnxruntime``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax

import qcompiler
from qcompiler.codegen.cuda import aot as cuda_aot
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.lower import lower
from qcompiler.codegen.target import TargetSpec
from qcompiler.errors import UserError
from qcompiler.ir import Graph, TensorType
from realmodels import fashion_test, ort_run, project_models, rapidocr_models

BF16 = TargetSpec("cuda", dtype="bf16", arch=("sm_90",))
TOL = 2e-2
NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
MODELS = {m.name: m for m in rapidocr_models() + project_models()}
SAMPLES = {"fashion_mobilenet": 32, "mnistnet": 8, "rapidocr-cls": 1}


def _bf16(a) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest-even) -> float32."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _on_cpu(mod: tvm.IRModule) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())


def _two_layer_graph() -> Graph:
    """x(2x16) -> MatMul w1 -> Add b1 -> Relu -> MatMul w2 -> Add b2: the hidden layer is stored."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w1[0, 0], w1[0, 1] = 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8      # ties: round to 1 and to 1 + 2^-6
    g = Graph("two_layer")
    x = g.add_input("x", TensorType((2, 16), "float32"))
    ws = [g.add_const(a, n) for a, n in ((w1, "w1"), (rng.standard_normal(32).astype(np.float32), "b1"),
                                         (rng.standard_normal((32, 8)).astype(np.float32), "w2"),
                                         (rng.standard_normal(8).astype(np.float32), "b2"))]
    h = g.create_op("Relu", [g.create_op("Add", [g.create_op("MatMul", [x, ws[0]]).result, ws[1]]).result]).result
    g.outputs = [g.create_op("Add", [g.create_op("MatMul", [h, ws[2]]).result, ws[3]], result_names=["y"]).result]
    return g


def _main_constants(mod: tvm.IRModule) -> list[np.ndarray]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.value.numpy())
                                    if isinstance(e, tvm.ir.GenericConst) else None)
    return found


def test_weights_and_activations_are_bf16_rounded_to_nearest_even():
    g = _two_layer_graph()
    w1, b1, w2, b2 = (v.data for v in g.consts.values())
    mod = lower(g, BF16)
    consts = _main_constants(mod)
    assert consts and all(c.dtype == ml_dtypes.bfloat16 for c in consts), [c.dtype for c in consts]
    got = np.sort(np.concatenate([c.astype(np.float32).ravel() for c in consts]))
    want = np.sort(np.concatenate([_bf16(a).ravel() for a in (w1, b1, w2, b2)]))
    np.testing.assert_array_equal(got, want)                   # every weight, bit for bit, RNE
    assert 1.0 in got and 1 + 2.0 ** -6 in got                 # the two ties went to even

    x = np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)
    y = _on_cpu(mod)["main"](tvm.runtime.tensor(x)).numpy()
    assert y.dtype == np.float32                               # model outputs stay float32
    # numpy model of the scheme: bf16 weights, hidden layer stored bf16, float32 arithmetic
    h = _bf16(np.maximum(x.astype(np.float64) @ _bf16(w1) + _bf16(b1), 0))
    emul = (h.astype(np.float64) @ _bf16(w2) + _bf16(b2)).astype(np.float32)
    exact = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    scale = float(np.abs(exact).max())
    assert np.abs(y - emul).max() <= 1e-5 * scale, np.abs(y - emul).max() / scale
    assert np.abs(y - exact).max() > 1e-4 * scale              # bf16 really is in use (fp32 would be ~1e-7)


def _run(vm, g, feeds) -> list[np.ndarray]:
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    return [o.numpy() for o in ([out] if isinstance(out, tvm.runtime.Tensor) else list(out))]


def _model_graph(name):
    m = MODELS.get(name)
    if m is None:
        pytest.skip(f"{name} is not there")
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    return m, g


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_bf16_cuda_lowering_matches_onnxruntime_on_cpu(name):
    m, g = _model_graph(name)
    vm = _on_cpu(lower(g, BF16, gpu_schedules=False))
    errs, agree, right = [], 0, 0
    labels = fashion_test()[1] if name == "fashion_mobilenet" and fashion_test() is not None else None
    for seed in range(SAMPLES[name]):     # fashion_mobilenet: the first 32 labelled test images, one by one
        feeds = m.feeds(seed)
        (y,), (r,) = _run(vm, g, feeds), ort_run(m.load(), feeds)
        assert y.shape == r.shape and y.dtype == np.float32
        errs.append(float(np.abs(y.astype(np.float64) - r).max()) / float(np.abs(r).max()))
        agree += int((y.argmax(1) == r.argmax(1)).all())
        right += int(labels is not None and y.argmax() == labels[seed])
    print(f"{name} bf16: max error / max|ref| worst {max(errs):.2e}, median {np.median(errs):.2e}; "
          f"top-1 = ONNX Runtime on {agree}/{len(errs)}" + (f"; {right}/{len(errs)} labels right" * (labels is not None)))
    assert max(errs) <= TOL, f"{name}: {max(errs):.2e} * max|ref| > {TOL}"
    assert agree == len(errs), f"{name}: top-1 differs from ONNX Runtime on {len(errs) - agree} samples"


@pytest.mark.slow
@pytest.mark.xfail(reason="fp16 already misses 1e-2 on these (lower.py, Precision); bf16: rec ~1e-1, det ~5e-1",
                   strict=False)
@pytest.mark.parametrize("name", ["rapidocr-rec", "rapidocr-det"])
def test_bf16_rapidocr_rec_det_known_miss(name):
    m, g = _model_graph(name)
    feeds = m.feeds(0)
    (y,), (r,) = _run(_on_cpu(lower(g, BF16, gpu_schedules=False)), g, feeds), ort_run(m.load(), feeds)
    err = float(np.abs(y.astype(np.float64) - r).max()) / float(np.abs(r).max())
    print(f"{name} bf16: max error / max|ref| {err:.2e}")
    assert err <= TOL


def test_bf16_is_refused_off_cuda():
    with pytest.raises(UserError, match="bf16 is supported on CUDA only"):
        TargetSpec("x86", dtype="bf16")
    with pytest.raises(UserError, match="bf16 is supported on CUDA only"):
        TargetSpec("arm", dtype="bf16")


def test_cli_bf16_on_x86_is_one_line_exit_2(tmp_path):
    model = MODELS.get("mnistnet")
    if model is None:
        pytest.skip("models/mnistnet.onnx is not there")
    r = subprocess.run([sys.executable, "-m", "qcompiler.cli", "compile", model.source, "--target", "x86",
                        "--dtype", "bf16", "-o", str(tmp_path / "OUT")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["qcompile: error: --dtype: bf16 is supported on CUDA only "
                                             "(use fp16 or fp32 on CPU targets)"], r.stderr


needs_nvcc = pytest.mark.skipif(not NVCC, reason="nvcc not found: install the CUDA toolkit to build CUDA artifacts")


@pytest.fixture(scope="module")
def fashion_bf16(tmp_path_factory):
    """fashion_mobilenet's bf16 sm_90 artifact, and the CUDA C++ source TVM handed to nvcc for it."""
    m, g = _model_graph("fashion_mobilenet")
    sources, compile_fatbin = [], cuda_aot.nvcc_fatbin
    cuda_aot.nvcc_fatbin = lambda code, *a, **k: (sources.append(code), compile_fatbin(code, *a, **k))[1]
    try:
        out = write_artifact(g, BF16, tmp_path_factory.mktemp("bf16") / "OUT")
    finally:
        cuda_aot.nvcc_fatbin = compile_fatbin
    return out, sources, m


@needs_nvcc
def test_bf16_cuda_artifact_builds_with_nv_bfloat16_storage(fashion_bf16):
    out, sources, _ = fashion_bf16
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["dtype"] == "bf16" and manifest["target"]["family"] == "cuda"
    assert manifest["cuda"]["device_code"] == "fatbin" and manifest["cuda"]["kernels"] >= 1
    assert manifest["inputs"][0]["dtype"] == "float32" and manifest["outputs"][0]["dtype"] == "float32"
    assert ("sass", "sm_90") in cuda_aot.fatbin_contents((out / "model.so").read_bytes())
    assert len(sources) == 1
    code = sources[0]
    assert "#include <cuda_bf16.h>" in code
    kernels = [ln for ln in code.splitlines() if ln.startswith('extern "C" __global__')]
    assert kernels and all("nv_bfloat16*" in ln for ln in kernels), kernels[:3]   # every kernel stores/reads bf16
    assert "float* __restrict__ in0_ptr" in code                   # the model input is read as float32
    assert "half" not in code.replace("half4_bfloat164", "")      # no fp16 anywhere
