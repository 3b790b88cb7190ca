/*
 * layer_norm.c — layer normalisation over the last dimension (torch.nn.functional.layer_norm).
 *   x [..., d], gamma [d] or NULL (1), beta [d] or NULL (0), eps finite > 0 -> y [..., d]
 *   per row: mean = sum(x) / d,  var = sum((x - mean)^2) / d (biased),  rstd = 1 / sqrt(var + eps)
 *            xhat = (x - mean) rstd,  y = xhat gamma + beta
 * A constant row has xhat = 0 and y = beta, and a finite gradient (rstd = 1 / sqrt(eps)). The forward saves
 * each row's mean and rstd (doubles, node->saved) for the closed-form backward.
 *
 * f64: plain loops in double. f32: every element computed in f32; the row sums (sum x, sum xc^2, and the
 * backward's two sums) go into 8 double partial sums, because a row of |x| ~ 1e4 with a small spread
 * loses the spread in an f32 sum and a single double accumulator would not vectorise (GCC does not
 * reorder an FP reduction without -ffast-math; 8 independent lanes need no reordering). The centred value
 * is xc = (x - mean_hi) - mean_lo, with the double mean split in two floats, so that it is exact to f32
 * rounding even when |mean| >> the spread. The loops are cloned per CPU (QKV_VECTOR_LOOP). One thread.
 */
#include "qkv_internal.h"

#include "row_sums.h"

#include <math.h>

typedef struct norm_saved {
    double *mean, *rstd; /* one per row */
    double eps;
} norm_saved;

/* ---- forward ------------------------------------------------------------------------------------ */

static void layer_norm_f64(const double *x, const double *g, const double *b, double *y, int64_t rows, int64_t d,
                           double eps, double *mean_out, double *rstd_out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d;
        double *yr = y + r * d;
        double s = 0.0, q = 0.0;
        for (int64_t j = 0; j < d; j++) s += xr[j];
        double mean = s / (double)d; // mean = sum(x) / d
        for (int64_t j = 0; j < d; j++) q += (xr[j] - mean) * (xr[j] - mean);
        double rstd = 1.0 / sqrt(q / (double)d + eps); // rstd = 1 / sqrt(var + eps)
        for (int64_t j = 0; j < d; j++) yr[j] = (xr[j] - mean) * rstd * (g ? g[j] : 1.0) + (b ? b[j] : 0.0);
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

QKV_VECTOR_LOOP
static void layer_norm_f32(const float *restrict x, const float *restrict g, const float *restrict b,
                           float *restrict y, int64_t rows, int64_t d, double eps, double *mean_out,
                           double *rstd_out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d;
        float *restrict yr = y + r * d;
        double mean = sum8_f32(xr, d) / (double)d;            // mean = sum(x) / d
        float hi = (float)mean, lo = (float)(mean - (double)hi); // mean = hi + lo
        for (int64_t j = 0; j < d; j++) yr[j] = (xr[j] - hi) - lo; // y holds xc = x - mean for now
        double rstd = 1.0 / sqrt(dot8_f32(yr, yr, d) / (double)d + eps); // rstd = 1 / sqrt(var + eps)
        float rs = (float)rstd;
        // y = xc rstd gamma + beta
        if (g && b)
            for (int64_t j = 0; j < d; j++) yr[j] = yr[j] * rs * g[j] + b[j];
        else if (g)
            for (int64_t j = 0; j < d; j++) yr[j] = yr[j] * rs * g[j];
        else if (b)
            for (int64_t j = 0; j < d; j++) yr[j] = yr[j] * rs + b[j];
        else
            for (int64_t j = 0; j < d; j++) yr[j] = yr[j] * rs;
        mean_out[r] = mean;
        rstd_out[r] = rstd;
    }
}

/* ---- backward ----------------------------------------------------------------------------------- */
// with dxh = dy gamma:  dx += rstd (dxh - mean(dxh) - xhat mean(dxh xhat)),
//                       dgamma += sum_rows dy xhat,  dbeta += sum_rows dy

