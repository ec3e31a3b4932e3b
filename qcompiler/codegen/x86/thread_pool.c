/* The thread pool of qcompiler's CPU artifacts (qcompiler/codegen/x86/thread_pool.py says why).
 *
 * TVM's generated code starts a parallel region through the context pointer
 * ``__TVMBackendParallelLaunch`` (and meets at ``__TVMBackendParallelBarrier``), which the TVM
 * runtime sets to its own thread pool when it loads a library where it finds them. TVM's launch
 * returns only when every worker has run its task: a worker that sleeps between kernels must be
 * woken and scheduled first, even when the calling thread has already claimed every chunk
 * (work_claiming.c), so each parallel kernel waits for a wake-up, and for a whole time slice when
 * the other core is busy with another process.
 *
 * This launcher returns as soon as the work is done: the calling thread runs task 0 at once, then
 * closes the job; a task no worker has taken by then it runs itself (a static split's share; a
 * claimed loop's task finds no chunk left), so it waits only for workers that have started. A worker
 * arriving after the close goes back to sleep without touching the job. A task that meets at a
 * barrier waits for every other task there, so a job with a barrier still runs on all threads at
 * once, as TVM's does: the calling thread cannot close it before passing the barrier.
 *
 * Defined here, hidden, the two context pointers bind the library's kernels to this pool: the TVM
 * runtime does not find them and leaves them alone (library_module.cc sets only the ones it finds).
 * Threads: ``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``, else half the CPUs on x86 (one per core,
 * TVM's default) and all of them elsewhere; idle workers spin ``TVM_THREAD_POOL_SPIN_COUNT``
 * times (default 300000, TVM's) before they sleep; workers are bound to a CPU each as TVM binds
 * its own (TVM_BIND_THREADS). The count is read at the library's first parallel launch
 * (``runtime.config_threadpool`` sets TVM's pool only). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef QC_API
#define QC_API __attribute__((visibility("hidden")))
#endif

typedef struct {
    void* sync_handle;
    int32_t num_task;
} qc_penv_t;
typedef int (*qc_lambda_t)(int task_id, qc_penv_t* penv, void* cdata);

#define QC_MAX_THREADS 64
#define QC_CLOSED (1ull << 31)
#define QC_JOINED 0x7fffffffull

typedef struct {
    int32_t count, gen;
} qc_barrier_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t pid;                  /* the process that started the workers (0: none yet) */
    int32_t threads;            /* of a launch, the calling thread included */
    int32_t workers;            /* started */
    int32_t spin;
    int32_t stop;
    pthread_t th[QC_MAX_THREADS];
    /* the job: seq << 32 | QC_CLOSED | workers joined */
    uint64_t word;
    int32_t limit;              /* workers that may join */
    int32_t done;               /* joined workers finished */
    int32_t sleepers;
    int32_t busy;               /* a launch is in progress */
    int32_t bound;              /* workers bound to a CPU each */
#ifdef __linux__
    cpu_set_t allowed;          /* the process's CPUs when the workers started */
    int32_t cpu_of[QC_MAX_THREADS];
#endif
    int32_t err;
    qc_lambda_t fn;
    void* cdata;
    qc_penv_t env;
    qc_barrier_t barrier;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static inline void qc_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin a little, then yield the core: a thread that waits gives way to the one it waits for. */
static inline void qc_backoff(int* k) {
    if (++*k < 64) qc_relax();
    else sched_yield();
}

static int qc_env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static int qc_default_threads(void) {
    int n = qc_env_int("TVM_NUM_THREADS", 0);
    if (n <= 0) n = qc_env_int("OMP_NUM_THREADS", 0);
    if (n <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
#if defined(__x86_64__) || defined(__i386__)
        cpus /= 2;
#endif
        n = (int)cpus;
    }
    if (n < 1) n = 1;
    return n > QC_MAX_THREADS ? QC_MAX_THREADS : n;
}

static void qc_run(int task_id) {
    int r = P.fn(task_id, &P.env, P.cdata);
    if (r) __atomic_store_n(&P.err, r, __ATOMIC_RELAXED);
}

