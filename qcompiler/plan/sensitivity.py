"""Per-layer quantization sensitivity: what int8 costs, layer by layer.

For every *quantizable layer* -- an op the ``quantize`` plan turns into an integer op with its own
quantization point (QLinearConv/Gemm/Add/Mul/pooling, Concat; read from the plan's
``layers`` record, not from a list of kinds) -- two measurements against the fp32 model on a
bounded set of samples (default 64), both run by onnxruntime on the variant's QDQ export
(:func:`~qcompiler.passes.quantize_bias.variant_runner`: each float op between DequantizeLinear and
QuantizeLinear, within one step of the integer kernels where a float32 sum lands near a rounding
tie), or with ``exact=True`` by the reference interpreter (:mod:`qcompiler.quant.reference`, the
oracle the compiled kernels match bit for bit; 20-60x slower: an EfficientNet-B0's table of 32
samples did not finish in 15 minutes):

(a) **only this layer int8**, every other layer float: the damage the layer does by itself
    (``None`` for ops that are integer only behind a quantized operand: Add, Mul, pools, Concat);
(b) **only this layer float**, every other layer int8: what un-quantizing it alone buys back.

Each as the output metrics of :class:`Scores`, over all model outputs y (fp32 reference r)::

    SQNR = 10 log10( Σ r² / Σ (y - r)² )  dB
    KL   = mean over rows of Σ_i p_i log(p_i / q_i),   p = softmax(r), q = softmax(y)  (last axis)
    RMSE = sqrt( mean (y - r)² )

plus, with labels, the top-1 accuracy (first output, argmax over the last axis) and with a user
callback ``metric(outputs_list) -> float`` its value; the *drop* is fp32's minus the candidate's.
These are the "faster-to-compute" sensitivity metrics of Algorithm 6.2's discussion (Deep
Learning Systems, ch. 6.2: KL divergence and RMSE vs the fp32 model), measured end to end rather
than through the Hessian trace (Dong et al., HAWQ, ICCV 2019), which needs gradients we do not have.

Cost: ONE calibration of the whole graph (every float activation observed in the same pass, so
the range of any value some mixed plan needs is known: ``QuantizeOptions.ranges``), ONE average
of the Conv/Gemm inputs for the empirical bias correction (used where the all-int8 build keeps
it), then per layer set only the cheap rewrite (plan, params, integer weights) and one run of
the samples. The fp32 outputs are computed once. So the table costs about 2 n + 1 model
runs for n layers, and the greedy selection (:mod:`qcompiler.plan.select`) re-uses the same
:meth:`Sensitivity.scores` (memoized per float set).

    sens = Sensitivity(float_graph, QuantizeOptions(calib=ds), samples(ds, 64))
    rows = sens.table()                               # ranked: most damaging first
    sens.scores(frozenset({"conv1"})).sqnr_db        # conv1 float, everything else int8
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Sequence

import numpy as np

from ..codegen.target import QUANTIZED_DTYPES
from ..errors import UserError
from ..ir.graph import Graph
from ..ir.types import dequantize
from ..passes import quantize_bias, quantize_plan, quantize_rewrite
from ..passes.quantize import gptq_rounding
from ..progress import report
from ..quant import reference
from ..quant.calibrate import float_runs, value_runs
from ..quant.qparams import sqnr_from_energies
from .report import Energy, EvalData, chunks

Metric = Callable[[list[np.ndarray]], float]
Sample = tuple[dict[str, np.ndarray], "np.ndarray | None"]      # (feed, labels or None)
DEFAULT_SAMPLES = 64


@dataclass(frozen=True)
class Scores:
    """Output metrics of one mixed-precision variant against fp32 (see the module docstring)."""
    sqnr_db: float                 # +inf when exact
    kl: float
    rmse: float
    accuracy: float | None = None  # top-1 on the labels, in [0, 1]
    metric: float | None = None    # the user callback's value

    def to_json(self) -> dict:
        return {k: _round(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class PerSample:
    """Per-sample energies of one variant against fp32: ``signal[i] = Σ r²``, ``noise[i] = Σ (y - r)²``
    over every output of sample i (so ``SQNR = 10 log10(Σ signal / Σ noise)``); with labels,
    ``correct[i]`` / ``fp32_correct[i]``: top-1 of the first output right (1) or not (0), the share of
    its rows when a sample has several (so their mean is :attr:`Scores.accuracy`)."""
    signal: np.ndarray
    noise: np.ndarray
    correct: np.ndarray | None = None
    fp32_correct: np.ndarray | None = None


def _round(x, nd: int = 4):
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def samples(data: Iterable, n: int = DEFAULT_SAMPLES) -> list[Sample]:
    """The first ``n`` samples of ``data`` as one (feed, labels) pair: ``data`` is a
    :class:`~qcompiler.quant.data.Dataset` (labels when it has them), a
    :class:`~qcompiler.plan.report.EvalData`, or an iterable of feeds."""
    if n < 1:
        raise UserError(f"sensitivity needs at least 1 sample, got {n}", "--sensitivity-samples", "give e.g. 64")
    if isinstance(data, EvalData):
        data = EvalData(data.dataset, data.skip, min(n, data.take), data.source, data.held_back, data.random)
        batch = data.dataset.batch
        parts = list(chunks(data, n, batch))
    else:
        it = data.with_labels() if hasattr(data, "with_labels") else ((f, None) for f in data)
        parts, have = [], 0
        for feed, labels in it:
            k = len(next(iter(feed.values())))
            parts.append((feed, labels))
            have += k
            if have >= n:
                break
    if not parts:
        raise UserError("no samples to measure the sensitivity on", "sensitivity data", "give data with samples")
    feed = {k: np.concatenate([np.asarray(p[0][k]) for p in parts])[:n] for k in parts[0][0]}
    labels = None
    if all(p[1] is not None for p in parts):
        labels = np.concatenate([np.asarray(p[1]) for p in parts])[:n]
    return [(feed, labels)]


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def output_scores(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], labels: np.ndarray | None = None,
                  metric: Metric | None = None) -> Scores:
    """:class:`Scores` of outputs ``got`` against the fp32 outputs ``ref`` (lists, one array per
    model output, same order)."""
    r = np.concatenate([np.asarray(a, np.float64).ravel() for a in ref])
    y = np.concatenate([np.asarray(a, np.float64).ravel() for a in got])
    noise = float(np.sum((y - r) ** 2))
    sqnr = sqnr_from_energies(float(np.sum(r ** 2)), noise)
    kls = []
    for a, b in zip(ref, got):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.ndim == 0 or a.shape[-1] < 2:
            continue
        p, q = _softmax(a), _softmax(b)
        kls.append(np.sum(p * (np.log(np.maximum(p, 1e-300)) - np.log(np.maximum(q, 1e-300))), axis=-1).ravel())
    kl = float(np.mean(np.concatenate(kls))) if kls else 0.0
    acc = None
    first = np.asarray(got[0])
    if labels is not None and first.ndim >= 2 and first.shape[-1] > 1 and first.shape[:-1] == labels.shape:
        acc = float(np.mean(first.argmax(-1) == labels))
    return Scores(sqnr, max(kl, 0.0), math.sqrt(noise / max(r.size, 1)), acc,
                  None if metric is None else float(metric([np.asarray(a) for a in got])))


class Sensitivity:
    """Mixed-precision variants of one float graph, scored against fp32 on fixed samples.

    ``graph``: the float graph the quantize pass would start from (after the default pipeline);
    it is not modified: :func:`prepare` splits fused residual blocks as the pass does, on a clone.
    ``opts``: the :class:`~qcompiler.passes.quantize.QuantizeOptions` of the build (calibration
    data, method, per-channel, the user's ``keep_float``); ``data``: (feed, labels) pairs, e.g.
    :func:`samples`. ``ranges``: already collected ranges (else one calibration here).
    """

    def __init__(self, graph: Graph, opts, data: list[Sample], *, metric: Metric | None = None,
                 ranges: dict | None = None, log: Callable[[str], None] | None = None, exact: bool = False):
        self.opts, self.metric, self.log = opts, metric, log or (lambda m: None)
        self.graph = prepare(graph, opts)
        self.data = data
        self.exact = exact
        self.ranges = dict(ranges) if ranges is not None else calibrate_all(self.graph, opts)
        self.ref = self._outputs(self.graph) if not exact else [reference.run(self.graph, feed) for feed, _ in data]
        plan = quantize_plan.plan(self.graph, replace(opts, ranges=self.ranges))
        self.means: dict = {}
        self._weights: dict = {}                    # the integer weights per (layer, params): Rewriter's cache
        self.calib_run: dict | None = None          # the float run over the calibration data, for the pass
        self.rounding = gptq_rounding(self.graph, plan, opts)    # --weight-rounding gptq: its Gram matrices
        float_outputs: list = []
        means = quantize_bias.layer_input_means(self.graph, plan, opts, float_outputs) \
            if opts.bias_correction and opts.calib is not None else {}
        if means or self.rounding is not None:
            self.calib_run = {"calib": opts.calib, "means": means, "float_outputs": float_outputs,
                              "rounding": self.rounding}
            self.means, self.rounding, _ = quantize_bias.choose_corrections(
                self.graph, replace(opts, ranges=self.ranges), self.ranges, means, float_outputs, self.rounding)
        self.bias_correction = bool(self.means)
        g, layers = self.quantized(frozenset())
        self._base = (_signatures(g), [reference.run_values(g, feed) for feed, _ in data]) if exact else ({}, [])
        self._all_int8 = self._base
        self._parent: frozenset = frozenset()       # the float set whose run _base holds
        self._wanted: dict[frozenset, int] = {}      # how often a set would have been the better base
        self.layers = layers                         # the all-int8 plan's record, per layer
        self.candidates = [n for n, v in layers.items() if v["precision"] in QUANTIZED_DTYPES and "method" in v]
        self.kinds = {n: layers[n]["kind"] for n in self.candidates}
        self._cache: dict[frozenset, Scores] = {}
        self._per_sample: dict[frozenset, "PerSample | None"] = {}
        self._int8_alone: dict[frozenset, bool] = {}
        self.evaluations = 0

    # ---- variants ----------------------------------------------------------------------------
    def quantized(self, float_set: frozenset) -> tuple[Graph, dict]:
        """The graph quantized with the layers in ``float_set`` (and the user's keep_float) kept
        float, with the shared ranges and bias-correction means: (graph, per-layer record)."""
        g = self.graph.clone()
        o = replace(self.opts, keep_float=frozenset(self.opts.keep_float) | frozenset(float_set),
                    ranges=self.ranges)
        plan = quantize_plan.plan(g, o)
        P, _ = quantize_plan.activation_qparams(g, plan, o, {})
        rw = quantize_rewrite.Rewriter(g, plan, P, self.ranges, o, self.means, self._weights, self.rounding)
        rw.run()
        self._stands_for = {q.name: f for q, f in rw.stands_for.items()}
        return g, rw.layers

    def scores(self, float_set: Iterable[str]) -> Scores:
        """Scores of the build with ``float_set`` float (memoized)."""
        key = frozenset(float_set)
        if key not in self._cache:
            if self.exact:
                self._choose_base(key)
            g, layers = self.quantized(key)
            self._int8_alone[key] = layers
            outs = [self._run(g, i) for i in range(len(self.data))] if self.exact else self._outputs(g)
            self._cache[key] = self._combine(outs)
            self._per_sample[key] = self._split(outs)
            self.evaluations += 1
            report("evaluate layer sets", self.evaluations)
        return self._cache[key]

    def _outputs(self, g: Graph) -> list[list[np.ndarray]]:
        """The outputs of ``g`` on each sample set, run by onnxruntime
        (:func:`~qcompiler.passes.quantize_bias.variant_runner`: a quantized graph as its QDQ
        export, within one step of the integer kernels at rounding ties)."""
        return quantize_bias.variant_runner(g)([feed for feed, _ in self.data])

    def _choose_base(self, key: frozenset) -> None:
        """Which run :meth:`_run` takes unchanged ops from: the all-int8 one, or that of the largest
        set already scored inside ``key``. The greedy search measures many sets S ∪ {L} for one S;
        with S's run as the base only the ops downstream of L run again (with the all-int8 run,
        everything downstream of any layer in S does). A set becomes the base the second time it
        is the best one (one extra run of it; a single request does not pay that), and the base in
        use stays while it lies inside ``key``. Scores do not change: a reused value is the one the
        same kernels computed on the same operands."""
        if len(key) < 2:
            return
        best = max((s for s in self._cache if s < key), key=len, default=frozenset())
        if self._parent < key and len(self._parent) >= len(best):
            return                                   # the base in use is as good
        self._wanted[best] = self._wanted.get(best, 0) + 1
        if self._wanted[best] < 2:
            if not self._parent < key:
                self._base, self._parent = self._all_int8, frozenset()
            return
        g, _ = self.quantized(best)
        self._base = self._all_int8                  # the new base's own run reuses the all-int8 one
        values = [self._run(g, i, keep_all=True) for i in range(len(self.data))]
        self._base, self._parent = (_signatures(g), values), best

    def _run(self, g: Graph, i: int, keep_all: bool = False):
        """The outputs of ``g`` on sample set ``i``, like :func:`reference.run`, but every op that
        is the same as in the base graph (same kind, attributes, operand and result names and
        types, same constants) and reads only such ops' results takes its result from the base
        run (all-int8, or a subset's: :meth:`_choose_base`): the ops upstream of every float layer
        not in the base's set are not run again. ``keep_all``: every value by name."""
        sigs, base = self._base[0], self._base[1][i]
        feed = self.data[i][0]
        env: dict[str, np.ndarray] = {v.name: v.data for v in g.consts.values()}
        for v in g.inputs:
            env[v.name] = np.asarray(feed[v.name])
        same = {v.name for v in g.inputs}
        last = {}
        for k, op in enumerate(g.ops):
            for v in op.operands:
                last[v.name] = k
        outputs = {v.name for v in g.outputs}
        for k, op in enumerate(g.ops):
            sig = sigs.get(op.results[0].name) if op.results else None
            if sig is not None and sig[0] == _signature(op) and all(
                    v.name in same or (v.is_const and v.name in sig[1] and _same_array(sig[1][v.name], v.data))
                    for v in op.operands):
                for r in op.results:
                    env[r.name] = base[r.name]
                    same.add(r.name)
            else:
                for r, a in zip(op.results, reference.evaluate_op(op, [env[v.name] for v in op.operands])):
                    env[r.name] = a
            if keep_all:
                continue
            for v in op.operands:
                if last.get(v.name) == k and v.name not in outputs and not v.is_const:
                    env.pop(v.name, None)
        return env if keep_all else [env[v.name] for v in g.outputs]

    def per_sample(self, float_set: Iterable[str]) -> "PerSample | None":
        """Per-sample signal and noise energies (and top-1 correctness with labels) of the build with
        ``float_set`` float: what :mod:`qcompiler.plan.select`'s bootstrap bound resamples. None
        when an output has no leading sample axis (its rows cannot be told apart)."""
        key = frozenset(float_set)
        self.scores(key)
        return self._per_sample[key]

    def _split(self, outs: list[list[np.ndarray]]) -> "PerSample | None":
        """Σ r² and Σ (y - r)² over every output of each sample (rows of the leading axis)."""
        sig, noise, correct, ref_correct = [], [], [], []
        for (feed, labels), r, y in zip(self.data, self.ref, outs):
            n = len(next(iter(feed.values())))
            if any(np.ndim(a) == 0 or np.shape(a)[0] != n for a in (*r, *y)):
                return None
            rr = [np.asarray(a, np.float64).reshape(n, -1) for a in r]
            yy = [np.asarray(a, np.float64).reshape(n, -1) for a in y]
            sig.append(sum(np.sum(a * a, axis=1) for a in rr))
            noise.append(sum(np.sum((b - a) ** 2, axis=1) for a, b in zip(rr, yy)))
            first_r, first_y = np.asarray(r[0]), np.asarray(y[0])
            if labels is not None and first_y.ndim >= 2 and first_y.shape[:-1] == np.shape(labels) \
                    and first_y.shape[-1] > 1:
                rows = (n, -1)                         # the share of a sample's rows that are right
                correct.append(np.mean((first_y.argmax(-1) == labels).reshape(rows), axis=1))
                ref_correct.append(np.mean((first_r.argmax(-1) == labels).reshape(rows), axis=1))
        have = len(correct) == len(self.data)
        return PerSample(np.concatenate(sig), np.concatenate(noise),
                         np.concatenate(correct).astype(np.float64) if have else None,
                         np.concatenate(ref_correct).astype(np.float64) if have else None)

    def _combine(self, outs: list[list[np.ndarray]]) -> Scores:
        ref = [np.concatenate([r[i] for r in self.ref]) for i in range(len(self.ref[0]))]
        got = [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]
        labels = [lb for _, lb in self.data]
        lab = np.concatenate(labels) if all(lb is not None for lb in labels) else None
        return output_scores(ref, got, lab, self.metric)

    def groups(self) -> list[frozenset]:
        """Per candidate layer: it with the candidate layers that read its output (through ops that
        only carry their input's quantization, e.g. Flatten, MaxPool): keeping all of them float
        removes that activation's quantization point, which keeping one of them cannot."""
        by_name = {op.name: op for op in self.graph.ops}
        cands = set(self.candidates)
        out = []
        for name in self.candidates:
            group, todo, seen = {name}, [by_name[name].result], set()
            while todo:
                v = todo.pop()
                for use in v.uses:
                    user = use[0]
                    if user in seen:
                        continue
                    seen.add(user)
                    if user.name in cands:
                        group.add(user.name)
                    elif user.kind in quantize_plan.KEEP_PARAMS and user.results:
                        todo.append(user.result)
            if len(group) > 1:
                out.append(frozenset(group))
        return list(dict.fromkeys(out))

    def prior(self) -> list[str]:
        """The candidates ordered by the SQNR each loses across itself in ONE all-int8 run over the
        first sample set (SQNR of its quantized inputs minus that of its output, vs fp32; largest
        first): a cheap ranking of where the error enters, for
        :func:`~qcompiler.plan.select.select_float_layers`'s shortlist and bisection."""
        g, _ = self.quantized(frozenset())
        stands = dict(self._stands_for)
        feeds = [self.data[0][0]]
        energies = self._value_energies(g, stands, feeds)

        def sqnr(qname: str) -> float | None:
            e = energies.get(qname)
            if e is None:
                return None
            return 300.0 if e[1] == 0 else 10 * math.log10(max(e[0], 1e-300) / e[1])
        drop = {}
        for op in g.ops:
            if op.name not in self.kinds:
                continue
            out = sqnr(op.result.name)
            ins = [x for x in (sqnr(v.name) for v in op.operands if not v.is_const) if x is not None]
            drop[op.name] = (min(ins) if ins else 300.0) - out if out is not None else 0.0
        return sorted(self.candidates, key=lambda c: (-drop.get(c, 0.0), self.candidates.index(c)))

    def _value_energies(self, g: Graph, stands: dict[str, str], feeds: list[dict]) -> dict[str, tuple[float, float]]:
        """Per quantized value q of ``g`` standing for float value f of the float graph: (Σ f², Σ
        (dequantize(q) - f)²) over ``feeds``, f from the float graph's run and q from ``g``'s QDQ
        export, both in onnxruntime run by run (the reference interpreter where there is no QDQ form
        or the exact arithmetic was asked for)."""
        from ..frontend.qdq_export import export_qdq
        qnames = [q for q, f in stands.items() if g.has_value(q) and self.graph.has_value(f)]
        fnames = list(dict.fromkeys(stands[q] for q in qnames))

        def energies(runs) -> dict[str, tuple[float, float]]:
            e = Energy()
            for fv, qv in runs:
                for q in qnames:
                    e.add(q, fv[stands[q]], dequantize(qv[q], g.value(q).type.quant))
            return {q: (e.signal.get(q, 0.0), e.noise.get(q, 0.0)) for q in qnames}
        if not self.exact:
            try:
                qruns = value_runs(export_qdq(g), feeds, qnames)
                return energies((fv, qv) for (_, fv), (_, qv) in zip(float_runs(self.graph, feeds, fnames), qruns))
            except Exception:  # noqa: BLE001 - no QDQ form, or a value ORT cannot fetch: the reference
                pass
        return energies((reference.run_values(self.graph, f), reference.run_values(g, f)) for f in feeds)

    @property
    def fp32(self) -> Scores:
        """The fp32 model scored against itself (accuracy and metric of fp32)."""
        ref = [np.concatenate([r[i] for r in self.ref]) for i in range(len(self.ref[0]))]
        labels = [lb for _, lb in self.data]
        lab = np.concatenate(labels) if all(lb is not None for lb in labels) else None
        return output_scores(ref, ref, lab, self.metric)

    def only_int8(self, name: str) -> Scores | None:
        """Scores with only ``name`` int8 (None when the plan cannot make it integer alone)."""
        key = frozenset(c for c in self.candidates if c != name)
        s = self.scores(key)
        layers = self._int8_alone[key]
        return s if layers.get(name, {}).get("precision") in QUANTIZED_DTYPES else None

    def only_float(self, name: str) -> Scores:
        return self.scores(frozenset({name}))

    # ---- the table -----------------------------------------------------------------------------
    def table(self, progress: bool = False) -> list[dict]:
        """One row per quantizable layer, most damaging first: ``gain_db`` (SQNR with only it float
        minus all-int8) descending, then SQNR with only it int8 ascending."""
        base, ref = self.scores(frozenset()), self.fp32
        rows = []
        for i, name in enumerate(self.candidates):
            if progress:        # the compile's progress line (a terminal only): one step per layer
                report("sensitivity", i, len(self.candidates))
            a, b = self.only_int8(name), self.only_float(name)
            row = {"layer": name, "kind": self.kinds[name],
                   "sqnr_only_int8_db": _round(a.sqnr_db) if a else None,
                   "kl_only_int8": _round(a.kl, 6) if a else None,
                   "rmse_only_int8": _round(a.rmse, 6) if a else None,
                   "sqnr_only_float_db": _round(b.sqnr_db), "kl_only_float": _round(b.kl, 6),
                   "rmse_only_float": _round(b.rmse, 6),
                   "gain_db": _round(b.sqnr_db - base.sqnr_db) if math.isfinite(b.sqnr_db) else None}
            if a is None:
                row["note"] = "integer only behind a quantized operand: measured with the others int8"
            if ref.accuracy is not None:
                row["accuracy_drop_only_int8"] = _round(100 * (ref.accuracy - a.accuracy)) if a else None
                row["accuracy_drop_only_float"] = _round(100 * (ref.accuracy - b.accuracy))
            if ref.metric is not None:
                row["metric_drop_only_int8"] = _round(ref.metric - a.metric) if a else None
                row["metric_drop_only_float"] = _round(ref.metric - b.metric)
            rows.append(row)
        if progress:
            report("sensitivity", len(self.candidates), len(self.candidates))
        rows.sort(key=lambda r: (-(r["gain_db"] if r["gain_db"] is not None else math.inf),
                                 r["sqnr_only_int8_db"] if r["sqnr_only_int8_db"] is not None else math.inf,
                                 r["layer"]))
        for k, r in enumerate(rows):
            r["rank"] = k + 1
        return rows


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b))


