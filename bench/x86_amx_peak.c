/* The AMX-INT8 peak of one x86 core (Sapphire Rapids and later): four independent tdpbusd tile
 * multiply-accumulates (16x64 u8 times 64x16 s8 into 16x16 int32: 16384 MACs each) per loop, the
 * operands resident in tiles. Our kernels do not use AMX yet; bench_x86_int8_kernels.py prints this
 * beside the VNNI peak (bench/x86_vnni_peak.c) as the headroom AMX would give.
 *
 *   cc -O2 -mamx-tile -mamx-int8 bench/x86_amx_peak.c -o /tmp/amx_peak && /tmp/amx_peak
 * prints "tdpbusd: <G> GMAC/s one core"; exits 1 where the kernel refuses the tile state. */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int8_t A[16*64] __attribute__((aligned(64))), B[16*64] __attribute__((aligned(64)));
static int32_t C[16*16] __attribute__((aligned(64)));
int main(void){
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("arch_prctl"); return 1; }
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  memset(A, 1, sizeof A); memset(B, 2, sizeof B);
  _tile_loadd(4, A, 64); _tile_loadd(5, B, 64); _tile_loadd(6, A, 64); _tile_loadd(7, B, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  long n = 2000000; double best = 0;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    for (long i = 0; i < n; i++) { _tile_dpbusd(0, 4, 5); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 6, 5); _tile_dpbusd(3, 6, 7); }
    double g = n * 4.0 * 16 * 16 * 64 / (now() - t0) / 1e9; if (g > best) best = g;
  }
  _tile_stored(0, C, 64); _tile_release();
  printf("tdpbusd: %.0f GMAC/s one core (C[0]=%d)\n", best, C[0]);
  return 0;
}
