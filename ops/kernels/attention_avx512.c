/*
 * attention_avx512.c — the f32 softmax and fused-attention row kernels on AVX-512F, 16 lanes, with SLEEF's
 * Sleef_expf16_u10avx512f (1-ulp exp). Compiled with -mavx512f; without SLEEF or the flag it compiles to
 * an entry point that reports itself unavailable. Shapes, the keep rule and the subnormal policy: attention_kernels.h.
 *
 * Every row is walked in vectors of 16 keys; a vector's kept lanes form a __mmask16 (below the row's
 * causal length, and with a nonzero mask byte), loads are masked (a dropped score is never read) and so
 * are the results (a dropped key gives exactly 0). Tails are the same masks.
 */
#include "attention_kernels.h"

#if defined(__AVX512F__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#define W 16

/* Lanes c .. c+15 of [0, n). */
static inline __mmask16 below(int64_t c, int64_t n) {
    int64_t left = n - c;
    return left >= W ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* Kept lanes c .. c+15 of a row: below len, and with a nonzero mask byte (bytes past len are not read). */
static inline __mmask16 keep_lanes(int64_t c, int64_t len, const uint8_t *mrow) {
    __mmask16 k = below(c, len);
    if (mrow && k) {
        __m128i bytes;
        if (len - c >= W) {
            bytes = _mm_loadu_si128((const __m128i *)(mrow + c));
        } else {
            uint8_t tmp[W] = {0};
            memcpy(tmp, mrow + c, (size_t)(len - c));
            bytes = _mm_loadu_si128((const __m128i *)tmp);
        }
        k &= _mm512_cmpneq_epi32_mask(_mm512_cvtepu8_epi32(bytes), _mm512_setzero_si512());
    }
    return k;
}

/* exp(x) on the lanes of k, 0 elsewhere and where x < QKV_EXP_FLUSH_F32 (NaN stays NaN). The argument is
 * clamped to the flush point before the call: SLEEF's exp is about 2x slower on lanes whose result is
 * subnormal, even ones thrown away. A vector with no lane left (saturated rows) skips the exp altogether. */
static inline __m512 exp_kept(__m512 x, __mmask16 k) {
    const __m512 flush = _mm512_set1_ps(QKV_EXP_FLUSH_F32);
    k &= _mm512_cmp_ps_mask(x, flush, _CMP_NLT_UQ);
    if (!k) return _mm512_setzero_ps();
    return _mm512_maskz_mov_ps(k, Sleef_expf16_u10avx512f(_mm512_max_ps(flush, x))); /* max keeps a NaN x */
}

static inline float exp_flushed(float x) { return x < QKV_EXP_FLUSH_F32 ? 0.0f : expf(x); }

// a[j] = exp(s[j] - m) / sum_{kept l} exp(s[l] - m),  m = max_{kept l} s[l];  0 where dropped
static void softmax_row(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    bool any = false;
    for (int64_t c = 0; c < len; c += W) {
        __mmask16 k = keep_lanes(c, len, mrow);
        any |= k != 0;
        vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, s + c));
    }
    if (!any) {
        for (int64_t c = 0; c < n; c += W) _mm512_mask_storeu_ps(a + c, below(c, n), _mm512_setzero_ps());
        return;
    }
    __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512d total_lo = _mm512_setzero_pd(), total_hi = _mm512_setzero_pd();
    for (int64_t c = 0; c < n; c += W) {
        __mmask16 k = keep_lanes(c, len, mrow);
        __m512 p = exp_kept(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + c), vm), k);
        _mm512_mask_storeu_ps(a + c, below(c, n), p);
        total_lo = _mm512_add_pd(total_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
        __m256 p_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
        total_hi = _mm512_add_pd(total_hi, _mm512_cvtps_pd(p_hi));
    }
    float total = (float)_mm512_reduce_add_pd(_mm512_add_pd(total_lo, total_hi));
    __m512 vt = _mm512_set1_ps(total), vmin = _mm512_set1_ps(FLT_MIN * total);
    for (int64_t c = 0; c < n; c += W) { /* a = p / total, exactly 0 where that would be subnormal */
        __mmask16 t = below(c, n);
        __m512 p = _mm512_maskz_loadu_ps(t, a + c);
        __mmask16 normal = _mm512_cmp_ps_mask(p, vmin, _CMP_NLT_UQ) & t;
        _mm512_mask_storeu_ps(a + c, t, _mm512_maskz_div_ps(normal, p, vt));
    }
}

// m' = max(m, max_c scale S[r,c]);  P = exp(scale S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o, int64_t ldo,
                     int64_t d_v) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0; /* max_ps drops NaNs; a kept NaN score must make the row NaN */
        for (int64_t c = 0; c < len; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & k;
            vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
        }
        float tmax = nan ? NAN : _mm512_reduce_max_ps(vmax);
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            for (int64_t c = 0; c < t->cols; c += W)
                _mm512_mask_storeu_ps(srow + c, below(c, t->cols), _mm512_setzero_ps());
            continue;
        }
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = m[r] == -INFINITY ? 0.0f : exp_flushed(m[r] - m_new);
        __m512 vm = _mm512_set1_ps(m_new), vsum = _mm512_setzero_ps();
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            __m512 p = exp_kept(_mm512_sub_ps(x, vm), k);
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), p);
            vsum = _mm512_add_ps(vsum, p);
        }
        l[r] = l[r] * alpha + _mm512_reduce_add_ps(vsum);
        m[r] = m_new;
        if (alpha != 1.0f) {
            __m512 va = _mm512_set1_ps(alpha);
            float *orow = o + r * ldo;
            for (int64_t c = 0; c < d_v; c += W) {
                __mmask16 tl = below(c, d_v);
                _mm512_mask_storeu_ps(orow + c, tl, _mm512_mul_ps(_mm512_maskz_loadu_ps(tl, orow + c), va));
            }
        }
    }
}

// P = exp(scale S - lse) over kept keys, 0 elsewhere
static void bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *lse) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        __m512 vl = _mm512_set1_ps(lse[r]);
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), exp_kept(_mm512_sub_ps(x, vl), k));
        }
    }
}

// dS = scale * P * (dP - dsum), 0 where P = 0
static void bwd_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                   float *ds) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        __m512 vd = _mm512_set1_ps(dsum[r]);
        int64_t row = r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 tl = below(c, t->cols);
            __m512 vp = _mm512_maskz_loadu_ps(tl, p + row + c);
            __mmask16 nz = _mm512_cmp_ps_mask(vp, _mm512_setzero_ps(), _CMP_NEQ_UQ) & tl;
            __m512 vdp = _mm512_maskz_loadu_ps(nz, dp + row + c);
            __m512 v = _mm512_maskz_mul_ps(nz, _mm512_mul_ps(vscale, vp), _mm512_sub_ps(vdp, vd));
            _mm512_mask_storeu_ps(ds + row + c, tl, v);
        }
    }
}

const qkv_attn_kernel_set_ qkv_attn_kernels_avx512_ = {
    .name = "avx512",
    .available = true,
    .softmax_row = softmax_row,
    .fwd_tile = fwd_tile,
    .bwd_p = bwd_p,
    .bwd_ds = bwd_ds,
};

#else

const qkv_attn_kernel_set_ qkv_attn_kernels_avx512_ = {.name = "avx512", .available = false};

#endif
