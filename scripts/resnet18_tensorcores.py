"""ResNet-18-shaped ONNX model (random seeded weights, onnx.helper only) and a report of which of
its kernels dlight's CUDA rules tensorize (WMMA) after qcompiler's lowering for ``--target cuda``.

    .venv/bin/python scripts/resnet18_tensorcores.py [--batch 1 8] [--dtype int8 fp16] [--source]

For each conv/gemm kernel of the lowered module (after TVM's CUDA pipeline passes up to FuseTIR)
it prints the implicit-GEMM extents I (n*oh*ow), J (co), K (ci*kh*kw), the first dlight rule that
applies (Matmul, GEMV, Reduction, GeneralReduction, Fallback, in ApplyDefaultSchedule's order) and
whether the scheduled function calls the WMMA intrinsics (``tvm_mma_sync``). ``--source`` also
builds the artifact for sm_90 and counts ``wmma::mma_sync`` in the generated CUDA source.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def resnet18(batch: int = 1, seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    """torchvision's resnet18 topology (conv-BN-ReLU, 3x3 max pool, 4 stages of 2 basic blocks,
    1x1 stride-2 downsample convs, global average pool, FC) with He-initialized random weights and
    random BN statistics: no torch needed."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = Counter()

    def name(p):
        count[p] += 1
        return f"{p}{count[p]}"

    def const(arr, p):
        n = name(p)
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), n))
        return n

    def conv_bn(x, cin, cout, k, s, relu=True):
        w = rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        y = name("conv")
        nodes.append(helper.make_node("Conv", [x, const(w, "w")], [y], kernel_shape=[k, k], strides=[s, s],
                                      pads=[k // 2] * 4))
        bn = name("bn")
        nodes.append(helper.make_node("BatchNormalization", [y, const(rng.uniform(0.5, 1.0, cout), "g"),
                                      const(rng.normal(0, 0.1, cout), "b"), const(rng.normal(0, 0.1, cout), "m"),
                                      const(rng.uniform(0.5, 1.5, cout), "v")], [bn], epsilon=1e-5))
        if not relu:
            return bn
        r = name("relu")
        nodes.append(helper.make_node("Relu", [bn], [r]))
        return r

    def block(x, cin, cout, s):
        y = conv_bn(x, cin, cout, 3, s)
        y = conv_bn(y, cout, cout, 3, 1, relu=False)
        sc = conv_bn(x, cin, cout, 1, s, relu=False) if (s != 1 or cin != cout) else x
        a = name("add")
        nodes.append(helper.make_node("Add", [y, sc], [a]))
        r = name("relu")
        nodes.append(helper.make_node("Relu", [a], [r]))
        return r

    x = conv_bn("input", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, cin = "pool0", 64
    for cout, s in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = block(x, cin, cout, s)
        x = block(x, cout, cout, 1)
        cin = cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    fw = const(rng.standard_normal((classes, 512)) * np.sqrt(1.0 / 512), "fcw")
    fb = const(rng.normal(0, 0.01, classes), "fcb")
    nodes.append(helper.make_node("Gemm", ["flat", fw, fb], ["logits"], transB=1))
    graph = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                              [batch, 3, 224, 224])], [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                              [batch, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


RULES = ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")


def quantized_graph(path: str, dtype: str, log=lambda *a: None):
    """The graph ``qcompile PATH --target cuda --dtype DTYPE --calib random`` compiles."""
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.driver import CalibOptions, CompileOptions, ModelSource, load_model, run_pipeline
    calib = "random"
    batch = onnx.load(path).graph.input[0].type.tensor_type.shape.dim[0].dim_value
    if batch > 1:
        # `--calib random` draws batch-1 samples whatever the model's static batch (the batch-8 graph
        # then calibrates on wrongly shaped data and fails): give the same kind of noise as a file
        calib = f"/tmp/resnet18_noise_b{batch}.npz"
        np.savez(calib, input=np.random.default_rng(0).standard_normal((4 * batch, 3, 224, 224)).astype(np.float32))
    spec = TargetSpec("cuda", dtype=dtype)
    opts = CompileOptions(target=spec, calib=CalibOptions(source=calib), quiet=True)
    g = load_model(ModelSource(path))
    run_pipeline(g, opts, log)
    return g, spec


def fused_module(g, spec):
    """lower() and TVM's CUDA pipeline up to FuseTIR: the PrimFuncs dlight schedules."""
    import tvm
    from tvm import relax
    from qcompiler.codegen.lower import lower
    mod = lower(g, spec)
    target = tvm.target.Target(spec.tvm)
    with target, tvm.transform.PassContext(opt_level=3):
        for p in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                  relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()):
            mod = p(mod)
    return mod, target


def classify(mod, target):
    """[(kernel, rule, uses_wmma, (I, J, K) | None)] for every conv/gemm PrimFunc of ``mod``: the
    kernels the lowering already scheduled (rule "cuda_wmma": int8 implicit GEMMs on tensor cores,
    qcompiler/codegen/cuda/wmma.py; "cuda_direct": depthwise convs and pooling,
    cuda/direct.py), the rest as dlight's ApplyDefaultSchedule would."""
    import tvm
    from tvm.s_tir import dlight as dl
    from qcompiler.codegen.cuda import wmma as cuda_wmma
    rules = [getattr(dl.gpu, r)() for r in RULES]
    rows = []
    for gv, f in mod.functions.items():
        if not isinstance(f, tvm.tirx.PrimFunc) or not any(k in gv.name_hint for k in ("conv", "gemm", "Gemm", "Conv")):
            continue
        if f.attrs is not None and "tirx.is_scheduled" in f.attrs:     # scheduled by the lowering itself
            wmma = "tvm_mma_sync" in f.script()
            rows.append((gv.name_hint, "cuda_wmma" if wmma else "cuda_direct", wmma, None))
            continue
        name, sch = "NONE", None
        for rname, r in zip(RULES, rules):
            try:
                sch = r.apply(f, target, False)
            except Exception:          # noqa: BLE001 - a rule that raises does not apply (as in dlight)
                sch = None
            if sch is not None:
                name = rname
                break
        wmma = sch is not None and "tvm_mma_sync" in sch.mod.script()
        info = cuda_wmma.gemm_extents(f)
        rows.append((gv.name_hint, name, wmma, info and info[0][1:]))
    return rows


def cuda_source_wmma(g, spec, out: Path) -> int:
    """Builds the artifact for sm_90 and counts ``wmma::mma_sync`` calls in the CUDA source TVM
    generated for it (before nvcc turned it into the embedded fatbin)."""
    from qcompiler.codegen.cuda.aot import cuda_sources
    from qcompiler.codegen.lower import build_module
    return cuda_sources(build_module(g, spec).mod).count("wmma::mma_sync")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--dtype", nargs="+", default=["int8", "fp16"])
    ap.add_argument("--source", action="store_true", help="also build and count wmma::mma_sync in the CUDA source")
    a = ap.parse_args(argv)
    for b in a.batch:
        path = f"/tmp/resnet18_b{b}.onnx"
        onnx.save(resnet18(b), path)
        for dtype in a.dtype:
            g, spec = quantized_graph(path, dtype)
            mod, target = fused_module(g, spec)
            rows = classify(mod, target)
            print(f"== resnet18 batch {b} --dtype {dtype}: {sum(r[2] for r in rows)} of {len(rows)} "
                  f"conv/gemm kernels on WMMA tensor cores")
            for name, rule, wmma, ext in rows:
                print(f"  {name:40s} {rule:16s} {'WMMA' if wmma else '-':5s} IJK={ext}")
            if a.source:
                print(f"  wmma::mma_sync calls in the CUDA source: {cuda_source_wmma(g, spec, Path('/tmp'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
