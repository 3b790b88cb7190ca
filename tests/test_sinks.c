/*
 * test_sinks.c — examples/sinks: the measures on hand-made inputs (a pattern and a model whose weights put all
 * attention on token 0 give sink rate 1; a uniform pattern gives the harmonic first-token weight; a planted
 * massive activation is found where it was put), the data (BOS only at position 0, every target kind what it
 * says), --data and --arms, and the quick run in-process: its files complete, its measures in range, the loss
 * falling in every arm, the StreamingLLM evaluations applied (recomputed by hand on a random model: BOS dropped,
 * the window shifted, the same targets scored), the same bits with 1 or 2 jobs, and the lines docs/sinks.md quotes from it (tests/doc_quotes.h).
 *
 * Bounds of the quick run: every arm's held-out loss fell from 4.98-5.01 to 2.11-2.12 (seed 0), 1.96-2.00
 * (seed 1), 1.85-1.89 (seed 2) (tree of 2026-12-04, AVX2 kernels; the six variant arms), and the gate and diff
 * arms' from 4.975 and 4.967 to 2.114 and 2.353 (seed 0); the test asks for a fall of 0.5 nats (the fall was
 * 2.6 nats or more). One head (gate) sinks in 200 steps: the quick run checks ranges, not the default run's
 * sinks (docs/sinks.md).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, open_memstream */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_quotes.h"
#include "sinks.h"
#include "stability.h"
#include "test_deadline.h"

/* A [BH, n, n] causal pattern: head h of every batch element puts all weight on key 0 when planted[h], else
 * spreads it evenly over keys 0..i. */
static float *pattern(int64_t B, int64_t H, int64_t n, const bool *planted) {
    float *A = calloc((size_t)(B * H * n * n), sizeof *A);
    cr_assert_not_null(A);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j <= i; j++) A[(bh * n + i) * n + j] = planted[bh % H] ? (j == 0) : 1.0f / (float)(i + 1);
    return A;
}

Test(sinks, head_stats_and_sink_rate_of_planted_patterns) {
    int64_t B = 3, H = 4, n = 16;
    bool planted[4] = {true, false, true, false};
    float *A = pattern(B, H, n, planted);
    double first[4], mass[4], entropy[4];
    sinks_head_stats(A, B * H, H, n, first, mass, entropy);
    double harmonic = 0, log_mean = 0; // mean over i in [1, n-1] of 1/(i+1) and of ln(i+1)
    for (int64_t i = 1; i < n; i++) harmonic += 1.0 / (double)(i + 1), log_mean += log((double)(i + 1));
    harmonic /= (double)(n - 1), log_mean /= (double)(n - 1);
    for (int h = 0; h < 4; h++) {
        cr_expect_float_eq(mass[h], 1.0, 1e-6, "head %d mass %g", h, mass[h]);
        if (planted[h]) {
            cr_expect_eq(first[h], 1.0, "planted head %d: first-token weight %g", h, first[h]);
            cr_expect_eq(entropy[h], 0.0, "planted head %d: entropy %g", h, entropy[h]);
        } else {
            cr_expect_float_eq(first[h], harmonic, 1e-6, "uniform head %d: %g, expected %g", h, first[h], harmonic);
            cr_expect_float_eq(entropy[h], log_mean, 1e-5, "uniform head %d: entropy %g, expected %g", h, entropy[h],
                               log_mean);
        }
    }
    cr_expect_eq(sinks_sink_rate(first, 4, SINKS_EPSILON), 0.5);
    cr_expect_eq(sinks_sink_rate(first, 1, SINKS_EPSILON), 1.0);
    cr_expect_eq(sinks_sink_rate(first + 1, 1, SINKS_EPSILON), 0.0); // 0.207 < 0.3
    double edge[2] = {SINKS_EPSILON, 0.3000001};
    cr_expect_eq(sinks_sink_rate(edge, 2, SINKS_EPSILON), 0.5, "the threshold is strict: > epsilon");
    // a row that spends half its weight (a softmax1-like head): mass 0.5, entropy of the row normalised
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < n * n; i++) A[bh * n * n + i] *= 0.5f;
    sinks_head_stats(A, B * H, H, n, first, mass, entropy);
    cr_expect_float_eq(mass[1], 0.5, 1e-6);
    cr_expect_float_eq(first[0], 0.5, 1e-7);
    cr_expect_float_eq(entropy[1], log_mean, 1e-5);
    free(A);
}

