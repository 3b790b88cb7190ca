/*
 * induction.h — examples/induction: watch a two-layer attention-only transformer learn to copy in context
 * (an induction head: [A][B] ... [A] -> [B]) while a one-layer model cannot (Elhage et al. 2021; Olsson et
 * al. 2022). The pieces, for the program (induction.c) and tests/test_induction.c:
 *
 *   ind_batch    the data: sequences of n random tokens of a vocabulary V whose last part repeats an earlier
 *                segment, every sequence a function of (seed, step, row)
 *   ind_train    train one model (qkv/model.h, attention-only, causal) with AdamW and a linear warm-up,
 *                measuring every eval_every steps on a fixed evaluation batch; then the attention patterns
 *                on one sequence, the ablation of every head, and the phase change step
 *   ind_study    the whole experiment: the two-layer model, the one-layer control, optionally the scale
 *                comparison; tables on opt->log, CSV and SVG files in opt->out_dir
 *
 * Positions of a sequence: a segment S of L random tokens appears twice, first at p, again at q >= p + L;
 * every other token is random. The length L is uniform in [min_segment, max_segment] ("segment") or n/2
 * ("repeat"). Where the copies sit (place):
 *   end     ids[0 .. p-1] a random prefix, S at p, S again at q = p + L, n = p + 2L (the repeat ends the sequence)
 *   random  p uniform in [0, n - 2L], then a gap of g random tokens, g uniform in [0, n - 2L - p], S again at
 *           q = p + L + g, and random tokens after it: the copy can sit anywhere, so neither its position nor
 *           the end of the sequence gives the answer away
 * Position i predicts ids[i+1]:
 *   repeated-half loss  mean over i in [q, q+L-2]  (targets in the second copy: predictable from context)
 *   first-half loss     mean over every other i in [0, n-2] (targets not predictable: with place end, the prefix
 *                       and the first copy, i in [0, p+L-1])
 *   in-context learning score  mean loss at the last w positions (i in [n-1-w, n-2]) minus the mean at the
 *                first w (i in [0, w-1]), w = max(1, n/8): negative when late tokens are easier
 * Scores of a head with attention A (rows queries, columns keys), averaged over the evaluation batch:
 *   previous-token score   mean over i in [1, n-1] of A[i, i-1]
 *   duplicate-token score  mean over i in [q, q+L-1] of A[i, i-(q-p)]: from a repeated token to its earlier
 *                          occurrence
 *   induction score        mean over i in [q, q+L-1] of A[i, i-(q-p)+1]: from a repeated token to the token
 *                          after its earlier occurrence
 */
#ifndef QKV_EXAMPLES_INDUCTION_H
#define QKV_EXAMPLES_INDUCTION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qkv.h"

#define IND_MAX_LAYERS 4
#define IND_MAX_HEADS 8
#define IND_MAX_EVALS 512
#define IND_MAX_N 256
#define IND_FORMED 0.2 /* the least final induction score that counts as an induction head */

typedef enum { IND_DATA_SEGMENT = 0, IND_DATA_REPEAT, IND_DATA_KINDS } ind_data_kind;
const char *ind_data_name(ind_data_kind kind); /* "segment", "repeat" */
typedef enum { IND_PLACE_END = 0, IND_PLACE_RANDOM, IND_PLACE_KINDS } ind_place_kind;
const char *ind_place_name(ind_place_kind kind); /* "end", "random" */

typedef struct ind_config {
    /* data */
    ind_data_kind data;
    ind_place_kind place;
    int64_t vocab, n, min_segment, max_segment; /* max_segment 0: n/2 */
    /* model: attention-only (d_mlp 0), causal */
    int64_t n_layer, n_head, d_model;
    double scale;                  /* QKV_SCALE_DEFAULT = 1/sqrt(d_head) */
    qkv_norm_kind norm, qk_norm;
    qkv_positions_kind positions;
    double init_std, init_embed_std; /* qkv_model_config's (W_O at init_std / sqrt(2 n_layer), GPT-2's) */
    /* training: AdamW, warm-up from lr/warmup to lr over warmup steps, then constant; clip the norm */
    double lr, weight_decay, clip;
    int64_t steps, warmup, batch;
    int64_t eval_every, eval_batch; /* measure every eval_every steps (and at step 0) on eval_batch sequences */
    uint64_t seed;                 /* the model's initialisation and every sequence */
    int threads;
} ind_config;

/* The default run's configuration; quick: the test's smaller one. */
ind_config ind_default_config(bool quick);
/* The literature's toy configuration (2 layers, d_model 64, 4 heads of 16, n 64, V 64, learned positions, a
 * segment of 8 to 24 tokens repeated at a random place, embeddings N(0, 1), AdamW 3e-3, batch 32, 3000 steps;
 * quick: 1500 steps) applied to c; the norm is left as it is (layer norm by default; none is the other
 * configuration the literature reports). */
