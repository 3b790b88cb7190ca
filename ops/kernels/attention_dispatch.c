/*
 * attention_dispatch.c — which f32 softmax/attention kernel set runs: the one of the instruction set the
 * GEMM uses (qkv_isa_best_: AVX-512F, else AVX2+FMA, else portable), if it was compiled in (it needs its ISA
 * flag and SLEEF at build time), else the portable one. Tests and benchmarks can force a set.
 */
#include "qkv_internal.h"

#include "attention_kernels.h"

static const qkv_attn_kernel_set_ *const sets[QKV_ISA_COUNT_] = {
    [QKV_ISA_PORTABLE_] = &qkv_attn_kernels_portable_,
    [QKV_ISA_AVX2_] = &qkv_attn_kernels_avx2_,
    [QKV_ISA_AVX512_] = &qkv_attn_kernels_avx512_,
};

static int forced = -1;

/* The set of isa if compiled in and supported by this CPU, else NULL. */
static const qkv_attn_kernel_set_ *usable(int isa) {
    if (isa < 0 || isa >= QKV_ISA_COUNT_ || !sets[isa]->available) return NULL;
    return qkv_isa_supported_((qkv_isa_)isa) ? sets[isa] : NULL;
}

const qkv_attn_kernel_set_ *qkv_attn_kernels_(void) {
    static const qkv_attn_kernel_set_ *_Atomic best = NULL; /* decided once; a race repeats the same answer */
    if (forced >= 0) return sets[forced];
    const qkv_attn_kernel_set_ *k = best;
    if (!k) {
        k = &qkv_attn_kernels_portable_;
        for (int isa = qkv_isa_best_(); isa > QKV_ISA_PORTABLE_; isa--)
            if (usable(isa)) {
                k = sets[isa];
                break;
            }
        best = k;
    }
    return k;
}

const qkv_attn_kernel_set_ *qkv_attn_few_rows_kernels_(const qkv_attn_kernel_set_ *ks) {
    if (ks->rows_dot) return ks;
    int from = QKV_ISA_COUNT_; /* a set not in the table (a test's emulation of a wider one) looks below all */
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++)
        if (sets[isa] == ks) from = isa;
    for (int isa = from - 1; isa > QKV_ISA_PORTABLE_; isa--)
        if (usable(isa) && sets[isa]->rows_dot) return sets[isa];
    return NULL;
}

bool qkv_attn_force_isa_(int isa) {
    if (isa == -1) {
        forced = -1;
        return true;
    }
    if (!usable(isa)) return false;
    forced = isa;
    return true;
}

static bool short_allowed = true;

void qkv_attn_allow_short_(bool allow) { short_allowed = allow; }

bool qkv_attn_short_allowed_(void) { return short_allowed; }

static bool keep_p_allowed = true;

void qkv_attn_allow_keep_p_(bool allow) { keep_p_allowed = allow; }

bool qkv_attn_keep_p_allowed_(void) { return keep_p_allowed; }

static _Atomic long long regions = 0;

void qkv_parallel_region_opened_(void) { regions++; }

long long qkv_parallel_regions_(void) { return regions; }
