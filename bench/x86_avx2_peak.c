/* The int8 multiply-add peak of one x86 core without VNNI (AVX2 only: AMD Zen 1-3, Intel before Ice
 * Lake), in the two forms such a core offers, no memory traffic, 6-10 independent accumulators each:
 *
 *   exact    vpmaddwd + vpaddd              16 int16 x int16 multiply-adds per pair: qcompiler's
 *                                           AVX2 kernels (activations widened to int16, weights
 *                                           sign-extended), exact for every int8 operand;
 *   u8s8     vpmaddubsw + vpmaddwd(1) + vpaddd  32 u8 x s8 multiply-adds: ONNX Runtime's AVX2 U8S8
 *                                           kernels, whose pair sums saturate in int16;
 *   fp32     vfmadd231ps                    8 float32 multiply-adds (the fp32 kernels' peak).
 *
 * bench_x86_int8_kernels.py compiles and runs it on a CPU without VNNI to print each int8 kernel's
 * fraction of the exact peak.
 *
 *   cc -O2 bench/x86_avx2_peak.c -o /tmp/avx2_peak && /tmp/avx2_peak
 * prints "exact vpmaddwd ymm: <G> GMAC/s one core", then the u8s8 and fp32 figures. */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Each loop body is written in assembly (a basic asm statement, registers named): a compiler
 * would otherwise see that every chain multiplies the same constants and keep one product. The
 * registers are only read and written inside the statement, and ymm8-15 are declared clobbered. */
#define N_ITER 20000000L
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
                "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

static double timed(void (*body)(long), long n) {
    double t0 = now();
    body(n);
    return now() - t0;
}

/* One timed loop: ``init`` zeroes the operands, ``body`` is the unrolled iteration. */
#define LOOP(n, init, body) \
    __asm__ volatile(init "1:\n" body " dec %0\n jnz 1b\n vzeroupper\n" : "+r"(n) : : CLOBBER, "cc")
#define ZERO(r) "vpxor %%ymm" #r ", %%ymm" #r ", %%ymm" #r "\n"
/* exact: vpmaddwd into temporary t, vpaddd into accumulator c; operands ymm14, ymm15 */
#define EXACT(t, c) " vpmaddwd %%ymm14, %%ymm15, %%ymm" #t "\n vpaddd %%ymm" #t ", %%ymm" #c ", %%ymm" #c "\n"
/* u8s8: vpmaddubsw into t, vpmaddwd with ones (ymm13), vpaddd into c */
#define U8S8(t, c) " vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n vpmaddwd %%ymm" #t ", %%ymm13, %%ymm" #t "\n" \
                   " vpaddd %%ymm" #t ", %%ymm" #c ", %%ymm" #c "\n"
#define FMA(c) " vfmadd231ps %%ymm14, %%ymm15, %%ymm" #c "\n"

static void exact_loop(long n) {          /* 6 accumulators, 16 multiply-adds per pair */
    LOOP(n, ZERO(14) ZERO(15),
         EXACT(8, 0) EXACT(9, 1) EXACT(10, 2) EXACT(11, 3) EXACT(12, 4) EXACT(13, 5));
}

static void u8s8_loop(long n) {           /* 6 accumulators, 32 multiply-adds per triple */
    LOOP(n, ZERO(13) ZERO(14) ZERO(15),
         U8S8(6, 0) U8S8(7, 1) U8S8(8, 2) U8S8(9, 3) U8S8(10, 4) U8S8(11, 5));
}

static void fp32_loop(long n) {           /* 10 independent chains, 8 multiply-adds each */
    LOOP(n, ZERO(14) ZERO(15),
         FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) FMA(8) FMA(9));
}

int main(void) {
    double e = 0, u = 0, f = 0, v;
    for (int rep = 0; rep < 3; rep++) {          /* best of 3: the least disturbed run */
        if ((v = N_ITER * 6.0 * 16 / timed(exact_loop, N_ITER) / 1e9) > e) e = v;
        if ((v = N_ITER * 6.0 * 32 / timed(u8s8_loop, N_ITER) / 1e9) > u) u = v;
        if ((v = N_ITER * 10.0 * 8 / timed(fp32_loop, N_ITER) / 1e9) > f) f = v;
    }
    printf("exact vpmaddwd ymm: %.1f GMAC/s one core\n", e);
    printf("u8s8 vpmaddubsw ymm: %.1f GMAC/s one core (%.2fx exact; saturates in int16)\n", u, u / e);
    printf("fp32 vfmadd231ps ymm: %.1f GMAC/s one core\n", f);
    return 0;
}
