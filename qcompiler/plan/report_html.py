"""The build report as one self-contained HTML page: ``OUT/report.html`` (and the data of
``OUT/report.json`` that every compile writes, fp32 too).

What the page shows, all of it computed by the compile (nothing is estimated here that the JSON
does not mark as estimated):

* **summary**: model file, inputs and outputs (name, shape, dtype), parameters before and after
  the passes, target, dtype, and the op histogram before and after the passes;
* **passes**: the pipeline in order with ops before -> after and whether the pass changed the graph
  (:class:`qcompiler.passes.manager.PassTiming`). The wall time per pass is included only with
  ``qcompile --time-passes``: times differ between runs, and report.json/report.html are listed with
  their sha256 in manifest.json, which must be byte-identical for the same model, data and flags;
* **layers**: one table row per layer of the report (int8: the rows of
  :func:`qcompiler.plan.report.layer_rows` -- op, output shape, precision, scale / zero point, weight
  scales, range source, SQNR vs fp32 on held-back data; fp32: every op of the compiled graph); with
  sparse or pruned weights a "weights zero" column (share of zeros, storage format), with per-layer
  costs (a budget, :mod:`qcompiler.plan.layer_cost`) an "int8 / float µs" column;
* **warnings** (:func:`warnings_of`): layers and outputs with SQNR below 20 dB, layers kept float,
  top-1 agreement below 99 %, accuracy lost, outputs that the float passes before quantize changed
  (e.g. relu6-to-relu; :func:`qcompiler.plan.report.passes_changed`), evaluation on calibration or
  random data, an int8 library that is not smaller than the fp32 one, an int8 layer whose kernel
  measured slower than float;
* **plots**, inline SVG (no script, no network): per-layer SQNR bars

      SQNR = 10 log10( Σ r² / Σ (dequantize(q) - r)² )  dB

  (the 20 dB line marked), the parameter and library sizes fp32 vs int8, the activation ranges of the
  worst layers (lowest SQNR) -- the calibrated range [min, max] against the range the 8-bit grid can
  represent, s (q_min - z) .. s (q_max - z) -- and, when ``equalize`` ran, the per-channel weight ranges
  before/after cross-layer equalization (:func:`qcompiler.plan.dfq.to_svg`; Nagel et al., "Data-Free
  Quantization Through Weight Equalization and Bias Correction", ICCV 2019); the trade-off
  (:func:`.report_plots.tradeoff_points`): output SQNR against predicted latency along the
  float-layer search with a budget, else against model.so size (int8 and fp32).
* **sensitivity and float layers** (``qcompile --sensitivity`` / ``--min-sqnr`` /
  ``--max-accuracy-drop``; :mod:`qcompiler.plan.mixed`): the ranked per-layer sensitivity bars (SQNR
  gained by keeping only that layer float) and each float layer with the reason it is float (the
  budget and its measured gain, ``--keep-float``, a default rule, or the quantize plan).

Activation histograms come from the held-back evaluation (:func:`qcompiler.plan.report.evaluate`):
each quantized layer's fp32 values counted on the 256 levels of its grid; the report keeps the
histograms of the lowest-SQNR layers and, for every layer, how many levels hold 99.99 % of the
values. Fewer than 26 (a tenth of the grid) on a calibrated range is the "range dominated by
outliers" warning.

The plots and the formatting helpers: :mod:`.report_plots`.

Every string that comes from the model (op, value, input names) is HTML-escaped.

    data = compile_data(graph, pm, model="m.onnx", target="x86", dtype="fp32", ops_before=..., ...)
    html = render({**data, "layers": float_layers(graph)})
"""
from __future__ import annotations

from typing import Any

from ..codegen.target import QUANTIZED_DTYPES
from .dfq import to_svg
from .mixed import criterion_text
from .report import OUTLIER_LEVELS, passes_changed
from .report_plots import (SQNR_WARN_DB, esc, fmt_bytes, fmt_num, fmt_shape, histograms_svg, html_table, ranges_svg,
                           sensitivity_svg, size_svg, sqnr_svg, tradeoff_svg)
from .sparse_report import worth_showing

AGREEMENT_WARN = 0.99
HTML_NAME = "report.html"


# ---- the data --------------------------------------------------------------------------------------
def _tensor(v) -> dict:
    return {"name": v.name, "shape": list(v.type.shape) if v.type.shape is not None else None,
            "dtype": str(v.type.dtype)}


