"""A user-written pass: HardSigmoid(x; alpha, beta) -> Clip(alpha*x + beta, 0, 1).

    qcompile model.onnx --plugin examples/custom_pass.py --passes hardsigmoid-to-clip,default

HardSigmoid is defined as max(0, min(1, alpha*x + beta)), so the two forms compute the same values
(to float rounding of the product); a target without a HardSigmoid kernel can run the Clip form.
"""
import numpy as np

from qcompiler.passes import register_pass
from qcompiler.passes.rewrite import Any, Op, rewrite


def hardsigmoid_to_clip(graph, match):
    hs, x = match["hs"], match["x"]
    alpha = graph.add_const(np.array(hs.attrs.get("alpha", 0.2), x.dtype), "alpha")
    beta = graph.add_const(np.array(hs.attrs.get("beta", 0.5), x.dtype), "beta")
    scaled = graph.create_op("Mul", [x, alpha], before=hs).result
    shifted = graph.create_op("Add", [scaled, beta], before=hs).result
    return graph.create_op("Clip", [shifted], {"min": 0.0, "max": 1.0}, before=hs).result


@register_pass("hardsigmoid-to-clip")
def hardsigmoid_to_clip_pass(graph, ctx):
    """HardSigmoid(x; alpha, beta) -> Clip(alpha*x + beta, 0, 1) as Mul, Add and Clip ops."""
    return rewrite(graph, [(Op("HardSigmoid", Any("x"), name="hs"), hardsigmoid_to_clip)])
