"""Static throughput of the ARM int8 conv kernels' inner loop: llvm-mca (-mcpu=cortex-a76) on the
innermost loop holding ``sdot`` of one QLinearConv built for ``--target arm --cpu cortex-a76
--features +dotprod``, for several register blockings. There is no ARM machine here and qemu timings
mean nothing, so this is the measurement behind the choices in qcompiler/codegen/kernels/qdot.py
(``_blocking``, ``INDEXED_SDOT``). It counts cycles per sdot of the steady-state loop only (not the
packing, epilogue or memory system); the bound is 0.5 (two ASIMD pipes issue one sdot each).

    .venv/bin/python scripts/arm_sdot_mca.py [llvm-mca binary, default llvm-mca]

Convs, variants: ``x86 rule, bo=4``: one register of 4 output channels, the x86 register budget;
``x86 rule``: what the x86 rule picks (8 channels when ow >= 8, 6 columns); ``bo=8, 32 regs``: the
tile sized for 32 NEON registers; ``final``: that tile with the indexed sdot (qdot's defaults).
Gemms (QLinearGemm), variants: ``x86 rule``: rows blocked by up to 8, one register of 4 columns
(each row's sdots one dependency chain); ``final``: up to 4 rows x 4 registers of columns.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qcompiler.codegen.kernels import conv as kconv  # noqa: E402
from qcompiler.codegen.kernels import qdot  # noqa: E402
from qcompiler.codegen.kernels.tensor import divisor_at_most  # noqa: E402
from qcompiler.codegen.lower import build_module  # noqa: E402
from qcompiler.codegen.x86 import schedules as x86  # noqa: E402
from qcompiler.codegen.target import TargetSpec  # noqa: E402
from qcompiler.ir import Graph, QuantParams, TensorType  # noqa: E402
from qcompiler.ir.ops import infer_types  # noqa: E402
from qcompiler.quant.requant import conv_multipliers  # noqa: E402

SPEC = TargetSpec("arm", dtype="int8", cpu="cortex-a76", features=("+dotprod",))
CASES = [  # (label, C, O, H=W, kernel, pads)
    ("3x3 64->64 at 28x28", 64, 64, 28, 3, 1),
    ("1x1 64->128 at 14x14", 64, 128, 14, 1, 0),
    ("1x1 96->24 at 7x7", 96, 24, 7, 1, 0),
    ("3x3 32->32 at 56x56", 32, 32, 56, 3, 1),
]
_orig = qdot._blocking


def _x86_rule(bo4: bool):
    def blocking(ctx, isa, kgp, lanes, ow, groups):
        bo = lanes if bo4 or not (kgp % (2 * lanes) == 0 and ow >= 8) else 2 * lanes
        return bo, kconv._reg_n(ow, ctx, bo)
    return blocking


VARIANTS = {"x86 rule, bo=4": (_x86_rule(True), False), "x86 rule": (_x86_rule(False), False),
            "bo=8, 32 regs": (_orig, False), "final": (_orig, True)}


def conv_graph(c, o, hw, k, p) -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("q")
    qx = QuantParams("uint8", (0.02,), (117,))
    x = g.add_input("x", TensorType((1, c, hw, hw), "uint8", qx))
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, o))
    w = g.add_const(rng.integers(-127, 128, (o, c, k, k)).astype(np.int8), "w",
                    QuantParams("int8", ws, (0,) * o, axis=0))
    ms, ss = conv_multipliers(0.02, ws, 0.05)
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [p] * 4, "group": 1, "activation": "",
             "activation_params": [], "multiplier": ms, "shift": ss}
    shape = infer_types("QLinearConv", [x.type, w.type], attrs)[0].shape
    g.outputs = [g.create_op("QLinearConv", [x, w], attrs,
                             result_types=[TensorType(shape, "uint8", QuantParams("uint8", (0.05,), (90,)))]).result]
    return g


def inner_loop(asm: str) -> list[str] | None:
    """The instructions of the loop with the most sdots that branches back to its own label."""
    lines = asm.splitlines()
    best = None
    for i, line in enumerate(lines):
        m = re.match(r"^(\.LBB\d+_\d+):", line)
        if not m:
            continue
        body = []
        for ln in lines[i + 1:]:
            if not ln.startswith("\t") or ln.startswith("\t."):
                if re.match(r"^\.LBB", ln):
                    break
                continue
            body.append(ln)
            op = ln.split()
            if op[0].startswith("b") and op[-1] == m.group(1):
                n = sum("sdot" in b for b in body)
                if n and (best is None or n > best[0]):
                    best = (n, body)
                break
    return best[1] if best else None


GEMMS = [(1, 1024, 256), (4, 512, 128), (8, 256, 64), (50, 256, 10)]   # (m, k, n)
_dense_orig = qdot._dense_blocking
DENSE_VARIANTS = {"x86 rule": lambda isa, m, nvec: (divisor_at_most(m, 8), 1),
                  "final": _dense_orig}


def gemm_graph(m, k, n) -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("q")
    qa = QuantParams("int8", (0.03,), (-5,))
    a = g.add_input("a", TensorType((m, k), "int8", qa))
    ws = tuple(float(v) for v in rng.uniform(0.002, 0.01, n))
    w = g.add_const(rng.integers(-128, 128, (n, k)).astype(np.int8), "w", QuantParams("int8", ws, (0,) * n, axis=0))
    ms, ss = conv_multipliers(0.03, ws, 0.04)
    g.outputs = [g.create_op("QLinearGemm", [a, w], {"multiplier": ms, "shift": ss, "activation": ""},
                             result_types=[TensorType((m, n), "int8", QuantParams("int8", (0.04,), (10,)))]).result]
    return g


def cycles_per_sdot(lib, mca: str) -> str:
    asm = "".join(m.inspect_source("asm") for m in lib.imports if m.kind == "llvm") \
        if lib.imports else lib.inspect_source("asm")
    body = inner_loop(asm)
    if body is None:
        return f"{'(unrolled)':>16s}"
    r = subprocess.run([mca, "-mtriple=aarch64", "-mcpu=cortex-a76", "-mattr=+dotprod", "-iterations=200"],
                       input="\n".join(body) + "\n", capture_output=True, text=True, check=True)
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1)) / 200
    n = sum("sdot" in b for b in body)
    return f"{cycles / n:9.3f} ({n:3d})"


def main(mca: str = "llvm-mca") -> None:
    x86.STRICT = True
    print(f"{'conv':24s} " + " ".join(f"{v:>16s}" for v in VARIANTS) + "   (cycles per sdot, llvm-mca cortex-a76)")
    for label, c, o, hw, k, p in CASES:
        row = []
        for blocking, indexed in VARIANTS.values():
            qdot._blocking, qdot.INDEXED_SDOT = blocking, indexed
            try:
                lib = build_module(conv_graph(c, o, hw, k, p), SPEC).mod
            finally:
                qdot._blocking, qdot.INDEXED_SDOT = _orig, True
            row.append(cycles_per_sdot(lib, mca))
        print(f"{label:24s} " + " ".join(row))
    print(f"\n{'gemm m x k x n':24s} " + " ".join(f"{v:>16s}" for v in DENSE_VARIANTS))
    for m, k, n in GEMMS:
        row = []
        for blocking in DENSE_VARIANTS.values():
            qdot._dense_blocking = blocking
            try:
                row.append(cycles_per_sdot(build_module(gemm_graph(m, k, n), SPEC).mod, mca))
            finally:
                qdot._dense_blocking = _dense_orig
        print(f"{f'{m} x {k} x {n}':24s} " + " ".join(row))


if __name__ == "__main__":
    main(*sys.argv[1:2])
