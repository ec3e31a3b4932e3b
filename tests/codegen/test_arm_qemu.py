"""ARM artifacts: cross-compile real models with qcompiler's own pipeline (import, default passes,
the real lowering with 4-lane NEON vectors) for aarch64 (cortex-a76, NEON + dotprod + fp16), run
them under qemu-aarch64 through examples/deploy_cpp (TVM runtime only, as on an edge device) and
compare with ONNX Runtime on the host within 1e-4 * max|ref| (fashion_mobilenet on three real
Fashion-MNIST test images, also the same top-1). About 25 s in all on two cores.

Needs: apt-get install -y gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user
       scripts/fetch_aarch64_runtime.sh
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.arm import toolchain as arm
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.target import TargetSpec

SPEC = TargetSpec("arm", cpu="cortex-a76", features=("+dotprod", "+fullfp16"))
_missing = arm.emulation_problems()
pytestmark = [pytest.mark.qemu,
              pytest.mark.skipif(bool(_missing), reason="cannot run aarch64 code here: " + "; ".join(_missing))]
ARM_MODELS = ("fashion_mobilenet", "rapidocr-cls")


def _model(name: str):
    from realmodels import project_models, rapidocr_models
    return {m.name: m for m in rapidocr_models() + project_models()}.get(name)


@pytest.fixture(scope="module")
def run_model(tmp_path_factory) -> Path:
    """examples/deploy_cpp cross-built for aarch64 (binary + the two runtime libraries)."""
    from conftest import build_arm_deploy
    return build_arm_deploy(tmp_path_factory)


def _run_on_arm(run_model: Path, out: Path, x: np.ndarray, tmp: Path) -> np.ndarray:
    (tmp / "x.bin").write_bytes(np.ascontiguousarray(x).tobytes())
    r = subprocess.run(arm.qemu_command(run_model, out, tmp / "x.bin", "-o", tmp / "y"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.fromfile(tmp / "y0.bin", np.float32)


def test_tiny_graph_under_qemu(run_model, tmp_path, tiny):
    g = tiny.graph()
    out = write_artifact(g, SPEC, tmp_path / "OUT", build=tiny.build)
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    y = _run_on_arm(run_model, out, x, tmp_path)
    ref = tiny.reference(g, x).ravel()
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def _compile(m, out: Path) -> None:
    """qcompiler's own pipeline: import, the default passes, the real ARM lowering, cross-linking."""
    import qcompiler
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    write_artifact(g, SPEC, out)


def _inputs(m) -> list[dict[str, np.ndarray]]:
    """A few real Fashion-MNIST test images for fashion_mobilenet (batch 1 each), else m.feeds()."""
    if m.name == "fashion_mobilenet":
        return [m.feeds(seed) for seed in range(3)]
    return [m.feeds()]


@pytest.mark.parametrize("name", ARM_MODELS)
def test_real_model_under_qemu_matches_onnxruntime(run_model, tmp_path, name, ort_run):
    m = _model(name)
    if m is None:
        pytest.skip(f"{name} is not there (models/ or the rapidocr_onnxruntime wheel)")
    out = tmp_path / "OUT"
    _compile(m, out)
    for feeds in _inputs(m):
        (x,) = feeds.values()
        ref = ort_run(m.load(), feeds)[0].ravel()
        y = _run_on_arm(run_model, out, x, tmp_path)
        assert y.shape == ref.shape
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        if ref.size > 1:
            assert y.argmax() == ref.argmax()


def test_dynamic_int8_gemm_under_qemu(run_model, tmp_path):
    """DynamicQuantParams + DynamicQLinearGemm on ``sdot`` (the uint8 activation stored as int8,
    the run-time zero point shifted by 128): the artifact's output equals the reference
    interpreter's within an ulp of the product and one of the result (an FMA may fuse the bias add)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_x86_dynamic_int8 import activations, dynamic_graph, fma_tolerance

    from qcompiler.quant import reference
    g, _, b = dynamic_graph(24, 64, 40, "token", act="Relu")
    out = write_artifact(g, SPEC, tmp_path / "OUT")
    x = activations(24, 64)
    y = _run_on_arm(run_model, out, x, tmp_path).reshape(24, 40)
    want = reference.run(g, {"a": x})[0]
    assert np.all(np.abs(y - want) <= fma_tolerance(want, b)), float(np.max(np.abs(y - want)))


@pytest.mark.parametrize("name", ["dynamic_conv_integer_u8", "dynamic_conv_integer_grouped", "static_conv_integer",
                                  "dynamic_matmul_integer_per_column", "static_matmul_integer_int8"])
def test_integer_ops_on_sdot_under_qemu(run_model, tmp_path, name):
    """ConvInteger / MatMulInteger of pre-quantized models on ``sdot`` (uint8 weights split into
    int8 + a per-channel offset times the window or row sum; a run-time zero point in the padding):
    the first output equals ONNX Runtime's bit for bit (integer sums times one float scale)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import qcompiler
    from qdq_models import cases, ort_plain
    m, feeds = cases()[name]
    g = qcompiler.import_onnx(m)
    qcompiler.run_passes(g, "default")
    out = write_artifact(g, SPEC, tmp_path / "OUT")
    want = ort_plain(m, feeds)[0]
    y = _run_on_arm(run_model, out, feeds["x"], tmp_path)
    np.testing.assert_array_equal(y.reshape(want.shape), want.astype(np.float32))


@pytest.mark.parametrize("case", ["matmul", "matmul ragged K", "conv"])
def test_nbits_kernels_under_qemu(run_model, tmp_path, case):
    """The weight-only 4-bit kernels (MatMulNBits, ConvNBits: packed nibbles decoded at their load,
    NEON's 4-lane vectors, a 16-row tile) against the reference interpreter, within the float32
    rounding of their summation order (tests/codegen/test_x86_nbits.py's bound)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_x86_nbits import conv_graph, matmul_graph

    from qcompiler.ir.types import dequantize
    from qcompiler.ir.windows import conv_sum
    from qcompiler.quant import reference
    if case == "conv":
        g, feeds = conv_graph(32, 24, 3, pad=1, blk=16, seed=2)
    else:
        g, feeds = matmul_graph((32, 96) if case == "matmul" else (5, 200), 40, 32 if case == "matmul" else 64,
                                "int4" if case == "matmul" else "uint4", seed=1)
    out = write_artifact(g, SPEC, tmp_path / "OUT")
    want = reference.run(g, feeds)[0]
    y = _run_on_arm(run_model, out, feeds["x"], tmp_path).reshape(want.shape)
    op = g.ops[0]
    w = op.operands[1]
    wd = np.abs(dequantize(w.data, w.type.quant)).astype(np.float64)
    x = np.abs(feeds["x"]).astype(np.float64)
    mag = conv_sum(x, wd, dict(op.attrs), want.shape[2:]) if case == "conv" else x @ wd.T
    k = int(np.prod(w.shape[1:]))
    assert np.all(np.abs(y - want) <= k * 2.0 ** -24 * mag + 2.0 ** -23 * np.abs(want)), float(np.max(np.abs(y - want)))
