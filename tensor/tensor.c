/*
 * tensor.c — making tensors (step and persistent), checking them, element access, dtype conversion,
 * and the f64 working buffers the reference kernels compute in.
 */
#include "qkv_internal.h"

#include <errno.h>
#include <math.h>

/* ---- dtypes -------------------------------------------------------------------------------------- */

size_t qkv_dtype_size(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return 4;
    case QKV_F64: return 8;
    case QKV_I32: return 4;
    case QKV_U8: return 1;
    default: return 0;
    }
}

const char *qkv_dtype_name(qkv_dtype dtype) {
    switch (dtype) {
    case QKV_F32: return "f32";
    case QKV_F64: return "f64";
    case QKV_I32: return "i32";
    case QKV_U8: return "u8";
    default: return "invalid";
    }
}

bool qkv_is_float_(qkv_dtype dtype) { return dtype == QKV_F32 || dtype == QKV_F64; }

/* ---- shapes -------------------------------------------------------------------------------------- */

char *qkv_shape_str(const qkv_tensor *t, char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    if (!t) {
        snprintf(buf, size, "NULL");
        return buf;
    }
    size_t len = 0;
    int n = snprintf(buf, size, "[");
    len = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < t->ndim && len < size; i++) {
        n = snprintf(buf + len, size - len, i ? ",%lld" : "%lld", (long long)t->shape[i]);
        if (n < 0) break;
        len += (size_t)n;
    }
    if (len < size) snprintf(buf + len, size - len, "]");
    return buf;
}

qkv_shapebuf_ qkv_shape_(const qkv_tensor *t) {
    qkv_shapebuf_ b;
    qkv_shape_str(t, b.s, sizeof b.s);
    return b;
}

bool qkv_same_shape_(const qkv_tensor *a, const qkv_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

int64_t qkv_dims_product_(const qkv_tensor *t, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= t->shape[i];
    return p;
}

/* Validate ndim and shape; numel receives the product. */
static bool check_shape(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim, const int64_t *shape,
                        int64_t *numel) {
    if ((int)dtype < 0 || dtype >= QKV_DTYPE_COUNT)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dtype), false;
    if (ndim < 0 || ndim > QKV_MAX_DIMS)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: %d dimensions requested, qkv tensors have 0 to %d", fn,
                         ndim, QKV_MAX_DIMS),
               false;
    if (ndim > 0 && !shape) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: shape is NULL", fn), false;
    /* n is the product of the nonzero dimensions: an empty tensor obeys the bound of a full one, in any
     * order of its dimensions ([0, 2^62, 5] and [2^62, 5, 0] alike), so no product of dimensions of a
     * valid tensor overflows (qkv.h, QKV_MAX_NUMEL) */
    size_t n = 1;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: dimension %d is %lld, must be >= 0", fn, i,
                             (long long)shape[i]),
                   false;
        if (shape[i] == 0) {
            empty = true;
            continue;
        }
        if (!qkv_mul_size_(n, (size_t)shape[i], &n) || n > (size_t)QKV_MAX_NUMEL)
            return qkv_fail_(ctx, QKV_ERR_OVERFLOW,
                             "%s: the element count overflows at dimension %d (%lld): the product of the "
                             "nonzero dimensions must be at most QKV_MAX_NUMEL (2^60 - 1)",
                             fn, i, (long long)shape[i]),
                   false;
    }
    *numel = empty ? 0 : (int64_t)n;
    return true;
}

static void init_header(qkv_tensor *t, qkv_dtype dtype, int ndim, const int64_t *shape, int64_t numel,
                        uint32_t epoch) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < QKV_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    t->numel = numel;
    t->magic_ = QKV_TENSOR_MAGIC;
    t->epoch_ = epoch;
}

