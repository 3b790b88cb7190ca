/*
 * sum.c — s = sum of every element of a, a scalar.   a [...] -> s []
 */
#include "qkv_internal.h"

// s = factor * sum_i a[i]
qkv_tensor *qkv_reduce_all_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, double factor) {
    if (!ctx || ctx->status || !qkv_check_float_(ctx, fn, "a", a)) return NULL;
    qkv_tensor *s = qkv_new_tensor_(ctx, fn, a->dtype, 0, NULL);
    const double *av = qkv_as_f64_(ctx, fn, a);
    if (!s || !av) return NULL;
    double total = 0.0;
    for (int64_t i = 0; i < a->numel; i++) total += av[i];
    total *= factor;
    if (s->dtype == QKV_F64) *(double *)s->data = total;
    else *(float *)s->data = (float)total;
    qkv_tensor *in[1] = {a};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node = qkv_record_(ctx, fn, qkv_reduce_all_backward_, s, in, 1);
        if (!node) return NULL;
        node->scalar = factor;
    }
    return s;
}

// da[i] += factor * ds
void qkv_reduce_all_backward_(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *a = node->in[0];
    qkv_tensor *da = qkv_grad_of_(ctx, a);
    if (!da) return;
    const qkv_tensor *ds = node->out->grad;
    double g = node->scalar * (ds->dtype == QKV_F64 ? *(const double *)ds->data : *(const float *)ds->data);
    if (da->dtype == QKV_F64) {
        double *d = da->data;
        for (int64_t i = 0; i < da->numel; i++) d[i] += g;
    } else {
        float *d = da->data;
        for (int64_t i = 0; i < da->numel; i++) d[i] = (float)((double)d[i] + g);
    }
}

qkv_tensor *qkv_sum(qkv_ctx *ctx, qkv_tensor *a) {
    return qkv_reduce_all_(ctx, "qkv_sum", a, 1.0);
}
