"""x86 int8 vs fp32: latency of our own int8 kernels against our own fp32 kernels.

    python bench/bench_x86_int8_kernels.py                         # conv layers and models
    python bench/bench_x86_int8_kernels.py --what layers --rounds 7
    python bench/bench_x86_int8_kernels.py --what models --models fashion,cls
    python bench/bench_x86_int8_kernels.py --features=-avx512vnni,-avxvnni   # the AVX2 (no VNNI) path

Layers: one convolution (or gemm) per graph, fp32 ``Conv`` against ``QLinearConv`` on uint8
input/output with per-channel int8 weights and the fused requantization (no Quantize/Dequantize
around it), batch 1, 2 threads. Models: the fp32 graph after the default passes against the same
graph quantized by the ``quantize`` pass (calibrated on a few real or synthetic inputs; input
QuantizeLinear and output DequantizeLinear included), batch 1.

Both variants are compiled for the same TargetSpec (``--features`` adds LLVM mattr, e.g. to hide
VNNI); latency is the median over ``--rounds`` interleaved rounds (fp32, then int8) of the median
of ``--iters`` calls each, so that load from other processes hits both alike. ratio = int8 / fp32
(< 1: int8 faster).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

RNG = np.random.default_rng(0)

# name: (C, K, H, W, kernel, stride, group, pad)
LAYERS = {
    "conv3x3 64->64 56x56": (64, 64, 56, 56, 3, 1, 1, 1),
    "conv3x3 s2 32->64 56x56": (32, 64, 56, 56, 3, 2, 1, 1),
    "conv1x1 128->128 28x28": (128, 128, 28, 28, 1, 1, 1, 0),
    "conv1x1 256->512 14x14": (256, 512, 14, 14, 1, 1, 1, 0),
    "conv3x3 3->32 s2 224x224": (3, 32, 224, 224, 3, 2, 1, 1),
    "dw3x3 128 28x28": (128, 128, 28, 28, 3, 1, 128, 1),
    "dw3x3 s2 96 56x56": (96, 96, 56, 56, 3, 2, 96, 1),
    "dw5x5 200 6x24": (200, 200, 6, 24, 5, 1, 200, 2),          # a rapidocr-cls depthwise layer
    "dw5x5 s2 64 56x56": (64, 64, 56, 56, 5, 2, 64, 2),
}
GEMMS = {"gemm 1x1024->1000": (1, 1024, 1000), "gemm 64x512->384": (64, 512, 384)}


from _timing import median_ms as _median_ms  # noqa: E402  (bench/ is on sys.path when run as a script)


def _compile(g, spec):
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    vm = relax.VirtualMachine(build_module(g, spec), tvm.cpu())
    return vm["main"]


def _interleaved(fns: list, args: list, rounds: int, iters: int) -> list[float]:
    for f, a in zip(fns, args):
        for _ in range(2):
            f(*a)
    res = [[] for _ in fns]
    for _ in range(rounds):
        for r, f, a in zip(res, fns, args):
            r.append(_median_ms(lambda: f(*a), iters))
    return [float(np.median(r)) for r in res]


# ---- single layers -----------------------------------------------------------------------------------
def layer_graphs(name):
    """(fp32 graph, int8 graph, fp32 feed, int8 feed) of one conv or gemm layer."""
    from qcompiler.ir import Graph, QuantParams, TensorType
    from qcompiler.ir.ops import infer_types
    from qcompiler.quant.requant import conv_multipliers
    qx = QuantParams("uint8", (0.02,), (117,))
    qo = QuantParams("uint8", (0.05,), (3,))
    if name in GEMMS:
        m, k, n = GEMMS[name]
        xshape, wshape, kind, attrs = (m, k), (n, k), "Gemm", {"transB": 1}
        qkind, qattrs = "QLinearGemm", {}
    else:
        c, kk, h, w, r, s, g, p = LAYERS[name]
        xshape, wshape = (1, c, h, w), (kk, c // g, r, r)
        attrs = {"strides": [s, s], "pads": [p] * 4, "group": g, "dilations": [1, 1], "kernel_shape": [r, r]}
        kind, qkind = "Conv", "QLinearConv"
        qattrs = {k: v for k, v in attrs.items() if k != "kernel_shape"}
        qattrs.update(activation="Relu", activation_params=[])
    o = wshape[0]
    wf = RNG.standard_normal(wshape).astype(np.float32) * 0.05
    bf = RNG.standard_normal(o).astype(np.float32) * 0.1
    gf = Graph("fp32")
    xf = gf.add_input("x", TensorType(xshape, "float32"))
    y = gf.create_op(kind, [xf, gf.add_const(wf, "w"), gf.add_const(bf, "b")], attrs).result
    gf.outputs = [gf.create_op("Relu", [y]).result]
    gq = Graph("int8")
    x = gq.add_input("x", TensorType(xshape, "uint8", qx))
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, o))
    qw = QuantParams("int8", ws, (0,) * o, axis=0)
    qb = QuantParams("int32", tuple(float(np.float32(qx.scale[0]) * np.float32(v)) for v in ws), (0,) * o, axis=0)
    ops = [x, gq.add_const(RNG.integers(-127, 128, wshape).astype(np.int8), "w", qw),
           gq.add_const(RNG.integers(-3000, 3000, o).astype(np.int32), "b", qb)]
    ms, ss = conv_multipliers(qx.scale[0], ws, qo.scale[0])
    qattrs.update(multiplier=ms, shift=ss)
    shape = infer_types(qkind, [v.type for v in ops], qattrs)[0].shape
    gq.outputs = [gq.create_op(qkind, ops, qattrs, result_types=[TensorType(shape, "uint8", qo)]).result]
    return gf, gq, RNG.standard_normal(xshape).astype(np.float32), RNG.integers(0, 256, xshape).astype(np.uint8)


def bench_layers(spec, rounds, iters, names):
    import tvm
    print(f"{'layer':28s} {'GMAC':>7s} {'fp32 ms':>9s} {'int8 ms':>9s} {'int8/fp32':>9s}")
    for name in names:
        gf, gq, xf, xq = layer_graphs(name)
        op = gq.outputs[0].producer
        w = op.operands[1].type.shape
        gmac = np.prod(gq.outputs[0].type.shape) * np.prod(w[1:]) / 1e9
        f32, i8 = _compile(gf, spec), _compile(gq, spec)
        t = _interleaved([f32, i8], [[tvm.runtime.tensor(xf)], [tvm.runtime.tensor(xq)]], rounds, iters)
        print(f"{name:28s} {gmac:7.3f} {t[0]:9.3f} {t[1]:9.3f} {t[1] / t[0]:9.2f}", flush=True)


# ---- whole models ------------------------------------------------------------------------------------
def model_cases(filt):
    import realmodels
    out = []
    fm = Path(realmodels.MODELS_DIR) / "fashion_mobilenet.onnx"
    data = realmodels.fashion_test()
    if fm.exists() and data is not None:
        x = data[0].astype(np.float32)
        out.append(("fashion_mobilenet", str(fm), x[:1], [x[i:i + 1] for i in range(0, 64, 4)]))
    for m in realmodels.rapidocr_models():
        kind = m.name.split("-")[1]
        if kind == "rec":
            continue
        shape = m.input_shapes["x"]
        x = realmodels.rapidocr_input(kind, shape)
        calib = [realmodels.rapidocr_input(kind, shape) * np.float32(s) for s in (0.9, 1.0, 1.1)]
        out.append((m.name, m.source, x, calib))
    return [c for c in out if not filt or any(s in c[0] for s in filt.split(","))]


def model_graphs(path, calib):
    import onnx

    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import PassContext, PassManager, run_passes
    from qcompiler.passes.quantize import QuantizeOptions
    m = onnx.load(path)
    name = m.graph.input[0].name
    shape = calib[0].shape
    gf = import_onnx(m, {name: shape})
    run_passes(gf)
    gq = import_onnx(m, {name: shape})
    run_passes(gq)
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        calib=[{name: c} for c in calib])})).run(gq)
    return gf, gq


def bench_models(spec, rounds, iters, filt):
    import tvm
    print(f"{'model':22s} {'input':>14s} {'fp32 ms':>9s} {'int8 ms':>9s} {'int8/fp32':>9s} {'QLinearConv':>11s}")
    for name, path, x, calib in model_cases(filt):
        gf, gq = model_graphs(path, calib)
        nq = sum(op.kind == "QLinearConv" for op in gq.ops)
        nc = nq + sum(op.kind in ("Conv", "FusedConv") for op in gq.ops)
        f32, i8 = _compile(gf, spec), _compile(gq, spec)
        a = [tvm.runtime.tensor(x)]
        t = _interleaved([f32, i8], [a, a], rounds, iters)
        shape = "x".join(map(str, x.shape))
        print(f"{name:22s} {shape:>14s} {t[0]:9.3f} {t[1]:9.3f} {t[1] / t[0]:9.2f} {nq:5d}/{nc:<5d}", flush=True)


def main(argv=None) -> int:
    from qcompiler.codegen.target import TargetSpec
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="layers,models", help="layers, models or both (default)")
    ap.add_argument("--layers", default="", help="comma-separated substrings of layer names (default: all)")
    ap.add_argument("--models", default="", help="comma-separated substrings of model names (default: all)")
    ap.add_argument("--features", default="", help="LLVM mattr for both variants, e.g. -avx512vnni,-avxvnni")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    spec = TargetSpec("x86", features=tuple(f for f in a.features.split(",") if f))
    from qcompiler.codegen.intrin_x86 import int8_isa
    print(f"target: {spec.host_tvm}  int8 kernels: {int8_isa(spec)}  threads: {a.threads}")
    if "layers" in a.what:
        names = [n for n in (*LAYERS, *GEMMS) if not a.layers or any(s in n for s in a.layers.split(","))]
        bench_layers(spec, a.rounds, a.iters, names)
    if "models" in a.what:
        bench_models(spec, a.rounds, a.iters, a.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
