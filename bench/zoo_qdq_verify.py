"""``qcompile verify`` on ONNX Runtime's QDQ files of the zoo's float models (issue #35's parity check).

    python bench/zoo_qdq_verify.py                                  # every float zoo model, per channel, uint8
    python bench/zoo_qdq_verify.py --variants all --models resnet18,mobilenet_v2
    python bench/zoo_qdq_verify.py --target arm --models mnasnet     # the aarch64 artifact under qemu

For each model and variant, ORT's ``quantize_static`` writes the QDQ file (zoo.ort_quantize_static:
MinMax on 16 calibration feeds; ``pc``/``pt`` weights per channel / per tensor, ``asym`` uint8
activations with a zero point / ``sym`` int8 with zero point 0), ``qcompile FILE --dtype int8
--debug-layers`` compiles it with its own scales (fold-qdq), and :func:`qcompiler.verify.verify`
compares every stored integer layer, each of our kernels alone on ORT's inputs, with ORT running
that file (within 1 LSB, >= 99 % exact; outputs >= 99.9 % within 1 LSB), on 4 evaluation feeds.
One line per model and variant, then the count that passed; ``--json`` keeps the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402
from zoo.harness import cli_args, save_runs  # noqa: E402

VARIANTS = {"pc-asym": (True, False), "pt-asym": (False, False), "pc-sym": (True, True), "pt-sym": (False, True)}


def check(m, variant: str, tmp: Path, target: str, samples: int) -> dict:
    import contextlib
    import io

    from qcompiler.cli import main as qcompile
    from qcompiler.verify import verify
    per_channel, symmetric = VARIANTS[variant]
    row = {"model": m.name, "variant": variant, "target": target}
    t = time.perf_counter()
    try:
        qdq = zoo.ort_quantize_static(m, m.feeds(16, seed=0), tmp / f"{m.name}.{variant}.onnx",
                                      per_channel=per_channel, symmetric=symmetric)
        out = tmp / f"{m.name}.{variant}.{target}"
        args = cli_args(m, "int8", out, path=qdq) + ["--debug-layers"]
        args[args.index("--target") + 1] = target
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = qcompile(args)
        if rc != 0:
            raise RuntimeError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"rc {rc}")
        data = save_runs(m.feeds(samples, seed=1), tmp / "eval.npz")
        rep = verify(out, data, qdq=qdq)
        compared = rep.compared
        row.update(passed=rep.passed, verdict=rep.verdict(), layers=len(compared),
                   missing=len(rep.layers) - len(compared),
                   worst_lsb=max((r.max_lsb for r in compared), default=0.0),
                   worst_layer=max(compared, key=lambda r: r.max_lsb).name if compared else "",
                   min_exact=min((r.exact for r in compared), default=1.0),
                   output_within1=min((r.within1 for r in rep.outputs), default=1.0))
    except Exception as e:                         # noqa: BLE001 - one row per model, the run goes on
        row.update(passed=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    row["seconds"] = round(time.perf_counter() - t, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated zoo names (default: every float model)")
    ap.add_argument("--group", default=None, choices=("wheel", "torch", "transformers"))
    ap.add_argument("--variants", default="pc-asym", help="comma-separated of " + ", ".join(VARIANTS) + ", or all")
    ap.add_argument("--target", default="x86", choices=("x86", "arm"))
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    from qcompiler.frontend.onnx_qdq import is_prequantized
    ms = [zoo.get(n) for n in a.models.split(",")] if a.models else zoo.models(a.group)
    ms = [m for m in ms if not m.xfail("import") and not is_prequantized(str(m.path()))]
    variants = list(VARIANTS) if a.variants == "all" else a.variants.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for m in ms:
            for v in variants:
                r = check(m, v, Path(d), a.target, a.samples)
                rows.append(r)
                print(f"{m.name:<28} {v:<8} {'PASS' if r['passed'] else 'FAIL'} {r['seconds']:6.1f} s  "
                      + (r.get("error") or f"{r['layers']} layers, worst {r['worst_lsb']:g} LSB ({r['worst_layer']}), "
                         f">= {100 * r['min_exact']:.3f} % exact, output {100 * r['output_within1']:.3f} % "
                         f"within 1 LSB" + (f", {r['missing']} not in the file" if r['missing'] else "")),
                      flush=True)
    ok = sum(r["passed"] for r in rows)
    print(f"\n{ok} of {len(rows)} passed ({len(ms)} models x {len(variants)} variants, {a.target})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