/* A step tensor's header is a slot of the context's header ring and its data is in the step arena; a
 * persistent tensor's header and data share one block of the persistent heap, the data QKV_HEADER bytes
 * into it (so it keeps the block's alignment), and its header joins the set of live tensors (flags:
 * QKV_LIVE_GRAD for a gradient). Persistent data is zeroed; step data is left uninitialised. */
static qkv_tensor *new_block_tensor(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim,
                                    const int64_t *shape, bool persistent, uintptr_t flags) {
    int64_t numel;
    if (!check_shape(ctx, fn, dtype, ndim, shape, &numel)) return NULL;
    size_t data_bytes, bytes;
    if (!qkv_mul_size_((size_t)numel, qkv_dtype_size(dtype), &data_bytes) ||
        !qkv_add_size_(data_bytes, QKV_HEADER, &bytes))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: tensor of %lld elements overflows size_t", fn,
                         (long long)numel);
    _Static_assert(sizeof(qkv_tensor) <= QKV_HEADER, "the tensor header must fit in its aligned slot");
    if (!persistent) {
        void *data = qkv_arena_alloc_(ctx, fn, data_bytes);
        qkv_tensor *t = data ? qkv_step_header_(ctx, fn) : NULL;
        if (!t) return NULL;
        init_header(t, dtype, ndim, shape, numel, ctx->epoch);
        t->data = data;
        return t;
    }
    if (!qkv_live_reserve_(ctx, fn)) return NULL;
    unsigned char *block = qkv_persistent_alloc_(ctx, fn, bytes);
    if (!block) return qkv_live_trim_(ctx), NULL;
    qkv_tensor *t = (qkv_tensor *)block;
    init_header(t, dtype, ndim, shape, numel, 0);
    t->data = block + QKV_HEADER;
    memset(t->data, 0, data_bytes);
    qkv_live_add_(ctx, t, flags);
    return t;
}

qkv_tensor *qkv_new_tensor_(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim,
                            const int64_t *shape) {
    return new_block_tensor(ctx, fn, dtype, ndim, shape, false, 0);
}

qkv_tensor *qkv_new_like_(qkv_ctx *ctx, const char *fn, const qkv_tensor *like) {
    return qkv_new_tensor_(ctx, fn, like->dtype, like->ndim, like->shape);
}

static qkv_tensor *new_persistent(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim,
                                  const int64_t *shape, uintptr_t flags) {
    return new_block_tensor(ctx, fn, dtype, ndim, shape, true, flags);
}

/* ---- argument checks ----------------------------------------------------------------------------- */

/* By address first: a slot of the current header ring (the common case, one range test), then the live
 * set, then the retired rings; t is read only once its address is known to be one of ours. */
bool qkv_tensor_is_live_(const qkv_ctx *ctx, const qkv_tensor *t) {
    const qkv_ring_ *r = ctx->ring;
    if (r) {
        uintptr_t off = (uintptr_t)t - (uintptr_t)r->slots;
        if (off < r->capacity * sizeof(qkv_tensor) && off % sizeof(qkv_tensor) == 0 &&
            t->magic_ == QKV_TENSOR_MAGIC && t->epoch_ == ctx->epoch)
            return true;
    }
    uint32_t made_in;
    qkv_handle_kind_ kind = qkv_classify_(ctx, t, &made_in);
    return kind == QKV_HANDLE_STEP_ || kind == QKV_HANDLE_PERSISTENT_ || kind == QKV_HANDLE_GRAD_;
}

bool qkv_check_tensor_(qkv_ctx *ctx, const char *fn, const char *name, const qkv_tensor *t) {
    if (!t) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, name), false;
    if (qkv_tensor_is_live_(ctx, t)) return true;
    uint32_t made_in = 0;
    qkv_handle_kind_ kind = qkv_classify_(ctx, t, &made_in);
    return qkv_handle_fail_(ctx, fn, name, kind, made_in);
}

