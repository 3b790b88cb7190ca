/*
 * gemm_avx2.c — the packed f32 GEMM with an AVX2+FMA micro-kernel (compiled with -mavx2 -mfma).
 *
 * Micro-tile: 6 rows x 16 columns of C = 12 ymm accumulators, 2 for B, 1 broadcast: 15 of the 16 ymm
 * registers. Per step l: two loads of B, six broadcasts of A, twelve FMAs.
 *   C[r, 0:16] (+)= sum_l a[l*6 + r] * b[l*16 + 0:16]
 * Edge tiles compute only the 2-row / 8-column blocks that hold valid elements and store under masks; for
 * narrow outputs A is read where it lies instead of being packed (qkv_gemm_direct_a_, gemm_kernels.h).
 */
#include "gemm_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include "avx2_transpose.h"

#define GEMM_MR 6
#define GEMM_NR 16
#define GEMM_NAME qkv_gemm_f32_avx2_
#define GEMM_ROWS_NAME qkv_gemm_f32_avx2_rows_
#define GEMM_SMALL_NAME qkv_gemm_f32_small_avx2_
/* small path: 8 columns or fewer take 12-row tiles, twelve accumulators in flight (6 would leave the two
 * FMA pipes, each 4 cycles deep, a quarter idle) */
#define GEMM_SMALL_ROWS(nr) ((nr) > 8 ? GEMM_MR : 2 * GEMM_MR)

/* A tile of C: the first `rows` rows (1, 2, 4 or 6; with one half also 8 or 12, for the small path) and
 * 8 * `halves` columns (8 or 16) are computed; rows and halves are constants at every call site, so each
 * keeps only the accumulators it uses (at most 12 of the 16 ymm registers). Of those, the first
 * `store_rows` rows are written, and in the last 8-column half only the lanes of `mask` (edge tiles: masked
 * loads and stores touch nothing outside C, no tile buffer needed).
 * A: packed, row r at a[l*MR + r]; direct, at a[r*rs_a + l*cs_a], rows past store_rows (outside A) reading
 * the last valid row instead — computed, never stored. grouped (direct, every row inside A): through
 * four pointers, one per three rows, row r at g[r/3][(r%3)*rs_a], so twelve rows do not spill offsets.
 * B: packed, row l of the tile at b[l*NR]; in place (b_in_place), at b[l*ldb], the last half loaded under
 * `mask` so that nothing past op(B)'s last column is read. */
