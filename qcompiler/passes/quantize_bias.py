"""The quantize pass's bias correction, kept only where it helps (see :mod:`.quantize`): the
Conv/Gemm inputs averaged over the calibration data, and the comparison of the outputs with and
without the correction on that data, stopped early once its sign is settled.

    means = layer_input_means(graph, plan, opts, float_outputs)
    keep, with_db, without_db = bias_correction_helps(float_graph, opts, ranges, means, float_outputs)
    means, rounding, report = choose_corrections(float_graph, opts, ranges, means, float_outputs, rounding)
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..ir.graph import Graph
from ..ir.interp import EvalError
from ..quant import reference
from ..quant.calibrate import batch_runs, model_batch, ort_session
from ..quant.qparams import sqnr_from_energies
from .bias_correct import mean_inputs
from .quantize_plan import CONVS, GEMMS, Plan, activation_qparams, plan
from .quantize_rewrite import Rewriter

if TYPE_CHECKING:
    from .quantize import QuantizeOptions


def layer_input_means(graph: Graph, p: Plan, opts: QuantizeOptions,
                       outputs: list | None = None) -> dict[str, np.ndarray]:
    """For bias correction: the data input of every Conv/Gemm to quantize, averaged over the
    calibration feeds (none without real calibration data or with ``bias_correction`` off).
    ``outputs`` receives the float graph's outputs per feed (see :func:`mean_inputs`)."""
    if not opts.bias_correction or opts.calib is None:
        return {}
    layers = [op for op, role in p.role.items() if role == "compute" and op.kind in CONVS + GEMMS]
    return mean_inputs(graph, opts.calib, layers, outputs) if layers else {}


def _rewritten(src: Graph, opts: QuantizeOptions, ranges: dict, means: dict, rounding=None) -> Graph:
    """A quantized copy of ``src`` (the float graph after step 1) with the given ranges (no
    calibration), bias-correction means and weight rounding."""
    g = src.clone()
    pl = plan(g, opts)
    o = replace(opts, ranges=dict(ranges))
    P, _ = activation_qparams(g, pl, o, {})
    Rewriter(g, pl, P, ranges, o, means, rounding=rounding).run()
    return g


def bias_correction_helps(src: Graph, opts: QuantizeOptions, ranges: dict, means: dict,
                           float_outputs: list | None = None) -> tuple[bool, float, float]:
    """Whether the bias correction lowers the error of the graph outputs on the calibration data:
    (keep it, output SQNR in dB with it, without it, over the feeds compared), the quantized graph
    run by the reference interpreter against the float graph.

    The correction removes the mean output shift that rounding the weights causes, in
    expectation over the layer's float input. It does not see the other mean errors of the
    integer network (the input's own rounding, upstream layers, the output clamp), and on
    uspsnet it made the output worse even with E[x] taken from the evaluation data itself
    (36.37 -> 36.28 dB; on its 256 calibration samples 40.92 -> 40.68 dB, the same sign on all
    five real models). So it is kept only where the calibration data says it helps: strictly
    lower total squared error of the outputs (round-to-nearest's weights; with GPTQ's,
    :func:`choose_corrections` decides both at once). ``float_outputs``: ``src``'s outputs per calibration
    feed when already computed (:func:`layer_input_means` runs the same float graph on the same
    feeds), else run here.

    The feeds are compared in groups of MIN_FEEDS (:func:`variant_runner`), and the comparison
    stops early once the remaining ones cannot plausibly reverse the sign (:func:`sign_settled`):
    each feed costs two whole-model runs, and the answer often is clear after a few."""
    noise, signal = calibration_errors(src, opts, ranges, {"with": (means, None), "without": ({}, None)},
                                       float_outputs, settle=True)
    db = {k: sqnr_from_energies(signal, n) for k, n in noise.items()}
    return noise["with"] < noise["without"], db["with"], db["without"]