bool qkv_check_float_(qkv_ctx *ctx, const char *fn, const char *name, const qkv_tensor *t) {
    if (!qkv_check_tensor_(ctx, fn, name, t)) return false;
    if (!qkv_is_float_(t->dtype))
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: %s %s is %s, must be f32 or f64", fn, name,
                         QKV_SHAPE(t), qkv_dtype_name(t->dtype)),
               false;
    return true;
}

bool qkv_check_same_dtype_(qkv_ctx *ctx, const char *fn, const qkv_tensor *a, const char *an,
                           const qkv_tensor *b, const char *bn) {
    if (a->dtype == b->dtype) return true;
    return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: %s %s is %s but %s %s is %s; dtypes must match", fn, an,
                     QKV_SHAPE(a), qkv_dtype_name(a->dtype), bn, QKV_SHAPE(b),
                     qkv_dtype_name(b->dtype)),
           false;
}

bool qkv_check_broadcast_(qkv_ctx *ctx, const char *fn, const qkv_tensor *a, const qkv_tensor *b) {
    if (b->numel == 1 || qkv_same_shape_(a, b)) return true;
    bool suffix = b->ndim <= a->ndim;
    for (int i = 0; suffix && i < b->ndim; i++)
        if (b->shape[i] != a->shape[a->ndim - b->ndim + i]) suffix = false;
    if (suffix) return true;
    return qkv_fail_(ctx, QKV_ERR_SHAPE,
                     "%s: a is %s, b is %s: b must have a's shape, its trailing dimensions, or one element",
                     fn, QKV_SHAPE(a), QKV_SHAPE(b)),
           false;
}

void qkv_sum_rows_f64_(const double *src, int64_t rows, int64_t cols, double *dst) {
    for (int64_t j = 0; j < cols; j++) dst[j] = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) dst[j] += src[r * cols + j];
}

/* ---- element values as double -------------------------------------------------------------------- */

static double load(const qkv_tensor *t, int64_t i) {
    switch (t->dtype) {
    case QKV_F32: return ((const float *)t->data)[i];
    case QKV_F64: return ((const double *)t->data)[i];
    case QKV_I32: return ((const int32_t *)t->data)[i];
    case QKV_U8: return ((const uint8_t *)t->data)[i];
    default: return NAN;
    }
}

/* Integer stores saturate (and NaN becomes 0), so a conversion never has undefined behaviour. */
static void store(qkv_tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case QKV_F32: ((float *)t->data)[i] = (float)v; break;
    case QKV_F64: ((double *)t->data)[i] = v; break;
    case QKV_I32:
        ((int32_t *)t->data)[i] = v != v ? 0 : v >= 2147483647.0 ? INT32_MAX
                                          : v <= -2147483648.0  ? INT32_MIN
                                                                : (int32_t)v;
        break;
    case QKV_U8: ((uint8_t *)t->data)[i] = v != v ? 0 : v >= 255.0 ? 255 : v <= 0.0 ? 0 : (uint8_t)v; break;
    default: break;
    }
}

static void fill_value(qkv_tensor *t, double v) {
    if (t->dtype == QKV_F64) {
        double *p = t->data;
        for (int64_t i = 0; i < t->numel; i++) p[i] = v;
    } else if (t->dtype == QKV_F32) {
        float *p = t->data;
        for (int64_t i = 0; i < t->numel; i++) p[i] = (float)v;
    } else {
        for (int64_t i = 0; i < t->numel; i++) store(t, i, v);
    }
}

/* ---- creation ------------------------------------------------------------------------------------ */

qkv_tensor *qkv_zeros(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape) {
    if (!ctx || ctx->status) return NULL;
    qkv_tensor *t = qkv_new_tensor_(ctx, "qkv_zeros", dtype, ndim, shape);
    if (t) memset(t->data, 0, (size_t)t->numel * qkv_dtype_size(dtype));
    return t;
}

qkv_tensor *qkv_empty(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape) {
    if (!ctx || ctx->status) return NULL;
    return qkv_new_tensor_(ctx, "qkv_empty", dtype, ndim, shape); /* the elements are not touched */
}