static inline __attribute__((always_inline)) void tile_kernel(int64_t kc, const float *restrict a,
                                                              const float *restrict b, float *restrict c,
                                                              int64_t ldc, bool add, const int rows,
                                                              const int halves, int store_rows, __m256i mask,
                                                              const bool full_mask, const bool direct,
                                                              int64_t rs_a, int64_t cs_a, const bool b_in_place,
                                                              int64_t ldb, const bool grouped) {
#define OFF_DECL(r) const int64_t o##r = direct ? (int64_t)((r) < store_rows ? (r) : store_rows - 1) * rs_a : (r);
    OFF_DECL(0) OFF_DECL(1) OFF_DECL(2) OFF_DECL(3) OFF_DECL(4) OFF_DECL(5)
    OFF_DECL(6) OFF_DECL(7) OFF_DECL(8) OFF_DECL(9) OFF_DECL(10) OFF_DECL(11)
#undef OFF_DECL
    const float *g0 = a, *g1 = grouped && rows > 3 ? a + 3 * rs_a : a;
    const float *g2 = grouped && rows > 6 ? a + 6 * rs_a : a, *g3 = grouped && rows > 9 ? a + 9 * rs_a : a;
    const int64_t step_a = direct ? cs_a : GEMM_MR;
#define ACC_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
    ACC_DECL(6) ACC_DECL(7) ACC_DECL(8) ACC_DECL(9) ACC_DECL(10) ACC_DECL(11)
#undef ACC_DECL
#define LOAD_LAST(p) (full_mask ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask))
    for (int64_t l = 0; l < kc; l++) {
        // c[r, :] += a[l, r] * b[l, :]
        __m256 b0, b1;
        if (!b_in_place) {
            b0 = _mm256_load_ps(b);
            b1 = halves > 1 ? _mm256_load_ps(b + 8) : b0;
        } else if (halves > 1) {
            b0 = _mm256_loadu_ps(b);
            b1 = LOAD_LAST(b + 8);
        } else {
            b0 = b1 = LOAD_LAST(b);
        }
#define A_AT(r) (grouped ? ((r) < 3 ? g0 : (r) < 6 ? g1 : (r) < 9 ? g2 : g3) + ((r) % 3) * rs_a : a + o##r)
#define ACC_FMA(r)                                                                                     \
    if (rows > (r)) {                                                                                  \
        __m256 ar = _mm256_broadcast_ss(A_AT(r));                                                      \
        c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);                                                    \
        if (halves > 1) c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);                                    \
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
#define STORE_LAST(p, v)                                                                               \
    do {                                                                                               \
        if (full_mask) _mm256_storeu_ps(p, v);                                                         \
        else _mm256_maskstore_ps(p, mask, v);                                                          \
    } while (0)
#define ACC_STORE(r)                                                                                   \
    if (rows > (r) && store_rows > (r)) {                                                              \
        float *cr = c + (r) * ldc;                                                                     \
        if (halves > 1) {                                                                              \
            if (add) {                                                                                 \
                c##r##0 = _mm256_add_ps(_mm256_loadu_ps(cr), c##r##0);                                 \
                c##r##1 = _mm256_add_ps(LOAD_LAST(cr + 8), c##r##1);                                   \
            }                                                                                          \
            _mm256_storeu_ps(cr, c##r##0);                                                             \
            STORE_LAST(cr + 8, c##r##1);                                                               \
        } else {                                                                                       \
            if (add) c##r##0 = _mm256_add_ps(LOAD_LAST(cr), c##r##0);                                  \
            STORE_LAST(cr, c##r##0);                                                                   \
        }                                                                                              \
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3) ACC_STORE(4) ACC_STORE(5)
    ACC_STORE(6) ACC_STORE(7) ACC_STORE(8) ACC_STORE(9) ACC_STORE(10) ACC_STORE(11)
#undef ACC_STORE
#undef STORE_LAST
#undef LOAD_LAST
}

static void ukernel(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc,
                    bool add) {
    tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, _mm256_setzero_si256(), true, false, 1, GEMM_MR, false,
                GEMM_NR, false);
}

/* Any tile, mr <= 6 rows and nr <= 16 columns (mr <= 12 with nr <= 8: the small path), straight into C:
 * only the rows (in blocks of 1, 2, 4, 6, 8 or 12) and 8-column halves that hold valid elements are
 * computed, and the last half's loads and stores are masked to the tile. direct: A read in place (grouped
 * when mr is exactly the block); b_in_place: B too (row stride ldb). */
static inline __attribute__((always_inline)) void any_tile(int64_t kc, const float *restrict a,
                                                           const float *restrict b, float *restrict c,
                                                           int64_t ldc, bool add, int64_t mr, int64_t nr,
                                                           const bool direct, int64_t rs_a, int64_t cs_a,
                                                           const bool b_in_place, int64_t ldb) {
    int rows = (int)mr, last = (int)(nr > 8 ? nr - 8 : nr); /* valid lanes of the last half, 1..8 */
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(last), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    bool full = last == 8;
#define TILE(r, h)                                                                                     \
    do {                                                                                               \
        if (direct && mr == (r))                                                                       \
            tile_kernel(kc, a, b, c, ldc, add, r, h, rows, mask, full, true, rs_a, cs_a, b_in_place, ldb, true); \
        else                                                                                           \
            tile_kernel(kc, a, b, c, ldc, add, r, h, rows, mask, full, direct, rs_a, cs_a, b_in_place, ldb,   \
                        false);                                                                        \
    } while (0)
    if (nr > 8) {
        if (mr > 4) TILE(6, 2);
        else if (mr > 2) TILE(4, 2);
        else if (mr > 1) TILE(2, 2);
        else TILE(1, 2);
    } else {
        if (mr > 8) TILE(12, 1);
        else if (mr > 6) TILE(8, 1);
        else if (mr > 4) TILE(6, 1);
        else if (mr > 2) TILE(4, 1);
        else if (mr > 1) TILE(2, 1);
        else TILE(1, 1);
    }
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
        __m256i none = _mm256_setzero_si256();
        if (cs_a == 1)
            tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, none, true, true, rs_a, 1, false, 0, false);
        else tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, none, true, true, 1, cs_a, false, 0, false);
    } else {
        any_tile(kc, a, b, c, ldc, add, mr, nr, true, rs_a, cs_a, false, GEMM_NR);
    }
}