def compile_data(graph, pm, *, model: str, target: str, dtype: str, ops_before: dict[str, int],
                 params_before: tuple[int, int], timings: bool = False) -> dict:
    """The summary, pass and op-histogram parts of the report for ``graph`` after the passes of
    ``pm`` (a :class:`~qcompiler.passes.PassManager` that ran). ``timings``: include seconds per
    pass (not reproducible; see the module docstring)."""
    n, b = graph.param_count()
    passes = []
    for t in pm.timings:
        p: dict[str, Any] = {"name": t.name, "changed": bool(t.changed), "ops_before": int(t.ops_before),
                             "ops_after": int(t.ops_after)}
        if timings:
            p["seconds"] = round(float(t.seconds), 4)
        passes.append(p)
    return {
        "model": model, "target": target, "dtype": dtype,
        "summary": {"inputs": [_tensor(v) for v in graph.inputs], "outputs": [_tensor(v) for v in graph.outputs],
                    "params_before": {"count": int(params_before[0]), "bytes": int(params_before[1])},
                    "params_after": {"count": int(n), "bytes": int(b)},
                    "ops_before": sum(ops_before.values()), "ops_after": len(graph.ops)},
        "passes": passes,
        "ops": {"before": dict(ops_before), "after": graph.op_histogram()},
    }


def float_layers(graph) -> list[dict]:
    """One row per op result of a float graph: name, kind, output shape and dtype (an op with
    several results, e.g. Split, has a row for each)."""
    rows = []
    for op in graph.ops:
        for v in op.results:
            rows.append({"name": op.name, "kind": op.kind, "value": v.name,
                         "shape": list(v.type.shape) if v.type.shape is not None else None,
                         "precision": str(v.type.dtype)})
    return rows


def warnings_of(report: dict) -> list[str]:
    """The warnings the data supports, most important first."""
    out = []
    ev = report.get("evaluation", {})
    for r in report.get("layers", []):
        if r.get("sqnr_db") is not None and r["sqnr_db"] < SQNR_WARN_DB:
            out.append(f"layer {r['name']} ({r['kind']}): SQNR {r['sqnr_db']:.1f} dB vs fp32, below {SQNR_WARN_DB:g} dB")
    for o in ev.get("outputs", []):
        if o.get("sqnr_db") is not None and o["sqnr_db"] < SQNR_WARN_DB:
            out.append(f"output {o['name']}: SQNR {o['sqnr_db']:.1f} dB vs fp32, below {SQNR_WARN_DB:g} dB")
        if o.get("top1_agreement") is not None and o["top1_agreement"] < AGREEMENT_WARN:
            out.append(f"output {o['name']}: top-1 agreement with fp32 {100 * o['top1_agreement']:.2f} % "
                       f"({o['top1_agree_rows']}/{o['top1_rows']}), below {100 * AGREEMENT_WARN:g} %")
        if passes_changed(o):
            out.append(f"output {o['name']}: the float passes before quantize changed the fp32 model "
                       f"({o['float_passes_sqnr_db']:.1f} dB vs the model as given; relu6-to-relu, pruning and "
                       "analytic bias correction change results); the output SQNR includes it")
    acc = ev.get("accuracy")
    if acc and acc["int8"] < acc["fp32"]:
        out.append(f"top-1 accuracy on the labels drops from {100 * acc['fp32']:.2f} % (fp32) to "
                   f"{100 * acc['int8']:.2f} % (int8)")
    if report.get("dtype") in QUANTIZED_DTYPES:
        for r in report.get("layers", []):
            if r.get("precision") == "float":
                out.append(f"layer {r['name']} ({r['kind']}) kept in float"
                           f"{': ' + r['reason'] if r.get('reason') else ''}")
        if ev.get("samples") and not ev.get("held_back", True):
            out.append("the evaluation ran on calibration samples (not held back): the SQNR figures are optimistic")
        if ev.get("random"):
            out.append("calibrated and evaluated on random data: the numbers say little about real inputs")
        if not ev.get("samples"):
            out.append(f"no evaluation ({ev.get('note', 'no data')}): no SQNR figures")
        for r in report.get("layers", []):
            n = r.get("levels_99_99")
            if n is not None and 0 < n < OUTLIER_LEVELS and str(r.get("range_source", "")).startswith("calibrated"):
                out.append(f"layer {r['name']}: 99.99 % of its fp32 values fall on {n} of the 256 levels of its "
                           f"8-bit grid: the calibrated range is set by outliers (a clipping --calib-method, "
                           f"percentile or mse, would spend the levels on the values)")
        lat = report.get("latency") or {}
        ms = {r["layer"]: r for r in lat.get("layers", [])}
        for name in lat.get("slower_than_float", []):
            r = ms.get(name, {})
            if r.get("precision") == "int8":
                out.append(f"layer {name}: its int8 kernel is slower than float ({1000 * r['int8_ms']:.1f} µs vs "
                           f"{1000 * r['float_ms']:.1f} µs, {lat.get('method', '')} on {lat.get('target', '')})")
        sz = report.get("size", {})
        if sz.get("library_ratio") is not None and sz["library_ratio"] >= 1.0:
            out.append(f"the int8 model.so ({sz['library_int8_bytes']} B) is not smaller than the estimated "
                       f"fp32 one ({sz['library_fp32_bytes']} B)")
    return out