/* qkv_full for the public function fn (qkv_full, qkv_ones, qkv_scalar): errors name fn. */
static qkv_tensor *full(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim, const int64_t *shape,
                        double value) {
    if (!ctx || ctx->status) return NULL;
    qkv_tensor *t = qkv_new_tensor_(ctx, fn, dtype, ndim, shape);
    if (t) fill_value(t, value);
    return t;
}

qkv_tensor *qkv_full(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape, double value) {
    return full(ctx, "qkv_full", dtype, ndim, shape, value);
}

qkv_tensor *qkv_ones(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape) {
    return full(ctx, "qkv_ones", dtype, ndim, shape, 1.0);
}

qkv_tensor *qkv_scalar(qkv_ctx *ctx, qkv_dtype dtype, double value) {
    return full(ctx, "qkv_scalar", dtype, 0, NULL, value);
}

qkv_tensor *qkv_from_data(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape,
                          const void *data) {
    if (!ctx || ctx->status) return NULL;
    if (!data) return qkv_fail_(ctx, QKV_ERR_NULL, "qkv_from_data: data is NULL");
    qkv_tensor *t = qkv_new_tensor_(ctx, "qkv_from_data", dtype, ndim, shape);
    if (t) memcpy(t->data, data, (size_t)t->numel * qkv_dtype_size(dtype));
    return t;
}

static qkv_tensor *new_random(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim,
                              const int64_t *shape) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_is_float_(dtype))
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: dtype %s, random tensors are f32 or f64", fn,
                         qkv_dtype_name(dtype));
    return qkv_new_tensor_(ctx, fn, dtype, ndim, shape);
}

/* qkv_randn and qkv_rand_uniform for the public function fn (they, or an initialiser): errors name fn. */
static qkv_tensor *randn(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim, const int64_t *shape,
                         double mean, double std) {
    qkv_tensor *t = new_random(ctx, fn, dtype, ndim, shape);
    if (!t) return NULL;
    if (!isfinite(mean) || !isfinite(std) || std < 0)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: mean %g and std %g must be finite, std >= 0", fn, mean, std);
    for (int64_t i = 0; i < t->numel; i++) store(t, i, mean + std * qkv_rng_normal_(ctx));
    return t;
}

static qkv_tensor *rand_uniform(qkv_ctx *ctx, const char *fn, qkv_dtype dtype, int ndim, const int64_t *shape,
                                double low, double high) {
    qkv_tensor *t = new_random(ctx, fn, dtype, ndim, shape);
    if (!t) return NULL;
    if (!isfinite(low) || !isfinite(high) || high < low)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: bounds [%g, %g) must be finite and ordered", fn, low, high);
    for (int64_t i = 0; i < t->numel; i++) store(t, i, low + (high - low) * qkv_rng_uniform_(ctx));
    return t;
}

qkv_tensor *qkv_randn(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape, double mean,
                      double std) {
    return randn(ctx, "qkv_randn", dtype, ndim, shape, mean, std);
}

qkv_tensor *qkv_rand_uniform(qkv_ctx *ctx, qkv_dtype dtype, int ndim, const int64_t *shape, double low,
                             double high) {
    return rand_uniform(ctx, "qkv_rand_uniform", dtype, ndim, shape, low, high);
}

static bool check_fans(qkv_ctx *ctx, const char *fn, int64_t fan_in, int64_t fan_out) {
    if (fan_in > 0 && fan_out > 0) return true;
    return qkv_fail_(ctx, QKV_ERR_ARG, "%s: fan_in %lld and fan_out %lld must be positive", fn,
                     (long long)fan_in, (long long)fan_out),
           false;
}

