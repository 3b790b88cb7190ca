/*
 * study.h — the four parts of examples/softmax_study: why attention divides its scores by sqrt(d_k).
 *
 * Each part computes with qkv's operators and autograd, prints a table to opt->log (if not NULL), writes
 * CSV and SVG files into opt->out_dir, and fills a result struct that tests/test_study.c checks.
 *   1. study_spread      std of q.k for unit-variance q, k against sqrt(d_k), with and without the scale
 *   2. study_saturation  how one-hot a softmax row of n keys gets as d_k grows, and what f32 rounds to 0
 *   3. study_gradients   |dL/dS| through the softmax Jacobian and |dL/dW^Q| at initialisation, f64 and f32
 *   4. study_training    the copy task (gauss and one-hot embeddings) per d_k, scale and seed
 * The three scales compared everywhere: 1/sqrt(d_k) (the seed's), 1 (left out) and 1/d_k.
 */
#ifndef QKV_EXAMPLES_STUDY_H
#define QKV_EXAMPLES_STUDY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "atomic_file.h"
#include "plot.h"

typedef struct study_options {
    const char *out_dir; /* existing folder for the CSV and SVG files                              */
    bool quick;          /* smaller samples and budgets (the test's mode)                          */
    uint64_t seed;       /* every random draw follows from it                                      */
    FILE *log;           /* tables and progress; NULL for silence                                  */
} study_options;

enum { STUDY_SCALE_SQRT, STUDY_SCALE_ONE, STUDY_SCALE_DK, STUDY_SCALES };
/* The scale's value at d_k, and its name ("1/sqrt(d_k)", "1", "1/d_k"; short: "sqrt", "one", "dk"). */
double study_scale_value(int scale, int64_t d_k);
const char *study_scale_name(int scale);
const char *study_scale_key(int scale);
/* The scale's colour in every plot: blue, red, green; and its marker: circle, square, triangle. */
const char *study_scale_color(int scale);
plot_marker study_scale_marker(int scale);

#define STUDY_MAX_DK 10 /* d_k = 2, 4, ..., 1024 */

/* ---- part 1 -------------------------------------------------------------------------------------- */
typedef struct study_spread_result {
    int count;
    int64_t samples;               /* N independent (q, k) pairs per d_k                      */
    int64_t d_k[STUDY_MAX_DK];
    double mean[STUDY_MAX_DK];     /* sample mean of q.k (expected 0)                          */
    double std[STUDY_MAX_DK];      /* sample std of q.k (expected sqrt(d_k))                   */
    double se[STUDY_MAX_DK];       /* standard error of that std: sqrt(d_k (2 + 6/d_k) / (4N))  */
    double std_sqrt[STUDY_MAX_DK]; /* std of q.k / sqrt(d_k) (expected 1)                      */
    double std_dk[STUDY_MAX_DK];   /* std of q.k / d_k (expected 1/sqrt(d_k))                  */
} study_spread_result;
bool study_spread(const study_options *opt, study_spread_result *r);

/* ---- part 2 -------------------------------------------------------------------------------------- */
typedef struct study_saturation_cell {
    double score_std;      /* std of the softmax input s q.k                                     */
    double max_weight;     /* mean over rows of max_j a_j (f64)                                  */
    double entropy;        /* mean over rows of -sum_j a_j ln a_j, nats (f64)                    */
    double below_1e6;      /* share of weights < 1e-6 (f64)                                      */
    double subnormal_f32;  /* share of f32 weights that are subnormal (0 < a < FLT_MIN)           */
    double zero_f32;       /* share of f32 weights that are exactly 0                            */
    double zero_f64;       /* share of f64 weights that are exactly 0                            */
    double onehot_f32;     /* share of rows whose largest f32 weight is exactly 1.0f             */
} study_saturation_cell;
typedef struct study_saturation_result {
    int count;
    int64_t n_keys, rows;
    int64_t d_k[STUDY_MAX_DK];
    study_saturation_cell cell[STUDY_MAX_DK][STUDY_SCALES];
} study_saturation_result;
bool study_saturation(const study_options *opt, study_saturation_result *r);

