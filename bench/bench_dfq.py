"""Data-free quantization benchmark: per-tensor int8 weights without / with cross-layer equalization and
bias correction, beside per-channel int8 and onnxruntime's own ``quantize_static`` (QDQ, per-channel
int8 weights, uint8 activations, MinMax) on the same calibration data.

    .venv/bin/python bench/bench_dfq.py [--models fashion_mobilenet,rapidocr-cls] [--json OUT.json]

Each row is a ``qcompile --dtype int8`` recipe (the same passes and quantize options the CLI flags
select, via :func:`qcompiler.plan.dfq.dfq_recipe`), run by the reference interpreter (the integer
oracle the compiled kernels match bit for bit); fp32 is the float graph after the default passes.

* fashion_mobilenet (MobileNetV2-style, ReLU6): calibrate on the first 500 images of
  models/fashion_test.npz, evaluate on the other 500 (real labelled Fashion-MNIST): output SQNR vs fp32
  and top-1 accuracy.
* rapidocr-cls (PaddleOCR's MobileNetV3-style direction classifier: HardSwish, squeeze-excite): no
  labelled data exists offline, so 32 synthetic text lines calibrate and 128 others evaluate
  (tests/realmodels.py ``rapidocr_text_lines``, half upside down): output (softmax) SQNR vs fp32 and
  top-1 agreement with fp32.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import realmodels  # noqa: E402

from qcompiler.passes import PassContext, PassManager, run_passes  # noqa: E402
from qcompiler.passes.quantize import QuantizeOptions  # noqa: E402
from qcompiler.quant import reference, sqnr_db  # noqa: E402
from qcompiler.plan.dfq import dfq_recipe  # noqa: E402

# (label, per_channel, equalize, bias_correction): what the CLI flags select
RECIPES = [
    ("per-tensor", False, False, "none"),
    ("per-tensor, empirical bias corr.", False, False, "empirical"),
    ("per-tensor, equalize", False, True, "none"),
    ("per-tensor, equalize, analytic bias corr.", False, True, "analytic"),
    ("per-tensor, equalize, empirical bias corr.", False, True, "empirical"),
    ("per-channel, empirical bias corr. (default)", True, False, "empirical"),
    ("per-channel, equalize, empirical bias corr.", True, True, "empirical"),
]
BASELINE = "per-tensor"
DFQ = "per-tensor, equalize, analytic bias corr."


@dataclass
class Case:
    name: str
    model: object                 # path or ModelProto
    calib: np.ndarray
    test: np.ndarray
    labels: np.ndarray | None
    batch: int


def fashion_case() -> Case | None:
    p, data = realmodels.MODELS_DIR / "fashion_mobilenet.onnx", realmodels.fashion_test()
    if not p.exists() or data is None:
        return None
    x, y = data
    return Case("fashion_mobilenet", str(p), x[:500], x[500:1000], y[500:1000], batch=250)


def ocr_cls_case(n_calib: int = 32, n_test: int = 128) -> Case | None:
    m = [m for m in realmodels.rapidocr_models() if m.name == "rapidocr-cls"]
    if not m:
        return None
    shape = m[0].input_shapes["x"]
    return Case("rapidocr-cls", m[0].load(), realmodels.rapidocr_text_lines(n_calib, shape, start=1000),
                realmodels.rapidocr_text_lines(n_test, shape, start=2000), None, batch=16)


CASES = {"fashion_mobilenet": fashion_case, "rapidocr-cls": ocr_cls_case}


def run_graph(g, name: str, xs: np.ndarray, batch: int) -> np.ndarray:
    outs = [reference.run(g, {name: xs[s:s + batch]})[0] for s in range(0, len(xs), batch)]
    return np.concatenate(outs)


def int8_graph(g0, name: str, case: Case, per_channel: bool, equalize: bool, bias: str):
    """The int8 graph ``qcompile --dtype int8 [--per-tensor] [--equalize] --bias-correction B`` makes."""
    g = g0.clone()
    calib = [{name: case.calib[s:s + case.batch]} for s in range(0, len(case.calib), case.batch)]
    passes, keep_bc = dfq_recipe(["quantize"], equalize=equalize, bias_correction=bias)
    ctx = PassContext(options={"quantize": QuantizeOptions(calib=calib, per_channel=per_channel,
                                                           bias_correction=keep_bc)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PassManager(passes, ctx=ctx).run(g)
    return g


def ort_static(g0, name: str, case: Case) -> np.ndarray:
    """onnxruntime.quantization.quantize_static (QDQ, per-channel, MinMax) of the same float graph."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    import onnx

    from qcompiler.frontend.onnx_export import export_onnx
    from qcompiler.passes.expand_fused import expand_fused
    g = g0.clone()
    expand_fused(g)
    feeds = iter([{name: case.calib[s:s + case.batch]} for s in range(0, len(case.calib), case.batch)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save(export_onnx(g), src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
        sess = realmodels.ort_session(str(dst))
        return np.concatenate([sess.run(None, {name: case.test[s:s + case.batch]})[0]
                               for s in range(0, len(case.test), case.batch)])


def _row(fp32, out, labels):
    top = lambda y: y.reshape(len(y), -1).argmax(axis=1)          # noqa: E731
    row = {"sqnr_db": sqnr_db(fp32, out), "agreement": 100 * float(np.mean(top(fp32) == top(out)))}
    if labels is not None:
        row["top1"] = 100 * float(np.mean(top(out) == labels))
    return row


def measure(case: Case, recipes=RECIPES, ort: bool = True) -> dict:
    """{label: {sqnr_db, agreement[, top1]}} plus "fp32" (top1 with labels) and "ort" rows."""
    g0, name = realmodels.import_batched(case.model, (1, *case.test.shape[1:]), case.batch)
    run_passes(g0)
    fp32 = run_graph(g0, name, case.test, case.batch)
    res = {"fp32": {"top1": 100 * float(np.mean(fp32.argmax(1) == case.labels)) if case.labels is not None
                    else None}}
    for label, pc, eq, bias in recipes:
        t = time.perf_counter()
        g = int8_graph(g0, name, case, pc, eq, bias)
        res[label] = {**_row(fp32, run_graph(g, name, case.test, case.batch), case.labels),
                      "seconds": time.perf_counter() - t}
    if ort:
        res["onnxruntime quantize_static (per-channel)"] = _row(fp32, ort_static(g0, name, case), case.labels)
    return res


def print_table(name: str, res: dict) -> None:
    fp = res["fp32"]["top1"]
    print(f"\n{name}" + (f"  (fp32 top-1 {fp:.1f}%)" if fp is not None else "  (no labels: agreement with fp32)"))
    print(f"  {'recipe':<46}{'SQNR dB':>9}{'agree %':>9}" + (f"{'top-1 %':>9}" if fp is not None else ""))
    for label, r in res.items():
        if label == "fp32":
            continue
        print(f"  {label:<46}{r['sqnr_db']:>9.2f}{r['agreement']:>9.1f}" + (f"{r['top1']:>9.1f}" if "top1" in r else ""))
    if BASELINE in res and DFQ in res:
        print(f"  DFQ gain ({DFQ} vs {BASELINE}): {res[DFQ]['sqnr_db'] - res[BASELINE]['sqnr_db']:+.2f} dB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime's quantize_static")
    args = ap.parse_args(argv)
    out = {}
    for name in args.models.split(","):
        case = CASES[name]()
        if case is None:
            print(f"{name}: model or data not installed; skipped")
            continue
        out[name] = measure(case, ort=not args.no_ort)
        print_table(name, out[name])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
