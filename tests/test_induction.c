/*
 * test_induction.c — examples/induction in its quick mode, in-process (the experiment is linked in as a
 * library): every CSV and SVG file is written, and the facts the experiment is about hold:
 *   - the two-layer model's repeated-half loss ends far below its first-half loss, the one-layer control's
 *     does not;
 *   - a head of layer 1 has a high induction score;
 *   - zeroing that head raises the repeated-half loss;
 * and the lines of the quick run's tables that docs/induction.md quotes are what it prints now
 * (tests/doc_quotes.h).
 * The bounds come from quick runs of seeds 0 to 4 (BOUNDS below), with margin. The quick run takes about
 * 25 s of CPU (more wall time on a loaded machine: the timeouts allow for it).
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
#include "induction.h"
#include "test_deadline.h"

/* BOUNDS: quick runs (ind_default_config(true): 1500 steps) of seeds 0, 1, 2, 3, 4 gave at the end, first on the
 * tree the experiment was written on, then (second rows) on the tree with the final f32 norm/GELU kernels and
 * optimizer code, whose rounding moves the trajectories (training is chaotic; seed 0's induction head forms
 * later and weaker there), then (third rows) on the tree of 2026-12-03 (gcc 12.2, AVX2 kernels), whose seed 0
 * is the quick run docs/induction.md quotes:
 *   two layers: repeated-half / first-half loss      0.120  0.122  0.066  0.114  0.096   (worst 0.122)
 *                                                    0.401  0.107  0.088  0.125  0.097   (worst 0.401)
 *                                                    0.139  0.083  0.079  0.097  0.105   (worst 0.139)
 *   one layer:  repeated-half / first-half loss      0.953  0.962  0.961  0.962  0.968   (worst 0.953)
 *                                                    0.953  0.962  0.961  0.962  0.968   (worst 0.953)
 *                                                    0.953  0.962  0.961  0.962  0.968   (worst 0.953)
 *   best layer-1 induction score                     0.843  0.880  0.871  0.887  0.841   (worst 0.841)
 *                                                    0.550  0.894  0.854  0.869  0.843   (worst 0.550)
 *                                                    0.812  0.869  0.857  0.842  0.835   (worst 0.812)
 *   repeated-half loss rise, best head zeroed (nats) 0.83   1.23   0.81   0.62   1.03    (worst 0.62)
 *                                                    0.74   0.96   0.75   1.01   1.09    (worst 0.74)
 *                                                    1.01   1.20   0.94   0.97   0.93    (worst 0.93)
 *   phase change step                                1100   950    1000   1050   800
 *                                                    850    1000   1050   1050   800
 *                                                    1000   1000   950    950    800
 * The bounds leave a margin around the worst seed of both trees (1.5x on the loss ratio, whose one-layer
 * counterpart stays at 0.95; 1.8x on the score). A build whose arithmetic moves the phase change of seed 0
 * past about 1400 steps fails here: the quick budget is 1500 steps. */
#define TWO_LAYER_MAX_RATIO 0.6   /* two layers: loss_repeat < 0.6 loss_first           */
#define ONE_LAYER_MIN_RATIO 0.85  /* one layer: loss_repeat > 0.85 loss_first           */
#define MIN_INDUCTION_SCORE 0.3   /* the best layer-1 head's induction score            */
#define MIN_ABLATION_RISE 0.25    /* nats added to the repeated-half loss by zeroing it */
#define QUOTED_LINES 24           /* lines docs/induction.md quotes from the quick run    */

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096 + 256 + 2];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static ind_result res;

