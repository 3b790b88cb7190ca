/*
 * layer_norm.c — layer normalisation over the last dimension (torch.nn.functional.layer_norm).
 *   x [..., d], gamma [d] or NULL (1), beta [d] or NULL (0), eps finite > 0 -> y [..., d]
 *   per row: mean = sum(x) / d,  var = sum((x - mean)^2) / d (biased),  rstd = 1 / sqrt(var + eps)
 *            xhat = (x - mean) rstd,  y = xhat gamma + beta
 * A constant row has xhat = 0 and y = beta, and a finite gradient (rstd = 1 / sqrt(eps)). The forward saves
 * each row's mean and rstd (doubles, node->saved) for the closed-form backward.
 *
 * f64: plain loops in double. f32 (ops/kernels/layer_norm_*.c: AVX2 or portable C, the same bits): every
 * element and every sum in f32, each row sum in 16 f32 lanes added in a fixed order; only the per-row
 * scalars (mean, var, rstd) are computed in double.
 * The mean is taken in two passes, because a row of |x| ~ 1e4 with a small spread loses the spread in an
 * f32 sum of x: m0 = sum(x) / d, then s1 = sum(x - m0) and s2 = sum((x - m0)^2) over the centred values
 * (x - m0 is exact when x is within a factor 2 of m0), mean = m0 + s1 / d, var = s2 / d - (s1 / d)^2 (the
 * corrected two-pass formula: s1 is small, so nothing cancels). The centred value is then
 * xc = (x - mean_hi) - mean_lo, with the double mean split in two floats, so that it is exact to f32
 * rounding even when |mean| >> the spread. The backward is one pass over a row for its two sums and the
 * dgamma / dbeta blocks (f32 over 16 rows, then added in double), then one for dx, recomputing xhat and
 * dy gamma instead of storing them. A NULL gamma or beta is a row of ones or zeros (x 1 and + 0 are exact).
 * The f32 rows are split over qkv_threads(ctx) threads (ops/parallel.h), each row one thread's. With more
 * than one, the backward's ranges are whole blocks of QKV_NORM_BLOCK rows, each block's dgamma / dbeta
 * (its f32 sums, exactly as a double) kept apart, then each column's blocks added in their order by one
 * thread: the same additions in double, in the same order, as on one thread, so the same bits for any count.
 */
#include "qkv_internal.h"

#include "kernels/layer_norm_kernels.h"
#include "parallel.h"

#include <float.h>
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

/* d floats of ones (or of zeros), from the step arena: what a NULL gamma (or beta) stands for */
static const float *constant_row(qkv_ctx *ctx, const char *fn, int64_t d, float value) {
    float *row = qkv_arena_array_(ctx, fn, (size_t)(d > 0 ? d : 1), sizeof(float));
    if (row)
        for (int64_t j = 0; j < d; j++) row[j] = value;
    return row;
}

/* The f32 kernels over a range of rows: the forward's, and the backward's in blocks of QKV_NORM_BLOCK rows,
 * block k's dgamma and dbeta into parts[k] (2 d doubles, zero before) when they are wanted. */
typedef struct norm_job {
    const float *x, *g, *b, *dy;
    float *y, *dx, *scratch; /* scratch: 2 d floats per block */
    double *mean, *rstd, *parts;
    int64_t d;
    double eps;
    bool dg, db;
} norm_job;

static void norm_forward_range(void *arg, int64_t r0, int64_t r1) {
    const norm_job *j = arg;
    int64_t d = j->d;
    qkv_layer_norm_kernels_()->forward(j->x + r0 * d, j->g, j->b, j->y + r0 * d, r1 - r0, d, j->eps, j->mean + r0,
                                       j->rstd + r0);
}

static void norm_backward_range(void *arg, int64_t r0, int64_t r1) {
    const norm_job *j = arg;
    int64_t d = j->d;
    const qkv_layer_norm_kernel_set_ *ks = qkv_layer_norm_kernels_();
    for (int64_t r = r0; r < r1; r += QKV_NORM_BLOCK) { /* r0 is a multiple of QKV_NORM_BLOCK */
        int64_t k = r / QKV_NORM_BLOCK, n = r1 - r < QKV_NORM_BLOCK ? r1 - r : QKV_NORM_BLOCK;
        double *part = j->parts + k * 2 * d;
        float *gb = j->scratch + k * 2 * d;
        if (j->dg || j->db) memset(part, 0, (size_t)(2 * d) * sizeof(double));
        ks->backward(j->x + r * d, j->g, j->dy + r * d, j->mean + r, j->rstd + r, n, d, j->dx ? j->dx + r * d : NULL,
                     j->dg ? part : NULL, j->db ? part + d : NULL, gb, gb + d);
    }
}