static void layer_norm_backward_f64(const double *x, const double *g, const double *dy, const norm_saved *s,
                                    int64_t rows, int64_t d, double *dx, double *dg, double *db) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d, *dyr = dy + r * d;
        double mean = s->mean[r], rstd = s->rstd[r], a = 0.0, c = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double xhat = (xr[j] - mean) * rstd, dxh = dyr[j] * (g ? g[j] : 1.0);
            a += dxh;        // a = sum(dxh)
            c += dxh * xhat; // c = sum(dxh xhat)
        }
        a /= (double)d;
        c /= (double)d;
        for (int64_t j = 0; j < d; j++) {
            double xhat = (xr[j] - mean) * rstd, dxh = dyr[j] * (g ? g[j] : 1.0);
            if (dx) dx[r * d + j] += rstd * (dxh - a - xhat * c);
            if (dg) dg[j] += dyr[j] * xhat;
            if (db) db[j] += dyr[j];
        }
    }
}

/* xh, dxh, gb and bb are d-float scratch rows; dg and db (either may be NULL) are d-double sums over rows.
 * dgamma and dbeta are summed in f32 over blocks of NORM_BLOCK rows (gb, bb), each block then added into
 * the double sums: half the vector work of adding every row in double, and the f32 error of a block sum
 * (<= 16 terms) stays below 1e-6 relative. The block boundaries depend only on the row index. */
#define NORM_BLOCK 16
QKV_VECTOR_LOOP
static void layer_norm_backward_f32(const float *restrict x, const float *restrict g, const float *restrict dy,
                                    const norm_saved *s, int64_t rows, int64_t d, float *restrict dx,
                                    double *restrict dg, double *restrict db, float *restrict xh,
                                    float *restrict dxh, float *restrict gb, float *restrict bb) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * d, *restrict dyr = dy + r * d;
        float hi = (float)s->mean[r], lo = (float)(s->mean[r] - (double)hi), rs = (float)s->rstd[r];
        if (g)
            for (int64_t j = 0; j < d; j++) {
                xh[j] = ((xr[j] - hi) - lo) * rs; // xhat = (x - mean) rstd
                dxh[j] = dyr[j] * g[j];           // dxh = dy gamma
            }
        else
            for (int64_t j = 0; j < d; j++) xh[j] = ((xr[j] - hi) - lo) * rs, dxh[j] = dyr[j];
        if (dx) {
            float a = (float)(sum8_f32(dxh, d) / (double)d), c = (float)(dot8_f32(dxh, xh, d) / (double)d);
            float *restrict dxr = dx + r * d;
            for (int64_t j = 0; j < d; j++) dxr[j] += rs * ((dxh[j] - a) - xh[j] * c);
        }
        bool first = r % NORM_BLOCK == 0, last = r % NORM_BLOCK == NORM_BLOCK - 1 || r == rows - 1;
        if (dg) {
            if (first)
                for (int64_t j = 0; j < d; j++) gb[j] = dyr[j] * xh[j];
            else
                for (int64_t j = 0; j < d; j++) gb[j] += dyr[j] * xh[j];
            if (last)
                for (int64_t j = 0; j < d; j++) dg[j] += (double)gb[j];
        }
        if (db) {
            if (first)
                for (int64_t j = 0; j < d; j++) bb[j] = dyr[j];
            else
                for (int64_t j = 0; j < d; j++) bb[j] += dyr[j];
            if (last)
                for (int64_t j = 0; j < d; j++) db[j] += (double)bb[j];
        }
    }
}

