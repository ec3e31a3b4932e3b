"""``smooth-quant``: move activation outliers into the weights before static int8 quantization
(Xiao et al., *SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language
Models*, ICML 2023).

A transformer's LayerNorm outputs carry a few channels 10-100x larger than the rest, the same
channels on every token. One per-tensor activation scale must cover them, and the other channels
are left with a handful of integer levels. A linear layer is unchanged when its input channel j
is divided by s_j and its weight row j multiplied by it::

    Y = X W = (X diag(s)^-1) (diag(s) W),      s_j = max|X_j|^α / max|W_j|^(1-α)

which flattens the activation's channels (α = 1 moves all of the difficulty into the weights,
α = 0 none of it; the paper uses 0.5 for most models). max|X_j| is observed on the calibration
data; max|W_j| is taken over every linear layer that reads X (a transformer's Q, K and V
projections share one s). Where X is the output of a LayerNormalization with constant γ, β and
no other reader, ``diag(s)^-1`` is folded into γ and β (free); elsewhere (BERT's post-LN blocks,
whose LayerNorm output also feeds the residual; the GELU output that feeds FC2) it is a ``Mul`` by
1/s on the path to the linear layers, which the quantize pass then quantizes after.

α per group: given (``alpha``), or chosen from ``alphas`` (and "no smoothing") by the error the
int8 quantization would make on the calibration data, with the quantize pass's schemes and
:mod:`qcompiler.quant.qparams` (activation per tensor over the observed range of X/s, asymmetric
uint8 unless the quantize options say int8/symmetric; weights symmetric int8 per output channel,
or per tensor)::

    err(α) = Σ_layers ||X W - Q(X/s) Q(sW)||² / ||X W||²      over sampled rows of X

A group where no α beats no smoothing is left alone. ``graph.meta["smooth_quant"]`` records per
smoothed value the α, where 1/s went (``layernorm`` or ``mul``), the layers, and err before/after.

Before (x's channel 1 is 100x channel 0)::

    %y = MatMul(%x, %w) : tensor<1x4x2xf32>

After (α = 0.5)::

    %x_smooth = Mul(%x, %inv_s) : tensor<1x4x2xf32>
    %y = MatMul(%x_smooth, %w_smooth) : tensor<1x4x2xf32>
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Op, Value
from ..ir.ops import REGISTRY
from ..quant import qparams as qpm
from ..quant.dynamic import quantize_rows, row_params
from ._common import is_output, pass_options, quantize_calib, quantize_option
from .manager import PassContext, register_pass

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
S_RANGE = (1e-4, 1e4)           # s is clipped here: a dead channel (max 0) keeps s = 1


@dataclass
class SmoothQuantOptions:
    alpha: float | None = None              # migration strength in [0, 1]; None: chosen per group
    alphas: tuple = ALPHAS                  # the candidates when alpha is None
    calib: Any = None                       # feeds (a Dataset); None: the quantize pass's
    per_channel: bool | None = None         # weights' scheme in the α search; None: the quantize pass's
    max_rows: int = 256                     # rows of each activation the α search uses
    granularity: str | None = None          # a dynamic build's activation scales ("token"/"tensor"); None: static
    keep_float: frozenset | None = None     # layers left alone; None: the quantize pass's

    def __post_init__(self):
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"alpha {self.alpha:g} outside [0, 1]", "--smooth-quant",
                            "give the migration strength, e.g. 0.5, or no value to choose it per layer")
        if self.max_rows < 1:
            raise UserError("max_rows must be at least 1", "smooth-quant options", "e.g. 256")


@dataclass
class Group:
    x: Value                                 # the activation the linear layers read
    layers: list                             # (op, W as K x N float32)

    @property
    def wmax(self) -> np.ndarray:
        return np.max([np.abs(w).max(axis=1) for _, w in self.layers], axis=0)


def _weight(op: Op, x: Value) -> np.ndarray | None:
    """W (K x N) when ``op`` is a linear layer x @ W (+ b) reading ``x`` as its data input."""
    if not op.operands or op.operands[0] is not x or len(op.operands) < 2 or not op.operands[1].is_const:
        return None
    w = op.operands[1]
    if op.kind == "MatMul" and w.type.rank == 2 and x.type.rank >= 2:
        return w.data.astype(np.float32)
    if op.kind in ("Gemm", "FusedGemm") and w.type.rank == 2:
        a = {**REGISTRY[op.kind].defaults, **op.attrs}
        if a["transA"]:
            return None
        return (w.data.T if a["transB"] else w.data).astype(np.float32)
    return None


def groups(graph: Graph, keep_float=frozenset()) -> list[Group]:
    """Every float activation read by at least one linear layer with a constant weight (not kept
    float), with those layers."""
    out = []
    for v in graph.values():
        if v.is_const or v.dtype != "float32" or v.type.quant is not None or v.type.rank < 2:
            continue
        layers = []
        for op, _ in v.uses:
            w = _weight(op, v)
            if w is not None and op.name not in keep_float and op.kind not in keep_float:
                layers.append((op, w))
        if layers and isinstance(v.shape[-1], int) and all(w.shape[0] == v.shape[-1] for _, w in layers):
            out.append(Group(v, layers))
    return out


class _Rows:
    """Observer: per-channel min/max of the last axis, and a seeded sample of rows."""

    def __init__(self, per_feed: int, seed: int):
        self.lo = self.hi = None
        self.rows: list[np.ndarray] = []
        self.per_feed, self.rng, self.count = per_feed, np.random.default_rng(seed), 0

    def update(self, x: np.ndarray) -> None:
        r = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        r = r[np.all(np.isfinite(r), axis=1)]
        if not len(r):
            return
        lo, hi = r.min(axis=0), r.max(axis=0)
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)
        k = min(self.per_feed, len(r))
        self.rows.append(r[np.sort(self.rng.choice(len(r), k, replace=False))])
        self.count += r.size


@dataclass
class Scheme:
    """The quantize pass's schemes: activations per tensor (``symmetric`` int8 or asymmetric over
    ``activation_dtype``), weights symmetric int8 per output channel or per tensor."""
    per_channel: bool = True
    activation_dtype: str = "uint8"
    symmetric: bool = False
    granularity: str | None = None           # dynamic: each row's (or the rows') own range, at run time

    def activation(self, x: np.ndarray, lo: float, hi: float) -> np.ndarray:
        if self.granularity is not None:     # qcompiler.quant.dynamic's quantization of the rows themselves
            s, r, z = row_params(x, self.granularity)
            return ((quantize_rows(x, r, z).astype(np.float32) - z) * s).astype(np.float32)
        make = qpm.symmetric if self.symmetric else qpm.asymmetric
        return qpm.fake_quantize(x, make(lo, hi, self.activation_dtype))

    def weight(self, w: np.ndarray) -> np.ndarray:
        """w: K x N, its output channels on axis 1."""
        qp = qpm.per_channel_symmetric(w, 1) if self.per_channel else qpm.symmetric(float(w.min()), float(w.max()))
        return qpm.fake_quantize(w, qp)


def factors(amax: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = amax_j^α / wmax_j^(1-α), clipped to S_RANGE; 1 where either maximum is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(amax.astype(np.float64), alpha) / np.power(wmax.astype(np.float64), 1.0 - alpha)
    ok = (amax > 0) & (wmax > 0) & np.isfinite(s)
    return np.where(ok, np.clip(s, *S_RANGE), 1.0).astype(np.float32)


def quant_error(g: Group, rows: np.ndarray, refs: list[np.ndarray], lo: np.ndarray, hi: np.ndarray,
                s: np.ndarray | None, scheme: Scheme) -> float:
    """Σ_layers ||X W - Q(X/s) Q(sW)||² / ||X W||² on the sampled rows X (``refs``: each layer's
    X W; s None: no smoothing)."""
    inv = np.ones_like(lo) if s is None else 1.0 / s
    # the range of X/s over all the data: per channel [lo, hi]/s (s > 0)
    xq = scheme.activation(rows * inv, float(np.min(lo * inv)), float(np.max(hi * inv)))
    num = den = 0.0
    for (_, w), ref in zip(g.layers, refs):
        ws = w if s is None else w * s[:, None]
        num += float(np.sum((ref - xq @ scheme.weight(ws)) ** 2, dtype=np.float64))
        den += float(np.sum(ref.astype(np.float64) ** 2))
    return num / den if den > 0 else 0.0


def _layernorm_absorbs(x: Value, g: Group) -> Op | None:
    """The LayerNormalization that makes x, when 1/s folds into its γ and β: constant γ (β),
    normalized over the last axis only, and no reader of x besides the group's layers."""
    ln = x.producer
    if ln is None or ln.kind != "LayerNormalization" or is_output(x):
        return None
    axis = ln.attrs.get("axis", -1)
    if axis % x.type.rank != x.type.rank - 1 or any(not v.is_const for v in ln.operands[1:]):
        return None
    if any(v.data.size != x.shape[-1] for v in ln.operands[1:]):
        return None
    mine = {id(op) for op, _ in g.layers}
    return ln if all(id(op) in mine for op, _ in x.uses) else None