def calibration_errors(src: Graph, opts: QuantizeOptions, ranges: dict, variants: dict, float_outputs: list | None = None,
                       *, settle: bool = False) -> tuple[dict, float]:
    """Σ (y − ref)² over the calibration feeds per variant ``{key: (means, rounding)}`` of the
    quantized graph (the outputs of each run by :func:`variant_runner`, ``ref`` the float graph's),
    and Σ ref² (``float_outputs``: the float graph's outputs per feed, else run here by onnxruntime
    too). A variant's ``rounding`` may be a pair: the weight rounding of the even-numbered feeds and
    that of the odd ones (GPTQ fitted on the other half: :meth:`~qcompiler.quant.gptq.GptqRounding.fitted_on`).
    ``settle`` (two variants): stop once the sign of their difference is settled
    (:func:`sign_settled`)."""
    runners = {k: tuple(variant_runner(_rewritten(src, opts, ranges, m, x)) for x in (r if isinstance(r, tuple) else (r,)))
               for k, (m, r) in variants.items()}
    float_outputs = float_outputs or None              # none computed yet: the float graph runs here too
    reference_run = variant_runner(src) if float_outputs is None else None
    total = len(float_outputs) if float_outputs is not None else \
        (len(opts.calib) if hasattr(opts.calib, "__len__") else None)
    signal = 0.0                                  # Σ ref², Σ (y - ref)² per variant, over the feeds compared
    noise = {k: 0.0 for k in runners}
    diffs: list[float] = []                       # settle: err(first) - err(second) per feed
    stream = iter(opts.calib)
    i = 0
    while True:
        group = list(itertools.islice(stream, MIN_FEEDS))        # one batched run per group
        if not group:
            break
        runs = {k: _run_by_parity(pair, group, i) for k, pair in runners.items()}
        ref_runs = reference_run(group) if reference_run is not None else None
        for j, feeds in enumerate(group):
            outs = float_outputs[i + j] if float_outputs is not None else ref_runs[j]
            signal += sum(_sum_sq(a) for a in outs)
            err = {k: sum(_sum_sq(b, a) for a, b in zip(outs, runs[k][j])) for k in runners}
            for k in runners:
                noise[k] += err[k]
            if settle:
                first, second = runners
                diffs.append(err[first] - err[second])
        i += len(group)
        if settle and total is not None and sign_settled(diffs, total):
            break
    return noise, signal


def _run_by_parity(runners: tuple, group: list, start: int) -> list:
    """The outputs of one runner for every feed of ``group``, or of a pair: feed ``start + j`` run by
    ``runners[(start + j) % 2]``."""
    if len(runners) == 1:
        return runners[0](group)
    out: list = [None] * len(group)
    for parity, run in enumerate(runners):
        at = [j for j in range(len(group)) if (start + j) % 2 == parity]
        for j, y in zip(at, run([group[j] for j in at]) if at else []):
            out[j] = y
    return out


def choose_corrections(src: Graph, opts: QuantizeOptions, ranges: dict, means: dict, float_outputs: list | None,
                       rounding=None) -> tuple[dict, object, dict]:
    """Which of the bias correction (``means``) and GPTQ's weights (``rounding``) the quantized
    graph keeps: ``(means or {}, rounding or None, report)``. Without ``rounding`` the bias
    correction's own check (:func:`bias_correction_helps`); with it, the combinations of GPTQ or
    round-to-nearest, with or without the correction, compared on all the calibration feeds, and
    the one with the least output error kept: GPTQ lowers each layer's own error (on data it
    did not fit, by its held-out check) but on some models not the output's (the activations'
    rounding dominates the error of an int8 network; uspsnet's first conv with GPTQ alone costs
    it 1.1 dB), so it is kept only where the whole model's outputs say so. GPTQ's weights are
    fitted to the calibration feeds, so its variant is measured out of sample: each feed runs
    with the weights fitted on the other half of the feeds (rapidocr-cls: in sample GPTQ led by
    0.8 dB and lost 0.7 on 256 held-back inputs)."""
    report: dict = {}
    if rounding is None:
        if means:
            keep, with_db, without_db = bias_correction_helps(src, opts, ranges, means, float_outputs)
            report["bias_correction"] = {"applied": keep, "calibration_sqnr_db": {"with": round(with_db, 3),
                                                                                  "without": round(without_db, 3)}}
            means = means if keep else {}
        return means, None, report
    heldout = (rounding.fitted_on(1), rounding.fitted_on(0))          # each feed by the fit on the other half
    variants = {(r, bc): (means if bc else {}, heldout if r == "gptq" else None)
                for r in ("gptq", "nearest") for bc in ((True, False) if means else (False,))}
    noise, signal = calibration_errors(src, opts, ranges, variants, float_outputs)
    db = {k: sqnr_from_energies(signal, n) for k, n in noise.items()}
    r, bc = min(noise, key=noise.get)
    if means:
        report["bias_correction"] = {"applied": bc, "calibration_sqnr_db": {"with": round(db[(r, True)], 3),
                                                                            "without": round(db[(r, False)], 3)}}
    chosen = rounding.choices()
    report["weight_rounding"] = {"method": "gptq", "applied": r == "gptq", "layers": len(chosen),
                                 "gptq": sum(c == "gptq" for c in chosen.values()),
                                 "nearest": sum(c == "nearest" for c in chosen.values()),
                                 "calibration_sqnr_db": {k: round(max(v for (kr, _), v in db.items() if kr == k), 3)
                                                         for k in ("gptq", "nearest")}}
    return (means if bc else {}), (rounding if r == "gptq" else None), report