qkv_tensor *qkv_xavier_uniform(qkv_ctx *ctx, qkv_dtype dtype, int64_t fan_in, int64_t fan_out) {
    const char *fn = "qkv_xavier_uniform";
    if (!ctx || ctx->status || !check_fans(ctx, fn, fan_in, fan_out)) return NULL;
    /* the sum in double: fan_in + fan_out in int64 overflows for fans near INT64_MAX (the shape is then
     * refused as too large, but the sum came first) */
    double a = sqrt(6.0 / ((double)fan_in + (double)fan_out)); /* Var U(-a, a) = a^2/3 = 2/(fan_in+fan_out) */
    return rand_uniform(ctx, fn, dtype, 2, (int64_t[]){fan_in, fan_out}, -a, a);
}

qkv_tensor *qkv_he_normal(qkv_ctx *ctx, qkv_dtype dtype, int64_t fan_in, int64_t fan_out) {
    const char *fn = "qkv_he_normal";
    if (!ctx || ctx->status || !check_fans(ctx, fn, fan_in, fan_out)) return NULL;
    return randn(ctx, fn, dtype, 2, (int64_t[]){fan_in, fan_out}, 0.0, sqrt(2.0 / (double)fan_in));
}

/* ---- persistent tensors -------------------------------------------------------------------------- */

/* src is checked unless it is a view the library built itself (view: see qkv_keep_view_). */
static qkv_tensor *persist(qkv_ctx *ctx, const char *fn, const qkv_tensor *src, bool param, bool view) {
    if (!ctx || ctx->status) return NULL;
    if (!view && !qkv_check_tensor_(ctx, fn, "tensor", src)) return NULL;
    if (param && !qkv_is_float_(src->dtype))
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: tensor %s is %s; parameters are f32 or f64", fn,
                         QKV_SHAPE(src), qkv_dtype_name(src->dtype));
    if (param && ctx->n_params == ctx->cap_params) {
        int cap = ctx->cap_params ? 2 * ctx->cap_params : 16;
        qkv_tensor **grown = qkv_raw_malloc_(ctx, (size_t)cap * sizeof *grown);
        if (!grown) return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory for the parameter list", fn);
        if (ctx->n_params) memcpy(grown, ctx->params, (size_t)ctx->n_params * sizeof *grown);
        qkv_raw_free_(ctx, ctx->params);
        ctx->params = grown;
        ctx->cap_params = cap;
    }
    qkv_tensor *t = new_persistent(ctx, fn, src->dtype, src->ndim, src->shape, 0);
    if (!t) return NULL;
    memcpy(t->data, src->data, (size_t)src->numel * qkv_dtype_size(src->dtype));
    if (param) {
        t->requires_grad = true;
        ctx->params[ctx->n_params++] = t;
    }
    return t;
}

qkv_tensor *qkv_param(qkv_ctx *ctx, const qkv_tensor *init) {
    return persist(ctx, "qkv_param", init, true, false);
}

qkv_tensor *qkv_keep(qkv_ctx *ctx, const qkv_tensor *t) { return persist(ctx, "qkv_keep", t, false, false); }

qkv_tensor *qkv_keep_view_(qkv_ctx *ctx, const char *fn, const qkv_tensor *view) {
    return persist(ctx, fn, view, false, true);
}


void qkv_free(qkv_ctx *ctx, qkv_tensor *t) {
    if (!ctx || !t) return;
    uint32_t made_in = 0;
    qkv_handle_kind_ kind = qkv_classify_(ctx, t, &made_in);
    if (kind == QKV_HANDLE_STEP_) return; /* a step tensor of this step: qkv_step_end releases it */
    if (kind == QKV_HANDLE_GRAD_) {
        qkv_fail_(ctx, QKV_ERR_ARG,
                  "qkv_free: tensor %s is the gradient of a persistent tensor, which owns it (qkv_zero_grad "
                  "zeros it; qkv_free of its tensor frees both)",
                  QKV_SHAPE(t));
        return;
    }
    if (kind != QKV_HANDLE_PERSISTENT_) {
        qkv_handle_fail_(ctx, "qkv_free", "tensor", kind, made_in);
        return;
    }
    qkv_take_back_dloss_(ctx, t); /* lent to this step's loss as its gradient: the loss lets go of it */
    bool param = false;
    for (int i = 0; i < ctx->n_params; i++) {
        if (ctx->params[i] == t) {
            memmove(ctx->params + i, ctx->params + i + 1, (size_t)(ctx->n_params - i - 1) * sizeof t);
            ctx->n_params--;
            param = true;
            break;
        }
    }
    /* it and its gradient; a parameter is held for the next QKV_FREED_KEPT frees of parameters */
    qkv_free_persistent_tensor_(ctx, t, param);
}

