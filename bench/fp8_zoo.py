"""fp8 (E4M3 by default) beside per-channel int8 on zoo models: output SQNR against ONNX Runtime
fp32, the reference interpreter's SQNR, the artifact's agreement with the reference, and the model.so
sizes (issue #38's acceptance: fp8 E4M3 >= 25 dB on ResNet-18/50, MobileNetV2 and a ViT).

    python bench/fp8_zoo.py                                   # resnet18 resnet50 mobilenet_v2 vit-s16
    python bench/fp8_zoo.py --models resnet18 --dtypes fp32,int8,fp8,fp8-e5m2,fp8@mse --calib 8 --eval 8

A variant is ``DTYPE[-FORMAT][@METHOD]``: ``fp8`` (E4M3), ``fp8-e5m2``, ``int8``, and the calibration
method after ``@`` (minmax by default; percentile, mse, entropy). Every variant is built with the
compile driver (what ``qcompile M.onnx --dtype D --calib C`` runs; x86, the CLI's defaults:
per-channel weights, empirical bias correction where it helps) on the same ``--calib`` feeds
(``m.feeds(n, seed=0)``), and its *artifact* is run on the ``--eval`` feeds (seed 1, held back);
SQNR = 10 log10(Σ ref² / Σ (ref - ours)²) over every output element of every feed, ref = ONNX
Runtime fp32 on the model as given. For a quantized variant also: ``ref_db``, the reference
interpreter (:mod:`qcompiler.quant.reference`: exact float8 rounding, float64 sums rounded once) on
the compiled IR against the same fp32 outputs, and ``art_vs_ref_db``, the artifact against the
reference (inf: bit-identical; fp8 differs by the float32 rounding of the kernels' summation order,
carried on through the network). One JSON line per model on stdout (and the table at the end);
builds go to a temporary folder (``--keep DIR`` keeps them).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zoo  # noqa: E402
from zoo.harness import Build, options, save_calib  # noqa: E402
from zoo.loader import ort_run, sqnr_db  # noqa: E402

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vit-s16")


def variant(name: str) -> tuple[str, dict, dict]:
    """"fp8-e5m2@mse" -> ("fp8", {fp8_format: e5m2}, {method: mse}); "int8" -> ("int8", {}, {})."""
    base, _, method = name.partition("@")
    dtype, _, fmt = base.partition("-")
    return dtype, ({"fp8_format": fmt} if fmt else {}), ({"method": method} if method else {})


def measure(name: str, dtypes: list[str], n_calib: int, n_eval: int, out: Path) -> dict:
    from qcompiler.driver import compile
    from qcompiler.quant import reference
    m = zoo.get(name)
    calib, evals = m.feeds(n_calib, seed=0), m.feeds(n_eval, seed=1)
    refs = [ort_run(m.path(), m.ort_feeds(f)) for f in evals]
    flat = [o for r in refs for o in r]
    npz = save_calib(calib, out / f"{name}.calib.npz")
    row: dict = {"model": name, "calib": n_calib, "eval": n_eval}
    for d in dtypes:
        dtype, target, calib_opts = variant(d)
        t = time.perf_counter()
        src, opts = options(m, dtype, npz if dtype != "fp32" else None, **calib_opts)
        opts = dataclasses.replace(opts, target=dataclasses.replace(opts.target, **target))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = compile(src, out / f"{name}.{d}", opts)
        build_s = time.perf_counter() - t
        art = Build(out / f"{name}.{d}", build_s)
        got = [art(f) for f in evals]
        r = {"sqnr_db": round(float(sqnr_db(flat, [o for g in got for o in g])), 2),
             "model_so_bytes": (out / f"{name}.{d}" / "model.so").stat().st_size, "build_s": round(build_s, 1)}
        if dtype != "fp32":
            g = built.graph
            names = [v.name for v in g.inputs]
            ref = [reference.run(g, {k: f[k] for k in names}) for f in evals]
            r["ref_db"] = round(float(sqnr_db(flat, [o for y in ref for o in y])), 2)
            r["art_vs_ref_db"] = round(float(sqnr_db([o for y in ref for o in y], [o for y in got for o in y])), 1)
        row[d] = r
        print(json.dumps({"model": name, d: r}), file=sys.stderr, flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--dtypes", default="fp32,int8,fp8")
    p.add_argument("--calib", type=int, default=8)
    p.add_argument("--eval", type=int, default=8)
    p.add_argument("--keep", default=None, metavar="DIR", help="keep the artifacts in DIR")
    a = p.parse_args(argv)
    dtypes = a.dtypes.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        for name in a.models:
            rows.append(measure(name, dtypes, a.calib, a.eval, out))
            print(json.dumps(rows[-1]), flush=True)
    print("\nSQNR vs ONNX Runtime fp32, dB (quantized: artifact / reference interpreter / artifact vs reference), "
          "model.so KB")
    print(f"{'model':<14}" + "".join(f"{d:>30}{'KB':>8}" for d in dtypes))
    for r in rows:
        cells = []
        for d in dtypes:
            v = r[d]
            txt = f"{v['sqnr_db']:.2f}" + (f" / {v['ref_db']:.2f} / {v['art_vs_ref_db']:g}" if "ref_db" in v else "")
            cells.append(f"{txt:>30}{v['model_so_bytes'] / 1024:>8.0f}")
        print(f"{r['model']:<14}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
