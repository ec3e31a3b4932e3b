"""One zoo model built twice, with an environment switch on and off, timed side by side in one run.

    python bench/ab_env.py QC_PAD_CHANNELS shufflenet_v2_x1_0,mtcnn-pnet --dtypes fp32,int8

Per model and dtype: ``zoo.harness.build`` (what ``qcompile`` runs; int8 on ``--calib`` feeds of
seed 0) with ``VAR=1`` and ``VAR=0``, the largest difference of their outputs on 2 feeds (relative
to max|output|), and their latency: ``--rounds`` interleaved rounds of the median of ``--iters``
calls each, 2 threads, spinning off (as bench/zoo.py); printed: the smallest round median of each,
their ratio (on / off) and the medians over rounds, then both compile times.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import zoo  # noqa: E402
from zoo.harness import build  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("var", help="the environment variable read at compile time (set to 1 and to 0)")
    ap.add_argument("models", help="zoo model names, comma-separated")
    ap.add_argument("--dtypes", default="fp32,int8")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--out", default=None, help="build folder (default: a temporary one)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import tempfile
    root = Path(a.out or tempfile.mkdtemp(prefix="ab_env_"))
    for name in a.models.split(","):
        m = zoo.get(name)
        for dtype in a.dtypes.split(","):
            feeds = m.feeds(2, seed=1)
            calib = m.feeds(a.calib, seed=0) if dtype == "int8" else None
            arts, outs, secs = {}, {}, {}
            for tag in ("1", "0"):
                os.environ[a.var] = tag
                b = build(m, dtype, root / f"{name}_{dtype}_{tag}", calib=calib)
                arts[tag], secs[tag], outs[tag] = b, b.seconds, [b(f) for f in feeds]
            worst = max(float(np.abs(np.asarray(x, np.float64) - y).max()) / max(float(np.abs(y).max()), 1e-12)
                        for xs, ys in zip(outs["1"], outs["0"]) for x, y in zip(xs, ys))
            ts: dict[str, list[float]] = {t: [] for t in arts}
            for art in arts.values():
                for _ in range(3):
                    art(feeds[0])
            for _ in range(a.rounds):
                for t, art in arts.items():
                    calls = []
                    for _ in range(a.iters):
                        t0 = time.perf_counter()
                        art(feeds[0])
                        calls.append(time.perf_counter() - t0)
                    ts[t].append(float(np.median(calls)))
            on, off = 1e3 * min(ts["1"]), 1e3 * min(ts["0"])
            print(f"{name:32s} {dtype}: rel diff {worst:.2e}; ms {a.var}=1 {on:.3f}, =0 {off:.3f}, ratio {on / off:.3f} "
                  f"(medians {1e3 * np.median(ts['1']):.3f} / {1e3 * np.median(ts['0']):.3f}); "
                  f"compile {secs['1']:.1f} / {secs['0']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
