"""x86 fp32: compile time and batch-1 latency of every real model, beside onnxruntime.

    python bench/bench_x86_fp32.py                     # all models, detector at 640x640
    python bench/bench_x86_fp32.py --models rapidocr   # names containing "rapidocr"
    python bench/bench_x86_fp32.py --det-size 320 --rounds 5

Both sides use 2 threads (TVM_NUM_THREADS=2, ORT intra_op_num_threads=2). Latency is the median
over ``--rounds`` interleaved rounds (TVM, then ORT) of the median of ``--iters`` runs each, so
that load from other processes hits both alike. The ratio is TVM / ORT (< 1: TVM faster).
Spinning, as in bench/bench_int8.py: idle worker threads of neither engine busy-wait
(TVM_THREAD_POOL_SPIN_COUNT=0, ORT session.intra_op.allow_spinning=0); with spinning, the thread ORT
leaves spinning after ``run`` holds a core while TVM's next call waits for its worker (measured:
uspsnet 0.05 ms alone, 4-7 ms right after an ORT run). ``--spin`` turns spinning back on in both.
Compile time is lower (kernel building + scheduling) plus tvm.compile (LLVM).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
if "--spin" not in sys.argv:
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")    # see "Spinning" in the docstring
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

import realmodels  # noqa: E402
from realmodels import all_models  # noqa: E402


def ort_session(model, threads: int, spin: bool = False):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    src = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


from _timing import median_ms as _median_ms  # noqa: E402  (bench/ is on sys.path when run as a script)


def bench_model(m, rounds: int, iters: int, threads: int, passes: str = "default", spin: bool = False):
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import compile_timed
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import run_passes

    t0 = time.perf_counter()
    g = import_onnx(m.load(), m.input_shapes)
    run_passes(g, passes)                        # what `qcompile` does before code generation
    t_import = time.perf_counter() - t0
    ex, info = compile_timed(g, TargetSpec("x86"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    feeds = m.feeds()
    args = [tvm.runtime.tensor(feeds[v.name]) for v in g.inputs]
    f = vm["main"]
    sess = ort_session(m.load(), threads, spin)
    out = f(*args)
    got = [o.numpy() for o in (list(out) if not isinstance(out, tvm.runtime.Tensor) else [out])]
    refs = sess.run(None, feeds)
    err = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)) for a, b in zip(got, refs))
    for _ in range(2):
        f(*args)
        sess.run(None, feeds)
    tvm_ms, ort_ms = [], []
    for _ in range(rounds):
        tvm_ms.append(_median_ms(lambda: f(*args), iters))
        ort_ms.append(_median_ms(lambda: sess.run(None, feeds), iters))
    return {"import_s": t_import, **info, "tvm_ms": float(np.median(tvm_ms)), "ort_ms": float(np.median(ort_ms)),
            "rel_err": err}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated substrings of model names (default: all)")
    ap.add_argument("--det-size", type=int, default=640, help="detector input side (multiple of 32)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", default="default", help="pass pipeline before codegen (default: qcompile's)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", help="let idle worker threads busy-wait (both engines)")
    a = ap.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    models = []
    for m in all_models():
        if a.models and not any(s in m.name for s in a.models.split(",")):
            continue
        if m.name == "rapidocr-det" and a.det_size:
            shape = (1, 3, a.det_size, a.det_size)
            m = replace(m, input_shapes={"x": shape},
                        make_feeds=lambda seed, s=shape: {"x": realmodels.rapidocr_input("det", s)})
        models.append(m)
    hdr = (f"{'model':22s} {'input':>16s} {'kernels':>7s} {'lower s':>8s} {'compile s':>9s} "
           f"{'TVM ms':>9s} {'ORT ms':>9s} {'TVM/ORT':>8s} {'rel err':>9s}")
    print(hdr)
    print("-" * len(hdr))
    for m in models:
        shape = "x".join(map(str, next(iter((m.input_shapes or realmodels._declared_inputs(m.proto())).values()))))
        try:
            r = bench_model(m, a.rounds, a.iters, a.threads, a.passes, a.spin)
        except Exception as e:  # noqa: BLE001 - report and go on with the next model
            print(f"{m.name:22s} {shape:>16s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        print(f"{m.name:22s} {shape:>16s} {r['kernels']:7d} {r['lower_s']:8.1f} {r['compile_s']:9.1f} "
              f"{r['tvm_ms']:9.2f} {r['ort_ms']:9.2f} {r['tvm_ms'] / r['ort_ms']:8.2f} {r['rel_err']:9.1e}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