Test(induction, quick_run_forms_an_induction_head) {
    QKV_TEST_DEADLINE(900);
    char dir[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/qkv_induction_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(dir), "cannot make a temporary folder %s", dir);
    char *printed = NULL;
    size_t printed_len = 0;
    FILE *tables = open_memstream(&printed, &printed_len); /* the tables, for the page's quoted lines below */
    cr_assert_not_null(tables);
    ind_options o = {dir, ind_default_config(true), false, 0, tables, NULL};
    cr_assert(ind_study(&o, &res), "the quick run failed");
    cr_assert_eq(fclose(tables), 0);

    /* every file, non-empty, of its kind */
    const char *files[] = {"training.csv", "heads.csv", "ablation.csv", "layers.csv", "patching.csv", "patterns.csv",
                           "sequence.csv", "summary.csv", "patching.svg",
                           "loss.svg", "icl.svg", "scores_prev.svg", "scores_induction.svg", "patterns.svg",
                           "patterns_one_layer.svg"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[4200], head[8] = "";
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s was not written", path);
        cr_expect_gt(st.st_size, 100, "%s has only %lld bytes", path, (long long)st.st_size);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        size_t got = fread(head, 1, 4, f);
        fclose(f);
        cr_expect_eq(got, 4);
        if (strstr(files[i], ".svg")) cr_expect_eq(strncmp(head, "<svg", 4), 0, "%s is not an SVG", path);
        else cr_expect(strchr("mp", head[0]) != NULL, "%s: no CSV header (%.4s)", path, head);
    }

    const ind_run *two = &res.two, *one = &res.one;
    cr_assert_eq(two->cfg.n_layer, 2);
    cr_assert_eq(one->cfg.n_layer, 1);
    cr_assert_gt(two->n_evals, 2);
    const ind_eval *e2 = &two->evals[two->n_evals - 1], *e1 = &one->evals[one->n_evals - 1];
    cr_expect_eq(e2->step, two->cfg.steps, "the last measurement is at the end of training");

    /* the repeated half is learned by two layers, not by one */
    cr_expect_lt(e2->loss_repeat, TWO_LAYER_MAX_RATIO * e2->loss_first,
                 "two layers: repeated-half loss %.4f, first-half loss %.4f", e2->loss_repeat, e2->loss_first);
    cr_expect_gt(e1->loss_repeat, ONE_LAYER_MIN_RATIO * e1->loss_first,
                 "one layer: repeated-half loss %.4f, first-half loss %.4f", e1->loss_repeat, e1->loss_first);
    /* the first half is random: neither model can beat ln V by much there */
    cr_expect_gt(e2->loss_first, 0.9 * log((double)two->cfg.vocab), "first-half loss %.4f", e2->loss_first);

    /* an induction head in layer 1 */
    double best = 0;
    int head = -1;
    for (int h = 0; h < two->cfg.n_head; h++)
        if (e2->induction[1][h] > best) best = e2->induction[1][h], head = h;
    cr_expect_gt(best, MIN_INDUCTION_SCORE, "the best layer-1 induction score is %.4f (head %d)", best, head);
    cr_expect_eq(two->best_layer, 1);
    cr_expect_eq(two->best_head, head);
    cr_expect_geq(two->phase_step, 0, "the phase change was found");

    /* zeroing it undoes the copying */
    double rise = two->zero_repeat[1][head] - two->base_repeat;
    cr_expect_gt(rise, MIN_ABLATION_RISE, "zeroing layer 1 head %d: repeated-half loss %.4f -> %.4f", head,
                 two->base_repeat, two->zero_repeat[1][head]);

    /* the duplicate-token scores and the layer ablations were measured: ablating layer 1 whole undoes the copying
     * at least as much as its best head alone (the other heads add their share), and the one-layer model's only
     * layer barely matters to the repeated half it never learned */
    cr_expect_geq(two->layer_zero_repeat[1] + 0.05, two->zero_repeat[1][head], "layer 1 zeroed %.4f, its head %.4f",
                  two->layer_zero_repeat[1], two->zero_repeat[1][head]);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < two->cfg.n_head; h++)
            cr_expect(e2->dup[l][h] >= 0 && e2->dup[l][h] <= 1, "dup score %d %d: %g", l, h, e2->dup[l][h]);

    /* activation patching finds the circuit: taking the z of the induction head, or of the best previous-token
     * head of layer 0, from sequences whose first copy is corrupted raises the clean repeated-half loss (quick
     * seed 0: 0.62 to 2.60 and 5.01; the whole corrupted run 6.64) */
    int prev_head = 0;
    for (int h = 1; h < two->cfg.n_head; h++)
        if (e2->prev[0][h] > e2->prev[0][prev_head]) prev_head = h;
    cr_expect_gt(two->corrupt_repeat, two->base_repeat + 1.0, "corrupted %.4f, clean %.4f", two->corrupt_repeat,
                 two->base_repeat);
    cr_expect_gt(two->patch_repeat[1][head], two->base_repeat + MIN_ABLATION_RISE, "induction head %d patched: %.4f",
                 head, two->patch_repeat[1][head]);
    cr_expect_gt(two->patch_repeat[0][prev_head], two->base_repeat + MIN_ABLATION_RISE,
                 "previous-token head %d patched: %.4f", prev_head, two->patch_repeat[0][prev_head]);

    /* docs/induction.md quotes lines of this quick run's tables: every one as printed now */
    int quoted = doc_quotes_check(QKV_DOCS_DIR "/induction.md", "quick", printed);
    if (quoted >= 0) cr_expect_geq(quoted, QUOTED_LINES, "docs/induction.md quotes %d lines of the quick run", quoted);
    free(printed);
    ind_result_free(&res);
    remove_dir(dir);
}

