"""Sparse vs dense kernels on x86: latency of our sparse TIR kernels (qcompiler/codegen/kernels/sparse.py)
against our dense kernels on the SAME pruned weights, and the analytic cost model (qcompiler/sparse/cost.py)
beside the measurement on the real models' layers.

    python bench/bench_sparse.py                              # large gemm + large conv, then real layers
    python bench/bench_sparse.py --what large --rounds 5
    python bench/bench_sparse.py --what models --models fashion,cls --sparsity 0.8

Large layers: a 1024x1024 gemm (batch 1, 4, 16) and a 3x3 conv 64->64 on 56x56 (im2col: K = 576,
P = 3136 output pixels), fp32 and int8 (uint8 activations, int8 weights, requantized uint8 output),
unstructured sparsity 50/70/80/90 % in CSR (and BSR 4x1 at >= 80 %), and 2:4 in the 2:4 format.
Every variant is one graph compiled by qcompiler's own lowering (dense: the hand-scheduled dense
kernels, AVX2/VNNI dot products for int8; sparse: ``graph.meta["sparsity"]`` names the format);
latency = median over ``--rounds`` interleaved rounds (dense, then sparse) of the median of
``--iters`` calls, batch as given, ``--threads`` threads (2 by default; on a machine shared with
other jobs 1 thread avoids a parallel region waiting a scheduler time slice for a preempted
worker, which adds ~8 ms to a kernel with several parallel stages). ratio = sparse / dense (< 1:
sparse faster). block4 = 1x4 blocks pruned (prune's ``block4`` pattern); on x86 with VNNI the
int8 BSR 1x4 kernel runs on ``vpdpbusd`` (one instruction per block and 16 columns).

Real layers (``--what models``): every non-depthwise conv/gemm of fashion_mobilenet and rapidocr-cls,
its weight pruned (magnitude, ``--sparsity``, int8 weights from a per-channel quantization), as a
one-layer int8 graph at batch 1: measured dense and each sparse format, the cost model's choice
(default factors, and factors fitted to these measurements with cost.fit), and whether it agrees
with the fastest measured format.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if "--threads" in sys.argv:
    os.environ["TVM_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]
os.environ.setdefault("TVM_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "codegen"))

import numpy as np  # noqa: E402

from _timing import median_ms  # noqa: E402

RNG = np.random.default_rng(0)


def _compile(g):
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86")), tvm.cpu())
    return vm["main"]


def _interleaved(fns, args, rounds: int, iters: int) -> list[float]:
    for f in fns:
        for _ in range(2):
            f(*args)
    res = [[] for _ in fns]
    for _ in range(rounds):
        for r, f in zip(res, fns):
            r.append(median_ms(lambda: f(*args), iters))
    return [float(np.median(r)) for r in res]


def _graph(kind: str, dtype: str, w: np.ndarray, batch: int, conv=None):
    from test_sparse_kernels import fconv_graph, fgemm_graph, qconv_graph, qgemm_graph
    if kind == "gemm":
        n, k = w.shape
        g = qgemm_graph(batch, k, n, w, RNG) if dtype == "int8" else fgemm_graph(batch, k, n, w, RNG)
        shape = (batch, k)
    else:
        shape, pads, stride, group = conv
        g = (qconv_graph(shape, w, RNG, group=group, s=stride, p=pads) if dtype == "int8"
             else fconv_graph(shape, w, RNG, group=group, s=stride, p=pads))
    x = RNG.integers(0, 256, shape).astype(np.uint8) if dtype == "int8" else RNG.standard_normal(shape).astype(np.float32)
    return g, x


def _weights(shape, dtype):
    if dtype == "int8":
        return RNG.integers(-127, 128, shape).astype(np.int8)
    return (RNG.standard_normal(shape) * 0.05).astype(np.float32)


def time_variants(kind, dtype, batch, cases, rounds, iters, conv=None) -> list[float]:
    """ms of the dense kernel (first case's weights) and of each ``(w, fmt)`` case's sparse kernel,
    all compiled once and timed in interleaved rounds (dense does not depend on which weights are 0)."""
    import tvm
    from test_sparse_kernels import meta
    fns = []
    for i, (w, fmt) in enumerate(cases):
        g, x = _graph(kind, dtype, w, batch, conv)
        if i == 0:
            fns.append(_compile(g))
        fns.append(_compile(meta(g, "layer", fmt)))
    return _interleaved(fns, [tvm.runtime.tensor(x)], rounds, iters)


def bench_large(rounds, iters, batches, dtypes):
    from test_sparse_kernels import prune
    cases = [("gemm 1024x1024", "gemm", (1024, 1024), None)]
    conv = ((1, 64, 56, 56), (1, 1, 1, 1), (1, 1), 1)
    cases.append(("conv3x3 64->64 56x56", "conv", (64, 64, 3, 3), conv))
    print(f"{'layer':22s} {'dtype':5s} {'batch':>5s} {'pattern':>12s} {'format':>7s} "
          f"{'dense ms':>9s} {'sparse ms':>9s} {'ratio':>6s}")
    rows = []
    for name, kind, wshape, cv in cases:
        for dtype in dtypes:
            for batch in (batches if kind == "gemm" else [1]):
                base = _weights(wshape, dtype)
                variants = [(f"{int(s * 100)}%", "csr", s, "unstructured") for s in (0.5, 0.7, 0.8, 0.9)]
                variants += [(f"{int(s * 100)}%", "bsr4x1", s, "unstructured") for s in (0.8, 0.9)]
                variants += [(f"{int(s * 100)}%", "bsr1x4", s, "unstructured") for s in (0.8, 0.9)]
                variants += [(f"block4 {int(s * 100)}%", "bsr1x4", s, "block4") for s in (0.8, 0.9)]
                variants += [("2:4", "2:4", 0.5, "2:4")]
                ws = [(prune(base, s, pattern, RNG), fmt) for _, fmt, s, pattern in variants]
                t = time_variants(kind, dtype, batch, ws, rounds, iters, cv)
                d = t[0]
                for (label, fmt, _, _), sp in zip(variants, t[1:]):
                    rows.append((name, dtype, batch, label, fmt, d, sp))
                    print(f"{name:22s} {dtype:5s} {batch:5d} {label:>12s} {fmt:>7s} {d:9.3f} {sp:9.3f} "
                          f"{sp / d:6.2f}", flush=True)
    return rows


# ---- real models: the cost model against measurement ----------------------------------------------
def real_layers(models: list[str]):
    """(model, op name, kind, weight [float], input shape, attrs) of every non-depthwise conv/gemm."""
    import realmodels

    import qcompiler
    out = []
    cands = {m.name: m for m in realmodels.rapidocr_models() + realmodels.project_models()}
    for short, name in (("fashion", "fashion_mobilenet"), ("cls", "rapidocr-cls")):
        if short not in models or name not in cands:
            continue
        m = cands[name]
        g = qcompiler.import_onnx(m.load(), m.input_shapes)
        qcompiler.run_passes(g, "default")
        for op in g.ops:
            if op.kind not in ("Conv", "FusedConv", "Gemm", "FusedGemm") or not op.operands[1].is_const:
                continue
            w = op.operands[1].data
            group = int(op.attrs.get("group", 1) or 1)
            if op.kind.endswith("Conv") and w.shape[1] == 1 and group > 1:
                continue                                         # depthwise: not pruned (prune.py)
            out.append((name, op.name, op, w, tuple(op.operands[0].type.shape)))
    return out


def _quantize_w(w: np.ndarray) -> np.ndarray:
    m = w.reshape(w.shape[0], -1)
    s = np.maximum(np.abs(m).max(axis=1, keepdims=True), 1e-12) / 127.0
    return np.clip(np.rint(m / s), -127, 127).astype(np.int8).reshape(w.shape)


def bench_models(models, sparsity, rounds, iters):
    from test_sparse_kernels import prune

    from qcompiler.sparse import cost
    from qcompiler.sparse.format import conv_matrices, gemm_matrix
    samples, rows = [], []
    print(f"\nreal layers, int8, batch 1, magnitude pruning {int(sparsity * 100)} % unstructured "
          f"(times in ms; model = cost.choose with default factors)")
    print(f"{'model':18s} {'layer':28s} {'N x K x P':>18s} {'dense':>7s} {'csr':>7s} {'bsr1x4':>7s} {'bsr4x1':>7s} "
          f"{'2:4':>7s} {'best':>7s} {'model':>7s} agree (exact / model's pick within 10 % of the best)")
    for model, name, op, w, xshape in real_layers(models):
        wq = _quantize_w(np.asarray(w, np.float32))
        if op.kind.endswith("Gemm"):
            wq = np.ascontiguousarray(gemm_matrix(wq, int(op.attrs.get("transB", 0))))
            kind, conv, p = "gemm", None, 1
        else:
            a = op.attrs
            group = int(a.get("group", 1) or 1)
            conv = ((1,) + xshape[1:], tuple(a.get("pads") or (0, 0, 0, 0)), tuple(a.get("strides") or (1, 1)), group)
            kind = "conv"
            oshape = op.results[0].type.shape
            p = int(oshape[2] * oshape[3])
        wq = prune(wq, sparsity, "unstructured", RNG)
        mats = wq[None] if kind == "gemm" else conv_matrices(wq, conv[3])
        shape = cost.LayerShape.of(mats, p)
        fmts = [f for f in ("csr", "bsr1x4", "bsr4x1", "2:4")
                if (f != "bsr4x1" or shape.n % 4 == 0) and (f != "2:4" or shape.is_24)]
        ms = time_variants(kind, "int8", 1, [(wq, f) for f in fmts], rounds, iters, conv)
        t = dict(zip(["dense"] + fmts, ms))
        for f, v in t.items():
            samples.append((shape, f, v * 1e-3))
        best = min(t, key=t.get)
        choice = cost.choose(shape)
        rows.append((model, name, shape, t, best))
        print(f"{model:18s} {name[:28]:28s} {f'{shape.groups * shape.n}x{shape.k}x{p}':>18s} "
              + " ".join(f"{t.get(f, float('nan')):7.3f}" for f in ("dense", "csr", "bsr1x4", "bsr4x1", "2:4"))
              + f" {best:>7s} {choice.format_time:>7s} {'yes' if choice.format_time == best else 'NO':>3s} / "
              f"{'yes' if _near(t, choice.format_time) else 'NO'}", flush=True)
    if not rows:
        return
    fitted = cost.fit(samples)
    near_d = sum(_near(t, cost.choose(s).format_time) for _, _, s, t, _ in rows)
    agree_d = sum(cost.choose(s).format_time == b for _, _, s, _, b in rows)
    agree_f = sum(cost.choose(s, fitted).format_time == b for _, _, s, _, b in rows)
    # "dense or sparse" agreement (the decision that matters for speed)
    sp_d = sum((cost.choose(s).format_time == "dense") == (b == "dense") for _, _, s, _, b in rows)
    sp_f = sum((cost.choose(s, fitted).format_time == "dense") == (b == "dense") for _, _, s, _, b in rows)
    print(f"\ncost model vs measurement on {len(rows)} layers: exact format {agree_d}/{len(rows)} "
          f"(dense-vs-sparse {sp_d}/{len(rows)}) with default factors; fitted factors "
          f"c_csr={fitted.c_csr:.2f} c_bsr={fitted.c_bsr:.2f}: exact format {agree_f}/{len(rows)} "
          f"(dense-vs-sparse {sp_f}/{len(rows)}); default model's pick within 10 % of the measured best: "
          f"{near_d}/{len(rows)}")


def _near(t: dict, fmt: str, tol: float = 0.10) -> bool:
    """The format's measured time is within ``tol`` of the best measured one."""
    return fmt in t and t[fmt] <= (1 + tol) * min(t.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="all", choices=("all", "large", "models"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batches", default="1,4,16", help="gemm batch sizes")
    ap.add_argument("--dtypes", default="int8,fp32")
    ap.add_argument("--models", default="fashion,cls")
    ap.add_argument("--sparsity", type=float, default=0.8, help="unstructured sparsity of the real layers")
    ap.add_argument("--threads", type=int, default=2, help="TVM_NUM_THREADS (1: robust timings on a loaded machine)")
    args = ap.parse_args()
    if args.what in ("all", "large"):
        bench_large(args.rounds, args.iters, [int(b) for b in args.batches.split(",")], args.dtypes.split(","))
    if args.what in ("all", "models"):
        bench_models(args.models.split(","), args.sparsity, args.rounds, args.iters)


if __name__ == "__main__":
    main()
