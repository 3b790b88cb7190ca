/*
 * attention_avx2.c — the f32 softmax and fused-attention row kernels on AVX2+FMA, 8 lanes, with SLEEF's
 * Sleef_expf8_u10avx2 (1-ulp exp), inline with the same bits (expf_avx2.h). Compiled with -mavx2 -mfma; without SLEEF or the flags it compiles to
 * an entry point that reports itself unavailable. Shapes, the keep rule and the subnormal policy: attention_kernels.h.
 *
 * As in attention_avx512.c, a vector's kept lanes form a mask (here a vector of all-ones lanes), loads and
 * stores are masked (_mm256_maskload_ps never reads a masked lane), and a dropped key gives exactly 0.
 *
 * Short sequences (n_k <= 8, d_k and d_v <= 16, no mask): short_fwd / short_bwd as in attention_avx512.c,
 * keys along the 8 lanes, rows of d_k or d_v in two 8-lane halves, one query per vector. From 9 to 64 keys
 * (the same d_k, d_v): mid_fwd / mid_bwd, keys in up to 8 vectors, K^T and V^T in an L1 buffer. Against
 * the tiled path they skip the backward's second exp (A is kept) and the GEMM's B^T copies. Measured with
 * bench/attention --shape --cpu against the tiled path's build, 5 interleaved runs each, on a 2-core AVX2
 * EPYC shared with other builds (load 18-21, so only the ratios mean anything), median of the 5 ratios:
 * (B, n, d) = (1, 64, 16) 1.6x; causal (128, 32, 8) (the induction model's heads) 2.0x; causal
 * (128, 64, 16) (bench/model preset a) 1.6x. The cost: A is kept, n_k floats a query (preset a's step
 * arena 26.9 -> 30.7 MiB).
 */
#include "attention_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#include "avx2_transpose.h"
#include "expf_avx2.h"
#include "../row_sums.h"

#define W 8

/* Lanes c .. c+7 of [0, n), as all-ones lanes. */
static inline __m256i below(int64_t c, int64_t n) {
    int64_t left = n - c;
    int lanes = left >= W ? W : left <= 0 ? 0 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline bool none(__m256i k) { return _mm256_testz_si256(k, k); }

/* Kept lanes c .. c+7 of a row: below len, and with a nonzero mask byte (bytes past len are not read). */
static inline __m256i keep_lanes(int64_t c, int64_t len, const uint8_t *mrow) {
    __m256i k = below(c, len);
    if (mrow && !none(k)) {
        __m128i bytes;
        if (len - c >= W) {
            bytes = _mm_loadl_epi64((const __m128i *)(mrow + c));
        } else {
            uint8_t tmp[16] = {0};
            memcpy(tmp, mrow + c, (size_t)(len - c));
            bytes = _mm_loadu_si128((const __m128i *)tmp);
        }
        __m256i zero = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256());
        k = _mm256_andnot_si256(zero, k);
    }
    return k;
}

/* Every lane of k kept: then a plain load or store does what the masked one does. On Zen 3 a masked store
 * (vmaskmovps to memory) costs several times a plain one; perf put 42% of the softmax row kernel on its
 * two masked stores, so a whole vector of kept lanes takes the plain move (the same values either way). */
static inline bool all_kept(__m256i k) { return _mm256_movemask_ps(_mm256_castsi256_ps(k)) == 0xFF; }

static inline __m256 load(const float *p, __m256i k) {
    return all_kept(k) ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, k);
}

static inline void store(float *p, __m256i k, __m256 v) {
    if (all_kept(k)) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, k, v);
}
static inline __m256 and_mask(__m256 v, __m256i k) { return _mm256_and_ps(v, _mm256_castsi256_ps(k)); }

/* exp(x) on the lanes of k, 0 elsewhere and where x < QKV_EXP_FLUSH_F32 (NaN stays NaN). The argument is
 * clamped to the flush point before the call (SLEEF's exp is slow on subnormal results, even discarded). */
static inline __m256 exp_kept(__m256 x, __m256i k) {
    const __m256 flush = _mm256_set1_ps(QKV_EXP_FLUSH_F32);
    __m256 big = _mm256_cmp_ps(x, flush, _CMP_NLT_UQ);
    k = _mm256_and_si256(k, _mm256_castps_si256(big));
    if (none(k)) return _mm256_setzero_ps();
    return and_mask(qkv_expf8_avx2_(_mm256_max_ps(flush, x)), k); /* max keeps a NaN x */
}

static inline float exp_flushed(float x) { return x < QKV_EXP_FLUSH_F32 ? 0.0f : expf(x); }

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* max(vmax, x) on the lanes of k. */
static inline __m256 max_kept(__m256 vmax, __m256 x, __m256i k) {
    return _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, x), _mm256_castsi256_ps(k));
}

/* The end of a softmax row: total = the sum of the 8 double lanes, then a = p / total over the n entries,
 * exactly 0 where that would be subnormal. */
static void normalize_row(float *a, int64_t n, __m256d total_lo, __m256d total_hi) {
    __m256d t2 = _mm256_add_pd(total_lo, total_hi);
    __m128d t1 = _mm_add_pd(_mm256_castpd256_pd128(t2), _mm256_extractf128_pd(t2, 1));
    double total = _mm_cvtsd_f64(_mm_add_sd(t1, _mm_unpackhi_pd(t1, t1)));
    __m256 vt = _mm256_set1_ps((float)total), vmin = _mm256_set1_ps(FLT_MIN * (float)total);
    for (int64_t c = 0; c < n; c += W) {
        __m256i t = below(c, n);
        __m256 p = load(a + c, t);
        __m256 normal = _mm256_cmp_ps(p, vmin, _CMP_NLT_UQ);
        store(a + c, t, _mm256_and_ps(_mm256_div_ps(_mm256_and_ps(p, normal), vt), normal));
    }
}

/* softmax_row for a row with every key kept (no mask, len = n) and n a multiple of 8: the same operations
 * on the same lanes in the same order, without the keep masks (all ones here), so the same bits; the composed
 * attention's softmax at (1, 2048, 64) spent a third of its time making and testing them. */
