/* The int32 accumulator of an int8 GEMM on Intel AMX tiles (Sapphire Rapids and later):
 *
 *     C[i, j] = sum_k A[i, k] * B[k, j]        A uint8 (M x K), B int8 (K x N), C int32 (M x N)
 *
 * with tdpbusd (u8 x s8 -> s32, 16x64 by 64x16 into 16x16 per instruction, sums of 4 products added
 * exactly in int32: the same integers as vpdpbusd). TVM's LLVM codegen cannot name the x86_amx tile
 * type, so the kernel is this C function, compiled into the artifact next to work_claiming.c and
 * called from the TIR kernel (qcompiler/codegen/kernels/qdot.py, ``dense_amx``) once per chunk of
 * column blocks of a parallel loop.
 *
 * Operands, laid out by the caller:
 *   A   M x K row-major, M a multiple of 16, K a multiple of 64 (the packing stage pads);
 *   B   packed at compile time as tiles: for each block of 16 columns j and 64 rows kb of K, one
 *       16 x 64-byte tile, row r holding B[kb*64 + 4r + t, j*16 + n] at byte 4n + t (the VNNI
 *       layout tdpbusd reads), tiles of one column block consecutive along K;
 *   C   M x N row-major int32, N a multiple of 32.
 * Blocks of 32 x 32 outputs (2 x 2 tiles), in the order that re-reads the smaller operand: column
 * blocks outer (each pair of weight strips read once while every row block passes over it) or,
 * with rows_outer, row blocks outer (M >= N: long sequences), a chunk [j0, j1) of the outer loop
 * per call.
 *
 * Linux gives a process the 8 KB tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM):
 * asked once, on the first call. Where it is refused (a kernel before 5.16, a hypervisor that hides
 * the state) the same integers come from a plain loop over the packed operands, and 1 is returned. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>


#ifndef QC_API
#define QC_API __attribute__((visibility("hidden")))
#endif

/* AMX intrinsics need GCC 11 or Clang 12; QC_NO_AMX (tests) builds the fallback alone */
#if !defined(QC_NO_AMX) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define QC_HAVE_AMX 1
#include <immintrin.h>
#endif

static int32_t qc_gemm_u8s8_plain(const uint8_t *A, const int8_t *B, int32_t *C, int32_t M, int32_t N,
                                  int32_t K, int32_t j0, int32_t j1, int32_t rows_outer) {
  const long strip = (long)(K / 64) * 1024;
  const long c0 = rows_outer ? 0 : 32L * j0, c1 = rows_outer ? N : 32L * j1;
  const long r0 = rows_outer ? 32L * j0 : 0, r1 = rows_outer ? (32L * j1 < M ? 32L * j1 : M) : M;
  for (long j = c0; j < c1; j++) {
    const int8_t *b = B + (j / 16) * strip + (j % 16) * 4;
    for (long i = r0; i < r1; i++) {
      int32_t s = 0;
      for (long k = 0; k < K; k++) s += (int32_t)A[i * K + k] * b[(k / 64) * 1024 + ((k % 64) / 4) * 64 + k % 4];
      C[i * N + j] = s;
    }
  }
  return 1;
}

#ifdef QC_HAVE_AMX
#define QC_ARCH_REQ_XCOMP_PERM 0x1023
#define QC_XFEATURE_XTILEDATA 18

typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} qc_tilecfg;

static volatile int qc_amx_state; /* 0 unknown, 1 granted, -1 refused */

static int qc_amx_permit(void) {
  int s = qc_amx_state;
  if (s == 0) {
    s = syscall(SYS_arch_prctl, QC_ARCH_REQ_XCOMP_PERM, QC_XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    qc_amx_state = s;
  }
  return s;
}

__attribute__((target("amx-tile,amx-int8"))) static void qc_amx_config(void) {
  qc_tilecfg cfg;                                      /* every tile 16 rows x 64 bytes */
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

/* tiles: 0-3 C (rows x 16 int32), 4-5 A (rows x 64 u8), 6-7 B (16 x 64 s8) */
/* C[i..i+31, 32j..32j+31] (the last 16 rows alone where M - i == 16) */
__attribute__((target("amx-tile,amx-int8"))) static inline void qc_amx_block(
    const uint8_t *A, const int8_t *B, int32_t *C, long M, long N, long K, long i, long j) {
  const long lda = K, ldc = N * 4, kb_n = K / 64, strip = kb_n * 1024;
  const int8_t *b0 = B + 2 * j * strip, *b1 = b0 + strip;
  const uint8_t *a = A + i * lda;
  int32_t *c = C + i * N + 32 * j;
  if (M - i >= 32) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long kb = 0; kb < kb_n; kb++) {
      _tile_loadd(4, a + kb * 64, lda);
      _tile_loadd(5, a + 16 * lda + kb * 64, lda);
      _tile_loadd(6, b0 + kb * 1024, 64);
      _tile_loadd(7, b1 + kb * 1024, 64);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, c, ldc);
    _tile_stored(1, c + 16, ldc);
    _tile_stored(2, c + 16 * N, ldc);
    _tile_stored(3, c + 16 * N + 16, ldc);
  } else {                                            /* the last 16 rows */
    _tile_zero(0); _tile_zero(1);
    for (long kb = 0; kb < kb_n; kb++) {
      _tile_loadd(4, a + kb * 64, lda);
      _tile_loadd(6, b0 + kb * 1024, 64);
      _tile_loadd(7, b1 + kb * 1024, 64);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
    }
    _tile_stored(0, c, ldc);
    _tile_stored(1, c + 16, ldc);
  }
}

/* rows_outer = 0: column blocks j0 <= j < j1 (units of 32 columns), all rows of each; rows_outer = 1:
 * row blocks j0 <= r < j1 (units of 32 rows), all columns of each. */
__attribute__((target("amx-tile,amx-int8"))) QC_API int32_t qc_amx_gemm_u8s8(
    const uint8_t *A, const int8_t *B, int32_t *C, int32_t M, int32_t N, int32_t K, int32_t j0, int32_t j1,
    int32_t rows_outer) {
  if (qc_amx_permit() < 0) return qc_gemm_u8s8_plain(A, B, C, M, N, K, j0, j1, rows_outer);
  qc_amx_config();
  if (rows_outer) {
    for (long r = j0; r < j1; r++)
      for (long j = 0; j < N / 32; j++) qc_amx_block(A, B, C, M, N, K, 32 * r, j);
  } else {
    for (long j = j0; j < j1; j++)
      for (long i = 0; i < M; i += 32) qc_amx_block(A, B, C, M, N, K, i, j);
  }
  _tile_release();
  return 0;
}
#else
QC_API int32_t qc_amx_gemm_u8s8(const uint8_t *A, const int8_t *B, int32_t *C, int32_t M, int32_t N, int32_t K,
                                int32_t j0, int32_t j1, int32_t rows_outer) {
  return qc_gemm_u8s8_plain(A, B, C, M, N, K, j0, j1, rows_outer);
}
#endif
#endif
