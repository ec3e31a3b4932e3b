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
  :func:`qcompiler.quant.report.layer_rows` -- op, output shape, precision, scale / zero point, weight
  scales, range source, SQNR vs fp32 on held-back data; fp32: every op of the compiled graph); with
  sparse or pruned weights a "weights zero" column (share of zeros, storage format), with per-layer
  costs (a budget, :mod:`qcompiler.quant.layer_cost`) an "int8 / float µs" column;
* **warnings** (:func:`warnings_of`): layers and outputs with SQNR below 20 dB, layers kept float,
  top-1 agreement below 99 %, accuracy lost, outputs that the float passes before quantize changed
  (e.g. relu6-to-relu; :func:`qcompiler.quant.report.passes_changed`), evaluation on calibration or
  random data, an int8 library that is not smaller than the fp32 one, an int8 layer whose kernel
  measured slower than float;
* **plots**, inline SVG (no script, no network): per-layer SQNR bars

      SQNR = 10 log10( Σ r² / Σ (dequantize(q) - r)² )  dB

  (the 20 dB line marked), the parameter and library sizes fp32 vs int8, the activation ranges of the
  worst layers (lowest SQNR) -- the calibrated range [min, max] against the range the 8-bit grid can
  represent, s (q_min - z) .. s (q_max - z) -- and, when ``equalize`` ran, the per-channel weight ranges
  before/after cross-layer equalization (:func:`qcompiler.quant.dfq.to_svg`; Nagel et al., "Data-Free
  Quantization Through Weight Equalization and Bias Correction", ICCV 2019); the trade-off
  (:func:`tradeoff_points`): output SQNR against predicted latency along the float-layer search
  with a budget, else against model.so size (int8 and fp32).
* **sensitivity and float layers** (``qcompile --sensitivity`` / ``--min-sqnr`` /
  ``--max-accuracy-drop``; :mod:`qcompiler.quant.mixed`): the ranked per-layer sensitivity bars (SQNR
  gained by keeping only that layer float) and each float layer with the reason it is float (the
  budget and its measured gain, ``--keep-float``, a default rule, or the quantize plan).

Activation histograms come from the held-back evaluation (:func:`qcompiler.quant.report.evaluate`):
each quantized layer's fp32 values counted on the 256 levels of its grid; the report keeps the
histograms of the lowest-SQNR layers and, for every layer, how many levels hold 99.99 % of the
values. Fewer than 26 (a tenth of the grid) on a calibrated range is the "range dominated by
outliers" warning.

Every string that comes from the model (op, value, input names) is HTML-escaped.

    data = compile_data(graph, pm, model="m.onnx", target="x86", dtype="fp32", ops_before=..., ...)
    html = render({**data, "layers": float_layers(graph)})
"""
from __future__ import annotations

import math
from html import escape
from typing import Any

from .sparse.report import worth_showing

SQNR_WARN_DB = 20.0              # below this a layer's output has lost most of 8 bits of precision
AGREEMENT_WARN = 0.99
WORST_LAYERS = 8                 # activation-range plot: this many layers with the lowest SQNR
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
    from .quant.report import passes_changed
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
    if report.get("dtype") == "int8":
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
        from .quant.report import OUTLIER_LEVELS
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


# ---- formatting helpers ----------------------------------------------------------------------------
def _e(x) -> str:
    return escape(str(x), quote=True)


def _bytes(n) -> str:
    if n is None:
        return "—"
    n = int(n)
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MB"


def _shape(s) -> str:
    return "?" if s is None else "×".join(str(d) for d in s) or "scalar"


def _num(x, fmt: str = ".4g") -> str:
    return "—" if x is None else format(x, fmt)


def _table(cls: str, head: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (then the caller escaped them)."""
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    thead = f"<thead><tr>{h}</tr></thead>" if head else ""
    return f'<table class="{cls}">{thead}\n<tbody>\n{body}</tbody></table>\n'


def _short(name: str, n: int = 38) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1):]


