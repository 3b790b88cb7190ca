/*
 * gemm_avx512.c — the packed f32 GEMM with an AVX-512F micro-kernel (compiled with -mavx512f -mavx2 -mfma).
 *
 * Micro-tile: 12 rows x 32 columns of C = 24 zmm accumulators. Per step l of the depth loop: two loads of
 * B (b[l, 0:16], b[l, 16:32]) and, for each of the 12 rows, one broadcast of a[l, r] feeding two FMAs:
 * 24 FMAs for 2 loads and 12 broadcast loads, 27 of the 32 zmm registers.
 *   C[r, 0:32] (+)= sum_l a[l*12 + r] * b[l*32 + 0:32]
 * Edge tiles compute only the 4-row / 16-column blocks that hold valid elements and store under masks.
 * For narrow outputs A is read where it lies instead of being packed (qkv_gemm_direct_a_, gemm_kernels.h).
 * On Zen 4 (the machine of issue 6) a 512-bit FMA issues once per cycle, so the peak equals AVX2's; the
 * gain is the 32 registers (a larger tile, fewer loads per FMA) and masked edges.
 */
#include "gemm_kernels.h"

/* QKV_EMULATE_AVX512: the test-only build through SIMDe (tests/avx512_emulation.h), no -mavx512f */
#if defined(__AVX512F__) || defined(QKV_EMULATE_AVX512)

#include <immintrin.h>

#include "avx512_transpose.h"

#define GEMM_MR 12
#define GEMM_NR 32
#define GEMM_NAME qkv_gemm_f32_avx512_
#define GEMM_ROWS_NAME qkv_gemm_f32_avx512_rows_
#define GEMM_SMALL_NAME qkv_gemm_f32_small_avx512_
#define GEMM_SMALL_ROWS(nr) GEMM_MR

/* A tile of C: the first `rows` rows (1, 2, 4, 8 or 12) and 16 * `halves` columns (16 or 32) are computed;
 * rows and halves are constants at every call site, so each keeps only the accumulators it uses. Of those,
 * the first `store_rows` rows are written, and in the last 16-column half only the lanes of `mask` (edge
 * tiles: masked loads and stores write nothing outside C, and no tile buffer is needed).
 * B: packed, row l of the tile at b[l*NR]; in place (b_in_place), at b[l*ldb], the last half loaded under
 * `mask` so that nothing past op(B)'s last column is read. */
static inline __attribute__((always_inline)) void tile_kernel(int64_t kc, const float *restrict a,
                                                              const float *restrict b, float *restrict c,
                                                              int64_t ldc, bool add, const int rows,
                                                              const int halves, int store_rows, __mmask16 mask,
                                                              const bool direct, int64_t rs_a, int64_t cs_a,
                                                              const bool b_in_place, int64_t ldb,
                                                              const bool grouped) {
    /* Where row r of the tile reads A: packed, a[l*MR + r]; direct, a[r*rs_a + l*cs_a], with the rows past
     * store_rows (outside A) reading the last valid row instead — they are computed but never stored.
     * grouped (direct, every row inside A): through four pointers, one per three rows, row r at
     * g[r/3][(r%3)*rs_a] — five registers for twelve rows, where twelve offsets would spill. */
    const float *g0 = a, *g1 = grouped && rows > 3 ? a + 3 * rs_a : a;
    const float *g2 = grouped && rows > 6 ? a + 6 * rs_a : a, *g3 = grouped && rows > 9 ? a + 9 * rs_a : a;
#define OFF_DECL(r) const int64_t o##r = direct ? (int64_t)((r) < store_rows ? (r) : store_rows - 1) * rs_a : (r);
    OFF_DECL(0) OFF_DECL(1) OFF_DECL(2) OFF_DECL(3) OFF_DECL(4) OFF_DECL(5)
    OFF_DECL(6) OFF_DECL(7) OFF_DECL(8) OFF_DECL(9) OFF_DECL(10) OFF_DECL(11)
#undef OFF_DECL
    const int64_t step_a = direct ? cs_a : GEMM_MR;
#define ACC_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
    ACC_DECL(6) ACC_DECL(7) ACC_DECL(8) ACC_DECL(9) ACC_DECL(10) ACC_DECL(11)
#undef ACC_DECL
    for (int64_t l = 0; l < kc; l++) {
        // c[r, :] += a[l, r] * b[l, :]
        __m512 b0, b1;
        if (!b_in_place) {
            b0 = _mm512_load_ps(b);
            b1 = halves > 1 ? _mm512_load_ps(b + 16) : b0;
        } else if (halves > 1) {
            b0 = _mm512_loadu_ps(b);
            b1 = _mm512_maskz_loadu_ps(mask, b + 16);
        } else {
            b0 = b1 = _mm512_maskz_loadu_ps(mask, b);
        }
#define A_AT(r) (grouped ? ((r) < 3 ? g0 : (r) < 6 ? g1 : (r) < 9 ? g2 : g3)[((r) % 3) * rs_a] : a[o##r])
#define ACC_FMA(r)                                                                                     \
    if (rows > (r)) {                                                                                  \
        __m512 ar = _mm512_set1_ps(A_AT(r));                                                           \
        c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);                                                    \
        if (halves > 1) c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);                                    \
    }
        ACC_FMA(0) ACC_FMA(1) ACC_FMA(2) ACC_FMA(3) ACC_FMA(4) ACC_FMA(5)
        ACC_FMA(6) ACC_FMA(7) ACC_FMA(8) ACC_FMA(9) ACC_FMA(10) ACC_FMA(11)