static void softmax_row_whole(const float *s, float *a, int64_t n) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t c = 0; c < n; c += W) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + c));
    const __m256 vm = _mm256_set1_ps(hmax(vmax)), flush = _mm256_set1_ps(QKV_EXP_FLUSH_F32);
    __m256d total_lo = _mm256_setzero_pd(), total_hi = _mm256_setzero_pd();
    for (int64_t c = 0; c < n; c += W) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + c), vm);
        __m256 big = _mm256_cmp_ps(x, flush, _CMP_NLT_UQ); // exp_kept: 0 below the flush point, NaN kept
        __m256 p = _mm256_and_ps(qkv_expf8_avx2_(_mm256_max_ps(flush, x)), big);
        _mm256_storeu_ps(a + c, p);
        total_lo = _mm256_add_pd(total_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        total_hi = _mm256_add_pd(total_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    normalize_row(a, n, total_lo, total_hi);
}

// a[j] = exp(s[j] - m) / sum_{kept l} exp(s[l] - m),  m = max_{kept l} s[l];  0 where dropped
static void softmax_row(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len) {
    if (!mrow && len == n && n > 0 && n % W == 0) {
        softmax_row_whole(s, a, n);
        return;
    }
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    bool any = false;
    for (int64_t c = 0; c < len; c += W) {
        __m256i k = keep_lanes(c, len, mrow);
        any |= !none(k);
        vmax = max_kept(vmax, load(s + c, k), k);
    }
    if (!any) {
        for (int64_t c = 0; c < n; c += W) store(a + c, below(c, n), _mm256_setzero_ps());
        return;
    }
    __m256 vm = _mm256_set1_ps(hmax(vmax));
    __m256d total_lo = _mm256_setzero_pd(), total_hi = _mm256_setzero_pd();
    for (int64_t c = 0; c < n; c += W) {
        __m256i k = keep_lanes(c, len, mrow);
        __m256 p = exp_kept(_mm256_sub_ps(load(s + c, k), vm), k);
        store(a + c, below(c, n), p);
        total_lo = _mm256_add_pd(total_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        total_hi = _mm256_add_pd(total_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    normalize_row(a, n, total_lo, total_hi);
}

// m' = max(m, max_c scale S[r,c]);  P = exp(scale S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o, int64_t ldo,
                     int64_t d_v) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        __m256 nan = _mm256_setzero_ps(); /* max_ps drops NaNs; a kept NaN score must make the row NaN */
        for (int64_t c = 0; c < len; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 x = _mm256_mul_ps(load(srow + c, k), vscale);
            nan = _mm256_or_ps(nan, and_mask(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), k));
            vmax = max_kept(vmax, x, k);
        }
        float tmax = _mm256_movemask_ps(nan) ? NAN : hmax(vmax);
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            for (int64_t c = 0; c < t->cols; c += W) store(srow + c, below(c, t->cols), _mm256_setzero_ps());
            continue;
        }
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = m[r] == -INFINITY ? 0.0f : exp_flushed(m[r] - m_new);
        __m256 vm = _mm256_set1_ps(m_new), vsum = _mm256_setzero_ps();
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 x = _mm256_mul_ps(load(srow + c, k), vscale);
            __m256 p = exp_kept(_mm256_sub_ps(x, vm), k);
            store(srow + c, below(c, t->cols), p);
            vsum = _mm256_add_ps(vsum, p);
        }
        l[r] = l[r] * alpha + hsum(vsum);
        m[r] = m_new;
        if (alpha != 1.0f) {
            __m256 va = _mm256_set1_ps(alpha);
            float *orow = o + r * ldo;
            for (int64_t c = 0; c < d_v; c += W) {
                __m256i tl = below(c, d_v);
                store(orow + c, tl, _mm256_mul_ps(load(orow + c, tl), va));
            }
        }
    }
}

// P = exp(scale S - lse) over kept keys, 0 elsewhere
static void bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *lse) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        __m256 vl = _mm256_set1_ps(lse[r]);
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 x = _mm256_mul_ps(load(srow + c, k), vscale);
            store(srow + c, below(c, t->cols), exp_kept(_mm256_sub_ps(x, vl), k));
        }
    }
}

// dS = scale * P * (dP - dsum), 0 where P = 0
static void bwd_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                   float *ds) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        __m256 vd = _mm256_set1_ps(dsum[r]);
        int64_t row = r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i tl = below(c, t->cols);
            __m256 vp = load(p + row + c, tl);
            __m256i nz = _mm256_and_si256(
                tl, _mm256_castps_si256(_mm256_cmp_ps(vp, _mm256_setzero_ps(), _CMP_NEQ_UQ)));
            __m256 vdp = load(dp + row + c, nz);
            __m256 v = and_mask(_mm256_mul_ps(_mm256_mul_ps(vscale, vp), _mm256_sub_ps(vdp, vd)), nz);
            store(ds + row + c, tl, v);
        }
    }
}

/* ---- attention variants (include/qkv/attention.h), the portable set's maths on 8 lanes ---------------- */

// P = sigma(scale S + bias) = 1 / (1 + exp(-(scale S + bias))) over kept keys; 0 elsewhere and below FLT_MIN
static void sigmoid_p(float *s, const qkv_attn_tile_ *t, float scale, float bias) {
    const __m256 vscale = _mm256_set1_ps(scale), vb = _mm256_set1_ps(bias), one = _mm256_set1_ps(1.0f);
    const __m256 lo = _mm256_set1_ps(QKV_EXP_FLUSH_F32), hi = _mm256_set1_ps(-QKV_EXP_FLUSH_F32);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 y = _mm256_add_ps(_mm256_mul_ps(load(srow + c, k), vscale), vb);
            k = _mm256_and_si256(k, _mm256_castps_si256(_mm256_cmp_ps(y, lo, _CMP_NLT_UQ))); /* NaN stays */
            /* exp(-y) with -y clamped to [flush, -flush]: the result is never subnormal nor inf (min/max keep NaN) */
            __m256 e = qkv_expf8_avx2_(_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_sub_ps(_mm256_setzero_ps(), y))));
            store(srow + c, below(c, t->cols), and_mask(_mm256_div_ps(one, _mm256_add_ps(one, e)), k));
        }
    }
}

// dS = scale P (1 - P) dP, 0 where P = 0
static void sigmoid_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, float *ds) {
    const __m256 vscale = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
    int64_t n = t->rows * t->cols;
    for (int64_t c = 0; c < n; c += W) {
        __m256i tl = below(c, n);
        __m256 vp = load(p + c, tl);
        __m256i nz = _mm256_and_si256(tl, _mm256_castps_si256(_mm256_cmp_ps(vp, _mm256_setzero_ps(), _CMP_NEQ_UQ)));
        __m256 vdp = load(dp + c, nz);
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(vscale, vp), _mm256_sub_ps(one, vp)), vdp);
        store(ds + c, tl, and_mask(v, nz));
    }
}

