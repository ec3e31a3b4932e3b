"""Sparse vs dense kernels on x86: latency of our sparse TIR kernels (qcompiler/codegen/kernels/sparse.py)
against our dense kernels on the SAME pruned weights, and the analytic cost model (qcompiler/sparse/cost.py)
beside the measurement on the real models' layers.

    python bench/bench_sparse.py                              # large gemm + large conv, then real layers
    python bench/bench_sparse.py --what large --rounds 5
    python bench/bench_sparse.py --what models --models fashion,cls --sparsity 0.8
    python bench/bench_sparse.py --what sweep --threads 1 --rounds 7 --iters 10   # synthetic layers -> JSON
    python bench/bench_sparse.py --what fit            # fit the cost model to that JSON, print constants

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

Synthetic layers (``--what sweep``, :func:`sweep_cases`): gemms at batch 1 and 1x1 / 3x3 convs on a
grid of channels and pixels, plus the large layers above, random weights, int8 and fp32, each timed
dense and in 8 sparse variants (CSR at 60/80/90 %, BSR 1x4 and 4x1 at 80/90 %, 2:4) in interleaved
rounds; ``--what fit`` fits :mod:`qcompiler.sparse.cost` to them (cost.fit) and prints the constants
that cost.py's x86 defaults hold, with the fit's error and its in-sample agreement per margin.

Real layers (``--what models``): every non-depthwise conv/gemm of fashion_mobilenet and rapidocr-cls,
its weight pruned (magnitude, ``--sparsity``, int8 weights from a per-channel quantization), as a
one-layer int8 graph at batch 1: measured dense and each sparse format, the cost model's choice
(its x86 defaults, fitted on the synthetic layers only: these are held out; beside it the previous
assumed-factor AdaPT model) and whether it agrees with the fastest measured format: exactly, on
dense-vs-sparse, and within 10 % of the fastest. ``--real-out F`` saves the timings, ``--what
recheck --real-out F`` re-scores the current model on them without timing again.
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


# ---- synthetic layers: the measurements cost.fit takes its default factors from ---------------------
def sweep_cases(layers: str = "") -> list[tuple]:
    """(label, kind, weight shape, conv geometry, batch) of the synthetic fit set: a grid of gemms
    (batch 1) and 1x1 / 3x3 convs over channels 3..1024 (powers of 2 and not: 24, 160 pad differently
    in the dense kernels' 16-lane tiles) and 1x1 (a conv on pooled features) .. 56x56 pixels, plus
    the large layers of :func:`bench_large`. Random weights; none of the real models' weights."""
    cases = []
    for n in (8, 24, 128, 512):
        for k in (16, 64, 256, 1024):
            cases.append((f"gemm {n}x{k}", "gemm", (n, k), None, 1))
    for b in (1, 4, 16):
        cases.append(("gemm 1024x1024", "gemm", (1024, 1024), None, b))
    for cin in (8, 24, 64, 160):
        for cout in (8, 24, 64, 160):
            for hw in ((1, 1), (4, 4), (8, 8), (16, 16), (12, 48)):
                cases.append((f"conv1x1 {cin}->{cout} {hw[0]}x{hw[1]}", "conv", (cout, cin, 1, 1),
                              ((1, cin) + hw, (0, 0, 0, 0), (1, 1), 1), 1))
    for cin in (3, 16, 48):
        for cout in (8, 24, 64):
            for hw, st in (((8, 8), 1), ((16, 16), 1), ((24, 48), 2)):
                cases.append((f"conv3x3 {cin}->{cout} {hw[0]}x{hw[1]}/{st}", "conv", (cout, cin, 3, 3),
                              ((1, cin) + hw, (1, 1, 1, 1), (st, st), 1), 1))
    cases.append(("conv3x3 64->64 56x56", "conv", (64, 64, 3, 3), ((1, 64, 56, 56), (1, 1, 1, 1), (1, 1), 1), 1))
    keep = [k for k in layers.split(",") if k]
    return [c for c in cases if not keep or any(k in c[0] for k in keep)]


SWEEP_VARIANTS = (("csr", 0.6, "unstructured"), ("csr", 0.8, "unstructured"), ("csr", 0.9, "unstructured"),
                  ("bsr1x4", 0.8, "unstructured"), ("bsr1x4", 0.9, "unstructured"),
                  ("bsr4x1", 0.8, "unstructured"), ("bsr4x1", 0.9, "unstructured"), ("2:4", 0.5, "2:4"))


def _columns(kind, wshape, conv, batch) -> int:
    """M of the im2col gemm: batch x output pixels (batch for a gemm)."""
    if kind == "gemm":
        return batch
    (_, _, h, w), (pt, pl, pb, pr), (sh, sw), _ = conv
    return batch * ((h + pt + pb - wshape[2]) // sh + 1) * ((w + pl + pr - wshape[3]) // sw + 1)


def _needs_im2col(wshape, conv) -> bool:
    """A conv whose X is a k x k expansion: kernel larger than 1x1, or padded."""
    return conv is not None and (int(np.prod(wshape[2:])) > 1 or any(conv[1]))


def shape_json(s) -> dict:
    from dataclasses import asdict
    return asdict(s)


def _write_samples(out: Path, head: dict, samples: list[dict]) -> None:
    """JSON, one sample a line."""
    import json
    body = ",\n".join(json.dumps(x) for x in samples)
    out.write_text(json.dumps(head)[:-1] + ', "samples": [\n' + body + "\n]}\n")


def bench_sweep(dtypes, rounds, iters, out: Path, layers: str = ""):
    """Time dense and every sparse variant of every :func:`sweep_cases` layer; write the samples
    (layer counts, format, seconds) as JSON for ``--what fit``."""
    import json
    import time

    from test_sparse_kernels import prune

    from qcompiler.sparse import cost
    from qcompiler.sparse.format import conv_matrices
    samples = []
    print(f"{'layer':28s} {'dtype':5s} {'M':>5s} " + " ".join(f"{f'{f}@{int(s * 100)}':>10s}" for f, s, _ in
                                                          (("dense", 0, ""),) + SWEEP_VARIANTS) + "  (us)")
    t0 = time.time()
    for dtype in dtypes:
        for label, kind, wshape, conv, batch in sweep_cases(layers):
            base = _weights(wshape, dtype)
            m = _columns(kind, wshape, conv, batch)
            vs = [(f, s, pat) for f, s, pat in SWEEP_VARIANTS if f != "bsr4x1" or wshape[0] % 4 == 0]
            ws = [prune(base, s, pat, RNG) for _, s, pat in vs]
            ms = time_variants(kind, dtype, batch, [(w, f) for w, (f, _, _) in zip(ws, vs)], rounds, iters, conv)
            mats = [(base if kind == "gemm" else conv_matrices(base))] + \
                [(w if kind == "gemm" else conv_matrices(w)) for w in ws]
            for (f, s, _), w, t in zip((("dense", 0.0, ""),) + tuple(vs), mats, ms):
                shape = cost.LayerShape.of(w[None] if kind == "gemm" else w, m, kind == "conv",
                                           _needs_im2col(wshape, conv))
                samples.append({"layer": label, "kind": kind, "dtype": dtype, "format": f, "sparsity": s,
                                "seconds": t * 1e-3, "shape": shape_json(shape)})
            got = dict(zip([f"{f}@{int(s * 100)}" for f, s, _ in (("dense", 0, ""),) + tuple(vs)], ms))
            print(f"{label:28s} {dtype:5s} {m:5d} " + " ".join(
                f"{got.get(f'{f}@{int(s * 100)}', float('nan')) * 1e3:10.1f}"
                for f, s, _ in (("dense", 0, ""),) + SWEEP_VARIANTS), flush=True)
            _write_samples(out, {"threads": os.environ.get("TVM_NUM_THREADS"), "rounds": rounds, "iters": iters},
                           samples)
    print(f"{len(samples)} samples in {time.time() - t0:.0f} s -> {out}")


def load_samples(path: Path) -> list[tuple]:
    """(LayerShape, format, seconds, record) of a ``--what sweep`` JSON file."""
    import json

    from qcompiler.sparse import cost
    recs = json.loads(Path(path).read_text())["samples"]
    for r in recs:                   # files written before LayerShape had im2col: the 3x3 convs (padded)
        r["shape"].setdefault("im2col", r["layer"].startswith("conv3x3"))
        r["shape"].setdefault("conv", r["layer"].startswith("conv"))
    return [(cost.LayerShape(**r["shape"]), r["format"], r["seconds"], r) for r in recs]


def _agreement(rows, cm) -> tuple[int, int, int]:
    """(exact, dense-vs-sparse, within 10 % of the fastest) over ``rows`` = [(LayerShape, {fmt: time})]:
    the model's time choice on each layer's shape against the measured times."""
    from qcompiler.sparse import cost
    ex = dvs = near = 0
    for s, t in rows:
        pick = cost.choose(s, cm).format_time
        best = min(t, key=t.get)
        ex += pick == best
        dvs += (pick == "dense") == (best == "dense")
        near += _near(t, pick)
    return ex, dvs, near


def _case(r) -> str:
    return f"{r['dtype']} {r['layer']} m={r['shape']['m']}"


def _synthetic_rows(samples) -> list[tuple]:
    """One (LayerShape, {format: seconds}) row per synthetic (layer, dtype, sparsity): its dense time
    and the sparse formats timed at that sparsity."""
    by = {}
    for s, f, t, r in samples:
        by.setdefault(_case(r), []).append((s, f, t, r))
    rows = []
    for recs in by.values():
        dense = [t for s, f, t, r in recs if f == "dense"][0]
        for sp in sorted({r["sparsity"] for *_, r in recs if r["format"] not in ("dense", "2:4")}):
            grp = [(s, f, t) for s, f, t, r in recs if r["sparsity"] == sp and f != "dense"]
            rows.append((grp[0][0], {"dense": dense, **{f: t for _, f, t in grp}}))
    return rows


def fit_samples(path: Path):
    """Fit the cost model to the synthetic sweep; print the constants (for cost.py) and the fit's
    quality on the synthetic set itself."""
    from qcompiler.sparse import cost
    samples = load_samples(path)
    cm = cost.fit([(s, f, t) for s, f, t, _ in samples])
    print(f"fitted on {len(samples)} synthetic samples ({path.name}):")
    for key in ("int8", "fp32"):
        d = getattr(cm, key)
        print(f"X86_{key.upper()} = DtypeCost(")
        for f in ("dense", "csr", "bsr1x4", "bsr4x1", "two_four"):
            c = getattr(d, f)
            print(f"    {f}=FormatCost(work={c.work:.4g}, work1={c.work1:.4g}, fixed={c.fixed:.4g}, "
                  f"tiles={c.tiles:.4g}, outputs={c.outputs:.4g}, xin={c.xin:.4g}, im2col={c.im2col:.4g}, "
                  f"conv_fixed={c.conv_fixed:.4g}),")
        print(f"    ns={d.ns:.4g})")
    print(f"{'dtype':5s} {'format':7s} {'n':>4s} {'median |err|':>12s} {'90 % |err|':>10s}")
    for key, bits in (("int8", 8), ("fp32", 32)):
        for f in ("dense", "csr", "bsr1x4", "bsr4x1", "2:4"):
            err = [abs(cost.predicted_ns(s, f, cm) * 1e-9 / t - 1) for s, ff, t, _ in samples
                   if ff == f and (s.bits <= 8) == (bits == 8)]
            if err:
                print(f"{key:5s} {f:7s} {len(err):4d} {np.median(err):12.1%} {np.percentile(err, 90):10.1%}")
    # agreement on the synthetic layers: in-sample, and 5-fold cross-validated by layer (which sets the margin)
    print(f"{'':5s} agreement on synthetic (layer, sparsity) rows: exact / dense-vs-sparse / within 10 % of the fastest")
    for key in ("int8", "fp32"):
        rows = _synthetic_rows([x for x in samples if x[3]["dtype"] == key])
        ex, dvs, near = _agreement(rows, cm)
        print(f"{key:5s} in-sample, margin {cm.margin:.2f}: {ex} / {dvs} / {near} of {len(rows)}")
    from dataclasses import replace
    layers = sorted({_case(r) for *_, r in samples})
    fold = {c: i % 5 for i, c in enumerate(np.random.default_rng(0).permutation(layers))}
    margins = (0.0, 0.05, 0.1, 0.15, 0.2)
    tot = {m: np.zeros(4, int) for m in margins}
    for k in range(5):
        cmk = cost.fit([(s, f, t) for s, f, t, r in samples if fold[_case(r)] != k])
        rows = _synthetic_rows([x for x in samples if fold[_case(x[3])] == k])
        for m in margins:
            tot[m] += (*_agreement(rows, replace(cmk, margin=m)), len(rows))
    print("5-fold cross-validation by layer (int8 + fp32), per margin (a sparse format must beat dense by it):")
    for m in margins:
        print(f"  margin {m:.2f}: {tot[m][0]} / {tot[m][1]} / {tot[m][2]} of {tot[m][3]}")
    return cm


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


def bench_models(models, sparsity, rounds, iters, out: Path | None = None):
    """Time every real layer dense and in each sparse format, and check the cost model's choice
    (its x86 defaults, fitted on the synthetic sweep only: these layers are held out)."""
    import json

    from test_sparse_kernels import prune

    from qcompiler.sparse import cost
    from qcompiler.sparse.format import conv_matrices, gemm_matrix
    cm = cost.CostModel()
    rows, recs = [], []
    print(f"\nreal layers, int8, batch 1, magnitude pruning {int(sparsity * 100)} % unstructured "
          f"(times in ms; model = cost.choose with the x86 defaults fitted on synthetic layers)")
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
        shape = cost.LayerShape.of(mats, p, kind == "conv", _needs_im2col(wq.shape, conv))
        fmts = [f for f in ("csr", "bsr1x4", "bsr4x1", "2:4")
                if (f != "bsr4x1" or shape.n % 4 == 0) and (f != "2:4" or shape.is_24)]
        ms = time_variants(kind, "int8", 1, [(wq, f) for f in fmts], rounds, iters, conv)
        t = dict(zip(["dense"] + fmts, ms))
        best = min(t, key=t.get)
        choice = cost.choose(shape, cm)
        rows.append((shape, t))
        recs.append({"model": model, "layer": name, "shape": shape_json(shape), "ms": t})
        print(f"{model:18s} {name[:28]:28s} {f'{shape.groups * shape.n}x{shape.k}x{p}':>18s} "
              + " ".join(f"{t.get(f, float('nan')):7.3f}" for f in ("dense", "csr", "bsr1x4", "bsr4x1", "2:4"))
              + f" {best:>7s} {choice.format_time:>7s} {'yes' if choice.format_time == best else 'NO':>3s} / "
              f"{'yes' if _near(t, choice.format_time) else 'NO'}", flush=True)
    if not rows:
        return
    if out is not None:
        out.write_text(json.dumps({"sparsity": sparsity, "rounds": rounds, "iters": iters,
                                   "threads": os.environ.get("TVM_NUM_THREADS"), "layers": recs}, indent=0))
    report_agreement(rows)


def report_agreement(rows):
    from qcompiler.sparse import cost
    n = len(rows)
    for label, cm in (("fitted x86 defaults (synthetic sweep; these layers held out)", cost.CostModel()),
                      ("AdaPT form, assumed factors (the previous defaults)", cost.CostModel.for_target("arm"))):
        ex, dvs, near = _agreement(rows, cm)
        dec = [(sh, t) for sh, t in rows if _decisive(t)]
        dvs_dec = _agreement(dec, cm)[1]
        print(f"cost model vs measurement on {n} layers, {label}: exact format {ex}/{n}, "
              f"dense-vs-sparse {dvs}/{n} ({dvs_dec}/{len(dec)} where dense and the best sparse format are "
              f"> 10 % apart), pick within 10 % of the fastest {near}/{n}")
    print(f"fastest measured: " + ", ".join(f"{f} {c}" for f, c in sorted(
        {f: sum(min(t, key=t.get) == f for _, t in rows) for f in cost.FORMATS}.items())) + "; "
          f"always dense within 10 %: {sum(_near(t, 'dense') for _, t in rows)}/{n}")


def _decisive(t: dict, tol: float = 0.10) -> bool:
    """Dense and the fastest sparse format are more than ``tol`` apart (not a near-tie)."""
    sp = min(v for f, v in t.items() if f != "dense")
    return max(sp, t["dense"]) > (1 + tol) * min(sp, t["dense"])


def evaluate_saved(path: Path):
    """Re-check the cost model (as it is now) against saved real-layer timings (``--real-out``)."""
    import json

    from qcompiler.sparse import cost
    recs = json.loads(Path(path).read_text())["layers"]
    report_agreement([(cost.LayerShape(**r["shape"]), r["ms"]) for r in recs])


def _near(t: dict, fmt: str, tol: float = 0.10) -> bool:
    """The format's measured time is within ``tol`` of the best measured one."""
    return fmt in t and t[fmt] <= (1 + tol) * min(t.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="all", choices=("all", "large", "models", "sweep", "fit", "recheck"))
    ap.add_argument("--real-out", type=Path, default=None,
                    help="--what models: write the real layers' timings here; --what recheck reads them")
    ap.add_argument("--samples", type=Path, default=ROOT / "bench" / "sparse_fit_samples.json",
                    help="--what sweep writes the synthetic layers' timings here, --what fit reads them")
    ap.add_argument("--layers", default="", help="--what sweep: comma-separated substrings of the synthetic "
                    "layers' labels (default: all)")
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
    if args.what == "sweep":
        bench_sweep(args.dtypes.split(","), args.rounds, args.iters, args.samples, args.layers)
    if args.what == "fit":
        fit_samples(args.samples)
    if args.what in ("all", "models"):
        bench_models(args.models.split(","), args.sparsity, args.rounds, args.iters, args.real_out)
    if args.what == "recheck":
        evaluate_saved(args.real_out)


if __name__ == "__main__":
    main()
