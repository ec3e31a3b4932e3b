"""CUDA artifacts built on a GPU-less host carry compiled device code (fatbin), never CUDA source.

Needs nvcc (skipped otherwise). The last test needs a CUDA device (marked gpu, skipped otherwise).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.cuda import aot as cuda_aot
from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.target import TargetSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_hosts import artifact, cuda_device_present  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PYPATH = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])   # keep a TVM found on PYTHONPATH
NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
pytestmark = pytest.mark.skipif(not NVCC, reason="nvcc not found: install the CUDA toolkit to build CUDA artifacts")
SOURCE_MARKERS = (b"__global__", b"extern \"C\"", b"#include <cuda")   # (launch tags like "threadIdx.x" are metadata)


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    from conftest import _relax_build, tiny_graph
    g = tiny_graph()
    return artifact("test_cuda_build.sm90", str(g),
                    lambda out: write_artifact(g, TargetSpec("cuda", arch=("sm_90",)), out, build=_relax_build),
                    tmp_path_factory.mktemp("cuda"))


def test_sm90_artifact_holds_a_fatbin_not_source(sm90):
    data = (sm90 / "model.so").read_bytes()
    assert ("sass", "sm_90") in cuda_aot.fatbin_contents(data)
    assert not [m for m in SOURCE_MARKERS if m in data], "CUDA source embedded in the library"
    m = json.loads((sm90 / "manifest.json").read_text())
    assert m["target"]["family"] == "cuda" and m["target"]["arch"] == ["sm_90"]
    assert m["cuda"]["device_code"] == "fatbin" and m["cuda"]["sass"] == ["sm_90"] and m["cuda"]["kernels"] >= 1


def test_several_archs_and_determinism(tmp_path, tiny):
    spec = TargetSpec("cuda", arch=("sm_87", "sm_90"))
    a = write_artifact(tiny.graph(), spec, tmp_path / "a", build=tiny.build)
    b = write_artifact(tiny.graph(), spec, tmp_path / "b", build=tiny.build)
    assert sorted(cuda_aot.fatbin_contents((a / "model.so").read_bytes())) == \
        [("ptx", "compute_90"), ("sass", "sm_87"), ("sass", "sm_90")]
    for name in ("model.so", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


LOAD_WITHOUT_JIT = """
    import ctypes, sys
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)   # stub driver: lets libtvm_runtime_cuda load here
    import tvm, tvm_ffi
    from qcompiler.runtime.device import _load_cuda_runtime
    _load_cuda_runtime("test")
    calls = []
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", lambda *a: calls.append(a) or bytearray(),
                                 override=True)
    lib = tvm.runtime.load_module(sys.argv[1] + "/model.so")
    kinds = []
    def walk(m):
        kinds.append(m.kind)
        for i in m.imports: walk(i)
    walk(lib)
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY and "libtvm_compiler" not in maps, "compiler loaded"
    assert "cuda" in kinds, kinds
    assert not calls, "CUDA source was compiled at load time"
    print("LOADED WITHOUT JIT", kinds)
"""


def test_runtime_only_load_needs_no_jit(sm90):
    """Runtime-only TVM (no compiler, JIT callback counting calls) deserializes the device module."""
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONPATH": PYPATH}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD_WITHOUT_JIT), str(sm90),
                        str(cuda_aot.stub_library())], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "LOADED WITHOUT JIT" in r.stdout, r.stdout + r.stderr


BUILD_SOURCE_ARTIFACT = """
    import sys
    from conftest import _relax_build, tiny_graph
    from qcompiler.codegen.target import TargetSpec
    _relax_build(tiny_graph(), TargetSpec("cuda", arch=("sm_90",))).export_library(sys.argv[1])
"""
LOAD_REFUSED = """
    import ctypes, sys
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
    import tvm
    from qcompiler.runtime.device import JIT_REFUSED, _load_cuda_runtime, no_cuda_jit
    _load_cuda_runtime("test")
    try:
        with no_cuda_jit():
            tvm.runtime.load_module(sys.argv[1])
    except Exception as e:
        assert JIT_REFUSED in str(e), e
        print("REFUSED")