#undef ACC_FMA
#undef A_AT
        if (grouped) g0 += cs_a, g1 += cs_a, g2 += cs_a, g3 += cs_a;
        else a += step_a;
        b += b_in_place ? ldb : GEMM_NR;
    }
    /* c = (add ? c : 0) + acc; a full half is stored whole, the last half under mask */
#define ACC_STORE(r)                                                                                   \
    if (rows > (r) && store_rows > (r)) {                                                              \
        float *cr = c + (r) * ldc;                                                                     \
        if (halves > 1) {                                                                              \
            if (add) {                                                                                 \
                c##r##0 = _mm512_add_ps(_mm512_loadu_ps(cr), c##r##0);                                 \
                c##r##1 = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, cr + 16), c##r##1);                \
            }                                                                                          \
            _mm512_storeu_ps(cr, c##r##0);                                                             \
            _mm512_mask_storeu_ps(cr + 16, mask, c##r##1);                                             \
        } else {                                                                                       \
            if (add) c##r##0 = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, cr), c##r##0);                \
            _mm512_mask_storeu_ps(cr, mask, c##r##0);                                                  \
        }                                                                                              \
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3) ACC_STORE(4) ACC_STORE(5)
    ACC_STORE(6) ACC_STORE(7) ACC_STORE(8) ACC_STORE(9) ACC_STORE(10) ACC_STORE(11)
#undef ACC_STORE
}

static void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc,
                    bool add) {
    tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, 0xffff, false, 1, GEMM_MR, false, GEMM_NR, false);
}

/* An edge tile, mr < 12 rows or nr < 32 columns, straight into C: only the rows (in blocks of 1, 2, 4, 8
 * or 12) and 16-column halves that hold valid elements are computed, and the stores are masked to the tile.
 * direct: A read in place; b_in_place: B too (row stride ldb). */
static inline __attribute__((always_inline)) void any_tile(int64_t kc, const float *restrict a,
                                                           const float *restrict b, float *restrict c,
                                                           int64_t ldc, bool add, int64_t mr, int64_t nr,
                                                           const bool direct, int64_t rs_a, int64_t cs_a,
                                                           const bool b_in_place, int64_t ldb) {
    int rows = (int)mr;
    __mmask16 mask = (__mmask16)(0xffffu >> (16 - (nr > 16 ? nr - 16 : nr)));
    /* direct with mr exactly 12, 8, 4, 2 or 1: the grouped addressing (no row outside A) */
#define TILE(r, h)                                                                                     \
    do {                                                                                               \
        if (direct && mr == (r))                                                                       \
            tile_kernel(kc, a, b, c, ldc, add, r, h, rows, mask, true, rs_a, cs_a, b_in_place, ldb, true); \
        else                                                                                           \
            tile_kernel(kc, a, b, c, ldc, add, r, h, rows, mask, direct, rs_a, cs_a, b_in_place, ldb, false); \
    } while (0)
#define TILE_ROWS(h)                                                                                   \
    do {                                                                                               \
        if (mr > 8) TILE(12, h);                                                                       \
        else if (mr > 4) TILE(8, h);                                                                   \
        else if (mr > 2) TILE(4, h);                                                                   \
        else if (mr > 1) TILE(2, h);                                                                   \
        else TILE(1, h);                                                                               \
    } while (0)
    if (nr > 16) TILE_ROWS(2);
    else TILE_ROWS(1);
#undef TILE_ROWS
#undef TILE
}