/* A one-layer softmax model whose weights put all attention on token 0: no norm, no positions, q = b_Q (W_Q 0),
 * k_j = W_K^T e(ids_j) with only BOS's embedding reaching the key, so score(i, 0) = 60 scale and every other
 * score 0. Its inspected pattern has sink rate 1; with b_Q = 0 every score is 0 and the weights are uniform. */
Test(sinks, a_hand_made_model_that_attends_to_token_0_has_sink_rate_1) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    cr_assert_not_null(ctx);
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 8, c.n_ctx = 12, c.d_model = 16, c.n_head = 4, c.n_layer = 1, c.d_mlp = 0;
    c.norm = QKV_NORM_NONE, c.positions = QKV_POS_NONE, c.attn_bias = true;
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    int64_t d = 16, dh = 4;
    float *E = qkv_f32(qkv_model_param(m, "embed.W_E")), *WQ = qkv_f32(qkv_model_param(m, "blocks.0.attn.W_Q"));
    float *WK = qkv_f32(qkv_model_param(m, "blocks.0.attn.W_K")), *bQ = qkv_f32(qkv_model_param(m, "blocks.0.attn.b_Q"));
    memset(E, 0, sizeof(float) * 8 * d);
    E[0 * d + 0] = 1; // BOS: e_0
    for (int t = 1; t < 8; t++) E[t * d + 1 + t] = 1; // the others: e_{1+t}, which W_K ignores
    memset(WQ, 0, sizeof(float) * d * d), memset(WK, 0, sizeof(float) * d * d);
    for (int64_t h = 0; h < 4; h++) WK[0 * d + h * dh] = 1, bQ[h * dh] = 120; // k(BOS) . q = 120, scale 1/2
    int32_t seq[12] = {0, 3, 5, 1, 7, 2, 2, 6, 4, 1, 3, 5};
    qkv_tensor *ids = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){2, 12});
    for (int b = 0; b < 2; b++) memcpy(qkv_i32(ids) + b * 12, seq, sizeof seq);
    qkv_model_set_inspect(m, true);
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL), "%s", qkv_errmsg(ctx));
        qkv_tensor *A = qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, 0);
        cr_assert_not_null(A);
        double first[4], mass[4], entropy[4];
        sinks_head_stats(qkv_f32(A), A->shape[0], 4, 12, first, mass, entropy);
        double rate = sinks_sink_rate(first, 4, SINKS_EPSILON);
        if (pass == 0) {
            cr_expect_eq(rate, 1.0, "sink rate %g (first-token weights %g %g %g %g)", rate, first[0], first[1], first[2],
                         first[3]);
            for (int h = 0; h < 4; h++) cr_expect_gt(first[h], 0.999999, "head %d: %.9f", h, first[h]);
        } else {
            cr_expect_eq(rate, 0.0, "uniform attention: sink rate %g", rate);
            double harmonic = 0;
            for (int i = 1; i < 12; i++) harmonic += 1.0 / (i + 1);
            for (int h = 0; h < 4; h++) cr_expect_float_eq(first[h], harmonic / 11, 1e-6, "head %d: %g", h, first[h]);
        }
        qkv_step_end(ctx);
        ids = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){2, 12});
        for (int b = 0; b < 2; b++) memcpy(qkv_i32(ids) + b * 12, seq, sizeof seq);
        memset(bQ, 0, sizeof(float) * d);
    }
    qkv_ctx_free(ctx);
}

