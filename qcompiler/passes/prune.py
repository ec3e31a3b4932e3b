"""``prune``: magnitude pruning of conv/gemm weights, and detection of sparsity already present.

Magnitude pruning (Han et al. 2015, *Learning both Weights and Connections for Efficient Neural
Networks*; Zhu & Gupta 2017, *To prune, or not to prune*) sets the weights of smallest ``|w|`` to
exactly 0. Every weight is seen as its gemm matrix ``W [N, K]`` (:mod:`qcompiler.sparse.format`:
a Gemm's ``B`` as ``[N, K]``, a conv's im2col matrix ``[O/g, C/g*kh*kw]`` per group), because that
is what the sparse kernels and the encodings store. Patterns, for a target sparsity ``s``:

* ``unstructured``: per layer, the ``round(s * numel)`` weights of smallest ``|w|`` become 0
  (ties: the lower flat index goes first, so the result is deterministic); with ``global_=True`` one
  magnitude ranking over all pruned layers together (``round(s * Σ numel)`` weights), so layers of
  small weights lose more. Sparsity is exactly ``round(s*n)/n`` unless a layer had more zeros already.
* ``N:M`` (``"2:4"``): in every group of M consecutive ``k`` of a row the ``M-N`` smallest become 0
  (Mishra et al. 2021, arXiv:2104.08378; what Ampere sparse tensor cores run). ``s`` is implied,
  ``1 - N/M``. When ``K % M != 0`` the last group keeps its ``min(N, size)`` largest.
* ``block4``: 1x4 blocks along ``k`` (``K`` zero-padded to a multiple of 4) ranked by their L2 norm;
  the ``round(s * blocks)`` weakest become 0 (per layer, or globally with ``global_``). The element
  sparsity is then the block sparsity up to the padded tail block.

Not pruned by default: convs whose filters read one input channel each: depthwise convs (``group ==
C_in``) and convs on a one-channel input (a grayscale image's first conv). Their im2col rows are
``kh*kw`` long - one 3x3 filter, nine weights - so a sparse encoding has nothing to amortize its
indices over, and 2:4/blocks along ``k`` would cut a spatial filter in half. They hold ~3 % of a
MobileNet's weights (so pruning them buys almost no size) while every output channel depends on its
single spatial filter: uspsnet's first conv (1 -> 32 channels, 3x3) pruned to 50 % alone cost 23
points of top-1 agreement even with reconstruction (``bench/prune_accuracy.py``). The first conv and the last gemm are pruned (not skipped):
skip them by name or kind with ``skip`` when the accuracy cost is too high.

Run it on the float weights, before ``quantize`` (the CLI does): the weights' int8 scales and the
empirical bias correction are then computed for the pruned weights. An int8 graph can be pruned too
(magnitude ``|q| * scale``), but its bias correction then describes the unpruned weights.

Detection (``sparsity=None``): nothing changes; every conv/gemm weight (float, or int8 of a
quantized graph) is measured: fraction of exact zeros, whether it is already N:M compliant, and
the fraction of all-zero 1x4 blocks.

Records ``graph.meta["sparsity"]``::

    {"target": 0.5 | None, "pattern": "unstructured" | "2:4" | "block4" | None, "global": bool,
     "method": "magnitude" (with a target; "obc" from :mod:`.prune_reconstruct`),
     "layers": {op_name: {"kind", "groups", "matrix": [N, K], "params", "zeros", "sparsity",
                          "nm_2_4": bool, "zero_blocks_1x4": frac, "pruned": bool, "skipped": reason?}}}

With a target, the graph before pruning is kept in ``ctx.data["prune.dense_graph"]`` (the build
report measures the pruning's own error against it: :mod:`qcompiler.plan.sparse_report`).

Before/after (``--sparsity 0.5``, unstructured)::

    %y = Conv(%x, %w: [2, 1, 1, 2] = [[[[0.1, -0.7]]], [[[0.3, 0.05]]]])
    %y = Conv(%x, %w_pruned = [[[[0.0, -0.7]]], [[[0.3, 0.0]]]])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Op, Value
from ..sparse.format import conv_matrices, gemm_matrix
from ._common import pass_options
from .manager import PassContext, register_pass

PATTERNS = ("unstructured", "2:4", "block4")
CONV_KINDS = ("Conv", "FusedConv", "QLinearConv")
GEMM_KINDS = ("Gemm", "FusedGemm", "QLinearGemm", "MatMul")


@dataclass(frozen=True)
class PruneOptions:
    sparsity: float | None = None          # None: detect only
    pattern: str = "unstructured"          # unstructured | N:M (e.g. 2:4) | block4
    global_: bool = False                  # one magnitude ranking across layers (unstructured, block4)
    skip: frozenset[str] = field(default_factory=frozenset)   # op names or kinds left dense
    skip_depthwise: bool = True            # and convs on a one-channel input: filters of one input channel

    def __post_init__(self):
        if self.pattern not in ("unstructured", "block4") and nm_of(self.pattern) is None:
            raise ValueError(f"prune: unknown pattern '{self.pattern}' (unstructured, N:M such as 2:4, block4)")
        if self.sparsity is not None and not 0.0 <= self.sparsity < 1.0:
            raise ValueError(f"prune: sparsity must be in [0, 1), got {self.sparsity}")
        nm = nm_of(self.pattern)
        if nm and self.sparsity is not None and abs(self.sparsity - (1 - nm[0] / nm[1])) > 1e-9:
            raise ValueError(f"prune: pattern {self.pattern} has sparsity {1 - nm[0] / nm[1]:g} by definition, "
                             f"got {self.sparsity:g}")


def nm_of(pattern: str) -> tuple[int, int] | None:
    """``(N, M)`` of an ``"N:M"`` pattern (0 < N < M), else None."""
    a, sep, b = pattern.partition(":")
    if not sep or not a.isdigit() or not b.isdigit():
        return None
    n, m = int(a), int(b)
    return (n, m) if 0 < n < m else None


# ---- the weights --------------------------------------------------------------------------------
@dataclass
class Layer:
    """A conv/gemm op with a constant weight, seen as its gemm matrices ``[g, N, K]``."""
    op: Op
    slot: int                    # operand index of the weight
    group: int
    trans: bool                  # gemm weight stored [K, N]
    scale: np.ndarray | None     # quantized weight: per-row scale [g*N] (magnitude = |q| * scale)

    @property
    def weight(self) -> Value:
        return self.op.operands[self.slot]

    def matrices(self) -> np.ndarray:
        w = self.weight.data
        if self.op.kind in CONV_KINDS:
            return conv_matrices(w, self.group)
        return gemm_matrix(w, 0 if self.trans else 1)[None]

    def magnitudes(self) -> np.ndarray:
        m = np.abs(self.matrices().astype(np.float64))
        if self.scale is not None:
            m *= self.scale.reshape(m.shape[0], m.shape[1], 1)
        return m

    def store(self, graph: Graph, mats: np.ndarray) -> None:
        w = self.weight
        data = mats.reshape(w.shape) if self.op.kind in CONV_KINDS else (mats[0].T if self.trans else mats[0])
        data = np.ascontiguousarray(data).astype(w.data.dtype)
        if len(w.uses) == 1 and w.name.endswith("_pruned"):
            w.data = data
            return
        self.op.set_operand(self.slot, graph.add_const(data, w.name + "_pruned", quant=w.type.quant))

    @property
    def depthwise(self) -> bool:
        return self.op.kind in CONV_KINDS and self.group > 1 and self.weight.shape[1] == 1

    @property
    def one_channel_filters(self) -> bool:
        """A conv whose every filter reads one input channel: depthwise, or a one-channel input."""
        return self.op.kind in CONV_KINDS and self.weight.shape[1] == 1


def layers(graph: Graph) -> list[Layer]:
    """Every conv/gemm op whose weight is a constant, in graph order."""
    out = []
    for op in graph.ops:
        if op.kind not in CONV_KINDS + GEMM_KINDS:
            continue
        w = op.operands[1] if len(op.operands) > 1 else None
        if w is None or not w.is_const or w.data.ndim < 2 or (op.kind in GEMM_KINDS and w.data.ndim != 2):
            continue
        group = int(op.attrs.get("group", 1) or 1) if op.kind in CONV_KINDS else 1
        if op.kind in CONV_KINDS or op.kind == "QLinearGemm":
            trans = False                                  # stored [O, ...] / [N, K]
        elif op.kind == "MatMul":
            trans = True                                   # x @ B, B [K, N]
        else:
            trans = not op.attrs.get("transB", 0)
        slot = 1
        scale = None
        qp = w.type.quant
        if qp is not None:
            rows = w.shape[0] if op.kind in CONV_KINDS or not trans else w.shape[1]
            scale = np.broadcast_to(np.asarray(qp.scale, np.float64), (rows,)).copy()
        out.append(Layer(op, slot, group, trans, scale))
    return out


# ---- masks (True = keep) --------------------------------------------------------------------------
def keep_largest(mag: np.ndarray, prune: int) -> np.ndarray:
    """Mask keeping all but the ``prune`` smallest entries of ``mag`` (ties: lower flat index pruned first)."""
    flat = mag.reshape(-1)
    mask = np.ones(flat.size, bool)
    if prune > 0:
        mask[np.argsort(flat, kind="stable")[:prune]] = False
    return mask.reshape(mag.shape)


def nm_mask(mag: np.ndarray, n: int, m: int) -> np.ndarray:
    """Keep the ``n`` largest of every ``m`` consecutive entries along the last axis."""
    k = mag.shape[-1]
    kp = -(-k // m) * m
    padded = np.full(mag.shape[:-1] + (kp,), -np.inf)
    padded[..., :k] = mag
    grp = padded.reshape(mag.shape[:-1] + (kp // m, m))
    # rank within the group by descending magnitude, ties to the lower index (stable)
    order = np.argsort(-grp, axis=-1, kind="stable")
    keep = np.zeros_like(grp, bool)
    np.put_along_axis(keep, order[..., :n], True, axis=-1)
    keep &= np.isfinite(grp)
    return keep.reshape(mag.shape[:-1] + (kp,))[..., :k]


def block_scores(mag: np.ndarray, b: int = 4) -> np.ndarray:
    """L2 norm of every 1 x b block along the last axis (zero-padded): ``[..., ceil(K/b)]``."""
    k = mag.shape[-1]
    kp = -(-k // b) * b
    padded = np.zeros(mag.shape[:-1] + (kp,))
    padded[..., :k] = mag
    return np.sqrt((padded.reshape(mag.shape[:-1] + (kp // b, b)) ** 2).sum(-1))


def expand_blocks(keep_blocks: np.ndarray, k: int, b: int = 4) -> np.ndarray:
    return np.repeat(keep_blocks, b, axis=-1)[..., :k]


# ---- statistics -----------------------------------------------------------------------------------
def stats(layer: Layer) -> dict:
    mats = layer.matrices()
    g, n, k = mats.shape
    nz = mats != 0
    zeros = int(mats.size - nz.sum())
    kp = -(-k // 4) * 4
    padded = np.zeros((g, n, kp), bool)
    padded[..., :k] = nz
    per4 = padded.reshape(g, n, kp // 4, 4).sum(-1)
    return {"kind": layer.op.kind, "groups": g, "matrix": [n, k], "params": int(mats.size), "zeros": zeros,
            "sparsity": round(zeros / max(mats.size, 1), 6), "nm_2_4": bool((per4 <= 2).all()),
            "zero_blocks_1x4": round(float((per4 == 0).mean()) if per4.size else 0.0, 6),
            "depthwise": layer.depthwise}


def base_kind(kind: str) -> str:
    """Conv for Conv/FusedConv/QLinearConv, Gemm for Gemm/FusedGemm/QLinearGemm, else the kind."""
    for prefix in ("Fused", "QLinear"):
        if kind.startswith(prefix):
            return kind[len(prefix):]
    return kind


def skip_reason(layer: Layer, opts: PruneOptions) -> str | None:
    op = layer.op
    if op.name in opts.skip:
        return "skipped by name"
    if op.kind in opts.skip or base_kind(op.kind) in opts.skip:
        return f"skipped by kind {base_kind(op.kind)}"
    if opts.skip_depthwise and layer.one_channel_filters:
        what = "depthwise" if layer.depthwise else "one input channel"
        return f"{what} (one kh*kw filter per output channel: nothing to encode, accuracy-critical)"
    return None


def chosen_layers(graph: Graph, opts: PruneOptions) -> list[tuple[Layer, str | None]]:
    """Every conv/gemm layer with a constant weight and why it is left dense (None: it is pruned);
    a ``skip`` entry that names no layer or kind is a UserError."""
    found = layers(graph)
    known = {l.op.name for l in found} | {l.op.kind for l in found} | {base_kind(l.op.kind) for l in found}
    unknown = sorted(set(opts.skip) - known)
    if unknown:
        raise UserError(f"--no-prune {unknown[0]!r} names no conv/gemm layer with a constant weight", "--no-prune",
                        f"give a layer name (see 'qcompile inspect') or a kind: "
                        f"{', '.join(sorted({base_kind(l.op.kind) for l in found}))}")
    return [(l, skip_reason(l, opts)) for l in found]


def record(chosen: list[tuple[Layer, str | None]], before: dict[int, dict], pruned: set[int],
           opts: PruneOptions) -> dict:
    """The ``graph.meta["sparsity"]`` record: per layer its statistics now, before (``before[id]``),
    whether it was pruned (``id(layer) in pruned``) or why not."""
    rows = {}
    for l, why in chosen:
        row = stats(l)
        row["pruned"] = id(l) in pruned
        row["sparsity_before"] = before[id(l)]["sparsity"]
        if why is not None:
            row["skipped"] = why
        rows[l.op.name] = row
    return {"target": opts.sparsity, "pattern": opts.pattern if opts.sparsity is not None else None,
            "global": bool(opts.global_ and opts.sparsity is not None), "layers": rows}


def prune_graph(graph: Graph, opts: PruneOptions) -> dict:
    """Prune (or, with ``opts.sparsity is None``, only measure) ``graph``; returns the meta record."""
    chosen = chosen_layers(graph, opts)
    todo = [l for l, why in chosen if why is None] if opts.sparsity is not None else []
    masks: dict[int, np.ndarray] = {}
    nm = nm_of(opts.pattern)
    if todo and nm is not None:
        for l in todo:
            masks[id(l)] = nm_mask(l.magnitudes(), *nm)
    elif todo and opts.pattern == "unstructured":
        mags = [l.magnitudes() for l in todo]
        if opts.global_:
            allm = np.concatenate([m.reshape(-1) for m in mags])
            keep = keep_largest(allm, int(round(opts.sparsity * allm.size)))
            off = 0
            for l, m in zip(todo, mags):
                masks[id(l)] = keep[off:off + m.size].reshape(m.shape)
                off += m.size
        else:
            for l, m in zip(todo, mags):
                masks[id(l)] = keep_largest(m, int(round(opts.sparsity * m.size)))
    elif todo:                                             # block4
        mags = [l.magnitudes() for l in todo]
        scores = [block_scores(m) for m in mags]
        if opts.global_:
            alls = np.concatenate([s.reshape(-1) for s in scores])
            keep = keep_largest(alls, int(round(opts.sparsity * alls.size)))
            off = 0
            for l, m, s in zip(todo, mags, scores):
                masks[id(l)] = expand_blocks(keep[off:off + s.size].reshape(s.shape), m.shape[-1])
                off += s.size
        else:
            for l, m, s in zip(todo, mags, scores):
                masks[id(l)] = expand_blocks(keep_largest(s, int(round(opts.sparsity * s.size))), m.shape[-1])
    before = {id(l): stats(l) for l, _ in chosen}
    for l in todo:
        if id(l) in masks:
            mats = l.matrices()
            l.store(graph, np.where(masks[id(l)], mats, np.zeros((), mats.dtype)))
    if masks:
        graph.remove_unused_consts()
    return record(chosen, before, set(masks), opts)


def summarize(record: dict) -> dict:
    """Totals over the layers of a meta record: params, zeros, overall sparsity."""
    rows = record["layers"].values()
    params = sum(r["params"] for r in rows)
    zeros = sum(r["zeros"] for r in rows)
    pp = sum(r["params"] for r in rows if r.get("pruned"))
    pz = sum(r["zeros"] for r in rows if r.get("pruned"))
    return {"layers": len(rows), "pruned_layers": sum(bool(r.get("pruned")) for r in rows),
            "params": params, "zeros": zeros, "sparsity": round(zeros / max(params, 1), 6),
            "pruned_sparsity": round(pz / pp, 6) if pp else None}


@register_pass("prune", options=PruneOptions)
def prune(graph: Graph, ctx: PassContext) -> bool:
    """Magnitude pruning of conv/gemm weights (unstructured, N:M, block4), or sparsity detection."""
    opts = pass_options(ctx, "prune", PruneOptions)
    if opts.sparsity is not None:
        ctx.data["prune.dense_graph"] = graph.clone()      # for the report: the pruning's own SQNR
    rec = prune_graph(graph, opts)
    if opts.sparsity is not None:
        rec["method"] = "magnitude"
    graph.meta["sparsity"] = rec
    s = summarize(rec)
    what = f"pruned {s['pruned_layers']} of {s['layers']} layers ({opts.pattern}" + \
        (", global" if rec["global"] else "") + ")" if opts.sparsity is not None else f"{s['layers']} layers measured"
    ctx.log(f"prune: {what}; {s['zeros']:,} of {s['params']:,} weights are zero ({100 * s['sparsity']:.1f} %)")
    return any(r["pruned"] for r in rec["layers"].values())
