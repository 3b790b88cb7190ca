/*
 * study_spread.c — part 1: the spread of q.k.
 *
 * For N independent pairs q, k in R^{d_k} with N(0, 1) components, q.k = sum_c q_c k_c has mean 0 and
 * variance d_k (each product has variance 1), so its std is sqrt(d_k): 8 at d_k = 64, 11.3 at 128.
 * Multiplying by 1/sqrt(d_k) brings the std back to 1; by 1/d_k it falls to 1/sqrt(d_k).
 *   q, k [N, 1, d_k]  ->  s = q k^T [N, 1, 1]  (N dot products as a batch of 1x1 matmuls)
 *
 * Sampling error: q.k has kurtosis 3 + 6/d_k (a product of two normals has fourth moment 9), so the
 * sample std has standard error sigma * sqrt((2 + 6/d_k) / (4N)) (-> sigma / sqrt(2N) for large d_k).
 */
#include <math.h>
#include <string.h>

#include "plot.h"
#include "qkv.h"
#include "study.h"

bool study_spread(const study_options *opt, study_spread_result *r) {
    memset(r, 0, sizeof *r);
    r->samples = opt->quick ? 4000 : 20000;
    qkv_options o = qkv_default_options();
    o.seed = opt->seed * 4 + 1;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return false;
    int64_t N = r->samples;
    for (int64_t d_k = 2; d_k <= 1024 && r->count < STUDY_MAX_DK; d_k *= 2) {
        int i = r->count++;
        int64_t shape[3] = {N, 1, d_k};
        qkv_tensor *q = qkv_randn(ctx, QKV_F64, 3, shape, 0, 1);        // q_c ~ N(0, 1)   [N, 1, d_k]
        qkv_tensor *k = qkv_randn(ctx, QKV_F64, 3, shape, 0, 1);        // k_c ~ N(0, 1)   [N, 1, d_k]
        qkv_tensor *s = qkv_matmul(ctx, q, k, QKV_TRANS_B);              // s = q.k         [N, 1, 1]
        qkv_tensor *s_sqrt = qkv_scale(ctx, s, 1 / sqrt((double)d_k)); // s / sqrt(d_k)
        qkv_tensor *s_dk = qkv_scale(ctx, s, 1 / (double)d_k);         // s / d_k
        if (!s_sqrt || !s_dk) break;
        double unused;
        r->d_k[i] = d_k;
        study_mean_std(qkv_f64(s), N, &r->mean[i], &r->std[i]);
        study_mean_std(qkv_f64(s_sqrt), N, &unused, &r->std_sqrt[i]);
        study_mean_std(qkv_f64(s_dk), N, &unused, &r->std_dk[i]);
        r->se[i] = sqrt((double)d_k) * sqrt((2 + 6.0 / (double)d_k) / (4.0 * (double)N));
        qkv_step_end(ctx);
    }
    if (qkv_error(ctx)) {
        fprintf(stderr, "softmax_study: part 1: %s\n", qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
        return false;
    }
    qkv_ctx_free(ctx);

    FILE *log = opt->log;
    if (log) {
        fprintf(log, "\nPart 1. Spread of q.k for q, k with independent N(0,1) components, %lld pairs per d_k\n",
                (long long)N);
        fprintf(log, "%6s %10s %10s %9s %8s %8s %14s %10s\n", "d_k", "mean q.k", "std q.k", "sqrt(d_k)", "ratio",
                "+-se", "std q.k/sqrt", "std q.k/d_k");
        for (int i = 0; i < r->count; i++)
            fprintf(log, "%6lld %10.4f %10.4f %9.4f %8.4f %8.4f %14.4f %10.4f\n", (long long)r->d_k[i], r->mean[i],
                    r->std[i], sqrt((double)r->d_k[i]), r->std[i] / sqrt((double)r->d_k[i]), r->se[i],
                    r->std_sqrt[i], r->std_dk[i]);
    }

    atomic_file csv_file;
    FILE *csv = study_open(opt, "part1_spread.csv", &csv_file);
    if (!csv) return false;
    fprintf(csv, "d_k,samples,mean_qk,std_qk,sqrt_dk,std_over_sqrt_dk,se_std,std_qk_scaled_sqrt,std_qk_scaled_dk\n");
    for (int i = 0; i < r->count; i++)
        fprintf(csv, "%lld,%lld,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g\n", (long long)r->d_k[i], (long long)N, r->mean[i],
                r->std[i], sqrt((double)r->d_k[i]), r->std[i] / sqrt((double)r->d_k[i]), r->se[i], r->std_sqrt[i],
                r->std_dk[i]);
    if (!study_close(&csv_file, "part1_spread.csv")) return false;

    double x[STUDY_MAX_DK], root[STUDY_MAX_DK];
    for (int i = 0; i < r->count; i++) x[i] = (double)r->d_k[i], root[i] = sqrt(x[i]);
    plot_series series[] = {
        {"std(q.k), measured", x, r->std, r->count},
        {"sqrt(d_k), expected", x, root, r->count},
        {"std(q.k / sqrt(d_k))", x, r->std_sqrt, r->count},
        {"std(q.k / d_k)", x, r->std_dk, r->count},
    };
    /* colour: the scale applied (none is scale 1); the formula is a grey dashed reference under the marks */
    const plot_style styles[] = {
        {study_scale_color(STUDY_SCALE_ONE), NULL, study_scale_marker(STUDY_SCALE_ONE)},
        {"#555555", "7 4", PLOT_MARKER_NONE},
        {study_scale_color(STUDY_SCALE_SQRT), NULL, study_scale_marker(STUDY_SCALE_SQRT)},
        {study_scale_color(STUDY_SCALE_DK), NULL, study_scale_marker(STUDY_SCALE_DK)},
    };
    return study_lines(opt, "part1_spread.svg", "Part 1: spread of q.k for unit-variance q, k", "d_k",
                       "standard deviation", series, 4, true, true, styles);
}
