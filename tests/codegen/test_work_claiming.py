"""Parallel loops whose threads claim their chunks (qcompiler/codegen/x86/work_claiming.py).

    for i in parallel(n): body(i)
      ->  ctl = [0, k, n, 0]
          launch: while qc_claim(&ctl, &range): for i in [range[0], range[1]): body(i)

and a stage ahead of a kernel's main loop in one launch counts its finished chunks (qc_done) and
waits for the count (qc_wait) instead of TVM's barrier. Which thread runs which iteration changes,
nothing else: the integers stay the oracle's, at any number of threads.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tvm
from tvm.script import tirx as T

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_x86_int8 import ACT, X86_LEVELS, add_qconv, check_exact, qin  # noqa: E402

from qcompiler.codegen.lower import lower, tvm_compile  # noqa: E402
from qcompiler.codegen.target import TargetSpec  # noqa: E402
from qcompiler.codegen.x86 import threads as thread_rule  # noqa: E402
from qcompiler.codegen.x86 import work_claiming  # noqa: E402
from qcompiler.ir import Graph, TensorType  # noqa: E402


def _doubling(n: int):
    @T.prim_func
    def f(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32")):
        for i in T.parallel(n):
            B[i] = A[i] * T.float32(2)
    return f


@pytest.mark.parametrize("n, k", [(100, 2), (97, 2), (48, 1), (1000, 20)])
def test_a_parallel_loop_becomes_claimed_chunks(n, k):
    """IR in -> IR out: the loop's control block (next chunk 0, chunk size k, n iterations, 0
    finished) set before a launch whose every thread claims chunks until none is left, a chunk the
    original body over the iterations qc_claim returns. k is ceil(n / 64), rounded up to a divisor of
    n where one is near (97 is a prime: its last chunk is short, which qc_claim's bounds say). The
    launch keeps the one empty parallel loop TVM's codegen asks of a launch region."""
    out = work_claiming.rewrite(_doubling(n)).script()
    assert [f"qc_ctl[{i}] = {v}" in out for i, v in enumerate((0, k, n, 0))] == [True] * 4, out
    assert 'with T.attr(qc_launch, "pragma_parallel_launch_point", 1):' in out, out
    assert out.count("T.parallel") == 1 and "for qc_mark in T.parallel(1):" in out, out
    assert ('while T.call_extern("int32", "qc_claim", T.address_of(qc_ctl[0]), T.address_of(qc_range[0])) != 0:'
            in out), out
    assert "for i in range(qc_range[0], qc_range[0] + (qc_range[1] - qc_range[0])):" in out, out
    assert "B[i] = A[i] * T.float32(2.0)" in out, out


def _winograd_conv(n: int = 2):
    """A 32 -> 32 3x3 int8 conv at 16x16: on AVX2 a Winograd conv over tile rows, its weight
    transform a stage ahead of the main loop in the same launch; on VNNI a direct conv, its
    packing stage ahead."""
    g = Graph("q")
    x = g.add_input("x", TensorType((n, 32, 16, 16), "uint8", ACT["uint8"]))
    g.outputs = [add_qconv(g, x, 32, (3, 3), p=(1, 1, 1, 1), act="Relu")]
    return g


def _conv_llvm_ir(cpu: str) -> str:
    """The LLVM IR of :func:`_winograd_conv`'s conv kernel built for ``cpu`` as tvm_compile builds it."""
    spec = TargetSpec("x86", cpu=cpu)
    mod = lower(_winograd_conv(), spec)
    (gv,) = [gv for gv in mod.functions if "qlinearconv" in gv.name_hint]
    ex = tvm_compile(tvm.IRModule({gv.name_hint: mod[gv].with_attr("global_symbol", gv.name_hint)}), spec)
    return "".join(m.inspect_source("ll") for m in ex.mod.imports) if ex.mod.imports else ex.mod.inspect_source("ll")


@pytest.mark.parametrize("cpu", X86_LEVELS)
def test_the_stage_ahead_counts_chunks_instead_of_a_barrier(monkeypatch, cpu):
    """Every kernel on the thread pool (PAR_MIN_NS = 0): the conv is still one launch; inside it
    both loops claim chunks, the stage counts them and every thread waits for the count; TVM's
    barrier (which waits for every thread, a sleeping worker too) is gone. LLVM IR of the build."""
    monkeypatch.setattr(thread_rule, "PAR_MIN_NS", 0.0)
    ll = _conv_llvm_ir(cpu)
    assert len(set(re.findall(r"call i32 @qc_claim\(ptr (%\w+)", ll))) == 2, ll     # the stage's, the main loop's
    assert "@qc_done" in ll and "@qc_wait" in ll
    assert "TVMBackendParallelBarrier" not in ll
    assert ll.count("load ptr, ptr @__TVMBackendParallelLaunch") == 1        # one launch for both loops


@pytest.mark.parametrize("threads", [1, 2])
def test_any_number_of_threads_gives_the_oracle_integers(monkeypatch, threads):
    """The same build run with one thread and with two in the pool (``runtime.config_threadpool``;
    TVM caps the pool at the machine's cores): the calling thread does every chunk, or the two share
    them as they come; the output is the oracle's either way."""
    monkeypatch.setattr(thread_rule, "PAR_MIN_NS", 0.0)
    config = tvm.get_global_func("runtime.config_threadpool")
    config(1, threads)
    try:
        check_exact(_winograd_conv(), {"x": qin(ACT["uint8"], (2, 32, 16, 16))}, f"{threads} threads")
    finally:
        config(1, 0)


def test_off_keeps_the_static_split(monkeypatch):
    """QC_WORK_CLAIMING=0 (A/B runs): TVM's split as it is, the barrier back, no qc_ call."""
    monkeypatch.setattr(thread_rule, "PAR_MIN_NS", 0.0)
    monkeypatch.setattr(work_claiming, "ENABLED", False)
    ll = _conv_llvm_ir(X86_LEVELS[0])
    assert "@qc_claim" not in ll and "TVMBackendParallelBarrier" in ll