qkv_tensor *const *qkv_params(const qkv_ctx *ctx, int *count) {
    if (count) *count = ctx ? ctx->n_params : 0;
    return ctx ? ctx->params : NULL;
}

/* Gradient storage: persistent for persistent tensors (made once, in the first backward), arena for
 * step tensors. */
qkv_tensor *qkv_grad_of_(qkv_ctx *ctx, qkv_tensor *t) {
    if (t->grad) return t->grad;
    qkv_tensor *g;
    if (t->epoch_ == 0) {
        g = new_persistent(ctx, "qkv_backward", t->dtype, t->ndim, t->shape, QKV_LIVE_GRAD);
    } else {
        g = qkv_new_like_(ctx, "qkv_backward", t);
        if (g) memset(g->data, 0, (size_t)g->numel * qkv_dtype_size(g->dtype));
    }
    t->grad = g;
    return g;
}

qkv_tensor *qkv_grad_to_write_(qkv_ctx *ctx, qkv_tensor *t, bool *fresh) {
    *fresh = false;
    if (t->grad || t->epoch_ == 0) return qkv_grad_of_(ctx, t);
    qkv_tensor *g = qkv_new_like_(ctx, "qkv_backward", t); /* every element is stored by the caller */
    t->grad = g;
    *fresh = g != NULL;
    return g;
}

/* ---- copies and conversion ----------------------------------------------------------------------- */

static void convert(qkv_tensor *dst, const qkv_tensor *src) {
    if (dst->dtype == src->dtype) {
        memcpy(dst->data, src->data, (size_t)src->numel * qkv_dtype_size(src->dtype));
        return;
    }
    for (int64_t i = 0; i < src->numel; i++) store(dst, i, load(src, i));
}

/* qkv_to_dtype for the public function fn (it, or qkv_copy): errors name fn. */
static qkv_tensor *to_dtype(qkv_ctx *ctx, const char *fn, const qkv_tensor *t, qkv_dtype dtype) {
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, fn, "tensor", t)) return NULL;
    qkv_tensor *out = qkv_new_tensor_(ctx, fn, dtype, t->ndim, t->shape);
    if (out) convert(out, t);
    return out;
}

qkv_tensor *qkv_to_dtype(qkv_ctx *ctx, const qkv_tensor *t, qkv_dtype dtype) {
    return to_dtype(ctx, "qkv_to_dtype", t, dtype);
}

qkv_tensor *qkv_copy(qkv_ctx *ctx, const qkv_tensor *t) {
    if (!ctx || ctx->status || !qkv_check_tensor_(ctx, "qkv_copy", "tensor", t)) return NULL;
    return to_dtype(ctx, "qkv_copy", t, t->dtype);
}

qkv_status qkv_copy_into(qkv_ctx *ctx, qkv_tensor *dst, const qkv_tensor *src) {
    const char *fn = "qkv_copy_into";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_tensor_(ctx, fn, "dst", dst) || !qkv_check_tensor_(ctx, fn, "src", src))
        return ctx->status;
    if (dst->numel != src->numel)
        return qkv_failc_(ctx, QKV_ERR_SHAPE, "%s: dst %s has %lld elements, src %s has %lld", fn,
                          QKV_SHAPE(dst), (long long)dst->numel, QKV_SHAPE(src), (long long)src->numel);
    convert(dst, src);
    return QKV_OK;
}

