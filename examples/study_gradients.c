/*
 * study_gradients.c — part 3: gradients at initialisation, through the softmax Jacobian.
 *
 * One attention layer at initialisation, with the seed's assumption made true by construction:
 * X ~ N(0, 1) and W^Q, W^K, W^V ~ N(0, 1/d_model), so the components of Q = X W^Q and K = X W^K have
 * variance 1 and the raw scores Q K^T have std sqrt(d_k).
 *   X [B, n, d_model]  W^Q, W^K [d_model, d_k]  W^V [d_model, V]  targets [B, n] uniform in 0..V-1
 *   Q = X W^Q, K = X W^K, Vals = X W^V           [B, n, d_k], [B, n, d_k], [B, n, V]
 *   S = s Q K^T                                  [B, n, n]   the softmax input
 *   A = softmax(S), O = A Vals                   [B, n, n], [B, n, V]   (O are the logits)
 *   L = mean cross-entropy(O, targets)
 * qkv_backward gives dL/dA, then dL/dS through the Jacobian diag(a) - a a^T of each row
 * (dS = A * (dA - rowsum(dA * A))), and dL/dW^Q = X^T (s dS K). Norms are Frobenius norms over the
 * whole batch, averaged over trials; the f32 run uses the same draws converted to f32.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"
#include "study.h"

static double value(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
}

static double frobenius(const qkv_tensor *t) {
    double sum = 0;
    for (int64_t i = 0; i < t->numel; i++) sum += value(t, i) * value(t, i); // |t|_F^2 = sum t_i^2
    return sqrt(sum);
}

static double zero_share(const qkv_tensor *t) {
    int64_t zeros = 0;
    for (int64_t i = 0; i < t->numel; i++) zeros += value(t, i) == 0;
    return (double)zeros / (double)t->numel;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rows of ds [rows, n]: the median of the row norms |dS_i|, and the share of rows that are all 0. */
static bool row_figures(const qkv_tensor *ds, int64_t rows, int64_t n, double *median, double *zero_rows) {
    double *norm = malloc((size_t)rows * sizeof *norm);
    if (!norm) return false;
    int64_t zeros = 0;
    for (int64_t i = 0; i < rows; i++) {
        double sum = 0;
        for (int64_t j = 0; j < n; j++) sum += value(ds, i * n + j) * value(ds, i * n + j);
        norm[i] = sqrt(sum);
        zeros += sum == 0;
    }
    qsort(norm, (size_t)rows, sizeof *norm, compare_doubles);
    *median = rows % 2 ? norm[rows / 2] : 0.5 * (norm[rows / 2 - 1] + norm[rows / 2]);
    *zero_rows = (double)zeros / (double)rows;
    free(norm);
    return true;
}

/* One forward and backward of the layer for (d_k, scale) in dtype; adds this trial's figures into c
 * (index 0 f64, 1 f32). Returns false on a qkv error. */
static bool one_trial(qkv_ctx *ctx, const study_gradients_result *r, int64_t d_k, double scale, int dt,
                      uint64_t seed, study_gradient_cell *c) {
    int64_t B = r->batch, n = r->n, dm = r->d_model, V = r->vocab;
    qkv_seed(ctx, seed); /* the same draws for every scale and both dtypes */
    qkv_tensor *x = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){B, n, dm}, 0, 1);
    qkv_tensor *wq = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){dm, d_k}, 0, 1 / sqrt((double)dm));
    qkv_tensor *wk = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){dm, d_k}, 0, 1 / sqrt((double)dm));
    qkv_tensor *wv = qkv_randn(ctx, QKV_F64, 2, (int64_t[]){dm, V}, 0, 1 / sqrt((double)dm));
    qkv_tensor *targets = qkv_to_dtype(ctx, qkv_rand_uniform(ctx, QKV_F64, 2, (int64_t[]){B, n}, 0, (double)V),
                                       QKV_I32);
    if (dt == 1) {
        x = qkv_to_dtype(ctx, x, QKV_F32);
        wq = qkv_to_dtype(ctx, wq, QKV_F32);
        wk = qkv_to_dtype(ctx, wk, QKV_F32);
        wv = qkv_to_dtype(ctx, wv, QKV_F32);
    }
    qkv_set_requires_grad(ctx, wq, true);
    qkv_set_requires_grad(ctx, wk, true);
    qkv_set_requires_grad(ctx, wv, true);
    qkv_tensor *q = qkv_projection(ctx, x, wq, NULL);     // Q = X W^Q        [B, n, d_k]
    qkv_tensor *k = qkv_projection(ctx, x, wk, NULL);     // K = X W^K        [B, n, d_k]
    qkv_tensor *vals = qkv_projection(ctx, x, wv, NULL);  // Vals = X W^V     [B, n, V]
    qkv_tensor *raw = qkv_matmul(ctx, q, k, QKV_TRANS_B); // Q K^T            [B, n, n]
    qkv_tensor *s = qkv_scale(ctx, raw, scale);           // S = s Q K^T
    qkv_tensor *a = qkv_softmax(ctx, s, NULL, 0);         // A = softmax(S)
    qkv_tensor *o = qkv_matmul(ctx, a, vals, 0);          // O = A Vals       [B, n, V]
    qkv_tensor *loss = qkv_cross_entropy(ctx, o, targets); // L = mean -log softmax(O)[target]
    if (qkv_backward(ctx, loss, NULL) != QKV_OK || !a->grad || !s->grad || !wq->grad) return false;
    if (dt == 0) {
        double mean, std;
        study_mean_std(qkv_f64(raw), raw->numel, &mean, &std);
        c->score_std += std;
        double top = 0;
        for (int64_t row = 0; row < B * n; row++) {
            double m = 0;
            for (int64_t j = 0; j < n; j++) m = fmax(m, qkv_f64(a)[row * n + j]);
            top += m;
        }
        c->max_weight += top / (double)(B * n);
    }
    c->dA[dt] += frobenius(a->grad);
    c->dS[dt] += frobenius(s->grad);
    c->dWq[dt] += frobenius(wq->grad);
    c->dS_zero[dt] += zero_share(s->grad);
    double median, zero_rows;
    if (!row_figures(s->grad, B * n, n, &median, &zero_rows)) return false;
    c->dS_median[dt] += median;
    c->dS_row_zero[dt] += zero_rows;
    qkv_step_end(ctx);
    return true;
}

