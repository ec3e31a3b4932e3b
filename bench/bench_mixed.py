"""Latency-aware selective unquantization against the accuracy-only greedy, on real models.

    .venv/bin/python bench/bench_mixed.py [--models fashion_mobilenet,rapidocr-cls] [--margin 3]
                                          [--min-sqnr fashion_mobilenet=37,rapidocr-cls=22] [--show-costs]

Per model, with one calibration and the budget measured by the reference interpreter (the integer
oracle the kernels match bit for bit) on held-back samples, as ``qcompile --min-sqnr`` does:

1. plain int8 SQNR vs fp32; the budget ``--min-sqnr`` is that plus ``--margin`` dB (or given), so
   plain int8 misses it;
2. the accuracy-only greedy (``select_float_layers(..., cost=None)``) and the latency-aware one
   (``cost=LayerCosts.latency``: per-layer int8/float kernel times measured on this host, plus the
   Q/DQ conversions at the float islands' boundaries);
3. both artifacts built (x86, batch 1) beside plain int8 and fp32, and timed: medians of
   interleaved rounds in alternating order (bench/_timing.py), so load from other jobs hits every
   variant alike; when both selections give the same set, that is one artifact timed once.

Printed side by side: float layers, Q/DQ boundaries, SQNR, predicted and measured latency, and the
ratio latency-aware / accuracy-only (must not exceed 1 beyond the timing noise; the selection
keeps the accuracy-only set when the latency-aware search ends on a set predicted slower).

Data: fashion_mobilenet calibrates on 128 images of models/fashion_test.npz and measures the budget
on 32 others (real labelled Fashion-MNIST); rapidocr-cls calibrates on 24 synthetic text lines and
measures on 16 others (tests/realmodels.py ``rapidocr_text_lines``; no labelled data offline).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import realmodels  # noqa: E402
from _timing import median_ms  # noqa: E402

from qcompiler.codegen.artifact import write_artifact  # noqa: E402
from qcompiler.codegen.target import TargetSpec  # noqa: E402
from qcompiler.frontend import import_onnx  # noqa: E402
from qcompiler.passes import run_passes  # noqa: E402
from qcompiler.passes.quantize import QuantizeOptions  # noqa: E402
from qcompiler.plan.layer_cost import measure_layer_costs  # noqa: E402
from qcompiler.plan.select import select_float_layers  # noqa: E402
from qcompiler.plan.sensitivity import Sensitivity  # noqa: E402
from qcompiler.runtime import load  # noqa: E402


def model_data(name: str, n_calib: int | None = None, n_held: int | None = None):
    """(ONNX model, calibration feeds, budget feeds, timing iterations) with batch-1 feeds;
    ``n_calib``/``n_held`` override the model's sample counts."""
    if name == "fashion_mobilenet":
        c, h = n_calib or 128, n_held or 32
        x = realmodels.fashion_test()[0].astype(np.float32)
        calib, held = x[:c], x[c:c + h]
        model, iters = str(realmodels.MODELS_DIR / "fashion_mobilenet.onnx"), 200
    elif name == "rapidocr-cls":
        c, h = n_calib or 24, n_held or 16
        m = {m.name: m for m in realmodels.rapidocr_models()}[name]
        lines = realmodels.rapidocr_text_lines(c + h)
        calib, held = lines[:c], lines[c:c + h]
        model, iters = m.load(), 40
    else:
        raise SystemExit(f"unknown model {name}")
    return model, [x[None] for x in calib], [x[None] for x in held], iters


def predicted_never_slower(costs, acc, lat) -> tuple:
    """The latency-aware result, unless the accuracy-only set also meets the budget and is
    predicted faster (greedy paths differ; the cheaper of the two is kept)."""
    if acc.met and (not lat.met or costs.latency(frozenset(acc.float_layers)) < costs.latency(frozenset(lat.float_layers))):
        return acc.float_layers, "accuracy-only set (predicted faster)"
    return lat.float_layers, "latency-aware search"


