"""The main job on the bundled model, end to end (what `bash scripts/demo.sh` runs).

fp32 (`python examples/demo.py fp32`):
1. `qcompile inspect` the model with the default pass pipeline (op counts before -> after);
2. `qcompile` it for this x86 machine into out/fashion_mobilenet_x86/;
3. run the artifact with `qcompiler.load` on the bundled held-back Fashion-MNIST test images and
   compare with ONNX Runtime on the original model: largest difference and top-1 accuracy.

int8 (`python examples/demo.py int8`):
4. `qcompile --dtype int8 --debug-layers` calibrating on the first 256 bundled test images (the
   build report's table is printed; out/fashion_mobilenet_x86_int8/ holds report.json and
   report.html; --debug-layers adds what step 6 needs);
5. top-1 accuracy of the int8 artifact on the other 744 images beside fp32 ONNX Runtime;
6. `qcompile verify`: the int8 artifact against its QDQ export in ONNX Runtime, layer by layer in LSB.

With no argument both run.
"""
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(ROOT, "models", "fashion_mobilenet.onnx")
DATA = os.path.join(ROOT, "models", "fashion_test.npz")
OUT = os.path.join(ROOT, "out", "fashion_mobilenet_x86")
CALIB = 256


def qcompile(*args):
    cmd = [sys.executable, "-m", "qcompiler.cli", *args]
    print("$ qcompile " + " ".join(os.path.relpath(a, ROOT) if os.path.isabs(a) else a for a in args),
          flush=True)
    subprocess.run(cmd, check=True)


def run_all(out, x):
    """Logits of the artifact in ``out`` and of ONNX Runtime on the original model, per sample."""
    import onnxruntime as ort
    import qcompiler
    model = qcompiler.load(out)
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    ours = np.concatenate([model(x[i:i + 1])[0] for i in range(len(x))])
    ref = np.concatenate([sess.run(None, {iname: x[i:i + 1]})[0] for i in range(len(x))])
    return ours, ref


def accuracy(logits, y):
    return float((logits.argmax(1) == y).mean() * 100)


def fp32(x, y):
    qcompile("inspect", MODEL, "--passes", "default", "--no-ir")
    t0 = time.perf_counter()
    qcompile(MODEL, "--target", "x86", "--dtype", "fp32", "-o", OUT)
    print(f"compiled in {time.perf_counter() - t0:.1f} s")
    ours, ref = run_all(OUT, x)
    diff = float(np.abs(ours - ref).max() / np.abs(ref).max())
    print(f"{len(x)} held-back test images: max|diff|/max|ref| = {diff:.2e}; "
          f"top-1 accuracy qcompiler fp32 {accuracy(ours, y):.2f}% vs ONNX Runtime fp32 {accuracy(ref, y):.2f}%")


def int8(x, y):
    out = OUT + "_int8"
    t0 = time.perf_counter()
    qcompile(MODEL, "--target", "x86", "--dtype", "int8", "--calib", DATA, "--calib-samples", str(CALIB),
             "--debug-layers", "-o", out)
    print(f"compiled in {time.perf_counter() - t0:.1f} s")
    held = os.path.join(ROOT, "out", "fashion_heldback.npy")
    np.save(held, x[CALIB:])
    ours, ref = run_all(out, x[CALIB:])
    print(f"{len(x) - CALIB} images not used for calibration: top-1 accuracy qcompiler int8 "
          f"{accuracy(ours, y[CALIB:]):.2f}% vs ONNX Runtime fp32 {accuracy(ref, y[CALIB:]):.2f}%")
    qcompile("verify", out, "--data", held)


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what not in ("fp32", "int8", "all"):
        sys.exit("usage: python examples/demo.py [fp32|int8|all]")
    os.makedirs(os.path.join(ROOT, "out"), exist_ok=True)
    d = np.load(DATA)
    x, y = d["x"], d["y"]
    if what in ("fp32", "all"):
        fp32(x, y)
    if what in ("int8", "all"):
        int8(x, y)


if __name__ == "__main__":
    main()
