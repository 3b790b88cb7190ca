/*
 * attention_f64_avx512.c — the f64 row kernels of the fused attention with AVX-512F and SLEEF's
 * Sleef_expd8_u10avx512f (1-ulp exp), 8 keys a vector (attention_f64_kernels.h): attention_f64_avx2.c's
 * steps on twice the lanes, with AVX-512's lane masks where AVX2 has masked loads and stores (which are slow
 * on AMD cores under AVX2, not under AVX-512). Compiled with -mavx512f -mavx2 -mfma; without SLEEF or the
 * flags it compiles to a set marked unavailable.
 *
 * Keys past the tile and dropped keys are never loaded (masked loads) and get P = 0. Sums over a row run
 * in 8 lanes, added across at the end: a fixed order, so the bits depend only on the tile (and may differ
 * in the last place from the AVX2 set's 4-lane sums).
 */
#include "attention_f64_kernels.h"

/* QKV_EMULATE_AVX512: the test-only build through SIMDe (tests/avx512_emulation.h), no -mavx512f */
#if (defined(__AVX512F__) || defined(QKV_EMULATE_AVX512)) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#define W 8

/* Lanes c .. c+7 of [0, n). */
static inline __mmask8 below(int64_t c, int64_t n) {
    int64_t left = n - c;
    return left >= W ? (__mmask8)0xFF : left <= 0 ? (__mmask8)0 : (__mmask8)((1u << left) - 1u);
}

/* Kept lanes c .. c+7 of a row: below len, and with a nonzero mask byte (bytes past len are not read). */
static inline __mmask8 keep_lanes(int64_t c, int64_t len, const uint8_t *mrow) {
    __mmask8 k = below(c, len);
    if (mrow && k) {
        uint8_t tmp[16] = {0};
        memcpy(tmp, mrow + c, (size_t)(len - c >= W ? W : len - c));
        __m512i bytes = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)tmp));
        k &= _mm512_test_epi64_mask(bytes, bytes);
    }
    return k;
}

/* exp(x) on the lanes of k, 0 elsewhere and where x < QKV_EXP_FLUSH_F64 (NaN stays NaN). */
static inline __m512d exp_kept(__m512d x, __mmask8 k) {
    const __m512d flush = _mm512_set1_pd(QKV_EXP_FLUSH_F64);
    k &= _mm512_cmp_pd_mask(x, flush, _CMP_NLT_UQ);
    if (!k) return _mm512_setzero_pd();
    return _mm512_maskz_mov_pd(k, Sleef_expd8_u10avx512f(_mm512_max_pd(flush, x))); /* max keeps a NaN x */
}

