/*
 * gemm_f64_avx2.c — the packed f64 GEMM with an AVX2+FMA micro-kernel (compiled with -mavx2 -mfma): the f32
 * design of gemm_avx2.c in 4-double lanes.
 *
 * Micro-tile: 6 rows x 8 columns of C = 12 ymm accumulators, 2 for B, 1 broadcast: 15 of the 16 ymm
 * registers (BLIS's haswell dgemm tile). Per step l: two loads of B, six broadcasts of A, twelve FMAs.
 *   C[r, 0:8] (+)= sum_l a[l*6 + r] * b[l*8 + 0:8]
 * Edge tiles compute only the 1/2/4/6-row and 4-column blocks that hold valid elements (the packed panels are
 * zero-padded) and store the last 4-column half under a mask, straight into C; every element of C gets the
 * same FMA chain over l as in a full tile, so the bits do not depend on where a tile falls.
 *
 * The loops around it are gemm_packed.h's (jc by NC, pc by KC, ic by MC, ir, jr), written out here because
 * the packs differ: a row-major copy (op(A) from A stored [k,m], op(B) from B stored [k,p]) walks each row
 * of the source once, writing its mc (nc) contiguous values into all the panels, where gemm_packed.h copies
 * one panel at a time, 6 (8) values per row. At a row stride of 4 KiB (m = 512) that read one page per value
 * of l, every row falling in the same L1 and L2 sets, each line fetched again for the next panel: TN and TT
 * ran at 0.71x OpenBLAS at 512^3 and A^T dO at n = 2048 at 0.75x (bench/gemm, 5 runs, load 8-10).
 */
#include "gemm_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#define GEMM_T double
#define GEMM_KC QKV_GEMM_F64_KC
#define GEMM_MC QKV_GEMM_F64_MC
#define GEMM_NC QKV_GEMM_F64_NC
#define GEMM_MR 6
#define GEMM_NR 8
#define GEMM_NAME qkv_gemm_f64_avx2_

/* A tile of C from packed panels: the first `rows` rows (1, 2, 4 or 6) and 4 * `halves` columns (4 or 8) are
 * computed (constants at every call site, so only their accumulators live), of those the first store_rows
 * rows written, the last 4-column half only in the lanes of `mask` unless full_mask. */
