/*
 * gemm_kernels.h — what ops/gemm.c shares with the per-ISA packed f32 and f64 GEMMs in ops/kernels/.
 *
 * Each ISA file (gemm_portable.c, gemm_avx2.c, gemm_avx512.c) is compiled with its own instruction-set flags
 * and includes gemm_packed.h, which instantiates the whole packed GEMM around that file's micro-kernel:
 *   C[m,p] (+)= op(A)[m,k] op(B)[k,p]
 * with op(A) packed into MR-row panels and op(B) into NR-column panels (transposes are resolved while
 * packing), cache-blocked by KC (depth), MC (rows of C) and NC (columns of C). The blocking is fixed, so the
 * same inputs give the same bits on every call.
 *
 * The packing buffers are the caller's (ops/gemm.c keeps one block per thread): apack holds at least
 * QKV_GEMM_APACK floats, bpack at least QKV_GEMM_BPACK floats, both 64-byte aligned.
 */
#ifndef QKV_GEMM_KERNELS_H
#define QKV_GEMM_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* Cache blocking, shared by every ISA (MC a multiple of every MR, NC a multiple of every NR). An MR x KC
 * micro-panel of packed A stays in L1 while the KC x NC block of packed B (512 KiB) streams from L2; NC
 * grows when k < KC so the block stays the same size. Measured on a Zen 4 core (32 KiB L1d, 1 MiB L2):
 * KC 256..512, MC 48..144, NC 384..640 are all within the noise of each other from 256^3 to 2048^3; this
 * one keeps the two thread-local buffers at 560 KiB. */
#define QKV_GEMM_KC 256
#define QKV_GEMM_MC 48
#define QKV_GEMM_NC 512
#define QKV_GEMM_APACK (QKV_GEMM_MC * QKV_GEMM_KC)

/* ops/gemm.c's dispatch (and the emulated AVX-512 dispatch of tests/test_avx512_emulated.c, which follows
 * it): below QKV_GEMM_SMALL multiply-adds the reference loops beat packing (bench/gemm --shape: at 8x8x8
 * the packed AVX-512 path is already 1.2-2.5x faster, at 4x4x4 and below the loops are); an op(B) of at most
 * QKV_GEMM_SMALL_B floats (16 KiB, half of a 32 KiB L1) is read in place by the ISA's small-path tiles,
 * nothing packed (attention at small n, the projections of a few hundred tokens). */
#define QKV_GEMM_SMALL 512
#define QKV_GEMM_SMALL_B 4096
#define QKV_GEMM_BPACK (QKV_GEMM_KC * QKV_GEMM_NC)

/* The f64 blocking, within the f32 buffers' bytes (one thread block serves both). The loops are those of
 * gemm_packed.h (gemm_f64_avx2.c has its own copy of them, with packs that read rows of A or B whole): an
 * MR x KC panel of A (6 x 256 doubles, 12 KiB) and a KC x NR panel of B (16 KiB) share L1; the KC x NC block
 * of B (352 KiB) stays in this core's 512 KiB L2 while every row of A passes it. MC only bounds the A buffer
 * (its 96 rows make one pack call cover 16 panels); when k < KC, MC and NC grow so the buffers stay full.
 * Measured (bench/gemm --cpu --dtype f64, 7 runs, a loaded machine, qkv / OpenBLAS), with the strided packs
 * of gemm_packed.h: KC 256 NC 128: 0.90x at 512^3, 0.75x at 1024^3, 1.26x at 128x64x128; NC 256: 0.88x, -,
 * 1.19x; KC 192 NC 128: 0.86x, 0.67x, 1.29x; KC 128 NC 256: 0.92x, 0.74x, 1.33x. */
#define QKV_GEMM_F64_KC 256
#define QKV_GEMM_F64_MC 96
#define QKV_GEMM_F64_NC 176
#define QKV_GEMM_F64_APACK (QKV_GEMM_F64_MC * QKV_GEMM_F64_KC) /* doubles; a multiple of 8: bpack stays aligned */
_Static_assert((QKV_GEMM_F64_APACK + QKV_GEMM_F64_KC * QKV_GEMM_F64_NC) * 8 <= (QKV_GEMM_APACK + QKV_GEMM_BPACK) * 4,
               "the f64 blocks exceed the thread's packing buffer");
_Static_assert(QKV_GEMM_F64_APACK % 8 == 0, "the f64 B block must start 64-byte aligned");

