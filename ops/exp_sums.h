/*
 * exp_sums.h — the largest element and the sum of exps of f32 rows, for the forwards of logsumexp_dim.c and
 * log_softmax.c, which need the sum and not the exps. With the kernel set k (qkv_unary_kernels_(); a test passes
 * each set), per row of n: m = the largest (NaN if any is) and, when m is finite, s = sum_j e^(x[j] - m) in
 * double, with the bits of softmax_dim.c's f32 m and s (x - m rounded once in float, the kernel set's float exp,
 * row_sums.h's sum8_f32), without storing e. Rows go in pairs through the kernel set's exp_sum2 (two rows' sums,
 * each a chain of dependent additions, interleaved); a row alone (the last of an odd number, or beside a row whose
 * m is not finite) is the pair of itself; a set without exp_sum2 (the portable one) maps e into scratch (n
 * floats) and sums it. s is unset where m is not finite. Always inlined, so that it is compiled for the
 * instruction set of the target clone that calls it: left to itself GCC did not inline it, and its max8_f32 ran
 * in SSE2 (log_softmax 2.5x slower). (Not a target clone itself: clang 14 gives a static clone's resolver a global
 * name, and two files including it then fail to link.)
 */
#ifndef QKV_EXP_SUMS_H
#define QKV_EXP_SUMS_H

#include "kernels/unary_kernels.h"
#include "row_sums.h"

static inline __attribute__((always_inline)) void exp_sums_f32(const qkv_unary_kernel_set_ *k, const float *x,
                                                              int64_t rows, int64_t n, double *m, double *s,
                                                              float *scratch) {
    for (int64_t r = 0; r < rows; r += 2) {
        int count = rows - r >= 2 ? 2 : 1;
        float top[2];
        for (int c = 0; c < count; c++) {
            bool nan;
            top[c] = max8_f32(x + (r + c) * n, n, &nan);
            m[r + c] = nan ? NAN : (double)top[c];
        }
        if (k->exp_sum2 && count == 2 && isfinite(m[r]) && isfinite(m[r + 1])) {
            k->exp_sum2(x + r * n, top[0], x + (r + 1) * n, top[1], n, s + r); // s = sum_j e^(x[j] - m), one pass
            continue;
        }
        for (int c = 0; c < count; c++) {
            const float *xr = x + (r + c) * n;
            if (!isfinite(m[r + c])) continue;
            if (k->exp_sum2) {
                double both[2];
                k->exp_sum2(xr, top[c], xr, top[c], n, both);
                s[r + c] = both[0];
            } else {
                for (int64_t j = 0; j < n; j++) scratch[j] = xr[j] - top[c]; // x - m in float, rounded once
                k->map(QKV_VF_EXP_, scratch, scratch, n, 0.0f);             // e = e^(x - m)
                s[r + c] = sum8_f32(scratch, n);                            // s = sum_j e[j]
            }
        }
    }
}

#endif
