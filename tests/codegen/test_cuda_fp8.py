"""CUDA float8 builds (``--target cuda --dtype fp8``, sm_89+) on a GPU-less host.

* Device code: fashion_mobilenet quantized to E4M3 and to E5M2 builds an artifact holding SASS for
  its SMs (no CUDA source); the PTX of its kernels (the build's own nvcc step, its intermediate
  files kept) has ``mma.sync.aligned.m16n8k32.row.col.f32.<f8>.<f8>.f32`` in every group-1 conv with
  K = c_in·kh·kw >= 32 and in the gemm, and none of it in the depthwise and K < 32 convs (the
  direct float32 kernels); the mma kernels use no local memory (their fragments stay in
  registers). The CLI builds one (E5M2, sm_89) from an ONNX file and calibration data.
* Arithmetic, on the CPU: the computes lowered for CUDA (``gpu_schedules=False``: the float8 GEMM
  with the operands' bits decoded by the integer decode instead of reinterpreted as float8,
  cuda/fp8.py) compiled for the host. Bit-exact with qcompiler.quant.reference (and so with the
  x86 build, tests/codegen/test_x86_fp8.py) where every partial sum is exact in float32
  (integer-valued float8 operands): the padding, im2col indexing, weight layout, decode, epilogue
  and clamp are then checked alone, independent of the summation order. Otherwise within the
  float32 rounding of a K-term sum in any order, the bound of test_x86_fp8 (K 2^-24 Σ|x w| per
  output): the reference forms the sum exactly and rounds once, the kernel sums in float32. The
  whole model within 1e-2·max|ref| of the reference (a float8 code one step
  apart somewhere in the chain moves the logits by about that; measured 2.7e-3, as the x86
  build's own distance to the reference), same top-1 on 85 % of 48 images (measured 46).
* On a GPU (marked ``gpu``, skipped here -- never run yet: no GPU in this project's CI): the
  tensor core multiplies float8 values exactly but adds the 32 products of an m16n8k32 mma and
  the accumulator in its own way -- aligned to the largest term and truncated, not IEEE float32
  (NVIDIA does not specify it; DeepSeek-V3's report measured about 14 bits kept on Hopper's
  fp8 wgmma). Assumed here: at least 13 bits kept per mma step. Then integer-valued sums below
  2^13 are still exact (bit-exact cases), and otherwise each of the K/32 steps loses at most
  33·2^-12 of the magnitude it adds, the tolerance of :func:`_gpu_bound`.
* Refusals: ``--dtype fp8`` with an SM older than sm_89 is one error line naming ``--arch``, exit 2.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.cuda import aot as cuda_aot
from qcompiler.codegen.target import TargetSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_hosts import cuda_device_present  # noqa: E402
from test_x86_fp8 import _bound, _input, conv_graph, gemm_graph  # noqa: E402

NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
needs_nvcc = pytest.mark.skipif(not NVCC, reason="nvcc not found: install the CUDA toolkit to build CUDA artifacts")
FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
REAL_MODEL = "fashion_mobilenet"
SOURCE_MARKERS = (b"__global__", b"extern \"C\"", b"#include <cuda")


def mma_instr(fmt: str) -> str:
    return f"mma.sync.aligned.m16n8k32.row.col.f32.{fmt}.{fmt}.f32"


def _fashion_fp8(fmt: str, batch: int = 16):
    """fashion_mobilenet at batch ``batch`` quantized to float8 ``fmt`` on 64 real test images;
    (graph, input name, images, labels)."""
    from realmodels import MODELS_DIR, fashion_test, quantize_batched
    data = fashion_test()
    if data is None or not (MODELS_DIR / f"{REAL_MODEL}.onnx").exists():
        pytest.skip(f"models/{REAL_MODEL}.onnx or models/fashion_test.npz is not there")
    x, y = data
    g, inp = quantize_batched(str(MODELS_DIR / f"{REAL_MODEL}.onnx"), x, 64, batch, fp8=fmt)
    return g, inp, x, y


def _mma_layers(g) -> tuple[int, int]:
    """(group-1 convs with K >= 32, those with K < 32 or depthwise) of a float8 graph."""
    from qcompiler.codegen.cuda.mma import mma_sized
    yes = no = 0
    for op in g.ops:
        if op.kind == "QLinearConv":
            n, k, oh, ow = op.result.shape
            w = op.operands[1].shape
            big = op.attrs.get("group", 1) == 1 and mma_sized(n * oh * ow, k, int(np.prod(w[1:])))
            yes, no = yes + big, no + (not big)
    return yes, no


def _ptx_entries(text: str) -> dict[str, str]:
    """Kernel name -> its body in the PTX ``text``."""
    return {m.group(1): text[m.end():text.index("\n}\n", m.end())] for m in re.finditer(r"\.entry (\w+)\(", text)}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def real_fp8(request, tmp_path_factory):
    """(format, graph, artifact folder, the PTX its nvcc made): fashion_mobilenet float8, E4M3 for
    sm_89 (Ada), E5M2 for sm_90 (Hopper); nvcc keeps its intermediate files (``--keep``), the PTX
    that ptxas assembled into the artifact's SASS among them."""
    if not NVCC:
        pytest.skip("nvcc not found")
    from qcompiler.codegen.artifact import write_artifact
    fmt = request.param
    g, *_ = _fashion_fp8(fmt)
    archs = ("sm_89",) if fmt == "e4m3" else ("sm_90",)
    tmp = tmp_path_factory.mktemp(f"fp8_{fmt}")
    (tmp / "nvcc").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cuda_aot, "NVCC_FLAGS", (*cuda_aot.NVCC_FLAGS, "--keep", f"--keep-dir={tmp / 'nvcc'}"))
        out = write_artifact(g, TargetSpec("cuda", arch=archs, dtype="fp8", fp8_format=fmt), tmp / "OUT")
    (ptx,) = (tmp / "nvcc").glob("*.ptx")
    return fmt, g, out, ptx.read_text()


