"""Parallel loops whose threads claim their iterations, so that no launch waits for a late worker.

TVM's CPU codegen splits a ``parallel`` loop of n iterations statically: the calling thread runs
the first ceil(n / T) and each worker of the thread pool its own share, and the call returns when
the last share is done. A worker that sleeps between kernels (``TVM_THREAD_POOL_SPIN_COUNT=0``, as
bench/bench_int8.py runs both engines; TVM's default spins for a while) starts its share only once
it wakes, so every launch costs the wake-up on top of half the work. On the project's 2-vCPU Zen 3
host (2026-11-27) the idle vCPU halts in the hypervisor: every int8 model ran faster with all its
kernels serial than with the thread rule's parallel ones (svhnnet 500 against 546-637 us, mnistnet
65 against 117, rapidocr-cls 877 against 1199-2133), while ONNX Runtime's pool, which lets the
calling thread go through the loop itself and takes a late worker's help only for what is left,
gains from its second thread.

This pass (run by :func:`..lower.tvm_compile` through :mod:`.pipeline` on CPU targets after TVM's lowering, before the
host finalization) gives our loops that behaviour. Every ``parallel`` loop

    for i in parallel(n): body(i)

becomes chunks of ``k = ceil(n / MAX_CHUNKS)`` iterations (rounded up to a divisor of n where one is
near) that every thread of the launch claims through a control block in the calling thread's stack
frame (next chunk, k, n, finished chunks), set before the launch:

    ctl = [0, k, n, 0]
    launch:                                          # every thread of the pool runs this
        while qc_claim(&ctl, &range):                # atomic fetch-add: each chunk goes to one thread
            for i in [range[0], range[1]): body(i)

so the calling thread starts at once and does all the chunks if no worker comes; a worker that
wakes late claims what is left (or nothing). On TVM's pool the launch still ends only when every
worker has been through; the artifact's own launcher (:mod:`.thread_pool`, linked in beside these
atomics) waits only for the workers that have started. The loop
ahead of a kernel's main loop inside one launch (:func:`.schedules._one_launch`: a packing
stage or the Winograd transform, ``pragma_parallel_barrier_when_finish``) counts its finished
chunks (``qc_done``) instead of meeting at TVM's barrier (which waits for every thread, the sleeping
one too): each thread, once no chunk is left to claim, waits until the count is complete
(``qc_wait``), and a worker arriving after that passes at once. Which thread runs which iteration
changes, nothing else: the iterations of a parallel loop are independent, so the outputs are the
same bits. The chunk bounds come from the C side, so the loop's code stays as small as TVM's static
split (rapidocr-det's int8 library is within its 0.3x-of-fp32 promise by a page).

The three atomic functions (``qc_claim``, ``qc_done``, ``qc_wait``) are ``work_claiming.c``, since TVM's LLVM
CPU codegen has no atomic add ("CPU backend does not support atomic add yet"): it is compiled into
every CPU ``model.so`` (:func:`object_file`, by the artifact's linker) and, for the in-process
builds of tests, benchmarks and ``--tune``, into a small library loaded with RTLD_GLOBAL where the
LLVM JIT finds it (:func:`load_in_process`). ``QC_WORK_CLAIMING=0`` at compile time keeps TVM's
static split (A/B runs).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import tvm
from tvm import tirx

ENABLED = os.environ.get("QC_WORK_CLAIMING", "1") != "0"
SOURCE = Path(__file__).with_name("work_claiming.c")
SOURCES = (SOURCE, Path(__file__).with_name("amx_gemm.c"))
"""The C the artifact links in: these atomics and the AMX int8 GEMM (``amx_gemm.c``, empty off x86)."""
MAX_CHUNKS = 64         # chunks of a loop: an atomic claim each (~10 ns), enough for balance
LAUNCH, BARRIER = "pragma_parallel_launch_point", "pragma_parallel_barrier_when_finish"
_lock = threading.Lock()
_loaded: list[ctypes.CDLL] = []


def _i32(v: int) -> tirx.IntImm:
    return tirx.IntImm("int32", v)


def chunk_size(n: int) -> int:
    """Iterations per chunk of an n-iteration loop: the smallest divisor of n that makes at most
    MAX_CHUNKS chunks (the chunks then share the work evenly), else ceil(n / MAX_CHUNKS)."""
    k = -(-n // MAX_CHUNKS)
    for d in range(k, min(n, 2 * k) + 1):
        if n % d == 0:
            return d
    return k


def _counter(name: str, n: int = 1) -> tirx.Buffer:
    return tirx.decl_buffer((n,), "int32", name=name)


def _call(fn: str, buf: tirx.Buffer, *args) -> tirx.PrimExpr:
    return tirx.call_extern("int32", fn, tirx.address_of(tirx.BufferLoad(buf, [_i32(0)])), *args)


def _claiming(loop: tirx.For, ctl: tirx.Buffer, count: bool) -> tuple[tirx.Stmt, tuple[int, ...]] | None:
    """(``loop`` -- parallel, static extent -- as chunks claimed through ``ctl``, the initial values
    of ``ctl``: next chunk, chunk size, iterations, finished chunks). ``count``: add each finished
    chunk to ``ctl[3]``. None when the extent is not a constant. The chunk bounds come from
    ``qc_claim`` (the C side): the loop's code is a call and a loop between two loaded bounds, close
    to TVM's static split in size (with the bounds computed inline from a constant chunk size,
    rapidocr-det's int8 .text grew by 20 KB, past its library's 0.3x-of-fp32 promise)."""
    if not isinstance(loop.extent, tirx.IntImm) or not isinstance(loop.min, tirx.IntImm):
        return None
    n, lo = int(loop.extent), int(loop.min)
    k = chunk_size(n)
    dt = str(loop.extent.ty)
    rng = _counter("qc_range", 2)
    b, e = tirx.BufferLoad(rng, [_i32(0)]), tirx.BufferLoad(rng, [_i32(1)])

    def typed(x):
        return tirx.Cast(dt, x) if dt != "int32" else x
    body = [tirx.For(loop.loop_var, typed(b + _i32(lo) if lo else b), typed(e - b), tirx.ForKind.SERIAL, loop.body)]
    if count:
        body.append(tirx.Evaluate(_call("qc_done", ctl)))
    claim = tirx.call_extern("int32", "qc_claim", tirx.address_of(tirx.BufferLoad(ctl, [_i32(0)])),
                             tirx.address_of(b))
    # run by every thread of the launch (the statements of a launch region outside a parallel loop
    # are): no static split of its own
    work = tirx.While(claim != _i32(0), body[0] if len(body) == 1 else tirx.SeqStmt(body))
    return tirx.SeqStmt([tirx.AllocBuffer(rng), work]), (0, k, n, 0)


def _marked(body: tirx.Stmt) -> tirx.Stmt:
    """``body`` with the empty parallel loop that TVM's codegen wants in every launch region (it
    checks for one): the work itself is claimed by every thread outside it."""
    return tirx.SeqStmt([tirx.For(tirx.Var("qc_mark", "int32"), _i32(0), _i32(1), tirx.ForKind.PARALLEL,
                                  tirx.Evaluate(_i32(0))), body])


def _initialized(counters: list[tuple[tirx.Buffer, tuple[int, ...]]], stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` after allocating the control blocks ``counters`` and storing their initial values
    (in the calling thread, before the launch)."""
    if not counters:
        return stmt
    head = []
    for b, values in counters:
        head.append(tirx.AllocBuffer(b))
        head += [tirx.BufferStore(b, _i32(v), [_i32(i)]) for i, v in enumerate(values)]
    return tirx.SeqStmt(head + [stmt])


