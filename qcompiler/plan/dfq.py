"""Data-free quantization (Nagel et al., *Data-Free Quantization Through Weight Equalization and Bias
Correction*, ICCV 2019) as ``qcompile`` runs it: what ``--equalize`` and ``--bias-correction`` add to
the pass pipeline, and the equalization report written into the artifact.

    passes, opts = dfq_recipe(["fold-bn", ..., "quantize"], equalize=True, bias_correction="analytic")
    # passes: [..., "relu6-to-relu", "equalize", "absorb-bias", "bias-correct", "quantize"],
    # opts: quantize's bias_correction

Recipe (defaults chosen from the measurements in README.md, "Data-free quantization"):

* ``equalize``: ``relu6-to-relu`` (ReLU6 does not commute with a per-channel scale; the clamp at 6 is
  dropped, see that pass), then ``equalize`` (cross-layer equalization, HardSwish rescaled exactly)
  and ``absorb-bias`` (high-bias absorption, c checked against the calibration data so it never
  changes the function on it; on the project models and rapidocr it absorbs nothing then),
  inserted right before ``quantize`` (or at the end of a pipeline without it). Default: on with
  per-tensor weights (output SQNR +12.5 dB on fashion_mobilenet, +8.9 dB on rapidocr-cls with
  analytic bias correction), off with per-channel weights (each output channel has its own scale
  already; equalizing moves the imbalance into the next layer's rows: fashion −4.2 dB, rapidocr-cls
  +2.9 dB; the trained model loses, so off).
* ``bias_correction``: ``none``; ``analytic`` runs the ``bias-correct`` pass (E[x] from the
  BatchNorm statistics, no data) right before ``quantize`` and turns off the quantize pass's own
  correction; ``empirical`` is the quantize pass's correction from the calibration data (its
  default: E[x] measured, the rounding of the real weights simulated exactly).

The report: ``graph.meta["equalize"]`` (per producer layer, its per-output-channel weight ranges
max|W| before and after) as ``equalization.json`` and, for the most imbalanced layers, a
self-contained SVG (``equalization.svg``): per channel a bar for the range before (grey) and after
(blue), on a log scale, one panel per layer.
"""
from __future__ import annotations

import json
import math
from html import escape

from ..errors import UserError

BIAS_CORRECTION = ("none", "analytic", "empirical")
EQUALIZE_PASSES = ("relu6-to-relu", "equalize", "absorb-bias")
JSON_NAME, SVG_NAME = "equalization.json", "equalization.svg"


def equalize_default(per_channel: bool) -> bool:
    """``--equalize`` when neither it nor ``--no-equalize`` is given: on for per-tensor weights."""
    return not per_channel


def dfq_recipe(pipeline: list[str], *, equalize: bool, bias_correction: str) -> tuple[list[str], bool]:
    """The pipeline with the DFQ passes inserted before ``quantize``, and whether the quantize pass
    keeps its own (empirical) bias correction."""
    if bias_correction not in BIAS_CORRECTION:
        raise UserError(f"unknown bias correction '{bias_correction}'", "--bias-correction",
                        f"choose one of {', '.join(BIAS_CORRECTION)}")
    if bias_correction != "none" and "quantize" not in pipeline:
        raise UserError(f"{bias_correction} bias correction needs the quantize pass", "--bias-correction",
                        "add --dtype int8 (or 'quantize' to --passes), or drop --bias-correction")
    extra = [p for p in EQUALIZE_PASSES if equalize and p not in pipeline]
    if bias_correction == "analytic" and "bias-correct" not in pipeline:
        extra.append("bias-correct")
    at = pipeline.index("quantize") if "quantize" in pipeline else len(pipeline)
    return pipeline[:at] + extra + pipeline[at:], bias_correction == "empirical"


# ---- report ----------------------------------------------------------------------------------------
def _imbalance(r: list[float]) -> float:
    pos = [x for x in r if x > 0]
    return max(pos) / min(pos) if pos else 1.0