// m' = max(m, max_c x);  e_c = exp(x - m') - exp(-m');  P = relu(e_c);  l' = exp(m - m') l + rowsum(|e_c|);
// O *= exp(m - m')
static void softpick_fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o,
                              int64_t ldo, int64_t d_v) {
    const __m256 vscale = _mm256_set1_ps(scale), sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m256 vmax = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
        for (int64_t c = 0; c < len; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 x = _mm256_mul_ps(load(srow + c, k), vscale);
            nan = _mm256_or_ps(nan, and_mask(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), k));
            vmax = max_kept(vmax, x, k);
        }
        float tmax = _mm256_movemask_ps(nan) ? NAN : hmax(vmax);
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = exp_flushed(m[r] - m_new), floor_e = exp_flushed(-m_new);
        __m256 vm = _mm256_set1_ps(m_new), vfloor = _mm256_set1_ps(floor_e), vsum = _mm256_setzero_ps();
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i k = keep_lanes(c, len, mrow);
            __m256 x = _mm256_mul_ps(load(srow + c, k), vscale);
            __m256 e = and_mask(_mm256_sub_ps(exp_kept(_mm256_sub_ps(x, vm), k), vfloor), k);
            store(srow + c, below(c, t->cols), _mm256_max_ps(e, _mm256_setzero_ps()));
            vsum = _mm256_add_ps(vsum, _mm256_andnot_ps(sign, e));
        }
        l[r] = l[r] * alpha + hsum(vsum);
        m[r] = m_new;
        if (alpha != 1.0f) {
            __m256 va = _mm256_set1_ps(alpha);
            float *orow = o + r * ldo;
            for (int64_t c = 0; c < d_v; c += W) {
                __m256i tl = below(c, d_v);
                store(orow + c, tl, _mm256_mul_ps(load(orow + c, tl), va));
            }
        }
    }
}

// E = exp(x - m) inv;  P = relu(E - exp(-m) inv);  e = sign(x) E
static void softpick_bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *m, const float *inv,
                           float *e) {
    const __m256 vscale = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols, *erow = e + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m256 vm = _mm256_set1_ps(m[r]), vinv = _mm256_set1_ps(inv[r]);
        __m256 vfloor = _mm256_set1_ps(exp_flushed(-m[r]) * inv[r]);
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i k = keep_lanes(c, len, mrow), tl = below(c, t->cols);
            __m256 x = and_mask(_mm256_mul_ps(load(srow + c, k), vscale), k);
            __m256 big = _mm256_mul_ps(exp_kept(_mm256_sub_ps(x, vm), k), vinv);
            __m256 pos = _mm256_cmp_ps(x, zero, _CMP_GT_OQ), neg = _mm256_cmp_ps(x, zero, _CMP_LT_OQ);
            __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
            store(srow + c, tl, _mm256_and_ps(_mm256_sub_ps(big, vfloor), pos));
            __m256 signed_e = _mm256_or_ps(_mm256_and_ps(big, pos), _mm256_and_ps(_mm256_sub_ps(zero, big), neg));
            store(erow + c, tl, _mm256_or_ps(signed_e, _mm256_and_ps(x, nan)));
        }
    }
}

// dS = scale (e > 0 ? e (dP - D) : -e D)
static void softpick_ds(const float *e, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                        float *ds) {
    const __m256 vscale = _mm256_set1_ps(scale), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < t->rows; r++) {
        __m256 vd = _mm256_set1_ps(dsum[r]);
        int64_t row = r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __m256i tl = below(c, t->cols);
            __m256 ve = load(e + row + c, tl);
            __m256 pos = _mm256_cmp_ps(ve, zero, _CMP_GT_OQ);
            __m256i nz = _mm256_and_si256(tl, _mm256_castps_si256(_mm256_cmp_ps(ve, zero, _CMP_NEQ_UQ)));
            __m256 vdp = load(dp + row + c, nz);
            __m256 a = _mm256_mul_ps(_mm256_mul_ps(vscale, ve), _mm256_sub_ps(vdp, vd));
            __m256 b = _mm256_mul_ps(_mm256_mul_ps(vscale, _mm256_sub_ps(zero, ve)), vd);
            store(ds + row + c, tl, and_mask(_mm256_blendv_ps(b, a, pos), nz));
        }
    }
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- few-row products: a query block of 1 .. QKV_ATTN_FEW_ROWS rows (decoding), nothing packed ---------- */

/* Lanes [l, l + 8) of a row of k floats: whole, or under a mask at the tail. */
static inline __m256 load_part(const float *p, int64_t l, int64_t k) {
    return k - l >= W ? _mm256_loadu_ps(p + l) : load(p + l, below(l, k));
}

/* The 4 sums of the lanes of s0 .. s3, as one 4-float vector {sum s0, sum s1, sum s2, sum s3}. */
static inline __m128 hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* C[r, j .. j+4) and C[r+1, j .. j+4) = A_r . B_j.. and A_{r+1} . B_j..: 8 sums, 6 loads per 8 FMAs. */
static inline void dot_2x4(const float *a0, const float *a1, const float *b, float *c0, float *c1, int64_t k) {
    const float *b0 = b, *b1 = b0 + k, *b2 = b1 + k, *b3 = b2 + k;
    __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00;
    for (int64_t l = 0; l < k; l += W) {
        __m256 x0 = load_part(a0, l, k), x1 = load_part(a1, l, k), y;
        y = load_part(b0, l, k), s00 = _mm256_fmadd_ps(x0, y, s00), s10 = _mm256_fmadd_ps(x1, y, s10);
        y = load_part(b1, l, k), s01 = _mm256_fmadd_ps(x0, y, s01), s11 = _mm256_fmadd_ps(x1, y, s11);
        y = load_part(b2, l, k), s02 = _mm256_fmadd_ps(x0, y, s02), s12 = _mm256_fmadd_ps(x1, y, s12);
        y = load_part(b3, l, k), s03 = _mm256_fmadd_ps(x0, y, s03), s13 = _mm256_fmadd_ps(x1, y, s13);
    }
    _mm_storeu_ps(c0, hsum4(s00, s01, s02, s03));
    _mm_storeu_ps(c1, hsum4(s10, s11, s12, s13));
}