/* dst[l*rows + r] = src[r*ld + l], rows 6 (a panel of A) or 16 (of B^T), 8 values of l at a time. */
#define GEMM_HAS_PACK_T 1
static void pack_t(const float *restrict src, int64_t ld, int64_t kc, float *restrict dst, int rows) {
    int64_t l = 0;
    if (rows == GEMM_MR) {
        for (; l + 8 <= kc; l += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = i < GEMM_MR ? _mm256_loadu_ps(src + i * ld + l) : _mm256_setzero_ps();
            qkv_transpose8_avx2_(r);
            /* 6 valid lanes per l; each full store's 2 extra lanes are overwritten by the next one */
            float *d = dst + l * GEMM_MR;
            for (int j = 0; j < 7; j++) _mm256_storeu_ps(d + j * GEMM_MR, r[j]);
            _mm_storeu_ps(d + 7 * GEMM_MR, _mm256_castps256_ps128(r[7]));
            _mm_storel_pi((__m64 *)(d + 7 * GEMM_MR + 4), _mm256_extractf128_ps(r[7], 1));
        }
    } else {
        for (; l + 8 <= kc; l += 8)
            for (int half = 0; half < 2; half++) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (half * 8 + i) * ld + l);
                qkv_transpose8_avx2_(r);
                for (int j = 0; j < 8; j++) _mm256_store_ps(dst + (l + j) * GEMM_NR + half * 8, r[j]);
            }
    }
    for (; l < kc; l++)
        for (int i = 0; i < rows; i++) dst[l * rows + i] = src[i * ld + l];
}

#include "gemm_packed.h"

/* dst [cols, rows] = src [rows, cols]^T, both row-major: 8 x 8 blocks transposed in registers, partial
 * blocks loaded and stored under masks. */
void qkv_transpose_f32_avx2_(const float *src, int64_t rows, int64_t cols, float *dst) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        int64_t nr = gemm_min(8, rows - r0);
        __m256i store_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr), lane);
        for (int64_t c0 = 0; c0 < cols; c0 += 8) {
            int64_t nc = gemm_min(8, cols - c0);
            __m256i load_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nc), lane);
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < nr ? _mm256_maskload_ps(src + (r0 + i) * cols + c0, load_mask) : _mm256_setzero_ps();
            qkv_transpose8_avx2_(r);
            for (int j = 0; j < nc; j++) _mm256_maskstore_ps(dst + (c0 + j) * rows + r0, store_mask, r[j]);
        }
    }
}

#else /* not compiled for AVX2+FMA: the dispatcher never picks this ISA */

void qkv_transpose_f32_avx2_(const float *src, int64_t rows, int64_t cols, float *dst) {
    (void)src, (void)rows, (void)cols, (void)dst;
}

bool qkv_gemm_f32_small_avx2_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                              bool trans_a, bool accumulate) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)accumulate;
    return false;
}

bool qkv_gemm_f32_avx2_rows_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                             bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack, int64_t i_begin,
                             int64_t i_end) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)trans_b, (void)accumulate;
    (void)apack, (void)bpack, (void)i_begin, (void)i_end;
    return false;
}

bool qkv_gemm_f32_avx2_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, float *apack, float *bpack) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)trans_b, (void)accumulate;
    (void)apack, (void)bpack;
    return false;
}

#endif
