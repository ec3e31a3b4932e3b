"""The main job on the bundled model, end to end (what `bash scripts/demo.sh` runs).

1. `qcompile inspect` the model with the default pass pipeline (op counts before -> after);
2. `qcompile` it for this x86 machine into out/fashion_mobilenet_x86/;
3. run the artifact with `qcompiler.load` on the bundled held-back Fashion-MNIST test images and
   compare with ONNX Runtime on the original model: largest difference and top-1 accuracy.
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


def qcompile(*args):
    cmd = [sys.executable, "-m", "qcompiler.cli", *args]
    print("$ qcompile " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main():
    dtype = sys.argv[1] if len(sys.argv) > 1 else "fp32"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    qcompile("inspect", MODEL, "--passes", "default", "--no-ir")
    t0 = time.perf_counter()
    qcompile(MODEL, "--target", "x86", "--dtype", dtype, "-o", OUT)
    print(f"compiled in {time.perf_counter() - t0:.1f} s")

    import onnxruntime as ort
    import qcompiler
    d = np.load(DATA)
    x, y = d["x"], d["y"]
    model = qcompiler.load(OUT)
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    ours, ref = [], []
    for i in range(len(x)):
        ours.append(model(x[i:i + 1])[0])
        ref.append(sess.run(None, {iname: x[i:i + 1]})[0])
    ours, ref = np.concatenate(ours), np.concatenate(ref)
    diff = float(np.abs(ours - ref).max() / np.abs(ref).max())
    acc_ours = float((ours.argmax(1) == y).mean() * 100)
    acc_ref = float((ref.argmax(1) == y).mean() * 100)
    print(f"{len(x)} held-back test images: max|diff|/max|ref| = {diff:.2e}; "
          f"top-1 accuracy qcompiler {dtype} {acc_ours:.2f}% vs ONNX Runtime fp32 {acc_ref:.2f}%")


if __name__ == "__main__":
    main()
