/* The int8 dot-product peak of one x86 core: 12 independent chains of AVX-512 VNNI vpdpbusd on zmm
 * registers (64 u8 x s8 multiply-adds each), no memory traffic. bench_x86_int8_kernels.py compiles
 * and runs it to print each int8 kernel's achieved fraction of this peak.
 *
 *   cc -O2 -mavx512f -mavx512bw -mavx512vnni bench/x86_vnni_peak.c -o /tmp/vnni_peak && /tmp/vnni_peak
 * prints "vpdpbusd zmm: <G> GMAC/s one core". */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHAIN(c) c = _mm512_dpbusd_epi32(c, a, b)

int main(void) {
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2), z = _mm512_setzero_si512();
    __m512i c0 = z, c1 = z, c2 = z, c3 = z, c4 = z, c5 = z, c6 = z, c7 = z, c8 = z, c9 = z, c10 = z, c11 = z;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        long n = 4000000L;
        double t0 = now();
        for (long i = 0; i < n; i++) {
            CHAIN(c0); CHAIN(c1); CHAIN(c2); CHAIN(c3); CHAIN(c4); CHAIN(c5);
            CHAIN(c6); CHAIN(c7); CHAIN(c8); CHAIN(c9); CHAIN(c10); CHAIN(c11);
        }
        double g = n * 12.0 * 64 / (now() - t0) / 1e9;
        best = g > best ? g : best;
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    printf("vpdpbusd zmm: %.1f GMAC/s one core (checksum %d)\n", best, _mm512_reduce_add_epi32(s));
    return 0;
}