static inline __attribute__((always_inline)) void tile_kernel(int64_t kc, const double *restrict a,
                                                              const double *restrict b, double *restrict c,
                                                              int64_t ldc, bool add, const int rows,
                                                              const int halves, int store_rows, __m256i mask,
                                                              const bool full_mask) {
#define ACC_DECL(r) __m256d c##r##0 = _mm256_setzero_pd(), c##r##1 = _mm256_setzero_pd();
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
#undef ACC_DECL
    for (int64_t l = 0; l < kc; l++) {
        // c[r, :] += a[l, r] * b[l, :]
        __m256d b0 = _mm256_load_pd(b), b1 = halves > 1 ? _mm256_load_pd(b + 4) : b0;
#define ACC_FMA(r)                                                                                     \
    if (rows > (r)) {                                                                                  \
        __m256d ar = _mm256_broadcast_sd(a + (r));                                                     \
        c##r##0 = _mm256_fmadd_pd(ar, b0, c##r##0);                                                    \
        if (halves > 1) c##r##1 = _mm256_fmadd_pd(ar, b1, c##r##1);                                    \
    }
        ACC_FMA(0) ACC_FMA(1) ACC_FMA(2) ACC_FMA(3) ACC_FMA(4) ACC_FMA(5)
#undef ACC_FMA
        a += GEMM_MR;
        b += GEMM_NR;
    }
    /* c = (add ? c : 0) + acc; a full half is stored whole, the last half under mask */
#define LOAD_LAST(p) (full_mask ? _mm256_loadu_pd(p) : _mm256_maskload_pd(p, mask))
#define STORE_LAST(p, v)                                                                               \
    do {                                                                                               \
        if (full_mask) _mm256_storeu_pd(p, v);                                                         \
        else _mm256_maskstore_pd(p, mask, v);                                                          \
    } while (0)
#define ACC_STORE(r)                                                                                   \
    if (rows > (r) && store_rows > (r)) {                                                              \
        double *cr = c + (r) * ldc;                                                                    \
        if (halves > 1) {                                                                              \
            if (add) {                                                                                 \
                c##r##0 = _mm256_add_pd(_mm256_loadu_pd(cr), c##r##0);                                 \
                c##r##1 = _mm256_add_pd(LOAD_LAST(cr + 4), c##r##1);                                   \
            }                                                                                          \
            _mm256_storeu_pd(cr, c##r##0);                                                             \
            STORE_LAST(cr + 4, c##r##1);                                                               \
        } else {                                                                                       \
            if (add) c##r##0 = _mm256_add_pd(LOAD_LAST(cr), c##r##0);                                  \
            STORE_LAST(cr, c##r##0);                                                                   \
        }                                                                                              \
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3) ACC_STORE(4) ACC_STORE(5)
#undef ACC_STORE
#undef STORE_LAST
#undef LOAD_LAST
}

static void ukernel(int64_t kc, const double *restrict a, const double *restrict b, double *restrict c,
                    int64_t ldc, bool add) {
    tile_kernel(kc, a, b, c, ldc, add, GEMM_MR, 2, GEMM_MR, _mm256_setzero_si256(), true);
}

/* An edge tile, mr <= 6 rows and nr <= 8 columns, straight into C. */
#define GEMM_HAS_EDGE_KERNEL 1
static void ukernel_edge(int64_t kc, const double *restrict a, const double *restrict b, double *restrict c,
                         int64_t ldc, bool add, int64_t mr, int64_t nr) {
    int rows = (int)mr, last = (int)(nr > 4 ? nr - 4 : nr); /* valid lanes of the last half, 1..4 */
    __m256i mask = _mm256_cmpgt_epi64(_mm256_set1_epi64x(last), _mm256_setr_epi64x(0, 1, 2, 3));
    bool full = last == 4;
#define TILE(r, h) tile_kernel(kc, a, b, c, ldc, add, r, h, rows, mask, full)
    if (nr > 4) {
        if (mr > 4) TILE(6, 2);
        else if (mr > 2) TILE(4, 2);
        else if (mr > 1) TILE(2, 2);
        else TILE(1, 2);
    } else {
        if (mr > 4) TILE(6, 1);
        else if (mr > 2) TILE(4, 1);
        else if (mr > 1) TILE(2, 1);
        else TILE(1, 1);
    }
#undef TILE
}

/* [r0..r3] (4 doubles each) -> columns: r[j] = (r0[j], r1[j], r2[j], r3[j]) */
static inline __attribute__((always_inline)) void transpose4(__m256d r[4]) {
    __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
    __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
    r[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    r[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    r[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    r[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

/* dst[l*rows + r] = src[r*ld + l], rows 6 (a panel of A) or 8 (of B^T), 4 values of l at a time. */
#define GEMM_HAS_PACK_T 1
static void pack_t(const double *restrict src, int64_t ld, int64_t kc, double *restrict dst, int rows) {
    int64_t l = 0;
    if (rows == GEMM_MR) {
        for (; l + 4 <= kc; l += 4) {
            __m256d r[4];
            for (int i = 0; i < 4; i++) r[i] = _mm256_loadu_pd(src + i * ld + l);
            transpose4(r);
            __m256d r4 = _mm256_loadu_pd(src + 4 * ld + l), r5 = _mm256_loadu_pd(src + 5 * ld + l);
            __m256d u0 = _mm256_unpacklo_pd(r4, r5), u1 = _mm256_unpackhi_pd(r4, r5); /* l+0,l+2 / l+1,l+3 */
            double *d = dst + l * GEMM_MR;
            for (int j = 0; j < 4; j++) _mm256_storeu_pd(d + j * GEMM_MR, r[j]);
            _mm_storeu_pd(d + 0 * GEMM_MR + 4, _mm256_castpd256_pd128(u0));
            _mm_storeu_pd(d + 1 * GEMM_MR + 4, _mm256_castpd256_pd128(u1));
            _mm_storeu_pd(d + 2 * GEMM_MR + 4, _mm256_extractf128_pd(u0, 1));
            _mm_storeu_pd(d + 3 * GEMM_MR + 4, _mm256_extractf128_pd(u1, 1));
        }
    } else {
        for (; l + 4 <= kc; l += 4)
            for (int half = 0; half < 2; half++) {
                __m256d r[4];
                for (int i = 0; i < 4; i++) r[i] = _mm256_loadu_pd(src + (half * 4 + i) * ld + l);
                transpose4(r);
                for (int j = 0; j < 4; j++) _mm256_store_pd(dst + (l + j) * GEMM_NR + half * 4, r[j]);
            }
    }
    for (; l < kc; l++)
        for (int i = 0; i < rows; i++) dst[l * rows + i] = src[i * ld + l];
}

static inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* Pack op(A)[i0:i0+mc, l0:l0+kc] into 6-row panels (panel q: dst[q*6*kc + l*6 + r], rows past mc zero). */
static void pack_a_f64(const double *restrict a, int64_t m, int64_t k, bool trans_a, int64_t i0, int64_t mc,
                       int64_t l0, int64_t kc, double *restrict dst) {
    if (trans_a) { /* row l of A holds op(A)[:, l]: one pass over each row, mc contiguous values */
        const double *src = a + l0 * m + i0;
        int64_t full = mc / GEMM_MR * GEMM_MR;
        for (int64_t l = 0; l < kc; l++, src += m) {
            double *d = dst + l * GEMM_MR;
            int64_t ir = 0;
            for (; ir < full; ir += GEMM_MR, d += GEMM_MR * kc) {
                _mm256_storeu_pd(d, _mm256_loadu_pd(src + ir));
                _mm_storeu_pd(d + 4, _mm_loadu_pd(src + ir + 4));
            }
            if (ir < mc) {
                int r = 0;
                for (; r < mc - ir; r++) d[r] = src[ir + r];
                for (; r < GEMM_MR; r++) d[r] = 0.0;
            }
        }
        return;
    }
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR, dst += GEMM_MR * kc) { /* interleave 6 rows of A */
        int64_t mr = min64(GEMM_MR, mc - ir);
        const double *src = a + (i0 + ir) * k + l0;
        if (mr == GEMM_MR) {
            pack_t(src, k, kc, dst, GEMM_MR);
        } else {
            for (int64_t l = 0; l < kc; l++) {
                for (int r = 0; r < mr; r++) dst[l * GEMM_MR + r] = src[r * k + l];
                for (int r = (int)mr; r < GEMM_MR; r++) dst[l * GEMM_MR + r] = 0.0;
            }
        }
    }
}

/* Pack op(B)[l0:l0+kc, j0:j0+nc] into 8-column panels (panel q: dst[q*8*kc + l*8 + j], columns past nc zero). */
static void pack_b_f64(const double *restrict b, int64_t k, int64_t p, bool trans_b, int64_t l0, int64_t kc,
                       int64_t j0, int64_t nc, double *restrict dst) {
    if (!trans_b) { /* row l of B holds op(B)[l, :]: one pass over each row, nc contiguous values */
        const double *src = b + l0 * p + j0;
        int64_t full = nc / GEMM_NR * GEMM_NR;
        for (int64_t l = 0; l < kc; l++, src += p) {
            double *d = dst + l * GEMM_NR;
            int64_t jr = 0;
            for (; jr < full; jr += GEMM_NR, d += GEMM_NR * kc) {
                _mm256_store_pd(d, _mm256_loadu_pd(src + jr));
                _mm256_store_pd(d + 4, _mm256_loadu_pd(src + jr + 4));
            }
            if (jr < nc) {
                int j = 0;
                for (; j < nc - jr; j++) d[j] = src[jr + j];
                for (; j < GEMM_NR; j++) d[j] = 0.0;
            }
        }
        return;
    }
    for (int64_t jr = 0; jr < nc; jr += GEMM_NR, dst += GEMM_NR * kc) { /* interleave 8 rows of B */
        int64_t nr = min64(GEMM_NR, nc - jr);
        const double *src = b + (j0 + jr) * k + l0;
        if (nr == GEMM_NR) {
            pack_t(src, k, kc, dst, GEMM_NR);
        } else {
            for (int64_t l = 0; l < kc; l++) {
                for (int j = 0; j < nr; j++) dst[l * GEMM_NR + j] = src[j * k + l];
                for (int j = (int)nr; j < GEMM_NR; j++) dst[l * GEMM_NR + j] = 0.0;
            }
        }
    }
}

static inline void one_tile(int64_t kc, const double *ap, const double *bp, double *ct, int64_t ldc, bool add,
                            int64_t mr, int64_t nr) {
    if (mr == GEMM_MR && nr == GEMM_NR) ukernel(kc, ap, bp, ct, ldc, add);
    else ukernel_edge(kc, ap, bp, ct, ldc, add, mr, nr);
}

bool qkv_gemm_f64_avx2_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, double *apack, double *bpack) {
    /* equal depth blocks of at most KC (a multiple of 16 when k allows): kc depends only on k */
    int64_t nblocks_k = (k + GEMM_KC - 1) / GEMM_KC;
    int64_t kc_step = (k + nblocks_k - 1) / nblocks_k;
    if (nblocks_k > 1) kc_step = min64(GEMM_KC, (kc_step + 15) & ~(int64_t)15);
    int64_t nc_step = (int64_t)GEMM_KC * GEMM_NC / kc_step / GEMM_NR * GEMM_NR;
    int64_t mc_step = (int64_t)GEMM_KC * GEMM_MC / kc_step / GEMM_MR * GEMM_MR;
    for (int64_t jc = 0; jc < p; jc += nc_step) {
        int64_t nc = min64(nc_step, p - jc);
        for (int64_t pc = 0; pc < k; pc += kc_step) {
            int64_t kc = min64(kc_step, k - pc);
            bool add = accumulate || pc > 0;
            // Bp = op(B)[pc:pc+kc, jc:jc+nc] in 8-column panels
            pack_b_f64(b, k, p, trans_b, pc, kc, jc, nc, bpack);
            for (int64_t ic = 0; ic < m; ic += mc_step) {
                int64_t mc = min64(mc_step, m - ic);
                // Ap = op(A)[ic:ic+mc, pc:pc+kc] in 6-row panels
                pack_a_f64(a, m, k, trans_a, ic, mc, pc, kc, apack);
                double *cb = c + ic * p + jc;
                // C[ic:ic+mc, jc:jc+nc] (+)= Ap Bp
                for (int64_t ir = 0; ir < mc; ir += GEMM_MR) /* the 6-row panel of A stays in L1 */
                    for (int64_t jr = 0; jr < nc; jr += GEMM_NR)
                        one_tile(kc, apack + ir * kc, bpack + jr * kc, cb + ir * p + jr, p, add,
                                 min64(GEMM_MR, mc - ir), min64(GEMM_NR, nc - jr));
            }
        }
    }
    return true;
}

#else /* not compiled for AVX2+FMA: the dispatcher never picks this ISA */

bool qkv_gemm_f64_avx2_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                        bool trans_a, bool trans_b, bool accumulate, double *apack, double *bpack) {
    (void)a, (void)b, (void)c, (void)m, (void)k, (void)p, (void)trans_a, (void)trans_b, (void)accumulate;
    (void)apack, (void)bpack;
    return false;
}

#endif