static void layer_norm_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0], *gamma = node->in[1], *beta = node->in[2];
    const norm_saved *s = node->saved;
    int64_t d = x->shape[x->ndim - 1], rows = d > 0 ? x->numel / d : 0;
    qkv_tensor *dx = qkv_wants_grad_(x) ? qkv_grad_of_(ctx, x) : NULL;
    qkv_tensor *dgt = qkv_wants_grad_(gamma) ? qkv_grad_of_(ctx, gamma) : NULL;
    qkv_tensor *dbt = qkv_wants_grad_(beta) ? qkv_grad_of_(ctx, beta) : NULL;
    if (ctx->status) return;
    const qkv_tensor *dy = node->out->grad;
    if (x->dtype == QKV_F64) {
        layer_norm_backward_f64(x->data, gamma ? gamma->data : NULL, dy->data, s, rows, d, dx ? dx->data : NULL,
                                dgt ? dgt->data : NULL, dbt ? dbt->data : NULL);
        return;
    }
    double *sums = qkv_arena_array_(ctx, node->op, (size_t)(2 * d + 1), sizeof(double));
    float *scratch = qkv_arena_array_(ctx, node->op, (size_t)(4 * d + 1), sizeof(float));
    if (!sums || !scratch) return;
    memset(sums, 0, (size_t)(2 * d) * sizeof(double));
    layer_norm_backward_f32(x->data, gamma ? gamma->data : NULL, dy->data, s, rows, d, dx ? dx->data : NULL,
                            dgt ? sums : NULL, dbt ? sums + d : NULL, scratch, scratch + d, scratch + 2 * d,
                            scratch + 3 * d);
    if (dgt) qkv_accumulate_f64_(dgt, sums);
    if (dbt) qkv_accumulate_f64_(dbt, sums + d);
}

/* ---- the operator ------------------------------------------------------------------------------- */

/* gamma or beta: NULL, or x's dtype and [d]. */
static bool check_affine(qkv_ctx *ctx, const char *fn, const char *name, const qkv_tensor *x,
                         const qkv_tensor *p) {
    if (!p) return true;
    if (!qkv_check_float_(ctx, fn, name, p) || !qkv_check_same_dtype_(ctx, fn, x, "x", p, name)) return false;
    int64_t d = x->shape[x->ndim - 1];
    if (p->ndim != 1 || p->shape[0] != d)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, %s is %s: %s must be [d] = [%lld] or NULL", fn,
                         QKV_SHAPE(x), name, QKV_SHAPE(p), name, (long long)d),
               false;
    return true;
}

qkv_tensor *qkv_layer_norm(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *gamma, qkv_tensor *beta, double eps) {
    const char *fn = "qkv_layer_norm";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (x->ndim < 1)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s: it needs at least one dimension [..., d]", fn,
                         QKV_SHAPE(x));
    if (!check_affine(ctx, fn, "gamma", x, gamma) || !check_affine(ctx, fn, "beta", x, beta)) return NULL;
    if (!(eps > 0.0) || !isfinite(eps))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, eps is %g: eps must be finite and > 0", fn, QKV_SHAPE(x),
                         eps);
    int64_t d = x->shape[x->ndim - 1], rows = d > 0 ? x->numel / d : 0;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    norm_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
    double *stats = qkv_arena_array_(ctx, fn, (size_t)(2 * rows + 1), sizeof(double));
    if (!y || !s || !stats) return NULL;
    s->mean = stats;
    s->rstd = stats + rows;
    s->eps = eps;
    if (x->dtype == QKV_F64)
        layer_norm_f64(x->data, gamma ? gamma->data : NULL, beta ? beta->data : NULL, y->data, rows, d, eps,
                       s->mean, s->rstd);
    else
        layer_norm_f32(x->data, gamma ? gamma->data : NULL, beta ? beta->data : NULL, y->data, rows, d, eps,
                       s->mean, s->rstd);

    qkv_tensor *in[3] = {x, gamma, beta};
    if (qkv_needs_grad_(ctx, in, 3)) {
        qkv_node_ *node = qkv_record_(ctx, fn, layer_norm_backward, y, in, 3);
        if (!node) return NULL;
        node->saved = s;
        node->scalar = eps;
    }
    return y;
}