def _signature(op) -> tuple:
    return (op.kind, repr(sorted(op.attrs.items())), tuple((v.name, str(v.type)) for v in op.operands),
            tuple((r.name, str(r.type)) for r in op.results))


def _signatures(g: Graph) -> dict[str, tuple]:
    """First result name -> (signature, {constant operand name: its array})."""
    return {op.results[0].name: (_signature(op), {v.name: v.data for v in op.operands if v.is_const})
            for op in g.ops if op.results}


def prepare(graph: Graph, opts) -> Graph:
    """A clone of ``graph`` with the quantize pass's step 1 applied (FusedConv/FusedGemm residual
    adds and non-foldable activations split off), so every layer a plan may keep float has its
    own name. Idempotent: the pass itself then finds nothing to split."""
    g = graph.clone()
    quantize_plan.prepare(g, opts)
    return g


def activation_values(graph: Graph) -> list[str]:
    """Every float32 activation of the graph (inputs and op results, not constants)."""
    names = [v.name for v in graph.inputs if v.dtype == "float32"]
    names += [r.name for op in graph.ops for r in op.results if r.dtype == "float32" and r.type.quant is None]
    return list(dict.fromkeys(names))


def calibrate_all(graph: Graph, opts) -> dict[str, tuple[float, float]]:
    """The ranges of every float activation by the build's method, in ONE pass over the
    calibration data: any mixed plan's params come from these (given ranges win)."""
    return quantize_plan.value_ranges(graph, activation_values(graph), opts, {})


