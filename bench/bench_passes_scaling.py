"""Import and default-pipeline time against graph size (issue #33): Add/Mul chains of n ops.

    python bench/bench_passes_scaling.py [N ...]        (default: 2000 5000 20000 40000)

Builds the chain of tests/passes/test_linear_scaling.py (node i is Add if i is even else Mul, with
a constant c{i % 7} of shape [1], input x float [1, 8], opset 17), then times, in one process,
import_onnx alone and the default pipeline (with its verify after every pass), and prints the time
per 1,000 ops, which stays flat when the work is linear. The same chain as a file, for
``qcompile inspect CHAIN --passes default``, is written with --save DIR.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests", "passes")]     # this checkout's qcompiler

from test_linear_scaling import chain_model  # noqa: E402

from qcompiler.frontend.onnx_import import import_onnx  # noqa: E402
from qcompiler.passes.manager import run_passes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[2000, 5000, 20000, 40000])
    ap.add_argument("--save", metavar="DIR", help="also write DIR/chainN.onnx")
    args = ap.parse_args()
    print(f"{'ops':>8} {'import s':>10} {'passes s':>10} {'total s':>10} {'ms / 1k ops':>12}")
    for n in args.sizes:
        model = chain_model(n)
        if args.save:
            import onnx
            onnx.save(model, os.path.join(args.save, f"chain{n}.onnx"))
        t0 = time.perf_counter()
        g = import_onnx(model)
        t1 = time.perf_counter()
        run_passes(g, "default")
        t2 = time.perf_counter()
        print(f"{n:>8} {t1 - t0:>10.2f} {t2 - t1:>10.2f} {t2 - t0:>10.2f} {1e6 * (t2 - t0) / n:>12.1f}")


if __name__ == "__main__":
    main()