"""


def test_a_source_artifact_is_refused_at_load(tmp_path):
    """Without qcompiler's CUDA setup TVM embeds CUDA source; the runtime refuses to JIT it."""
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("a CUDA driver is present: TVM would not fall back to embedding source")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    lib = tmp_path / "source.so"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD_SOURCE_ARTIFACT), str(lib)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert b"extern \"C\" __global__" in lib.read_bytes() and not cuda_aot.fatbin_contents(lib.read_bytes())
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD_REFUSED), str(lib), str(cuda_aot.stub_library())],
                       capture_output=True, text=True, env={**env, "TVM_USE_RUNTIME_LIB": "1"}, timeout=120)
    assert "REFUSED" in r.stdout, r.stdout + r.stderr


def test_real_lowering_for_cuda(tmp_path, tiny):
    out = write_artifact(tiny.graph(), TargetSpec("cuda", arch=("sm_90",)), tmp_path / "OUT")
    assert ("sass", "sm_90") in cuda_aot.fatbin_contents((out / "model.so").read_bytes())


REAL_MODEL = "fashion_mobilenet"        # ~15 s to build for sm_90 here (rapidocr-cls: ~60 s)


def _real_model():
    from realmodels import project_models
    m = {m.name: m for m in project_models()}.get(REAL_MODEL)
    if m is None:
        pytest.skip(f"models/{REAL_MODEL}.onnx is not there")
    return m


def _real_graph(m):
    import qcompiler
    g = qcompiler.import_onnx(m.load(), m.input_shapes)
    qcompiler.run_passes(g, "default")
    return g


@pytest.fixture(scope="module")
def real_sm90(tmp_path_factory):
    """fashion_mobilenet through import, the default passes and the real lowering, for sm_90."""
    m = _real_model()
    g = _real_graph(m)
    return artifact("test_cuda_build.real_sm90", str(g),
                    lambda out: write_artifact(g, TargetSpec("cuda", arch=("sm_90",)), out),
                    tmp_path_factory.mktemp("cuda_real")), m


def test_real_model_sm90_artifact_holds_device_code(real_sm90):
    out, _ = real_sm90
    data = (out / "model.so").read_bytes()
    assert ("sass", "sm_90") in cuda_aot.fatbin_contents(data)
    assert not [m for m in SOURCE_MARKERS if m in data], "CUDA source embedded in the library"
    m = json.loads((out / "manifest.json").read_text())
    assert m["cuda"]["device_code"] == "fatbin" and m["cuda"]["kernels"] >= 1


def test_real_model_runtime_only_load_needs_no_jit(real_sm90):
    out, _ = real_sm90
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONPATH": PYPATH}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD_WITHOUT_JIT), str(out),
                        str(cuda_aot.stub_library())], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "LOADED WITHOUT JIT" in r.stdout, r.stdout + r.stderr


def test_cuda_lowering_numerics_on_cpu(ort_run):
    """No GPU here: the very kernels lowered for CUDA (plain NCHW, before the GPU schedules: dlight's
    and the lowering's own, ``gpu_schedules=False``, which only reorder, tile and bind loops) are
    compiled for the host CPU
    and compared with ONNX Runtime, so a layout or indexing error in the CUDA lowering cannot hide
    until a GPU is available."""
    import tvm
    from tvm import relax
    from qcompiler.codegen.lower import lower
    m = _real_model()
    g = _real_graph(m)
    ex = tvm.compile(lower(g, TargetSpec("cuda", arch=("sm_90",)), gpu_schedules=False),
                     target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    feeds = m.feeds()
    y = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs]).numpy()
    ref = ort_run(m.load(), feeds)[0]
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def _fashion_int8(batch: int = 16):
    """fashion_mobilenet at batch ``batch``, quantized (default passes, then the quantize pass) on
    256 real Fashion-MNIST test images; returns (graph, input name, images, labels)."""
    from realmodels import MODELS_DIR, fashion_test, quantize_batched
    data = fashion_test()
    if data is None or not (MODELS_DIR / f"{REAL_MODEL}.onnx").exists():
        pytest.skip(f"models/{REAL_MODEL}.onnx or models/fashion_test.npz is not there")
    x, y = data
    g, inp = quantize_batched(str(MODELS_DIR / f"{REAL_MODEL}.onnx"), x, 256, batch)
    return g, inp, x, y


