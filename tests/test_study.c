/*
 * test_study.c — the scaling study (examples/softmax_study) in its quick mode, in-process: each part runs
 * into its own temporary folder; the test checks that every CSV and SVG file is written, the numbers of
 * part 1 within sampling error, and at least one qualitative fact per part that must hold; and that the quick
 * part 4 table docs/scaling.md quotes is what a fresh quick run prints (tests/doc_quotes.h).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "doc_quotes.h"
#include "study.h"

/* A fresh temporary folder for one part's files. */
static study_options quick_options(char *dir, size_t size) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/qkv_study_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(dir), "cannot make a temporary folder %s", dir);
    study_options opt = {dir, true, 0, NULL};
    return opt;
}

/* Each file exists, is non-empty, and starts as its kind must ("<svg" / a CSV header line). */
static void expect_files(const char *dir, const char *const *names, int count) {
    for (int i = 0; i < count; i++) {
        char path[4096], head[8] = "";
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s was not written", path);
        cr_expect_gt(st.st_size, 100, "%s has only %lld bytes", path, (long long)st.st_size);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f, "%s cannot be read", path);
        size_t got = fread(head, 1, 4, f);
        fclose(f);
        cr_expect_eq(got, 4, "%s", path);
        if (strstr(names[i], ".svg")) cr_expect_eq(strncmp(head, "<svg", 4), 0, "%s is not an SVG", path);
        else cr_expect(strncmp(head, "d_k,", 4) == 0 || strncmp(head, "embe", 4) == 0, "%s: no CSV header", path);
    }
}

/* Remove the folder and its files (only after the checks passed, so a failure leaves them to look at). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

Test(study, part1_spread_is_sqrt_dk_within_sampling_error) {
    char dir[4096];
    study_options opt = quick_options(dir, sizeof dir);
    static study_spread_result r;
    cr_assert(study_spread(&opt, &r), "part 1 failed");
    const char *files[] = {"part1_spread.csv", "part1_spread.svg"};
    expect_files(dir, files, 2);
    cr_assert_eq(r.count, 10, "d_k = 2 ... 1024 is 10 values, got %d", r.count);
    cr_assert_geq(r.samples, 1000);
    /* 4 standard errors: with 10 d_k values and a fixed seed, a correct study fails this with
     * probability about 6e-4 per seed; a study off by 10% fails it at every d_k >= 4. */
    int bad = 0;
    for (int i = 0; i < r.count; i++) {
        double d = (double)r.d_k[i], root = sqrt(d), n = (double)r.samples;
        double se = root * sqrt((2 + 6 / d) / (4 * n)); /* the sample std's standard error */
        cr_expect_eq(r.d_k[i], (int64_t)2 << i);
        cr_expect_float_eq(r.se[i], se, 1e-12 * se, "the reported standard error at d_k %g", d);
        if (!(fabs(r.std[i] - root) <= 4 * se)) {
            bad++;
            cr_log_error("d_k %g: std(q.k) %.4f, sqrt(d_k) %.4f, 4 se %.4f", d, r.std[i], root, 4 * se);
        }
        if (!(fabs(r.std_sqrt[i] - 1) <= 4 * se / root)) {
            bad++;
            cr_log_error("d_k %g: std(q.k / sqrt(d_k)) %.4f, want 1 +- %.4f", d, r.std_sqrt[i], 4 * se / root);
        }
        if (!(fabs(r.std_dk[i] - 1 / root) <= 4 * se / d)) {
            bad++;
            cr_log_error("d_k %g: std(q.k / d_k) %.5f, want %.5f", d, r.std_dk[i], 1 / root);
        }
        if (!(fabs(r.mean[i]) <= 4 * root / sqrt(n))) { /* the mean's standard error is sqrt(d_k / N) */
            bad++;
            cr_log_error("d_k %g: mean(q.k) %.4f, want 0 +- %.4f", d, r.mean[i], 4 * root / sqrt(n));
        }
    }
    cr_expect_eq(bad, 0, "%d figures of part 1 outside 4 standard errors", bad);
    /* the seed quotes std 8 at d_k = 64 and about 11.3 at d_k = 128 */
    cr_expect(fabs(r.std[5] - 8) < 4 * r.se[5], "std at d_k 64: %.3f", r.std[5]);
    cr_expect(fabs(r.std[6] - 11.3137) < 4 * r.se[6], "std at d_k 128: %.3f", r.std[6]);
    remove_dir(dir);
}