# ---- plots -----------------------------------------------------------------------------------------
def _svg_head(cls: str, W: int, H: int, title: str, *, font_size: int = 11, title_y: int = 16) -> list[str]:
    """The opening of every plot: the ``<svg class="plot CLS">`` element, a white background and
    the bold title (``title`` already escaped)."""
    return [f'<svg class="plot {cls}" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="{font_size}">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="10" y="{title_y}" font-size="14" font-weight="bold">{title}</text>']


def sqnr_svg(layers: list[dict]) -> str:
    """Horizontal bars, one per layer with a measured SQNR; red below SQNR_WARN_DB."""
    rows = [r for r in layers if r.get("sqnr_db") is not None]
    if not rows:
        return ""
    L, W, BH, T = 300, 900, 16, 40
    top = max(60.0, max(r["sqnr_db"] for r in rows))
    top = 10 * math.ceil(top / 10)
    pw = W - L - 70
    H = T + len(rows) * BH + 30
    x = lambda db: L + max(db, 0.0) / top * pw                            # noqa: E731
    out = _svg_head("sqnr", W, H, f'SQNR of each layer\'s output vs fp32 (dB, '
           f'held-back data; red: below {SQNR_WARN_DB:g} dB)')
    for k in range(0, int(top) + 1, 10):
        out.append(f'<line x1="{x(k):.1f}" y1="{T - 6}" x2="{x(k):.1f}" y2="{T + len(rows) * BH}" stroke="#ddd"/>'
                   f'<text x="{x(k):.1f}" y="{T - 9}" text-anchor="middle">{k}</text>')
    for i, r in enumerate(rows):
        y = T + i * BH
        db = r["sqnr_db"]
        color = "#d9534f" if db < SQNR_WARN_DB else "#2a6fdb"
        out.append(f'<text x="{L - 6}" y="{y + BH - 4}" text-anchor="end">{_e(_short(r["name"]))}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 2}" width="{x(db) - L:.1f}" height="{BH - 4}" fill="{color}">'
                   f'<title>{_e(r["name"])}: {db:.2f} dB</title></rect>'
                   f'<text x="{x(db) + 4:.1f}" y="{y + BH - 4}">{db:.1f}</text>')
    out.append(f'<line x1="{x(SQNR_WARN_DB):.1f}" y1="{T - 6}" x2="{x(SQNR_WARN_DB):.1f}" '
               f'y2="{T + len(rows) * BH}" stroke="#d9534f" stroke-dasharray="4 3"/>')
    out.append("</svg>")
    return "\n".join(out)


SENSITIVITY_ROWS = 40             # sensitivity plot: the most damaging layers shown


