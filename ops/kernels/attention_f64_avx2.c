/*
 * attention_f64_avx2.c — the f64 row kernels of the fused attention with AVX2+FMA and SLEEF's
 * Sleef_expd4_u10avx2 (1-ulp exp), 4 keys a vector (attention_f64_kernels.h). Compiled with -mavx2 -mfma;
 * without SLEEF or the flags it compiles to a set marked unavailable, and ops/attention.c keeps its plain C
 * kernels.
 *
 * Keys past the tile and dropped keys are never loaded (masked loads) and get P = 0. Sums over a row run
 * in 4 lanes, added across at the end: a fixed order, so the bits depend only on the tile.
 */
#include "attention_f64_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#define W 4

/* Lanes c .. c+3 of [0, n), as all-ones 64-bit lanes. */
static inline __m256i below(int64_t c, int64_t n) {
    int64_t left = n - c;
    int64_t lanes = left >= W ? W : left <= 0 ? 0 : left;
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(lanes), _mm256_setr_epi64x(0, 1, 2, 3));
}

static inline bool none(__m256i k) { return _mm256_testz_si256(k, k); }

/* Kept lanes c .. c+3 of a row: below len, and with a nonzero mask byte (bytes past len are not read). */
static inline __m256i keep_lanes(int64_t c, int64_t len, const uint8_t *mrow) {
    __m256i k = below(c, len);
    if (mrow && !none(k)) {
        uint8_t tmp[16] = {0};
        memcpy(tmp, mrow + c, (size_t)(len - c >= W ? W : len - c));
        __m256i zero = _mm256_cmpeq_epi64(_mm256_cvtepu8_epi64(_mm_loadu_si128((const __m128i *)tmp)),
                                          _mm256_setzero_si256());
        k = _mm256_andnot_si256(zero, k);
    }
    return k;
}

static inline __m256d load(const double *p, __m256i k) { return _mm256_maskload_pd(p, k); }
static inline __m256d and_mask(__m256d v, __m256i k) { return _mm256_and_pd(v, _mm256_castsi256_pd(k)); }

/* exp(x) on the lanes of k, 0 elsewhere and where x < QKV_EXP_FLUSH_F64 (NaN stays NaN). */
static inline __m256d exp_kept(__m256d x, __m256i k) {
    const __m256d flush = _mm256_set1_pd(QKV_EXP_FLUSH_F64);
    __m256d big = _mm256_cmp_pd(x, flush, _CMP_NLT_UQ);
    k = _mm256_and_si256(k, _mm256_castpd_si256(big));
    if (none(k)) return _mm256_setzero_pd();
    return and_mask(Sleef_expd4_u10avx2(_mm256_max_pd(flush, x)), k); /* max keeps a NaN x */
}

static inline double hsum(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline double hmax(__m256d v) {
    __m128d s = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_max_sd(s, _mm_unpackhi_pd(s, s)));
}