Test(sinks, massive_activation_found_where_planted) {
    int64_t B = 2, n = 5, d = 6;
    float x[60], scratch[60];
    int32_t ids[10] = {0, 4, 4, 2, 1, 0, 7, 3, 3, 9};
    for (int k = 0; k < 60; k++) x[k] = (k % 2 ? -1.0f : 1.0f) * (float)(1 + k % 3); // |x| 1, 2, 3 in turn
    x[(1 * n + 3) * d + 4] = -250.0f; // row 1, position 3 (token 3), dimension 4
    sinks_massive_act a = sinks_massive(x, ids, B, n, d, scratch);
    cr_expect_eq(a.max_abs, 250.0);
    cr_expect(a.row == 1 && a.pos == 3 && a.dim == 4 && a.token == 3, "at row %lld pos %lld dim %lld token %d",
              (long long)a.row, (long long)a.pos, (long long)a.dim, (int)a.token);
    cr_expect_eq(a.median_abs, 2.0, "median %g", a.median_abs); // 20 ones, 20 twos, 19 threes, 250
}

Test(sinks, the_data_has_bos_first_and_targets_of_the_kind_they_say) {
    static sinks_data d;
    sinks_data_synthetic(&d, 7);
    int64_t B = 16, n = 64;
    int32_t ids[16 * 64];
    uint8_t kind[16 * 64];
    sinks_batch(&d, 1, 3, B, n, ids, kind);
    int counts[SINKS_T_KINDS] = {0};
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            int32_t t = ids[b * n + i];
            cr_assert(t >= 0 && t < SINKS_VOCAB);
            cr_assert_eq(t == 0, i == 0, "row %lld position %lld: token %d (BOS is at position 0 only)", (long long)b,
                         (long long)i, t);
            counts[kind[b * n + i]]++;
            if (kind[b * n + i] == SINKS_T_LOOKUP) { // the value of a query whose key was stored earlier
                int32_t query0 = 1 + SINKS_KEYS * SINKS_VALUES, value0 = query0 + SINKS_KEYS;
                int32_t k = ids[b * n + i - 1] - query0, store = 1 + k * SINKS_VALUES + (t - value0);
                cr_assert(k >= 0 && k < SINKS_KEYS && t >= value0 && t < value0 + SINKS_VALUES, "lookup %d after %d", t,
                          ids[b * n + i - 1]);
                int64_t j = i - 2;
                while (j >= 1 && ids[b * n + j] != store) j--;
                cr_assert(j >= 1, "lookup at %lld: no earlier store(%d, %d)", (long long)i, k, t - value0);
            }
            if (kind[b * n + i] == SINKS_T_TEXT) {
                int32_t p = ids[b * n + i - 1];
                cr_assert(p >= SINKS_VOCAB - SINKS_TEXT && (d.succ[p][0] == t || d.succ[p][1] == t));
            }
        }
    cr_expect_gt(counts[SINKS_T_LOOKUP], B * 2, "%d lookup targets", counts[SINKS_T_LOOKUP]);
    cr_expect_gt(counts[SINKS_T_TEXT], B * n / 3, "%d text targets", counts[SINKS_T_TEXT]);
    int32_t again[16 * 64]; // a function of (seed, split, step, row)
    sinks_batch(&d, 1, 3, B, n, again, NULL);
    cr_expect_eq(memcmp(ids, again, sizeof ids), 0);
    sinks_batch(&d, 0, 3, B, n, again, NULL);
    cr_expect_neq(memcmp(ids, again, sizeof ids), 0, "the held-out split is another stream");
}

