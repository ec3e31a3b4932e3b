"""x86 int8 vs fp32: latency of our own int8 kernels against our own fp32 kernels.

    python bench/bench_x86_int8_kernels.py                         # conv layers and models
    python bench/bench_x86_int8_kernels.py --what layers --rounds 7
    python bench/bench_x86_int8_kernels.py --what models --models fashion,cls
    python bench/bench_x86_int8_kernels.py --features=-avx512vnni,-avxvnni   # the AVX2 (no VNNI) path
    python bench/bench_x86_int8_kernels.py --what kernels --models cls --threads 1   # per-kernel profile
    python bench/bench_x86_int8_kernels.py --what kernels --models svhn --threads 1  # ... with % of VNNI peak
                                                     # (without VNNI: of the vpmaddwd peak, bench/x86_avx2_peak.c)
    python bench/bench_x86_int8_kernels.py --what kernels --models fashion --batch 8  # ... the models at batch 8

Layers: one convolution (or gemm) per graph, fp32 ``Conv`` (activation fused by the default passes) against ``QLinearConv`` on uint8
input/output with per-channel int8 weights and the fused requantization (no Quantize/Dequantize
around it), batch 1, 2 threads. Models: the fp32 graph after the default passes against the same
graph quantized by the ``quantize`` pass (calibrated on a few real or synthetic inputs; input
QuantizeLinear and output DequantizeLinear included) and given its weight formats by ``encode-sparse``
(both as ``qcompile --dtype int8`` runs them), batch 1.

Both variants are compiled for the same TargetSpec (``--features`` adds LLVM mattr, e.g. to hide
VNNI); latency is the median over ``--rounds`` interleaved rounds (fp32, then int8) of the median
of ``--iters`` calls each, so that load from other processes hits both alike. ratio = int8 / fp32
(< 1: int8 faster).

Kernels (``--what kernels``): every kernel of both builds of a model timed alone (TVM
``time_evaluator``, as :func:`qcompiler.plan.layer_cost.kernel_times`), the int8 kernel beside the
fp32 kernel of the same anchor layer, whether each runs on the thread pool (``par``), the sums by
category (depthwise conv, 1x1 conv, other conv, squeeze-excite multiply, pools, gemm, conversions,
other), and the whole model called through the VM (interleaved medians), whose excess over the
kernel sum is the VM's per-call and per-kernel overhead plus what the kernels lose when chained.
Idle worker threads do not spin (TVM_THREAD_POOL_SPIN_COUNT=0, as bench_int8.py runs).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")      # as bench_int8.py: idle workers sleep
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
    # rapidocr-cls's largest layers, with its HardSwish (the float32 epilogue of qcompiler/quant/hardswish.py)
    "dw5x5 200 2x96 HardSwish": (200, 200, 2, 96, 5, 1, 200, 2),
    "conv1x1 32->200 2x96 HardSwish": (32, 200, 2, 96, 1, 1, 1, 0),
}
GEMMS = {"gemm 1x1024->1000": (1, 1024, 1000), "gemm 64x512->384": (64, 512, 384)}


from _timing import median_ms as _median_ms  # noqa: E402  (bench/ is on sys.path when run as a script)
from qcompiler.runtime.device import cpu_flags  # noqa: E402


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
        qattrs.update(activation="HardSwish" if "HardSwish" in name else "Relu", activation_params=[])
    o = wshape[0]
    wf = RNG.standard_normal(wshape).astype(np.float32) * 0.05
    bf = RNG.standard_normal(o).astype(np.float32) * 0.1
    gf = Graph("fp32")
    xf = gf.add_input("x", TensorType(xshape, "float32"))
    y = gf.create_op(kind, [xf, gf.add_const(wf, "w"), gf.add_const(bf, "b")], attrs).result
    gf.outputs = [gf.create_op(qattrs.get("activation", "Relu") if kind == "Conv" else "Relu", [y]).result]
    from qcompiler.passes import run_passes
    run_passes(gf)                                  # the activation fused into the conv, as in a model
    gq = Graph("int8")
    x = gq.add_input("x", TensorType(xshape, "uint8", qx))
    ws = tuple(float(v) for v in RNG.uniform(0.002, 0.01, o))
    qw = QuantParams("int8", ws, (0,) * o, axis=0)
    qb = QuantParams("int32", tuple(float(np.float32(qx.scale[0]) * np.float32(v)) for v in ws), (0,) * o, axis=0)
    ops = [x, gq.add_const(RNG.integers(-127, 128, wshape).astype(np.int8), "w", qw),
           gq.add_const(RNG.integers(-3000, 3000, o).astype(np.int32), "b", qb)]
    if qattrs.get("activation") == "HardSwish":
        from qcompiler.quant import hardswish
        qattrs.update(hardswish.epilogue_attrs(qx.scale[0], ws, qo, [], o))
    else:
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
def model_cases(filt, batch: int = 1):
    """``(name, onnx path, input, calibration inputs)`` of the real models, batch 1, or each array
    repeated ``batch`` times along the batch axis (kernel timing does not depend on the values)."""
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
    for m in realmodels.project_models():             # mnistnet, uspsnet, svhnnet on their digit inputs
        if m.name.startswith("fashion") or m.data == "random":
            continue
        (name, x), = m.feeds(0).items()
        out.append((m.name, m.source, x[:1], [x[i:i + 1] for i in range(min(len(x), 16))]))
    out = [c for c in out if not filt or any(s in c[0] for s in filt.split(","))]
    if batch > 1:
        out = [(n, p, np.repeat(x, batch, axis=0), [np.repeat(c, batch, axis=0) for c in cal]) for n, p, x, cal in out]
    return out


def model_graphs(path, calib):
    import onnx

    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import PassContext, PassManager, run_passes
    from qcompiler.passes.quantize import QuantizeOptions
    m = onnx.load(path)
    name = m.graph.input[0].name
    shape = calib[0].shape
    for d, n in zip(m.graph.input[0].type.tensor_type.shape.dim, shape):   # a batch fixed at 1 (--batch)
        d.Clear()
        d.dim_value = n
    gf = import_onnx(m, {name: shape})
    run_passes(gf)
    gq = import_onnx(m, {name: shape})
    run_passes(gq)
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(
        calib=[{name: c} for c in calib])})).run(gq)
    # as qcompile: encode-sparse last, whose per-layer format the lowering follows (a sparse kernel
    # picked for an unpruned layer cost rapidocr-cls 0.3-0.6 ms, unseen while this bench skipped it)
    from qcompiler.passes.encode_sparse import EncodeSparseOptions
    PassManager("encode-sparse", ctx=PassContext(options={"encode-sparse": EncodeSparseOptions()})).run(gq)
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


# ---- per-kernel profile ------------------------------------------------------------------------------
def _category(members) -> str:
    """The kernel's class by its anchor op: dw (depthwise conv), 1x1 / conv, mul (QLinearMul / Mul:
    the squeeze-excite gate), pool, gemm, q/dq (a Quantize/DequantizeLinear-only kernel) or other."""
    from qcompiler.plan.layer_cost import CONV_KINDS, GEMM_KINDS, POOL_KINDS
    for op in members:
        if op.kind in CONV_KINDS:
            w = op.operands[1].shape
            if op.attrs.get("group", 1) > 1 and w[1] == 1:
                return "dw"
            return "1x1" if tuple(w[2:]) == (1, 1) else "conv"
        if op.kind in GEMM_KINDS:
            return "gemm"
        if op.kind in POOL_KINDS:
            return "pool"
    kinds = {op.kind for op in members}
    if "QLinearMul" in kinds or any(op.kind == "Mul" and not any(v.is_const for v in op.operands) for op in members):
        return "mul"
    if kinds <= {"QuantizeLinear", "DequantizeLinear"}:
        return "q/dq"
    return "other"


def _anchor_name(members) -> str:
    from qcompiler.plan.layer_cost import macs
    main = next((op for op in members if macs(op)), None) or next(
        (op for op in members if op.kind not in ("QuantizeLinear", "DequantizeLinear", "Requantize")), members[-1])
    return main.name


def _shape_note(members) -> str:
    """' C->K RxS sS HxW' of the kernel's conv, or its output shape."""
    from qcompiler.plan.layer_cost import CONV_KINDS
    conv = next((op for op in members if op.kind in CONV_KINDS), None)
    if conv is None:
        return " " + "x".join(map(str, members[-1].results[0].shape))
    k, _, r, s = conv.operands[1].shape
    c, (oh, ow) = conv.operands[0].shape[1], conv.results[0].shape[2:]
    st = (conv.attrs.get("strides") or [1])[0]
    return f" {c}->{k} {r}x{s}{' s2' if st == 2 else ''} {oh}x{ow}"