// C[r, j] = A_r . B_j  (A [m, k], B [n, k], C [m, n]): two rows by four keys at a time, in registers; each
// sum in the same order whichever rows and keys share its step (the same bits for any m)
static void rows_dot(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n) {
    int64_t r = 0;
    for (; r + 2 <= m; r += 2) {
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) dot_2x4(a + r * k, a + (r + 1) * k, b + j * k, c + r * n + j, c + (r + 1) * n + j, k);
        for (; j < n; j++)
            for (int64_t i = r; i < r + 2; i++) {
                __m256 s0 = _mm256_setzero_ps();
                for (int64_t l = 0; l < k; l += W) s0 = _mm256_fmadd_ps(load_part(a + i * k, l, k), load_part(b + j * k, l, k), s0);
                c[i * n + j] = hsum(s0);
            }
    }
    for (; r < m; r++) {
        const float *ar = a + r * k;
        float *cr = c + r * n;
        int64_t j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *b0 = b + j * k, *b1 = b0 + k, *b2 = b1 + k, *b3 = b2 + k;
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t l = 0; l < k; l += W) {
                __m256 x = load_part(ar, l, k);
                s0 = _mm256_fmadd_ps(x, load_part(b0, l, k), s0);
                s1 = _mm256_fmadd_ps(x, load_part(b1, l, k), s1);
                s2 = _mm256_fmadd_ps(x, load_part(b2, l, k), s2);
                s3 = _mm256_fmadd_ps(x, load_part(b3, l, k), s3);
            }
            _mm_storeu_ps(cr + j, hsum4(s0, s1, s2, s3));
        }
        for (; j < n; j++) {
            __m256 s0 = _mm256_setzero_ps();
            for (int64_t l = 0; l < k; l += W) s0 = _mm256_fmadd_ps(load_part(ar, l, k), load_part(b + j * k, l, k), s0);
            cr[j] = hsum(s0);
        }
    }
}

/* c[0:k] (+)= the sum over j < n of x[j * xs] * b[j * k .. j * k + k), 64 columns at a time in registers. */
static inline void axpy_sum(const float *x, int64_t xs, const float *b, float *c, int64_t n, int64_t k) {
    for (int64_t l0 = 0; l0 < k; l0 += 8 * W) {
        int64_t nv = (min64(8 * W, k - l0) + W - 1) / W; /* vectors in this chunk, 1 .. 8 */
        __m256 acc[8];
        for (int v = 0; v < 8; v++) acc[v] = v < nv ? load_part(c, l0 + v * W, k) : _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            __m256 xj = _mm256_set1_ps(x[j * xs]);
            const float *bj = b + j * k;
            for (int v = 0; v < 8; v++)
                if (v < nv) acc[v] = _mm256_fmadd_ps(xj, load_part(bj, l0 + v * W, k), acc[v]);
        }
        for (int v = 0; v < nv; v++) {
            int64_t l = l0 + v * W;
            if (k - l >= W) _mm256_storeu_ps(c + l, acc[v]);
            else store(c + l, below(l, k), acc[v]);
        }
    }
}

// C_r += sum_j A[r, j] B_j  (A [m, n], B [n, k], C [m, k])
static void rows_axpy(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t r = 0; r < m; r++) axpy_sum(a + r * n, 1, b, c + r * k, n, k);
}

// C_j += sum_r A[r, j] X_r  (A [m, n], X [m, k], C [n, k]): C = A^T X, row j of C from column j of A
static void outer_add(const float *a, const float *x, float *c, int64_t m, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n; j++) axpy_sum(a + j, n, x, c + j * k, m, k);
}

/* ---- short sequences: one batch element, keys along the 8 lanes (n_k <= 8; d_k, d_v <= 16) ---------- */

/* A row of d <= 16 floats as two 8-lane halves (the second 0 when d <= 8, and then never addressed). */
typedef struct row16 {
    __m256 h[2];
} row16;

static inline row16 load_row(const float *p, int64_t d) {
    row16 r = {{load(p, below(0, d)), _mm256_setzero_ps()}};
    if (d > W) r.h[1] = load(p + W, below(W, d));
    return r;
}

/* p[0:min(d, 8)] = v: whole when d >= 8, else under a mask (a masked store that a masked load later
 * overlaps is not forwarded, and the load waits for it to reach the cache) */
static inline void put8(float *p, int64_t d, __m256 v) {
    if (d >= W) _mm256_storeu_ps(p, v);
    else store(p, below(0, d), v);
}

/* p[0:d] += r (full halves stored whole, the rest under masks) */
static inline void add_row(float *p, int64_t d, row16 r) {
    for (int h = 0; h < 2 && h * W < d; h++) {
        float *q = p + h * W;
        if (d - h * W >= W) _mm256_storeu_ps(q, _mm256_add_ps(_mm256_loadu_ps(q), r.h[h]));
        else store(q, below(h * W, d), _mm256_add_ps(load(q, below(h * W, d)), r.h[h]));
    }
}

/* t[l] lane c = x[c*d + l] for c < n, l < d (every other lane and vector 0): x [n <= 8, d <= 16] transposed */
static inline void transposed(const float *x, int64_t n, int64_t d, __m256 t[2 * W]) {
    for (int h = 0; h < 2; h++) {
        __m256 r[W];
        for (int c = 0; c < W; c++) /* rows past n, and a second half past d: zeros, nothing addressed */
            r[c] = c < n && h * W < d ? load(x + c * d + h * W, below(h * W, d)) : _mm256_setzero_ps();
        qkv_transpose8_avx2_(r);
        for (int l = 0; l < W; l++) t[h * W + l] = r[l];
    }
}

// s[c] = a . x_c for every key c at once: d FMAs against X^T, in four independent chains
static inline __m256 dot_keys(const float *a, const __m256 xt[2 * W], int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t l = 0;
    for (; l + 4 <= d; l += 4) {
        s0 = _mm256_fmadd_ps(_mm256_set1_ps(a[l]), xt[l], s0);
        s1 = _mm256_fmadd_ps(_mm256_set1_ps(a[l + 1]), xt[l + 1], s1);
        s2 = _mm256_fmadd_ps(_mm256_set1_ps(a[l + 2]), xt[l + 2], s2);
        s3 = _mm256_fmadd_ps(_mm256_set1_ps(a[l + 3]), xt[l + 3], s3);
    }
    for (; l < d; l++) s0 = _mm256_fmadd_ps(_mm256_set1_ps(a[l]), xt[l], s0);
    return _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
}

/* Lane c of x in every lane. */
static inline __m256 lane(__m256 x, int64_t c) { return _mm256_permutevar8x32_ps(x, _mm256_set1_epi32((int)c)); }