qkv_status qkv_fill(qkv_ctx *ctx, qkv_tensor *t, double value) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_tensor_(ctx, "qkv_fill", "tensor", t)) return ctx->status;
    fill_value(t, value);
    return QKV_OK;
}

/* ---- element access ------------------------------------------------------------------------------ */

static bool flat_index(qkv_ctx *ctx, const char *fn, const qkv_tensor *t, const int64_t *index,
                       int64_t *flat) {
    if (!qkv_check_tensor_(ctx, fn, "tensor", t)) return false;
    if (t->ndim > 0 && !index) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: index is NULL", fn), false;
    int64_t f = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (index[i] < 0 || index[i] >= t->shape[i])
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: index %lld out of range for dimension %d of %s", fn,
                             (long long)index[i], i, QKV_SHAPE(t)),
                   false;
        f = f * t->shape[i] + index[i];
    }
    *flat = f;
    return true;
}

static bool check_position(qkv_ctx *ctx, const char *fn, const qkv_tensor *t, int64_t position) {
    if (!qkv_check_tensor_(ctx, fn, "tensor", t)) return false;
    if (position < 0 || position >= t->numel)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: position %lld out of range for %s (%lld elements)", fn,
                         (long long)position, QKV_SHAPE(t), (long long)t->numel),
               false;
    return true;
}

double qkv_get(qkv_ctx *ctx, const qkv_tensor *t, const int64_t *index) {
    int64_t f;
    if (!ctx || ctx->status || !flat_index(ctx, "qkv_get", t, index, &f)) return NAN;
    return load(t, f);
}

qkv_status qkv_set(qkv_ctx *ctx, qkv_tensor *t, const int64_t *index, double value) {
    int64_t f;
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!flat_index(ctx, "qkv_set", t, index, &f)) return ctx->status;
    store(t, f, value);
    return QKV_OK;
}

double qkv_get_flat(qkv_ctx *ctx, const qkv_tensor *t, int64_t position) {
    if (!ctx || ctx->status || !check_position(ctx, "qkv_get_flat", t, position)) return NAN;
    return load(t, position);
}

qkv_status qkv_set_flat(qkv_ctx *ctx, qkv_tensor *t, int64_t position, double value) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!check_position(ctx, "qkv_set_flat", t, position)) return ctx->status;
    store(t, position, value);
    return QKV_OK;
}

float *qkv_f32_mut(qkv_tensor *t) { return t && t->dtype == QKV_F32 ? t->data : NULL; }
const float *qkv_f32_const(const qkv_tensor *t) { return t && t->dtype == QKV_F32 ? t->data : NULL; }
double *qkv_f64_mut(qkv_tensor *t) { return t && t->dtype == QKV_F64 ? t->data : NULL; }
const double *qkv_f64_const(const qkv_tensor *t) { return t && t->dtype == QKV_F64 ? t->data : NULL; }
int32_t *qkv_i32_mut(qkv_tensor *t) { return t && t->dtype == QKV_I32 ? t->data : NULL; }
const int32_t *qkv_i32_const(const qkv_tensor *t) { return t && t->dtype == QKV_I32 ? t->data : NULL; }
uint8_t *qkv_u8_mut(qkv_tensor *t) { return t && t->dtype == QKV_U8 ? t->data : NULL; }
const uint8_t *qkv_u8_const(const qkv_tensor *t) { return t && t->dtype == QKV_U8 ? t->data : NULL; }

/* ---- printing ------------------------------------------------------------------------------------ */

enum { PRINT_EDGE = 3 }; /* a dimension longer than 2 * PRINT_EDGE shows its first and last 3 */

