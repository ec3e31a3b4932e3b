"""``prune-reconstruct``: one-shot pruning that repairs each layer from calibration data (SparseGPT:
Frantar & Alistarh 2023, *SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot*,
Algorithm 1; the OBS/OBC saliency ``w²/[H⁻¹]_jj`` and update; the math in
:mod:`qcompiler.sparse.reconstruct`).

Layer by layer, in graph order, each conv/gemm/matmul with a constant float weight that
:mod:`qcompiler.passes.prune` would prune (same patterns ``unstructured`` / ``N:M`` / ``block4``,
same skips: depthwise convs and ``skip`` names or kinds, same exact counts) is pruned and its
remaining weights re-fitted to reproduce its outputs on the calibration samples::

    H = Σ_rows x xᵀ            x: a row of the layer's input (a conv: an im2col patch, stride,
                               padding, dilation and groups as the conv reads them; per group)
    Ŵ = SparseGPT(W, H + λI)   λ = damp · mean diag H

Sequential, as SparseGPT is: a layer's inputs are computed with every earlier layer already pruned
(the ops between two layers run once, on onnxruntime, as a graph of their own:
:func:`~qcompiler.quant.calibrate.float_runner`; the reference interpreter where onnxruntime
cannot), so each layer also repairs the error the layers before it left: with ``match_dense``
(the default) its target is the unpruned model's output of the layer on the unpruned model's
inputs, ``Ŵ x ≈ W x_dense`` (the products ``P = Σ (W x_dense) xᵀ`` beside ``H``), not its own
output on the pruned inputs (SparseGPT's; on fashion_mobilenet at 50 % that costs 28 points of
accuracy instead of 1, ``bench/prune_accuracy.py --no-match-dense``). Convs with more input
rows than ``rows_per_column · K`` (at least ``min_rows``) use that many rows drawn uniformly at
random (seeded) over samples and positions: a ResNet-50 3x3 conv of the first stage has 800 k rows
for K = 576 over 256 samples, where the Gram matrix converges long before (SparseGPT's own OPT
runs have 5-20 rows per column); ``rows_per_column=None`` takes them all.

Run it on the float graph after BatchNorm folding and activation fusion and before ``quantize``
(the ``--sparsity`` pipeline slot: quantization then sees the repaired weights). It records
``graph.meta["sparsity"]`` as ``prune`` does (``"method": "obc"``, and per pruned layer
``"reconstruction": {"rows", "rows_total", "loss"}``: the rows its Gram matrix summed and
``(W − Ŵ)(H+λI)(W − Ŵ)ᵀ / tr(W H Wᵀ)``, the relative output error the layer alone adds) and keeps
the unpruned graph in ``ctx.data["prune.dense_graph"]`` for the report.

Before/after (``PruneReconstructOptions(prune=PruneOptions(sparsity=0.5))``)::

    %y = Gemm(%x, %w: [2, 4], %b: [2]) {alpha = 2.0, beta = 0.5, transB = 1}
    %y = Gemm(%x, %w_pruned: [2, 4], 4 of its 8 weights 0, the others re-fitted, %b_pruned: [2], re-fitted)
             {alpha = 2.0, beta = 1.0, transB = 1}       (tests/passes/test_prune_reconstruct.py, as IR text)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Op
from ..ir.ops import full_attrs
from ..quant.gram import BLOCK, DAMP, Gram, conv_rows, gemm_rows
from ..sparse.reconstruct import Pattern, reconstruct
from ._common import pass_options, quantize_calib
from .equalize import bias_of, set_weights
from .manager import PassContext, register_pass
from .prune import CONV_KINDS, Layer, PruneOptions, chosen_layers, record, stats, summarize


SIGNAL_ROWS = 64         # the recorded relative loss is measured on the first rows of each group
BIASED = ("Conv", "FusedConv", "Gemm", "FusedGemm")       # the layers whose bias is re-fitted with the weights
GEMMS = ("Gemm", "FusedGemm")


@dataclass(frozen=True)
class PruneReconstructOptions:
    prune: PruneOptions = field(default_factory=lambda: PruneOptions(sparsity=0.5))   # what to prune
    calib: Any = None                    # feeds (Dataset or list of dicts); None: the quantize options'
    damp: float = DAMP                   # λ = damp · mean diag H
    block: int = BLOCK                   # lazy-batch and mask-selection block (columns)
    rows_per_column: int | None = 16     # conv rows of a Gram matrix at most this · K (None: all)
    min_rows: int = 16384                # ... but never fewer than this (or all there are)
    bias: bool = True                    # re-fit the bias too (Conv/Gemm): one more input, constant 1
    match_dense: bool = True             # fit the unpruned model's layer outputs (else its own: SparseGPT)
    seed: int = 0

    def __post_init__(self):
        if self.prune.sparsity is None:
            raise ValueError("prune-reconstruct: PruneOptions.sparsity must be set (detection is the prune pass's)")
        if self.prune.global_:
            raise UserError("--sparsity-global ranks magnitudes across layers; reconstruction prunes each layer "
                            "to its own target", "--sparsity-global",
                            "drop --sparsity-global, or use --prune-method magnitude")


# ---- the calibration values at a point of the graph -------------------------------------------------
def span_graph(graph: Graph, ops: list[Op], outputs: list[str]) -> Graph:
    """The ops as a graph of their own: inputs are the values they read from before them."""
    g = Graph(graph.name + "_span")
    g.meta = {k: v for k, v in graph.meta.items() if k == "opset"}
    vals: dict[str, Any] = {}
    for op in ops:
        for v in op.operands:
            if v.name not in vals:
                vals[v.name] = g.add_const(v.data, v.name, quant=v.type.quant) if v.is_const \
                    else g.add_input(v.name, v.type)
        new = g.create_op(op.kind, [vals[v.name] for v in op.operands], dict(op.attrs),
                          result_types=[r.type for r in op.results], name=op.name,
                          result_names=[r.name for r in op.results])
        vals.update({r.name: nr for r, nr in zip(op.results, new.results)})
    g.outputs = [vals[n] for n in outputs]
    return g


class Frontier:
    """The calibration samples' values (all samples stacked) where the graph's ops up to ``pos``
    have run: :meth:`input_of` runs the ops before a layer (each op once, with the weights as they
    are now, i.e. the earlier layers pruned) and keeps only the values later ops read."""

    def __init__(self, graph: Graph, calib):
        self.graph, self.ops = graph, graph.ops
        self.at = {op: i for i, op in enumerate(self.ops)}
        self.last: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            for v in op.operands:
                if not v.is_const:
                    self.last[v.name] = i
        feeds = list(calib)
        if not feeds:
            raise ValueError("prune-reconstruct: the calibration data holds no feeds")
        self.env = {v.name: np.concatenate([np.asarray(f[v.name]) for f in feeds])
                    for v in graph.inputs if v.name in self.last}
        self.samples = len(next(iter(self.env.values()))) if self.env else 0
        self.pos, self.seconds = 0, 0.0

    def input_of(self, op: Op) -> np.ndarray:
        end = self.at[op]
        span = self.ops[self.pos:end]
        if span:
            t0 = time.perf_counter()
            want = [r.name for o in span for r in o.results if self.last.get(r.name, -1) >= end]
            sub = span_graph(self.graph, span, want)
            self.env.update(_run(sub, {v.name: self.env[v.name] for v in sub.inputs}, want))
            self.seconds += time.perf_counter() - t0
        self.pos = end
        self.env = {k: a for k, a in self.env.items() if self.last.get(k, -1) >= end}
        return self.env[op.operands[0].name]


BATCH_FREE = {"Conv", "FusedConv", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
              "Add", "Sub", "Mul", "Div", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
              "BatchNormalization", "Identity", "MatMul", "PRelu", "Erf", "Gelu"}
SPAN_BATCH = 64          # samples per onnxruntime call where a span computes each sample on its own


def batch_free(sub: Graph) -> bool:
    """Whether every op of ``sub`` computes each sample (leading index) on its own, so the span runs
    on several samples per call although its types say one."""
    b = {v.shape[0] if v.shape else None for v in sub.inputs}
    if len(b) != 1 or None in b:
        return False
    for op in sub.ops:
        if any(not v.is_const and (not v.shape or v.shape[0] not in b) for v in (*op.operands, *op.results)):
            return False
        a, rank = op.attrs, len(op.result.shape)
        ok = (op.kind in BATCH_FREE or op.kind == "Flatten" and (a.get("axis", 1) or 0) % rank != 0
              or op.kind in ("Gemm", "FusedGemm") and not a.get("transA", 0)
              or op.kind == "Concat" and a.get("axis", 0) % rank != 0)
        if not ok:
            return False
    return True


def _run(sub: Graph, feed: dict[str, np.ndarray], want: list[str]) -> dict[str, np.ndarray]:
    """``want`` of ``sub`` on ``feed`` (every sample): onnxruntime (:data:`SPAN_BATCH` samples per call
    where :func:`batch_free`, else one model batch), else the reference interpreter."""
    from ..frontend.onnx_export import export_onnx
    from ..quant.calibrate import float_runner
    try:
        if batch_free(sub):
            model = export_onnx(sub)
            for v in (*model.graph.input, *model.graph.output):
                v.type.tensor_type.shape.dim[0].dim_param = "batch"
            del model.graph.value_info[:]
            run, step = float_runner(model, want, floats_only=False), SPAN_BATCH
        else:
            run, step = float_runner(sub, want, floats_only=False), None
    except Exception:  # noqa: BLE001 - a span ONNX cannot hold or onnxruntime cannot run: the reference
        from ..quant import reference
        vals = reference.run_values(sub, feed)
        return {k: vals[k] for k in want}
    n = len(next(iter(feed.values())))
    parts = [run({k: a[s:s + step] for k, a in feed.items()}) for s in range(0, n, step)] if step else [run(feed)]
    return {k: parts[0][k] if len(parts) == 1 else np.concatenate([p[k] for p in parts]) for k in want}


# ---- one layer ----------------------------------------------------------------------------------------
def layer_rows(layer: Layer, xs: list[np.ndarray], opts: PruneReconstructOptions, rng) -> tuple[Any, int, int]:
    """(iterator of tuples of row chunks [g, r, K], one per input of ``xs``, the same samples and
    positions in each; rows used; rows there are) of the layer's inputs ``xs``."""
    op = layer.op
    if op.kind not in CONV_KINDS:
        if op.attrs.get("transA", 0):            # per sample A is [K, M]; the samples are stacked on K
            kk, m = op.operands[0].shape
            xs = [x.reshape(-1, kk, m).transpose(0, 2, 1) for x in xs]
        rows = [gemm_rows(x) for x in xs]
        return iter([tuple(rows)]), rows[0].shape[1], rows[0].shape[1]
    attrs = full_attrs(op.kind, **op.attrs)
    spatial, kernel = tuple(op.result.shape[2:]), layer.weight.shape[2:]
    per, n = int(np.prod(spatial)), len(xs[0])
    total = n * per
    cap = total if opts.rows_per_column is None else max(opts.rows_per_column * int(np.prod(layer.weight.shape[1:])),
                                                          opts.min_rows)
    pick = np.sort(rng.choice(total, cap, replace=False)) if cap < total else None
    step = max(1, (1 << 22) // max(per * int(xs[0].shape[1]) * int(np.prod(kernel)), 1))   # ~16 MB of rows

    def chunks():
        for s in range(0, n, step):
            sub = None
            if pick is not None:
                lo, hi = np.searchsorted(pick, [s * per, (s + step) * per])
                if hi == lo:
                    continue
                sub = pick[lo:hi] - s * per
            yield tuple(conv_rows(x[s:s + step], kernel, attrs, spatial, layer.group, sub) for x in xs)
    return chunks(), min(cap, total), total


def prune_layer(graph: Graph, layer: Layer, x: np.ndarray, x_dense: np.ndarray | None, pattern: Pattern,
                opts: PruneReconstructOptions, rng) -> dict:
    """Gram matrix of ``x`` (and, with the unpruned model's inputs ``x_dense``, the products of the
    unpruned layer's outputs on them with ``x``), SparseGPT, the pruned weight (and re-fitted bias)
    stored; returns the layer's record."""
    op = layer.op
    w = layer.matrices()
    g, n, k = w.shape
    biased = opts.bias and op.kind in BIASED
    wb = w.astype(np.float64)
    if biased:                   # the bias: one more input, constant 1, last and kept (it compensates too)
        alpha = float(full_attrs(op.kind, **op.attrs).get("alpha", 1.0)) if op.kind in GEMMS else 1.0
        wb = np.concatenate([wb, (bias_of(op) / alpha).reshape(g, n, 1)], axis=2)
    chunks, used, total = layer_rows(layer, [x] if x_dense is None else [x, x_dense], opts, rng)
    gram = Gram(g, k, outputs=n if x_dense is not None else None)
    w32, b32 = wb[:, :, :k].transpose(0, 2, 1).astype(np.float32), wb[:, None, :, k].astype(np.float32) \
        if biased else None
    t0 = time.perf_counter()
    for rows in chunks:
        if x_dense is None:
            gram.add(rows[0])
        else:                    # the unpruned layer's outputs (bias included) on the unpruned inputs
            y = np.matmul(np.asarray(rows[1], np.float32), w32)
            gram.add(rows[0], y + b32 if biased else y)
    t1 = time.perf_counter()
    h = gram.with_ones() if biased else gram.h
    target = gram.targets(ones=biased) if x_dense is not None else None
    w_hat, _, loss = reconstruct(wb, h, pattern, block=opts.block, damp=opts.damp, fixed=int(biased),
                                 target=target)
    few = wb[:, :SIGNAL_ROWS]             # tr(W H Wᵀ) on a few rows: N·K² would double the cost
    signal = float(((few @ h) * few).sum())
    layer.store(graph, w_hat[:, :, :k].astype(w.dtype))
    if biased:
        set_weights(graph, op, b=alpha * w_hat[:, :, k].reshape(-1), suffix="_pruned")
    return {"rows": int(used), "rows_total": int(total),
            "loss": round(float(loss[:, :SIGNAL_ROWS].sum()) / max(signal, 1e-30), 6),
            "gram_s": t1 - t0, "solve_s": time.perf_counter() - t1}


@register_pass("prune-reconstruct", options=PruneReconstructOptions)
def prune_reconstruct(graph: Graph, ctx: PassContext) -> bool:
    """Prune conv/gemm weights and re-fit the rest on calibration data, layer by layer (SparseGPT)."""
    opts = pass_options(ctx, "prune-reconstruct", PruneReconstructOptions)
    calib = opts.calib if opts.calib is not None else quantize_calib(ctx)
    if calib is None:
        raise ValueError("prune-reconstruct needs calibration feeds (PruneReconstructOptions.calib or the "
                         "quantize options' calib)")
    po = opts.prune
    chosen = chosen_layers(graph, po)
    quantized = [l.op.name for l, why in chosen if why is None and l.scale is not None]
    if quantized:
        raise UserError(f"layer {quantized[0]} is already quantized; reconstruction re-fits float weights",
                        "--prune-method", "prune before quantization (qcompile does), or use --prune-method magnitude")
    ctx.data["prune.dense_graph"] = graph.clone()
    pattern = Pattern.of(po.pattern, po.sparsity)
    before = {id(l): stats(l) for l, _ in chosen}
    todo = [l for l, why in chosen if why is None]
    t0 = time.perf_counter()
    frontier = Frontier(graph, calib)
    dense = Frontier(ctx.data["prune.dense_graph"], calib) if opts.match_dense else None
    rng = np.random.default_rng(opts.seed)
    done = {}
    for l in todo:
        x_dense = dense.input_of(dense.ops[frontier.at[l.op]]) if dense is not None else None
        done[id(l)] = prune_layer(graph, l, frontier.input_of(l.op), x_dense, pattern, opts, rng)
    if todo:
        graph.remove_unused_consts()
    rec = record(chosen, before, set(done), po)
    rec["method"] = "obc"
    for l in todo:
        r = done[id(l)]
        rec["layers"][l.op.name]["reconstruction"] = {k: r[k] for k in ("rows", "rows_total", "loss")}
    graph.meta["sparsity"] = rec
    s = summarize(rec)
    gram_s, solve_s = sum(r["gram_s"] for r in done.values()), sum(r["solve_s"] for r in done.values())
    ctx.log(f"prune-reconstruct: pruned {s['pruned_layers']} of {s['layers']} layers ({po.pattern}, "
            f"{frontier.samples} samples); {s['zeros']:,} of {s['params']:,} weights are zero "
            f"({100 * s['sparsity']:.1f} %); {time.perf_counter() - t0:.1f} s (layer inputs "
            f"{frontier.seconds + (dense.seconds if dense else 0):.1f} s, "
            f"Gram matrices {gram_s:.1f} s, SparseGPT {solve_s:.1f} s)")
    return bool(todo)
