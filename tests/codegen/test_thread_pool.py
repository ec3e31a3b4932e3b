"""The artifact's thread pool (qcompiler/codegen/x86/thread_pool.c): a parallel kernel returns when
its work is done, waiting only for the workers that have started.

The launcher itself, driven from C (every task of a launch runs exactly once, barriers, nested and
concurrent launches, errors, fork, a worker that cannot run is not waited for, workers kept off the
calling thread's CPU), and artifacts built
with it: the kernels bound to it and hidden from the TVM runtime, the same bits as on TVM's pool
at any number of threads, with claimed loops and with TVM's static split and barrier.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qcompiler.codegen.x86 import thread_pool, work_claiming

HARNESS = r"""
#define QC_API
#include "POOL"
#include "CLAIM"
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

static int ran[QC_MAX_THREADS];
static long tid_of[QC_MAX_THREADS];
static long sum, main_tid, by_workers, task_ns;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int count_tasks(int task_id, qc_penv_t* penv, void* cdata) {
    (void)cdata;
    CHECK(task_id >= 0 && task_id < penv->num_task, "task %d of %d", task_id, penv->num_task);
    __atomic_add_fetch(&ran[task_id], 1, __ATOMIC_RELAXED);
    for (long t0 = now_ns(); now_ns() - t0 < task_ns;) {}
    tid_of[task_id] = syscall(SYS_gettid);
    if (tid_of[task_id] != main_tid) __atomic_add_fetch(&by_workers, 1, __ATOMIC_RELAXED);
    return 0;
}

/* every task runs once per launch */
static void static_split(int launches) {
    for (int l = 0; l < launches; ++l) {
        memset(ran, 0, sizeof ran);
        CHECK(qc_parallel_launch(count_tasks, NULL, 0) == 0, "launch failed");
        for (int t = 0; t < P.env.num_task || t < 1; ++t) CHECK(ran[t] == 1, "launch %d: task %d ran %d times", l, t, ran[t]);
    }
}

static int slots[QC_MAX_THREADS];
static int with_barrier(int task_id, qc_penv_t* penv, void* cdata) {
    int round = *(int*)cdata;
    slots[task_id] = round;
    qc_parallel_barrier(task_id, penv);
    for (int t = 0; t < penv->num_task; ++t) CHECK(slots[t] == round, "task %d saw slot %d = %d, not %d", task_id, t, slots[t], round);
    qc_parallel_barrier(task_id, penv);
    return 0;
}

static int nested(int task_id, qc_penv_t* penv, void* cdata) {
    (void)task_id; (void)penv; (void)cdata;
    CHECK(qc_parallel_launch(count_tasks, NULL, 0) == 0, "nested launch failed");
    __atomic_add_fetch(&sum, 1, __ATOMIC_RELAXED);
    return 0;
}

static int failing(int task_id, qc_penv_t* penv, void* cdata) {
    (void)cdata;
    return task_id == penv->num_task - 1 ? -7 : 0;
}

/* claimed chunks, handed out by work_claiming.c's own qc_claim */
typedef struct { int32_t ctl[4]; double* out; } claim_job;
static int claimed(int task_id, qc_penv_t* penv, void* cdata) {
    (void)task_id; (void)penv;
    claim_job* j = (claim_job*)cdata;
    int32_t r[2];
    while (qc_claim(j->ctl, r))
        for (int i = r[0]; i < r[1]; ++i) j->out[i] += i;
    return 0;
}

static void* concurrent(void* arg) {
    (void)arg;
    double out[1000];
    for (int l = 0; l < 3000; ++l) {
        memset(out, 0, sizeof out);
        claim_job j = {{0, 16, 1000, 0}, out};
        CHECK(qc_parallel_launch(claimed, &j, 0) == 0, "concurrent launch failed");
        for (int i = 0; i < 1000; ++i) CHECK(out[i] == i, "element %d = %g", i, out[i]);
    }
    return NULL;
}