def profile_kernels(graph, spec, repeats: int):
    """[(anchor name, category, label, parallel, ms, MACs)] for every kernel call of ``graph``."""
    from qcompiler.plan.layer_cost import macs, time_each_kernel
    out = []
    for members, name, func, ms in time_each_kernel(graph, spec, repeats):
        par = "T.parallel" in func.script()
        label = "+".join(op.kind for op in members) + _shape_note(members)
        out.append((_anchor_name(members), _category(members), f"{name} {label}", par, ms,
                    sum(macs(op) for op in members)))
    return out


def _c_peak(source: str, flags: list[str], cpu_flag: str, tag: str) -> float | None:
    """GMAC/s printed by one of the bench/x86_*_peak.c programs (compiled with the system cc), or
    None where there is no compiler, no ``cpu_flag`` in /proc/cpuinfo, or the program fails."""
    import shutil
    import subprocess
    import tempfile
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or cpu_flag not in (cpu_flags() or set()):
        return None
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "peak"
        r = subprocess.run([cc, "-O2", *flags, str(ROOT / "bench" / source), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        r = subprocess.run([str(exe)], capture_output=True, text=True)
    return float(r.stdout.split(tag)[1].split()[0]) if r.returncode == 0 and tag in r.stdout else None


def vnni_peak_gmacs() -> float | None:
    """One core's vpdpbusd peak in GMAC/s (bench/x86_vnni_peak.c)."""
    return _c_peak("x86_vnni_peak.c", ["-mavx512f", "-mavx512bw", "-mavx512vnni"], "avx512_vnni", "zmm:")


def amx_peak_gmacs() -> float | None:
    """One core's AMX-INT8 tdpbusd peak in GMAC/s (bench/x86_amx_peak.c), where the CPU has it."""
    return _c_peak("x86_amx_peak.c", ["-mamx-tile", "-mamx-int8"], "amx_int8", "tdpbusd:")


def avx2_peak_gmacs() -> float | None:
    """One core's exact int8 peak without VNNI in GMAC/s: vpmaddwd + vpaddd (bench/x86_avx2_peak.c)."""
    return _c_peak("x86_avx2_peak.c", [], "avx2", "vpmaddwd ymm:")


def _peak_note(par: bool, ms: float, n_macs: int, peak: float | None, threads: int) -> str:
    """' <GMAC/s> <%>' of an int8 conv/gemm kernel against ``peak`` GMAC/s per core (times the
    threads for a kernel on the thread pool)."""
    if not n_macs or not ms or peak is None:
        return ""
    g = n_macs / (ms * 1e-3) / 1e9
    return f" {g:6.0f} {100 * g / (peak * (threads if par else 1)):4.0f}%"


def bench_kernels(spec, rounds, iters, filt, repeats: int = 5, threads: int = 1, batch: int = 1):
    import tvm
    peak, peak_name, source = vnni_peak_gmacs(), "VNNI", "x86_vnni_peak.c"
    if peak is None and "avx512_vnni" not in (cpu_flags() or set()):     # AVX2 only: the exact vpmaddwd peak
        peak, peak_name, source = avx2_peak_gmacs(), "vpmaddwd", "x86_avx2_peak.c"
    if peak is not None:
        print(f"{peak_name} peak (bench/{source}): {peak:.0f} GMAC/s per core; int8 conv/gemm kernels print "
              f"GMAC/s and % of it (x {threads} threads for * kernels)")
        if peak_name == "vpmaddwd":
            print("MACs are the direct convolution's: the 3x3 Winograd convs (x86/qwinograd.py) multiply "
                  "2.25x fewer, so they can pass 100 %")
    if peak is not None and peak_name == "VNNI":
        amx = amx_peak_gmacs()
        if amx is not None:
            print(f"AMX-INT8 peak (bench/x86_amx_peak.c): {amx:.0f} GMAC/s per core, {amx / peak:.1f}x VNNI "
                  f"(our kernels do not use AMX)")
    for name, path, x, calib in model_cases(filt, batch):
        gf, gq = model_graphs(path, calib)
        kq, kf = profile_kernels(gq, spec, repeats), profile_kernels(gf, spec, repeats)
        fmap = {}
        for row in kf:
            fmap.setdefault(row[0], []).append(row)
        print(f"\n{name}: {len(kq)} int8 kernels, {len(kf)} fp32 kernels (us; * = thread pool)")
        print(f"{'int8 kernel':64s} {'us':>8s}   {'fp32 kernel':40s} {'us':>8s}")
        kq = [(a, c, lab.replace("QLinearConv", "QConv").replace("DequantizeLinear+HardSigmoid+QuantizeLinear+", "SE:")
               .replace("_qlinear", "_q"), p, m, n) for a, c, lab, p, m, n in kq]
        used = set()
        for anchor, cat, label, par, ms, n_macs in kq:
            fr = fmap.get(anchor, [])
            f = next((r for r in fr if id(r) not in used), None)
            if f is not None and cat not in ("q/dq",):
                used.add(id(f))
                ftxt = f"{f[2].split(' ', 1)[0][:39]:40s} {f[4] * 1e3:7.1f}{'*' if f[3] else ' '}"
            else:
                ftxt = ""
            print(f"{label[:63]:64s} {ms * 1e3:7.1f}{'*' if par else ' '}   {ftxt}"
                  f"{_peak_note(par, ms, n_macs, peak, threads) if cat in ('1x1', 'conv', 'gemm') else ''}")
        for row in kf:
            if id(row) not in used:
                print(f"{'':64s} {'':8s}   {row[2][:39]:40s} {row[4] * 1e3:7.1f}{'*' if row[3] else ' '}")
        cats = sorted({r[1] for r in kq + kf})
        print(f"\n{'category':10s} {'int8 us':>9s} {'n':>3s} {'par':>3s} {'fp32 us':>9s} {'n':>3s} {'par':>3s}")
        for c in cats:
            a = [r for r in kq if r[1] == c]
            b = [r for r in kf if r[1] == c]
            print(f"{c:10s} {sum(r[4] for r in a) * 1e3:9.1f} {len(a):3d} {sum(r[3] for r in a):3d} "
                  f"{sum(r[4] for r in b) * 1e3:9.1f} {len(b):3d} {sum(r[3] for r in b):3d}")
        sq, sf = sum(r[4] for r in kq), sum(r[4] for r in kf)
        f32, i8 = _compile(gf, spec), _compile(gq, spec)
        a = [tvm.runtime.tensor(x)]
        t = _interleaved([f32, i8], [a, a], rounds, iters)
        print(f"{'sum':10s} {sq * 1e3:9.1f} {len(kq):3d} {sum(r[3] for r in kq):3d} {sf * 1e3:9.1f} {len(kf):3d} "
              f"{sum(r[3] for r in kf):3d}")
        print(f"{'model (VM)':10s} {t[1] * 1e3:9.1f} {'':7s} {t[0] * 1e3:9.1f}      int8/fp32 {t[1] / t[0]:.2f}")
        print(f"{'VM - sum':10s} {(t[1] - sq) * 1e3:9.1f} {'':7s} {(t[0] - sf) * 1e3:9.1f}", flush=True)
        if peak is not None:
            dot = [r for r in kq if r[1] in ("1x1", "conv", "gemm")]
            n_dot, t_dot = sum(r[5] for r in dot), sum(r[4] for r in dot)
            all_macs = sum(r[5] for r in kq)
            g_dot, g_all = n_dot / (t_dot * 1e-3) / 1e9, all_macs / (t[1] * 1e-3) / 1e9       # times in ms
            print(f"int8 conv/gemm kernels: {n_dot / 1e6:.1f} M MACs in {t_dot * 1e3:.1f} us = {g_dot:.0f} GMAC/s; "
                  f"whole model (VM): {g_all:.0f} GMAC/s = {100 * g_all / (peak * threads):.0f} % "
                  f"of {threads} core(s)' {peak_name} peak", flush=True)


def main(argv=None) -> int:
    from qcompiler.codegen.target import TargetSpec
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="layers,models", help="layers, models (both by default) or kernels")
    ap.add_argument("--layers", default="", help="comma-separated substrings of layer names (default: all)")
    ap.add_argument("--models", default="", help="comma-separated substrings of model names (default: all)")
    ap.add_argument("--features", default="", help="LLVM mattr for both variants, e.g. -avx512vnni,-avxvnni")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="--what kernels: the models at this batch size")
    a = ap.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    spec = TargetSpec("x86", features=tuple(f for f in a.features.split(",") if f))
    from qcompiler.codegen.isa import int8_isa
    print(f"target: {spec.host_tvm}  int8 kernels: {int8_isa(spec)}  threads: {a.threads}")
    if "layers" in a.what:
        names = [n for n in (*LAYERS, *GEMMS) if not a.layers or any(s in n for s in a.layers.split(","))]
        bench_layers(spec, a.rounds, a.iters, names)
    if "models" in a.what:
        bench_models(spec, a.rounds, a.iters, a.models)
    if "kernels" in a.what:
        bench_kernels(spec, a.rounds, a.iters, a.models, threads=a.threads, batch=a.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