Test(study, part2_scale_one_saturates_and_f32_rounds_to_zero) {
    char dir[4096];
    study_options opt = quick_options(dir, sizeof dir);
    static study_saturation_result r;
    cr_assert(study_saturation(&opt, &r), "part 2 failed");
    const char *files[] = {"part2_saturation.csv", "part2_max_weight.svg", "part2_entropy.svg",
                           "part2_underflow.svg"};
    expect_files(dir, files, 4);
    cr_assert_eq(r.count, 10);
    double ln_n = log((double)r.n_keys);
    const study_saturation_cell *one = &r.cell[9][STUDY_SCALE_ONE]; /* d_k = 1024, scale 1 */
    cr_expect_gt(one->max_weight, 0.9, "scale 1, d_k 1024: mean largest weight %.4f", one->max_weight);
    cr_expect_lt(one->entropy / ln_n, 0.1, "scale 1, d_k 1024: H / ln n %.4f", one->entropy / ln_n);
    cr_expect_gt(one->zero_f32, 0.01, "scale 1, d_k 1024: f32 weights exactly 0: %.4f", one->zero_f32);
    cr_expect_gt(one->below_1e6, 0.5, "scale 1, d_k 1024: weights < 1e-6: %.4f", one->below_1e6);
    /* scale 1 grows monotonically more one-hot with d_k */
    int bad = 0;
    for (int i = 1; i < r.count; i++) bad += !(r.cell[i][STUDY_SCALE_ONE].max_weight > r.cell[i - 1][STUDY_SCALE_ONE].max_weight);
    cr_expect_eq(bad, 0, "scale 1: the mean largest weight is not increasing in d_k at %d steps", bad);
    /* 1/sqrt(d_k): roughly flat, never near one-hot, nothing underflows, in f32 or f64 */
    double lo = INFINITY, hi = -INFINITY;
    bad = 0;
    for (int i = 0; i < r.count; i++) {
        const study_saturation_cell *c = &r.cell[i][STUDY_SCALE_SQRT];
        lo = fmin(lo, c->max_weight), hi = fmax(hi, c->max_weight);
        bad += !(fabs(c->score_std - 1) < 0.1) + !(c->entropy / ln_n > 0.8) + (c->zero_f32 != 0) +
               (c->subnormal_f32 != 0) + (c->below_1e6 != 0);
        bad += r.cell[i][STUDY_SCALE_ONE].zero_f64 != 0; /* f64 never reaches exp(-745) here */
        bad += !(r.cell[i][STUDY_SCALE_DK].entropy >= c->entropy); /* 1/d_k is flatter still */
    }
    cr_expect_eq(bad, 0, "%d facts of part 2 do not hold", bad);
    cr_expect_lt(hi / lo, 1.5, "1/sqrt(d_k): the mean largest weight ranges over [%.4f, %.4f]", lo, hi);
    cr_expect_gt(r.cell[9][STUDY_SCALE_DK].entropy / ln_n, 0.99, "1/d_k at d_k 1024 is nearly uniform");
    remove_dir(dir);
}

Test(study, part3_gradient_of_a_typical_row_vanishes_without_the_scale) {
    char dir[4096];
    study_options opt = quick_options(dir, sizeof dir);
    static study_gradients_result r;
    cr_assert(study_gradients(&opt, &r), "part 3 failed");
    const char *files[] = {"part3_gradients.csv", "part3_dS.svg", "part3_dS_median.svg", "part3_dWq.svg",
                           "part3_zeros.svg"};
    expect_files(dir, files, 5);
    cr_assert_eq(r.count, 10);
    const study_gradient_cell *one = &r.cell[9][STUDY_SCALE_ONE], *root = &r.cell[9][STUDY_SCALE_SQRT];
    /* the seed's assumption holds by construction: raw scores have std close to sqrt(d_k) */
    int bad = 0;
    for (int i = 5; i < r.count; i++) /* d_k >= 64: enough columns for the draw of W to average out */
        if (!(fabs(r.cell[i][0].score_std / sqrt((double)r.d_k[i]) - 1) < 0.1)) {
            bad++;
            cr_log_error("d_k %lld: std of Q K^T %.3f", (long long)r.d_k[i], r.cell[i][0].score_std);
        }
    cr_expect_eq(bad, 0);
    cr_expect_lt(one->dS_median[0], 1e-3 * root->dS_median[0],
                 "d_k 1024: median row |dL/dS| with scale 1 %.3e, with 1/sqrt(d_k) %.3e", one->dS_median[0],
                 root->dS_median[0]);
    cr_expect_gt(one->dS_zero[1], one->dS_zero[0], "f32 underflow gives more exact zeros than f64");
    cr_expect_gt(one->dS_zero[1], 0.01, "scale 1, d_k 1024: share of f32 dL/dS exactly 0: %.4f", one->dS_zero[1]);
    /* with 1/sqrt(d_k) the typical row's gradient is flat in d_k, and f32 agrees with f64 */
    double lo = INFINITY, hi = -INFINITY;
    bad = 0;
    for (int i = 0; i < r.count; i++) {
        const study_gradient_cell *c = &r.cell[i][STUDY_SCALE_SQRT];
        lo = fmin(lo, c->dS_median[0]), hi = fmax(hi, c->dS_median[0]);
        bad += c->dS_zero[1] != 0 || !(fabs(c->dS[1] / c->dS[0] - 1) < 1e-3);
    }
    cr_expect_eq(bad, 0, "1/sqrt(d_k): f32 has zeros or differs from f64 at %d d_k", bad);
    cr_expect_lt(hi / lo, 2, "1/sqrt(d_k): median row |dL/dS| ranges over [%.3e, %.3e]", lo, hi);
    /* 1/d_k shrinks dL/dW^Q as d_k grows (the factor s = 1/d_k is in dL/dQ = s dS K) */
    cr_expect_lt(r.cell[9][STUDY_SCALE_DK].dWq[0], 0.1 * r.cell[0][STUDY_SCALE_DK].dWq[0]);
    remove_dir(dir);
}