@pytest.mark.parametrize("layout", ["nchw", "blocked", "blocked-copy"])
def test_cuda_int8_lowering_bit_exact_on_cpu(layout, monkeypatch):
    """The int8 kernels lowered for CUDA (group-1 QLinearConv as an s8 x s8 -> s32 implicit GEMM over
    x - 128, the form dlight's/our int8 WMMA rule takes; cuda/int8.py ``conv_s8s8``),
    compiled for the host CPU, give exactly the integers of the x86 int8 build and of the numpy
    integer reference on real Fashion-MNIST images. Lowered with ``gpu_schedules=False``: the
    lowering's own GPU schedules (int8 WMMA on sm_70+, depthwise convs) bind threads and compile
    for CUDA only; the computes are the same (the schedules only reorder, tile, bind and tensorize).
    Each activation layout of ``QC_CUDA_INT8_LAYOUT``: in the NCHW16c ones, the 11 convs whose input
    has a multiple of 16 channels reduce over K = (ci/16, kh, kw, ci%16) with a 5-D weight, the
    padding masked arithmetically ("blocked") or a stage of its own ("blocked-copy")."""
    import tvm
    from tvm import relax
    from qcompiler.codegen.lower import build_module, lower
    from qcompiler.quant import reference
    monkeypatch.setenv("QC_CUDA_INT8_LAYOUT", layout)
    g, inp, x, y = _fashion_int8()
    mod = lower(g, TargetSpec("cuda", arch=("sm_61",), dtype="int8"), gpu_schedules=False)
    s8 = [f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and "qw_s8" in f.script()]
    assert len(s8) >= 10, len(s8)                 # every pointwise/full conv took the s8 x s8 path
    weight_5d = re.compile(r'qw_s8\d*: T\.Buffer\(\((\d+, ){4}16\), "int8"\)')
    assert sum(bool(weight_5d.search(f)) for f in s8) == (0 if layout == "nchw" else 11)
    assert sum('"pad_mat"' in f for f in s8) == (11 if layout == "blocked-copy" else 0)   # uint8 inputs: all
    cuda_cpu = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    x86 = relax.VirtualMachine(build_module(g, TargetSpec("x86", dtype="int8")), tvm.cpu())
    agree = []
    for s in range(500, 548, 16):
        xb = x[s:s + 16]
        got = cuda_cpu["main"](tvm.runtime.tensor(xb)).numpy()
        want = x86["main"](tvm.runtime.tensor(xb)).numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, reference.run(g, {inp: xb})[0])
        agree.append(got.argmax(1) == y[s:s + 16])
    assert np.mean(agree) >= 0.85                 # measured 0.958 (46 of 48)


def _one_conv(c: int = 128, hw: int = 28, n: int = 1, group: int = 1, stride: int = 1, quantize: bool = True,
              convs: int = 1, pool: bool = False):
    """A ResNet-18 layer-2 conv (n x c x hw x hw -> c, 3x3, pad 1; ``group`` = c: depthwise) + ReLU,
    quantized unless ``quantize`` is False; ``convs`` > 1: a chain of that many (conv + ReLU), the
    stride on the last; ``pool``: a 3x3/2 max pool (pad 1) after the first conv + ReLU, as after
    ResNet's stem."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    oh = hw
    nodes, inits, x = [], [], "x"
    for i in range(convs):
        w = (rng.standard_normal((c, c // group, 3, 3)) * np.sqrt(2.0 / (9 * c // group))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        last = i == convs - 1
        oh = (oh - 1) // stride + 1 if last else oh
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"y{i}"], kernel_shape=[3, 3], pads=[1] * 4,
                                   strides=[stride if last else 1] * 2, group=group),
                  helper.make_node("Relu", [f"y{i}"], ["z" if last else f"r{i}"])]
        x = f"r{i}"
        if pool and i == 0:
            nodes.append(helper.make_node("MaxPool", [nodes[-1].output[0]], [f"p{i}"], kernel_shape=[3, 3],
                                          pads=[1] * 4, strides=[2, 2]))
            x, oh = f"p{i}", (oh - 1) // 2 + 1
    out = nodes[-1].output[0]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [n, c, oh, oh])], inits)
    return _imported(graph, (n, c, hw, hw), rng if quantize else None)


def _imported(graph, shape, rng):
    """The IR of the one-input ONNX ``graph`` (opset 13) after the default passes, quantized on one
    random-normal batch of ``shape`` drawn from ``rng`` (None: left float)."""
    import onnx
    from onnx import helper
    from qcompiler.frontend import import_onnx
    from qcompiler.passes import PassContext, PassManager, run_passes
    from qcompiler.passes.quantize import QuantizeOptions
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    g = import_onnx(onnx.ModelProto.FromString(m.SerializeToString()))
    run_passes(g)
    if rng is not None:
        calib = [{"x": rng.standard_normal(shape).astype(np.float32)}]
        PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(g)
    return g


def _launch(script: str, axis: str) -> int:
    """The extent bound to ``axis`` (e.g. threadIdx.y) in a scheduled kernel's TVMScript."""
    import re
    (ext,) = set(re.findall(r'T\.thread_binding\((\d+), thread="' + re.escape(axis) + '"\)', script))
    return int(ext)