@needs_nvcc
def test_real_model_artifact_has_fp8_mma_in_its_ptx(real_fp8):
    fmt, g, out, ptx = real_fp8
    data = (out / "model.so").read_bytes()
    m = json.loads((out / "manifest.json").read_text())
    archs = m["target"]["arch"]
    assert (m["target"]["dtype"], m["target"]["fp8_format"]) == ("fp8", fmt)
    assert {("sass", a) for a in archs} <= set(cuda_aot.fatbin_contents(data))
    assert not [s for s in SOURCE_MARKERS if s in data], "CUDA source embedded in the library"
    entries = _ptx_entries(ptx)
    instr, other = mma_instr(fmt), mma_instr("e5m2" if fmt == "e4m3" else "e4m3")
    on_mma = {name for name, body in entries.items() if instr in body}
    assert not [name for name, body in entries.items() if other in body]
    assert _mma_layers(g) == (11, 12)             # 12: the stem (K = 9), 1x1 convs of K 16 / 24 (2 each), 7 depthwise
    # kernels (layers of one shape share one): 10 convs on mma (the two 40 -> 160 1x1 convs share
    # one), 9 not -- the stem, the 16 -> 64 and 24 -> 96 1x1 convs, 6 depthwise
    convs = [n for n in entries if "qlinearconv" in n]
    assert (len([n for n in convs if n in on_mma]), len(convs)) == (10, 19)
    assert [n for n in on_mma if "qlineargemm" in n], "the gemm (I x J x K = 16 x 10 x 160) is not on mma"
    assert all(entries[n].count(instr) >= 2 for n in on_mma)     # two m16n8k32 per 16x16 fragment
    # the operand fragments in registers: no local memory (TVM leaves their buffers warp-sized, cuda/mma.py)
    assert not [n for n in on_mma if ".local" in entries[n]]


