"""Which layers of an int8 build stay float: user rules, default rules and the budget.

Runs between the float pipeline and the ``quantize`` pass (``qcompile --dtype int8``):

1. ``--keep-float NAME|op:TYPE`` (a bare TYPE still works) resolved against the graph: every entry
   must name an op or an op type, else one UserError line. Names are the layers the report and the
   selection print, after the quantize pass split fused residual blocks: NAME of a block
   FusedConv(X, W, B, Z) is its conv, NAME_add its add (each kept float only when named), so the
   selection's float set given back by name builds the graph the selection scored (a type keeps
   its fused blocks whole);
2. ``--force-int8 NAME`` overrides a keep-float *type* for that op; forcing an op the plan cannot
   make integer (Softmax, Sigmoid, Tanh, Erf/Gelu: no integer kernel, the default rule keeps them
   float) is a UserError;
3. with ``--sensitivity`` the ranked table (:mod:`qcompiler.plan.sensitivity`), with
   ``--min-sqnr DB`` / ``--max-accuracy-drop POINTS`` the budgeted selection
   (:mod:`qcompiler.plan.select`) over the layers neither forced nor kept.

The result is the QuantizeOptions the pass runs with (keep_float += the selection, the shared
``ranges`` of the one calibration, bias correction as the evaluation had it) and the JSON parts of
the report: ``sensitivity`` (rows) and ``selection`` (budget, met, every float layer with its reason).
The SQNR budget is measured on the ``--sensitivity-samples`` samples of the calibration source that
follow the calibration samples and the report's evaluation samples (:meth:`qcompiler.driver.CalibSource.selection`; on the
first calibration samples only when the source holds no more: optimistic, the ranges were fitted to
them), and checked at the 95 % bootstrap lower bound over those samples, not at the point estimate
(``--budget-confidence``; the math in :mod:`qcompiler.plan.select`). The build report then
evaluates the result on its held-back samples, which the selection did not see either. The accuracy
budget needs labelled ``--eval`` data and is measured on it (bootstrap upper bound of the drop).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Literal

from ..errors import UserError
from ..ir.graph import Graph
from ..passes import quantize_plan

DEFAULT_FLOAT = ("Softmax", "LogSoftmax", "Sigmoid", "Tanh", "Erf", "Gelu")   # no integer kernel: float by rule
DEFAULT_FLOAT += ("PRelu", "Where", "Sign", "Mod", "GatherND", "ScatterND")      # the zoo ops (comparisons and
#   logic give bool, never quantized)
OP_PREFIX = "op:"


@dataclass(frozen=True)
class BudgetOptions:
    """Which layers of an int8 build stay float: by name (``--keep-float``/``--force-int8``), by an
    SQNR or accuracy budget, or ranked by measured sensitivity (``qcompiler.driver`` re-exports it
    as ``CompileOptions.budget``)."""
    keep_float: tuple[str, ...] = ()
    force_int8: tuple[str, ...] = ()
    min_sqnr: float | None = None
    max_accuracy_drop: float | None = None
    sensitivity: bool = False
    sensitivity_samples: int = 64          # the selection window of the calibration source
    confidence: float = 0.95               # the budget holds at this bootstrap lower bound; 0: point estimate
    layer_costs: Literal["measure", "model", "off"] = "measure"   # the latency-aware selection's per-layer times
    shortlist: int | None = 8
    max_evaluations: int | None = None     # None: one per candidate layer + 40, both searches together

    @property
    def budgeted(self) -> bool:
        return self.budget is not None

    @property
    def active(self) -> bool:
        return bool(self.force_int8) or self.sensitivity or self.budget is not None

    @property
    def budget(self) -> float | None:
        return self.min_sqnr if self.min_sqnr is not None else (
            -self.max_accuracy_drop if self.max_accuracy_drop is not None else None)

    def check(self) -> None:
        if self.min_sqnr is not None and self.max_accuracy_drop is not None:
            raise UserError("--min-sqnr and --max-accuracy-drop both given", "--min-sqnr",
                            "give one budget")
        if self.min_sqnr is not None and not math.isfinite(self.min_sqnr):
            raise UserError(f"--min-sqnr must be a finite number of dB, got {self.min_sqnr}", "--min-sqnr",
                            "give e.g. --min-sqnr 30")
        if self.max_accuracy_drop is not None and not (0 <= self.max_accuracy_drop <= 100):
            raise UserError(f"--max-accuracy-drop must be 0..100 points, got {self.max_accuracy_drop}",
                            "--max-accuracy-drop", "give e.g. --max-accuracy-drop 0.5")
        if self.sensitivity_samples < 1:
            raise UserError(f"--sensitivity-samples must be positive, got {self.sensitivity_samples}",
                            "--sensitivity-samples", "give e.g. 64")
        if not (0 <= self.confidence < 1) or (0 < self.confidence < 0.5):
            raise UserError(f"--budget-confidence must be 0 (point estimate) or in [0.5, 1), got {self.confidence}",
                            "--budget-confidence", "give e.g. 0.95 (the default), or 0 for the point estimate")


def resolve_keep_float(graph: Graph, entries, force_int8=()) -> frozenset[str]:
    """``--keep-float`` entries as the quantize pass's keep_float: names stay names, ``op:TYPE`` and
    bare types become the type and its fused form (op:Conv: Conv and FusedConv, as the float
    pipeline fuses Conv+Relu), or, when a forced op has that type, the names of its other ops."""
    from ..ir.ops import REGISTRY
    from ..passes.quantize import QuantizeOptions
    from ..passes.quantize_plan import split_names
    names = {op.name for op in graph.ops} | split_names(graph, QuantizeOptions())   # the parts it splits off
    kinds = {op.kind for op in graph.ops}
    out: set[str] = set()
    forced = set(force_int8)
    for e in entries:
        kind = e[len(OP_PREFIX):] if e.startswith(OP_PREFIX) else None
        if kind is None and e in names:
            out.add(e)
            continue
        kind = kind or e
        if kind not in kinds and kind not in REGISTRY:
            near = sorted(n for n in names if e.lower() in n.lower())[:3]
            raise UserError(f"--keep-float '{e}' names no op and no op type of the model", "--keep-float",
                            "give an op name" + (f" (e.g. {', '.join(near)})" if near else "") +
                            " or op:TYPE such as op:Conv (see 'qcompile inspect')")
        also = {kind, "Fused" + kind} & (kinds | set(REGISTRY))        # op:Conv also means FusedConv (Conv+Relu)
        of_kind = {op.name for op in graph.ops if op.kind in also}
        if of_kind & forced:
            out |= of_kind - forced
        else:
            out |= also
    return frozenset(out)


def check_forced(graph: Graph, opts, force_int8) -> None:
    """Every ``--force-int8`` name is an op the quantize plan makes integer."""
    from .sensitivity import prepare
    g = prepare(graph, opts)
    plan = quantize_plan.plan(g, opts)
    ops = {op.name: op for op in g.ops}
    for name in force_int8:
        if name not in ops:
            raise UserError(f"--force-int8 '{name}' names no op of the model", "--force-int8",
                            "give an op name as 'qcompile inspect' prints it")
        op = ops[name]
        if plan.role.get(op) is None:
            why = plan.why.get(op, "")
            rule = " (default rule: it stays float)" if op.kind in DEFAULT_FLOAT else ""
            raise UserError(f"--force-int8 '{name}': {op.kind} cannot be integer: {why}{rule}", "--force-int8",
                            "drop it from --force-int8 (only ops with an integer kernel can be forced)")


def plan(graph: Graph, opts, req: BudgetOptions, *, calib_data=None, eval_data=None, select_data=None, metric=None,
         cost: Callable[[frozenset], float] | None = None, log: Callable[[str], None] = lambda m: None):
    """(QuantizeOptions for the pass, report parts) for ``graph`` (the float graph before the
    quantize pass, prepared here in place like the pass would). ``calib_data``/``eval_data``:
    where to measure (a Dataset / EvalData); ``select_data`` (EvalData, :meth:`qcompiler.driver.CalibSource.selection`):
    where ``--min-sqnr`` and ``--sensitivity`` are measured instead of the first calibration samples."""
    from .select import Memo, select_float_layers
    from .sensitivity import Sensitivity, samples
    req.check()
    forced = set(req.force_int8)
    keep = resolve_keep_float(graph, req.keep_float, forced)
    for name in forced & keep:
        keep = keep - {name}
    opts = replace(opts, keep_float=keep)
    quantize_plan.prepare(graph, opts)      # split residual blocks now: the selection names those parts
    check_forced(graph, opts, forced)
    parts: dict = {}
    if not (req.sensitivity or req.budget is not None):
        return opts, parts
    accuracy = req.max_accuracy_drop is not None
    if accuracy:
        if eval_data is None or not eval_data.dataset.has_labels:
            raise UserError("--max-accuracy-drop needs labelled evaluation data", "--max-accuracy-drop",
                            "give --eval DATA.npz holding the inputs and a label array (or use --min-sqnr)")
        data, where = samples(eval_data, req.sensitivity_samples), f"{eval_data.source} (evaluation data)"
    elif select_data is not None:                # past the calibration and the evaluation samples
        data, where = samples(select_data, req.sensitivity_samples), select_data.source + " (held back from calibration)"
    else:
        src = opts.calib
        if src is None:
            from ..quant.data import random_dataset
            src = random_dataset(graph.inputs, min(req.sensitivity_samples, opts.random_samples))
        data, where = samples(src, req.sensitivity_samples), "calibration data"
    n = len(next(iter(data[0][0].values())))
    log(f"sensitivity: one calibration of every activation, then per layer set one run of {n} samples (onnxruntime, QDQ)")
    sens = Sensitivity(graph, opts, data, metric=metric, log=log)
    cands = [c for c in sens.candidates if c not in forced]
    base = sens.scores(frozenset())
    if req.sensitivity:
        parts["sensitivity"] = {"samples": n, "data": where, "rows": sens.table(progress=True),
                                "all_int8": base.to_json()}
    reasons = {}
    if req.budget is not None:
        point, evaluate, criterion = _criterion(sens, accuracy, req.confidence, n)
        unit = "points" if accuracy else "dB"
        prior = ([r["layer"] for r in parts["sensitivity"]["rows"]] if "sensitivity" in parts else sens.prior())
        cap = req.max_evaluations if req.max_evaluations is not None else len(cands) + 40
        kw = dict(shortlist=req.shortlist, prior=prior, unit=unit, groups=sens.groups(), max_evaluations=cap,
                  memo=Memo())                     # the cap bounds both searches together
        sel = select_float_layers(evaluate, cands, req.budget, **kw)          # accuracy only
        alternatives = {}
        if cost is not None:
            # latency-aware search (scores memoized: only new sets cost a reference run); it is
            # taken only when it meets the budget and is predicted no slower than the
            # accuracy-only set, so the latency-aware choice is never slower by the cost model
            fast = select_float_layers(evaluate, cands, req.budget, cost=cost, **kw)
            acc_ms, fast_ms = cost(frozenset(sel.float_layers)), cost(frozenset(fast.float_layers))
            alternatives = {"accuracy_only": {"float_layers": list(sel.float_layers), "score": sel.score,
                                              "predicted_ms": acc_ms, "met": sel.met},
                            "latency_aware": {"float_layers": list(fast.float_layers), "score": fast.score,
                                              "predicted_ms": fast_ms, "met": fast.met}}
            if fast.met and (not sel.met or fast_ms <= acc_ms):
                sel = fast
            alternatives["chosen"] = "latency_aware" if sel is fast else "accuracy_only"
        opts = replace(opts, keep_float=keep | frozenset(sel.float_layers))
        reasons.update(sel.reasons())
        js = sel.to_json()
        js.update(kind="min-sqnr" if not accuracy else "max-accuracy-drop", data=where, samples=n,
                  criterion=criterion, point=round(point(frozenset(sel.float_layers)), 4),
                  baseline_point=round(point(frozenset()), 4),
                  candidates=len(cands), forced_int8=sorted(forced),
                  scores=sens.scores(frozenset(sel.float_layers)).to_json(), all_int8=base.to_json(),
                  max_evaluations=cap, **alternatives)
        if accuracy:
            js["budget_points"] = req.max_accuracy_drop
        parts["selection"] = js
        log(f"selection: {len(sel.float_layers)} float layer(s) for {'SQNR' if not accuracy else 'accuracy'} "
            f"budget {req.budget:g} {unit}: {criterion['name']} {sel.score:.2f} {unit} (all int8: {sel.baseline:.2f}); "
            f"{sel.evaluations} evaluations")
    parts.setdefault("selection", {"budget": None, "met": None, "float_layers": []})
    parts["selection"]["user_keep_float"] = sorted(keep)
    parts["_reasons"] = reasons
    parts["_calib_run"] = sens.calib_run         # the quantize pass re-uses it (QUANTIZE_CALIB_RUN)
    opts = replace(opts, ranges={**sens.ranges, **opts.ranges},
                   bias_correction=opts.bias_correction and sens.bias_correction)
    return opts, parts


def _criterion(sens, accuracy: bool, confidence: float, n: int):
    """(point estimate, the score the budget is checked on, its description) as functions of the
    float set: the 1 - confidence bootstrap lower bound of the output SQNR (or minus the upper
    bound of the accuracy drop) over the selection samples, or the point estimate itself when
    confidence is 0 or the outputs have no per-sample axis (see :mod:`qcompiler.plan.select`)."""
    from .select import RESAMPLES, Bootstrap
    ref = sens.fp32

    def point(S):
        s = sens.scores(S)
        return -100.0 * (ref.accuracy - s.accuracy) if accuracy else s.sqnr_db
    base = sens.per_sample(frozenset())
    if confidence == 0 or base is None or (accuracy and base.correct is None):
        why = "requested (--budget-confidence 0)" if confidence == 0 else "the outputs have no per-sample axis"
        return point, point, {"name": "point estimate", "why": why}
    bs = Bootstrap(n, RESAMPLES, level=1.0 - confidence, seed=0)

    def bound(S):
        p = sens.per_sample(S)
        if accuracy:
            return -bs.accuracy_drop(p.fp32_correct, p.correct)
        return bs.sqnr_db(p.signal, p.noise)
    return point, bound, {"name": "bootstrap bound", "confidence": confidence, "resamples": RESAMPLES,
                          "seed": 0, "what": ("upper bound of the accuracy drop" if accuracy else
                                              "lower bound of the output SQNR, 10 log10(Σ signal / Σ noise)")}


def float_reasons(int8: Graph, parts: dict, keep_float) -> dict[str, str]:
    """Why each float layer of the built graph is float: budget, --keep-float, default rule, plan."""
    out = {}
    chosen = parts.get("_reasons", {})
    for name, v in int8.meta.get("quant", {}).get("layers", {}).items():
        if v.get("precision") != "float":
            continue
        kind = v.get("kind", "")
        if name in chosen:
            out[name] = chosen[name]
        elif name in keep_float or kind in keep_float:
            out[name] = "--keep-float"
        elif kind in DEFAULT_FLOAT:
            out[name] = f"default rule: {kind} stays float"
        else:
            out[name] = f"quantize plan: {v.get('reason', '')}"
    return out


def format_selection(sel: dict, reasons: dict[str, str]) -> str:
    lines = []
    if sel.get("budget") is not None:
        u = sel.get("unit", "dB")
        b = f"max accuracy drop {sel['budget_points']:g} points" if "budget_points" in sel else \
            f"min SQNR {sel['budget']:g} dB"
        lines.append(f"selection ({b}{criterion_text(sel)}, on {sel['samples']} samples of the {sel['data']}): "
                     f"{'met' if sel['met'] else 'NOT met'}, {sel['score']} {u} with "
                     f"{len(sel['float_layers'])} float layer(s) (all int8: {sel['baseline']} {u}; "
                     f"{sel['evaluations']} evaluations)")
        if sel.get("criterion", {}).get("name") == "bootstrap bound":
            lines.append(f"  point estimate on those samples: {sel['point']} {u} (all int8: {sel['baseline_point']} {u})")
    if "chosen" in sel:
        a, f = sel["accuracy_only"], sel["latency_aware"]
        lines.append(f"  accuracy-only search: {len(a['float_layers'])} float layer(s), predicted {a['predicted_ms']:.3f} ms; "
                     f"latency-aware: {len(f['float_layers'])}, {f['predicted_ms']:.3f} ms; "
                     f"chosen: {sel['chosen'].replace('_', '-')} (never the slower prediction)")
    if reasons:
        lines.append("float layers:")
        w = min(max(len(n) for n in reasons), 48)
        lines += [f"  {n:<{w}}  {r}" for n, r in reasons.items()]
    return "\n".join(lines) + ("\n" if lines else "")


def criterion_text(sel: dict) -> str:
    """', at the 95 % bootstrap lower bound' (or upper bound of the drop), or '' (point estimate)."""
    c = sel.get("criterion") or {}
    if c.get("name") != "bootstrap bound":
        return ""
    return f", at the {100 * c['confidence']:g} % bootstrap {'upper bound' if 'budget_points' in sel else 'lower bound'}"


def report_parts(int8: Graph, parts: dict, opts, rep: dict) -> dict:
    """``sensitivity`` and ``selection`` for report.json: the selection with every float layer's
    reason, and the budget checked again on the report's held-back evaluation."""
    if not parts:
        return {}
    out = {k: v for k, v in parts.items() if not k.startswith("_")}
    sel = dict(out.get("selection", {}))
    sel["float_layer_reasons"] = float_reasons(int8, parts, opts.keep_float)
    ev = rep.get("evaluation", {})
    if sel.get("budget") is not None and ev.get("samples"):
        held: dict = {"samples": ev["samples"], "source": ev.get("source"), "held_back": ev.get("held_back")}
        if "budget_points" in sel and "accuracy" in ev:
            drop = 100 * (ev["accuracy"]["fp32"] - ev["accuracy"]["int8"])
            held.update(accuracy_drop_points=round(drop, 4), met=drop <= sel["budget_points"] + 1e-9)
        elif "budget_points" not in sel:
            dbs = [o.get("sqnr_db") for o in ev.get("outputs", [])]
            worst = min((math.inf if d is None else d) for d in dbs) if dbs else None
            held.update(output_sqnr_db=dbs, met=worst is not None and worst >= sel["budget"])
        sel["evaluation"] = held
    out["selection"] = sel
    return out


def format_text(report: dict) -> str:
    """The sensitivity table and the selection, for stdout after the build report's table."""
    from .sensitivity import format_table
    text = ""
    if "sensitivity" in report:
        text += format_table(report["sensitivity"]["rows"])
    if "selection" in report:
        sel = report["selection"]
        text += format_selection(sel, sel.get("float_layer_reasons", {}))
        held = sel.get("evaluation")
        if held and "met" in held:
            what = (f"accuracy drop {held['accuracy_drop_points']:.2f} points" if "accuracy_drop_points" in held
                    else "output SQNR " + ", ".join("—" if d is None else f"{d:.2f}" for d in held["output_sqnr_db"])
                    + " dB")
            text += (f"on the {held['samples']} evaluation samples ({'held back' if held.get('held_back') else 'NOT held back'}): "
                     f"{what}: budget {'met' if held['met'] else 'NOT met'}\n")
    return text