// per query r:  x = s q_r K^T,  m = max kept x,  P = exp(x - m),  l = rowsum(P),  O_r = P V / l,  A_r = P / l
static void short_fwd(const float *q, const float *k, const float *v, float *out, float *a, int64_t n_q,
                      int64_t n_k, int64_t d_k, int64_t d_v, float scale, bool causal) {
    __m256 kt[2 * W];
    transposed(k, n_k, d_k, kt); // K^T [d_k, n_k]
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < n_q; r++) {
        int64_t n_kept = causal ? min64(n_k, r + 1) : n_k;
        __m256i kept = below(0, n_kept);
        __m256 x = _mm256_mul_ps(dot_keys(q + r * d_k, kt, d_k), vscale);
        __m256i nan = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)), kept);
        float m = !none(nan) ? NAN : hmax(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(kept)));
        row16 o = {{_mm256_setzero_ps(), _mm256_setzero_ps()}};
        if (m == -INFINITY) { /* every kept score is -inf: O = 0, A = 0 (as the tiled path) */
            if (a) put8(a + r * n_k, n_k, _mm256_setzero_ps());
            for (int h = 0; h < 2 && h * W < d_v; h++) put8(out + r * d_v + h * W, d_v - h * W, o.h[h]);
            continue;
        }
        __m256 p = exp_kept(_mm256_sub_ps(x, _mm256_set1_ps(m)), kept);
        float l = hsum(p);
        for (int64_t c = 0; c < n_kept; c++) { // O_r += P[c] V_c
            row16 v_c = load_row(v + c * d_v, d_v);
            __m256 p_c = lane(p, c);
            o.h[0] = _mm256_fmadd_ps(p_c, v_c.h[0], o.h[0]);
            if (d_v > W) o.h[1] = _mm256_fmadd_ps(p_c, v_c.h[1], o.h[1]);
        }
        __m256 vl = _mm256_set1_ps(l);
        if (a) put8(a + r * n_k, n_k, _mm256_div_ps(p, vl));
        for (int h = 0; h < 2 && h * W < d_v; h++) put8(out + r * d_v + h * W, d_v - h * W, _mm256_div_ps(o.h[h], vl));
    }
}

// per query r, from the forward's A:  D = rowsum(dO_r * O_r),  dS = s A_r (dO_r V^T - D) (0 where A = 0),
// dV_c += A[r,c] dO_r,  dK_c += dS[c] q_r,  dQ_r += sum_c dS[c] k_c
static void short_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                      const float *a, float *dq, float *dk, float *dv, int64_t n_q, int64_t n_k, int64_t d_k,
                      int64_t d_v, float scale, bool causal) {
    __m256 vt[2 * W];
    row16 dk_acc[W], dv_acc[W];
    transposed(v, n_k, d_v, vt); // V^T [d_v, n_k]
    for (int64_t c = 0; c < n_k; c++)
        for (int h = 0; h < 2; h++) dk_acc[c].h[h] = dv_acc[c].h[h] = _mm256_setzero_ps();
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256i keys = below(0, n_k);
    for (int64_t r = 0; r < n_q; r++) {
        __m256 p = load(a + r * n_k, keys), dp = dot_keys(dout + r * d_v, vt, d_v);
        double d = dot8_f32(dout + r * d_v, out + r * d_v, d_v); // D = rowsum(dO * O), as the tiled path
        // dS = s A (dP - D), 0 where A = 0 (dropped keys, queries with no key)
        __m256 nz = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ);
        __m256 ds = _mm256_mul_ps(_mm256_mul_ps(vscale, p), _mm256_sub_ps(dp, _mm256_set1_ps((float)d)));
        ds = _mm256_and_ps(ds, nz);
        row16 q_r = load_row(q + r * d_k, d_k), do_r = load_row(dout + r * d_v, d_v);
        row16 dq_r = {{_mm256_setzero_ps(), _mm256_setzero_ps()}};
        int64_t n_kept = causal ? min64(n_k, r + 1) : n_k;
        for (int64_t c = 0; c < n_kept; c++) {
            __m256 p_c = lane(p, c), ds_c = lane(ds, c);
            row16 k_c = load_row(k + c * d_k, d_k);
            for (int h = 0; h < 2; h++) { /* the second halves only when d is past 8 */
                if (h * W < d_v) dv_acc[c].h[h] = _mm256_fmadd_ps(p_c, do_r.h[h], dv_acc[c].h[h]);
                if (h * W >= d_k) continue;
                dk_acc[c].h[h] = _mm256_fmadd_ps(ds_c, q_r.h[h], dk_acc[c].h[h]);
                dq_r.h[h] = _mm256_fmadd_ps(ds_c, k_c.h[h], dq_r.h[h]);
            }
        }
        if (dq) add_row(dq + r * d_k, d_k, dq_r);
    }
    for (int64_t c = 0; c < n_k; c++) {
        if (dk) add_row(dk + c * d_k, d_k, dk_acc[c]); // dK_c += sum_r dS[r,c] q_r
        if (dv) add_row(dv + c * d_v, d_v, dv_acc[c]); // dV_c += sum_r A[r,c] dO_r
    }
}

/* ---- short sequences of 9 .. 64 keys: keys along up to 8 vectors (d_k, d_v <= 16) ------------------------
 * The same algorithm as short_fwd / short_bwd with K^T and V^T in an L1 buffer of 8 key vectors a row
 * (64 keys) instead of registers. The backward keeps dS of up to 64 queries at a time and the dK and dV
 * sums of every key in buffers of its own, so that each query's row of dS is formed once. */

#define MID_KEYS (8 * W) /* keys of a transposed row; also the queries of a backward chunk */

/* The halves of a row of d <= 16 floats: how many, which are whole, the lanes of each. */
typedef struct halves {
    int n;
    bool full[2];
    __m256i m[2];
} halves;

static inline halves halves_of(int64_t d) {
    halves h = {d > W ? 2 : 1, {d >= W, d >= 2 * W}, {below(0, d), below(W, d)}};
    return h;
}

/* half i of a row: loaded whole, or under its mask at the tail (nothing past the row is read) */
static inline __m256 ld_half(const float *p, const halves *h, int i) {
    return h->full[i] ? _mm256_loadu_ps(p + i * W) : _mm256_maskload_ps(p + i * W, h->m[i]);
}

static inline void st_half(float *p, const halves *h, int i, __m256 v) {
    if (h->full[i]) _mm256_storeu_ps(p + i * W, v);
    else _mm256_maskstore_ps(p + i * W, h->m[i], v);
}

/* vector i (keys 8i .. 8i+7) of a row of n floats: whole, or masked at the tail */
static inline __m256 ld_keys(const float *p, int64_t i, int64_t n) {
    return (i + 1) * W <= n ? _mm256_loadu_ps(p + i * W) : load(p + i * W, below(i * W, n));
}