def apply(graph: Graph, g: Group, s: np.ndarray) -> str:
    """Divide g.x's channels by s (in its LayerNorm, or by a Mul) and multiply the weights' rows."""
    x, inv = g.x, (1.0 / s).astype(np.float32)
    ln = _layernorm_absorbs(x, g)
    if ln is not None:
        for i, v in enumerate(ln.operands[1:], start=1):
            ln.set_operand(i, graph.add_const((v.data.reshape(-1) * inv).reshape(v.shape).astype(v.dtype),
                                              v.name + "_smooth"))
        src, where = x, "layernorm"
    else:
        order = {id(op): i for i, op in enumerate(graph.ops)}
        first = min((op for op, _ in g.layers), key=lambda op: order[id(op)])
        k = graph.add_const(inv, x.name + "_inv_s")
        src = graph.create_op("Mul", [x, k], name=x.name + "_smooth", result_names=[x.name + "_smooth"],
                              before=first).result
        where = "mul"
    for op, w in g.layers:
        wv = op.operands[1]
        ws = w * s[:, None]
        data = ws if op.kind == "MatMul" or not {**REGISTRY[op.kind].defaults, **op.attrs}["transB"] else ws.T
        op.set_operand(1, graph.add_const(np.ascontiguousarray(data).astype(wv.dtype), wv.name + "_smooth"))
        if src is not x:
            op.set_operand(0, src)
    return where