int main(int argc, char** argv) {
    const char* what = argc > 1 ? argv[1] : "all";
    main_tid = syscall(SYS_gettid);
    if (!strcmp(what, "all")) {
        static_split(20000);
        task_ns = 20000;                                    /* tasks of 20 us: a worker has time to join */
        static_split(500);
        task_ns = 0;
        long split_by_workers = by_workers;
        for (int round = 1; round <= 2000; ++round) CHECK(qc_parallel_launch(with_barrier, &round, 0) == 0, "barrier launch");
        sum = 0;
        CHECK(qc_parallel_launch(nested, NULL, 0) == 0 && sum == (P.threads > 1 ? P.env.num_task : 1), "nested: %ld", sum);
        CHECK(qc_parallel_launch(failing, NULL, 0) == -7, "the error code of a task");
        CHECK(qc_parallel_launch(failing, NULL, 1) == -7, "the error code of a task alone");
        pthread_t a, b;
        pthread_create(&a, NULL, concurrent, NULL);
        pthread_create(&b, NULL, concurrent, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        pid_t child = fork();
        if (child == 0) { static_split(2000); concurrent(NULL); _exit(0); }
        int status;
        waitpid(child, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child's launches");
        static_split(100);
        printf("{\"threads\": %d, \"workers\": %d, \"by_workers\": %d}\n", P.threads, P.workers, split_by_workers > 0);
        return 0;
    }
    if (!strcmp(what, "late")) {
        /* One CPU for the process, the worker at SCHED_IDLE: it cannot run while the calling
         * thread computes, so the launch must finish without it, every task on the calling thread. */
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "affinity");
        static_split(1);                                    /* starts the worker */
        struct sched_param sp = {0};
        for (int i = 0; i < P.workers; ++i) {
            CHECK(pthread_setaffinity_np(P.th[i], sizeof one, &one) == 0, "worker affinity");
            CHECK(pthread_setschedparam(P.th[i], SCHED_IDLE, &sp) == 0, "SCHED_IDLE");
        }
        long me = syscall(SYS_gettid);
        int alone = 0;
        for (int l = 0; l < 200; ++l) {
            memset(ran, 0, sizeof ran);
            CHECK(qc_parallel_launch(count_tasks, NULL, 0) == 0, "launch failed");
            int mine = 1;
            for (int t = 0; t < P.env.num_task; ++t) {
                CHECK(ran[t] == 1, "task %d ran %d times", t, ran[t]);
                mine &= tid_of[t] == me;
            }
            alone += mine;
        }
        printf("{\"alone\": %d, \"threads\": %d}\n", alone, P.env.num_task);
        return 0;
    }
    if (!strcmp(what, "apart")) {
        /* The calling thread moved onto each CPU in turn: after a launch there, no worker is bound
         * to the CPU it runs on. */
        cpu_set_t all, one, w;
        CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "affinity");
        static_split(1);
        int moves = 0;
        for (int c = 0; c < CPU_SETSIZE; ++c) {
            if (!CPU_ISSET(c, &all)) continue;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            CHECK(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0, "caller affinity");
            static_split(1);
            for (int i = 0; i < P.workers; ++i) {
                CHECK(pthread_getaffinity_np(P.th[i], sizeof w, &w) == 0, "worker affinity");
                CHECK(CPU_COUNT(&w) == 1 && !CPU_ISSET(c, &w), "worker %d bound to the caller's CPU %d", i, c);
            }
            moves++;
        }
        printf("{\"cpus\": %d, \"workers\": %d}\n", moves, P.workers);
        return 0;
    }
    return 2;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool")
    src = d / "harness.c"
    src.write_text(HARNESS.replace("POOL", str(thread_pool.SOURCE)).replace("CLAIM", str(work_claiming.SOURCE)))
    exe = d / "harness"
    subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-Wall", "-Werror", "-pthread", str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    return exe


def _run(exe: Path, *args: str, **env: str) -> dict:
    e = {**os.environ, "TVM_THREAD_POOL_SPIN_COUNT": "0", **env}
    r = subprocess.run([str(exe), *args], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("threads, spin", [(1, "0"), (2, "0"), (3, "0"), (4, "0"), (2, "300000")])
def test_every_task_runs_once_barriers_nesting_errors_concurrency_fork(harness, threads, spin):
    """20500 launches of a static split (each task id exactly once, whoever runs it), 2000 with
    two barriers, a launch inside a task (runs alone), a task's error code returned, two threads
    launching at once (one runs alone), a forked child (its own workers): at 1-4 threads, workers
    sleeping or spinning."""
    out = _run(harness, "all", TVM_NUM_THREADS=str(threads), TVM_THREAD_POOL_SPIN_COUNT=spin)
    assert out["threads"] == threads and out["workers"] == threads - 1, out
    if threads > 1 and spin != "0":
        assert out["by_workers"], out                # spinning workers take tasks of the static split


def test_a_worker_that_cannot_run_is_not_waited_for(harness):
    """The process on one CPU and its worker at SCHED_IDLE: the worker never runs while the calling
    thread works, so each launch ends with every task run by the calling thread (TVM's pool would
    wait for the worker each time)."""
    out = _run(harness, "late", TVM_NUM_THREADS="2")
    assert out["threads"] == 2 and out["alone"] >= 190, out


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_workers_stay_off_the_calling_threads_cpu(harness):
    """Workers are bound to a CPU each, as TVM binds its own, but the calling thread is free: on
    whichever CPU it runs, the worker bound there moves to a free one (else the two take turns on
    one CPU)."""
    out = _run(harness, "apart", TVM_NUM_THREADS="2")
    assert out["workers"] == 1 and out["cpus"] == len(os.sched_getaffinity(0)), out


def test_thread_count_follows_tvm(harness):
    """TVM_NUM_THREADS, else OMP_NUM_THREADS, else one thread per core (half the CPUs on x86)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([str(harness), "all"], env={**env, "OMP_NUM_THREADS": "3", "TVM_THREAD_POOL_SPIN_COUNT": "0"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["threads"] == 3, r.stderr
    r = subprocess.run([str(harness), "all"], env={**env, "TVM_THREAD_POOL_SPIN_COUNT": "0"},
                       capture_output=True, text=True, timeout=300)
    cpus = os.cpu_count() or 1
    assert r.returncode == 0 and json.loads(r.stdout)["threads"] == max(1, cpus // 2), r.stderr


# --- artifacts on the pool ----------------------------------------------------------------------

RUN = r"""
import json, os, sys
import numpy as np
from qcompiler.runtime import load
m = load(sys.argv[1])
x = np.load(sys.argv[2])
ys = [m(x)[0] for _ in range(20)]
assert all(np.array_equal(y, ys[0]) for y in ys)
names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
np.save(sys.argv[3], ys[0])
print(json.dumps({"pool_threads": names.count("qc-pool")}))
"""


def _conv_graph():
    from qcompiler.ir import Graph, TensorType
    from qcompiler.ir.ops import full_attrs
    rng = np.random.default_rng(0)
    g = Graph("conv")
    x = g.add_input("x", TensorType((1, 32, 28, 28), "float32"))
    w = g.add_const(rng.standard_normal((64, 32, 3, 3)).astype(np.float32) * 0.1, "w")
    b = g.add_const(rng.standard_normal(64).astype(np.float32), "b")
    y = g.create_op("Conv", [x, w, b], full_attrs("Conv", strides=[1, 1], dilations=[1, 1], pads=[1, 1, 1, 1],
                                                  group=1)).result
    g.outputs = [g.create_op("Relu", [y], result_names=["y"]).result]
    return g


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The conv built with every kernel on the thread pool: on this pool, on TVM's (QC_THREAD_POOL=0),
    and on this pool with TVM's static split and barriers (QC_WORK_CLAIMING=0)."""
    from qcompiler.codegen.artifact import write_artifact
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.codegen.x86 import threads as thread_rule
    from qcompiler.codegen.x86 import work_claiming
    d = tmp_path_factory.mktemp("art")
    mp = pytest.MonkeyPatch()
    mp.setattr(thread_rule, "PAR_MIN_NS", 0.0)
    out = {}
    try:
        for tag, pool, claiming in (("pool", "1", True), ("tvm", "0", True), ("static", "1", False)):
            mp.setenv("QC_THREAD_POOL", pool)
            mp.setattr(work_claiming, "ENABLED", claiming)
            out[tag] = write_artifact(_conv_graph(), TargetSpec("x86"), d / tag)
    finally:
        mp.undo()
    return out


def _symbols(lib: Path) -> str:
    return subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True, check=True).stdout


def test_kernels_launch_on_the_pool_which_the_runtime_does_not_see(artifacts):
    """On: the library's launch and barrier pointers are hidden (the TVM runtime cannot rebind
    them); off: TVM's runtime finds its launch pointer, as before."""
    assert "__TVMBackendParallelLaunch" not in _symbols(artifacts["pool"] / "model.so")
    assert "__TVMBackendParallelLaunch" in _symbols(artifacts["tvm"] / "model.so")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_same_bits_as_on_tvms_pool(artifacts, tmp_path, threads):
    """Each artifact run in a process of its own at 1-3 threads: the pool's (claimed loops, and TVM's
    static split with its barrier) give the bits of TVM's pool, with threads - 1 workers named
    qc-pool (none for TVM's)."""
    x = np.random.default_rng(1).standard_normal((1, 32, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "TVM_THREAD_POOL_SPIN_COUNT": "0"}
    got = {}
    for tag, art in artifacts.items():
        r = subprocess.run([sys.executable, "-c", RUN, str(art), str(tmp_path / "x.npy"), str(tmp_path / f"{tag}.npy")],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        want_pool = 0 if tag == "tvm" else threads - 1
        assert json.loads(r.stdout.strip().splitlines()[-1])["pool_threads"] == want_pool, (tag, r.stdout)
        got[tag] = np.load(tmp_path / f"{tag}.npy")
    assert np.array_equal(got["pool"], got["tvm"]) and np.array_equal(got["static"], got["tvm"])


def test_two_threads_calling_one_library(artifacts):
    """Two Python threads, each with its own loaded model of one library (one Relax VM is not for
    two threads at once; the library and its pool are shared), call it at once: a launch finding
    the pool busy runs alone; both get the single-caller result."""
    import threading

    from qcompiler.runtime import load
    models = [load(artifacts["pool"]) for _ in range(2)]
    x = np.random.default_rng(2).standard_normal((1, 32, 28, 28)).astype(np.float32)
    want = models[0](x)[0]
    bad, done = [], []

    def calls(m):
        for _ in range(50):
            if not np.array_equal(m(x)[0], want):
                bad.append(1)
        done.append(1)
    ts = [threading.Thread(target=calls, args=(m,)) for m in models]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad and len(done) == 2