void ind_literature_preset(ind_config *c, bool quick);
/* The longest segment c allows (max_segment, or n/2 when it is 0). */
int64_t ind_max_segment(const ind_config *c);

/* One measurement during training. */
typedef struct ind_eval {
    int64_t step;
    double loss_all, loss_first, loss_repeat, icl;
    double prev[IND_MAX_LAYERS][IND_MAX_HEADS], induction[IND_MAX_LAYERS][IND_MAX_HEADS];
    double dup[IND_MAX_LAYERS][IND_MAX_HEADS];
} ind_eval;

typedef struct ind_run {
    ind_config cfg;
    int64_t params;
    int n_evals;
    ind_eval evals[IND_MAX_EVALS];
    /* the head of the last layer with the highest final induction score, and the phase change: the first
     * measured step where its induction score reaches half its final value (-1 when the final score is
     * below IND_FORMED: no induction head formed, and "half of it" would be reached at step 0 by the
     * attention of an untrained head, about 1 / (the number of keys)); loss_drop_step: the first
     * measured step where the repeated-half loss has fallen half way from its value at step 0 to its final
     * value (-1: never) */
    int best_layer, best_head;
    int64_t phase_step, loss_drop_step;
    /* ablation on the evaluation batch after training: the repeated- and first-half loss with each head's
     * output zeroed, or replaced by its mean (qkv_model_ablate_head) */
    double base_repeat, base_first;
    double zero_repeat[IND_MAX_LAYERS][IND_MAX_HEADS], zero_first[IND_MAX_LAYERS][IND_MAX_HEADS];
    double mean_repeat[IND_MAX_LAYERS][IND_MAX_HEADS], mean_first[IND_MAX_LAYERS][IND_MAX_HEADS];
    /* the same with every head of a layer ablated at once */
    double layer_zero_repeat[IND_MAX_LAYERS], layer_zero_first[IND_MAX_LAYERS];
    double layer_mean_repeat[IND_MAX_LAYERS], layer_mean_first[IND_MAX_LAYERS];
    /* activation patching (noising, qkv_model_patch_sweep at blocks.L.attn.hook_z by head): the corrupted batch is
     * the evaluation batch with its first copy of S replaced by other random tokens; each head's output z in
     * the clean run is replaced by its value on the corrupted batch, and the clean repeated-half loss measured.
     * corrupt_repeat: that loss when the whole model runs on the corrupted batch (the clean targets). */
    double corrupt_repeat;
    double patch_repeat[IND_MAX_LAYERS][IND_MAX_HEADS];
    /* every head's attention on one evaluation sequence: pattern[((l * n_head + h) * n + i) * n + j] */
    double *pattern;
    int32_t pattern_ids[IND_MAX_N];
    int64_t pattern_prefix, pattern_segment, pattern_repeat; /* its p, L and q */
    double seconds;
} ind_run;

/* Fill ids [B * n] (row-major) for training step `step` (step < 0: the evaluation batch), and per row the
 * start p of the segment, its length L and the start q of its repeat. */
void ind_batch(const ind_config *c, int64_t step, int64_t B, int32_t *ids, int64_t *prefix, int64_t *segment,
               int64_t *repeat);

/* Check c; false with a message naming the field in err. */
bool ind_config_check(const ind_config *c, char *err, size_t size);

/* Train and measure one model. progress: a progress line while it trains (NULL: none); label names the run
 * in it. r->pattern is allocated (free it with ind_run_free). False (message on stderr) on error. */
bool ind_train(const ind_config *c, ind_run *r, FILE *progress, const char *label);
void ind_run_free(ind_run *r);

/* ---- the whole experiment ---------------------------------------------------------------------------- */

#define IND_ARMS 3  /* the scale comparison: 1/sqrt(d_head), 1, qk-norm (layer norm of q and k, 1/sqrt(d_head)) */
#define IND_SEEDS 3
const char *ind_arm_name(int arm); /* "1/sqrt(d_head)", "1", "qk_norm" */

typedef struct ind_options {
    const char *out_dir; /* existing folder for the CSV and SVG files */
    ind_config cfg;      /* the two-layer run's configuration (the control: the same with n_layer 1) */
    bool compare;        /* also the scale comparison (IND_ARMS x IND_SEEDS runs of cfg) */
    int64_t compare_steps; /* their training steps (0: cfg.steps) */
    FILE *log;           /* tables (NULL: silence) */
    FILE *progress;      /* progress lines (NULL: none) */
} ind_options;

typedef struct ind_result {
    ind_run two, one; /* the two-layer model and the one-layer control */
    bool compared;
    ind_run arm[IND_ARMS][IND_SEEDS];
    double seconds;
} ind_result;

/* Everything: trains, prints, writes every file. False on error (message on stderr). Free with
 * ind_result_free. */
bool ind_study(const ind_options *opt, ind_result *res);
void ind_result_free(ind_result *res);

#endif