@pytest.mark.slow
def test_int8_resnet_conv_is_scheduled_on_wmma_tensor_cores():
    """ResNet-18-shaped 3x3 int8 convs on int8 WMMA (cuda/wmma.py) in 64-row block tiles:
    1x128x28x28 -> 128 (implicit GEMM I = 784, J = 128, K = 1152) in 64x128 tiles (8 warps, 13
    blocks); 1x128x7x7 -> 128 (I = 49, layer 4's I at batch 1: dlight's threshold, every extent
    > 64, kept it off tensor cores) padded to one 64-row tile; 1x64x28x28 -> 64 (J = 64: layer 1)
    in 64x64 tiles (4 warps). A 32-channel conv (J = 32) stays on dlight's SIMT rules. ~80 s:
    importing TVM's tensor intrinsics (tvm.s_tir.tensor_intrin, parsed from TVMScript at import)
    dominates. The built CUDA source (wmma::mma_sync on signed-char fragments) is checked on GPU
    hosts: tests/codegen/test_cuda_gpu.py."""
    from qcompiler.codegen.lower import lower
    spec = TargetSpec("cuda", arch=("sm_90",), dtype="int8")
    for kernel, warps, blocks in ((wmma_conv_kernel(spec), 8, 13), (wmma_conv_kernel(spec, c=128, hw=7), 8, 1),
                                  (wmma_conv_kernel(spec, c=64), 4, 13)):
        script = kernel.script()
        assert "tvm_mma_sync" in script
        assert (_launch(script, "threadIdx.y"), _launch(script, "blockIdx.x")) == (warps, blocks)
    small = lower(_one_conv(c=32), spec)
    assert not any("tvm_mma_sync" in small[gv].script() for gv in small.functions if "qlinearconv" in gv.name_hint)