def _mixed_sections(report: dict) -> list[str]:
    """The sensitivity plot and the float layers with the reason each is float."""
    parts = []
    sens = report.get("sensitivity")
    if sens and sens.get("rows"):
        parts.append('<h2 id="sensitivity">Sensitivity</h2>')
        parts.append(f'<p class="note">{len(sens["rows"])} quantizable layers measured on {sens.get("samples")} '
                     f'samples of the {esc(sens.get("data", ""))}: SQNR of the model output vs fp32 with only the '
                     'layer int8 (everything else float) and with only the layer float (everything else int8).</p>')
        parts.append(sensitivity_svg(sens["rows"]))
    sel = report.get("selection")
    if sel:
        parts.append('<h2 id="float-layers">Float layers</h2>')
        if sel.get("budget") is not None:
            u = sel.get("unit", "dB")
            b = (f"accuracy drop at most {sel['budget_points']:g} points" if "budget_points" in sel
                 else f"output SQNR at least {sel['budget']:g} dB")
            held = sel.get("evaluation") or {}
            hb = ("" if "met" not in held else
                  f' On the {held.get("samples")} evaluation samples ({"held back" if held.get("held_back") else "NOT held back"}): '
                  + (f'accuracy drop {held["accuracy_drop_points"]:.2f} points' if "accuracy_drop_points" in held else
                     'output SQNR ' + ", ".join("—" if d is None else f"{d:.2f}" for d in held.get("output_sqnr_db", []))
                     + " dB") + f', budget {"met" if held["met"] else "NOT met"}.')
            pt = (f' Point estimate on the {esc(sel.get("samples"))} selection samples: {esc(sel.get("point"))} {esc(u)} '
                  f'(all int8: {esc(sel.get("baseline_point"))} {esc(u)}).' if "point" in sel and criterion_text(sel) else "")
            parts.append(f'<p class="note">Budget: {esc(b)}{esc(criterion_text(sel))}; {"met" if sel.get("met") else "NOT met"} with '
                         f'{len(sel.get("float_layers", []))} float layer(s): {esc(sel.get("score"))} {esc(u)} '
                         f'(all int8: {esc(sel.get("baseline"))} {esc(u)}; {esc(sel.get("evaluations"))} '
                         f'evaluations, greedy with re-evaluation, then pruned).{pt}{esc(hb)}</p>')
        reasons = sel.get("float_layer_reasons", {})
        parts.append(html_table("float-reasons", ["layer", "why float"], [[k, v] for k, v in reasons.items()])
                     if reasons else '<p class="note">none: every quantizable layer is int8</p>')
    return parts


# ---- the page --------------------------------------------------------------------------------------
CSS = """
body { font-family: sans-serif; font-size: 14px; margin: 24px; color: #222; max-width: 1180px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.low td { background: #fde8e7; } td.slow { color: #d9534f; font-weight: bold; }
ul.warnings li { color: #a12622; } p.note { color: #555; }
.name { font-family: monospace; word-break: break-all; max-width: 360px; }
"""