def sensitivity_svg(rows: list[dict], n: int = SENSITIVITY_ROWS) -> str:
    """Ranked bars, one per layer (most damaging first): the output SQNR gained by keeping only
    that layer float, vs all int8 (dB; negative gains drawn as 0), labelled with the SQNR when
    only that layer is int8."""
    rows = [r for r in rows if r.get("gain_db") is not None][:n]
    if not rows:
        return ""
    L, W, BH, T = 300, 900, 16, 40
    top = max(1.0, max(r["gain_db"] for r in rows))
    pw = W - L - 170
    H = T + len(rows) * BH + 30
    x = lambda db: L + max(db, 0.0) / top * pw                            # noqa: E731
    out = _svg_head("sensitivity", W, H, 'Sensitivity: output SQNR gained by keeping '
           'only this layer float (dB vs all int8; ranked)')
    for i, r in enumerate(rows):
        y = T + i * BH
        g = r["gain_db"]
        alone = r.get("sqnr_only_int8_db")
        label = f"+{g:.2f} dB" + (f" (only it int8: {alone:.1f} dB)" if alone is not None else "")
        out.append(f'<text x="{L - 6}" y="{y + BH - 4}" text-anchor="end">{_e(_short(r["layer"]))}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 2}" width="{x(g) - L:.1f}" height="{BH - 4}" fill="#e08a1e">'
                   f'<title>{_e(r["layer"])} ({_e(r["kind"])}): {_e(label)}</title></rect>'
                   f'<text x="{x(g) + 4:.1f}" y="{y + BH - 4}">{_e(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _mixed_sections(report: dict) -> list[str]:
    """The sensitivity plot and the float layers with the reason each is float."""
    parts = []
    sens = report.get("sensitivity")
    if sens and sens.get("rows"):
        parts.append('<h2 id="sensitivity">Sensitivity</h2>')
        parts.append(f'<p class="note">{len(sens["rows"])} quantizable layers measured on {sens.get("samples")} '
                     f'samples of the {_e(sens.get("data", ""))}: SQNR of the model output vs fp32 with only the '
                     'layer int8 (everything else float) and with only the layer float (everything else int8).</p>')
        parts.append(sensitivity_svg(sens["rows"]))
    sel = report.get("selection")
    if sel:
        parts.append('<h2 id="float-layers">Float layers</h2>')
        if sel.get("budget") is not None:
            u = sel.get("unit", "dB")
            b = (f"accuracy drop at most {sel['budget_points']:g} points" if "budget_points" in sel
                 else f"output SQNR at least {sel['budget']:g} dB")
            from .quant.mixed import criterion_text
            held = sel.get("evaluation") or {}
            hb = ("" if "met" not in held else
                  f' On the {held.get("samples")} evaluation samples ({"held back" if held.get("held_back") else "NOT held back"}): '
                  + (f'accuracy drop {held["accuracy_drop_points"]:.2f} points' if "accuracy_drop_points" in held else
                     'output SQNR ' + ", ".join("—" if d is None else f"{d:.2f}" for d in held.get("output_sqnr_db", []))
                     + " dB") + f', budget {"met" if held["met"] else "NOT met"}.')
            pt = (f' Point estimate on the {_e(sel.get("samples"))} selection samples: {_e(sel.get("point"))} {_e(u)} '
                  f'(all int8: {_e(sel.get("baseline_point"))} {_e(u)}).' if "point" in sel and criterion_text(sel) else "")
            parts.append(f'<p class="note">Budget: {_e(b)}{_e(criterion_text(sel))}; {"met" if sel.get("met") else "NOT met"} with '
                         f'{len(sel.get("float_layers", []))} float layer(s): {_e(sel.get("score"))} {_e(u)} '
                         f'(all int8: {_e(sel.get("baseline"))} {_e(u)}; {_e(sel.get("evaluations"))} '
                         f'evaluations, greedy with re-evaluation, then pruned).{pt}{_e(hb)}</p>')
        reasons = sel.get("float_layer_reasons", {})
        parts.append(_table("float-reasons", ["layer", "why float"], [[k, v] for k, v in reasons.items()])
                     if reasons else '<p class="note">none: every quantizable layer is int8</p>')
    return parts


def tradeoff_points(report: dict) -> tuple[str, str, list[tuple[float, float, str]], float | None]:
    """(x axis, y axis, points (x, y, label), budget) of the trade-off plot. With a latency-aware
    selection: output SQNR on the selection samples vs predicted latency, one point per step of the
    search (all int8 first, the chosen set last) and all float; otherwise output SQNR on the
    held-back data vs model.so size, int8 and fp32. y = +inf (fp32: exact) is drawn at the top."""
    sel, lat = report.get("selection") or {}, report.get("latency") or {}
    if lat.get("layers") and sel.get("steps") and all("cost" in st for st in sel["steps"]):
        pts = [(sel["baseline_cost_ms"], sel["baseline"], "all int8")]
        pts += [(st["cost"], st["score"], f"{st['size']} float") for st in sel["steps"]]
        chosen = (sel["cost_ms"], sel["score"])
        pts = [p for p in pts if (p[0], p[1]) != chosen]           # the last step is the chosen set
        pts.append((*chosen, f"chosen: {len(sel['float_layers'])} float"))
        pts.append((lat["float_latency_ms"], math.inf, "all float (exact)"))
        return "predicted latency (ms, per-layer kernels + Q/DQ)", "output SQNR (dB, selection samples; the budget's bound)", pts, \
            sel.get("budget") if sel.get("unit", "dB") == "dB" else None
    sz, outs = report.get("size", {}), (report.get("evaluation") or {}).get("outputs", [])
    sq = outs[0].get("sqnr_db") if outs else None
    if sq is None or sz.get("library_int8_bytes") is None or sz.get("library_fp32_bytes") is None:
        return "", "", [], None
    return "model.so size (KB)", "output SQNR (dB, held-back data)", [
        (sz["library_int8_bytes"] / 1024, sq, "int8"),
        (sz["library_fp32_bytes"] / 1024, math.inf,
         "fp32" + (" (estimated size)" if sz.get("library_fp32_estimated") else ""))], None


def tradeoff_svg(report: dict) -> str:
    xlab, ylab, pts, budget = tradeoff_points(report)
    if len(pts) < 2:
        return ""
    W, H, L, R, T, B = 900, 360, 70, 40, 40, 50
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts if math.isfinite(p[1])] + ([budget] if budget is not None else [])
    x0, x1 = min(xs), max(xs)
    pad = (x1 - x0) * 0.08 or max(abs(x1), 1e-9) * 0.1
    x0, x1 = x0 - pad, x1 + pad
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    ypad = (y1 - y0) * 0.1 or 1.0
    y0, y1 = y0 - ypad, y1 + 2 * ypad                      # the top band holds "exact" (fp32)
    X = lambda v: L + (v - x0) / (x1 - x0) * (W - L - R)                      # noqa: E731
    Y = lambda v: T + (1 - ((y1 if not math.isfinite(v) else v) - y0) / (y1 - y0)) * (H - T - B)   # noqa: E731
    out = _svg_head("tradeoff", W, H, f'Trade-off: {_e(ylab)} vs {_e(xlab)}') + [
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#888"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#888"/>',
           f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">{_e(xlab)}</text>',
           f'<text x="14" y="{(T + H - B) / 2:.0f}" transform="rotate(-90 14 {(T + H - B) / 2:.0f})" '
           f'text-anchor="middle">{_e(ylab)}</text>']
    for k in range(5):
        xv, yv = x0 + (x1 - x0) * k / 4, y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{X(xv):.1f}" y="{H - B + 14}" text-anchor="middle">{xv:.3g}</text>'
                   f'<text x="{L - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    if budget is not None:
        out.append(f'<line x1="{L}" y1="{Y(budget):.1f}" x2="{W - R}" y2="{Y(budget):.1f}" stroke="#d9534f" '
                   f'stroke-dasharray="4 3"/><text x="{W - R}" y="{Y(budget) - 4:.1f}" text-anchor="end" '
                   f'fill="#d9534f">budget {budget:g} dB</text>')
    for i, (xv, yv, label) in enumerate(pts):
        last = label.startswith("chosen") or (i == 0 and len(pts) == 2)
        color = "#7a7a7a" if not math.isfinite(yv) else ("#2a6fdb" if last else "#9bbcf0")
        shown = "exact" if not math.isfinite(yv) else f"{yv:.2f} dB"
        out.append(f'<circle class="point" cx="{X(xv):.1f}" cy="{Y(yv):.1f}" r="{6 if last else 4}" fill="{color}">'
                   f'<title>{_e(label)}: {xv:.4g}, {shown}</title></circle>'
                   f'<text x="{X(xv) + 8:.1f}" y="{Y(yv) - 6:.1f}">{_e(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def size_bars(report: dict) -> list[tuple[str, int, bool]]:
    """(label, bytes, estimated) of the size plot, from what the report measured."""
    sz = report.get("size", {})
    bars = []
    if sz.get("params_fp32_bytes") is not None:
        bars.append(("parameters fp32", sz["params_fp32_bytes"], False))
    if sz.get("params_int8_bytes") is not None:
        bars.append(("parameters int8", sz["params_int8_bytes"], False))
    if sz.get("library_fp32_bytes") is not None:
        bars.append(("model.so fp32" + (" (estimated)" if sz.get("library_fp32_estimated") else ""),
                     sz["library_fp32_bytes"], bool(sz.get("library_fp32_estimated"))))
    if sz.get("library_int8_bytes") is not None:
        bars.append(("model.so int8", sz["library_int8_bytes"], False))
    return bars


def size_svg(report: dict) -> str:
    bars = size_bars(report)
    if not bars:
        return ""
    L, W, BH, T = 200, 900, 26, 36
    top = max(b for _, b, _ in bars) or 1
    pw = W - L - 110
    H = T + len(bars) * BH + 12
    out = _svg_head("size", W, H, 'Sizes (bytes; hatched: estimated)', font_size=12, title_y=18) + [
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#b0b0b0"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern></defs>']
    for i, (label, n, est) in enumerate(bars):
        y = T + i * BH
        w = n / top * pw
        fill = "url(#hatch)" if est else ("#2a6fdb" if "int8" in label else "#7a7a7a")
        out.append(f'<text x="{L - 6}" y="{y + BH - 9}" text-anchor="end">{_e(label)}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 3}" width="{w:.1f}" height="{BH - 8}" fill="{fill}"/>'
                   f'<text x="{L + w + 5:.1f}" y="{y + BH - 9}">{_e(_bytes(n))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def range_rows(layers: list[dict], n: int = WORST_LAYERS) -> list[dict]:
    """The ``n`` quantized layers with the lowest measured SQNR (graph order among equals)."""
    q = [r for r in layers if r.get("range") is not None and r.get("sqnr_db") is not None]
    return sorted(q, key=lambda r: r["sqnr_db"])[:n]


def ranges_svg(layers: list[dict]) -> str:
    """Per worst layer: the representable range of its 8-bit grid (grey) and, where the range was
    calibrated, the calibrated [min, max] (blue), each on the layer's own axis ±max|x|."""
    rows = range_rows(layers)
    if not rows:
        return ""
    L, W, RH, T = 300, 900, 42, 44
    pw = W - L - 40
    H = T + len(rows) * RH + 10
    out = _svg_head("ranges", W, H, f'Activation ranges of the {len(rows)} layers '
           'with the lowest SQNR', title_y=14) + [
           f'<rect x="{L}" y="22" width="10" height="10" fill="#c8c8c8"/><text x="{L + 14}" y="31">'
           'representable by the 8-bit grid</text>'
           f'<rect x="{L + 200}" y="22" width="10" height="10" fill="#2a6fdb"/><text x="{L + 214}" y="31">'
           'calibrated [min, max]</text>']
    for i, r in enumerate(rows):
        y = T + i * RH
        spans = [r["range"]] + ([r["calibrated_range"]] if r.get("calibrated_range") else [])
        m = max(abs(v) for s in spans for v in s) or 1.0
        x = lambda v: L + (v + m) / (2 * m) * pw                           # noqa: E731
        lo, hi = r["range"]
        out.append(f'<text x="{L - 6}" y="{y + 12}" text-anchor="end">{_e(_short(r["name"]))}</text>'
                   f'<text x="{L - 6}" y="{y + 25}" text-anchor="end" fill="#666">{r["sqnr_db"]:.1f} dB, '
                   f'{_e(r.get("range_source", "")[:28])}</text>'
                   f'<line x1="{x(0):.1f}" y1="{y}" x2="{x(0):.1f}" y2="{y + 25}" stroke="#444"/>'
                   f'<rect class="range" x="{x(lo):.1f}" y="{y + 2}" width="{max(x(hi) - x(lo), 1):.1f}" '
                   f'height="11" fill="#c8c8c8"><title>representable {lo:.4g} .. {hi:.4g}</title></rect>'
                   f'<text x="{L}" y="{y + 35}" fill="#666">{-m:.3g}</text>'
                   f'<text x="{x(0):.1f}" y="{y + 35}" text-anchor="middle" fill="#666">0</text>'
                   f'<text x="{L + pw}" y="{y + 35}" text-anchor="end" fill="#666">{m:.3g}</text>')
        if r.get("calibrated_range"):
            a, b = r["calibrated_range"]
            out.append(f'<rect class="calibrated" x="{x(a):.1f}" y="{y + 15}" width="{max(x(b) - x(a), 1):.1f}" '
                       f'height="8" fill="#2a6fdb"><title>calibrated {a:.4g} .. {b:.4g}</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def histograms_svg(layers: list[dict]) -> str:
    """Per layer that carries one (the lowest SQNR ones): the histogram of its fp32 values over
    the levels of its 8-bit grid (log counts; the end levels also count the clipped values)."""
    rows = [r for r in layers if r.get("histogram")]
    if not rows:
        return ""
    cols, PW, PH, L, T = 2, 420, 110, 20, 34
    W = L + cols * (PW + 20)
    H = T + -(-len(rows) // cols) * (PH + 44)
    out = _svg_head("histograms", W, H, f'Activation histograms of the {len(rows)} '
           'layers with the lowest SQNR: fp32 values on the 256 levels of the 8-bit grid (log count)')
    for i, r in enumerate(rows):
        h = r["histogram"]
        x0, y0 = L + (i % cols) * (PW + 20), T + (i // cols) * (PH + 44) + 14
        top = math.log10(max(h) + 1) or 1.0
        bw = PW / len(h)
        d = "".join(f"M{x0 + k * bw:.1f},{y0 + PH}v{-PH * math.log10(c + 1) / top:.1f}h{bw:.2f}V{y0 + PH}z"
                    for k, c in enumerate(h) if c)
        lo, hi = r["range"]
        used = r.get("levels_99_99")
        out.append(f'<text x="{x0}" y="{y0 - 4}">{_e(_short(r["name"], 44))} — {r["sqnr_db"]:.1f} dB'
                   f'{f", 99.99 % on {used} levels" if used else ""}</text>'
                   f'<rect class="hist" x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#ccc"/>'
                   f'<path class="bins" d="{d}" fill="#2a6fdb"/>'
                   f'<text x="{x0}" y="{y0 + PH + 13}" fill="#666">{lo:.3g}</text>'
                   f'<text x="{x0 + PW}" y="{y0 + PH + 13}" text-anchor="end" fill="#666">{hi:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)


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
    int8 = report.get("dtype") == "int8"
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
        cells = [f'<td class="n">{i}</td>', f'<td class="name">{_e(r["name"])}</td>', f"<td>{_e(r['kind'])}</td>",
                 f"<td>{_e(_shape(r.get('shape')))}</td>", f"<td>{_e(r.get('precision', ''))}</td>"]
        low = False
        if int8:
            wt = ""
            if "weight" in r:
                w = r["weight"]
                wt = (f"per channel ({w['count']}): {w['scale_min']:.3g} .. {w['scale_max']:.3g}" if w["per_channel"]
                      else f"per tensor: {w['scale_min']:.3g}")
            sq = r.get("sqnr_db")
            low = sq is not None and sq < SQNR_WARN_DB
            sqs = _num(sq, ".2f") if sq is not None else ("exact" if r.get("note") == "exact (no error)"
                                                          else "—")
            src = r.get("range_source", r.get("reason", ""))
            cells += [f'<td class="n">{_e(_num(r.get("scale")))}</td>', f'<td class="n">{_e(r.get("zero_point", "—"))}</td>',
                      f"<td>{_e(wt)}</td>", f"<td>{_e(src)}</td>", f'<td class="n">{_e(sqs)}</td>']
        if sparse:
            sp = sparse.get(r["name"])
            text = f"{100 * sp['sparsity']:.0f} % {sp['format']}" if sp else ""
            cells.append(f'<td class="n">{_e(text)}</td>')
        if lat:
            t = lat.get(r["name"])
            text = f"{1000 * t['int8_ms']:.1f} / {1000 * t['float_ms']:.1f}" if t else ""
            slow = " slow" if t and t["int8_ms"] > t["float_ms"] else ""
            cells.append(f'<td class="n{slow}">{_e(text)}</td>')
        rows.append(('<tr class="low">' if low else "<tr>") + "".join(cells) + "</tr>")
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    return (f'<table class="layers"><thead><tr>{h}</tr></thead>\n<tbody>\n' + "\n".join(rows)
            + "\n</tbody></table>\n")


def render(report: dict, *, equalization: dict | None = None) -> str:
    """The report as one HTML page (UTF-8 text, no script, no external resource). ``equalization``:
    the equalize pass's report (:func:`qcompiler.quant.dfq.report`), plotted when given."""
    from .quant.report import passes_changed
    int8 = report.get("dtype") == "int8"
    s = report.get("summary", {})
    title = f"qcompiler build report: {report.get('model') or 'model'} ({report.get('dtype', '?')}, " \
            f"{report.get('target', '?')})"
    parts = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(title)}</title><style>{CSS}</style></head><body>", f"<h1>{_e(title)}</h1>"]

    # summary
    parts.append('<h2 id="summary">Model</h2>')
    info = [["model file", _e(report.get("model", "?"))], ["target", _e(report.get("target", "?"))],
            ["dtype", _e(report.get("dtype", "?"))]]
    for kind in ("inputs", "outputs"):
        info.append([kind, "<br>".join(f'<span class="name">{_e(v["name"])}</span>: {_e(_shape(v["shape"]))} '
                                       f'{_e(v["dtype"])}' for v in s.get(kind, []))])
    pb, pa = s.get("params_before"), s.get("params_after")
    if pb and pa:
        info.append(["parameters", _e(f"{pb['count']:,} ({_bytes(pb['bytes'])}) before the passes, "
                                      f"{pa['count']:,} ({_bytes(pa['bytes'])}) after")])
    if "ops_before" in s:
        info.append(["ops", _e(f"{s['ops_before']} before the passes, {s['ops_after']} after")])
    if int8:
        cal = report.get("calibration", {})
        info.append(["quantization", _e("; ".join(f"{k}: {v}" for k, v in sorted(report.get("scheme", {}).items())
                                               if isinstance(v, (str, int, float))))])
        info.append(["calibration", _e(f"{cal.get('source')}, {cal.get('samples')} samples, range method "
                                       f"{report.get('range_method')}")])
        ev = report.get("evaluation", {})
        if ev.get("samples"):
            info.append(["evaluation", _e(f"{ev['samples']} samples of {ev.get('source')} from sample "
                                          f"{ev.get('first_sample')}"
                                          f"{', held back from calibration' if ev.get('held_back') else ''}")])
            for o in ev.get("outputs", []):
                t = f"SQNR {_num(o.get('sqnr_db'), '.2f')} dB"
                if "top1_agreement" in o:
                    t += (f", top-1 agreement with fp32 {100 * o['top1_agreement']:.2f} % "
                          f"({o['top1_agree_rows']}/{o['top1_rows']})")
                if passes_changed(o):
                    t += f"; the float passes before quantize alone: {o['float_passes_sqnr_db']:.2f} dB"
                info.append([f"output {_e(o['name'])}", _e(t)])
            if "accuracy" in ev:
                info.append(["top-1 accuracy", _e(f"fp32 {100 * ev['accuracy']['fp32']:.2f} %, "
                                                  f"int8 {100 * ev['accuracy']['int8']:.2f} %")])
    parts.append(_table("summary", [], info, raw=True))

    # warnings
    warns = report.get("warnings")
    if warns is None:
        warns = warnings_of(report)
    parts.append('<h2 id="warnings">Warnings</h2>')
    parts.append('<ul class="warnings">' + "".join(f"<li>{_e(w)}</li>" for w in warns) + "</ul>" if warns
                 else '<p class="note">none</p>')

    # passes and ops
    passes = report.get("passes", [])
    parts.append('<h2 id="passes">Pass pipeline</h2>')
    timed = any("seconds" in p for p in passes)
    head = ["#", "pass", "changed", "ops before", "ops after"] + (["seconds"] if timed else [])
    prow = [[str(i), p["name"], "yes" if p["changed"] else "no", str(p["ops_before"]), str(p["ops_after"])]
            + ([_num(p.get("seconds"), ".4f")] if timed else []) for i, p in enumerate(passes)]
    parts.append(_table("passes", head, prow))
    if not timed:
        parts.append('<p class="note">Time per pass: compile with <code>--time-passes</code> to record it here '
                     '(left out by default: it differs between runs, and this file is listed with its '
                     'sha256 in the reproducible manifest.json).</p>')
    ops = report.get("ops", {})
    if ops:
        kinds = sorted(set(ops.get("before", {})) | set(ops.get("after", {})),
                       key=lambda k: (-ops.get("after", {}).get(k, 0), -ops.get("before", {}).get(k, 0), k))
        parts.append("<h3>Ops before and after the passes</h3>")
        parts.append(_table("ops", ["op", "before", "after"],
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
        from .quant.dfq import to_svg
        svg = to_svg(equalization).decode()
        parts.append(svg.replace("<svg ", '<svg class="plot equalization" ', 1))
    parts += _mixed_sections(report)
    parts.append("</body></html>\n")
    return "\n".join(parts)
