"""The int8 build report: ``OUT/report.json`` and the table ``qcompile --dtype int8`` prints.

Per quantized layer, in graph order (every op whose result is a quantized value: QuantizeLinear,
QLinearConv/Gemm/Add/pooling, Requantize, and the ops that carry their input's params such as
MaxPool or Reshape; plus the ops the quantizer kept float): name, op kind, precision, output scale
and zero point, output shape, the weight scales (per channel: count, min, max), how the range was set, and

    SQNR = 10 log10( Σ r² / Σ (dequantize(q) - r)² )  dB

of the layer's output q against the same tensor r of the fp32 model, on data held back from
calibration (the noise of ONE uniform 8-bit quantization of a full-range signal is about 40-50
dB; what the table shows is the error accumulated up to that layer). The sums are accumulated in
float64 batch by batch, so no sample is kept after its batch. For the model outputs the same SQNR,
the top-1 agreement (argmax over the last axis, per row) and, when the data has labels, the
top-1 accuracy of both models.

Activation histograms, on the same held-back data: each layer's fp32 values counted on the 256
levels of its 8-bit grid (:func:`grid_histogram`); ``levels_99_99`` per layer is the narrowest
window of levels holding 99.99 % of them (:func:`levels_holding`: fewer than ``OUTLIER_LEVELS``
means the range was set by outliers), and the ``HIST_LAYERS`` layers with the lowest SQNR keep
their whole histogram for the HTML report.

Engines: the int8 model runs in :mod:`qcompiler.quant.reference` (the integer oracle the
compiled kernels match bit for bit, tested in tests/codegen/test_x86_int8.py); the fp32 models run
in onnxruntime, op by op as the calibration runs them (float32; the reference interpreter's float
kernels, which accumulate in float64, where onnxruntime cannot run a graph). Two fp32 models, because the float
passes before ``quantize`` need not preserve results (``relu6-to-relu``, which ``--equalize`` and
so ``--per-tensor`` insert, drops the clamp at 6: 33.7 dB on fashion_mobilenet; pruning; analytic
bias correction):

* the layer rows compare with the graph the quantize pass started from, as it saw it after
  splitting fused residual blocks (``ctx.data["quantize.float_graph"]``: numerically the same
  graph, in which every split-off value has its fp32 tensor; equalization rescales channels, so
  its intermediate values exist only there). Quantized values are matched to float values with
  ``graph.meta["quant"]["float_values"]``;
* the model outputs (SQNR, top-1 agreement, fp32 accuracy) compare with ``given``, the model as
  the user gave it (the graph as imported, before any pass): what the artifact is judged against
  (``qcompile run`` vs ONNX Runtime on the ONNX file), so the output SQNR is the artifact's, within
  float rounding. Each output also says what the float passes alone did to it
  (``float_passes_sqnr_db``: the float graph above against ``given``; None when equal). Without
  ``given`` (a caller that has no such graph), the outputs compare with the float graph.

Sizes: parameter bytes (constants) of both graphs and the int8 ``model.so``; the fp32 model.so is
estimated as ``int8 model.so - int8 parameter bytes + fp32 parameter bytes`` (marked estimated:
compiling twice would double the build time; tests/quant/test_report.py measures it for real).

    rep = build_report(fp32, int8, eval_data, calibration={...}, target="x86")
    rep = with_library_size(rep, (OUT / "model.so").stat().st_size)
    (OUT / REPORT).write_bytes(to_json(rep)); print(format_table(rep))

The JSON is deterministic (sorted keys, rounded floats, no timestamps or paths of temp folders).
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import UserError
from ..ir.graph import Graph, Op
from ..ir.types import INT_RANGES, dequantize, is_fp8, np_dtype, storage_range
from ..quant import reference
from ..quant.calibrate import float_runner
from ..quant.fp8 import Fp8Format

REPORT = "report.json"
FORMAT_VERSION = 1
MEMORY_BUDGET = 256 << 20          # bytes of intermediate tensors per evaluation chunk
MAX_CHUNK = 64                     # samples per evaluation chunk at most
ROUND = 4                          # decimals kept for dB and ratios in the JSON
HIST_LAYERS = 6                    # layers (lowest SQNR) whose activation histogram the report keeps
OUTLIER_LEVELS = 26                # 99.99 % of values on fewer of the 256 levels: range set by outliers
# below this output SQNR of the float graph against the model as given, the float passes changed the
# model (float32 rounding alone stays far above: 137.8 dB on fashion_mobilenet; relu6-to-relu 33.7 dB)
PASSES_CHANGED_DB = 80.0


def grid_histogram(x: np.ndarray, qp) -> np.ndarray:
    """How many values of the fp32 activation ``x`` land on each level of its 8-bit grid
    (round(x / s) + z, clamped: the end levels also count the clipped values)."""
    lo, hi = INT_RANGES[qp.storage]
    s, z = float(qp.scale[0]), int(qp.zero_point[0])
    q = np.clip(np.rint(np.asarray(x, np.float64).ravel() / s) + z, lo, hi).astype(np.int64) - lo
    return np.bincount(q, minlength=hi - lo + 1)


def levels_holding(hist: np.ndarray, share: float = 0.9999) -> int:
    """The fewest consecutive levels holding ``share`` of the values (a sliding window over the
    histogram; the width a range would need for them)."""
    total = int(hist.sum())
    if total == 0:
        return 0
    need = share * total
    c = np.concatenate([[0], np.cumsum(hist)])
    for w in range(1, len(hist) + 1):
        if np.max(c[w:] - c[:-w]) >= need:
            return w
    return len(hist)

# range_source of a layer: how its output params were set
CALIBRATED, INHERITED, CONCAT = "calibrated", "input's params", "the Concat output's params"


# ---- evaluation data -------------------------------------------------------------------------------
@dataclass
class EvalData:
    """Held-back evaluation data: ``take`` samples of ``dataset`` after its first ``skip``."""
    dataset: Any                   # a qcompiler.quant.data.Dataset (re-iterable, streams)
    skip: int
    take: int
    source: str                    # what the report says about the data
    held_back: bool = True         # False: no sample was left over, evaluated on calibration samples
    random: bool = False

    def describe(self) -> dict:
        return {"source": self.source, "samples": self.take, "first_sample": self.skip,
                "held_back": self.held_back, "random": self.random}


def chunks(data: EvalData, size: int, batch: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
    """(feed, labels) of ``size`` samples (the last one a multiple of ``batch``) from samples
    ``skip .. skip + take - 1`` of the stream; skipped samples are read and dropped."""
    lo_all, hi_all = data.skip, data.skip + data.take
    parts: list[tuple[dict, np.ndarray | None]] = []
    have, pos = 0, 0

    def cut(n: int):
        nonlocal parts, have
        feeds = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
        labels = np.concatenate([p[1] for p in parts]) if all(p[1] is not None for p in parts) else None
        out = ({k: a[:n] for k, a in feeds.items()}, labels[:n] if labels is not None else None)
        rest = ({k: a[n:] for k, a in feeds.items()}, labels[n:] if labels is not None else None)
        have -= n
        parts = [rest] if have else []
        return out

    for feed, labels in data.dataset.with_labels():
        n = len(next(iter(feed.values())))
        lo, hi = max(lo_all - pos, 0), min(hi_all - pos, n)
        pos += n
        if hi > lo:
            parts.append(({k: np.asarray(a[lo:hi]) for k, a in feed.items()},
                          None if labels is None else np.asarray(labels[lo:hi])))
            have += hi - lo
            while have >= size:
                yield cut(size)
        if pos >= hi_all:
            break
    whole = have // batch * batch
    if whole < have:
        warnings.warn(f"report: {have - whole} evaluation sample(s) do not fill the model's batch of {batch}; "
                      "skipped", stacklevel=2)
    if whole:
        yield cut(whole)


# ---- layers ------------------------------------------------------------------------------------------
def _is_layer(op: Op, float_layers: set[str]) -> bool:
    if op.kind == "DequantizeLinear" or len(op.results) != 1:      # multi-result ops (Split) are not layers
        return False
    return (op.result.type.quant is not None or op.name in float_layers
            or op.kind in ("QLinearConv", "QLinearGemm", "DynamicQLinearGemm"))


def quantized_ops(graph: Graph) -> list[Op]:
    """The ops whose result is a quantized value, in graph order (what the report calls the
    quantized layers)."""
    return [op for op in graph.ops if len(op.results) == 1 and op.result.type.quant is not None]


def _method(scheme: dict, percentile: float | None) -> str:
    m = scheme.get("method", "?")
    return f"percentile {percentile:g}" if m == "percentile" and percentile is not None else m


def _weight_row(op: Op) -> dict:
    w = op.operands[2 if op.kind == "DynamicQLinearGemm" else 1].type.quant
    return {"dtype": w.storage, "per_channel": w.axis is not None, "count": len(w.scale),
            "scale_min": float(min(w.scale)), "scale_max": float(max(w.scale))}


def layer_rows(int8: Graph, percentile: float | None = None) -> list[dict]:
    """The static part of each layer's row: what the quantize pass chose."""
    meta = int8.meta.get("quant", {})
    info = meta.get("layers", {})
    float_layers = {k for k, v in info.items() if v.get("precision") == "float"}
    method = _method(meta.get("scheme", {}), percentile)
    rows = []
    for op in int8.ops:
        if not _is_layer(op, float_layers):
            continue
        qp = op.result.type.quant
        row: dict[str, Any] = {"name": op.name, "kind": op.kind, "value": op.result.name,
                               "shape": list(op.result.shape)}
        if qp is None and op.kind in ("QLinearConv", "QLinearGemm", "DynamicQLinearGemm"):   # float32 result
            row.update(precision="fp8>f32" if is_fp8(op.operands[0].dtype) else "int8>f32", weight=_weight_row(op))
            if op.kind == "DynamicQLinearGemm":
                p = op.operands[1].producer
                row["range_source"] = f"run time, per {p.attrs.get('granularity', 'token') if p else 'token'}"
            rows.append(row)
            continue
        if qp is None:
            row.update(precision="float", reason=info.get(op.name, {}).get("reason", ""))
            rows.append(row)
            continue
        lo, hi = storage_range(qp.storage)
        s, z = float(qp.scale[0]), int(qp.zero_point[0])
        row.update(precision=Fp8Format.of_storage(qp.storage).value if is_fp8(qp.storage) else qp.storage,
                   scale=s, zero_point=z, range=[s * (lo - z), s * (hi - z)])
        if op.kind in ("QLinearConv", "QLinearGemm"):
            row["weight"] = _weight_row(op)
        calibrated = info.get(op.name, {}).get("range")
        if op.kind == "Requantize":
            row["range_source"] = CONCAT
        elif op.kind == "QuantizeLinear" or (calibrated is not None and "method" in info.get(op.name, {})):
            row["range_source"] = f"{CALIBRATED} ({method})"
            if calibrated:
                row["calibrated_range"] = [float(calibrated[0]), float(calibrated[1])]
        else:
            row["range_source"] = INHERITED
        rows.append(row)
    return rows