static inline void st_keys(float *p, int64_t i, int64_t n, __m256 v) {
    if ((i + 1) * W <= n) _mm256_storeu_ps(p + i * W, v);
    else store(p + i * W, below(i * W, n), v);
}

/* xt[l * MID_KEYS + c] = x[c * d + l] for c < n, l < 16 (0 past d, and for n <= c < 8 ceil(n / 8)):
 * x [n <= 64, d <= 16] transposed, 8 keys at a time */
static void transposed_mid(const float *x, int64_t n, int64_t d, float *xt) {
    for (int64_t c0 = 0; c0 < n; c0 += W) {
        __m256 t[2 * W];
        transposed(x + c0 * d, min64(W, n - c0), d, t);
        for (int64_t l = 0; l < d; l++) _mm256_store_ps(xt + l * MID_KEYS + c0, t[l]);
    }
}

/* x[i] = sum_l a[l] xt[l * MID_KEYS + 8i ..] for i < nv (a constant at each call: eight named accumulators,
 * those past nv never touched, so that nothing is zeroed or copied through memory) */
static inline __attribute__((always_inline)) void dot_vecs(const float *a, const float *xt, int64_t d, __m256 *x,
                                                           const int nv) {
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0, y4 = y0, y5 = y0, y6 = y0, y7 = y0;
    for (int64_t l = 0; l < d; l++) {
        __m256 al = _mm256_set1_ps(a[l]);
        const float *row = xt + l * MID_KEYS;
#define DOT_STEP(i) if (nv > i) y##i = _mm256_fmadd_ps(al, _mm256_load_ps(row + i * W), y##i);
        DOT_STEP(0) DOT_STEP(1) DOT_STEP(2) DOT_STEP(3) DOT_STEP(4) DOT_STEP(5) DOT_STEP(6) DOT_STEP(7)
#undef DOT_STEP
    }
#define DOT_OUT(i) if (nv > i) x[i] = y##i;
    DOT_OUT(0) DOT_OUT(1) DOT_OUT(2) DOT_OUT(3) DOT_OUT(4) DOT_OUT(5) DOT_OUT(6) DOT_OUT(7)
#undef DOT_OUT
}

/* dot_vecs for a run-time nv in 1 .. 8: one constant-nv copy each */
static void dot_keys_mid(const float *a, const float *xt, int64_t d, __m256 *x, int64_t nv) {
    switch (nv) {
    case 1: dot_vecs(a, xt, d, x, 1); break;
    case 2: dot_vecs(a, xt, d, x, 2); break;
    case 3: dot_vecs(a, xt, d, x, 3); break;
    case 4: dot_vecs(a, xt, d, x, 4); break;
    case 5: dot_vecs(a, xt, d, x, 5); break;
    case 6: dot_vecs(a, xt, d, x, 6); break;
    case 7: dot_vecs(a, xt, d, x, 7); break;
    default: dot_vecs(a, xt, d, x, 8); break;
    }
}

// per query r:  x = s q_r K^T (8 keys a vector),  m = max kept x,  P = exp(x - m),  l = rowsum(P),
// O_r = P V / l,  A_r = P / l
static inline __attribute__((always_inline)) void mid_fwd_body(const float *q, const float *k, const float *v,
                                                               float *out, float *a, int64_t n_q, int64_t n_k,
                                                               int64_t d_k, int64_t d_v, float scale, bool causal,
                                                               const bool v2) {
    _Alignas(32) float kt[2 * W * MID_KEYS], pr[MID_KEYS];
    transposed_mid(k, n_k, d_k, kt); // K^T [d_k, n_k]
    const halves hv = halves_of(d_v);
    const __m256 vscale = _mm256_set1_ps(scale);
    const int64_t nvk = (n_k + W - 1) / W; /* vectors of a row of A */
    for (int64_t r = 0; r < n_q; r++) {
        int64_t n_kept = causal ? min64(n_k, r + 1) : n_k, nv = (n_kept + W - 1) / W;
        const float *q_r = q + r * d_k;
        __m256 x[8];
        dot_keys_mid(q_r, kt, d_k, x, nv); // x = q_r K^T
        __m256 vmax = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++)
            if (i < nv) {
                __m256i kept = below(i * W, n_kept);
                x[i] = _mm256_mul_ps(x[i], vscale);
                nan = _mm256_or_ps(nan, and_mask(_mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q), kept));
                vmax = max_kept(vmax, x[i], kept);
            }
        float m = _mm256_movemask_ps(nan) ? NAN : hmax(vmax);
        float *a_r = a ? a + r * n_k : NULL, *o_r = out + r * d_v;
        if (m == -INFINITY) { /* every kept score is -inf: O = 0, A = 0 (as the tiled path) */
            if (a_r)
                for (int64_t i = 0; i < nvk; i++) st_keys(a_r, i, n_k, _mm256_setzero_ps());
            for (int h = 0; h < hv.n; h++) st_half(o_r, &hv, h, _mm256_setzero_ps());
            continue;
        }
        __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++)
            if (i < nv) {
                x[i] = exp_kept(_mm256_sub_ps(x[i], vm), below(i * W, n_kept));
                vsum = _mm256_add_ps(vsum, x[i]);
                _mm256_store_ps(pr + i * W, x[i]);
            }
        float l = hsum(vsum);
        // O_r = sum_c P[c] V_c, in four chains (keys c mod 4) per half, added at the end
        __m256 o0[4], o1[4];
        for (int j = 0; j < 4; j++) o0[j] = o1[j] = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 4 <= n_kept; c += 4)
            for (int j = 0; j < 4; j++) {
                const float *v_c = v + (c + j) * d_v;
                __m256 p_c = _mm256_broadcast_ss(pr + c + j);
                o0[j] = _mm256_fmadd_ps(p_c, ld_half(v_c, &hv, 0), o0[j]);
                if (v2) o1[j] = _mm256_fmadd_ps(p_c, ld_half(v_c, &hv, 1), o1[j]);
            }
        for (int j = 0; c < n_kept; c++, j++) {
            const float *v_c = v + c * d_v;
            __m256 p_c = _mm256_broadcast_ss(pr + c);
            o0[j] = _mm256_fmadd_ps(p_c, ld_half(v_c, &hv, 0), o0[j]);
            if (v2) o1[j] = _mm256_fmadd_ps(p_c, ld_half(v_c, &hv, 1), o1[j]);
        }
        __m256 vl = _mm256_set1_ps(l);
        if (a_r)
            for (int64_t i = 0; i < nvk; i++) st_keys(a_r, i, n_k, i < nv ? _mm256_div_ps(x[i], vl) : _mm256_setzero_ps());
        st_half(o_r, &hv, 0, _mm256_div_ps(_mm256_add_ps(_mm256_add_ps(o0[0], o0[1]), _mm256_add_ps(o0[2], o0[3])), vl));
        if (v2)
            st_half(o_r, &hv, 1, _mm256_div_ps(_mm256_add_ps(_mm256_add_ps(o1[0], o1[1]), _mm256_add_ps(o1[2], o1[3])), vl));
    }
}