def transform_stmts(s: tirx.Stmt, pre, post) -> tirx.Stmt:
    """``s`` rebuilt bottom-up: ``pre(node)`` may replace a node whole (its children untouched),
    ``post(node)`` a node whose children are done; None (or no ``pre``) keeps it. Descends through the statements
    that hold others (sequences, attributes, loops, conditionals); a loop inside any other kind
    of statement keeps TVM's static split."""
    r = pre(s) if pre is not None else None
    if r is not None:
        return r
    if isinstance(s, tirx.SeqStmt):
        s = tirx.SeqStmt([transform_stmts(x, pre, post) for x in s.seq])
    elif isinstance(s, tirx.AttrStmt):
        s = tirx.AttrStmt(s.node, s.attr_key, s.value, transform_stmts(s.body, pre, post))
    elif isinstance(s, tirx.For):
        s = tirx.For(s.loop_var, s.min, s.extent, s.kind, transform_stmts(s.body, pre, post), s.thread_binding,
                     s.annotations)
    elif isinstance(s, tirx.IfThenElse):
        s = tirx.IfThenElse(s.condition, transform_stmts(s.then_case, pre, post),
                            None if s.else_case is None else transform_stmts(s.else_case, pre, post))
    elif isinstance(s, tirx.While):
        s = tirx.While(s.condition, transform_stmts(s.body, pre, post))
    r = post(s)
    return s if r is None else r