def _sum_sq(a: np.ndarray, ref: np.ndarray | None = None) -> float:
    """Σ a² (``ref`` None) or Σ (a - ref)², in float64."""
    d = np.asarray(a, np.float64) if ref is None else np.subtract(a, ref, dtype=np.float64)
    d = d.ravel()
    return float(d @ d)


def variant_runner(g: Graph) -> Callable[[list[dict]], list[list[np.ndarray]]]:
    """A function giving the outputs of the quantized graph ``g`` for each feed of a group.

    onnxruntime runs ``g``'s QDQ export (:func:`~qcompiler.frontend.qdq_export.export_qdq`) op by
    op (:func:`~qcompiler.quant.calibrate.float_runs`' session: DequantizeLinear -> float op ->
    QuantizeLinear, no integer fusion): the integer network to within one step where a float32
    sum lands near a rounding tie, as ``qcompile verify`` checks it against the compiled kernels,
    and ~20x faster than the reference interpreter's exact integer arithmetic (DeepLabV3 int8 at
    520x520: 66 s for the comparison on 28 feeds, 3 s). The sign of a comparison of two variants
    that such ties could flip is a choice between two equally good ones. A graph that has no QDQ
    form, or that onnxruntime refuses, runs in the reference (:func:`_run_feeds`)."""
    from ..frontend.qdq_export import export_qdq
    try:
        model = export_qdq(g)
        sess = ort_session(model)
    except Exception:  # noqa: BLE001 - no QDQ form: the reference runs it
        return lambda group: _run_feeds(g, group)
    names = [o.name for o in model.graph.output]
    inputs = [i.name for i in sess.get_inputs()]
    batch = model_batch([i for i in model.graph.input if i.name in inputs])

    def outputs(feeds: dict) -> list[np.ndarray]:
        parts = [sess.run(names, r) for r in batch_runs(feeds, inputs, batch)]
        return parts[0] if len(parts) == 1 else [np.concatenate(p) for p in zip(*parts)]

    def run(group: list[dict]) -> list[list[np.ndarray]]:
        return [outputs(f) for f in group]
    return run


def _run_feeds(g: Graph, group: list[dict]) -> list[list[np.ndarray]]:
    """The reference outputs of ``g`` for each feed of ``group``, run as ONE batch where the graph
    allows it (the reference kernels take any number of samples; bigger GEMMs and a quarter of
    the per-op overhead): every output must have the samples on its leading axis, else (or if the
    batched run fails) feed by feed. Integer kernels are exact, so the split outputs are the
    per-feed ones."""
    sizes = [len(next(iter(f.values()))) for f in group]
    if len(group) > 1 and all(set(f) == set(group[0]) for f in group):
        try:
            outs = reference.run(g, {k: np.concatenate([np.asarray(f[k]) for f in group]) for k in group[0]})
        except (EvalError, ValueError):
            outs = None
        if outs is not None and all(np.ndim(o) and np.shape(o)[0] == sum(sizes) for o in outs):
            cuts = np.cumsum(sizes)[:-1]
            return [list(p) for p in zip(*(np.split(np.asarray(o), cuts) for o in outs))]
    return [reference.run(g, f) for f in group]


# one-sided 99.9 % quantiles of Student's t by degrees of freedom (smaller df: use the next lower row)
_T999 = ((3, 10.21), (4, 7.173), (5, 5.893), (6, 5.208), (7, 4.785), (8, 4.501), (9, 4.297), (10, 4.144),
         (12, 3.930), (15, 3.733), (20, 3.552), (30, 3.385), (60, 3.232), (120, 3.160))
MIN_FEEDS = 4


def sign_settled(diffs: list[float], total: int) -> bool:
    """Whether the sign of Σ d over all ``total`` feeds is settled by the first m = len(diffs):
    d_i = (squared output error with the correction) - (without) on feed i.

    The remaining r = total - m feeds are modelled as independent draws like the first m (the
    calibration feeds are exchangeable), so their sum is predicted by r d̄ with standard error
    s sqrt(r (1 + r / m)) (s: the sample standard deviation; the r/m term is the uncertainty of d̄
    itself). The sign is settled when |Σ d + r d̄| exceeds t s sqrt(r (1 + r/m)), t Student's
    one-sided 99.9 % quantile with m - 1 degrees of freedom: the full comparison would reverse it
    with probability below about 0.1 %. Never before MIN_FEEDS feeds, and always at the last."""
    m = len(diffs)
    if m >= total:
        return True
    if m < MIN_FEEDS:
        return False
    d = np.asarray(diffs, np.float64)
    r = total - m
    t = next((q for df, q in reversed(_T999) if df <= m - 1), _T999[0][1])
    return abs(float(d.sum()) + r * float(d.mean())) > t * float(d.std(ddof=1)) * float(np.sqrt(r * (1 + r / m)))