def _layer_table(report: dict) -> str:
    layers = report.get("layers", [])
    int8 = report.get("dtype") in QUANTIZED_DTYPES
    if int8:
        head = ["#", "layer", "op", "output shape", "precision", "scale", "zero point", "weight scales",
                "range set by", "SQNR dB"]
    else:
        head = ["#", "layer", "op", "output shape", "precision"]
    sparse = {r["name"]: r for r in (report.get("sparsity") or {}).get("layers", [])}
    if not worth_showing(sparse.values(), min_zeros=0.05):
        sparse = {}                                  # nothing worth a column
    lat = {r["layer"]: r for r in (report.get("latency") or {}).get("layers", [])}
    head += ["weights zero"] * bool(sparse) + ["int8 / float µs"] * bool(lat)
    rows = []
    for i, r in enumerate(layers):
        cells = [f'<td class="n">{i}</td>', f'<td class="name">{esc(r["name"])}</td>', f"<td>{esc(r['kind'])}</td>",
                 f"<td>{esc(fmt_shape(r.get('shape')))}</td>", f"<td>{esc(r.get('precision', ''))}</td>"]
        low = False
        if int8:
            wt = ""
            if "weight" in r:
                w = r["weight"]
                wt = (f"per channel ({w['count']}): {w['scale_min']:.3g} .. {w['scale_max']:.3g}" if w["per_channel"]
                      else f"per tensor: {w['scale_min']:.3g}")
            sq = r.get("sqnr_db")
            low = sq is not None and sq < SQNR_WARN_DB
            sqs = fmt_num(sq, ".2f") if sq is not None else ("exact" if r.get("note") == "exact (no error)"
                                                          else "—")
            src = r.get("range_source", r.get("reason", ""))
            cells += [f'<td class="n">{esc(fmt_num(r.get("scale")))}</td>', f'<td class="n">{esc(r.get("zero_point", "—"))}</td>',
                      f"<td>{esc(wt)}</td>", f"<td>{esc(src)}</td>", f'<td class="n">{esc(sqs)}</td>']
        if sparse:
            sp = sparse.get(r["name"])
            text = f"{100 * sp['sparsity']:.0f} % {sp['format']}" if sp else ""
            cells.append(f'<td class="n">{esc(text)}</td>')
        if lat:
            t = lat.get(r["name"])
            text = f"{1000 * t['int8_ms']:.1f} / {1000 * t['float_ms']:.1f}" if t else ""
            slow = " slow" if t and t["int8_ms"] > t["float_ms"] else ""
            cells.append(f'<td class="n{slow}">{esc(text)}</td>')
        rows.append(('<tr class="low">' if low else "<tr>") + "".join(cells) + "</tr>")
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    return (f'<table class="layers"><thead><tr>{h}</tr></thead>\n<tbody>\n' + "\n".join(rows)
            + "\n</tbody></table>\n")