/* The dK and dV sums of keys c0 .. c0+G-1 (G = 1, 2 or 4, a constant) over the chunk's queries r0 .. r1 that
 * keep them, into acc_k / acc_v (rows of 16 floats a key):  dK_c += dS[r, c] q_r,  dV_c += A[r, c] dO_r.
 * Causal: query r keeps key c when c <= r, so the queries c0 .. c0+G-2 keep only some of the G keys; a key a
 * query dropped gets nothing from it (not even 0 times a NaN query). */
static inline __attribute__((always_inline)) void mid_dkdv(const float *q, const float *dout, const float *a,
                                                           const float *ds, int64_t n_k, int64_t d_k, int64_t d_v,
                                                           int64_t r0, int64_t r1, int64_t c0, const int G,
                                                           bool causal, const halves *hk, const halves *hv,
                                                           float *acc_k, float *acc_v, const bool k2,
                                                           const bool v2) {
    __m256 kk[4][2], vv[4][2];
    for (int g = 0; g < G; g++)
        for (int h = 0; h < 2; h++) {
            kk[g][h] = _mm256_load_ps(acc_k + (c0 + g) * 2 * W + h * W);
            vv[g][h] = _mm256_load_ps(acc_v + (c0 + g) * 2 * W + h * W);
        }
    int64_t r = causal && c0 > r0 ? c0 : r0;
    for (; r < r1; r++) {
        bool all = !causal || r >= c0 + G - 1;
        if (all) break; /* the steady rows below, with no per-key test */
        const float *q_r = q + r * d_k, *do_r = dout + r * d_v, *ds_r = ds + (r - r0) * MID_KEYS + c0;
        const float *a_r = a + r * n_k + c0;
        __m256 q0 = ld_half(q_r, hk, 0), q1 = k2 ? ld_half(q_r, hk, 1) : q0;
        __m256 g0 = ld_half(do_r, hv, 0), g1 = v2 ? ld_half(do_r, hv, 1) : g0;
        for (int g = 0; g < G; g++) {
            if (!all && c0 + g > r) continue;
            __m256 sg = _mm256_broadcast_ss(ds_r + g), pg = _mm256_broadcast_ss(a_r + g);
            kk[g][0] = _mm256_fmadd_ps(sg, q0, kk[g][0]);
            if (k2) kk[g][1] = _mm256_fmadd_ps(sg, q1, kk[g][1]);
            vv[g][0] = _mm256_fmadd_ps(pg, g0, vv[g][0]);
            if (v2) vv[g][1] = _mm256_fmadd_ps(pg, g1, vv[g][1]);
        }
    }
    for (; r < r1; r++) { /* every query here keeps all G keys */
        const float *q_r = q + r * d_k, *do_r = dout + r * d_v, *ds_r = ds + (r - r0) * MID_KEYS + c0;
        const float *a_r = a + r * n_k + c0;
        __m256 q0 = ld_half(q_r, hk, 0), q1 = k2 ? ld_half(q_r, hk, 1) : q0;
        __m256 g0 = ld_half(do_r, hv, 0), g1 = v2 ? ld_half(do_r, hv, 1) : g0;
        for (int g = 0; g < G; g++) {
            __m256 sg = _mm256_broadcast_ss(ds_r + g), pg = _mm256_broadcast_ss(a_r + g);
            kk[g][0] = _mm256_fmadd_ps(sg, q0, kk[g][0]);
            if (k2) kk[g][1] = _mm256_fmadd_ps(sg, q1, kk[g][1]);
            vv[g][0] = _mm256_fmadd_ps(pg, g0, vv[g][0]);
            if (v2) vv[g][1] = _mm256_fmadd_ps(pg, g1, vv[g][1]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int h = 0; h < 2; h++) {
            _mm256_store_ps(acc_k + (c0 + g) * 2 * W + h * W, kk[g][h]);
            _mm256_store_ps(acc_v + (c0 + g) * 2 * W + h * W, vv[g][h]);
        }
}

// per query r, from the forward's A:  D = rowsum(dO_r * O_r),  dS = s A_r (dO_r V^T - D) (0 where A = 0),
// dQ_r += sum_c dS[c] k_c;  then per key c over the queries that keep it:  dK_c += sum_r dS[r,c] q_r,
// dV_c += sum_r A[r,c] dO_r  (queries in chunks of 64, whose dS rows stay in an L1 buffer)
static inline __attribute__((always_inline)) void mid_bwd_body(const float *q, const float *k, const float *v,
                                                               const float *out, const float *dout, const float *a,
                                                               float *dq, float *dk, float *dv, int64_t n_q,
                                                               int64_t n_k, int64_t d_k, int64_t d_v, float scale,
                                                               bool causal, const bool k2, const bool v2) {
    _Alignas(32) float vt[2 * W * MID_KEYS], ds[MID_KEYS * MID_KEYS];
    _Alignas(32) float acc_k[MID_KEYS * 2 * W], acc_v[MID_KEYS * 2 * W];
    transposed_mid(v, n_k, d_v, vt); // V^T [d_v, n_k]
    size_t acc_bytes = (size_t)n_k * 2 * W * sizeof(float);
    memset(acc_k, 0, acc_bytes);
    memset(acc_v, 0, acc_bytes);
    const halves hk = halves_of(d_k), hv = halves_of(d_v);
    const __m256 vscale = _mm256_set1_ps(scale);
    const int64_t nvk = (n_k + W - 1) / W;
    for (int64_t r0 = 0; r0 < n_q; r0 += MID_KEYS) {
        int64_t r1 = min64(n_q, r0 + MID_KEYS);
        for (int64_t r = r0; r < r1; r++) {
            int64_t n_kept = causal ? min64(n_k, r + 1) : n_k, nv = (n_kept + W - 1) / W;
            const float *do_r = dout + r * d_v, *a_r = a + r * n_k;
            float *ds_r = ds + (r - r0) * MID_KEYS;
            __m256 dp[8];
            dot_keys_mid(do_r, vt, d_v, dp, nv); // dP = dO_r V^T
            // D = rowsum(dO * O), as the tiled path;  dS = s A (dP - D), 0 where A = 0 (dropped keys)
            __m256 vd = _mm256_set1_ps((float)dot8_f32(do_r, out + r * d_v, d_v));
            for (int i = 0; i < 8; i++)
                if (i < nvk) {
                    __m256 dsv = _mm256_setzero_ps();
                    if (i < nv) {
                        __m256 p = ld_keys(a_r, i, n_k);
                        __m256 nz = _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                        dsv = _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(vscale, p), _mm256_sub_ps(dp[i], vd)), nz);
                    }
                    _mm256_store_ps(ds_r + i * W, dsv);
                }
            if (!dq) continue;
            // dQ_r += sum_c dS[r, c] k_c, in four chains (keys c mod 4) per half
            __m256 g0[4], g1[4];
            for (int j = 0; j < 4; j++) g0[j] = g1[j] = _mm256_setzero_ps();
            int64_t c = 0;
            for (; c + 4 <= n_kept; c += 4)
                for (int j = 0; j < 4; j++) {
                    const float *k_c = k + (c + j) * d_k;
                    __m256 s_c = _mm256_broadcast_ss(ds_r + c + j);
                    g0[j] = _mm256_fmadd_ps(s_c, ld_half(k_c, &hk, 0), g0[j]);
                    if (k2) g1[j] = _mm256_fmadd_ps(s_c, ld_half(k_c, &hk, 1), g1[j]);
                }
            for (int j = 0; c < n_kept; c++, j++) {
                const float *k_c = k + c * d_k;
                __m256 s_c = _mm256_broadcast_ss(ds_r + c);
                g0[j] = _mm256_fmadd_ps(s_c, ld_half(k_c, &hk, 0), g0[j]);
                if (k2) g1[j] = _mm256_fmadd_ps(s_c, ld_half(k_c, &hk, 1), g1[j]);
            }
            float *dq_r = dq + r * d_k;
            __m256 t0 = _mm256_add_ps(_mm256_add_ps(g0[0], g0[1]), _mm256_add_ps(g0[2], g0[3]));
            st_half(dq_r, &hk, 0, _mm256_add_ps(ld_half(dq_r, &hk, 0), t0));
            if (k2) {
                __m256 t1 = _mm256_add_ps(_mm256_add_ps(g1[0], g1[1]), _mm256_add_ps(g1[2], g1[3]));
                st_half(dq_r, &hk, 1, _mm256_add_ps(ld_half(dq_r, &hk, 1), t1));
            }
        }
        if (!dk && !dv) continue;
        // dK_c += sum_r dS[r, c] q_r,  dV_c += sum_r A[r, c] dO_r  over this chunk: four keys at a time when
        // the rows are one half each (eight accumulators), else two; the last keys one by one
        int64_t c = 0;
        if (!k2 && !v2)
            for (; c + 4 <= n_k; c += 4)
                mid_dkdv(q, dout, a, ds, n_k, d_k, d_v, r0, r1, c, 4, causal, &hk, &hv, acc_k, acc_v, k2, v2);
        for (; c + 2 <= n_k; c += 2)
            mid_dkdv(q, dout, a, ds, n_k, d_k, d_v, r0, r1, c, 2, causal, &hk, &hv, acc_k, acc_v, k2, v2);
        for (; c < n_k; c++)
            mid_dkdv(q, dout, a, ds, n_k, d_k, d_v, r0, r1, c, 1, causal, &hk, &hv, acc_k, acc_v, k2, v2);
    }
    for (int64_t c = 0; c < n_k; c++) {
        row16 rk = {{_mm256_load_ps(acc_k + c * 2 * W), _mm256_load_ps(acc_k + c * 2 * W + W)}};
        row16 rv = {{_mm256_load_ps(acc_v + c * 2 * W), _mm256_load_ps(acc_v + c * 2 * W + W)}};
        if (dk) add_row(dk + c * d_k, d_k, rk);
        if (dv) add_row(dv + c * d_v, d_v, rv);
    }
}