static void* qc_worker(void* arg) {
    uint64_t last = (uint64_t)(uintptr_t)arg;      /* the job seq seen last */
    for (;;) {
        uint64_t w = __atomic_load_n(&P.word, __ATOMIC_ACQUIRE);
        for (int k = 0; (w >> 32) == last; w = __atomic_load_n(&P.word, __ATOMIC_ACQUIRE)) {
            if (__atomic_load_n(&P.stop, __ATOMIC_ACQUIRE)) return NULL;
            if (k++ < P.spin) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            __atomic_add_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            while ((__atomic_load_n(&P.word, __ATOMIC_SEQ_CST) >> 32) == last &&
                   !__atomic_load_n(&P.stop, __ATOMIC_SEQ_CST))
                pthread_cond_wait(&P.cv, &P.mu);
            __atomic_sub_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&P.mu);
            k = 0;
        }
        /* a new job: join it unless it is closed or full */
        for (;;) {
            last = w >> 32;
            if ((w & QC_CLOSED) || (int32_t)(w & QC_JOINED) >= __atomic_load_n(&P.limit, __ATOMIC_RELAXED)) break;
            if (__atomic_compare_exchange_n(&P.word, &w, w + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                qc_run((int)(w & QC_JOINED) + 1);
                __atomic_add_fetch(&P.done, 1, __ATOMIC_RELEASE);
                break;
            }
        }
    }
}

static void qc_stop_workers(void) {
    if (P.pid != getpid() || !P.workers) return;
    pthread_mutex_lock(&P.mu);
    __atomic_store_n(&P.stop, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.workers; ++i) pthread_join(P.th[i], NULL);
    P.workers = 0;
    P.stop = 0;
}

/* Before the library is unmapped (dlclose, exit), its workers end: they run its code. */
__attribute__((destructor)) static void qc_pool_fini(void) { qc_stop_workers(); }

/* Worker ``i`` on a core of its own, as TVM binds its workers: the (i + 1)-th CPU this process may
 * run on. Unbound, a worker woken by a busy calling thread may be queued on that thread's CPU. Not
 * where the threads outnumber the CPUs, nor with TVM_BIND_THREADS set to anything but 1 (TVM's
 * switch). */
static void qc_bind(int i) {
#ifdef __linux__
    P.cpu_of[i] = -1;
    if (i == 0) {
        P.bound = 0;
        if (qc_env_int("TVM_BIND_THREADS", 1) != 1) return;
        if (sched_getaffinity(0, sizeof(P.allowed), &P.allowed) != 0) return;
        if (P.threads > CPU_COUNT(&P.allowed)) return;
        P.bound = 1;
    }
    if (!P.bound) return;
    int want = (i + 1) % CPU_COUNT(&P.allowed), seen = 0;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (!CPU_ISSET(c, &P.allowed)) continue;
        if (seen++ == want) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            if (pthread_setaffinity_np(P.th[i], sizeof(one), &one) == 0) P.cpu_of[i] = c;
            return;
        }
    }
#else
    (void)i;
#endif
}

/* Keep the bound workers off the calling thread's CPU: the calling thread is not bound (it is the
 * application's), and wherever the scheduler has put it (after another library's threads ran, say)
 * a worker bound to that CPU would only take turns with it there while a CPU idles (svhnnet's
 * launches took the one-thread time in those calls, TVM's pool alike). The worker on the caller's
 * CPU moves to a CPU that no worker holds: a system call only when they meet. */
static void qc_keep_off_caller(void) {
#ifdef __linux__
    if (!P.bound) return;
    int here = sched_getcpu();
    for (int j = 0; j < P.workers; ++j) {
        if (P.cpu_of[j] != here) continue;
        for (int c = 0; c < CPU_SETSIZE; ++c) {
            if (!CPU_ISSET(c, &P.allowed) || c == here) continue;
            int taken = 0;
            for (int k = 0; k < P.workers; ++k) taken |= P.cpu_of[k] == c;
            if (taken) continue;
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            if (pthread_setaffinity_np(P.th[j], sizeof(one), &one) == 0) P.cpu_of[j] = c;
            return;
        }
        return;
    }
#endif
}

