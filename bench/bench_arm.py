"""ARM (aarch64): instruction counts of the compiled kernels and the analytic cost model, in one run.

    python bench/bench_arm.py                       # fashion_mobilenet, mnistnet, rapidocr-cls
    python bench/bench_arm.py --models cls --cpu cortex-a76

Timings under qemu-aarch64 are meaningless (it translates every instruction), so for ARM this
script reports what the compiler emitted and what the hardware would need for it:

* for each model, three builds through the CLI (``qcompile --target arm --cpu CPU``): fp32; int8 with
  ``--features=+dotprod`` (the ``sdot`` kernels) and int8 with ``--features=-dotprod`` (the plain NEON loops);
  int8 is calibrated on real data where the model has some (Fashion-MNIST test images, MNIST
  digits), else on the model's own text-image inputs;
* the libraries are linked with their symbols (``QCOMPILER_KEEP_SYMBOLS=1``; release builds strip
  them) and disassembled with ``aarch64-linux-gnu-objdump``; per build: kernels, instructions in the
  kernel bodies (``kN_*_compute_``), and the instruction classes that do the arithmetic: ``sdot/udot``,
  NEON integer multiplies (``mul/mla/smull/smlal/umull/umlal``, vector operands), NEON float
  ``fmla/fmul``;
* the analytic model of :mod:`qcompiler.plan.layer_cost` (``ANALYTIC["arm"]``: the per-layer
  costs latency-aware selective unquantization uses for ARM) summed over the model, and a
  peak-issue bound per build: every conv/gemm multiply-accumulate at the core's peak for the
  instruction class its kernels use (Arm Cortex-A76 Software Optimization Guide: two 128-bit ASIMD
  pipes, each ``sdot`` 16 MACs, each 16-bit ``smlal`` 8, each ``fmla`` 4 per cycle; depthwise convs
  never use ``sdot``), at ``--ghz``. Static counts, not executed ones: they show which instructions
  the kernels are made of, not how often each runs.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

OBJDUMP = "aarch64-linux-gnu-objdump"
MAC_PER_CYCLE = {"sdot": 32, "int16": 16, "fp32": 8}
CLASSES = {
    "sdot/udot": re.compile(r"^(s|u|us)dot$"),
    "int mul": re.compile(r"^(mul|mla|mls|smull2?|smlal2?|umull2?|umlal2?|sqdmulh|sqrdmulh)$"),
    "fmla/fmul": re.compile(r"^(fmla|fmul|fmls)$"),
}


def model_data(name: str):
    """(onnx path, input shapes or None, calibration array) for a short model name."""
    import realmodels as rm
    if name in ("fashion", "fashion_mobilenet"):
        x, _ = rm.fashion_test()
        return rm.MODELS_DIR / "fashion_mobilenet.onnx", None, x[:64].astype(np.float32)
    if name in ("mnist", "mnistnet"):
        return rm.MODELS_DIR / "mnistnet.onnx", None, rm.mnist_inputs(64)[0]
    if name in ("cls", "rapidocr-cls"):
        m = {m.name: m for m in rm.rapidocr_models()}["rapidocr-cls"]
        feeds = [m.feeds(s) for s in range(8)]
        (key,) = feeds[0]
        return Path(m.load()), m.input_shapes, \
            np.concatenate([f[key] for f in feeds])
    raise SystemExit(f"unknown model '{name}' (fashion, mnist, cls)")


def build(onnx_path, shapes, calib, out: Path, cpu: str, dtype: str, dotprod: bool) -> None:
    """= qcompile ONNX --target arm --cpu CPU --dtype DTYPE --features=(+|-)dotprod [--calib C --debug-layers]."""
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.driver import CalibOptions, CompileOptions, ModelSource, compile
    spec = TargetSpec("arm", dtype=dtype, cpu=cpu, features=("+dotprod" if dotprod else "-dotprod",),
                      debug_layers=dtype == "int8")      # cortex-a76 has dotprod itself
    calib_opts = CalibOptions()
    if dtype == "int8":
        np.save(out.parent / "calib.npy", calib)
        calib_opts = CalibOptions(source=str(out.parent / "calib.npy"), samples=len(calib))
    os.environ["QCOMPILER_KEEP_SYMBOLS"] = "1"
    try:
        compile(ModelSource(str(onnx_path), dict(shapes or {})), out,
                CompileOptions(target=spec, calib=calib_opts, quiet=True))
    finally:
        del os.environ["QCOMPILER_KEEP_SYMBOLS"]


def instruction_counts(lib: Path) -> tuple[int, Counter]:
    """(kernels, instruction class counts) over the kernel bodies of an aarch64 library."""
    text = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    counts, kernels, inside = Counter(), set(), False
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            name = head.group(1)
            inside = bool(re.match(r"^k\d+_.*_compute_", name))
            if inside:
                kernels.add(name.split("_compute_")[0])
            continue
        if not inside:
            continue
        parts = line.split("\t")
        if len(parts) < 2 or not parts[1].strip():
            continue
        mnem = parts[1].split()[0]
        ops = parts[2] if len(parts) > 2 else ""
        counts["instructions"] += 1
        for cls, rx in CLASSES.items():
            if rx.match(mnem) and (cls == "sdot/udot" or "v" in ops.split(",")[0]):
                counts[cls] += 1
    return len(kernels), counts


def graph_macs(out: Path) -> tuple[int, int]:
    """(conv/gemm MACs, of which depthwise) of the quantized graph the int8 artifact was built from."""
    from qcompiler.ir.parser import parse_graph
    from qcompiler.plan.layer_cost import macs
    g = parse_graph((out / "model.qir").read_text())
    total = dw = 0
    for op in g.ops:
        m = macs(op)
        total += m
        if m and op.attrs.get("group", 1) > 1 and op.operands[1].shape[1] == 1:
            dw += m
    return total, dw


def analytic_ms(onnx_path, shapes, int8_out: Path | None) -> float:
    """The layer_cost analytic model summed over the model: the int8 graph the artifact was built
    from (its quantized ops at the int8 rate), or the float graph after the default passes."""
    import qcompiler
    from qcompiler.ir.parser import parse_graph
    from qcompiler.plan.layer_cost import ANALYTIC, analytic_times
    if int8_out is not None:
        g = parse_graph((int8_out / "model.qir").read_text())
    else:
        g = qcompiler.import_onnx(str(onnx_path), shapes)
        qcompiler.run_passes(g, "default")
    return sum(t for _, t in analytic_times(g, ANALYTIC["arm"], "fp32"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="fashion,mnist,cls")
    p.add_argument("--cpu", default="cortex-a76")
    p.add_argument("--ghz", type=float, default=2.4, help="core clock for the peak-issue bound")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_arm_"))
    print(f"# aarch64 {args.cpu}: static instruction counts of the kernel bodies; peak-issue bound at "
          f"{args.ghz} GHz; analytic = qcompiler.plan.layer_cost ANALYTIC['arm']")
    print("\n| model | build | kernels | instructions | sdot/udot | NEON int mul | NEON fmla/fmul | MMAC "
          "| peak-issue bound ms | analytic ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        onnx_path, shapes, calib = model_data(name)
        outs = {}
        for label, dtype, dot in (("fp32", "fp32", False), ("int8 +dotprod", "int8", True),
                                  ("int8 plain NEON", "int8", False)):
            d = work / f"{name}_{label.replace(' ', '_').replace('+', '')}"
            d.mkdir()
            build(onnx_path, shapes, calib, d / "OUT", args.cpu, dtype, dot)
            outs[label] = d / "OUT"
        total, dw = graph_macs(outs["int8 +dotprod"])
        for label, out in outs.items():
            kernels, c = instruction_counts(out / "model.so")
            if label == "fp32":
                cycles = total / MAC_PER_CYCLE["fp32"]
            else:
                dense_rate = MAC_PER_CYCLE["sdot"] if c["sdot/udot"] else MAC_PER_CYCLE["int16"]
                cycles = (total - dw) / dense_rate + dw / MAC_PER_CYCLE["int16"]
            bound = cycles / (args.ghz * 1e9) * 1e3
            an = analytic_ms(onnx_path, shapes, None if label == "fp32" else out)
            print(f"| {name} | {label} | {kernels} | {c['instructions']} | {c['sdot/udot']} | {c['int mul']} | "
                  f"{c['fmla/fmul']} | {total / 1e6:.1f} | {bound:.3f} | {an:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
