"""``encode-sparse``: choose, per conv/gemm layer, dense or a sparse weight format.

For every conv/gemm with a constant weight (float or int8; run it after ``quantize`` to decide on the
int8 weights the artifact stores) the weight's gemm matrices ``[g, N, K]`` are measured (non-zeros,
non-zero 1x4/4x1 blocks, 2:4 compliance) and :func:`qcompiler.sparse.cost.choose` predicts, for each
format of :mod:`qcompiler.sparse.format`, the exact stored bytes and the time (AdaPT-style
``MACs x non-zero fraction x word length``, plus index bits, the target's vector padding and
per-kernel, per-row and per-output costs), with the factors of the layer's weight dtype (int8 or
fp32) on the options' target family (``CostModel.for_target``: x86 fitted to measurements, arm /
cuda assumed). ``M``, the
output columns of the im2col gemm, is the product of the result's shape without its channel axis
(batch x output pixels; batch for a gemm).

The pass changes no op (the sparse kernels that consume the choice are the codegen's business); it
records, for each layer, in ``graph.meta["sparsity"]["layers"][op_name]["encoding"]``::

    {"format": <chosen for the objective>, "objective": "time" | "size",
     "format_size": ..., "format_time": ..., "size": {fmt: bytes}, "time": {fmt: bit-MAC units},
     "code": {fmt: kernel code bytes the size objective adds},
     "m": M, "bits": 8 | 32, "dense_bytes": ..., "encoded_bytes": <bytes of "format">}

and, when ``graph.meta["sparsity"]`` holds no record for the layer yet (no ``prune`` ran), the
layer's sparsity statistics as ``prune`` would detect them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph
from ..ir import REGISTRY
from ..sparse.cost import CostModel, LayerShape, choose, shares_kernel
from ._common import pass_options
from .manager import PassContext, register_pass
from .prune import CONV_KINDS, layers, stats


@dataclass(frozen=True)
class EncodeSparseOptions:
    objective: str = "time"                  # "time": fastest predicted; "size": fewest bytes + kernel code
    target: str = "x86"                      # target family: which kernels' cost model decides
    model: CostModel | None = None           # None: CostModel.for_target(target)

    def __post_init__(self):
        if self.objective not in ("time", "size"):
            raise ValueError(f"encode-sparse: objective is 'time' or 'size', got '{self.objective}'")
        if self.target not in ("x86", "arm", "cuda"):
            raise ValueError(f"encode-sparse: target is 'x86', 'arm' or 'cuda', got '{self.target}'")

    @property
    def cost_model(self) -> CostModel:
        return self.model if self.model is not None else CostModel.for_target(self.target)


def output_columns(op) -> int:
    """M of the layer's im2col gemm: the result's elements per output channel."""
    shape = op.result.shape
    if op.kind in CONV_KINDS:
        return int(np.prod(shape)) // max(shape[1], 1)
    return int(np.prod(shape[:-1])) if shape else 1


def conv_kind(layer) -> tuple[bool, bool]:
    """(a conv, a conv whose im2col X is an expansion: kernel larger than 1x1, or padded)."""
    if layer.op.kind not in CONV_KINDS:
        return False, False
    kernel = tuple(layer.weight.type.shape[2:])
    return True, bool(int(np.prod(kernel)) > 1 or any(layer.op.attrs.get("pads") or ()))


def decide(graph: Graph, opts: EncodeSparseOptions = EncodeSparseOptions()) -> dict:
    """Measure and choose for every layer; returns (and stores) ``graph.meta["sparsity"]``."""
    rec = graph.meta.setdefault("sparsity", {"target": None, "pattern": None, "global": False, "layers": {}})
    model = opts.cost_model                  # per target; int8 or fp32 factors by the layer's weight bits
    for layer in layers(graph):
        mats = layer.matrices()
        s = LayerShape.of(mats, output_columns(layer.op), *conv_kind(layer))
        attrs = {**REGISTRY[layer.op.kind].defaults, **layer.op.attrs}
        shared = opts.objective == "size" and shares_kernel(layer.op.kind, attrs, layer.weight.type.shape,
                                                            layer.weight.dtype, opts.target)
        c = choose(s, model, shared)
        fmt = c.format_time if opts.objective == "time" else c.format_size
        row = rec["layers"].setdefault(layer.op.name, {})
        now = stats(layer)
        row.update({k: v for k, v in now.items() if k not in row or k in ("zeros", "sparsity", "nm_2_4",
                                                                             "zero_blocks_1x4", "kind")})
        row["encoding"] = {"format": fmt, "objective": opts.objective, **c.to_json(), "m": s.m, "bits": s.bits,
                           "dense_bytes": c.size["dense"], "encoded_bytes": c.size[fmt]}
    return rec


@register_pass("encode-sparse", options=EncodeSparseOptions)
def encode_sparse(graph: Graph, ctx: PassContext) -> bool:
    """Choose dense or CSR/BSR/2:4 per conv/gemm weight by the analytic cost model (records only)."""
    opts = pass_options(ctx, "encode-sparse", EncodeSparseOptions)
    rec = decide(graph, opts)
    chosen = [r["encoding"]["format"] for r in rec["layers"].values() if "encoding" in r]
    sparse = sum(f != "dense" for f in chosen)
    ctx.log(f"encode-sparse: {sparse} of {len(chosen)} layers sparse (objective {opts.objective})")
    return False
