"""``relu6-to-relu``: replace ReLU6 = Clip(x, 0, 6) by ReLU (off by default; changes results).

``min(max(x, 0), 6)`` and ``max(x, 0)`` differ exactly where x > 6, so this pass is *not* an
identity: it removes the upper clamp that MobileNetV2-style networks (Sandler et al., 2018) were
trained with. Why one would: an unbounded ReLU is cheaper on some targets and lets fuse-act and
the kernel library use a plain ReLU epilogue; the clamp at 6 is also redundant after int8
quantization with an output range ⊆ [0, 6]. Why it is off by default: activations above 6 now pass
through, and the layers after them were trained never to see such values.

Measured on ``models/fashion_mobilenet.onnx`` (MobileNetV2-style, 16 ReLU6, trained by
``models/train_fashion_mobilenet.py``), default pipeline then this pass, onnxruntime, top-1:

* ``models/fashion_test.npz`` (1,000 test images): ReLU6 94.2%, ReLU 94.4%; the two give the same
  class on 99.8% of the images;
* the full Fashion-MNIST test split (10,000 images, ``dataset-fashion-mnist``): ReLU6 92.34%,
  ReLU 92.39%; same class on 99.71% (29 of 10,000 predictions change).

So on this network the effect is within noise (+0.05 points on 10k); a network whose activations
often exceed 6 could lose more, so measure before using it. ``tests/passes/test_relu6_to_relu.py``
re-measures the first row.

Rewrites ``Clip(x) {min = 0, max = 6}`` to ``Relu(x)`` and FusedConv/FusedGemm with activation
Clip [0, 6] to activation Relu.

Before::

    graph @g(%x: tensor<4xf32>) {
      %y = Clip(%x) {max = 6.0, min = 0.0} : tensor<4xf32>
      return %y
    }

After::

    graph @g(%x: tensor<4xf32>) {
      %y = Relu(%x) : tensor<4xf32>
      return %y
    }
"""
from __future__ import annotations

from ..ir.activations import activation_of
from ..ir.graph import Graph
from .manager import PassContext, register_pass
from .rewrite import Any, Op, rewrite

RELU6 = ("Clip", [0.0, 6.0])


def _clip_to_relu(g: Graph, m):
    if activation_of(m.root) != RELU6:
        return None
    return g.create_op("Relu", [m["x"]], before=m.root, name=m.root.name + "_relu").result


@register_pass("relu6-to-relu")
def relu6_to_relu(graph: Graph, ctx: PassContext) -> bool:
    """Clip(0, 6) -> Relu, also as a FusedConv/FusedGemm activation (changes results above 6)."""
    changed = rewrite(graph, [(Op("Clip", Any("x")), _clip_to_relu)])
    for op in graph.ops:
        if op.kind in ("FusedConv", "FusedGemm") and \
                (op.attrs.get("activation"), list(op.attrs.get("activation_params", []))) == RELU6:
            op.attrs["activation"], op.attrs["activation_params"] = "Relu", []
            changed = True
    return changed
