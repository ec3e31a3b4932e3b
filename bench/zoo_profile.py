"""Where a zoo model's time goes: our artifact's kernels, slowest first, beside ONNX Runtime's ops.

    python bench/zoo_profile.py mtcnn-onet                 # fp32
    python bench/zoo_profile.py smart-turn-v3.2 --dtype int8   # a pre-quantized model's int8 build
    python bench/zoo_profile.py deit_tiny --dtype int8         # ORT quantize_static's QDQ file, in both engines
    python bench/zoo_profile.py mobilenet_v3_large --top 30
    python bench/zoo_profile.py bert-base-seq128 --dtype dynamic  # --activations dynamic vs ORT quantize_dynamic

Ours: every kernel of the default fp32 build (int8: a QDQ model's fold-qdq build; a float model is
first quantized by ORT's ``quantize_static`` on 32 calibration feeds, as ``bench/zoo.py --qdq`` does,
and both engines profile that file) timed alone (TVM's time_evaluator; TVM 0.27's Relax
VM has no profiler), with the IR ops fused into it and its output shape. ORT:
its own profiler (``enable_profiling``), per node type and per node, the median over the same
number of runs, 2 threads each (TVM_NUM_THREADS=2, ORT intra_op_num_threads=2).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import zoo  # noqa: E402


def ours(m, dtype: str, path: Path) -> list[tuple[str, float]]:
    """Every kernel of our fp32 build timed alone (qcompiler.plan.layer_cost.time_each_kernel:
    TVM's time_evaluator on the kernel's constants and random activations), with the IR ops
    fused into it."""
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import run_passes
    from qcompiler.plan.layer_cost import time_each_kernel
    g = import_onnx(str(path), m.input_shapes, input_values=m.input_values or None)
    run_passes(g, {"int8": "default,fold-qdq", "dynamic": "default,quantize-dynamic"}.get(dtype, "default"))
    rows = []
    for members, name, _, ms in time_each_kernel(g, TargetSpec(family="x86", dtype="fp32" if dtype == "fp32" else "int8")):
        kinds = "+".join(op.kind for op in members)
        rows.append((f"{name} [{kinds}] {tuple(members[-1].results[0].shape) if members[-1].results else ''}", ms))
    return sorted(rows, key=lambda kv: -kv[1])


def theirs(m, path: Path, feed: dict, runs: int) -> list[tuple[str, float]]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.enable_profiling = True
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as d:
        so.profile_file_prefix = str(Path(d) / "ort")
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        of = m.ort_feeds(feed)
        for _ in range(3 + runs):
            s.run(None, of)
        events = json.loads(Path(s.end_profiling()).read_text())
    tot: dict[str, float] = defaultdict(float)
    per_run = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            key = f"{e['args'].get('op_name', '?')} {e['name'][:-len('_kernel_time')]}"
            tot[key] += e["dur"] / 1e3
            per_run[key] += 1
    n = 3 + runs
    return sorted(((k, v / n) for k, v in tot.items()), key=lambda kv: -kv[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dtype", choices=("fp32", "int8", "dynamic"), default="fp32",
                    help="dynamic: ours --activations dynamic beside ORT's quantize_dynamic file")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    m = zoo.get(a.model)
    feed = m.feeds(1, seed=1)[0]
    from qcompiler.frontend.onnx_qdq import is_prequantized
    tmp = tempfile.TemporaryDirectory()
    path = m.path()
    if a.dtype == "dynamic":
        path = zoo.ort_quantize_dynamic(m, Path(tmp.name) / f"{m.name}.ort_dyn.onnx")
        mine = ours(m, a.dtype, m.path())
    elif a.dtype == "int8" and not is_prequantized(str(path)):
        path = zoo.ort_quantize_static(m, m.feeds(32, seed=0), Path(tmp.name) / f"{m.name}.ort_int8.onnx")
    if a.dtype != "dynamic":
        mine = ours(m, a.dtype, path)
    total = sum(v for _, v in mine)
    kinds: dict[str, float] = defaultdict(float)
    for name, ms in mine:
        kinds[name.split("[")[1].split("]")[0]] += ms
    print(f"# {m.name} {a.dtype}: ours {total:.3f} ms in {len(mine)} kernels (each timed alone, summed); by kind: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:10]))
    for name, ms in mine[:a.top]:
        print(f"  {ms:8.3f} ms {100 * ms / total:5.1f} %  {name}")
    ort_rows = theirs(m, path, feed, a.runs)
    total = sum(v for _, v in ort_rows)
    by_type: dict[str, float] = defaultdict(float)
    for k, v in ort_rows:
        by_type[k.split()[0]] += v
    print(f"# ONNX Runtime {a.dtype}: {total:.3f} ms in {len(ort_rows)} nodes; by type: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])[:10]))
    for name, ms in ort_rows[:a.top]:
        print(f"  {ms:8.3f} ms {100 * ms / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
