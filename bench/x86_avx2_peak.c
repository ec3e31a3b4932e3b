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

/* vpmaddwd into a temporary, vpaddd into one of 6 accumulators (ymm0-5); operands ymm14, ymm15. */
static void exact_loop(long n) {
    __asm__ volatile(
        "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15\n"
        "1:\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm8\n vpaddd %%ymm8, %%ymm0, %%ymm0\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm9\n vpaddd %%ymm9, %%ymm1, %%ymm1\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm10\n vpaddd %%ymm10, %%ymm2, %%ymm2\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm11\n vpaddd %%ymm11, %%ymm3, %%ymm3\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm4, %%ymm4\n"
        " vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm5, %%ymm5\n"
        " dec %0\n jnz 1b\n vzeroupper\n"
        : "+r"(n) : : CLOBBER, "cc");
}

/* vpmaddubsw, vpmaddwd with ones (ymm13), vpaddd into one of 6 accumulators. */
static void u8s8_loop(long n) {
    __asm__ volatile(
        "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15\n vpxor %%ymm13, %%ymm13, %%ymm13\n"
        "1:\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm6\n vpmaddwd %%ymm6, %%ymm13, %%ymm6\n vpaddd %%ymm6, %%ymm0, %%ymm0\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm7\n vpmaddwd %%ymm7, %%ymm13, %%ymm7\n vpaddd %%ymm7, %%ymm1, %%ymm1\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm8\n vpmaddwd %%ymm8, %%ymm13, %%ymm8\n vpaddd %%ymm8, %%ymm2, %%ymm2\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm9\n vpmaddwd %%ymm9, %%ymm13, %%ymm9\n vpaddd %%ymm9, %%ymm3, %%ymm3\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm10\n vpmaddwd %%ymm10, %%ymm13, %%ymm10\n vpaddd %%ymm10, %%ymm4, %%ymm4\n"
        " vpmaddubsw %%ymm14, %%ymm15, %%ymm11\n vpmaddwd %%ymm11, %%ymm13, %%ymm11\n vpaddd %%ymm11, %%ymm5, %%ymm5\n"
        " dec %0\n jnz 1b\n vzeroupper\n"
        : "+r"(n) : : CLOBBER, "cc");
}

/* 10 independent vfmadd231ps chains (ymm0-9). */
static void fp32_loop(long n) {
    __asm__ volatile(
        "vxorps %%ymm14, %%ymm14, %%ymm14\n vxorps %%ymm15, %%ymm15, %%ymm15\n"
        "1:\n"
        " vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n"
        " vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n"
        " vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n"
        " vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n"
        " vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n"
        " dec %0\n jnz 1b\n vzeroupper\n"
        : "+r"(n) : : CLOBBER, "cc");
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