static bool write_outputs(const study_options *opt, const study_gradients_result *r);

bool study_gradients(const study_options *opt, study_gradients_result *r) {
    memset(r, 0, sizeof *r);
    r->batch = opt->quick ? 8 : 16;
    r->n = 16;
    r->d_model = 64;
    r->vocab = 16;
    r->trials = opt->quick ? 1 : 8;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    if (!ctx) return false;
    bool ok = true;
    for (int64_t d_k = 2; ok && d_k <= 1024 && r->count < STUDY_MAX_DK; d_k *= 2) {
        int i = r->count++;
        r->d_k[i] = d_k;
        for (int sc = 0; ok && sc < STUDY_SCALES; sc++) {
            study_gradient_cell *c = &r->cell[i][sc];
            for (int64_t t = 0; ok && t < r->trials; t++)
                for (int dt = 0; ok && dt < 2; dt++)
                    ok = one_trial(ctx, r, d_k, study_scale_value(sc, d_k), dt,
                                   opt->seed * 4 + 3 + 1000003 * (uint64_t)(t * 2048 + d_k), c);
            double inv = 1.0 / (double)r->trials; /* sums over trials -> means */
            c->score_std *= inv, c->max_weight *= inv;
            for (int dt = 0; dt < 2; dt++) {
                c->dA[dt] *= inv, c->dS[dt] *= inv, c->dWq[dt] *= inv;
                c->dS_zero[dt] *= inv, c->dS_median[dt] *= inv, c->dS_row_zero[dt] *= inv;
            }
        }
    }
    if (!ok) fprintf(stderr, "softmax_study: part 3: %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return ok && write_outputs(opt, r);
}

static bool write_outputs(const study_options *opt, const study_gradients_result *r) {
    FILE *log = opt->log;
    if (log) {
        fprintf(log,
                "\nPart 3. Gradients at initialisation: B %lld, n %lld, d_model %lld, V %lld, W ~ N(0, 1/d_model), "
                "mean of %lld trial(s)\n",
                (long long)r->batch, (long long)r->n, (long long)r->d_model, (long long)r->vocab,
                (long long)r->trials);
        fprintf(log, "%6s %12s %8s %6s %7s | %9s %9s %9s | %8s %8s %8s | %9s %9s\n", "", "", "", "", "",
                "|dL/dS|", "median", "row", "dL/dS", "dL/dS", "rows", "|dL/dWq|", "");
        fprintf(log, "%6s %12s %8s %6s %7s | %9s %9s %9s | %8s %8s %8s | %9s %9s\n", "d_k", "scale", "std QKt",
                "max a", "|dL/dA|", "f64", "f64", "f32", "==0 f64", "==0 f32", "==0 f32", "f64", "f32");
        for (int i = 0; i < r->count; i++)
            for (int s = 0; s < STUDY_SCALES; s++) {
                const study_gradient_cell *c = &r->cell[i][s];
                fprintf(log, "%6lld %12s %8.3f %6.3f %7.4f | %9.2e %9.2e %9.2e | %7.2f%% %7.2f%% %7.2f%% | %9.2e %9.2e\n",
                        (long long)r->d_k[i], study_scale_name(s), c->score_std, c->max_weight, c->dA[0], c->dS[0],
                        c->dS_median[0], c->dS_median[1], 100 * c->dS_zero[0], 100 * c->dS_zero[1],
                        100 * c->dS_row_zero[1], c->dWq[0], c->dWq[1]);
            }
    }
    atomic_file csv_file;
    FILE *csv = study_open(opt, "part3_gradients.csv", &csv_file);
    if (!csv) return false;
    fprintf(csv, "d_k,scale,scale_value,dtype,batch,n,d_model,vocab,trials,score_std,max_weight,norm_dL_dA,norm_dL_dS,"
                 "median_row_norm_dL_dS,share_dL_dS_zero,share_rows_dL_dS_zero,norm_dL_dWq\n");
    for (int i = 0; i < r->count; i++)
        for (int s = 0; s < STUDY_SCALES; s++)
            for (int dt = 0; dt < 2; dt++) {
                const study_gradient_cell *c = &r->cell[i][s];
                fprintf(csv, "%lld,%s,%.9g,%s,%lld,%lld,%lld,%lld,%lld,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g\n",
                        (long long)r->d_k[i], study_scale_name(s), study_scale_value(s, r->d_k[i]),
                        dt ? "f32" : "f64", (long long)r->batch, (long long)r->n, (long long)r->d_model,
                        (long long)r->vocab, (long long)r->trials, c->score_std, c->max_weight, c->dA[dt], c->dS[dt],
                        c->dS_median[dt], c->dS_zero[dt], c->dS_row_zero[dt], c->dWq[dt]);
            }
    if (!study_close(&csv_file, "part3_gradients.csv")) return false;

    /* [scale][dtype][d_k] columns for the plots */
    double x[STUDY_MAX_DK], ds[STUDY_SCALES][2][STUDY_MAX_DK], med[STUDY_SCALES][2][STUDY_MAX_DK];
    double dw[STUDY_SCALES][2][STUDY_MAX_DK], zero[STUDY_SCALES][2][STUDY_MAX_DK];
    for (int i = 0; i < r->count; i++) {
        x[i] = (double)r->d_k[i];
        for (int s = 0; s < STUDY_SCALES; s++)
            for (int dt = 0; dt < 2; dt++) {
                const study_gradient_cell *c = &r->cell[i][s];
                ds[s][dt][i] = c->dS[dt], med[s][dt][i] = c->dS_median[dt];
                dw[s][dt][i] = c->dWq[dt], zero[s][dt][i] = c->dS_zero[dt];
            }
    }
    char names[STUDY_SCALES][2][48];
    plot_series ss[2 * STUDY_SCALES], ms[2 * STUDY_SCALES], ws[2 * STUDY_SCALES], zs[2 * STUDY_SCALES];
    plot_style style[2 * STUDY_SCALES];
    for (int s = 0; s < STUDY_SCALES; s++)
        for (int dt = 0; dt < 2; dt++) {
            int j = 2 * s + dt;
            snprintf(names[s][dt], sizeof names[s][dt], "%s, %s", study_scale_name(s), dt ? "f32" : "f64");
            ss[j] = (plot_series){names[s][dt], x, ds[s][dt], r->count};
            ms[j] = (plot_series){names[s][dt], x, med[s][dt], r->count};
            ws[j] = (plot_series){names[s][dt], x, dw[s][dt], r->count};
            zs[j] = (plot_series){names[s][dt], x, zero[s][dt], r->count};
            style[j] = (plot_style){study_scale_color(s), dt ? "8 4" : NULL, dt ? PLOT_MARKER_DIAMOND : PLOT_MARKER_CIRCLE};
        }
    bool ok = study_lines(opt, "part3_dS.svg", "Part 3: |dL/dS| over the batch, through the softmax Jacobian", "d_k",
                          "Frobenius norm", ss, 2 * STUDY_SCALES, true, true, style);
    ok = study_lines(opt, "part3_dS_median.svg", "Part 3: median row |dL/dS_i| (an exact 0 is not drawn)", "d_k",
                     "norm of one row", ms, 2 * STUDY_SCALES, true, true, style) && ok;
    ok = study_lines(opt, "part3_dWq.svg", "Part 3: |dL/dW^Q| at initialisation", "d_k", "Frobenius norm", ws,
                     2 * STUDY_SCALES, true, true, style) && ok;
    ok = study_lines(opt, "part3_zeros.svg", "Part 3: share of dL/dS entries that are exactly 0", "d_k", "share",
                     zs, 2 * STUDY_SCALES, true, false, style) && ok;
    return ok;
}
