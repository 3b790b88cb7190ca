/*
 * study_saturation.c — part 2: how close to one-hot a softmax row gets as d_k grows.
 *
 * A row of n keys: scores z_j = s q.k_j with q, k_j ~ N(0, I_{d_k}), so z has std s sqrt(d_k):
 * sqrt(d_k) with s = 1, 1 with s = 1/sqrt(d_k), 1/sqrt(d_k) with s = 1/d_k. Once the gap between the
 * largest score and the rest is >> 1 the row is one-hot. In f32, a weight exp(z_j - max z) below
 * FLT_MIN (1.2e-38, a gap of 87) is subnormal or 0: qkv's f32 softmax kernel flushes it to 0, a kernel
 * that rounds a double result keeps it as a subnormal down to 1.4e-45 (a gap of 103).
 *   Q [G, r, d_k], K [G, n, d_k] -> Z = s Q K^T [G, r, n] -> A = softmax(Z) [G, r, n]
 * (G groups of r query rows; the rows of a group share their n keys). The f64 and f32 columns are the
 * same draws, the f32 ones converted and sent through qkv's f32 matmul, scale and softmax.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "qkv.h"
#include "study.h"

/* Statistics of one softmax, a [rows, n] in f64 and a32 [rows, n] in f32, into c. */
static void row_stats(const double *a, const float *a32, int64_t rows, int64_t n, study_saturation_cell *c) {
    double max_sum = 0, h_sum = 0;
    int64_t below = 0, subnormal = 0, zero32 = 0, zero64 = 0, onehot = 0;
    for (int64_t i = 0; i < rows; i++) {
        const double *p = a + i * n;
        const float *p32 = a32 + i * n;
        double top = 0, h = 0;
        float top32 = 0;
        for (int64_t j = 0; j < n; j++) {
            top = fmax(top, p[j]);
            if (p[j] > 0) h -= p[j] * log(p[j]); // H = -sum_j a_j ln a_j
            below += p[j] < 1e-6;
            zero64 += p[j] == 0;
            subnormal += fpclassify(p32[j]) == FP_SUBNORMAL;
            zero32 += p32[j] == 0.0f;
            top32 = fmaxf(top32, p32[j]);
        }
        max_sum += top;
        h_sum += h;
        onehot += top32 == 1.0f;
    }
    double total = (double)(rows * n);
    c->max_weight = max_sum / (double)rows;
    c->entropy = h_sum / (double)rows;
    c->below_1e6 = (double)below / total;
    c->subnormal_f32 = (double)subnormal / total;
    c->zero_f32 = (double)zero32 / total;
    c->zero_f64 = (double)zero64 / total;
    c->onehot_f32 = (double)onehot / (double)rows;
}

static bool write_outputs(const study_options *opt, const study_saturation_result *r);

bool study_saturation(const study_options *opt, study_saturation_result *r) {
    memset(r, 0, sizeof *r);
    int64_t G = opt->quick ? 8 : 32, rq = opt->quick ? 16 : 32, n = 64;
    r->n_keys = n;
    r->rows = G * rq;
    qkv_options o = qkv_default_options();
    o.seed = opt->seed * 4 + 2;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return false;
    for (int64_t d_k = 2; d_k <= 1024 && r->count < STUDY_MAX_DK; d_k *= 2) {
        int i = r->count++;
        r->d_k[i] = d_k;
        qkv_tensor *q = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){G, rq, d_k}, 0, 1); // [G, r, d_k]
        qkv_tensor *k = qkv_randn(ctx, QKV_F64, 3, (int64_t[]){G, n, d_k}, 0, 1);  // [G, n, d_k]
        qkv_tensor *raw = qkv_matmul(ctx, q, k, QKV_TRANS_B);                     // Q K^T [G, r, n]
        qkv_tensor *raw32 = qkv_matmul(ctx, qkv_to_dtype(ctx, q, QKV_F32), qkv_to_dtype(ctx, k, QKV_F32),
                                       QKV_TRANS_B); // the same in f32
        for (int s = 0; s < STUDY_SCALES; s++) {
            double scale = study_scale_value(s, d_k);
            qkv_tensor *z = qkv_scale(ctx, raw, scale);                                   // Z = s Q K^T
            qkv_tensor *a = qkv_softmax(ctx, z, NULL, 0);                                 // A = softmax(Z)
            qkv_tensor *a32 = qkv_softmax(ctx, qkv_scale(ctx, raw32, scale), NULL, 0); // in f32
            if (!a || !a32) break;
            double mean;
            study_mean_std(qkv_f64(z), z->numel, &mean, &r->cell[i][s].score_std);
            row_stats(qkv_f64(a), qkv_f32(a32), G * rq, n, &r->cell[i][s]);
        }
        qkv_step_end(ctx);
    }
    bool ok = !qkv_error(ctx);
    if (!ok) fprintf(stderr, "softmax_study: part 2: %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return ok && write_outputs(opt, r);
}