/* mid_fwd_body / mid_bwd_body with the halves of d_k and d_v (one or two) constants: one copy each */
static void mid_fwd(const float *q, const float *k, const float *v, float *out, float *a, int64_t n_q, int64_t n_k,
                    int64_t d_k, int64_t d_v, float scale, bool causal) {
    if (d_v > W) mid_fwd_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, true);
    else mid_fwd_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, false);
}

static void mid_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                    const float *a, float *dq, float *dk, float *dv, int64_t n_q, int64_t n_k, int64_t d_k,
                    int64_t d_v, float scale, bool causal) {
#define MID_BWD(k2, v2) mid_bwd_body(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal, k2, v2)
    if (d_k > W) {
        if (d_v > W) MID_BWD(true, true);
        else MID_BWD(true, false);
    } else {
        if (d_v > W) MID_BWD(false, true);
        else MID_BWD(false, false);
    }
#undef MID_BWD
}

/* The short path's entry points: one key vector (n_k <= 8) in registers, else the 64-key kernels. */
static void short_fwd_any(const float *q, const float *k, const float *v, float *out, float *a, int64_t n_q,
                          int64_t n_k, int64_t d_k, int64_t d_v, float scale, bool causal) {
    if (n_k <= W) short_fwd(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal);
    else mid_fwd(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal);
}

static void short_bwd_any(const float *q, const float *k, const float *v, const float *out, const float *dout,
                          const float *a, float *dq, float *dk, float *dv, int64_t n_q, int64_t n_k, int64_t d_k,
                          int64_t d_v, float scale, bool causal) {
    if (n_k <= W) short_bwd(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal);
    else mid_bwd(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal);
}

const qkv_attn_kernel_set_ qkv_attn_kernels_avx2_ = {
    .name = "avx2",
    .available = true,
    .softmax_row = softmax_row,
    .short_keys = MID_KEYS,
    .short_dims = 2 * W,
    .short_fwd = short_fwd_any,
    .short_bwd = short_bwd_any,
    .fwd_tile = fwd_tile,
    .bwd_p = bwd_p,
    .bwd_ds = bwd_ds,
    .rows_dot = rows_dot,
    .rows_axpy = rows_axpy,
    .outer_add = outer_add,
    .sigmoid_p = sigmoid_p,
    .sigmoid_ds = sigmoid_ds,
    .softpick_fwd_tile = softpick_fwd_tile,
    .softpick_bwd_p = softpick_bwd_p,
    .softpick_ds = softpick_ds,
};

#else

const qkv_attn_kernel_set_ qkv_attn_kernels_avx2_ = {.name = "avx2", .available = false};

#endif