# ---- accuracy --------------------------------------------------------------------------------------
BLOCK = 1 << 14


def _sum_squares(x: np.ndarray) -> float:
    """Σ x²: float32 dot products over blocks of 2^14 values, the blocks summed in float64
    (relative error about 2^7 float32 ulps: below 1e-4 dB; float64 throughout took a quarter of a
    DeepLabV3 report's evaluation)."""
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    n = x.size // BLOCK * BLOCK
    head = x[:n].reshape(-1, BLOCK)
    tail = x[n:].astype(np.float64)
    return float(np.einsum("ij,ij->i", head, head).sum(dtype=np.float64) + np.dot(tail, tail))


class Energy:
    """Σ r² and Σ (x - r)² per key (:func:`_sum_squares`): the report's SQNRs and Sensitivity.prior's."""

    def __init__(self):
        self.signal: dict[str, float] = {}
        self.noise: dict[str, float] = {}

    def add(self, key: str, ref: np.ndarray, got: np.ndarray) -> None:
        r = np.asarray(ref, np.float32)
        d = np.asarray(got, np.float32) - r
        self.signal[key] = self.signal.get(key, 0.0) + _sum_squares(r)
        self.noise[key] = self.noise.get(key, 0.0) + _sum_squares(d)

    def sqnr(self, key: str) -> float | None:
        """dB; None when there is no noise at all (exact) or no data."""
        n, s = self.noise.get(key), self.signal.get(key)
        if n is None or n == 0.0:
            return None
        return -math.inf if s == 0.0 else 10.0 * math.log10(s / n)