Test(sinks, data_from_a_file_and_arm_lists) {
    const char *tmp = getenv("TMPDIR");
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/qkv_sinks_data_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    for (int k = 0; k < 1000; k++) fputc('a' + k % 26, f);
    fclose(f);
    sinks_data d;
    cr_expect_not(sinks_data_file(&d, path, 200, err, sizeof err), "1000 bytes are too few for n_ctx 200");
    cr_expect(strstr(err, "--data") && strstr(err, "1000 bytes"), "%s", err);
    cr_assert(sinks_data_file(&d, path, 16, err, sizeof err), "%s", err);
    cr_expect(d.vocab == 257 && d.n_bytes == 1000 && d.n_train == 900);
    int32_t ids[4 * 16];
    sinks_batch(&d, 1, 0, 4, 16, ids, NULL);
    for (int b = 0; b < 4; b++) {
        cr_expect_eq(ids[b * 16], 256, "BOS");
        for (int i = 2; i < 16; i++) cr_expect_eq(ids[b * 16 + i], 'a' + (ids[b * 16 + i - 1] - 'a' + 1) % 26);
    }
    sinks_data_free(&d);
    remove(path);
    cr_expect_not(sinks_data_file(&d, path, 16, err, sizeof err));
    const sinks_arm *arms[SINKS_MAX_ARMS];
    int n = 0;
    cr_expect(sinks_arms_parse("sink,softmax", arms, SINKS_MAX_ARMS, &n, err, sizeof err));
    cr_expect(n == 2 && !strcmp(arms[0]->name, "sink") && !strcmp(arms[1]->name, "softmax"));
    cr_expect_not(sinks_arms_parse("softmax,gates", arms, SINKS_MAX_ARMS, &n, err, sizeof err));
    cr_expect(strstr(err, "'gates'") && strstr(err, "softpick") && strstr(err, "diff"), "%s", err);
    cr_expect_not(sinks_arms_parse("sink,sink", arms, SINKS_MAX_ARMS, &n, err, sizeof err));
    cr_expect_not(sinks_arms_parse("", arms, SINKS_MAX_ARMS, &n, err, sizeof err));
    qkv_model_config c = qkv_model_default_config();
    sinks_arm_find("sigmoid")->apply(&c);
    cr_expect_eq(c.attn_variant, QKV_ATTN_SIGMOID);
}

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static int count_lines(const char *path, char *head, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int lines = 0, ch;
    if (!fgets(head, (int)size, f)) head[0] = '\0';
    else lines = 1;
    while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
    fclose(f);
    return lines;
}

static sinks_result first, second;

