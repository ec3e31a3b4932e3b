"""The inline SVG plots of ``report.html`` (no script, no network) and the HTML formatting helpers
the page shares with them (every string from the model escaped: :func:`esc`):

* :func:`sqnr_svg`: per-layer SQNR bars, the 20 dB line marked;
* :func:`sensitivity_svg`: the most damaging layers of the sensitivity (only this layer int8 /
  only this layer float);
* :func:`tradeoff_svg` (:func:`tradeoff_points`): output SQNR against predicted latency along the
  float-layer search with a budget, else against model.so size (int8 and fp32);
* :func:`size_svg` (:func:`size_bars`): parameter and library sizes fp32 vs int8;
* :func:`ranges_svg` (:func:`range_rows`): the activation ranges of the worst layers against the
  range the 8-bit grid can represent; :func:`histograms_svg`: their activation histograms.

See :mod:`.report_html` for the page.
"""
from __future__ import annotations

import math
from html import escape

SQNR_WARN_DB = 20.0              # below this a layer's output has lost most of 8 bits of precision
WORST_LAYERS = 8                 # activation-range plot: this many layers with the lowest SQNR


# ---- formatting helpers ----------------------------------------------------------------------------
def esc(x) -> str:
    return escape(str(x), quote=True)


def fmt_bytes(n) -> str:
    if n is None:
        return "—"
    n = int(n)
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MB"


def fmt_shape(s) -> str:
    return "?" if s is None else "×".join(str(d) for d in s) or "scalar"


def fmt_num(x, fmt: str = ".4g") -> str:
    return "—" if x is None else format(x, fmt)


def html_table(cls: str, head: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (then the caller escaped them)."""
    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else esc(c)}</td>" for c in r) + "</tr>\n" for r in rows)
    thead = f"<thead><tr>{h}</tr></thead>" if head else ""
    return f'<table class="{cls}">{thead}\n<tbody>\n{body}</tbody></table>\n'


def short_name(name: str, n: int = 38) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1):]


# ---- plots -----------------------------------------------------------------------------------------
def svg_head(cls: str, W: int, H: int, title: str, *, font_size: int = 11, title_y: int = 16) -> list[str]:
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
    out = svg_head("sqnr", W, H, f'SQNR of each layer\'s output vs fp32 (dB, '
           f'held-back data; red: below {SQNR_WARN_DB:g} dB)')
    for k in range(0, int(top) + 1, 10):
        out.append(f'<line x1="{x(k):.1f}" y1="{T - 6}" x2="{x(k):.1f}" y2="{T + len(rows) * BH}" stroke="#ddd"/>'
                   f'<text x="{x(k):.1f}" y="{T - 9}" text-anchor="middle">{k}</text>')
    for i, r in enumerate(rows):
        y = T + i * BH
        db = r["sqnr_db"]
        color = "#d9534f" if db < SQNR_WARN_DB else "#2a6fdb"
        out.append(f'<text x="{L - 6}" y="{y + BH - 4}" text-anchor="end">{esc(short_name(r["name"]))}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 2}" width="{x(db) - L:.1f}" height="{BH - 4}" fill="{color}">'
                   f'<title>{esc(r["name"])}: {db:.2f} dB</title></rect>'
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
    out = svg_head("sensitivity", W, H, 'Sensitivity: output SQNR gained by keeping '
           'only this layer float (dB vs all int8; ranked)')
    for i, r in enumerate(rows):
        y = T + i * BH
        g = r["gain_db"]
        alone = r.get("sqnr_only_int8_db")
        label = f"+{g:.2f} dB" + (f" (only it int8: {alone:.1f} dB)" if alone is not None else "")
        out.append(f'<text x="{L - 6}" y="{y + BH - 4}" text-anchor="end">{esc(short_name(r["layer"]))}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 2}" width="{x(g) - L:.1f}" height="{BH - 4}" fill="#e08a1e">'
                   f'<title>{esc(r["layer"])} ({esc(r["kind"])}): {esc(label)}</title></rect>'
                   f'<text x="{x(g) + 4:.1f}" y="{y + BH - 4}">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


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
    out = svg_head("tradeoff", W, H, f'Trade-off: {esc(ylab)} vs {esc(xlab)}') + [
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#888"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#888"/>',
           f'<text x="{(L + W - R) / 2:.0f}" y="{H - 12}" text-anchor="middle">{esc(xlab)}</text>',
           f'<text x="14" y="{(T + H - B) / 2:.0f}" transform="rotate(-90 14 {(T + H - B) / 2:.0f})" '
           f'text-anchor="middle">{esc(ylab)}</text>']
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
                   f'<title>{esc(label)}: {xv:.4g}, {shown}</title></circle>'
                   f'<text x="{X(xv) + 8:.1f}" y="{Y(yv) - 6:.1f}">{esc(label)}</text>')
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
    out = svg_head("size", W, H, 'Sizes (bytes; hatched: estimated)', font_size=12, title_y=18) + [
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#b0b0b0"/>'
           '<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern></defs>']
    for i, (label, n, est) in enumerate(bars):
        y = T + i * BH
        w = n / top * pw
        fill = "url(#hatch)" if est else ("#2a6fdb" if "int8" in label else "#7a7a7a")
        out.append(f'<text x="{L - 6}" y="{y + BH - 9}" text-anchor="end">{esc(label)}</text>'
                   f'<rect class="bar" x="{L}" y="{y + 3}" width="{w:.1f}" height="{BH - 8}" fill="{fill}"/>'
                   f'<text x="{L + w + 5:.1f}" y="{y + BH - 9}">{esc(fmt_bytes(n))}</text>')
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
    out = svg_head("ranges", W, H, f'Activation ranges of the {len(rows)} layers '
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
        out.append(f'<text x="{L - 6}" y="{y + 12}" text-anchor="end">{esc(short_name(r["name"]))}</text>'
                   f'<text x="{L - 6}" y="{y + 25}" text-anchor="end" fill="#666">{r["sqnr_db"]:.1f} dB, '
                   f'{esc(r.get("range_source", "")[:28])}</text>'
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
    out = svg_head("histograms", W, H, f'Activation histograms of the {len(rows)} '
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
        out.append(f'<text x="{x0}" y="{y0 - 4}">{esc(short_name(r["name"], 44))} — {r["sqnr_db"]:.1f} dB'
                   f'{f", 99.99 % on {used} levels" if used else ""}</text>'
                   f'<rect class="hist" x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#ccc"/>'
                   f'<path class="bins" d="{d}" fill="#2a6fdb"/>'
                   f'<text x="{x0}" y="{y0 + PH + 13}" fill="#666">{lo:.3g}</text>'
                   f'<text x="{x0 + PW}" y="{y0 + PH + 13}" text-anchor="end" fill="#666">{hi:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)