static bool write_outputs(const study_options *opt, const study_saturation_result *r) {
    double log_n = log((double)r->n_keys);
    FILE *log = opt->log;
    if (log) {
        fprintf(log, "\nPart 2. Saturation of a softmax row of n = %lld keys (%lld rows per d_k); ln n = %.3f\n",
                (long long)r->n_keys, (long long)r->rows, log_n);
        fprintf(log, "%6s %12s %9s %8s %8s %10s %10s %9s %11s\n", "d_k", "scale", "std(z)", "max a", "H/ln n",
                "a<1e-6", "f32 subn", "f32 == 0", "f32 a==1 rows");
        for (int i = 0; i < r->count; i++)
            for (int s = 0; s < STUDY_SCALES; s++) {
                const study_saturation_cell *c = &r->cell[i][s];
                fprintf(log, "%6lld %12s %9.3f %8.4f %8.4f %9.2f%% %9.3f%% %8.2f%% %10.1f%%\n", (long long)r->d_k[i],
                        study_scale_name(s), c->score_std, c->max_weight, c->entropy / log_n, 100 * c->below_1e6,
                        100 * c->subnormal_f32, 100 * c->zero_f32, 100 * c->onehot_f32);
            }
    }
    atomic_file csv_file;
    FILE *csv = study_open(opt, "part2_saturation.csv", &csv_file);
    if (!csv) return false;
    fprintf(csv, "d_k,scale,scale_value,n_keys,rows,score_std,max_weight,entropy,entropy_over_log_n,share_below_1e-6,"
                 "share_subnormal_f32,share_zero_f32,share_zero_f64,share_rows_max_is_1_f32\n");
    for (int i = 0; i < r->count; i++)
        for (int s = 0; s < STUDY_SCALES; s++) {
            const study_saturation_cell *c = &r->cell[i][s];
            fprintf(csv, "%lld,%s,%.9g,%lld,%lld,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g\n", (long long)r->d_k[i],
                    study_scale_name(s), study_scale_value(s, r->d_k[i]), (long long)r->n_keys, (long long)r->rows,
                    c->score_std, c->max_weight, c->entropy, c->entropy / log_n, c->below_1e6, c->subnormal_f32,
                    c->zero_f32, c->zero_f64, c->onehot_f32);
        }
    if (!study_close(&csv_file, "part2_saturation.csv")) return false;

    /* [scale][d_k] columns for the plots */
    double x[STUDY_MAX_DK], uniform[STUDY_MAX_DK], top[STUDY_SCALES][STUDY_MAX_DK], h[STUDY_SCALES][STUDY_MAX_DK];
    double below[STUDY_SCALES][STUDY_MAX_DK], sub[STUDY_SCALES][STUDY_MAX_DK], zero[STUDY_SCALES][STUDY_MAX_DK];
    for (int i = 0; i < r->count; i++) {
        x[i] = (double)r->d_k[i];
        uniform[i] = 1.0 / (double)r->n_keys;
        for (int s = 0; s < STUDY_SCALES; s++) {
            const study_saturation_cell *c = &r->cell[i][s];
            top[s][i] = c->max_weight, h[s][i] = c->entropy / log_n;
            below[s][i] = c->below_1e6, sub[s][i] = c->subnormal_f32, zero[s][i] = c->zero_f32;
        }
    }
    char names[STUDY_SCALES][3][64];
    plot_series ts[STUDY_SCALES + 1], hs[STUDY_SCALES], us[3 * STUDY_SCALES];
    plot_style ustyle[3 * STUDY_SCALES];
    for (int s = 0; s < STUDY_SCALES; s++) {
        snprintf(names[s][0], sizeof names[s][0], "%s: a < 1e-6", study_scale_name(s));
        snprintf(names[s][1], sizeof names[s][1], "%s: f32 == 0", study_scale_name(s));
        snprintf(names[s][2], sizeof names[s][2], "%s: f32 subn.", study_scale_name(s));
        ts[s] = (plot_series){study_scale_name(s), x, top[s], r->count};
        hs[s] = (plot_series){study_scale_name(s), x, h[s], r->count};
        us[3 * s] = (plot_series){names[s][0], x, below[s], r->count};
        us[3 * s + 1] = (plot_series){names[s][1], x, zero[s], r->count};
        us[3 * s + 2] = (plot_series){names[s][2], x, sub[s], r->count};
        ustyle[3 * s] = (plot_style){study_scale_color(s), NULL, PLOT_MARKER_CIRCLE};
        ustyle[3 * s + 1] = (plot_style){study_scale_color(s), "8 4", PLOT_MARKER_SQUARE};
        ustyle[3 * s + 2] = (plot_style){study_scale_color(s), "2 3", PLOT_MARKER_TRIANGLE};
    }
    ts[STUDY_SCALES] = (plot_series){"1/n (uniform row)", x, uniform, r->count};
    plot_style tstyle[STUDY_SCALES + 1];
    for (int s = 0; s < STUDY_SCALES; s++) tstyle[s] = (plot_style){study_scale_color(s), NULL, study_scale_marker(s)};
    tstyle[STUDY_SCALES] = (plot_style){"#7f7f7f", "6 4", PLOT_MARKER_NONE}; /* a reference: dashed, no marks */
    char title[128];
    snprintf(title, sizeof title, "Part 2: mean largest weight of a softmax row of %lld keys", (long long)r->n_keys);
    bool ok = study_lines(opt, "part2_max_weight.svg", title, "d_k", "mean max_j a_j", ts, STUDY_SCALES + 1, true,
                          false, tstyle);
    ok = study_lines(opt, "part2_entropy.svg", "Part 2: attention entropy over its maximum ln n", "d_k",
                     "H / ln n", hs, STUDY_SCALES, true, false, tstyle) && ok;
    ok = study_lines(opt, "part2_underflow.svg", "Part 2: share of weights that vanish (by scale)", "d_k", "share of weights",
                     us, 3 * STUDY_SCALES, true, false, ustyle) && ok;
    return ok;
}
