"""Quantization-aware fine-tuning of models/fashion_mobilenet.onnx, exported as QDQ ONNX: the
project's own pre-quantized (QAT) model, for ``qcompile`` to build as it is (issue #35).

Dev-only (torch, which the compiler itself does not need):

    apt-get install -y dataset-fashion-mnist      # /usr/share/datasets/fashion-mnist/*.gz
    python models/qat_fashion_mobilenet.py        # -> models/fashion_mobilenet_qat.onnx

What it does:

1. rebuilds the float network of ``train_fashion_mobilenet.py`` with the weights of
   ``fashion_mobilenet.onnx`` (its initializers carry the PyTorch parameter names) and folds each
   BatchNorm into its conv (eval statistics: w' = w γ/σ, b' = β - μ γ/σ);
2. inserts fake quantization as an integer deployment computes (Jacob et al., *Quantization and
   Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference*, CVPR 2018):
   weights int8 symmetric per output channel (scale max|w|/127 of the current weights, range
   [-127, 127]); activations uint8 per tensor, asymmetric, with a moving-average min/max
   observer (momentum 0.01) at the input, after every conv (+ReLU6), after every residual add,
   after the global average pool and at the logits; biases stay float (the compiler stores them
   as int32 at s_x s_w);
3. fine-tunes on the 60k training images (AdamW, lr 1e-4 cosine to 0, label smoothing 0.05,
   random horizontal flips; gradients straight through the rounding, zero outside the range),
   observers frozen after the first epoch;
4. exports with the TorchScript exporter (opset 13): every fake quantization is a
   QuantizeLinear/DequantizeLinear pair, the weights' per-channel ones with axis 0;
5. reports the accuracy of the float model, of the fake-quantized torch model and of the QDQ
   ONNX in ONNX Runtime on the 10k test images and on the first 1,000 (``fashion_test.npz``).

Deterministic (seeds, deterministic kernels, 2 threads).
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from train_fashion_mobilenet import (FashionMobileNet, evaluate, load_split, ort_predict, preprocess,
                                     set_determinism)

HERE = Path(__file__).resolve().parent


class ActFQ(nn.Module):
    """uint8 per-tensor fake quantization with a moving-average min/max observer (range holds 0)."""

    def __init__(self, momentum: float = 0.01):
        super().__init__()
        self.momentum = momentum
        self.observe = True
        self.fixed: tuple[float, int] | None = None     # (scale, zero point) once frozen: constants in the export
        self.register_buffer("lo", torch.tensor(float("nan")))
        self.register_buffer("hi", torch.tensor(float("nan")))

    def qparams(self) -> tuple[float, int]:
        lo, hi = min(float(self.lo), 0.0), max(float(self.hi), 0.0)
        scale = max((hi - lo) / 255.0, 1e-8)
        zp = int(min(max(round(-lo / scale), 0), 255))
        return scale, zp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.observe:
            with torch.no_grad():
                lo, hi = x.min(), x.max()
                if torch.isnan(self.lo):
                    self.lo.copy_(lo)
                    self.hi.copy_(hi)
                else:
                    self.lo.mul_(1 - self.momentum).add_(self.momentum * lo)
                    self.hi.mul_(1 - self.momentum).add_(self.momentum * hi)
        scale, zp = self.fixed or self.qparams()
        return torch.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255)


class QConv(nn.Module):
    """Conv2d (BatchNorm folded in) with int8 symmetric per-channel fake-quantized weights."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d | None, relu6: bool):
        super().__init__()
        w = conv.weight.detach().clone()
        b = conv.bias.detach().clone() if conv.bias is not None else torch.zeros(w.shape[0])
        if bn is not None:
            g = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
            w = w * g[:, None, None, None]
            b = bn.bias.detach() + (b - bn.running_mean) * g
        self.weight, self.bias = nn.Parameter(w), nn.Parameter(b)
        self.stride, self.padding, self.groups = conv.stride, conv.padding, conv.groups
        self.relu6 = relu6
        self.out = ActFQ()
        self.w_scale: torch.Tensor | None = None        # frozen per-channel scales (constants in the export)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, fq_weight(self.weight, self.w_scale), self.bias, self.stride, self.padding, 1, self.groups)
        return self.out(F.relu6(y) if self.relu6 else y)


def weight_scale(w: torch.Tensor) -> torch.Tensor:
    return (w.detach().abs().reshape(w.shape[0], -1).amax(1) / 127.0).clamp_min(1e-8)