def _onnx_conv_gemm(path: Path) -> None:
    """A small float model: 3x3 conv 16 -> 32 (pad 1) + Relu, global pool, Gemm 32 -> 40."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((40, 32)) * 0.1).astype(np.float32), "fw"),
             numpy_helper.from_array(np.zeros(40, np.float32), "fb")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


@needs_nvcc
def test_cli_builds_an_e5m2_cuda_artifact(tmp_path, capsys):
    """qcompile M.onnx --target cuda --arch sm_89 --dtype fp8 --fp8-format e5m2 --calib DATA."""
    from qcompiler.cli import main
    _onnx_conv_gemm(tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((8, 16, 12, 12)).astype(np.float32))
    code = main([str(tmp_path / "m.onnx"), "--target", "cuda", "--arch", "sm_89", "--dtype", "fp8",
                 "--fp8-format", "e5m2", "--calib", str(tmp_path / "calib.npz"), "-o", str(tmp_path / "out"), "-q"])
    assert code == 0, capsys.readouterr().err
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (m["target"]["family"], m["target"]["dtype"], m["target"]["fp8_format"]) == ("cuda", "fp8", "e5m2")
    assert ("sass", "sm_89") in cuda_aot.fatbin_contents((tmp_path / "out" / "model.so").read_bytes())


@pytest.mark.parametrize("argv,old", [(["--arch", "sm_86"], "sm_86"), (["--arch", "sm_90,sm_80"], "sm_80")])
def test_fp8_on_an_older_arch_is_refused(tmp_path, capsys, argv, old):
    """One line, naming --arch and the SM, exit 2, nothing written, before any calibration."""
    from qcompiler.cli import main
    _onnx_conv_gemm(tmp_path / "m.onnx")
    code = main([str(tmp_path / "m.onnx"), "--target", "cuda", "--dtype", "fp8", *argv,
                 "--calib", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("qcompile: error: --arch:") and old in err and "sm_89" in err, err
    assert not (tmp_path / "out").exists()


def test_target_spec_refuses_pre_ada_fp8():
    from qcompiler.errors import UserError
    with pytest.raises(UserError, match="--arch"):
        TargetSpec("cuda", dtype="fp8", arch=("sm_80",))
    assert TargetSpec("cuda", dtype="fp8", arch=("sm_89", "sm_90")).tvm["arch"] == "sm_89"
    TargetSpec("x86", dtype="fp8", arch=("sm_80",))         # --arch is the CUDA SM: other targets ignore it


def test_which_gemms_take_mma():
    from qcompiler.codegen.cuda.mma import TILES, block_tile, k_stage, mma_sized, whole_tiles
    assert [mma_sized(*e) for e in ((16, 8, 32), (3136, 16, 64), (1, 1000, 2048), (81, 32, 16), (784, 64, 9))] == \
        [True, True, False, False, False]
    for j, tile in ((10, "64x32"), (32, "64x32"), (48, "64x64"), (64, "64x64"), (96, "64x32"), (128, "64x128"),
                    (160, "64x32"), (1000, "64x128")):
        assert block_tile((1, 64, j, 64)) == TILES[tile], j
    assert [k_stage(k) for k in (32, 64, 96, 147, 576, 4608)] == [1, 2, 1, 1, 2, 2]
    assert whole_tiles((1, 3136, 64, 576), TILES["64x64"], 2) and not whole_tiles((1, 784, 64, 576), TILES["64x64"], 2)


# ---- the CUDA computes on the CPU ---------------------------------------------------------------------
SM89_FP8 = {fmt: TargetSpec("cuda", arch=("sm_89",), dtype="fp8", fp8_format=fmt) for fmt in FORMATS}


def cuda_on_cpu(g, fmt: str):
    """(``g``'s CUDA lowering without GPU schedules compiled for the host as ``run(feeds) ->
    outputs``, the number of its kernels in the float8 GEMM form)."""
    import tvm
    from tvm import relax
    from qcompiler.codegen.lower import lower
    mod = lower(g, SM89_FP8[fmt], gpu_schedules=False)
    gemm_form = sum("qw_f8" in mod[gv].script() for gv in mod.functions if isinstance(mod[gv], tvm.tirx.PrimFunc))
    # the host CPU (FMA): the epilogue's acc * f + b contracts to one fused multiply-add there, as nvcc
    # (--fmad=true) contracts it on the GPU and as the reference rounds it
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target(TargetSpec("x86").tvm)), tvm.cpu())

    def run(feeds: dict) -> list[np.ndarray]:
        out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[v.name])) for v in g.inputs])
        return [o.numpy() for o in (list(out) if len(g.outputs) > 1 else [out])]
    return run, gemm_form


MMA_CONVS = {"3x3 pad 1": dict(c=16, o=32, k=3, pad=1), "1x1 no act": dict(c=64, o=48, k=1, act=""),
             "3x3 stride 2": dict(c=32, o=40, k=3, stride=2, pad=1), "per-tensor 3x3": dict(c=8, o=16, k=3, pad=1,
                                                                                         per_channel=False)}
DIRECT_CONVS = {"depthwise": dict(c=16, o=16, k=3, group=16, stride=2, pad=1), "1x1 K=16": dict(c=16, o=24, k=1)}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(MMA_CONVS) + sorted(DIRECT_CONVS) + ["gemm"])
def test_cuda_fp8_computes_on_cpu(fmt, case):
    """Exact sums: bit-exact with the reference; general operands: within the float32 sum-order
    bound; the mma-sized layers in the float8 GEMM form, the others in the direct one."""
    from qcompiler.quant import reference
    storage = FORMATS[fmt]
    for exact in (True, False):
        if case == "gemm":
            g, shape, mma = gemm_graph(storage, 32, 200, 40, exact=exact), (32, 200), True
        else:
            kw = {**MMA_CONVS, **DIRECT_CONVS}[case]
            g, shape, mma = conv_graph(storage, exact=exact, **kw), (1, kw["c"], 9, 9), case in MMA_CONVS
        feeds = {"x": _input(shape, exact=exact)}
        run, gemm_form = cuda_on_cpu(g, fmt)
        (want,), (got,) = reference.run(g, feeds), run(feeds)
        assert gemm_form == int(mma), (case, gemm_form)
        if exact:
            assert np.array_equal(want, got), f"{case}: {(want != got).sum()} of {want.size} differ"
        else:
            diff = np.abs(want.astype(np.float64) - got)
            assert (diff <= _bound(g, feeds)).all(), f"{case}: max diff {diff.max()}"


def test_real_model_cuda_computes_on_cpu():
    """fashion_mobilenet E4M3 (batch 16): the CUDA lowering run on the CPU against the reference on
    48 real images (see the module docstring for the tolerance)."""
    from qcompiler.quant import reference
    g, inp, x, y = _fashion_fp8("e4m3")
    run, gemm_form = cuda_on_cpu(g, "e4m3")
    assert gemm_form == 11                        # 10 conv kernels and the gemm
    agree = []
    for s in range(500, 548, 16):
        xb = x[s:s + 16]
        (got,), ref = run({inp: xb}), reference.run(g, {inp: xb})[0]
        assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()
        agree.append(got.argmax(1) == y[s:s + 16])
    assert np.mean(agree) >= 0.85                 # measured 46 of 48


# ---- on a GPU (not run in this project's CI: no GPU) ----------------------------------------------------
RUN_ON_GPU = """
    import sys, numpy as np
    from qcompiler.runtime import load
    model = load(sys.argv[1])
    (y,) = model(np.load(sys.argv[2]))
    np.save(sys.argv[3], y)
    print("RAN ON", model.device)