def _claimed(loop: tirx.Stmt, counters: list, count: bool = False) -> tirx.Stmt | None:
    """``loop`` as claimed chunks (:func:`_claiming`) with a new control block, appended to
    ``counters`` with its initial values; None where ``loop`` is no parallel loop of constant extent."""
    if not (isinstance(loop, tirx.For) and loop.kind == tirx.ForKind.PARALLEL):
        return None
    ctl = _counter("qc_ctl", 4)
    r = _claiming(loop, ctl, count)
    if r is None:
        return None
    counters.append((ctl, r[1]))
    return r[0]


def _launch_region(attr: tirx.AttrStmt) -> tirx.Stmt:
    """One ``parallel_launch_point`` region: each parallel loop inside claims its chunks, the loop
    under a barrier also counts them and the threads wait for the count."""
    counters: list[tuple[tirx.Buffer, tuple[int, ...]]] = []

    def pre(s):
        if isinstance(s, tirx.AttrStmt) and s.attr_key == BARRIER:
            new = _claimed(s.body, counters, count=True)
            if new is None:
                return s
            ctl, (_, k, n, _) = counters[-1]
            return tirx.SeqStmt([new, tirx.Evaluate(_call("qc_wait", ctl, _i32(-(-n // k))))])
        return None

    def post(s):
        return _claimed(s, counters)

    body = transform_stmts(attr.body, pre, post)
    return _initialized(counters, tirx.AttrStmt(attr.node, attr.attr_key, attr.value,
                                           _marked(body) if counters else body))


def rewrite(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (lowered for a CPU) with every parallel loop claiming its iterations."""
    def pre(s):
        if isinstance(s, tirx.AttrStmt) and s.attr_key == LAUNCH:
            return _launch_region(s)
        return None

    def post(s):
        counters: list = []
        new = _claimed(s, counters)
        if new is None:
            return None
        return _initialized(counters, tirx.AttrStmt(tirx.Var("qc_launch", "int32"), LAUNCH, _i32(1), _marked(new)))

    return func.with_body(transform_stmts(func.body, pre, post))


@tvm.transform.module_pass(opt_level=0, name="WorkClaiming")
def work_claiming(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`rewrite` every PrimFunc of ``mod``."""
    out = {}
    for gv, f in mod.functions.items():
        out[gv] = rewrite(f) if isinstance(f, tirx.PrimFunc) else f
    return tvm.IRModule(out, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule(out)


def object_file(cc: str | None, workspace: Path) -> Path:
    """``work_claiming.c`` compiled for the artifact's linker ``cc`` (None: the host's) into
    ``workspace``, with the artifact's thread pool (:mod:`.thread_pool`) unless ``QC_THREAD_POOL=0``."""
    from . import thread_pool
    out = workspace / "qc_work_claiming.o"
    one = workspace / "qc_runtime_c.c"            # one translation unit: one object for the linker
    one.write_text("".join(f'#include "{s}"\n' for s in thread_pool.sources() + SOURCES))   # the pool first: it asks for _GNU_SOURCE
    # -x c: the cross linker is a g++, which would compile a .c file as C++ (mangled names)
    subprocess.run([cc or os.environ.get("CC", "gcc"), "-x", "c", "-O2", "-fPIC", *thread_pool.defines(),
                    "-c", str(one), "-o", str(out)],
                   check=True, capture_output=True)
    return out


def load_in_process() -> None:
    """Load the atomics into this process (RTLD_GLOBAL), where TVM's LLVM JIT resolves the in-process
    builds' calls; built once per source version into the cache folder."""
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        digest = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES)).hexdigest()[:16]
        cache = Path(os.environ.get("QCOMPILER_CACHE_DIR") or Path.home() / ".cache" / "qcompiler")
        lib = cache / f"work_claiming-{digest}.so"
        if not lib.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as d:
                tmp = Path(d) / lib.name
                subprocess.run([os.environ.get("CC", "gcc"), "-x", "c", "-O2", "-shared", "-fPIC", "-DQC_API=",
                                *map(str, SOURCES), "-o", str(tmp)],
                               check=True, capture_output=True)
                os.replace(tmp, lib)
        _loaded.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))