def fq_weight(w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """int8 symmetric per output channel: scale max|w[o]| / 127, so the values lie in [-127, 127]
    (the range given is the exporter's int8 one, [-128, 127]; -128 never occurs)."""
    scale = weight_scale(w) if scale is None else scale
    return torch.fake_quantize_per_channel_affine(w, scale, torch.zeros(w.shape[0], dtype=torch.int32), 0,
                                                  -128, 127)


class QBlock(nn.Module):
    def __init__(self, blk):
        super().__init__()
        s = blk.block
        self.expand = QConv(s[0][0], s[0][1], True)
        self.dw = QConv(s[1][0], s[1][1], True)
        self.project = QConv(s[2], s[3], False)
        self.residual = blk.use_residual
        self.add = ActFQ() if self.residual else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.dw(self.expand(x)))
        return self.add(x + y) if self.residual else y


class QATFashionMobileNet(nn.Module):
    def __init__(self, float_model: FashionMobileNet):
        super().__init__()
        f = float_model.features
        self.input = ActFQ()
        self.stem = QConv(f[0][0], f[0][1], True)
        self.blocks = nn.Sequential(*[QBlock(b) for b in f[1:-1]])
        self.head = QConv(f[-1][0], f[-1][1], True)
        self.pooled = ActFQ()
        fc = float_model.classifier
        self.fc_w, self.fc_b = nn.Parameter(fc.weight.detach().clone()), nn.Parameter(fc.bias.detach().clone())
        self.fc_scale: torch.Tensor | None = None
        self.logits = ActFQ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(self.input(x))))
        x = torch.flatten(self.pooled(F.adaptive_avg_pool2d(x, 1)), 1)
        return self.logits(F.linear(x, fq_weight(self.fc_w, self.fc_scale), self.fc_b))

    def freeze_observers(self) -> None:
        for m in self.modules():
            if isinstance(m, ActFQ):
                m.observe = False

    def freeze(self) -> None:
        """Every scale and zero point a Python constant: the exported Q/DQ take constant parameters."""
        self.freeze_observers()
        for m in self.modules():
            if isinstance(m, ActFQ):
                m.fixed = m.qparams()
            elif isinstance(m, QConv):
                m.w_scale = weight_scale(m.weight)
        self.fc_scale = weight_scale(self.fc_w)


def load_float(path: Path) -> FashionMobileNet:
    model = FashionMobileNet()
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(str(path)).graph.initializer}
    state = model.state_dict()
    missing = [k for k in state if k not in inits and not k.endswith("num_batches_tracked")]
    if missing:
        raise SystemExit(f"{path}: no initializer for {missing[:3]}")
    model.load_state_dict({k: inits.get(k, v) for k, v in state.items()})
    return model.eval()


def finetune(model: QATFashionMobileNet, x, y, epochs: int, batch: int, lr: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    steps = len(x) // batch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps)
    for ep in range(epochs):
        if ep == 1:
            model.freeze_observers()
        model.train()
        t0, tot = time.time(), 0.0
        perm = torch.randperm(len(x), generator=gen)
        flips = torch.rand(len(x), generator=gen) < 0.5
        for b in range(steps):
            idx = perm[b * batch:(b + 1) * batch]
            xb = torch.where(flips[idx][:, None, None, None], x[idx].flip(-1), x[idx])
            loss = F.cross_entropy(model(xb), y[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += loss.item()
        print(f"epoch {ep + 1}/{epochs}  loss {tot / steps:.4f}  {time.time() - t0:.1f}s", flush=True)
    model.freeze()
    model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "fashion_mobilenet_qat.onnx")
    args = ap.parse_args()
    set_determinism(args.seed, args.threads)
    t_start = time.time()
    xtr, ytr = load_split("train")
    xte, yte = load_split("t10k")
    xtr, xte = torch.from_numpy(preprocess(xtr)), torch.from_numpy(preprocess(xte))
    ytr, yte_t = torch.from_numpy(ytr), torch.from_numpy(yte)
    fm = load_float(HERE / "fashion_mobilenet.onnx")
    acc_float = evaluate(fm, xte, yte_t)
    model = QATFashionMobileNet(fm)
    finetune(model, xtr, ytr, args.epochs, args.batch_size, args.lr, args.seed)
    acc_fq = evaluate(model, xte, yte_t)
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    torch.onnx.export(model, (torch.zeros(1, 1, 28, 28),), str(args.out), dynamo=False, opset_version=13,
                      do_constant_folding=True, input_names=["input"], output_names=["logits"])
    pred = ort_predict(args.out, xte.numpy()).argmax(1)
    result = {"float_acc_10k": acc_float, "fake_quant_torch_acc_10k": acc_fq,
              "qdq_onnx_ort_acc_10k": float((pred == yte).mean()),
              "qdq_onnx_ort_acc_first1000": float((pred[:1000] == yte[:1000]).mean()),
              "onnx_bytes": args.out.stat().st_size, "wall_s": round(time.time() - t_start, 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