/* Whether the packed GEMM reads A where it lies instead of packing it (an ISA with a direct-A kernel asks
 * this, from the shape only, so the same shape always takes the same path): when each panel of A feeds only
 * a few tiles (p <= 128), packing it would cost about as much as computing them; but not when the rows of
 * the panel fight over cache sets. Measured with the AVX-512 12-row panels (bench/gemm --shape, best of
 * runs), direct against packed, GFLOP/s:
 *   NN, p = 64:  k = 512: 111 vs 104;  k = 1000: 110 vs 92;  k = 1536: 96 vs 86;  k = 1024: 74 vs 92
 *                (a row stride that is a multiple of 4 KiB puts all 12 rows of a panel in one L1 set);
 *   TN, p = 64:  m = 512: 114 vs 99;  m = 1024: 105 vs 87;  m = 1536: 93 vs 88;  m = 2048: 64 vs 82;
 *   p = 128:     128^3: 110 vs 105;  QK^T at n = 128: 106 vs 100;  NN k = 1536: 105 vs 100;
 *                TN m = 1024: 82 vs 97;  p = 256 with k = 2048: 73 vs 94 (so never above 128).
 * The AVX2 6-row panels conflict less; the same rule serves them. */
static inline bool qkv_gemm_direct_a_(int64_t m, int64_t k, int64_t p, bool trans_a) {
    int64_t stride = trans_a ? m : k; /* floats between rows of the panel as the kernel walks it */
    if (p <= 64) return trans_a ? m <= 1536 : k % 1024 != 0;
    return p <= 128 && stride < 1024;
}

/* The packed GEMM with one ISA's micro-kernel. m, k, p > 0. Returns false (and does nothing) when that ISA's
 * kernel was not compiled into this build (a non-x86 target, or a compiler without the flag). */
bool qkv_gemm_f32_portable_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                            bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
bool qkv_gemm_f32_avx2_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
bool qkv_gemm_f32_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                          bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
/* The same over rows [i_begin, i_end) of C only (0 <= i_begin < i_end <= m), each element with the bits of the
 * call over all rows: ops/gemm.c gives each thread a range of rows. */
bool qkv_gemm_f32_portable_rows_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                                 bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack,
                                 int64_t i_begin, int64_t i_end);
bool qkv_gemm_f32_avx2_rows_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                             bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack, int64_t i_begin,
                             int64_t i_end);
bool qkv_gemm_f32_avx512_rows_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                               bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack,
                               int64_t i_begin, int64_t i_end);

/* The same packed GEMM in f64 (gemm_f64_portable.c, gemm_f64_avx2.c): apack holds at least
 * QKV_GEMM_F64_MC * QKV_GEMM_F64_KC doubles, bpack QKV_GEMM_F64_KC * QKV_GEMM_F64_NC, both 64-byte aligned.
 * There is no AVX-512 f64 kernel yet: an AVX-512 CPU runs the AVX2 one. */
bool qkv_gemm_f64_portable_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                            bool trans_a, bool trans_b, bool accumulate, double *apack, double *bpack);
bool qkv_gemm_f64_avx2_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, double *apack, double *bpack);

/* Small problems: C[m,p] (+)= op(A)[m,k] B[k,p] with B row-major [k, p] (the caller transposes a B stored
 * [p, k] first), A and B read where they lie, nothing packed; for op(B) that stays in L1 (ops/gemm.c's
 * QKV_GEMM_SMALL_B). Each element of C is one FMA chain over the whole depth, then added to C or stored.
 * m, k, p > 0. Returns false when the ISA was not compiled in (there is no portable one: the reference loops
 * serve). */
bool qkv_gemm_f32_small_avx2_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                              bool trans_a, bool accumulate);
bool qkv_gemm_f32_small_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                                bool trans_a, bool accumulate);
/* dst [cols, rows] = src [rows, cols]^T (row-major, not overlapping), in the ISA's registers: the small path's
 * B^T. Does nothing when the ISA was not compiled in (the caller checks qkv_isa_supported_ first). */
void qkv_transpose_f32_avx2_(const float *src, int64_t rows, int64_t cols, float *dst);
void qkv_transpose_f32_avx512_(const float *src, int64_t rows, int64_t cols, float *dst);

#endif /* QKV_GEMM_KERNELS_H */