// m' = max(m, max_c s S[r,c]);  P = exp(s S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(double *s, const qkv_attn_tile_ *t, double scale, double *m, double *l, double *o,
                     int64_t d_v) {
    const __m512d vscale = _mm512_set1_pd(scale), ninf = _mm512_set1_pd(-INFINITY);
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        // tmax = max over kept c of s S[r,c] (a kept NaN makes it NaN)
        __m512d vmax = ninf;
        __mmask8 nan = 0;
        int64_t c = 0;
        if (!mrow) /* whole vectors of kept keys: plain loads */
            for (; c + W <= len; c += W) {
                __m512d x = _mm512_mul_pd(_mm512_loadu_pd(srow + c), vscale);
                nan |= _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
                vmax = _mm512_max_pd(vmax, x);
            }
        for (; c < len; c += W) {
            __mmask8 k = keep_lanes(c, len, mrow);
            __m512d x = _mm512_mask_mov_pd(ninf, k, _mm512_mul_pd(_mm512_maskz_loadu_pd(k, srow + c), vscale));
            nan |= _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
            vmax = _mm512_max_pd(vmax, x);
        }
        double tmax = nan ? NAN : _mm512_reduce_max_pd(vmax);
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            memset(srow, 0, (size_t)t->cols * sizeof *srow);
            continue;
        }
        double m_new = isnan(tmax) ? tmax : fmax(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        double alpha = m[r] == -INFINITY ? 0.0 : exp(m[r] - m_new);
        // P = exp(s S - m') over kept keys, 0 elsewhere;  sum = rowsum(P)
        const __m512d vm = _mm512_set1_pd(m_new);
        __m512d vsum = _mm512_setzero_pd();
        c = 0;
        if (!mrow)
            for (; c + W <= len; c += W) {
                __m512d p = exp_kept(_mm512_sub_pd(_mm512_mul_pd(_mm512_loadu_pd(srow + c), vscale), vm), 0xFF);
                _mm512_storeu_pd(srow + c, p);
                vsum = _mm512_add_pd(vsum, p);
            }
        for (; c < len; c += W) {
            __mmask8 k = keep_lanes(c, len, mrow);
            __m512d p = exp_kept(_mm512_sub_pd(_mm512_mul_pd(_mm512_maskz_loadu_pd(k, srow + c), vscale), vm), k);
            _mm512_mask_storeu_pd(srow + c, below(c, t->cols), p);
            vsum = _mm512_add_pd(vsum, p);
        }
        for (; c < t->cols; c++) srow[c] = 0.0; /* past the causal end of the row */
        l[r] = l[r] * alpha + _mm512_reduce_add_pd(vsum);
        m[r] = m_new;
        if (alpha != 1.0) {
            const __m512d va = _mm512_set1_pd(alpha);
            double *orow = o + r * d_v;
            for (int64_t e = 0; e < d_v; e += W) {
                __mmask8 k = below(e, d_v);
                _mm512_mask_storeu_pd(orow + e, k, _mm512_mul_pd(_mm512_maskz_loadu_pd(k, orow + e), va));
            }
        }
    }
}

// P = exp(s S - L) over kept keys, 0 elsewhere
static void bwd_p(double *s, const qkv_attn_tile_ *t, double scale, const double *lse) {
    const __m512d vscale = _mm512_set1_pd(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        const __m512d vl = _mm512_set1_pd(lse[r]);
        int64_t c = 0;
        if (!mrow)
            for (; c + W <= len; c += W)
                _mm512_storeu_pd(srow + c,
                                 exp_kept(_mm512_sub_pd(_mm512_mul_pd(_mm512_loadu_pd(srow + c), vscale), vl), 0xFF));
        for (; c < len; c += W) {
            __mmask8 k = keep_lanes(c, len, mrow);
            __m512d p = exp_kept(_mm512_sub_pd(_mm512_mul_pd(_mm512_maskz_loadu_pd(k, srow + c), vscale), vl), k);
            _mm512_mask_storeu_pd(srow + c, below(c, t->cols), p);
        }
        for (; c < t->cols; c++) srow[c] = 0.0;
    }
}

// dS = s P (dP - D), 0 where P = 0
static void bwd_ds(const double *p, const double *dp, const qkv_attn_tile_ *t, double scale, const double *dsum,
                   double *ds) {
    const __m512d vscale = _mm512_set1_pd(scale), zero = _mm512_setzero_pd();
    for (int64_t r = 0; r < t->rows; r++) {
        const __m512d vd = _mm512_set1_pd(dsum[r]);
        const double *prow = p + r * t->cols, *dprow = dp + r * t->cols;
        double *dsrow = ds + r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask8 in = below(c, t->cols);
            __m512d pv = _mm512_maskz_loadu_pd(in, prow + c);
            __mmask8 nz = in & _mm512_cmp_pd_mask(pv, zero, _CMP_NEQ_UQ); /* P != 0 (a NaN P too, as in C) */
            __m512d dpv = _mm512_maskz_loadu_pd(nz, dprow + c);
            __m512d v = _mm512_mul_pd(_mm512_mul_pd(vscale, pv), _mm512_sub_pd(dpv, vd));
            _mm512_mask_storeu_pd(dsrow + c, in, _mm512_maskz_mov_pd(nz, v));
        }
    }
}

const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx512_ = {"avx512 (sleef)", true, fwd_tile, bwd_p, bwd_ds};

#else /* not compiled for AVX-512F with SLEEF: the AVX2 set or ops/attention.c's plain C kernels serve */

const qkv_attn_f64_kernels_ qkv_attn_f64_kernels_avx512_ = {"avx512 (not compiled)", false, NULL, NULL, NULL};

#endif
