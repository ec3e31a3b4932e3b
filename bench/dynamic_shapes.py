"""One artifact for every sequence length (``--dynamic``) against one build per length.

    python bench/dynamic_shapes.py                                   # all-minilm-l6-v2, fp32
    python bench/dynamic_shapes.py --models all-minilm-l6-v2,bert-base-seq128 --dtype int8-dyn
    python bench/dynamic_shapes.py --lengths 8,77,128,512 --range 1..512

Per zoo model with a ``dynamic`` dim (its ``path(dynamic=True)`` file): one artifact compiled with
``--dynamic sequence=LO..HI`` (default buckets) and one static artifact per length
(``--input-shape NAME=1xL`` for every token input), both from the same ONNX file. Per length: the
largest relative difference of the dynamic artifact's outputs from the static build's
(max |a - b| / max |b|), and the time of one call of each beside ONNX Runtime fp32 on the same
file (fp32), or on ONNX Runtime's ``quantize_dynamic`` of it (int8-dyn), 2 threads: the three
timed in ``--rounds`` interleaved rounds, each the median of ``--iters`` calls after a warm-up,
the best round reported. Also the compile times and the
model.so sizes (the buckets share their weights). Inputs: real token ids of zoo/data's
tokenizer where the model has them (``data = "tokens"``), else ones; mask 1, token types 0.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))
import zoo  # noqa: E402
from _timing import median_ms  # noqa: E402

DTYPES = {"fp32": [], "int8-dyn": ["--dtype", "int8", "--activations", "dynamic"]}
PEER = {"fp32": "fp32", "int8-dyn": "quantize_dynamic"}


def feed(m, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (dtype, _) in m.inputs.items():
        if "mask" in name:
            out[name] = np.ones((1, length), np.int64)
        elif "type" in name:
            out[name] = np.zeros((1, length), np.int64)
        else:       # ids of ordinary word pieces (1000..20000 are words in BERT's vocabulary)
            ids = rng.integers(1000, 20000, (1, length)).astype(np.int64)
            ids[0, 0], ids[0, -1] = 101, 102               # [CLS] ... [SEP]
            out[name] = ids
    return out


def qcompile(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qcompiler.cli", *args, "-q"], check=True)
    return time.perf_counter() - t0


def bench(m, dtype: str, lengths: list[int], rng: str, iters: int, rounds: int, tmp: Path) -> list[str]:
    import onnxruntime as ort

    import qcompiler
    path = m.path(dynamic=True)
    dim = m.dynamic.partition("=")[0]
    lines = [f"## {m.name} {dtype}: --dynamic {dim}={rng} vs one build per length"]
    dyn_dir = tmp / f"{m.name}-{dtype}-dyn"
    t_dyn = qcompile([str(path), "--dynamic", f"{dim}={rng}", *DTYPES[dtype], "-o", str(dyn_dir)])
    dyn = qcompiler.load(dyn_dir)
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ["TVM_NUM_THREADS"])
    peer = path if dtype == "fp32" else zoo.ort_quantize_dynamic(m, tmp / f"{m.name}-ort-dyn.onnx", dynamic=True)
    sess = ort.InferenceSession(str(peer), so, providers=["CPUExecutionProvider"])
    size = (dyn_dir / "model.so").stat().st_size
    lines.append(f"dynamic artifact: {len(dyn.buckets.buckets)} buckets "
                 f"({', '.join(str(s[dim]) for s, _ in dyn.buckets.buckets)}), compiled in {t_dyn:.0f} s, "
                 f"model.so {size / 2**20:.1f} MiB")
    lines.append(f"| length | bucket | max rel diff vs static | dynamic ms | static ms | ORT {PEER[dtype]} ms "
                 "| dynamic/static | dynamic/ORT | static build s | static model.so MiB |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in lengths:
        f = feed(m, n)
        st_dir = tmp / f"{m.name}-{dtype}-{n}"
        shapes = [a for k in m.inputs for a in ("--input-shape", f"{k}=1x{n}")]
        t_st = qcompile([str(path), *shapes, *DTYPES[dtype], "-o", str(st_dir)])
        st = qcompiler.load(st_dir)
        a, b = dyn(**f), st(**f)
        diff = max(float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)) for x, y in zip(a, b))
        calls = (lambda: dyn(**f), lambda: st(**f), lambda: sess.run(None, f))
        for c in calls:
            c()                                          # warm-up
        # rounds interleaved, the best round's median each: a burst of load on a shared host hits one round
        td, ts, to = (min(t) for t in zip(*[[median_ms(c, iters) for c in calls] for _ in range(rounds)]))
        bucket = dyn.buckets.pick({dim: n})[0][dim]
        lines.append(f"| {n} | {bucket} | {diff:.1e} | {td:.2f} | {ts:.2f} | {to:.2f} | {td / ts:.2f} | {td / to:.2f} "
                     f"| {t_st:.0f} | {(st_dir / 'model.so').stat().st_size / 2**20:.1f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all-minilm-l6-v2")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--lengths", default="8,77,128,512")
    ap.add_argument("--range", default="1..512")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")]
    with tempfile.TemporaryDirectory() as d:
        for name in a.models.split(","):
            print("\n".join(bench(zoo.get(name), a.dtype, lengths, a.range, a.iters, a.rounds, Path(d))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