def _stem(n: int = 1, hw: int = 224):
    """ResNet-18's stem conv (n x 3 x hw x hw -> 64, 7x7 / 2, pad 3) + ReLU, quantized: its implicit
    GEMM (I = n*(hw/2)^2, J = 64, K = 147) is one that stays off tensor cores (tensor_core_sized)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 3, 7, 7)) * 0.1).astype(np.float32)
    oh = (hw - 1) // 2 + 1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[7, 7], pads=[3] * 4, strides=[2, 2]),
         helper.make_node("Relu", ["y"], ["z"])], "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, hw, hw])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, 64, oh, oh])], [numpy_helper.from_array(w, "w")])
    return _imported(graph, (n, 3, hw, hw), rng)


def _kernel_ptx(g, kernel: str, arch: str = "sm_90") -> str:
    """The PTX (``nvcc -ptx`` with the artifact's flags) of the CUDA kernel of ``g`` named ``kernel``:
    the instructions nvcc chose, which the CUDA source does not show."""
    from qcompiler.codegen.lower import lower, tvm_compile
    spec = TargetSpec("cuda", arch=(arch,), dtype="int8")
    with cuda_aot.device_compile([arch]):
        ex = tvm_compile(lower(g, spec), spec)
    src = cuda_aot.cuda_sources(ex.mod)
    with tempfile.TemporaryDirectory() as d:
        cu, ptx = Path(d) / "k.cu", Path(d) / "k.ptx"
        cu.write_text(src)
        subprocess.run([NVCC, "-ptx", *cuda_aot.NVCC_FLAGS, f"-arch={arch}", "-o", str(ptx), str(cu)],
                       check=True, capture_output=True)
        text = ptx.read_text()
    m = re.search(r"\.entry (\w*" + kernel + r"\w*)\(", text)
    assert m, f"no kernel {kernel} in the PTX"
    return text[m.end():text.index("\n}\n", m.end())]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["stem", "conv32"])
def test_simt_int8_gemm_runs_on_dp4a(shape):
    """The int8 implicit GEMMs that stay off tensor cores -- ResNet-18's 7x7 stem (J = 64, K = 147)
    and a conv of 32 output channels (J = 32) -- go to dlight's SIMT Matmul rule, whose kernels sum
    the s8 x s8 products of 16 k at a time into a 4 x 4 register tile per thread (int32, written as
    scalar multiply-adds); nvcc forms ``dp4a`` (4 int8 products and an int32 add in one instruction,
    sm_61+) from each run of 4 k: 64 per K stage, the 4 x 4 tile times 16 / 4, and no scalar
    byte multiply-adds are left (PTX; nvcc 13.0). If a schedule change broke that pattern (say, a k
    run no longer 4 contiguous bytes in shared memory) the SIMT int8 GEMMs would quietly take 4x the
    multiply instructions: this fails then. Depthwise convs (cuda/direct.py, 9 taps of one
    channel) have no such run and keep scalar multiply-adds."""
    g = _stem() if shape == "stem" else _one_conv(c=32)
    ptx = _kernel_ptx(g, "qlinearconv")
    assert ptx.count("dp4a.s32.s32") == 64, ptx.count("dp4a.s32.s32")
    assert ptx.count("mad.lo.s32") + ptx.count("mul.lo.s32") < 32      # index arithmetic only


def _second_conv_source(c: int, hw: int) -> tuple[str, str]:
    """(TVMScript, CUDA source) of the second of two int8 3x3 convs (1 x c x hw x hw) for sm_90."""
    import tvm
    second = wmma_conv_kernel(TargetSpec("cuda", arch=("sm_90",), dtype="int8"), c, hw, convs=2)
    with cuda_aot.device_compile(["sm_90"]), tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}):
        ex = tvm.compile(tvm.IRModule({"main": second.with_attr("global_symbol", "main")}))   # nvcc compiles it
    return second.script(), cuda_aot.cuda_sources(ex.mod)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["blocked", "blocked-copy"])
def test_blocked_int8_conv_fetches_whole_vectors(layout, monkeypatch):
    """The second of two 64-channel 3x3 int8 convs at ResNet-18's layer-1 size (1x64x56x56: GEMM
    I x J x K = 3136 x 64 x 576, whole 64x64 tiles) reads the first one's NCHW16c output, K = (ci/16,
    kh, kw, ci%16): its WMMA kernel loads the activation tile in vectors along the 16 contiguous
    channels, where the NCHW kernel gathers it byte by byte (one uchar load, with the im2col division
    and modulo, per element). "blocked": the padding masked arithmetically, 4-byte loads (``uint``),
    one kernel; "blocked-copy": padding and the uint8 -> int8 shift in a stage of its own (one thread
    per element, its own launch), then a plain copy in 16-byte vectors (``int4``) of activations and
    weights. Both on tensor cores; nvcc compiles both (the build's own nvcc step)."""
    monkeypatch.setenv("QC_CUDA_INT8_LAYOUT", layout)
    script, src = _second_conv_source(64, 56)
    assert "tvm_mma_sync" in script and re.search(r'in0: T\.Buffer\(\(1, 4, 56, 56, 16\), "uint8"\)', script)
    if layout == "blocked":
        assert re.search(r"uint v_\w* = \*\(uint\*\)\(in0_ptr", src), src[:3000]
        assert src.count("__global__ void") == 2                    # declaration + definition: one kernel
    else:
        assert '"pad_mat"' in script and "T.vectorized(16)" in script
        assert re.search(r"\*\(int4\*\)\(pad_mat_ptr", src) and re.search(r"\*\(int4\*\)\(qw_s8\d+_ptr", src)
        assert src.count("__global__ void") == 4                    # the padding stage's kernel and the GEMM's
    assert "in0_ptr[" not in src.split("main_kernel_1")[-1]        # no per-byte gather in the GEMM


def test_16_byte_fetch_only_for_whole_tiles():
    """pad_einsum's zero fill, vectorized with a 16-byte fetch, is a 16-lane int8 broadcast that
    TVM 0.27 prints as ``make_int4`` of 16 arguments (nvcc rejects it): GEMMs that need padding keep
    4-byte loads. ResNet-18 at batch 64 is whole tiles throughout; at batch 1 layers 2-4 are not."""
    from qcompiler.codegen.cuda.wmma import _whole_tiles, block_tile
    for ext, whole in (((1, 3136, 64, 576), True), ((1, 200704, 64, 576), True), ((1, 50176, 128, 1152), True),
                       ((1, 784, 128, 1152), False), ((1, 49, 512, 4608), False), ((1, 3136, 64, 147), False)):
        assert _whole_tiles(ext, block_tile(ext)) == whole, ext


def test_which_gemms_take_tensor_cores():
    """ResNet-18's implicit GEMMs (S, I, J, K): every 3x3 conv and downsample at batch 1 and 64, not
    the 7x7 stem (J = 64, K = 147: slower on WMMA than on dlight's SIMT rule), not the batch-1 fc
    (I = 1), not a 32-channel conv."""
    from qcompiler.codegen.cuda.wmma import tensor_core_sized
    yes = [(1, 49, 512, 4608), (1, 3136, 64, 576), (1, 784, 128, 64), (1, 196, 256, 2304), (1, 200704, 64, 576),
           (1, 3136, 512, 4608), (1, 64, 1000, 512)]
    no = [(1, 12544, 64, 147), (1, 802816, 64, 147), (1, 1, 1000, 512), (1, 784, 32, 288), (1, 16, 512, 4608)]
    assert [tensor_core_sized(e) for e in yes] == [True] * len(yes)
    assert [tensor_core_sized(e) for e in no] == [False] * len(no)


def test_wmma_block_tile_pads_j_least():
    """64 rows; 128 columns unless 64 pads J less (J = 64, 160, 192 ...); 128 on a tie (J = 96)."""
    from qcompiler.codegen.cuda.wmma import TILES, block_tile
    for j, tile in ((64, "64x64"), (96, "64x128"), (128, "64x128"), (160, "64x64"), (192, "64x64"),
                    (256, "64x128"), (512, "64x128"), (1000, "64x128")):
        assert block_tile((1, 49, j, 4608)) == TILES[tile], j


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_depthwise_conv_is_one_thread_per_output(dtype):
    """A 3x3 depthwise conv (stride 2) is scheduled by cuda/direct.py, not dlight's
    GeneralReduction: the output's n*c*oh*ow = 2*24*14*14 = 9408 elements over 37 blocks of 256
    threads, the 9 taps unrolled into a register accumulator, the padding stage inlined (no other
    buffer than the accumulator)."""
    g = _one_conv(c=24, hw=28, n=2, group=24, stride=2, quantize=dtype == "int8")
    _one_thread_per_output(g, dtype, "conv", blocks=37)


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_max_pool_keeps_its_running_max_in_a_register(dtype):
    """A 3x3/2 max pool feeding a conv (no epilogue: its reduction block writes the output) is one
    thread per output like the depthwise conv -- 2*24*14*14 = 9408 outputs over 37 blocks of 256
    threads, the window unrolled -- with the running max in a register (the one buffer it
    allocates, ``local``) and the output written once, not read-modified-written in global memory
    at each of 9 taps."""
    g = _one_conv(c=24, hw=28, n=2, convs=2, pool=True, quantize=dtype == "int8")
    pool, script = _one_thread_per_output(g, dtype, "maxpool", blocks=37)
    out = pool.params[-1].name                      # the output buffer (TVMScript names it after its param)
    writes = re.findall(r"^\s*(\w+)\[[^\]]*\] = ", script, re.M)
    assert writes.count(out) == 1, (out, writes)


def _one_thread_per_output(g, dtype: str, kernel: str, blocks: int):
    """The one kernel of ``g`` (lowered for sm_90 at ``dtype``) whose name holds ``kernel``, and its
    TVMScript, after checking it is cuda/direct.py's: ``blocks`` blocks of 256 threads, a 3x3 window
    unrolled, a register (``local``) accumulator its only buffer."""
    from qcompiler.codegen.lower import lower
    mod = lower(g, TargetSpec("cuda", arch=("sm_90",), dtype=dtype))
    (func,) = [mod[gv] for gv in mod.functions if kernel in gv.name_hint]
    script = func.script()
    assert func.attrs["tirx.is_scheduled"]
    assert (_launch(script, "blockIdx.x"), _launch(script, "threadIdx.x")) == (blocks, 256)
    assert script.count("T.unroll(3)") == 2
    allocs = [line for line in script.splitlines() if "alloc_buffer" in line]
    assert len(allocs) == 1 and 'scope="local"' in allocs[0], allocs
    return func, script


def wmma_conv_kernel(spec, c: int = 128, hw: int = 28, convs: int = 1):
    """The scheduled PrimFunc of the last conv of ``_one_conv(c, hw, convs=convs)`` lowered for ``spec``."""
    from qcompiler.codegen.lower import lower
    mod = lower(_one_conv(c, hw, convs=convs), spec)
    kernels = [mod[gv] for gv in mod.functions if "qlinearconv" in gv.name_hint]
    assert len(kernels) == convs and kernels[-1].attrs["tirx.is_scheduled"]
    return kernels[-1]


def wmma_artifact(g, out):
    """(the sm_90 int8 artifact of ``g`` written to ``out``, the CUDA source tvm.compile made for it
    before nvcc): one build."""
    from qcompiler.codegen.lower import build_module
    spec, seen = TargetSpec("cuda", arch=("sm_90",), dtype="int8"), {}

    def build(graph, s):
        ex = build_module(graph, s)
        seen["src"] = cuda_aot.cuda_sources(ex.mod)
        return ex
    return write_artifact(g, spec, out, build=build), seen["src"]


def test_fp16_conv_pads_in_float16_for_tensor_cores():
    """--dtype fp16 on cuda: a conv fed by a float16-stored activation pads it in float16, so the
    reduction reads f32(A_f16) * f32(B_f16), the pattern of dlight's fp16 WMMA rule
    (MatmulTensorization); x86 keeps padding the float32 it computes in."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from qcompiler.codegen.lower import lower
    from qcompiler.frontend import import_onnx
    w = (np.random.default_rng(0).standard_normal((128, 128, 3, 3)) * 0.03).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["z"], kernel_shape=[3, 3], pads=[1] * 4)]
    graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 28, 28])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 128, 28, 28])],
                              [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8

    def pad_dtypes(spec):
        mod = lower(import_onnx(onnx.ModelProto.FromString(m.SerializeToString())), spec)
        convs = sorted((gv for gv in mod.functions if "conv" in gv.name_hint), key=lambda gv: gv.name_hint)
        return [d for gv in convs for d in _alloc_dtypes(mod[gv], "pad")]
    assert pad_dtypes(TargetSpec("cuda", arch=("sm_90",), dtype="fp16")) == ["float32", "float16"]  # input is fp32
    assert pad_dtypes(TargetSpec("x86", dtype="fp16")) == ["float32", "float32"]


def _alloc_dtypes(func, name):
    """Dtypes of the intermediate buffers called ``name`` in ``func`` (TVMScript omits float32)."""
    import re
    return [d or "float32" for d in re.findall(rf'\b{name} = T\.sblock_alloc_buffer\(\([^)]*\)(?:, "(\w+)")?', func.script())]


RUN_ON_GPU = """
    import sys, numpy as np
    from qcompiler.runtime import load
    model = load(sys.argv[1])
    (y,) = model(np.load(sys.argv[2]))
    np.save(sys.argv[3], y)
    print("RAN ON", model.device)
"""


@pytest.mark.gpu
def test_runs_on_the_gpu_in_runtime_only_mode(sm90, tmp_path, tiny):
    if not cuda_device_present():
        pytest.skip("no CUDA device on this machine")
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONPATH": PYPATH}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN_ON_GPU), str(sm90), str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "RAN ON cuda" in r.stdout, r.stdout + r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), tiny.reference(tiny.graph(), x), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_real_model_on_the_gpu_matches_onnxruntime(real_sm90, tmp_path, ort_run):
    if not cuda_device_present():
        pytest.skip("no CUDA device on this machine: the on-GPU comparison with ONNX Runtime "
                    "(<= 1e-4 * max|ref|) runs only where one is")
    out, m = real_sm90
    for seed in range(3):
        feeds = m.feeds(seed)
        (x,) = feeds.values()
        np.save(tmp_path / "x.npy", x)
        env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PYTHONPATH": PYPATH}
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN_ON_GPU), str(out), str(tmp_path / "x.npy"),
                            str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and "RAN ON cuda" in r.stdout, r.stdout + r.stderr
        ref = ort_run(m.load(), feeds)[0]
        y = np.load(tmp_path / "y.npy")
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        assert (y.argmax(1) == ref.argmax(1)).all()