def _chunk_size(fp32: Graph, int8: Graph, batch: int, given: Graph | None = None) -> int:
    """Samples per chunk: a multiple of the batch whose intermediates fit MEMORY_BUDGET; just the
    batch for a graph that only runs at its own (``meta["fixed_batch"]``: unrolled recurrences)."""
    graphs = (fp32, int8) if given is None else (fp32, int8, given)
    if any(g.meta.get("fixed_batch") for g in graphs):
        return max(batch, 1)
    per_batch = sum(int(np.prod(v.shape or (1,))) * np.dtype(np_dtype(v.dtype)).itemsize
                    for g in graphs for op in g.ops for v in op.results)
    k = max(1, min(MAX_CHUNK // max(batch, 1), MEMORY_BUDGET // max(per_batch, 1)))
    return k * max(batch, 1)


def _float_engines(fp32: Graph, given: Graph | None, values: list[str]):
    """(feed -> the fp32 graph's named values and outputs, feed -> the given model's outputs), run
    by onnxruntime (:func:`~qcompiler.quant.calibrate.float_runner`, op by op as the calibration
    runs them): float32 like the reference interpreter, which accumulates in float64 (relative
    differences near 1e-7: far below the 0.01 dB the report prints) and was 1-2 s per DeepLabV3
    sample on each float graph. A graph onnxruntime cannot hold or run takes the reference."""
    names = list(dict.fromkeys([*values, *(v.name for v in fp32.outputs)]))
    try:
        fp32_values = float_runner(fp32, names)
    except Exception:  # noqa: BLE001 - no ONNX form, or onnxruntime refuses it: the reference
        def fp32_values(feed):
            return reference.run_values(fp32, feed)
    if given is None:
        return fp32_values, None
    outs = [v.name for v in given.outputs]
    try:
        run = float_runner(given, outs)
    except Exception:  # noqa: BLE001
        return fp32_values, lambda feed: reference.run(given, feed)

    def given_outputs(feed):
        values = run(feed)
        return [values[o] for o in outs]
    return fp32_values, given_outputs


def evaluate(fp32: Graph, int8: Graph, data: EvalData, rows: list[dict], given: Graph | None = None) -> dict:
    """Stream ``data`` through the models; fill each row's ``sqnr_db`` (against ``fp32``) and return
    the output metrics ``{"outputs": [...], "samples": n, "accuracy": {...} (with labels)}``, against
    ``given`` (the model as given) when there is one, else against ``fp32``."""
    batch = int8.inputs[0].shape[0] if int8.inputs and int8.inputs[0].shape else 1
    if given is not None and len(given.outputs) != len(int8.outputs):
        raise ValueError(f"the model as given has {len(given.outputs)} outputs, the int8 graph {len(int8.outputs)}")
    names = int8.meta.get("quant", {}).get("float_values", {})
    fnames = {v.name for g_op in fp32.ops for v in g_op.results} | {v.name for v in fp32.inputs}
    pairs = []                                          # (row, int8 value, fp32 value, quant params)
    for row in rows:
        f = names.get(row["value"], row["value"])
        if f in fnames:
            pairs.append((row, row["value"], f, int8.value(row["value"]).type.quant))
        else:
            row["sqnr_db"], row["note"] = None, "no fp32 counterpart"
    energy = Energy()
    agree = np.zeros(len(int8.outputs), np.int64)
    rows_seen = np.zeros(len(int8.outputs), np.int64)
    correct = {"fp32": 0, "int8": 0}
    n, labelled = 0, True
    hist: dict[str, np.ndarray] = {}
    fp32_values, given_outputs = _float_engines(fp32, given, [f for *_, f, _ in pairs])
    for feed, labels in chunks(data, _chunk_size(fp32, int8, batch, given), batch):
        fv = fp32_values(feed)
        qv = reference.run_values(int8, feed)
        refs = [fv[fo.name] for fo in fp32.outputs] if given is None else given_outputs(feed)
        for row, q, f, qp in pairs:
            energy.add(row["value"], fv[f], dequantize(qv[q], qp) if qp is not None else qv[q])
            if qp is not None and qp.scale is not None and len(qp.scale) == 1 and qp.storage in INT_RANGES:
                h = grid_histogram(fv[f], qp)                 # (a float8 grid is not uniform: no histogram)
                hist[row["value"]] = hist[row["value"]] + h if row["value"] in hist else h
        for i, (qo, fo) in enumerate(zip(int8.outputs, fp32.outputs)):
            r, x = refs[i], qv[qo.name]
            energy.add("output:" + qo.name, r, x)
            if given is not None:                       # what the float passes alone changed
                energy.add("passes:" + qo.name, r, fv[fo.name])
            top1 = r.ndim >= 2 and r.shape[-1] > 1
            if top1:
                a, b = r.argmax(-1), x.argmax(-1)
                agree[i] += int((a == b).sum())
                rows_seen[i] += a.size
            if i == 0:                                  # accuracy: one label per row of the first output
                if top1 and labels is not None and labels.shape == a.shape:
                    correct["fp32"] += int((a == labels).sum())
                    correct["int8"] += int((b == labels).sum())
                else:
                    labelled = False
        n += len(next(iter(feed.values())))
    for row, *_ in pairs:
        row["sqnr_db"] = json_round(energy.sqnr(row["value"]))
        if energy.noise.get(row["value"]) == 0.0:
            row["note"] = "exact (no error)"
        if row["value"] in hist:
            row["levels_99_99"] = levels_holding(hist[row["value"]])
    ranked = sorted((r for r, *_ in pairs if r["value"] in hist and r["sqnr_db"] is not None),
                    key=lambda r: r["sqnr_db"])
    for row in ranked[:HIST_LAYERS]:                    # the fp32 values on the 8-bit grid of the worst layers
        row["histogram"] = [int(c) for c in hist[row["value"]]]
    result: dict[str, Any] = {"samples": n, "outputs": []}
    for i, v in enumerate(int8.outputs):
        o = {"name": v.name, "sqnr_db": json_round(energy.sqnr("output:" + v.name))}
        if given is not None:
            o["float_passes_sqnr_db"] = json_round(energy.sqnr("passes:" + v.name))
        if rows_seen[i]:
            o.update(top1_agreement=json_round(agree[i] / rows_seen[i]), top1_rows=int(rows_seen[i]),
                     top1_agree_rows=int(agree[i]))
        result["outputs"].append(o)
    if labelled and n:
        result["accuracy"] = {k: json_round(c / n) for k, c in correct.items()}
    return result


# ---- sizes -------------------------------------------------------------------------------------------
def param_bytes(graph: Graph) -> int:
    return graph.param_count()[1]


def with_library_size(report: dict, library_bytes: int) -> dict:
    """The report with the artifact sizes: the int8 model.so measured, the fp32 one estimated."""
    size = dict(report["size"], library_int8_bytes=int(library_bytes))
    p32, p8 = size["params_fp32_bytes"], size["params_int8_bytes"]
    if p32 is None:
        return {**report, "size": size}
    size.update(library_fp32_bytes=int(library_bytes - p8 + p32),
                library_fp32_estimated=True,
                library_ratio=json_round(library_bytes / max(library_bytes - p8 + p32, 1)))
    return {**report, "size": size}


# ---- the report ------------------------------------------------------------------------------------
def build_report(fp32: Graph | None, int8: Graph, data: EvalData | None, *, calibration: dict | None = None,
                 percentile: float | None = None, target: str | None = None, model: str | None = None,
                 given: Graph | None = None) -> dict:
    """The report as a JSON-able dict (without the artifact size: :func:`with_library_size`).

    ``fp32``: the float graph the quantize pass started from (None: no accuracy part, e.g. for a
    model that came quantized); ``data``: held-back samples (None: no accuracy part);
    ``calibration``: what the CLI says about the calibration (source, samples, method);
    ``given``: the float model as the user gave it (the graph before any pass), which the outputs
    are measured against (None: against ``fp32``; see the module docstring)."""
    rows = layer_rows(int8, percentile)
    meta = int8.meta.get("quant", {})
    rep: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "model": model, "target": target,
        "scheme": {k: v for k, v in meta.get("scheme", {}).items() if k != "calibration"},
        "calibration": dict(calibration or {}),
        "range_method": _method(meta.get("scheme", {}), percentile),
        "quantized_layers": sum(r["precision"] != "float" for r in rows),
        "float_layers": sum(r["precision"] == "float" for r in rows),
        "layers": rows,
    }
    if fp32 is not None and data is not None and data.take > 0:
        rep["evaluation"] = {**data.describe(), **evaluate(fp32, int8, data, rows, given)}
    else:
        rep["evaluation"] = {"samples": 0, "note": "no fp32 reference" if fp32 is None else "not evaluated"}
        for r in rows:
            r["sqnr_db"] = None
    p8 = param_bytes(int8)
    p32 = param_bytes(fp32) if fp32 is not None else None
    rep["size"] = {"params_fp32_bytes": p32, "params_int8_bytes": p8,
                   "params_ratio": json_round(p8 / p32) if p32 else None}
    for r in rows:                                     # rounded for a stable JSON text
        for k in ("scale",):
            if k in r:
                r[k] = float(np.float32(r[k]))
        if "range" in r:
            r["range"] = [json_round(x, 6) for x in r["range"]]
        if "calibrated_range" in r:
            r["calibrated_range"] = [json_round(x, 6) for x in r["calibrated_range"]]
    return rep


def passes_changed(output: dict) -> bool:
    """Whether the float passes changed this output of the report's evaluation beyond float rounding."""
    db = output.get("float_passes_sqnr_db", math.inf)
    return db is not None and db < PASSES_CHANGED_DB


def json_round(x, nd: int = ROUND):
    """``x`` rounded to ``nd`` digits for the JSON report; None for None, inf and NaN."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    return round(x, nd)


def to_json(report: dict) -> bytes:
    """Canonical JSON text: sorted keys, 2-space indent, no NaN/Infinity, trailing newline."""
    return (json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


# ---- the table ---------------------------------------------------------------------------------------
def _kb(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MB"


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def format_table(report: dict) -> str:
    """The report as text: one row per layer, then the outputs and the sizes."""
    ev = report.get("evaluation", {})
    cal = report.get("calibration", {})
    q = report.get("dtype") if report.get("dtype") in ("int8", "fp8") else "int8"    # the quantized build's name
    lines = [f"{q} build report{': ' + report['model'] if report.get('model') else ''}"
             f"{' (' + report['target'] + ')' if report.get('target') else ''}"]
    if cal:
        lines.append(f"calibration: {cal.get('source', '?')}, {cal.get('samples', '?')} samples, "
                     f"range method {report.get('range_method')}")
    if ev.get("samples"):
        held = "held back from calibration" if ev.get("held_back") else "NOT held back (calibration samples)"
        lines.append(f"evaluation:  {ev['samples']} samples of {ev['source']} (from sample {ev['first_sample']}, "
                     f"{held}){'; random data: the numbers say little about real inputs' if ev.get('random') else ''}")
    else:
        lines.append(f"evaluation:  none ({ev.get('note', '')})")
    w = max([20] + [min(len(r["name"]), 44) for r in report["layers"]])
    head = f"{'layer':<{w}}  {'kind':<24} {'prec':<6} {'out scale':>10} {'zp':>4}  {'weight scales (n: min..max)':<29} {'range':<20} {'SQNR dB':>8}"
    lines += [head, "-" * len(head)]
    for r in report["layers"]:
        sq = "—" if r.get("sqnr_db") is None else f"{r['sqnr_db']:.1f}"
        if r.get("sqnr_db") is None and r.get("note") == "exact (no error)":
            sq = "exact"
        if r["precision"] == "float":
            lines.append(f"{_short(r['name'], w):<{w}}  {r['kind']:<24} {'float':<6} {'':>10} {'':>4}  "
                         f"{'':<29} {_short(r.get('reason', ''), 20):<20} {sq:>8}")
            continue
        wt = ""
        if "weight" in r:
            x = r["weight"]
            wt = (f"{'ch ' if x['per_channel'] else 'tensor '}{x['count']}: {x['scale_min']:.2e}..{x['scale_max']:.2e}"
                  if x["per_channel"] else f"tensor: {x['scale_min']:.2e}")
        src = r.get("range_source", "")
        src = "calibrated" if src.startswith(CALIBRATED) else {INHERITED: "input's", CONCAT: "concat's"}.get(src, src)
        if "scale" not in r:                            # an int8 (fp8) conv/GEMM with a float32 result
            lines.append(f"{_short(r['name'], w):<{w}}  {r['kind']:<24} {r['precision'].split('>')[0]:<6} {'f32 out':>10} {'':>4}  "
                         f"{wt:<29} {'':<20} {sq:>8}")
            continue
        lines.append(f"{_short(r['name'], w):<{w}}  {r['kind']:<24} {r['precision']:<6} {r['scale']:>10.4g} "
                     f"{r['zero_point']:>4}  {wt:<29} {src:<20} {sq:>8}")
    lines.append(f"{report['quantized_layers']} quantized layers, {report['float_layers']} float")
    for o in ev.get("outputs", []):
        s = f"output {o['name']}: SQNR {'—' if o['sqnr_db'] is None else format(o['sqnr_db'], '.2f')} dB"
        if "top1_agreement" in o:
            s += f", top-1 agreement with fp32 {100 * o['top1_agreement']:.2f} % ({o['top1_agree_rows']}/{o['top1_rows']})"
        lines.append(s)
        if passes_changed(o):
            lines.append(f"  the float passes before quantize alone: {o['float_passes_sqnr_db']:.2f} dB "
                         "(fp32 after them vs the model as given)")
    if "accuracy" in ev:
        lines.append(f"top-1 accuracy on the labels: fp32 {100 * ev['accuracy']['fp32']:.2f} %, "
                     f"{q} {100 * ev['accuracy']['int8']:.2f} %")
    sz = report["size"]
    s = f"parameters: fp32 {_kb(sz['params_fp32_bytes'])} -> {q} {_kb(sz['params_int8_bytes'])}"
    if sz.get("params_ratio") is not None:
        s += f" ({sz['params_ratio']:.2f}x)"
    lines.append(s)
    if "library_fp32_bytes" in sz:
        lines.append(f"model.so:   fp32 {_kb(sz['library_fp32_bytes'])} (estimated) -> {q} "
                     f"{_kb(sz['library_int8_bytes'])} ({sz['library_ratio']:.2f}x)")
    return "\n".join(lines) + "\n"
