/*
 * induction_study.c — the whole induction-head experiment (induction.h): the two-layer model, the one-layer
 * control and the scale comparison; tables on the terminal, CSV files at full precision (%.17g) and SVG
 * plots in the output folder.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atomic_file.h"
#include "induction.h"
#include "plot.h"
#include "plot_heatmap.h"

const char *ind_arm_name(int arm) { return arm == 0 ? "1/sqrt(d_head)" : arm == 1 ? "1" : "qk_norm"; }

static const char *const HEAD_COLORS[IND_MAX_HEADS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
static const char *const ARM_COLORS[IND_ARMS] = {"#1f77b4", "#d62728", "#2ca02c"};

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- files ------------------------------------------------------------------------------------------- */

static bool path_of(const ind_options *o, const char *name, char *buf, size_t size) {
    int len = snprintf(buf, size, "%s/%s", o->out_dir, name);
    if (len > 0 && (size_t)len < size) return true;
    fprintf(stderr, "induction: output path too long: %s/%s\n", o->out_dir, name);
    return false;
}

static FILE *open_csv(const ind_options *o, const char *name, atomic_file *a) {
    char path[4096];
    if (!path_of(o, name, path, sizeof path)) return NULL;
    FILE *f = atomic_open(a, path);
    if (!f) fprintf(stderr, "induction: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static bool wrote(const ind_options *o, const char *name, bool ok) {
    if (!ok) fprintf(stderr, "induction: cannot write %s/%s: %s\n", o->out_dir, name, strerror(errno));
    else if (o->log) fprintf(o->log, "  wrote %s/%s\n", o->out_dir, name);
    return ok;
}

static bool close_csv(const ind_options *o, atomic_file *a, const char *name) { return wrote(o, name, atomic_commit(a)); }

static bool lines(const ind_options *o, const char *name, const char *title, const char *x_label, const char *y_label,
                  const plot_series *s, int n, const plot_style *styles) {
    char path[4096];
    bool ok = path_of(o, name, path, sizeof path) && plot_lines_styled_svg(path, title, x_label, y_label, s, n, false,
                                                                           false, styles);
    return wrote(o, name, ok);
}

/* ---- derived numbers --------------------------------------------------------------------------------- */

static const ind_eval *last_eval(const ind_run *r) { return &r->evals[r->n_evals - 1]; }

/* The largest score of a layer at one measurement. */
static double best_of(const ind_eval *e, const ind_run *r, int64_t layer, bool induction, int *head) {
    double best = -1;
    for (int64_t h = 0; h < r->cfg.n_head; h++) {
        double v = induction ? e->induction[layer][h] : e->prev[layer][h];
        if (v > best) best = v, *head = (int)h;
    }
    return best;
}

/* ---- tables ------------------------------------------------------------------------------------------ */

static void print_training(FILE *log, const ind_run *r, const char *title) {
    int64_t L = r->cfg.n_layer;
    fprintf(log, "\n%s: %" PRId64 " layer%s, %" PRId64 " parameters, %.1f s\n", title, L, L > 1 ? "s" : "",
            r->params, r->seconds);
    fprintf(log, "   step  loss first  loss repeated   ICL score  best prev-token (layer 0)  best induction (layer %" PRId64 ")\n",
            L - 1);
    int every = r->n_evals > 16 ? (r->n_evals + 15) / 16 : 1;
    for (int k = 0; k < r->n_evals; k++) {
        if (k % every && k != r->n_evals - 1) continue;
        const ind_eval *e = &r->evals[k];
        int hp = 0, hi = 0;
        double bp = best_of(e, r, 0, false, &hp), bi = best_of(e, r, L - 1, true, &hi);
        fprintf(log, "  %5" PRId64 "  %10.4f  %13.4f  %10.4f  %17.4f (head %d)  %15.4f (head %d)\n", e->step,
                e->loss_first, e->loss_repeat, e->icl, bp, hp, bi, hi);
    }
}

static void print_heads(FILE *log, const ind_run *r) {
    const ind_eval *e = last_eval(r);
    fprintf(log, "\nheads at the end (%" PRId64 " layer%s): scores, and the evaluation losses with the head ablated\n",
            r->cfg.n_layer, r->cfg.n_layer > 1 ? "s" : "");
    fprintf(log, "  layer head  prev-token  induction   repeated-half loss: zeroed   mean-ablated   (none %.4f)"
            "   first-half loss zeroed (none %.4f)\n", r->base_repeat, r->base_first);
    for (int64_t l = 0; l < r->cfg.n_layer; l++)
        for (int64_t h = 0; h < r->cfg.n_head; h++)
            fprintf(log, "  %5" PRId64 " %4" PRId64 "  %10.4f %10.4f   %26.4f %14.4f %29.4f\n", l, h, e->prev[l][h],
                    e->induction[l][h], r->zero_repeat[l][h], r->mean_repeat[l][h], r->zero_first[l][h]);
}

/* The duplicate-token score of every head, and each layer ablated whole (on their own lines: the heads table
 * above is quoted by docs/induction.md as it is). */
static void print_dup_and_layers(FILE *log, const ind_run *r) {
    const ind_eval *e = last_eval(r);
    fprintf(log, "\nduplicate-token score at the end (attention from a repeated token to its earlier occurrence)\n  layer");
    for (int64_t h = 0; h < r->cfg.n_head; h++) fprintf(log, "  head %" PRId64, h);
    fprintf(log, "\n");
    for (int64_t l = 0; l < r->cfg.n_layer; l++) {
        fprintf(log, "  %5" PRId64, l);
        for (int64_t h = 0; h < r->cfg.n_head; h++) fprintf(log, "  %6.4f", e->dup[l][h]);
        fprintf(log, "\n");
    }
    fprintf(log, "every head of a layer ablated at once: repeated-half loss zeroed, mean-ablated (none %.4f); first-half "
            "loss zeroed, mean-ablated (none %.4f)\n", r->base_repeat, r->base_first);
    for (int64_t l = 0; l < r->cfg.n_layer; l++)
        fprintf(log, "  layer %" PRId64 ": %.4f, %.4f; %.4f, %.4f\n", l, r->layer_zero_repeat[l], r->layer_mean_repeat[l],
                r->layer_zero_first[l], r->layer_mean_first[l]);
    fprintf(log, "activation patching: repeated-half loss with one head's z taken from the sequences whose first copy is\n"
            "replaced by other tokens (clean %.4f, all corrupted %.4f)\n  layer", r->base_repeat, r->corrupt_repeat);
    for (int64_t h = 0; h < r->cfg.n_head; h++) fprintf(log, "  head %" PRId64, h);
    fprintf(log, "\n");
    for (int64_t l = 0; l < r->cfg.n_layer; l++) {
        fprintf(log, "  %5" PRId64, l);
        for (int64_t h = 0; h < r->cfg.n_head; h++) fprintf(log, "  %6.4f", r->patch_repeat[l][h]);
        fprintf(log, "\n");
    }
}

/* A head's share of the corruption's damage: (patched - clean) / (all corrupted - clean), in [0, 1]. */
static double patch_share(const ind_run *r, int64_t l, int64_t h) {
    double gap = r->corrupt_repeat - r->base_repeat, v = gap > 0 ? (r->patch_repeat[l][h] - r->base_repeat) / gap : 0;
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

/* The patching result as a heat map: layers x heads, each cell the head's share of the damage. */
static bool patching_map(const ind_options *o, const ind_run *r, const char *name) {
    static double cells[IND_MAX_LAYERS * IND_MAX_HEADS];
    int64_t L = r->cfg.n_layer, H = r->cfg.n_head;
    for (int64_t l = 0; l < L; l++)
        for (int64_t h = 0; h < H; h++) cells[l * H + h] = patch_share(r, l, h);
    char title[256], panel_title[128];
    snprintf(title, sizeof title, "Activation patching (%" PRId64 " layers): share of the repeated-half loss's rise "
             "(%.2f to %.2f) when one head's z comes from the corrupted sequences", L, r->base_repeat, r->corrupt_repeat);
    snprintf(panel_title, sizeof panel_title, "rows: layers 0..%" PRId64 ", columns: heads 0..%" PRId64, L - 1, H - 1);
    plot_panel panel = {panel_title, cells};
    char path[4096];
    bool ok = path_of(o, name, path, sizeof path) &&
              plot_heatmap_grid_svg(path, title, "head", "layer", &panel, 1, 1, (int)L, (int)H, NULL, 0);
    return wrote(o, name, ok);
}

static void print_phase(FILE *log, const ind_run *r) {
    int64_t every = r->cfg.eval_every;
    if (r->phase_step < 0) {
        fprintf(log, "\nphase change (%" PRId64 " layers): none; the best head of layer %d (head %d) ends with an induction "
                "score of %.4f, below %.2f\n", r->cfg.n_layer, r->best_layer, r->best_head,
                last_eval(r)->induction[r->best_layer][r->best_head], IND_FORMED);
        return;
    }
    fprintf(log, "\nphase change (%" PRId64 " layers): head %d of layer %d has the highest final induction score, %.4f;\n"
            "  it first reaches half of that at step %" PRId64 "; the repeated-half loss is half way down (from %.4f at "
            "step 0 to %.4f) at step %" PRId64 ":\n  %s (%+" PRId64 " steps; measured every %" PRId64 ")\n",
            r->cfg.n_layer, r->best_head, r->best_layer, last_eval(r)->induction[r->best_layer][r->best_head],
            r->phase_step, r->evals[0].loss_repeat, last_eval(r)->loss_repeat, r->loss_drop_step,
            r->phase_step >= 0 && r->loss_drop_step >= 0 && llabs(r->loss_drop_step - r->phase_step) <= every
                ? "the same step, within one measurement interval"
                : "not the same step",
            r->loss_drop_step - r->phase_step, every);
}

/* ---- files of one run ------------------------------------------------------------------------------- */

static void csv_run_rows(FILE *t, FILE *hd, const ind_run *r, const char *model) {
    for (int k = 0; k < r->n_evals; k++) {
        const ind_eval *e = &r->evals[k];
        fprintf(t, "%s,%" PRId64 ",%.17g,%.17g,%.17g,%.17g\n", model, e->step, e->loss_all, e->loss_first,
                e->loss_repeat, e->icl);
        for (int64_t l = 0; l < r->cfg.n_layer; l++)
            for (int64_t h = 0; h < r->cfg.n_head; h++)
                fprintf(hd, "%s,%" PRId64 ",%" PRId64 ",%" PRId64 ",%.17g,%.17g,%.17g\n", model, e->step, l, h, e->prev[l][h],
                        e->induction[l][h], e->dup[l][h]);
    }
}

static void csv_ablation_rows(FILE *f, const ind_run *r, const char *model) {
    const ind_eval *e = last_eval(r);
    for (int64_t l = 0; l < r->cfg.n_layer; l++)
        for (int64_t h = 0; h < r->cfg.n_head; h++)
            fprintf(f, "%s,%" PRId64 ",%" PRId64 ",%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g\n", model, l, h,
                    e->prev[l][h], e->induction[l][h], r->base_repeat, r->zero_repeat[l][h], r->mean_repeat[l][h],
                    r->base_first, r->zero_first[l][h], r->mean_first[l][h]);
}

static void csv_layer_rows(FILE *f, const ind_run *r, const char *model) {
    for (int64_t l = 0; l < r->cfg.n_layer; l++)
        fprintf(f, "%s,%" PRId64 ",%.17g,%.17g,%.17g,%.17g,%.17g,%.17g\n", model, l, r->base_repeat, r->layer_zero_repeat[l],
                r->layer_mean_repeat[l], r->base_first, r->layer_zero_first[l], r->layer_mean_first[l]);
}

static void csv_pattern_rows(FILE *f, const ind_run *r, const char *model) {
    int64_t n = r->cfg.n, H = r->cfg.n_head;
    for (int64_t l = 0; l < r->cfg.n_layer; l++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j <= i; j++)
                    fprintf(f, "%s,%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%.17g\n", model, l, h, i, j,
                            r->pattern[((l * H + h) * n + i) * n + j]);
}

/* The attention of every head on the evaluation sequence 0, one panel per head. */
static bool pattern_grid(const ind_options *o, const ind_run *r, const char *name) {
    int64_t n = r->cfg.n, H = r->cfg.n_head, L = r->cfg.n_layer;
    plot_panel panels[IND_MAX_LAYERS * IND_MAX_HEADS];
    char titles[IND_MAX_LAYERS * IND_MAX_HEADS][96], title[256];
    const ind_eval *e = last_eval(r);
    for (int64_t l = 0; l < L; l++)
        for (int64_t h = 0; h < H; h++) {
            int k = (int)(l * H + h);
            snprintf(titles[k], sizeof titles[k], "layer %" PRId64 " head %" PRId64 ": prev %.2f, induction %.2f", l, h,
                     e->prev[l][h], e->induction[l][h]);
            panels[k].title = titles[k];
            panels[k].values = r->pattern + (size_t)k * (size_t)(n * n);
        }
    snprintf(title, sizeof title, "Attention of each head (%" PRId64 "-layer model) on one sequence: a segment of %"
             PRId64 " tokens at %" PRId64 ", repeated at %" PRId64 " (red lines)", L, r->pattern_segment,
             r->pattern_prefix, r->pattern_repeat);
    int guides[2] = {(int)r->pattern_prefix, (int)r->pattern_repeat};
    char path[4096];
    bool ok = path_of(o, name, path, sizeof path) &&
              plot_heatmap_grid_svg(path, title, "key position", "query position", panels, (int)(L * H), (int)H,
                                    (int)n, (int)n, guides, 2);
    return wrote(o, name, ok);
}

/* ---- plots ------------------------------------------------------------------------------------------- */

#define MAXS (2 * IND_MAX_LAYERS * IND_MAX_HEADS + 8)

static bool plots(const ind_options *o, const ind_result *res) {
    const ind_run *two = &res->two, *one = &res->one;
    static double x2[IND_MAX_EVALS], x1[IND_MAX_EVALS], y[MAXS][IND_MAX_EVALS];
    for (int k = 0; k < two->n_evals; k++) x2[k] = (double)two->evals[k].step;
    for (int k = 0; k < one->n_evals; k++) x1[k] = (double)one->evals[k].step;
    plot_series s[MAXS];
    plot_style st[MAXS];
    int ns = 0;
    bool ok = true;
    double phase_x[2] = {(double)two->phase_step, (double)two->phase_step}, phase_y[2];
    char phase_name[64];
    snprintf(phase_name, sizeof phase_name, "phase change (step %" PRId64 ")", two->phase_step);

    /* loss of both halves, both models */
    for (int k = 0; k < two->n_evals; k++) y[0][k] = two->evals[k].loss_first, y[1][k] = two->evals[k].loss_repeat;
    for (int k = 0; k < one->n_evals; k++) y[2][k] = one->evals[k].loss_first, y[3][k] = one->evals[k].loss_repeat;
    s[0] = (plot_series){"2 layers: first half", x2, y[0], two->n_evals};
    s[1] = (plot_series){"2 layers: repeated half", x2, y[1], two->n_evals};
    s[2] = (plot_series){"1 layer: first half", x1, y[2], one->n_evals};
    s[3] = (plot_series){"1 layer: repeated half", x1, y[3], one->n_evals};
    st[0] = (plot_style){"#1f77b4", NULL, PLOT_MARKER_CIRCLE};
    st[1] = (plot_style){"#d62728", NULL, PLOT_MARKER_SQUARE};
    st[2] = (plot_style){"#1f77b4", "6 3", PLOT_MARKER_TRIANGLE};
    st[3] = (plot_style){"#d62728", "6 3", PLOT_MARKER_DIAMOND};
    double lnv_x[2] = {0, (double)two->cfg.steps}, lnv_y[2] = {log((double)two->cfg.vocab), log((double)two->cfg.vocab)};
    s[4] = (plot_series){"ln V (a uniform guess)", lnv_x, lnv_y, 2};
    st[4] = (plot_style){"#7f7f7f", "2 4", PLOT_MARKER_NONE};
    ns = 5;
    if (two->phase_step >= 0) {
        phase_y[0] = 0, phase_y[1] = lnv_y[0];
        s[ns] = (plot_series){phase_name, phase_x, phase_y, 2};
        st[ns++] = (plot_style){"#000000", "4 4", PLOT_MARKER_NONE};
    }
    ok &= lines(o, "loss.svg", "Next-token loss: first half (random) and repeated half",
                "training step", "loss (nats per token)", s, ns, st);

    /* the in-context learning score */
    for (int k = 0; k < two->n_evals; k++) y[0][k] = two->evals[k].icl;
    for (int k = 0; k < one->n_evals; k++) y[1][k] = one->evals[k].icl;
    s[0] = (plot_series){"2 layers", x2, y[0], two->n_evals};
    s[1] = (plot_series){"1 layer", x1, y[1], one->n_evals};
    st[0] = (plot_style){"#1f77b4", NULL, PLOT_MARKER_CIRCLE};
    st[1] = (plot_style){"#d62728", "6 3", PLOT_MARKER_SQUARE};
    double zero_y[2] = {0, 0};
    s[2] = (plot_series){"0 (no in-context learning)", lnv_x, zero_y, 2};
    st[2] = (plot_style){"#7f7f7f", "2 4", PLOT_MARKER_NONE};
    ns = 3;
    if (two->phase_step >= 0) {
        double lo = 0;
        for (int k = 0; k < two->n_evals; k++) lo = fmin(lo, y[0][k]);
        phase_y[0] = lo, phase_y[1] = 0;
        s[ns] = (plot_series){phase_name, phase_x, phase_y, 2};
        st[ns++] = (plot_style){"#000000", "4 4", PLOT_MARKER_NONE};
    }
    ok &= lines(o, "icl.svg", "In-context learning score: loss of the last eighth minus the first",
                "training step", "loss difference (nats)", s, ns, st);

    /* per-head scores of the two-layer model */
    for (int kind = 0; kind < 2; kind++) {
        static char names[IND_MAX_LAYERS * IND_MAX_HEADS][64];
        ns = 0;
        for (int64_t l = 0; l < two->cfg.n_layer; l++)
            for (int64_t h = 0; h < two->cfg.n_head; h++, ns++) {
                for (int k = 0; k < two->n_evals; k++)
                    y[ns][k] = kind ? two->evals[k].induction[l][h] : two->evals[k].prev[l][h];
                snprintf(names[ns], sizeof names[ns], "layer %" PRId64 " head %" PRId64, l, h);
                s[ns] = (plot_series){names[ns], x2, y[ns], two->n_evals};
                st[ns] = (plot_style){HEAD_COLORS[h], l ? NULL : "6 3", l ? PLOT_MARKER_CIRCLE : PLOT_MARKER_SQUARE};
            }
        if (two->phase_step >= 0) {
            phase_y[0] = 0, phase_y[1] = 1;
            s[ns] = (plot_series){phase_name, phase_x, phase_y, 2};
            st[ns++] = (plot_style){"#000000", "4 4", PLOT_MARKER_NONE};
        }
        ok &= kind ? lines(o, "scores_induction.svg", "Induction score of each head (attention from i to i-L+1)", "training step", "mean attention weight", s, ns, st)
                   : lines(o, "scores_prev.svg", "Previous-token score of each head (attention from i to i-1)",
                           "training step", "mean attention weight", s, ns, st);
    }
    ok &= pattern_grid(o, two, "patterns.svg");
    ok &= patching_map(o, two, "patching.svg");
    ok &= pattern_grid(o, one, "patterns_one_layer.svg");

    if (res->compared) {
        static char names[IND_ARMS * IND_SEEDS][64];
        static const char *const dashes[IND_SEEDS] = {NULL, "6 3", "2 3"};
        static const plot_marker marks[IND_SEEDS] = {PLOT_MARKER_CIRCLE, PLOT_MARKER_SQUARE, PLOT_MARKER_TRIANGLE};
        static double xa[IND_ARMS * IND_SEEDS][IND_MAX_EVALS];
        ns = 0;
        for (int a = 0; a < IND_ARMS; a++)
            for (int sd = 0; sd < IND_SEEDS; sd++, ns++) {
                const ind_run *r = &res->arm[a][sd];
                for (int k = 0; k < r->n_evals; k++)
                    xa[ns][k] = (double)r->evals[k].step, y[ns][k] = r->evals[k].induction[r->best_layer][r->best_head];
                if (r->phase_step >= 0)
                    snprintf(names[ns], sizeof names[ns], "%s s%" PRIu64 ": %" PRId64, ind_arm_name(a), r->cfg.seed,
                             r->phase_step);
                else snprintf(names[ns], sizeof names[ns], "%s s%" PRIu64 ": none", ind_arm_name(a), r->cfg.seed);
                s[ns] = (plot_series){names[ns], xa[ns], y[ns], r->n_evals};
                st[ns] = (plot_style){ARM_COLORS[a], dashes[sd], marks[sd]};
            }
        ok &= lines(o, "compare.svg", "Best last-layer induction score (legend: arm, seed: phase step)",
                    "training step", "mean attention weight", s, ns, st);
    }
    return ok;
}

/* ---- the experiment ---------------------------------------------------------------------------------- */

static bool write_csvs(const ind_options *o, const ind_result *res) {
    atomic_file a;
    FILE *f;
    bool ok = true;
    if ((f = open_csv(o, "training.csv", &a))) {
        atomic_file b;
        FILE *g = open_csv(o, "heads.csv", &b);
        if (g) {
            fprintf(f, "model,step,loss_all,loss_first,loss_repeat,icl_score\n");
            fprintf(g, "model,step,layer,head,prev_token_score,induction_score,duplicate_token_score\n");
            csv_run_rows(f, g, &res->two, "two_layer");
            csv_run_rows(f, g, &res->one, "one_layer");
            ok &= close_csv(o, &b, "heads.csv");
        } else ok = false;
        ok &= close_csv(o, &a, "training.csv");
    } else ok = false;
    if ((f = open_csv(o, "ablation.csv", &a))) {
        fprintf(f, "model,layer,head,prev_token_score,induction_score,loss_repeat,loss_repeat_zeroed,loss_repeat_mean,"
                "loss_first,loss_first_zeroed,loss_first_mean\n");
        csv_ablation_rows(f, &res->two, "two_layer");
        csv_ablation_rows(f, &res->one, "one_layer");
        ok &= close_csv(o, &a, "ablation.csv");
    } else ok = false;
    if ((f = open_csv(o, "layers.csv", &a))) {
        fprintf(f, "model,layer,loss_repeat,loss_repeat_zeroed,loss_repeat_mean,loss_first,loss_first_zeroed,"
                "loss_first_mean\n");
        csv_layer_rows(f, &res->two, "two_layer");
        csv_layer_rows(f, &res->one, "one_layer");
        ok &= close_csv(o, &a, "layers.csv");
    } else ok = false;
    if ((f = open_csv(o, "patching.csv", &a))) {
        fprintf(f, "model,layer,head,loss_repeat_clean,loss_repeat_corrupted,loss_repeat_patched,share\n");
        const ind_run *runs[2] = {&res->two, &res->one};
        for (int k = 0; k < 2; k++)
            for (int64_t l = 0; l < runs[k]->cfg.n_layer; l++)
                for (int64_t h = 0; h < runs[k]->cfg.n_head; h++)
                    fprintf(f, "%s,%" PRId64 ",%" PRId64 ",%.17g,%.17g,%.17g,%.17g\n", k ? "one_layer" : "two_layer", l, h,
                            runs[k]->base_repeat, runs[k]->corrupt_repeat, runs[k]->patch_repeat[l][h],
                            patch_share(runs[k], l, h));
        ok &= close_csv(o, &a, "patching.csv");
    } else ok = false;
    if ((f = open_csv(o, "patterns.csv", &a))) {
        fprintf(f, "model,layer,head,query,key,weight\n");
        csv_pattern_rows(f, &res->two, "two_layer");
        csv_pattern_rows(f, &res->one, "one_layer");
        ok &= close_csv(o, &a, "patterns.csv");
    } else ok = false;
    if ((f = open_csv(o, "sequence.csv", &a))) {
        const ind_run *r = &res->two;
        fprintf(f, "position,token,part\n");
        for (int64_t i = 0; i < r->cfg.n; i++)
            fprintf(f, "%" PRId64 ",%" PRId32 ",%s\n", i, r->pattern_ids[i],
                    i < r->pattern_prefix                                 ? "prefix"
                    : i < r->pattern_prefix + r->pattern_segment           ? "first"
                    : i >= r->pattern_repeat && i < r->pattern_repeat + r->pattern_segment ? "repeat"
                                                                           : "random");
        ok &= close_csv(o, &a, "sequence.csv");
    } else ok = false;
    if ((f = open_csv(o, "summary.csv", &a))) {
        fprintf(f, "model,layers,params,steps,seconds,loss_first,loss_repeat,icl_score,best_layer,best_head,"
                "best_induction_score,best_prev_token_score,best_duplicate_token_score,phase_step,loss_drop_step,"
                "loss_repeat_best_zeroed\n");
        const ind_run *runs[2] = {&res->two, &res->one};
        for (int k = 0; k < 2; k++) {
            const ind_run *r = runs[k];
            const ind_eval *e = last_eval(r);
            int hp = 0;
            double dup = 0;
            for (int64_t h = 0; h < r->cfg.n_head; h++) dup = fmax(dup, e->dup[0][h]);
            fprintf(f, "%s,%" PRId64 ",%" PRId64 ",%" PRId64 ",%.17g,%.17g,%.17g,%.17g,%d,%d,%.17g,%.17g,%.17g,%" PRId64
                    ",%" PRId64 ",%.17g\n", k ? "one_layer" : "two_layer", r->cfg.n_layer, r->params, r->cfg.steps,
                    r->seconds, e->loss_first, e->loss_repeat, e->icl, r->best_layer, r->best_head,
                    e->induction[r->best_layer][r->best_head], best_of(e, r, 0, false, &hp), dup, r->phase_step,
                    r->loss_drop_step, r->zero_repeat[r->best_layer][r->best_head]);
        }
        ok &= close_csv(o, &a, "summary.csv");
    } else ok = false;
    if (res->compared) {
        if ((f = open_csv(o, "compare.csv", &a))) {
            fprintf(f, "arm,seed,phase_step,loss_drop_step,best_layer,best_head,best_induction_score,loss_first,"
                    "loss_repeat,seconds\n");
            for (int arm = 0; arm < IND_ARMS; arm++)
                for (int sd = 0; sd < IND_SEEDS; sd++) {
                    const ind_run *r = &res->arm[arm][sd];
                    const ind_eval *e = last_eval(r);
                    fprintf(f, "%s,%" PRIu64 ",%" PRId64 ",%" PRId64 ",%d,%d,%.17g,%.17g,%.17g,%.17g\n", ind_arm_name(arm),
                            r->cfg.seed, r->phase_step, r->loss_drop_step, r->best_layer, r->best_head,
                            e->induction[r->best_layer][r->best_head], e->loss_first, e->loss_repeat, r->seconds);
                }
            ok &= close_csv(o, &a, "compare.csv");
        } else ok = false;
    }
    return ok;
}

static void print_compare(FILE *log, const ind_result *res) {
    fprintf(log, "\nscale comparison (%d seeds each, %" PRId64 " steps; phase step = the best last-layer head's induction "
            "score reaches half its final value, -1: no head reached %.2f)\n", IND_SEEDS, res->arm[0][0].cfg.steps,
            IND_FORMED);
    fprintf(log, "  arm              seed  phase step  loss drop step  final induction  loss first  loss repeated\n");
    for (int a = 0; a < IND_ARMS; a++) {
        for (int sd = 0; sd < IND_SEEDS; sd++) {
            const ind_run *r = &res->arm[a][sd];
            const ind_eval *e = last_eval(r);
            fprintf(log, "  %-15s %5" PRIu64 "  %10" PRId64 "  %14" PRId64 "  %15.4f  %10.4f  %13.4f\n", ind_arm_name(a),
                    r->cfg.seed, r->phase_step, r->loss_drop_step, e->induction[r->best_layer][r->best_head],
                    e->loss_first, e->loss_repeat);
        }
    }
}

bool ind_study(const ind_options *o, ind_result *res) {
    double t0 = seconds_now();
    memset(res, 0, sizeof *res);
    const ind_config *c = &o->cfg;
    FILE *out = o->log;
    if (out) {
        fprintf(out, "data: %s, V %" PRId64 ", n %" PRId64 " (segment length %" PRId64 " to %" PRId64 ", repeated %s)\n",
                ind_data_name(c->data), c->vocab, c->n, c->data == IND_DATA_REPEAT ? c->n / 2 : c->min_segment,
                c->data == IND_DATA_REPEAT ? c->n / 2 : ind_max_segment(c),
                c->place == IND_PLACE_RANDOM ? "at a random place" : "at the end");
        fprintf(out, "model: attention-only, %" PRId64 " heads, d_model %" PRId64 ", norm %s, qk-norm %s, positions %s, "
                "scale %s\n", c->n_head, c->d_model, qkv_norm_kind_name(c->norm), qkv_norm_kind_name(c->qk_norm),
                qkv_positions_kind_name(c->positions), c->scale == QKV_SCALE_DEFAULT ? "1/sqrt(d_head)" : "custom");
        fprintf(out, "initialisation: embeddings N(0, %g^2), W_Q W_K W_V W_U N(0, %g^2), W_O N(0, (%g / sqrt(2 layers))^2)\n",
                c->init_embed_std, c->init_std, c->init_std);
        if (c->scale != QKV_SCALE_DEFAULT) fprintf(out, "  (scale %g)\n", c->scale);
        fprintf(out, "training: AdamW lr %g (warm-up %" PRId64 " steps, then flat), weight decay %g, clip %g, batch %"
                PRId64 ", %" PRId64 " steps, measured every %" PRId64 " on %" PRId64 " sequences, seed %" PRIu64 "\n",
                c->lr, c->warmup, c->weight_decay, c->clip, c->batch, c->steps, c->eval_every, c->eval_batch, c->seed);
    }
    ind_config one = *c;
    one.n_layer = 1;
    char label[32];
    snprintf(label, sizeof label, "%" PRId64 " layers", c->n_layer);
    if (!ind_train(c, &res->two, o->progress, label)) return false;
    if (!ind_train(&one, &res->one, o->progress, "1 layer")) return false;
    if (o->compare) {
        for (int a = 0; a < IND_ARMS; a++)
            for (int sd = 0; sd < IND_SEEDS; sd++) {
                ind_config k = *c;
                k.seed = c->seed + (uint64_t)sd;
                if (o->compare_steps > 0) k.steps = o->compare_steps;
                k.scale = a == 1 ? 1.0 : QKV_SCALE_DEFAULT;
                k.qk_norm = a == 2 ? QKV_NORM_LAYER : QKV_NORM_NONE;
                snprintf(label, sizeof label, "%s s%d", a == 0 ? "sqrt" : a == 1 ? "one" : "qknorm", sd);
                if (!ind_train(&k, &res->arm[a][sd], o->progress, label)) return false;
            }
        res->compared = true;
    }
    if (out) {
        print_training(out, &res->two, "two-layer model");
        print_heads(out, &res->two);
        print_dup_and_layers(out, &res->two);
        print_phase(out, &res->two);
        print_training(out, &res->one, "one-layer control");
        print_heads(out, &res->one);
        print_dup_and_layers(out, &res->one);
        const ind_eval *e2 = last_eval(&res->two), *e1 = last_eval(&res->one);
        fprintf(out, "\nat the end: repeated-half loss / first-half loss = %.4f / %.4f (2 layers), %.4f / %.4f (1 layer);"
                " ln V = %.4f\n", e2->loss_repeat, e2->loss_first, e1->loss_repeat, e1->loss_first, log((double)c->vocab));
        fprintf(out, "zeroing head %d of layer %d raises the two-layer model's repeated-half loss from %.4f to %.4f\n",
                res->two.best_head, res->two.best_layer, res->two.base_repeat,
                res->two.zero_repeat[res->two.best_layer][res->two.best_head]);
        if (res->compared) print_compare(out, res);
        fprintf(out, "\n");
    }
    bool ok = write_csvs(o, res) && plots(o, res);
    res->seconds = seconds_now() - t0;
    return ok;
}

void ind_result_free(ind_result *res) {
    if (!res) return;
    ind_run_free(&res->two);
    ind_run_free(&res->one);
    for (int a = 0; a < IND_ARMS; a++)
        for (int sd = 0; sd < IND_SEEDS; sd++) ind_run_free(&res->arm[a][sd]);
}