/* The data's layouts: with place end the repeat ends the sequence (q = p + L = n - L), as the quoted runs were
 * made; with place random both copies are intact, apart, anywhere, and of every allowed length; tokens outside
 * the second copy are the same function of (seed, step, row, position) in both layouts. */
Test(induction, the_repeat_sits_where_the_configuration_says) {
    ind_config c = ind_default_config(true);
    ind_literature_preset(&c, true);
    enum { B = 512 };
    int64_t n = c.n, p[B], L[B], q[B];
    static int32_t ids[B * 256], ids_end[B * 256];
    ind_batch(&c, 7, B, ids, p, L, q);
    bool seen_len[64] = {false}, gap_seen = false, start_seen = false, suffix_seen = false;
    for (int b = 0; b < B; b++) {
        cr_assert(L[b] >= c.min_segment && L[b] <= c.max_segment, "row %d: L %lld", b, (long long)L[b]);
        cr_assert(p[b] >= 0 && p[b] + L[b] <= q[b] && q[b] + L[b] <= n, "row %d: p %lld L %lld q %lld", b,
                  (long long)p[b], (long long)L[b], (long long)q[b]);
        for (int64_t i = 0; i < L[b]; i++) cr_assert_eq(ids[b * n + q[b] + i], ids[b * n + p[b] + i]);
        for (int64_t i = 0; i < n; i++) cr_assert(ids[b * n + i] >= 0 && ids[b * n + i] < c.vocab);
        seen_len[L[b]] = true;
        gap_seen |= q[b] > p[b] + L[b];
        start_seen |= p[b] == 0;
        suffix_seen |= q[b] + L[b] < n;
    }
    for (int64_t k = c.min_segment; k <= c.max_segment; k++) cr_expect(seen_len[k], "no segment of length %lld", (long long)k);
    cr_expect(gap_seen && start_seen && suffix_seen, "random placement: a gap %d, a copy at 0 %d, a suffix %d", gap_seen,
              start_seen, suffix_seen);

    c.place = IND_PLACE_END;
    int64_t pe[B], Le[B], qe[B];
    ind_batch(&c, 7, B, ids_end, pe, Le, qe);
    for (int b = 0; b < B; b++) {
        cr_assert_eq(Le[b], L[b], "the length does not depend on the place");
        cr_assert(qe[b] == pe[b] + Le[b] && qe[b] + Le[b] == n, "end: p %lld L %lld q %lld", (long long)pe[b],
                  (long long)Le[b], (long long)qe[b]);
        for (int64_t i = 0; i < qe[b]; i++)
            if (i < q[b] || i >= q[b] + L[b]) // outside both layouts' second copies
                cr_assert_eq(ids_end[b * n + i], ids[b * n + i], "row %d position %lld", b, (long long)i);
    }
}
