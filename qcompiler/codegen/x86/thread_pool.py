"""The artifact's own thread pool: a parallel kernel returns when its work is done, not when every
worker has woken.

TVM's generated code starts each parallel region through TVM's thread pool, whose launch returns
only once every worker has run its task. With work claiming (:mod:`.work_claiming`) the calling
thread starts at once and may claim every chunk itself, but it still waits for a sleeping worker
(``TVM_THREAD_POOL_SPIN_COUNT=0``, as the benchmarks run both engines) to wake up, be scheduled and
find nothing left: a wake-up per parallel kernel, and a time slice whenever the other core runs
another process.

``thread_pool.c``, linked into every CPU ``model.so`` with the work-claiming atomics, is a launcher
that waits only for workers that have started: the calling thread runs task 0, closes the job, runs
itself the tasks that no worker has taken (a claimed loop's find nothing left, a static split's
share is done once either way) and waits for the workers that joined; a worker that wakes after the
close goes back to sleep. A task that meets at a barrier waits there for all the others, so a
kernel with a barrier still runs on every thread, as TVM's do. The library's two context pointers
(``__TVMBackendParallelLaunch``, ``__TVMBackendParallelBarrier``) are defined there, hidden, so
the TVM runtime does not find them to point them at its own pool. ``QC_THREAD_POOL=0`` at compile
time leaves the kernels on TVM's pool (A/B runs). Which thread runs which iteration changes,
nothing else: the outputs are the same bits.

Workers are bound to a CPU each, as TVM binds its own (``TVM_BIND_THREADS``), and kept off the
calling thread's CPU: the calling thread is the application's and not bound, and after another
library's threads have run (ONNX Runtime's, in the zoo benchmark's interleaved rounds) the scheduler
may leave it on the CPU of a bound worker. TVM's pool then shares that CPU between the two while the
other idles, and svhnnet took its one-thread time (0.76 against 0.47-0.51 ms, in the rounds
that started there); here the worker bound to the calling thread's CPU moves to a free one, a system
call only when they meet.

The pool reads TVM's settings: ``TVM_NUM_THREADS`` (else ``OMP_NUM_THREADS``, else one thread per
core, TVM's default), ``TVM_THREAD_POOL_SPIN_COUNT`` (idle workers spin that many yields before
they sleep; TVM's default 300000) and ``TVM_BIND_THREADS``. In-process builds (tests, ``--tune``)
run on TVM's pool.
"""
from __future__ import annotations

import os
from pathlib import Path

SOURCE = Path(__file__).with_name("thread_pool.c")


def enabled() -> bool:
    """Whether artifacts get the pool (read at each link: ``QC_THREAD_POOL=0`` turns it off)."""
    return os.environ.get("QC_THREAD_POOL", "1") != "0"


def sources() -> tuple[Path, ...]:
    """The C the artifact links in for its pool (none with ``QC_THREAD_POOL=0``)."""
    return (SOURCE,) if enabled() else ()


def defines() -> list[str]:
    """Compiler flags of the artifact's C: bind the kernels' launches to the pool."""
    return ["-DQC_BIND_POOL"] if enabled() else []
