"""The zoo benchmark: every zoo model (zoo/manifest.toml), qcompiler beside ONNX Runtime, in one run.

    python bench/zoo.py                                  # all models (~1-2 h on 2 cores)
    python bench/zoo.py --models resnet18,deit_tiny      # some of them
    python bench/zoo.py --group torch --json zoo.json    # one group; also write the rows as JSON
    python bench/zoo.py --fp32-only --models vit-s16     # fp32 columns only (no int8 builds)
    python bench/zoo.py --qdq --group torch              # also: ours on ORT's QDQ file beside ORT on it
    python bench/zoo.py --dynamic --models bert-base     # int8 = ours --activations dynamic vs ORT quantize_dynamic

Per model, on the same calibration feeds (``--calib`` samples of the zoo's data, seed 0) and
separate evaluation feeds (``--eval`` samples, seed 1):

* qcompiler: ``qcompile M.onnx --dtype fp32`` and ``--dtype int8 --calib CALIB.npz`` (the CLI's
  defaults: MinMax, per-channel int8 weights, uint8 activations), compile time of each;
* ONNX Runtime: the model as given (fp32), and ``quantize_static`` of the graph we compile (QDQ,
  per-channel, MinMax; zoo.ort_quantize_static: bound inputs and the Ifs they decide resolved,
  zoo/inline.py) on the same calibration feeds;
* a model that arrives quantized (QDQ, e.g. smart-turn-v3.2): ours is its int8 build with its own
  scales (fold-qdq, no calibration), ORT int8 is ORT running the file itself. Its fp32 row is our
  float build of the file (every Q/DQ rounding done in float) beside that same ORT run, which is
  integer arithmetic (ORT fuses the Q/DQ groups into QLinear kernels): not an fp32 comparison, so
  the summary's fp32 geomean and worst leave these files out and show them on a line of their own;
* ``--qdq``: also ``qcompile ORT_QDQ.onnx`` (fold-qdq on ORT's own QDQ file), timed beside ORT on
  that file, and its outputs' SQNR against ORT's on it (agreement, not accuracy);
* int8 SQNR of each engine's int8 outputs against ONNX Runtime fp32 on the evaluation feeds
  (zoo.sqnr_db, all outputs of all samples), and our fp32's max error relative to ORT fp32;
* latency at batch 1 with 2 threads (TVM_NUM_THREADS=2, ORT intra_op_num_threads=2, spinning off
  in both: see bench/bench_int8.py): the median over ``--rounds`` interleaved rounds (ours int8,
  ours fp32, ORT int8, ORT fp32) of the median of ``--iters`` calls; the VM function on prepared
  tensors, ORT's ``run`` on numpy feeds.

Columns: compile s (fp32/int8), fp32 ms ours/ORT, int8 ms ours/ORT int8, ours int8/ours fp32,
SQNR dB ours/ORT (and with ``--qdq``: ours on ORT's QDQ file / ORT on it, and the SQNR between
the two). A model that does not build shows the stage and error instead. The summary
line gives the geomean and the worst (largest ratio, smallest SQNR margin) of each ratio over
the models where both sides ran.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import zoo  # noqa: E402
from zoo.harness import build, max_rel_error  # noqa: E402

from _timing import median_ms as _median_ms  # noqa: E402  (bench/ is on sys.path when run as a script)


def bench_model(m, tmp: Path, calib_n: int, eval_n: int, rounds: int, iters: int, threads: int,
                int8: bool = True, qdq: bool = False, dynamic: bool = False) -> dict:
    row: dict = {"model": m.name, "group": m.group}
    try:
        return _bench_model(m, row, tmp, calib_n, eval_n, rounds, iters, threads, int8, qdq, dynamic)
    except Exception as e:                       # noqa: BLE001 - a row per model, whatever failed
        msg = str(e).strip().splitlines()[-1][:160] if str(e).strip() else ""
        row["failed"] = f"{row.pop('_stage', 'run')}: {type(e).__name__}: {msg}"
        return row


def _bench_model(m, row: dict, tmp: Path, calib_n: int, eval_n: int, rounds: int, iters: int, threads: int,
                 int8: bool = True, qdq: bool = False, dynamic: bool = False) -> dict:
    import tvm

    from qcompiler.frontend.onnx_qdq import is_prequantized
    row["_stage"] = "export"
    path = m.path()
    pre = row["prequantized"] = is_prequantized(str(path))   # its own scales; ORT runs the file as it is
    calib, evals = m.feeds(calib_n, seed=0), m.feeds(eval_n, seed=1)
    row["_stage"] = "fp32"
    ours32 = build(m, "fp32", tmp / f"{m.name}.fp32")
    row["compile_fp32_s"] = ours32.seconds
    oursq = None
    if int8:
        row["_stage"] = "int8"
        if dynamic:                              # --activations dynamic beside ORT's quantize_dynamic
            ours8 = build(m, "int8", tmp / f"{m.name}.int8", activations="dynamic")
        else:
            ours8 = build(m, "int8", tmp / f"{m.name}.int8", calib=None if pre else calib)
        row["compile_int8_s"] = ours8.seconds
        row["_stage"] = "ort-int8"
        ort_q_path = path if pre else zoo.ort_quantize_dynamic(m, tmp / f"{m.name}.ort_dyn.onnx") if dynamic \
            else zoo.ort_quantize_static(m, calib, tmp / f"{m.name}.ort_int8.onnx")
        if qdq and not pre:
            row["_stage"] = "qdq"
            oursq = build(m, "int8", tmp / f"{m.name}.qdq", path=ort_q_path)
    row["_stage"] = "run"
    ort32 = zoo.ort_session(path, threads)
    ort8 = zoo.ort_session(ort_q_path, threads) if int8 else None
    refs, mine32, mine8, theirs8, mineq = [], [], [], [], []
    for f in evals:
        of = m.ort_feeds(f)
        refs += ort32.run(None, of)
        mine32 += ours32(f)
        if int8:
            theirs8 += ort8.run(None, of)
            mine8 += ours8(f)
        if oursq is not None:
            mineq += oursq(f)
    row["fp32_max_err"] = max_rel_error(refs, mine32)
    if int8:
        row["ours_int8_db"] = zoo.sqnr_db(refs, mine8)
        row["ort_int8_db"] = zoo.sqnr_db(refs, theirs8)
    if oursq is not None:
        row["qdq_agree_db"] = zoo.sqnr_db(theirs8, mineq)
    elif pre and int8:
        row["qdq_agree_db"] = row["ours_int8_db"]

    f0, of0 = evals[0], m.ort_feeds(evals[0])
    names32 = [s.name for s in ours32.model.inputs]
    a32 = [tvm.runtime.tensor(np.ascontiguousarray(f0[k])) for k in names32]
    main32 = ours32.model._main
    runs = {}
    if int8:
        a8 = [tvm.runtime.tensor(np.ascontiguousarray(f0[s.name])) for s in ours8.model.inputs]
        main8 = ours8.model._main
        runs["ours_int8"] = lambda: main8(*a8)
    runs["ours_fp32"] = lambda: main32(*a32)
    if oursq is not None:
        aq = [tvm.runtime.tensor(np.ascontiguousarray(f0[s.name])) for s in oursq.model.inputs]
        mainq = oursq.model._main
        runs["ours_qdq"] = lambda: mainq(*aq)
    if int8:
        runs["ort_int8"] = lambda: ort8.run(None, of0)
    runs["ort_fp32"] = lambda: ort32.run(None, of0)
    for fn in runs.values():                     # warm up
        for _ in range(3):
            fn()
    times: dict[str, list] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            times[k].append(_median_ms(fn, iters))
    row.update({f"{k}_ms": float(np.median(v)) for k, v in times.items()})
    row["fp32_ratio"] = row["ours_fp32_ms"] / row["ort_fp32_ms"]
    if int8:
        row["int8_ratio"] = row["ours_int8_ms"] / row["ort_int8_ms"]
        row["int8_vs_fp32"] = row["ours_int8_ms"] / row["ours_fp32_ms"]
    if oursq is not None:
        row["qdq_ratio"] = row["ours_qdq_ms"] / row["ort_int8_ms"]
    elif pre and int8:
        row["qdq_ratio"] = row["int8_ratio"]
    del row["_stage"]
    return row


def _fmt(row: dict) -> str:
    if "failed" in row:
        return f"{row['model']:<30} FAILED {row['failed']}"
    if "int8_ratio" not in row:
        return (f"{row['model']:<30} {row['compile_fp32_s']:5.1f}     -  "
                f"{row['ours_fp32_ms']:8.2f} {row['ort_fp32_ms']:8.2f} {row['fp32_ratio']:5.2f}  "
                f"{'-':>8} {'-':>8} {'-':>5}  {'-':>5}  {'-':>6} {'-':>6}  {row['fp32_max_err']:.1e}")
    return (f"{row['model']:<30} {row['compile_fp32_s']:5.1f} {row['compile_int8_s']:5.1f}  "
            f"{row['ours_fp32_ms']:8.2f} {row['ort_fp32_ms']:8.2f} {row['fp32_ratio']:5.2f}  "
            f"{row['ours_int8_ms']:8.2f} {row['ort_int8_ms']:8.2f} {row['int8_ratio']:5.2f}  "
            f"{row['int8_vs_fp32']:5.2f}  {row['ours_int8_db']:6.1f} {row['ort_int8_db']:6.1f}  "
            f"{row['fp32_max_err']:.1e}" +
            (f"  qdq {row['qdq_ratio']:5.2f} {row['qdq_agree_db']:6.1f} dB" if "qdq_ratio" in row else ""))


HEADER = (f"{'model':<30} {'compile s':>11}  {'fp32 ms: ours':>13} {'ORT':>8} {'ratio':>5}  "
          f"{'int8 ms: ours':>13} {'ORT':>8} {'ratio':>5}  {'8/32':>5}  {'SQNR: ours':>10} {'ORT':>6}  fp32 err\n"
          f"{'':<30} {'fp32  int8':>11}")


def summary(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if "failed" not in r]
    out = [f"models: {len(rows)}, built and ran: {len(ok)}, failed: {len(rows) - len(ok)}"]
    if not ok:
        return out

    def gm(k, over=ok):
        return float(np.exp(np.mean([np.log(r[k]) for r in over])))

    int8 = "int8_ratio" in ok[0]                 # not with --fp32-only
    ratios = (("fp32_ratio", "fp32 ours/ORT"), ("int8_ratio", "int8 ours/ORT int8"), ("int8_vs_fp32", "int8/fp32 ours"))
    floats = [r for r in ok if not r.get("prequantized")] or ok     # not a QDQ file: ORT ran it in fp32
    for k, label in ratios if int8 else ratios[:1]:
        over = floats if k == "fp32_ratio" else ok
        worst = max(over, key=lambda r: r[k])
        out.append(f"{label:<20} geomean {gm(k, over):5.2f}  worst {worst[k]:5.2f} ({worst['model']})")
    pre = [r for r in ok if r.get("prequantized")]
    if pre and len(pre) < len(ok):
        out.append(f"{'fp32, left out':<20} " + ", ".join(f"{r['model']} {r['fp32_ratio']:.2f}" for r in pre)
                   + " (pre-quantized: our float build of the file beside ORT's integer run of it)")
    if not int8:
        return out
    margin = min(floats, key=lambda r: r["ours_int8_db"] - r["ort_int8_db"])     # a QDQ file's ORT SQNR is inf
    below = [r["model"] for r in floats if r["ours_int8_db"] < r["ort_int8_db"]]
    out.append(f"{'int8 SQNR ours-ORT':<20} worst {margin['ours_int8_db'] - margin['ort_int8_db']:+5.1f} dB "
               f"({margin['model']}); below ORT: {len(below)} {below if below else ''}")
    qd = [r for r in ok if "qdq_ratio" in r]
    if qd:
        worst = max(qd, key=lambda r: r["qdq_ratio"])
        agree = min(qd, key=lambda r: r["qdq_agree_db"])
        gq = float(np.exp(np.mean([np.log(r["qdq_ratio"]) for r in qd])))
        out.append(f"{'QDQ ours/ORT':<20} geomean {gq:5.2f}  worst {worst['qdq_ratio']:5.2f} ({worst['model']}) "
                   f"over {len(qd)} QDQ files; agreement with ORT on them: lowest {agree['qdq_agree_db']:.1f} dB "
                   f"({agree['model']})")
    cmax = max(ok, key=lambda r: max(r["compile_fp32_s"], r["compile_int8_s"]))
    out.append(f"{'compile':<20} slowest {max(cmax['compile_fp32_s'], cmax['compile_int8_s']):.1f} s "
               f"({cmax['model']})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--group", choices=zoo.loader.GROUPS, default=None)
    ap.add_argument("--calib", type=int, default=32, metavar="N", help="calibration samples (default 32)")
    ap.add_argument("--eval", type=int, default=8, metavar="N", help="evaluation samples (default 8)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--fp32-only", action="store_true", help="fp32 builds only: no int8 builds, no ORT quantization")
    ap.add_argument("--qdq", action="store_true", help="also compile ORT's QDQ file with ours (fold-qdq) and "
                    "time it beside ORT on that file")
    ap.add_argument("--dynamic", action="store_true", help="int8 columns in dynamic mode: ours --activations "
                    "dynamic beside ORT's quantize_dynamic (no calibration on either side)")
    a = ap.parse_args(argv)
    want = [s for s in a.models.split(",") if s]
    ms = [m for m in zoo.models(a.group) if not want or m.name in want]
    if want and len(ms) != len(want):
        ap.error(f"unknown models: {sorted(set(want) - {m.name for m in ms})}")
    print(f"# bench/zoo.py: {len(ms)} models, {a.threads} threads, calib {a.calib}, eval {a.eval}, "
          f"{a.rounds} rounds x {a.iters} iters", flush=True)
    print(HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoo_bench_") as tmp:
        for m in ms:
            row = bench_model(m, Path(tmp), a.calib, a.eval, a.rounds, a.iters, a.threads, int8=not a.fp32_only,
                              qdq=a.qdq, dynamic=a.dynamic)
            rows.append(row)
            print(_fmt(row), flush=True)
            for p in Path(tmp).glob(f"{m.name}*"):          # keep the disk small
                if p.is_dir():
                    import shutil
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
    print()
    for line in summary(rows):
        print(line)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