/* sums[i] = sum over the blocks k in order of parts[k][i], for the columns i in [i0, i1) of 2 d */
typedef struct norm_fold_job {
    const double *parts;
    double *sums;
    int64_t blocks, width;
} norm_fold_job;

static void norm_fold_range(void *arg, int64_t i0, int64_t i1) {
    const norm_fold_job *j = arg;
    double *restrict sums = j->sums;
    const double *restrict parts = j->parts;
    for (int64_t k = 0; k < j->blocks; k++)
        for (int64_t i = i0; i < i1; i++) sums[i] += parts[k * j->width + i];
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
    float *scratch = qkv_arena_array_(ctx, node->op, (size_t)(2 * d + 1), sizeof(float));
    const float *g = gamma ? gamma->data : constant_row(ctx, node->op, d, 1.0f);
    if (!sums || !scratch || !g) return;
    memset(sums, 0, (size_t)(2 * d) * sizeof(double));
    int threads = qkv_range_threads_(qkv_threads(ctx), rows, QKV_NORM_BLOCK, (double)rows * (double)d,
                                     QKV_GRAIN_ELEMENTS_);
    if (threads > 1) {
        int64_t blocks = (rows + QKV_NORM_BLOCK - 1) / QKV_NORM_BLOCK;
        norm_job job = {.x = x->data, .g = g, .dy = dy->data, .dx = dx ? dx->data : NULL, .d = d, .dg = dgt != NULL,
                        .db = dbt != NULL, .mean = s->mean, .rstd = s->rstd};
        job.parts = qkv_arena_array_(ctx, node->op, (size_t)(blocks * 2 * d), sizeof(double));
        job.scratch = qkv_arena_array_(ctx, node->op, (size_t)(blocks * 2 * d), sizeof(float));
        if (!job.parts || !job.scratch) return;
        qkv_parallel_ranges_(threads, rows, QKV_NORM_BLOCK, (double)rows * (double)d, QKV_GRAIN_ELEMENTS_,
                             norm_backward_range, &job);
        // dgamma, dbeta = sum over the blocks in order (what the one-thread kernel adds, in the same order),
        // each column by one thread
        norm_fold_job fold = {job.parts, sums, blocks, 2 * d};
        if (dgt || dbt)
            qkv_parallel_ranges_(threads, 2 * d, 16, (double)blocks * (double)(2 * d), QKV_GRAIN_ELEMENTS_,
                                 norm_fold_range, &fold);
    } else
        qkv_layer_norm_kernels_()->backward(x->data, g, dy->data, s->mean, s->rstd, rows, d, dx ? dx->data : NULL,
                                        dgt ? sums : NULL, dbt ? sums + d : NULL, scratch, scratch + d);
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
    if (x->dtype == QKV_F32 && eps < FLT_MIN) /* as an f32 it would be 0 or subnormal: 1/sqrt(eps) overflows */
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s (f32), eps is %g: an f32 eps must be at least FLT_MIN "
                         "(1.17549e-38), or a constant row would give 0 * inf = NaN", fn, QKV_SHAPE(x), eps);
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
    else {
        const float *g = gamma ? gamma->data : constant_row(ctx, fn, d, 1.0f);
        const float *b = beta ? beta->data : constant_row(ctx, fn, d, 0.0f);
        if (!g || !b) return NULL;
        norm_job job = {.x = x->data, .g = g, .b = b, .y = y->data, .mean = s->mean, .rstd = s->rstd, .d = d,
                        .eps = eps};
        qkv_parallel_ranges_(qkv_threads(ctx), rows, 1, (double)rows * (double)d, QKV_GRAIN_ELEMENTS_,
                             norm_forward_range, &job);
    }

    qkv_tensor *in[3] = {x, gamma, beta};
    if (qkv_needs_grad_(ctx, in, 3)) {
        qkv_node_ *node = qkv_record_(ctx, fn, layer_norm_backward, y, in, 3);
        if (!node) return NULL;
        node->saved = s;
        node->scalar = eps;
    }
    return y;
}
