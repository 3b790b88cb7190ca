/*
 * unary_portable.c — the f32 maps of unary_kernels.h in plain C: each element in double with libm, rounded
 * once to float; and the choice of set for this CPU.
 */
#include "unary_kernels.h"

#include "qkv_internal.h"

#include <math.h>

static double f_of(qkv_vf_ f, double x, double p) {
    switch (f) {
    case QKV_VF_EXP_: return exp(x);
    case QKV_VF_LOG_: return log(x);
    case QKV_VF_TANH_:
    case QKV_VF_TANH_FAST_: return tanh(x);
    case QKV_VF_SIGMOID_: { // 1 / (1 + e^-x) from e = e^-|x| <= 1: no overflow either side
        double e = exp(-fabs(x));
        return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    }
    case QKV_VF_SOFTPLUS_: return fmax(x, 0.0) + log1p(exp(-fabs(x))); // ln(1 + e^x), exact everywhere
    default: return pow(x, p);
    }
}

static void map_portable(qkv_vf_ f, const float *x, float *y, int64_t n, float p) {
    for (int64_t i = 0; i < n; i++) y[i] = (float)f_of(f, (double)x[i], (double)p);
}

const qkv_unary_kernel_set_ qkv_unary_kernels_portable_ = {.name = "portable", .available = true, .map = map_portable};

const qkv_unary_kernel_set_ *qkv_unary_kernels_isa_(int isa) {
    if (isa == QKV_ISA_PORTABLE_) return &qkv_unary_kernels_portable_;
    if (isa == QKV_ISA_AVX512_ && qkv_unary_kernels_avx512_.available && qkv_isa_supported_(QKV_ISA_AVX512_))
        return &qkv_unary_kernels_avx512_;
    if (isa == QKV_ISA_AVX2_ && qkv_unary_kernels_avx2_.available && qkv_isa_supported_(QKV_ISA_AVX2_))
        return &qkv_unary_kernels_avx2_;
    return NULL;
}

const qkv_unary_kernel_set_ *qkv_unary_kernels_(void) {
    static const qkv_unary_kernel_set_ *_Atomic best = NULL; /* decided once; a race repeats the answer */
    const qkv_unary_kernel_set_ *k = best;
    if (!k) {
        k = qkv_unary_kernels_isa_(QKV_ISA_AVX512_);
        if (!k) k = qkv_unary_kernels_isa_(QKV_ISA_AVX2_);
        if (!k) k = &qkv_unary_kernels_portable_;
        best = k;
    }
    return k;
}
