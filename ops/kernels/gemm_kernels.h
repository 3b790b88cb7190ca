/*
 * gemm_kernels.h — what ops/gemm.c shares with the per-ISA packed f32 GEMMs in ops/kernels/.
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
#define QKV_GEMM_BPACK (QKV_GEMM_KC * QKV_GEMM_NC)

/* The packed GEMM with one ISA's micro-kernel. m, k, p > 0. Returns false (and does nothing) when that ISA's
 * kernel was not compiled into this build (a non-x86 target, or a compiler without the flag). */
bool qkv_gemm_f32_portable_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                            bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
bool qkv_gemm_f32_avx2_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);
bool qkv_gemm_f32_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                          bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack);

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