Test(sinks, quick_run_files_ranges_streaming_test_and_the_same_bits_with_2_jobs) {
    QKV_TEST_DEADLINE(600);
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qkv_sinks_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    char *printed = NULL;
    size_t printed_len = 0;
    FILE *tables = open_memstream(&printed, &printed_len);
    cr_assert_not_null(tables);
    sinks_options opt = {.out_dir = dir, .cfg = sinks_default_config(true), .jobs = 1, .threads = 1, .log = tables};
    cr_assert(sinks_run(&opt, &first), "the quick run failed");
    cr_assert_eq(fclose(tables), 0);
    int quoted = doc_quotes_check(QKV_DOCS_DIR "/sinks.md", "quick", printed);
    if (quoted >= 0) cr_expect_geq(quoted, 30, "docs/sinks.md quotes %d lines of the quick run", quoted);
    free(printed);

    const sinks_config *c = &first.cfg;
    cr_assert_eq(first.n_arms, sinks_arm_count);
    int64_t L = c->n_layer, H = c->n_head, probes = c->steps / c->probe_every + 1;
    for (int a = 0; a < first.n_arms; a++) {
        const sinks_arm_result *u = &first.arm[a];
        cr_expect_str_eq(u->name, sinks_arms[a].name);
        cr_expect_eq(u->n_probes, probes);
        cr_expect_lt(u->final_loss, u->init_loss - 0.5, "%s: %g -> %g", u->name, u->init_loss, u->final_loss);
        bool signed_pattern = !strcmp(u->name, "diff");
        for (int p = 0; p < u->n_probes; p++) {
            cr_expect(u->probe_sink_rate[p] >= 0 && u->probe_sink_rate[p] <= 1);
            for (int64_t l = 0; l < L; l++) // diff's pattern A1 - lambda A2 is signed
                cr_expect(u->probe_first[p][l] >= (signed_pattern ? -1 : 0) && u->probe_first[p][l] <= 1);
        }
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++) {
                double f = u->first[l][h], m = u->mass[l][h], e = u->entropy[l][h];
                if (signed_pattern) cr_expect(fabs(f) <= 1 && isfinite(m), "%s first %g mass %g", u->name, f, m);
                else cr_expect(f >= 0 && f <= m + 1e-6, "%s %lld.%lld: first %g mass %g", u->name, (long long)l, (long long)h, f, m);
                bool normalised = !strcmp(u->name, "softmax") || !strcmp(u->name, "ssmax") || !strcmp(u->name, "gate");
                bool at_most_one = normalised || !strcmp(u->name, "softmax1") || !strcmp(u->name, "sink") ||
                                   !strcmp(u->name, "softpick");
                if (normalised) cr_expect_float_eq(m, 1.0, 1e-5, "%s row mass %g", u->name, m);
                if (at_most_one) cr_expect_leq(m, 1.0 + 1e-5, "%s row mass %g", u->name, m);
                if (m > 0) cr_expect(e >= 0 && e <= log((double)c->n_ctx), "%s entropy %g", u->name, e);
                else cr_expect(isnan(e) && !strcmp(u->name, "softpick"), "%s: a head that never attends", u->name);
            }
        for (int64_t l = 0; l < L; l++) {
            const sinks_massive_act *v = &u->massive[l];
            cr_expect(v->max_abs >= v->median_abs && v->median_abs > 0 && v->pos < c->n_ctx && v->dim < c->d_model);
        }
        // the StreamingLLM evaluations ran on other inputs than the full one: every loss finite, and different
        cr_expect(isfinite(u->loss_bos) && isfinite(u->loss_nobos) && isfinite(u->loss_window_bos) &&
                  isfinite(u->loss_window_nobos) && isfinite(u->lookup_nobos));
        cr_expect(!same_bits(u->loss_bos, u->loss_nobos) && !same_bits(u->loss_window_bos, u->loss_window_nobos),
                  "%s: %.17g %.17g %.17g %.17g", u->name, u->loss_bos, u->loss_nobos, u->loss_window_bos,
                  u->loss_window_nobos);
        char path[4200], head[256];
        snprintf(path, sizeof path, "%s/sinks_%s.csv", dir, u->name);
        cr_expect_eq(count_lines(path, head, sizeof head), 1 + probes * L, "%s", path);
        cr_expect_eq(strncmp(head, "arm,step,", 9), 0, "%s: %s", path, head);
        remove(path);
    }
    static const char *const names[] = {"sinks_heads.csv", "sinks_massive.csv", "sinks_summary.csv"};
    const int lines[] = {1 + sinks_arm_count * 2 * 4, 1 + sinks_arm_count * 2, 1 + sinks_arm_count};
    for (int k = 0; k < 3; k++) {
        char path[4200], head[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        cr_expect_eq(count_lines(path, head, sizeof head), lines[k], "%s", path);
        cr_expect_eq(strncmp(head, "arm,", 4), 0, "%s", path);
        remove(path);
    }
    static const char *const svgs[] = {"sinks_rate.svg", "sinks_first_weight_steps.svg", "sinks_first_weight.svg",
                                       "sinks_massive.svg", "sinks_streaming.svg"};
    for (int k = 0; k < 5; k++) {
        char path[4200], head[256];
        snprintf(path, sizeof path, "%s/%s", dir, svgs[k]);
        cr_expect_geq(count_lines(path, head, sizeof head), 10, "%s", path);
        cr_expect_eq(strncmp(head, "<svg", 4), 0, "%s", path);
        remove(path);
    }
    // 2 jobs of 2 kernel threads: the same bits (every arm a function of the seed)
    opt.jobs = 2, opt.threads = 2, opt.log = NULL;
    opt.n_arms = 2, opt.arms[0] = sinks_arm_find("softpick"), opt.arms[1] = sinks_arm_find("softmax");
    cr_assert(sinks_run(&opt, &second));
    for (int k = 0; k < 2; k++) {
        const sinks_arm_result *u = &second.arm[k], *v = &first.arm[k == 0 ? 5 : 0];
        cr_expect_str_eq(u->name, v->name);
        cr_expect(same_bits(u->final_loss, v->final_loss) && same_bits(u->loss_nobos, v->loss_nobos) &&
                      same_bits(u->sink_rate, v->sink_rate) && same_bits(u->massive[1].max_abs, v->massive[1].max_abs),
                  "%s: %.17g vs %.17g", u->name, u->final_loss, v->final_loss);
        for (int p = 0; p < u->n_probes; p++)
            cr_expect(same_bits(u->probe_first[p][0], v->probe_first[p][0]), "%s probe %d", u->name, p);
    }
    char path[4200];
    const char *all[] = {"sinks_softpick.csv", "sinks_softmax.csv", "sinks_heads.csv", "sinks_massive.csv",
                         "sinks_summary.csv", "sinks_rate.svg", "sinks_first_weight_steps.svg", "sinks_first_weight.svg",
                         "sinks_massive.svg", "sinks_streaming.svg"};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) snprintf(path, sizeof path, "%s/%s", dir, all[k]), remove(path);
    cr_expect_eq(rmdir(dir), 0, "%s holds files the test did not expect", dir);
}