// m' = max(m, max_c s S[r,c]);  P = exp(s S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(double *s, const qkv_attn_tile_ *t, double scale, double *m, double *l, double *o,
                     int64_t d_v) {
    const __m256d vscale = _mm256_set1_pd(scale), ninf = _mm256_set1_pd(-INFINITY);
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        // tmax = max over kept c of s S[r,c] (a kept NaN makes it NaN)
        __m256d vmax = ninf, vnan = _mm256_setzero_pd();
        int64_t c = 0;
        if (!mrow) /* whole vectors of kept keys: plain loads */
            for (; c + W <= len; c += W) {
                __m256d x = _mm256_mul_pd(_mm256_loadu_pd(srow + c), vscale);
                vnan = _mm256_or_pd(vnan, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
                vmax = _mm256_max_pd(vmax, x);
            }
        for (; c < len; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256d x = _mm256_mul_pd(load(srow + c, k), vscale);
            x = _mm256_blendv_pd(ninf, x, _mm256_castsi256_pd(k));
            vnan = _mm256_or_pd(vnan, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
            vmax = _mm256_max_pd(vmax, x);
        }
        double tmax = _mm256_movemask_pd(vnan) ? NAN : hmax(vmax);
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            memset(srow, 0, (size_t)t->cols * sizeof *srow);
            continue;
        }
        double m_new = isnan(tmax) ? tmax : fmax(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        double alpha = m[r] == -INFINITY ? 0.0 : exp(m[r] - m_new);
        // P = exp(s S - m') over kept keys, 0 elsewhere;  sum = rowsum(P)
        const __m256d vm = _mm256_set1_pd(m_new);
        __m256d vsum = _mm256_setzero_pd();
        c = 0;
        if (!mrow) /* whole vectors of kept keys: plain loads and stores (AMD's masked stores are slow) */
            for (; c + W <= len; c += W) {
                __m256d p = exp_kept(_mm256_sub_pd(_mm256_mul_pd(_mm256_loadu_pd(srow + c), vscale), vm),
                                     _mm256_set1_epi64x(-1));
                _mm256_storeu_pd(srow + c, p);
                vsum = _mm256_add_pd(vsum, p);
            }
        for (; c < len; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256i in = below(c, t->cols);
            __m256d p = exp_kept(_mm256_sub_pd(_mm256_mul_pd(load(srow + c, k), vscale), vm), k);
            _mm256_maskstore_pd(srow + c, in, p);
            vsum = _mm256_add_pd(vsum, p);
        }
        for (; c < t->cols; c++) srow[c] = 0.0; /* past the causal end of the row */
        l[r] = l[r] * alpha + hsum(vsum);
        m[r] = m_new;
        if (alpha != 1.0) {
            const __m256d va = _mm256_set1_pd(alpha);
            double *orow = o + r * d_v;
            int64_t e = 0;
            for (; e + W <= d_v; e += W) _mm256_storeu_pd(orow + e, _mm256_mul_pd(_mm256_loadu_pd(orow + e), va));
            for (; e < d_v; e++) orow[e] *= alpha;
        }
    }
}

// P = exp(s S - L) over kept keys, 0 elsewhere
static void bwd_p(double *s, const qkv_attn_tile_ *t, double scale, const double *lse) {
    const __m256d vscale = _mm256_set1_pd(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        const __m256d vl = _mm256_set1_pd(lse[r]);
        int64_t c = 0;
        if (!mrow) /* whole vectors of kept keys: plain loads and stores (AMD's masked stores are slow) */
            for (; c + W <= len; c += W) {
                __m256d p = exp_kept(_mm256_sub_pd(_mm256_mul_pd(_mm256_loadu_pd(srow + c), vscale), vl),
                                     _mm256_set1_epi64x(-1));
                _mm256_storeu_pd(srow + c, p);
            }
        for (; c < len; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256d p = exp_kept(_mm256_sub_pd(_mm256_mul_pd(load(srow + c, k), vscale), vl), k);
            _mm256_maskstore_pd(srow + c, below(c, t->cols), p);
        }
        for (; c < t->cols; c++) srow[c] = 0.0;
    }
}

// dS = s P (dP - D), 0 where P = 0
static void bwd_ds(const double *p, const double *dp, const qkv_attn_tile_ *t, double scale, const double *dsum,
                   double *ds) {
    const __m256d vscale = _mm256_set1_pd(scale), zero = _mm256_setzero_pd();
    for (int64_t r = 0; r < t->rows; r++) {
        const __m256d vd = _mm256_set1_pd(dsum[r]);
        const double *prow = p + r * t->cols, *dprow = dp + r * t->cols;
        double *dsrow = ds + r * t->cols;
        int64_t c = 0;
        /* whole vectors: plain loads and stores; a dP read where P = 0 is masked out of the result by nz */
        for (; c + W <= t->cols; c += W) {
            __m256d pv = _mm256_loadu_pd(prow + c);
            __m256d nz = _mm256_cmp_pd(pv, zero, _CMP_NEQ_UQ);
            __m256d v = _mm256_mul_pd(_mm256_mul_pd(vscale, pv), _mm256_sub_pd(_mm256_loadu_pd(dprow + c), vd));
            _mm256_storeu_pd(dsrow + c, _mm256_and_pd(v, nz));
        }
        for (; c < t->cols; c += W) {
            __m256i in = below(c, t->cols);
            __m256d pv = load(prow + c, in);
            __m256d nz = _mm256_cmp_pd(pv, zero, _CMP_NEQ_UQ); /* P != 0 (a NaN P too, as in C) */
            __m256d dpv = _mm256_maskload_pd(dprow + c, _mm256_and_si256(in, _mm256_castpd_si256(nz)));
            __m256d v = _mm256_mul_pd(_mm256_mul_pd(vscale, pv), _mm256_sub_pd(dpv, vd));
            _mm256_maskstore_pd(dsrow + c, in, _mm256_and_pd(v, nz));
        }
    }
}

const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx2_ = {"avx2 (sleef)", true, fwd_tile, bwd_p, bwd_ds};

#else /* not compiled for AVX2+FMA with SLEEF: ops/attention.c keeps its plain C kernels */

const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx2_ = {"avx2 (not compiled)", false, NULL, NULL, NULL};

#endif
