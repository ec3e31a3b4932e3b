"""Does a selected mixed-precision set meet its budget on samples the selection did not see?

    .venv/bin/python bench/bench_held_back.py rapidocr-cls C N M BUDGET [SHORTLIST]
    .venv/bin/python bench/bench_held_back.py fashion 256 64 64 37        (CAP=400 CRITS=point,bootstrap5)

C calibration samples, then N selection samples, then M held-back samples (disjoint, in that order,
as ``qcompile --min-sqnr`` takes them from one source); BUDGET in dB, or ``+D``: the all-int8
point SQNR on the selection samples plus D. Per criterion (env CRITS, comma-separated):

* ``point``: the dataset SQNR on the selection samples (``--budget-confidence 0``);
* ``bootstrap5``: its 5th-percentile bootstrap lower bound (the CLI's default);
* ``folds``: the worse of the two halves' SQNR;
* ``splitpoint`` / ``splitboot``: select on the first half (point / bound), the set must also meet
  the budget on the second half (``select_float_layers(confirm=...)``).

Prints one JSON line per criterion: float layers, the criterion's value, the point SQNR on the
selection samples, the SQNR on the held-back samples and whether that meets the budget.
The evaluation cap is the CLI's (2 per candidate + 40) unless env CAP is set.
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import realmodels as rm  # noqa: E402

from qcompiler.frontend import import_onnx  # noqa: E402
from qcompiler.passes import PassManager  # noqa: E402
from qcompiler.passes.quantize import QuantizeOptions  # noqa: E402
from qcompiler.plan.select import Bootstrap, select_float_layers  # noqa: E402
from qcompiler.plan.sensitivity import Sensitivity  # noqa: E402


def setup(name, C, N, M):
    if name == "rapidocr-cls":
        m = [m for m in rm.rapidocr_models() if m.name == name][0]
        g = import_onnx(m.load(), m.input_shapes)
        xs, inp = rm.rapidocr_text_lines(C + N + M), "x"
        opts = QuantizeOptions(calib=[{inp: xs[i:i + 1]} for i in range(C)])
    else:
        x = rm.fashion_test()[0].astype(np.float32)
        g, inp = rm.import_batched(str(rm.MODELS_DIR / "fashion_mobilenet.onnx"), (1, *x.shape[1:]), 8)
        xs = x[:C + N + M]
        opts = QuantizeOptions(calib=[{inp: xs[s:s + 8]} for s in range(0, C, 8)])
    PassManager("default").run(g)
    sel = Sensitivity(g, opts, [({inp: xs[C:C + N]}, None)])
    held = Sensitivity(g, opts, [({inp: xs[C + N:C + N + M]}, None)], ranges=sel.ranges)
    return sel, held


def db(s, e):
    return 10 * np.log10(s.sum() / e.sum()) if e.sum() > 0 else np.inf


def main(name, C, N, M, budget_arg, shortlist=8):
    sens, held = setup(name, C, N, M)
    plain = sens.scores(frozenset()).sqnr_db
    budget = plain + float(budget_arg[1:]) if budget_arg.startswith("+") else float(budget_arg)
    cands, half, bs = sens.candidates, N // 2, Bootstrap(N)
    bh = Bootstrap(half)

    def part(f, sl):
        return lambda S: f(sens.per_sample(S).signal[sl], sens.per_sample(S).noise[sl])
    A, B, ALL = slice(0, half), slice(half, None), slice(None)
    table = {"point": (part(db, ALL), None), "bootstrap5": (part(bs.sqnr_db, ALL), None),
             "folds": (lambda S: min(part(db, A)(S), part(db, B)(S)), None),
             "splitpoint": (part(db, A), part(db, B)), "splitboot": (part(bh.sqnr_db, A), part(bh.sqnr_db, B))}
    cap = int(os.environ.get("CAP", 2 * len(cands) + 40))
    print(json.dumps({"model": name, "calibration": C, "selection": N, "held_back": M, "budget": round(budget, 2),
                      "plain_point": round(plain, 2), "plain_bound": round(table["bootstrap5"][0](frozenset()), 2),
                      "plain_held_back": round(held.scores(frozenset()).sqnr_db, 2)}), flush=True)
    for crit in os.environ.get("CRITS", "point,bootstrap5").split(","):
        f, confirm = table[crit]
        t = time.time()
        sel = select_float_layers(f, cands, budget, shortlist=shortlist, prior=sens.prior(), groups=sens.groups(),
                                  max_evaluations=cap, confirm=confirm)
        S = frozenset(sel.float_layers)
        h = held.scores(S).sqnr_db
        print(json.dumps({"criterion": crit, "met": sel.met, "float_layers": len(S), "value": round(sel.score, 2),
                          "point": round(sens.scores(S).sqnr_db, 2), "held_back": round(h, 2),
                          "held_back_meets": bool(h >= budget), "evaluations": sel.evaluations,
                          "seconds": round(time.time() - t, 1), "set": sorted(S)}), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), a[4], int(a[5]) if len(a) > 5 else 8)