/* examples/stability's --arms: the learning-rate sweep of the attention-variant arms (its quick mode: lr 1e-3,
 * 3.2e-2 and 1, one seed, 40 steps). Every arm trains at lr 1e-3 (quick runs of seeds 0, 1, 2: from 2.79-2.80
 * to 2.54, 2.53 and 2.51 in every arm, a fall of 0.25; the test asks for 0.1), the arms are different models (their final losses differ), a bad arm count is refused, and
 * docs/sinks.md quotes the sweep's tables. */
Test(sinks, stability_sweep_of_the_variant_arms) {
    QKV_TEST_DEADLINE(600);
    static stab_config c;
    c = stab_default_config(true);
    const sinks_arm *arms[SINKS_MAX_ARMS];
    int n_arms = 0; // every arm but differential attention, whose two score matrices the probe cannot read
    for (int a = 0; a < sinks_arm_count; a++)
        if (strcmp(sinks_arms[a].name, "diff")) arms[n_arms++] = &sinks_arms[a];
    cr_assert_eq(n_arms, sinks_arm_count - 1);
    c.variant_arms = arms, c.n_variant_arms = n_arms;
    char why[256];
    cr_expect_null(stab_config_problem(&c, why, sizeof why), "%s", why);
    stab_config bad = c;
    bad.n_variant_arms = STAB_MAX_ARMS + 1;
    cr_expect(stab_config_problem(&bad, why, sizeof why) && strstr(why, "--arms"), "%s", why);
    const sinks_arm *with_diff[] = {sinks_arm_find("softmax"), sinks_arm_find("diff")};
    bad = c, bad.variant_arms = with_diff, bad.n_variant_arms = 2;
    cr_expect(stab_config_problem(&bad, why, sizeof why) && strstr(why, "'diff'"), "%s", why);
    cr_expect(stab_arm_probeable(sinks_arm_find("gate")) && !stab_arm_probeable(sinks_arm_find("diff")));
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qkv_sinks_stab_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    char *printed = NULL;
    size_t printed_len = 0;
    FILE *tables = open_memstream(&printed, &printed_len);
    cr_assert_not_null(tables);
    static stab_result r;
    stab_options opt = {dir, true, 0, 1, 1, tables, &c};
    cr_assert(stability_run(&opt, &r));
    cr_assert_eq(fclose(tables), 0);
    int quoted = doc_quotes_check(QKV_DOCS_DIR "/sinks.md", "stability-quick", printed);
    if (quoted >= 0) cr_expect_geq(quoted, 20, "docs/sinks.md quotes %d lines of the quick sweep", quoted);
    cr_expect(strstr(printed, "3 lrs x 7 arms x 1 seeds") != NULL);
    free(printed);
    cr_assert_eq(r.n_arms, n_arms);
    int distinct = 0;
    for (int a = 0; a < r.n_arms; a++) {
        cr_expect_str_eq(r.arm_name[a], arms[a]->name);
        const stab_run *lo = &r.run[a][0][0];
        cr_expect_lt(lo->final_loss, lo->init_loss - 0.1, "%s at lr 1e-3: %g -> %g", r.arm_name[a], lo->init_loss,
                     lo->final_loss);
        distinct += a > 0 && !same_bits(lo->final_loss, r.run[0][0][0].final_loss);
    }
    cr_expect_eq(distinct, r.n_arms - 1, "every variant trains another model than the softmax");
    char path[4200];
    static const char *const names[] = {"stability_runs.csv", "stability_probes.csv", "stability_sensitivity.csv",
                                        "stability_lr.svg", "stability_logit_lr_1e0.svg", "stability_entropy_lr_1e0.svg",
                                        "stability_logit_lr_1e-3.svg", "stability_entropy_lr_1e-3.svg"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        cr_expect_eq(remove(path), 0, "%s was not written", path);
    }
    cr_expect_eq(rmdir(dir), 0);
}

