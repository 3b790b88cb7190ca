/*
 * variant_kernel_cases.h — the attention variants' f32 tile kernels of one set (attention_kernels.h: sigmoid_p,
 * sigmoid_ds, softpick_fwd_tile, softpick_bwd_p, softpick_ds) against the portable set's, on odd tiles (1-5
 * rows, 1-40 keys), with and without a mask and causality, and scores from -40 to 40 (sigmoids that saturate,
 * e^x - 1 on both sides of 0). Shared by tests/test_attention_variants.c (the sets this CPU runs) and
 * tests/test_avx512_emulated.c (the AVX-512 set through SIMDe).
 */
#ifndef QKV_TESTS_VARIANT_KERNEL_CASES_H
#define QKV_TESTS_VARIANT_KERNEL_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../ops/kernels/attention_kernels.h"

/* |a - b| <= tol max(1, |b|), NaN where both are NaN; else a description into why. */
static inline bool vk_close(float a, float b, double tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs((double)a - (double)b) <= tol * fmax(1.0, fabs((double)b));
}

/* Runs every variant kernel of ks and of the portable set on the same tiles; returns the number of entries that
 * differ by more than 2e-6 relative (the first described in why). */
static inline int variant_kernels_against_portable(const qkv_attn_kernel_set_ *ks, char *why, size_t why_size) {
    const qkv_attn_kernel_set_ *ref = &qkv_attn_kernels_portable_;
    uint64_t state = 12345;
    int bad = 0, tiles = 0;
    enum { R = 5, C = 40, DV = 19 };
    for (int rows = 1; rows <= R; rows++)
        for (int cols = 1; cols <= C; cols += 3)
            for (int kind = 0; kind < 3; kind++) {
                float s0[R * C], s1[R * C], s2[R * C], dp[R * C], e1[R * C], e2[R * C], d1[R * C], d2[R * C];
                float o1[R * DV], o2[R * DV], m1[R], m2[R], l1[R], l2[R], inv[R], dsum[R];
                uint8_t mask[R * C];
                for (int i = 0; i < rows * cols; i++) {
                    state = state * 6364136223846793005ull + 1442695040888963407ull;
                    double u = (double)(state >> 11) * 0x1.0p-53;
                    s0[i] = (float)(80.0 * u - 40.0) * (i % 7 == 3 ? 0.01f : 1.0f); /* some near 0 */
                    dp[i] = (float)(2.0 * u - 1.0);
                    mask[i] = (state >> 7) % 4 != 0;
                }
                for (int r = 0; r < R; r++) dsum[r] = 0.3f * (float)r - 0.5f, inv[r] = 0.1f + 0.2f * (float)r;
                qkv_attn_tile_ t = {rows, cols, kind == 1 ? mask : NULL, kind == 1 ? cols : 0, kind == 2, 1};
                const float scale = 0.37f;
                // sigmoid: P, then dS from P
                memcpy(s1, s0, sizeof s1), memcpy(s2, s0, sizeof s2);
                ks->sigmoid_p(s1, &t, scale, -1.5f);
                ref->sigmoid_p(s2, &t, scale, -1.5f);
                ks->sigmoid_ds(s2, dp, &t, scale, d1);
                ref->sigmoid_ds(s2, dp, &t, scale, d2);
                for (int i = 0; i < rows * cols; i++)
                    if (!vk_close(s1[i], s2[i], 2e-6) || !vk_close(d1[i], d2[i], 2e-6)) {
                        if (!bad++) snprintf(why, why_size, "%s sigmoid tile %d entry %d: P %g / %g, dS %g / %g",
                                             ks->name, tiles, i, s1[i], s2[i], d1[i], d2[i]);
                    }
                // softpick forward: two tiles in a row from m = 0, l = 0, O random
                for (int r = 0; r < R; r++) m1[r] = m2[r] = 0.0f, l1[r] = l2[r] = 0.0f;
                for (int i = 0; i < R * DV; i++) o1[i] = o2[i] = (float)(i % 5) - 2.0f;
                for (int pass = 0; pass < 2; pass++) {
                    for (int i = 0; i < rows * cols; i++) s1[i] = s2[i] = s0[i] * (pass ? 1.5f : 0.5f);
                    ks->softpick_fwd_tile(s1, &t, scale, m1, l1, o1, DV, DV);
                    ref->softpick_fwd_tile(s2, &t, scale, m2, l2, o2, DV, DV);
                    for (int i = 0; i < rows * cols; i++)
                        if (!vk_close(s1[i], s2[i], 2e-6) && !bad++)
                            snprintf(why, why_size, "%s softpick_fwd_tile %d entry %d: P %g / %g", ks->name, tiles, i,
                                     s1[i], s2[i]);
                }
                for (int r = 0; r < rows; r++)
                    if ((!vk_close(m1[r], m2[r], 2e-6) || !vk_close(l1[r], l2[r], 2e-6) ||
                         !vk_close(o1[r * DV + 7], o2[r * DV + 7], 2e-6)) && !bad++)
                        snprintf(why, why_size, "%s softpick_fwd_tile %d row %d: m %g / %g, l %g / %g", ks->name,
                                 tiles, r, m1[r], m2[r], l1[r], l2[r]);
                // softpick backward from the m the forward left
                memcpy(s1, s0, sizeof s1), memcpy(s2, s0, sizeof s2);
                ks->softpick_bwd_p(s1, &t, scale, m2, inv, e1);
                ref->softpick_bwd_p(s2, &t, scale, m2, inv, e2);
                ks->softpick_ds(e2, dp, &t, scale, dsum, d1);
                ref->softpick_ds(e2, dp, &t, scale, dsum, d2);
                for (int i = 0; i < rows * cols; i++)
                    if ((!vk_close(s1[i], s2[i], 2e-6) || !vk_close(e1[i], e2[i], 2e-6) ||
                         !vk_close(d1[i], d2[i], 2e-6)) && !bad++)
                        snprintf(why, why_size, "%s softpick backward tile %d entry %d: P %g / %g, e %g / %g, dS %g / %g",
                                 ks->name, tiles, i, s1[i], s2[i], e1[i], e2[i], d1[i], d2[i]);
                tiles++;
            }
    return bad;
}

#endif