@register_pass("smooth-quant", options=SmoothQuantOptions)
def smooth_quant(graph: Graph, ctx: PassContext) -> bool:
    """SmoothQuant (Xiao et al. 2023): divide the input channels of linear layers by
    s = max|X|^α / max|W|^(1-α) and multiply the weights' rows by s, α chosen per layer group on
    the calibration data unless given; needs calibration data."""
    from ..quant.calibrate import observe
    opts = pass_options(ctx, "smooth-quant", SmoothQuantOptions)
    calib = opts.calib if opts.calib is not None else quantize_calib(ctx)
    if calib is None:
        raise UserError("SmoothQuant needs calibration data (it observes each activation's channels)",
                        "--smooth-quant", "give --calib DATA (or the pass option calib)")
    scheme = Scheme(opts.per_channel if opts.per_channel is not None else quantize_option(ctx, "per_channel", True),
                    quantize_option(ctx, "activation_dtype", "uint8"),
                    quantize_option(ctx, "symmetric_activations", False), opts.granularity)
    keep = opts.keep_float if opts.keep_float is not None else quantize_option(ctx, "keep_float", frozenset())
    todo = groups(graph, frozenset(keep))
    if not todo:
        graph.meta["smooth_quant"] = {}
        return False
    n_feeds = len(calib) if hasattr(calib, "__len__") else 32
    per_feed = max(1, -(-opts.max_rows // max(1, n_feeds)))
    obs = observe(graph, calib, [g.x.name for g in todo], lambda name: _Rows(per_feed, zlib.crc32(name.encode())))
    record, changed = {}, False
    for g in todo:
        o = obs[g.x.name]
        if o.lo is None:
            continue
        rows = np.concatenate(o.rows)[: opts.max_rows]
        amax = np.maximum(np.abs(o.lo), np.abs(o.hi))
        refs = [rows @ w for _, w in g.layers]
        base = quant_error(g, rows, refs, o.lo, o.hi, None, scheme)
        cands = [opts.alpha] if opts.alpha is not None else list(opts.alphas)
        errs = {a: quant_error(g, rows, refs, o.lo, o.hi, factors(amax, g.wmax, a), scheme) for a in cands}
        best = min(errs, key=errs.get)
        if opts.alpha is None and errs[best] >= base:
            record[g.x.name] = {"alpha": None, "layers": [op.name for op, _ in g.layers],
                                "error": {"without": base, "with": errs[best]}}
            continue
        where = apply(graph, g, factors(amax, g.wmax, best))
        record[g.x.name] = {"alpha": best, "into": where, "layers": [op.name for op, _ in g.layers],
                            "error": {"without": base, "with": errs[best]}}
        changed = True
    graph.remove_unused_consts()
    graph.meta["smooth_quant"] = record
    n = sum(1 for r in record.values() if r["alpha"] is not None)
    if ctx is not None:
        ctx.log(f"smooth-quant: {n} of {len(record)} activations smoothed")
    return changed
