/* The three atomic operations of qcompiler's parallel loops (qcompiler/codegen/x86/work_claiming.py).
 *
 * TVM's LLVM CPU codegen has no atomic add, so the loops call these. They are linked into every
 * CPU model.so (and loaded into the compiling process for in-process builds): the artifact still
 * needs nothing but the TVM runtime. */
#include <stdint.h>

/* Not exported from model.so (the kernels beside them call them); the in-process build for the
 * compiler's JIT defines QC_API empty, so that the JIT finds them. */
#ifndef QC_API
#define QC_API __attribute__((visibility("hidden")))
#endif

/* ctl: the loop's next chunk, chunk size, iterations, finished chunks (set before the launch).
 * Claims the next chunk: its iterations [range[0], range[1]) and 1, or 0 when none is left. Each
 * chunk goes to exactly one caller. */
QC_API int32_t qc_claim(int32_t* ctl, int32_t* range) {
    int32_t b = __atomic_fetch_add(&ctl[0], 1, __ATOMIC_RELAXED) * ctl[1];
    if (b >= ctl[2]) return 0;
    range[0] = b;
    range[1] = b + ctl[1] < ctl[2] ? b + ctl[1] : ctl[2];
    return 1;
}

/* One more chunk of a stage finished; its writes are visible to whoever sees the count. */
QC_API int32_t qc_done(int32_t* ctl) { return __atomic_add_fetch(&ctl[3], 1, __ATOMIC_RELEASE); }

/* Wait until ``n`` chunks of a stage are finished (ctl[3]) (a barrier that a thread arriving late, after
 * all chunks are done, passes at once). */
QC_API int32_t qc_wait(int32_t* ctl, int32_t n) {
    while (__atomic_load_n(&ctl[3], __ATOMIC_ACQUIRE) < n) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
    return 0;
}