"""
GPU_CASES = {"3x3 pad 1": dict(c=16, o=32, k=3, pad=1), "1x1 no act": dict(c=64, o=48, k=1, act="")}
"""K = 144 and 64, and the gemm's 160: integer-valued sums of |x| <= 8, |w| <= 6 stay below 2^13."""


def _gpu_bound(g, feeds: dict) -> np.ndarray:
    """The float32 bound of :func:`test_x86_fp8._bound` plus (at least) what a tensor core keeping 13 bits per
    mma step may lose: each of the ceil(K/32) steps adds 33 terms (32 products and the accumulator),
    each aligned to the largest and truncated, within 33·2^-12 of the magnitudes summed so far
    (<= Σ|x w|), times the epilogue's scale f_c (an assumption, see the module docstring)."""
    op = next(o for o in g.ops if o.kind in ("QLinearConv", "QLinearGemm"))
    k = int(np.prod(op.operands[1].shape[1:]))
    steps = -(-k // 32)
    return _bound(g, feeds) * (1 + steps * 33 * 2.0 ** -12 / (k * 2.0 ** -24))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_fp8_layers_on_the_gpu(fmt, tmp_path):
    """The float8 mma convs and gemm run on a GPU (sm_89+): exact sums bit-exact with the
    reference, others within :func:`_gpu_bound`."""
    import subprocess
    import textwrap
    if not NVCC or not cuda_device_present():
        pytest.skip("needs nvcc and a CUDA device (sm_89 or newer)")
    from qcompiler.codegen.artifact import write_artifact
    from qcompiler.quant import reference
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    storage = FORMATS[fmt]
    for case in [*GPU_CASES, "gemm"]:
        for exact in (True, False):
            if case == "gemm":
                g, shape = gemm_graph(storage, 32, 160, 40, exact=exact), (32, 160)
            else:
                g, shape = conv_graph(storage, exact=exact, **GPU_CASES[case]), (1, GPU_CASES[case]["c"], 9, 9)
            feeds = {"x": _input(shape, exact=exact)}
            out = write_artifact(g, TargetSpec("cuda", arch=("sm_89", "sm_90"), dtype="fp8", fp8_format=fmt),
                                 tmp_path / f"{case}-{exact}".replace(" ", "_"))
            np.save(tmp_path / "x.npy", feeds["x"])
            r = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN_ON_GPU), str(out), str(tmp_path / "x.npy"),
                                str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, timeout=300)
            assert r.returncode == 0 and "RAN ON cuda" in r.stdout, r.stdout + r.stderr
            got, want = np.load(tmp_path / "y.npy"), reference.run(g, feeds)[0]
            if exact:
                assert np.array_equal(got, want), f"{case}: {(got != want).sum()} of {got.size} differ"
            else:
                diff = np.abs(want.astype(np.float64) - got)
                assert (diff <= _gpu_bound(g, feeds)).all(), f"{case}: max diff {diff.max()}"