Test(study, part4_training_copy_task) {
    char dir[4096];
    study_options opt = quick_options(dir, sizeof dir);
    static study_training_result r;
    char *printed = NULL;
    size_t printed_len = 0;
    opt.log = open_memstream(&printed, &printed_len); /* the table, for the page's quoted lines below */
    cr_assert_not_null(opt.log);
    cr_assert(study_training(&opt, &r), "part 4 failed");
    cr_assert_eq(fclose(opt.log), 0);
    const char *files[] = {"part4_training.csv", "part4_curves.csv", "part4_accuracy_gauss.svg",
                           "part4_entropy_gauss.svg", "part4_accuracy_onehot.svg", "part4_entropy_onehot.svg"};
    expect_files(dir, files, 6);
    cr_assert_eq(r.n_dk, 3);
    cr_assert_eq(r.n_seeds, 1);
    double ln_n = log((double)r.n_tokens);
    int bad = 0;
    for (int i = 0; i < r.n_dk; i++) {
        const study_run *g_root = &r.run[STUDY_EMBED_GAUSS][i][STUDY_SCALE_SQRT][0];
        const study_run *g_one = &r.run[STUDY_EMBED_GAUSS][i][STUDY_SCALE_ONE][0];
        const study_run *o_one = &r.run[STUDY_EMBED_ONEHOT][i][STUDY_SCALE_ONE][0];
        const study_run *o_dk = &r.run[STUDY_EMBED_ONEHOT][i][STUDY_SCALE_DK][0];
        /* gauss: at initialisation scale 1 already concentrates the attention */
        bad += !(g_one->init_entropy < 0.5 * g_root->init_entropy);
        /* one-hot: the scores are tiny (std < 1 even unscaled), so scale 1 starts near uniform */
        bad += !(o_one->init_score_std < 1) + !(o_one->init_entropy > 0.9 * ln_n);
        /* one-hot with 1/d_k learns the copy task within the quick budget */
        bad += !(o_dk->best_accuracy >= 0.99);
        if (bad) cr_log_error("d_k %lld: a fact of part 4 fails (count %d)", (long long)r.d_k[i], bad);
    }
    cr_expect_eq(bad, 0, "%d facts of part 4 do not hold", bad);
    /* Xavier init with d_model 64: q's components are not unit variance unless d_k is near d_model */
    cr_expect_gt(r.run[STUDY_EMBED_GAUSS][0][0][0].init_q_std, 1.2, "d_k 16: std of q_c");
    cr_expect_lt(r.run[STUDY_EMBED_GAUSS][2][0][0].init_q_std, 0.9, "d_k 256: std of q_c");
    /* gauss, d_k 256: scale 1 collapses the attention during training and does worse than 1/d_k */
    const study_run *one = &r.run[STUDY_EMBED_GAUSS][2][STUDY_SCALE_ONE][0];
    const study_run *dk = &r.run[STUDY_EMBED_GAUSS][2][STUDY_SCALE_DK][0];
    cr_expect_lt(one->final_entropy, 0.1, "gauss d_k 256 scale 1: final entropy %.4f", one->final_entropy);
    cr_expect_lt(one->best_accuracy, dk->best_accuracy, "gauss d_k 256: scale 1 %.4f, 1/d_k %.4f",
                 one->best_accuracy, dk->best_accuracy);
    /* docs/scaling.md quotes this quick run's table (the header and 18 rows): every line as printed now */
    int quoted = doc_quotes_check(QKV_DOCS_DIR "/scaling.md", "part4", printed);
    if (quoted >= 0) cr_expect_geq(quoted, 19, "docs/scaling.md quotes %d lines of the quick part 4, not 19", quoted);
    free(printed);
    remove_dir(dir);
}