#define GEMM_HAS_EDGE_KERNEL 1
static void ukernel_edge(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c,
                         int64_t ldc, bool add, int64_t mr, int64_t nr) {
    any_tile(kc, a, b, c, ldc, add, mr, nr, false, 1, GEMM_MR, false, GEMM_NR);
}

#define GEMM_HAS_DIRECT_A 1 /* when qkv_gemm_direct_a_ says so (gemm_kernels.h) */

static void ukernel_direct(int64_t kc, const float *restrict a, int64_t rs_a, int64_t cs_a,
                           const float *restrict b, float *restrict c, int64_t ldc, bool add, int64_t mr,
                           int64_t nr) {
    if (mr == GEMM_MR && nr == GEMM_NR) {
        if (cs_a == 1) tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, 0xffff, true, rs_a, 1, false, 0, false);
        else tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, 0xffff, true, 1, cs_a, false, 0, false);
    } else {
        any_tile(kc, a, b, c, ldc, add, mr, nr, true, rs_a, cs_a, false, GEMM_NR);
    }
}

/* dst[l*rows + r] = src[r*ld + l], rows 12 (a panel of A) or 32 (of B^T), 16 values of l at a time. */
#define GEMM_HAS_PACK_T 1
static void pack_t(const float *restrict src, int64_t ld, int64_t kc, float *restrict dst, int rows) {
    int64_t l = 0;
    if (rows == GEMM_MR) {
        for (; l + 16 <= kc; l += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = i < GEMM_MR ? _mm512_loadu_ps(src + i * ld + l) : _mm512_setzero_ps();
            qkv_transpose16_avx512_(r);
            /* 12 valid lanes per l; each full store's 4 extra lanes are overwritten by the next one */
            float *d = dst + l * GEMM_MR;
            for (int j = 0; j < 15; j++) _mm512_storeu_ps(d + j * GEMM_MR, r[j]);
            _mm512_mask_storeu_ps(d + 15 * GEMM_MR, 0x0fff, r[15]);
        }
    } else {
        for (; l + 16 <= kc; l += 16)
            for (int half = 0; half < 2; half++) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (half * 16 + i) * ld + l);
                qkv_transpose16_avx512_(r);
                for (int j = 0; j < 16; j++) _mm512_store_ps(dst + (l + j) * GEMM_NR + half * 16, r[j]);
            }
    }
    for (; l < kc; l++)
        for (int i = 0; i < rows; i++) dst[l * rows + i] = src[i * ld + l];
}

#include "gemm_packed.h"

/* dst [cols, rows] = src [rows, cols]^T, both row-major: 16 x 16 blocks transposed in registers, partial
 * blocks loaded and stored under masks. */
void qkv_transpose_f32_avx512_(const float *src, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        int64_t nr = gemm_min(16, rows - r0);
        __mmask16 store_mask = (__mmask16)(0xffffu >> (16 - nr));
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            int64_t nc = gemm_min(16, cols - c0);
            __mmask16 load_mask = (__mmask16)(0xffffu >> (16 - nc));
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < nr ? _mm512_maskz_loadu_ps(load_mask, src + (r0 + i) * cols + c0) : _mm512_setzero_ps();
            qkv_transpose16_avx512_(r);
            for (int j = 0; j < nc; j++) _mm512_mask_storeu_ps(dst + (c0 + j) * rows + r0, store_mask, r[j]);
        }
    }
}

#else /* not compiled for AVX-512: the dispatcher never picks this ISA */

void qkv_transpose_f32_avx512_(const float *src, int64_t rows, int64_t cols, float *dst) {
    (void)src, (void)rows, (void)cols, (void)dst;
}

bool qkv_gemm_f32_small_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                                bool trans_a, bool accumulate) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)accumulate;
    return false;
}

bool qkv_gemm_f32_avx512_rows_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                             bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack, int64_t i_begin,
                             int64_t i_end) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)trans_b, (void)accumulate;
    (void)apack, (void)bpack, (void)i_begin, (void)i_end;
    return false;
}

bool qkv_gemm_f32_avx512_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                          bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)trans_b, (void)accumulate;
    (void)apack, (void)bpack;
    return false;
}

#endif