/* Mean -log softmax(logits)[target] of logits [B, len, V] (f32) against targets (-1: not counted). */
static double mean_nll(const qkv_tensor *logits, const int32_t *target, int64_t *count) {
    int64_t rows = logits->shape[0] * logits->shape[1], V = logits->shape[2];
    double sum = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (target[r] < 0) continue;
        const float *z = qkv_f32(logits) + r * V;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) m = fmax(m, z[v]);
        for (int64_t v = 0; v < V; v++) s += exp(z[v] - m);
        sum += m + log(s) - z[target[r]], ++*count;
    }
    return sum;
}

/* The StreamingLLM evaluation on a fresh (untrained, random) model, recomputed here by hand from the model's
 * logits: "no BOS" is the sequence shifted one position (ids[1..n-1]) scored on targets 2..n-1, "BOS" the whole
 * sequence on the same targets, and the window ids[s..n-1] with and without BOS put in front, on targets
 * s+1..n-1. A shift not applied, or applied to the wrong targets, changes these sums. */
Test(sinks, the_streaming_test_drops_the_first_token_and_scores_the_same_targets) {
    QKV_TEST_DEADLINE(300);
    static sinks_data d;
    sinks_data_synthetic(&d, 3);
    sinks_options opt = {.cfg = sinks_default_config(true)};
    opt.cfg.eval_batches = 1, opt.cfg.batch = 3, opt.cfg.n_ctx = 12, opt.cfg.shift = 5;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = qkv_model_default_config();
    c.vocab = SINKS_VOCAB, c.n_ctx = 12, c.d_model = 16, c.n_head = 2, c.d_mlp = 0, c.positions = QKV_POS_ROPE;
    c.init_std = 0.5, c.init_embed_std = 1.0, c.seed = 11; // large weights: every input changes the logits
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    static sinks_arm_result r;
    cr_assert(sinks_evaluate(ctx, m, &opt, &d, &r), "%s", qkv_errmsg(ctx));
    int64_t B = 3, n = 12, s = 5;
    int32_t ids[36], in[36], tg[36];
    uint8_t kind[36];
    sinks_batch(&d, 1, 0, B, n, ids, kind);
    double expect[4];
    for (int test = 0; test < 4; test++) { // whole with BOS, whole without, window with BOS, window without
        int64_t start = test < 2 ? (test == 0 ? 0 : 1) : s, bos = test == 2, len = n - start + bos, count = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < len; j++) {
                int64_t src = start + j - bos; // the position in ids of input j
                in[b * len + j] = bos && j == 0 ? 0 : ids[b * n + src];
                int64_t t = src + 1; // its target's position
                bool counted = t < n && (test < 2 ? t >= 2 : t >= s + 1) && !(bos && j == 0);
                tg[b * len + j] = counted ? ids[b * n + t] : -1;
            }
        qkv_tensor *x = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){B, len});
        memcpy(qkv_i32(x), in, sizeof(int32_t) * (size_t)(B * len));
        qkv_tensor *z = qkv_model_forward(ctx, m, x, QKV_CAUSAL);
        cr_assert_not_null(z, "%s", qkv_errmsg(ctx));
        expect[test] = mean_nll(z, tg, &count) / (double)count;
        cr_expect_eq(count, test < 2 ? B * (n - 2) : B * (n - s - 1));
        qkv_step_end(ctx);
    }
    cr_expect_float_eq(r.loss_bos, expect[0], 1e-9, "%.12g %.12g", r.loss_bos, expect[0]);
    cr_expect_float_eq(r.loss_nobos, expect[1], 1e-9, "%.12g %.12g", r.loss_nobos, expect[1]);
    cr_expect_float_eq(r.loss_window_bos, expect[2], 1e-9, "%.12g %.12g", r.loss_window_bos, expect[2]);
    cr_expect_float_eq(r.loss_window_nobos, expect[3], 1e-9, "%.12g %.12g", r.loss_window_nobos, expect[3]);
    cr_expect_gt(fabs(expect[0] - expect[1]), 1e-3, "dropping BOS changes this model's loss");
    cr_expect_gt(fabs(expect[2] - expect[3]), 1e-3);
    qkv_ctx_free(ctx);
}