def format_table(rows: list[dict], limit: int | None = 20) -> str:
    """The ranked table as text (the first ``limit`` rows)."""
    def f(x, fmt=".2f"):
        return "—" if x is None else format(x, fmt)
    w = max([12] + [min(len(r["layer"]), 40) for r in rows])
    head = (f"{'#':>3} {'layer':<{w}} {'kind':<26} {'only-int8 dB':>12} {'only-float dB':>13} "
            f"{'gain dB':>8} {'KL only-int8':>12} {'RMSE only-int8':>14}")
    drop = any("accuracy_drop_only_int8" in r for r in rows)
    if drop:
        head += f" {'drop pts':>8}"
    lines = ["sensitivity (ranked: most damaging first)", head, "-" * len(head)]
    for r in rows[:limit]:
        name = r["layer"] if len(r["layer"]) <= w else "…" + r["layer"][-(w - 1):]
        s = (f"{r['rank']:>3} {name:<{w}} {r['kind']:<26} {f(r['sqnr_only_int8_db']):>12} "
             f"{f(r['sqnr_only_float_db']):>13} {f(r['gain_db']):>8} {f(r['kl_only_int8'], '.2e'):>12} "
             f"{f(r['rmse_only_int8'], '.2e'):>14}")
        if drop:
            s += f" {f(r.get('accuracy_drop_only_int8')):>8}"
        lines.append(s)
    if limit is not None and len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more in report.json")
    return "\n".join(lines) + "\n"