def run(name: str, args) -> list[dict]:
    model, calib, held, iters = model_data(name, args.calib, args.held)
    t0 = time.perf_counter()
    g = import_onnx(model, {"x": (1, 3, 48, 192)} if name == "rapidocr-cls" else None)
    run_passes(g)
    inp = g.inputs[0].name
    opts = QuantizeOptions(calib=[{inp: x} for x in calib])
    sens = Sensitivity(g, opts, [({inp: x}, None) for x in held])
    plain = sens.scores(frozenset()).sqnr_db
    budget = args.budgets.get(name, round(plain + args.margin, 1))
    spec = TargetSpec("x86", dtype="int8")
    costs = measure_layer_costs(g, spec, keep_float=opts.keep_float)
    prior = sens.prior()

    def evaluate(S):
        return sens.scores(S).sqnr_db
    acc = select_float_layers(evaluate, sens.candidates, budget, shortlist=8, prior=prior)
    lat = select_float_layers(evaluate, sens.candidates, budget, cost=costs.latency, shortlist=8, prior=prior,
                              max_evaluations=acc.evaluations + args.max_evaluations)
    chosen, how = predicted_never_slower(costs, acc, lat)
    print(f"\n{name}: plain int8 {plain:.2f} dB on {len(held)} held-back samples; budget --min-sqnr {budget} dB; "
          f"{len(sens.candidates)} candidates; {sens.evaluations} evaluations; {time.perf_counter() - t0:.0f} s")
    print(f"  accuracy-only: met={acc.met} {list(acc.float_layers)}, predicted "
          f"{costs.latency(frozenset(acc.float_layers)):.3f} ms")
    print(f"  latency-aware search: met={lat.met} {list(lat.float_layers)}, predicted "
          f"{costs.latency(frozenset(lat.float_layers)):.3f} ms; kept: {how}")
    if args.show_costs:
        print(f"  per-layer costs (ms, measured on this host; conversions {costs.conversion_ms[0] * 1e3:.2f} us "
              f"+ {costs.conversion_ms[1] * 1e6:.3f} ns/element):")
        for n in costs.int8_ms:
            flag = "  int8 slower" if n in costs.slower_than_float() else ""
            print(f"    {n:<60} int8 {costs.int8_ms[n]:.4f}  float {costs.float_ms[n]:.4f}{flag}")

    variants = [("fp32", None), ("int8", frozenset()), ("accuracy-only", frozenset(acc.float_layers)),
                ("latency-aware", frozenset(chosen))]
    rows, models = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-mixed-") as tmp:
        built = {}
        for label, S in variants:
            key = "fp32" if S is None else S
            if key not in built:
                if S is None:
                    from qcompiler.plan.sensitivity import prepare
                    gg, sp = prepare(g, opts), TargetSpec("x86", dtype="fp32")
                else:
                    gg, sp = sens.quantized(S)[0], spec
                built[key] = load(write_artifact(gg, sp, Path(tmp) / f"v{len(built)}"))
            models[label] = built[key]
        x = held[0]
        # one timing per distinct artifact (the same set is the same artifact); interleaved rounds
        # in alternating order, so drifting load from other jobs hits every artifact alike
        keys = list(built)
        times: dict = {k: [] for k in keys}
        for k in keys:
            built[k](x)                                     # warm up
        for r in range(args.rounds):
            for k in (keys if r % 2 == 0 else keys[::-1]):
                times[k].append(median_ms(lambda: built[k](x), iters))
        ms = {label: times["fp32" if S is None else S] for label, S in variants}
    for label, S in variants:
        rows.append({"model": name, "variant": label, "float": None if S is None else sorted(S),
                     "boundaries": None if S is None else costs.boundaries(S),
                     "sqnr": None if S is None else sens.scores(S).sqnr_db,
                     "predicted": costs.float_latency() if S is None else costs.latency(S),
                     "ms": float(np.median(ms[label])), "budget": budget})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="fashion_mobilenet,rapidocr-cls")
    ap.add_argument("--margin", type=float, default=3.0, help="budget = plain int8 SQNR + this (dB)")
    ap.add_argument("--min-sqnr", default="", help="explicit budgets: name=DB,name=DB")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--max-evaluations", type=int, default=200,
                    help="evaluations the latency-aware search may add to the accuracy-only one's (its "
                         "same-size swaps each need one; default 200)")
    ap.add_argument("--show-costs", action="store_true", help="print the per-layer costs")
    ap.add_argument("--calib", type=int, default=None, metavar="N",
                    help="calibration samples (default: fashion 128, cls 24)")
    ap.add_argument("--held", type=int, default=None, metavar="N",
                    help="held-back samples the budget is measured on (default: fashion 32, cls 16)")
    args = ap.parse_args()
    args.budgets = {k: float(v) for k, v in (p.split("=") for p in args.min_sqnr.split(",") if p)}
    rows = []
    for name in args.models.split(","):
        rows += run(name, args)
    print("\n| model | variant | float layers | Q/DQ | SQNR dB | predicted ms | measured ms | vs accuracy-only |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["variant"] == "accuracy-only")["ms"]
        fl = "–" if r["float"] is None else str(len(r["float"]))
        bd = "–" if r["boundaries"] is None else str(r["boundaries"])
        db = "–" if r["sqnr"] is None else f"{r['sqnr']:.2f}"
        print(f"| {r['model']} (min {r['budget']} dB) | {r['variant']} | {fl} | {bd} | {db} | "
              f"{r['predicted']:.3f} | {r['ms']:.3f} | {r['ms'] / base:.2f} |")


if __name__ == "__main__":
    main()