static void print_rec(const qkv_tensor *t, FILE *out, int dim, int64_t offset, int indent) {
    int64_t n = t->shape[dim];
    bool elide = n > 2 * PRINT_EDGE;
    int64_t stride = qkv_dims_product_(t, dim + 1, t->ndim);
    fputc('[', out);
    for (int64_t i = 0; i < n; i++) {
        if (elide && i == PRINT_EDGE) {
            fprintf(out, dim == t->ndim - 1 ? "..., " : "...,\n%*s", dim == t->ndim - 1 ? 0 : indent + 1, "");
            i = n - PRINT_EDGE - 1;
            continue;
        }
        if (dim == t->ndim - 1) {
            if (t->dtype == QKV_F32 || t->dtype == QKV_F64) fprintf(out, "%.6g", load(t, offset + i));
            else fprintf(out, "%lld", (long long)load(t, offset + i));
        } else {
            print_rec(t, out, dim + 1, offset + i * stride, indent + 1);
        }
        if (i + 1 < n) fprintf(out, dim == t->ndim - 1 ? ", " : ",\n%*s", indent + 1, "");
    }
    fputc(']', out);
}

qkv_status qkv_print(qkv_ctx *ctx, const qkv_tensor *t, FILE *out) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_tensor_(ctx, "qkv_print", "tensor", t)) return ctx->status;
    if (!out) return qkv_failc_(ctx, QKV_ERR_NULL, "qkv_print: out is NULL");
    errno = 0; /* a failing write sets it: the reason goes into the message */
    fprintf(out, "tensor %s %s", QKV_SHAPE(t), qkv_dtype_name(t->dtype));
    if (t->requires_grad) fprintf(out, " requires_grad");
    fputc('\n', out);
    if (t->ndim == 0) {
        if (qkv_is_float_(t->dtype)) fprintf(out, "%.6g\n", load(t, 0));
        else fprintf(out, "%lld\n", (long long)load(t, 0));
    } else if (t->numel == 0) {
        fprintf(out, "[]\n");
    } else {
        print_rec(t, out, 0, 0, 0);
        fputc('\n', out);
    }
    /* stdio buffers what it writes, so a full disk or a closed pipe often shows only when the buffer goes
     * out: flush it, so that the error is the caller's now, not a silent one at fclose */
    if (fflush(out) != 0 || ferror(out))
        return qkv_failc_(ctx, QKV_ERR_IO, "qkv_print: writing tensor %s to the stream failed%s%s", QKV_SHAPE(t),
                          errno ? ": " : "", errno ? strerror(errno) : "");
    return QKV_OK;
}

/* ---- f64 working buffers ------------------------------------------------------------------------- */

const double *qkv_as_f64_(qkv_ctx *ctx, const char *fn, const qkv_tensor *t) {
    if (t->dtype == QKV_F64) return t->data;
    double *buf = qkv_arena_array_(ctx, fn, (size_t)t->numel, sizeof(double));
    if (!buf) return NULL;
    const float *src = t->data;
    for (int64_t i = 0; i < t->numel; i++) buf[i] = src[i];
    return buf;
}

double *qkv_out_f64_(qkv_ctx *ctx, const char *fn, qkv_tensor *t) {
    if (t->dtype == QKV_F64) return t->data;
    return qkv_arena_array_(ctx, fn, (size_t)t->numel, sizeof(double));
}

void qkv_store_f64_(qkv_tensor *t, const double *buf) {
    if (t->data == (const void *)buf) return;
    float *dst = t->data;
    for (int64_t i = 0; i < t->numel; i++) dst[i] = (float)buf[i];
}

void qkv_accumulate_f64_(qkv_tensor *t, const double *buf) {
    if (t->dtype == QKV_F64) {
        double *dst = t->data;
        for (int64_t i = 0; i < t->numel; i++) dst[i] += buf[i];
    } else {
        float *dst = t->data;
        for (int64_t i = 0; i < t->numel; i++) dst[i] = (float)((double)dst[i] + buf[i]);
    }
}