def report(meta: dict) -> dict:
    """The JSON report from ``graph.meta["equalize"]``: per layer the ranges and their max/min ratio
    before and after, most imbalanced (before) first."""
    layers = sorted(meta.get("layers", {}).items(), key=lambda kv: -_imbalance(kv[1]["before"]))
    return {
        "paper": "Nagel et al., Data-Free Quantization Through Weight Equalization and Bias Correction, ICCV 2019",
        "range": "max |W| per output channel",
        "sweeps": meta.get("sweeps"), "pairs": meta.get("pairs", []),
        "hardswish_rescaled": meta.get("hardswish", []),
        "layers": [{"name": n, "channels": len(v["before"]),
                    "ratio_before": round(_imbalance(v["before"]), 4),
                    "ratio_after": round(_imbalance(v["after"]), 4),
                    "before": [float(f"{x:.6g}") for x in v["before"]],
                    "after": [float(f"{x:.6g}") for x in v["after"]]} for n, v in layers],
    }


def to_json(rep: dict) -> bytes:
    return (json.dumps(rep, indent=1, sort_keys=True) + "\n").encode()


def to_svg(rep: dict, panels: int = 4) -> bytes:
    """Per-channel weight ranges before (grey) and after (blue) equalization for the ``panels`` most
    imbalanced layers: bars on a shared log10 axis, one panel per layer."""
    layers = rep["layers"][:panels]
    W, PH, L, T = 860, 190, 70, 56                     # width, panel height, left margin, title space
    H = T + max(1, len(layers)) * (PH + 30) + 10
    vals = [x for ly in layers for x in ly["before"] + ly["after"] if x > 0] or [1.0]
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    hi = hi if hi > lo else lo + 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14" font-weight="bold">Per-channel weight ranges max|W| before '
           'and after cross-layer equalization</text>',
           f'<rect x="{L}" y="30" width="10" height="10" fill="#b0b0b0"/><text x="{L + 14}" y="39">before</text>'
           f'<rect x="{L + 70}" y="30" width="10" height="10" fill="#2a6fdb"/><text x="{L + 84}" y="39">after</text>'
           f'<text x="{L + 130}" y="39">({rep.get("sweeps")} sweeps; log scale; the {len(layers)} most '
           'imbalanced layers)</text>']
    pw = W - L - 20
    for k, ly in enumerate(layers):
        y0 = T + k * (PH + 30) + 18
        n = ly["channels"]

        def ypos(x):
            x = max(x, 10.0 ** lo)
            return y0 + PH - (math.log10(x) - lo) / (hi - lo) * PH
        out.append(f'<text x="{L}" y="{y0 - 4}" font-weight="bold">{escape(ly["name"])}: {n} channels, '
                   f'max/min {ly["ratio_before"]:.3g} → {ly["ratio_after"]:.3g}</text>')
        out.append(f'<rect x="{L}" y="{y0}" width="{pw}" height="{PH}" fill="none" stroke="#444"/>')
        for e in range(lo, hi + 1):
            y = ypos(10.0 ** e)
            out.append(f'<line x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                       f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
        slot = pw / n
        bw = max(slot * 0.42, 0.5)
        for i, (b, a) in enumerate(zip(ly["before"], ly["after"])):
            x = L + i * slot + slot * 0.08
            for val, dx, color in ((b, 0.0, "#b0b0b0"), (a, bw, "#2a6fdb")):
                y = ypos(val)
                out.append(f'<rect x="{x + dx:.2f}" y="{y:.1f}" width="{bw:.2f}" height="{y0 + PH - y:.1f}" '
                           f'fill="{color}"/>')
        out.append(f'<text x="{L + pw}" y="{y0 + PH + 14}" text-anchor="end">output channel (0 … {n - 1})</text>')
    out.append("</svg>")
    return ("\n".join(out) + "\n").encode()


def artifact_files(meta: dict | None) -> dict[str, bytes]:
    """``{equalization.json, equalization.svg}`` for write_artifact's ``extra_files`` (empty when
    equalize did not run or found nothing)."""
    if not meta or not meta.get("layers"):
        return {}
    rep = report(meta)
    return {JSON_NAME: to_json(rep), SVG_NAME: to_svg(rep)}