def render(report: dict, *, equalization: dict | None = None) -> str:
    """The report as one HTML page (UTF-8 text, no script, no external resource). ``equalization``:
    the equalize pass's report (:func:`qcompiler.plan.dfq.report`), plotted when given."""
    int8 = report.get("dtype") in QUANTIZED_DTYPES
    s = report.get("summary", {})
    title = f"qcompiler build report: {report.get('model') or 'model'} ({report.get('dtype', '?')}, " \
            f"{report.get('target', '?')})"
    parts = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]

    # summary
    parts.append('<h2 id="summary">Model</h2>')
    info = [["model file", esc(report.get("model", "?"))], ["target", esc(report.get("target", "?"))],
            ["dtype", esc(report.get("dtype", "?"))]]
    for kind in ("inputs", "outputs"):
        info.append([kind, "<br>".join(f'<span class="name">{esc(v["name"])}</span>: {esc(fmt_shape(v["shape"]))} '
                                       f'{esc(v["dtype"])}' for v in s.get(kind, []))])
    pb, pa = s.get("params_before"), s.get("params_after")
    if pb and pa:
        info.append(["parameters", esc(f"{pb['count']:,} ({fmt_bytes(pb['bytes'])}) before the passes, "
                                      f"{pa['count']:,} ({fmt_bytes(pa['bytes'])}) after")])
    if "ops_before" in s:
        info.append(["ops", esc(f"{s['ops_before']} before the passes, {s['ops_after']} after")])
    if int8:
        cal = report.get("calibration", {})
        info.append(["quantization", esc("; ".join(f"{k}: {v}" for k, v in sorted(report.get("scheme", {}).items())
                                               if isinstance(v, (str, int, float))))])
        info.append(["calibration", esc(f"{cal.get('source')}, {cal.get('samples')} samples, range method "
                                       f"{report.get('range_method')}")])
        ev = report.get("evaluation", {})
        if ev.get("samples"):
            info.append(["evaluation", esc(f"{ev['samples']} samples of {ev.get('source')} from sample "
                                          f"{ev.get('first_sample')}"
                                          f"{', held back from calibration' if ev.get('held_back') else ''}")])
            for o in ev.get("outputs", []):
                t = f"SQNR {fmt_num(o.get('sqnr_db'), '.2f')} dB"
                if "top1_agreement" in o:
                    t += (f", top-1 agreement with fp32 {100 * o['top1_agreement']:.2f} % "
                          f"({o['top1_agree_rows']}/{o['top1_rows']})")
                if passes_changed(o):
                    t += f"; the float passes before quantize alone: {o['float_passes_sqnr_db']:.2f} dB"
                info.append([f"output {esc(o['name'])}", esc(t)])
            if "accuracy" in ev:
                info.append(["top-1 accuracy", esc(f"fp32 {100 * ev['accuracy']['fp32']:.2f} %, "
                                                  f"int8 {100 * ev['accuracy']['int8']:.2f} %")])
    parts.append(html_table("summary", [], info, raw=True))

    # warnings
    warns = report.get("warnings")
    if warns is None:
        warns = warnings_of(report)
    parts.append('<h2 id="warnings">Warnings</h2>')
    parts.append('<ul class="warnings">' + "".join(f"<li>{esc(w)}</li>" for w in warns) + "</ul>" if warns
                 else '<p class="note">none</p>')

    # passes and ops
    passes = report.get("passes", [])
    parts.append('<h2 id="passes">Pass pipeline</h2>')
    timed = any("seconds" in p for p in passes)
    head = ["#", "pass", "changed", "ops before", "ops after"] + (["seconds"] if timed else [])
    prow = [[str(i), p["name"], "yes" if p["changed"] else "no", str(p["ops_before"]), str(p["ops_after"])]
            + ([fmt_num(p.get("seconds"), ".4f")] if timed else []) for i, p in enumerate(passes)]
    parts.append(html_table("passes", head, prow))
    if not timed:
        parts.append('<p class="note">Time per pass: compile with <code>--time-passes</code> to record it here '
                     '(left out by default: it differs between runs, and this file is listed with its '
                     'sha256 in the reproducible manifest.json).</p>')
    ops = report.get("ops", {})
    if ops:
        kinds = sorted(set(ops.get("before", {})) | set(ops.get("after", {})),
                       key=lambda k: (-ops.get("after", {}).get(k, 0), -ops.get("before", {}).get(k, 0), k))
        parts.append("<h3>Ops before and after the passes</h3>")
        parts.append(html_table("ops", ["op", "before", "after"],
                            [[k, str(ops.get("before", {}).get(k, 0)), str(ops.get("after", {}).get(k, 0))]
                             for k in kinds]))

    # layers
    layers = report.get("layers", [])
    parts.append(f'<h2 id="layers">Layers ({len(layers)})</h2>')
    if int8:
        parts.append(f'<p class="note">{report.get("quantized_layers", 0)} quantized, '
                     f'{report.get("float_layers", 0)} float. SQNR: dequantized output vs the same tensor of the '
                     'fp32 model on the held-back data (error accumulated up to that layer); red rows below '
                     f'{SQNR_WARN_DB:g} dB.</p>')
    parts.append(_layer_table(report))

    # plots
    parts.append('<h2 id="plots">Plots</h2>')
    sv = sqnr_svg(layers)
    if sv:
        parts.append(sv)
    elif int8:
        parts.append('<p class="note">No SQNR plot: the layers were not evaluated against fp32.</p>')
    sz = size_svg(report)
    if sz:
        parts.append(sz)
    to = tradeoff_svg(report)
    if to:
        parts.append(to)
    rv = ranges_svg(layers)
    if rv:
        parts.append(rv)
    hv = histograms_svg(layers)
    if hv:
        parts.append(hv)
    if equalization and equalization.get("layers"):
        svg = to_svg(equalization).decode()
        parts.append(svg.replace("<svg ", '<svg class="plot equalization" ', 1))
    parts += _mixed_sections(report)
    parts.append("</body></html>\n")
    return "\n".join(parts)
