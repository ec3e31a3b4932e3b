"""Pruning + int8 on the trained Fashion-MNIST model: accuracy and artifact size per pruning recipe.

    .venv/bin/python bench/sparse_sizes.py [--calib 256] [--eval 744] [--out DIR]

Each row is one real ``qcompile`` run (x86, int8, calibrated on the first ``--calib`` images of
models/fashion_test.npz, evaluated on the next ``--eval`` labelled images, no fine-tuning) whose
numbers come from its OUT/report.json: fp32 top-1 of the pruned float model and of the int8
artifact, the conv/gemm weight bytes model.so stores (in the format ``encode-sparse`` chose), the
model.so bytes and their ratio to the unpruned int8 model.so, plus the floor: model.so minus every
conv/gemm weight byte, i.e. the size even a zero-byte weight encoding could not go below.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL, DATA = ROOT / "models" / "fashion_mobilenet.onnx", ROOT / "models" / "fashion_test.npz"
RECIPES = [
    ("none", []),
    ("50 % per layer", ["--sparsity", "0.5"]),
    ("50 % global", ["--sparsity", "0.5", "--sparsity-global"]),
    ("2:4, `--sparse-objective size`", ["--sparsity", "0.5", "--sparsity-pattern", "2:4", "--sparse-objective", "size"]),
    ("70 % per layer, `size`", ["--sparsity", "0.7", "--sparse-objective", "size"]),
    ("90 % global, `size`", ["--sparsity", "0.9", "--sparsity-global", "--sparse-objective", "size"]),
]


def compile_one(args, flags: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-c", "import sys; from qcompiler.cli import main; sys.exit(main())", str(MODEL), "--target", "x86", "--dtype", "int8", "--calib", str(DATA),
           "--calib-samples", str(args.calib), "--eval-samples", str(args.eval), "-q", "-o", str(out), *flags]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "report.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--eval", type=int, default=744)
    ap.add_argument("--out", default=None, help="keep the artifacts here (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        print("| pruning | fp32 top-1 | int8 top-1 | conv/gemm weights stored | model.so | vs dense int8 | "
              "model.so without any conv/gemm weight |")
        print("|---|---|---|---|---|---|---|")
        dense = None
        for i, (name, flags) in enumerate(RECIPES):
            r = compile_one(args, flags, base / f"r{i}")
            lib = r["size"]["library_int8_bytes"]
            dense = dense or lib
            sec = r.get("sparsity") or {}
            acc = r["evaluation"].get("accuracy") or {}
            pe = (sec.get("pruning_effect") or {}).get("accuracy") or {}
            fp32 = pe.get("fp32_pruned", acc.get("fp32"))
            stored = sec.get("weights_stored_bytes", sec.get("weights_dense_bytes", 0))
            fmts = {row["format"] for row in sec.get("layers", [])} - {"dense"}
            how = f" ({', '.join(sorted(fmts))} + dense)" if fmts else " (dense)"
            print(f"| {name} | {100 * fp32:.2f} % | {100 * acc['int8']:.2f} % | {stored:,} B{how} | {lib:,} B | "
                  f"{lib / dense:.3f} | {lib - stored:,} B ({(lib - stored) / dense:.3f}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