/* The workers for ``n`` threads of a launch, in this process (a forked child starts its own). Called
 * with P.busy held. */
static void qc_start(int n) {
    if (P.pid != getpid()) {                     /* first launch, or a child after fork */
        if (P.pid) {                             /* the child has none of the parent's workers */
            pthread_mutex_init(&P.mu, NULL);
            pthread_cond_init(&P.cv, NULL);
            P.sleepers = 0;
        }
        P.pid = getpid();
        P.workers = 0;
        P.spin = qc_env_int("TVM_THREAD_POOL_SPIN_COUNT", 300000);
        if (!P.threads) P.threads = qc_default_threads();
        n = n > 0 ? n : P.threads;
    }
    uint64_t seq = __atomic_load_n(&P.word, __ATOMIC_RELAXED) >> 32;
    while (P.workers < n - 1) {
        if (pthread_create(&P.th[P.workers], NULL, qc_worker, (void*)(uintptr_t)seq) != 0) break;
        qc_bind(P.workers);
#ifdef __linux__
        pthread_setname_np(P.th[P.workers], "qc-pool");
#endif
        P.workers++;
    }
}

QC_API int qc_parallel_launch(qc_lambda_t fn, void* cdata, int num_task) {
    if (P.pid != getpid() && !P.threads) P.threads = qc_default_threads();
    int n = P.threads;
    if (num_task > 0 && num_task < n) n = num_task;
    if (n > 1 && __atomic_exchange_n(&P.busy, 1, __ATOMIC_ACQUIRE) == 0) {
        if (P.pid != getpid() || P.workers < n - 1) qc_start(n);
        if (P.workers > 0) {
            n = P.workers + 1 < n ? P.workers + 1 : n;
            qc_keep_off_caller();
            P.fn = fn;
            P.cdata = cdata;
            P.env.sync_handle = &P.barrier;
            P.env.num_task = n;
            P.barrier.count = 0;
            P.limit = n - 1;
            P.done = 0;
            P.err = 0;
            uint64_t seq = (__atomic_load_n(&P.word, __ATOMIC_RELAXED) >> 32) + 1;
            __atomic_store_n(&P.word, seq << 32, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&P.sleepers, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&P.mu);
                pthread_cond_broadcast(&P.cv);
                pthread_mutex_unlock(&P.mu);
            }
            qc_run(0);
            int joined = (int)(__atomic_fetch_or(&P.word, QC_CLOSED, __ATOMIC_ACQ_REL) & QC_JOINED);
            for (int id = joined + 1; id < n; ++id) qc_run(id);   /* the tasks no worker took */
            for (int k = 0; __atomic_load_n(&P.done, __ATOMIC_ACQUIRE) < joined;) qc_backoff(&k);
            int r = P.err;
            __atomic_store_n(&P.busy, 0, __ATOMIC_RELEASE);
            return r;
        }
        __atomic_store_n(&P.busy, 0, __ATOMIC_RELEASE);
    }
    /* one thread, no worker, or a launch in progress (another thread's, or this one's nested): alone */
    qc_barrier_t barrier = {0, 0};
    qc_penv_t env = {&barrier, 1};
    return fn(0, &env, cdata);
}

/* Every task of the launch meets here (TVMBackendParallelBarrier's contract). */
QC_API int qc_parallel_barrier(int task_id, qc_penv_t* penv) {
    (void)task_id;
    qc_barrier_t* b = (qc_barrier_t*)penv->sync_handle;
    if (penv->num_task <= 1) return 0;
    int32_t gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == penv->num_task) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
    } else {
        for (int k = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen;) qc_backoff(&k);
    }
    return 0;
}

#ifdef QC_BIND_POOL
/* The artifact's kernels launch on this pool: the context pointers of TVM's generated code, defined
 * here (the LLVM objects hold weak, empty ones) and hidden from the runtime's lookup. */
QC_API void* __TVMBackendParallelLaunch = (void*)qc_parallel_launch;
QC_API void* __TVMBackendParallelBarrier = (void*)qc_parallel_barrier;
#endif