/* ---- part 3 -------------------------------------------------------------------------------------- */
typedef struct study_gradient_cell {
    double score_std;   /* std of the raw scores Q K^T (expected sqrt(d_k))                       */
    double max_weight;  /* mean largest attention weight                                          */
    double dA[2];       /* |dL/dA|_F, [0] f64, [1] f32                                             */
    double dS[2];       /* |dL/dS|_F, S = s Q K^T the softmax input: dS = A * (dA - rowsum(dA * A)) */
    double dWq[2];      /* |dL/dW^Q|_F                                                             */
    double dS_zero[2];  /* share of dL/dS entries that are exactly 0                               */
    double dS_median[2]; /* median over query rows i of |dL/dS_i| (the typical row, not the sum)     */
    double dS_row_zero[2]; /* share of query rows whose dL/dS_i is exactly 0 in every entry          */
} study_gradient_cell;
typedef struct study_gradients_result {
    int count;
    int64_t batch, n, d_model, vocab, trials;
    int64_t d_k[STUDY_MAX_DK];
    study_gradient_cell cell[STUDY_MAX_DK][STUDY_SCALES];
} study_gradients_result;
bool study_gradients(const study_options *opt, study_gradients_result *r);

/* ---- part 4 -------------------------------------------------------------------------------------- */
#define STUDY_TRAIN_DK 3    /* d_k = 16, 64, 256 */
#define STUDY_TRAIN_SEEDS 3
enum { STUDY_EMBED_GAUSS, STUDY_EMBED_ONEHOT, STUDY_EMBEDS };
typedef struct study_run {
    int64_t steps_to_100;   /* first evaluated step with 100% held-out accuracy; -1 if never       */
    double final_accuracy;  /* held-out token accuracy at the end of the budget                    */
    double best_accuracy;   /* best held-out accuracy seen at an evaluation                        */
    double init_q_std;      /* std of the components of Q = E W^Q at initialisation                */
    double init_score_std;  /* std of the raw scores q.k at initialisation                         */
    double init_entropy;    /* attention entropy (nats) at step 0                                  */
    double final_entropy;   /* attention entropy at the end                                        */
} study_run;
typedef struct study_training_result {
    int n_dk, n_seeds;
    int64_t d_k[STUDY_TRAIN_DK];
    int64_t steps[STUDY_EMBEDS], eval_every, n_evals; /* n_evals: evaluations of the longer budget */
    int64_t n_tokens, vocab;
    double lr;
    study_run run[STUDY_EMBEDS][STUDY_TRAIN_DK][STUDY_SCALES][STUDY_TRAIN_SEEDS];
} study_training_result;
bool study_training(const study_options *opt, study_training_result *r);

/* ---- shared helpers (study_common.c) ------------------------------------------------------------- */
/* "out_dir/name" into buf; false if it does not fit. */
bool study_path(const study_options *opt, const char *name, char *buf, size_t size);
/* Open out_dir/name for writing, atomically (atomic_file.h: the file appears whole at study_close); on
 * failure prints why to stderr and returns NULL. */
FILE *study_open(const study_options *opt, const char *name, atomic_file *file);
/* Finish a file opened by study_open; false (with a message) if anything failed, and then any old file of
 * that name is left as it was. */
bool study_close(atomic_file *file, const char *name);
/* Report a written plot (or the failure) and return success. */
bool study_plot_done(const study_options *opt, const char *name, bool ok);
/* plot_lines_styled_svg into out_dir/name, reported as study_plot_done does. */
bool study_lines(const study_options *opt, const char *name, const char *title, const char *x_label,
                 const char *y_label, const plot_series *series, int n_series, bool log_x, bool log_y,
                 const plot_style *styles);
double study_now(void);
/* Sample mean and std (n - 1 in the denominator) of n values. */
void study_mean_std(const double *x, int64_t n, double *mean, double *std);

#endif
