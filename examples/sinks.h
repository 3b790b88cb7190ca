/*
 * sinks.h — examples/sinks: attention sinks, massive activations and the StreamingLLM test, one small causal
 * language model per attention arm (the variants of qkv/attention.h), after Xiao et al. 2023 ("Efficient
 * Streaming Language Models with Attention Sinks"), Sun et al. 2024 ("Massive Activations in Large Language
 * Models") and Gu et al. 2024 ("When Attention Sink Emerges in Language Models", arXiv 2410.10781).
 *
 * The pieces, for the program (sinks.c) and tests/test_sinks.c:
 *
 *   sinks_arms        the arms: {name, a function that edits a qkv_model_config}; one table entry per arm
 *   sinks_batch       the data: BOS, then a mixture of bigram text (no lookup needed: the previous token says
 *                     all there is to say) and queries whose answer must be recalled from an earlier store
 *                     token (one attention lookup), or windows of a user's file (--data)
 *   sinks_head_stats  per head, from attention weights A [B*H, n, n]: the mean weight on the first token, the
 *                     mean row mass sum_j A_ij and the mean entropy of the row normalised to sum 1
 *   sinks_sink_rate   Gu et al.'s sink rate: the share of heads whose mean first-token weight exceeds epsilon
 *   sinks_massive     the largest |activation| of a residual stream [B, n, d], where it sits, the median |x|
 *   sinks_run         the whole experiment: trains every arm, prints tables to opt->log, writes CSV and SVG
 *                     files into opt->out_dir and fills a result
 *
 * Definitions (query rows i >= 1: row 0 has only itself to attend to, so its weight on the first token is 1
 * under any softmax and says nothing; Gu et al. average over every row, which differs by 1/n at most):
 *   first-token weight of head h   alpha_h = mean over batch rows and i in [1, n-1] of A[i, 0]
 *   sink head                      alpha_h > SINKS_EPSILON (Gu et al.'s epsilon, 0.3)
 *   sink rate                      (number of sink heads) / (n_layer n_head)
 *   row mass                       mean over the same rows of sum_j A[i, j] (1 for softmax and ssmax; the
 *                                  variants without the sum-to-one constraint may spend less, or more)
 *   entropy                        mean over the rows with any weight of -sum_j p_j ln p_j, p = |A[i, .]| /
 *                                  sum_j |A[i, j]| (= A / mass when A >= 0; NaN for a head that gives no row
 *                                  any weight: softpick can)
 * A is the hook_pattern of each layer: for the diff arm (differential attention) the signed A1 - lambda A2,
 * whose first-token weight is the net weight, whose row mass is 1 - lambda, and whose entropy is that of |A|.
 */
#ifndef QKV_EXAMPLES_SINKS_H
#define QKV_EXAMPLES_SINKS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "qkv.h"

#define SINKS_EPSILON 0.3 /* Gu et al. 2024's threshold on a head's mean first-token weight */
#define SINKS_MAX_ARMS 8
#define SINKS_MAX_LAYERS 8
#define SINKS_MAX_HEADS 16
#define SINKS_MAX_PROBES 128

/* ---- the arms ------------------------------------------------------------------------------------------ */

/* One arm: its name (CSV and file names, --arms) and the change it makes to the shared model configuration.
 * A new arm (gated output, differential attention) is one more entry of sinks_arms. */
typedef struct sinks_arm {
    const char *name;
    void (*apply)(qkv_model_config *c);
} sinks_arm;
extern const sinks_arm sinks_arms[];
extern const int sinks_arm_count;
/* The arm named name, or NULL. */
const sinks_arm *sinks_arm_find(const char *name);
/* Parse a comma-separated list of arm names ("softmax,sink") into arms[0 .. *n-1] (at most max); false with a
 * message in err naming the unknown or repeated name. */
bool sinks_arms_parse(const char *list, const sinks_arm **arms, int max, int *n, char *err, size_t size);

/* ---- the data ------------------------------------------------------------------------------------------ */

/* The synthetic language (vocabulary SINKS_VOCAB):
 *   0                 BOS, at position 0 of every sequence and nowhere else
 *   store(k, v)       one token per key k and value v (KEYS x VALUES of them): "k holds v"
 *   query(k)          one token per key: the next token is the value k holds
 *   value v           VALUES tokens; the rest are text tokens
 * Every sequence draws its own map k -> v. After BOS, each step emits, with probability SINKS_STORE_P, a store
 * token store(k, map[k]) (k uniform); with probability SINKS_QUERY_P, once some key is stored, a query query(k)
 * of a stored key (uniform among them) followed by the value map[k]; otherwise the next text token of a fixed bigram chain (each text token has 2 successors, weights
 * 3:1; the chain resumes after a store or a query). A value is known only from an earlier store of its key in
 * the same sequence: one attention lookup (query(k) to store(k, .)), needed at about 1 position in 10; at every
 * other position the previous token says all there is to say, and the heads have nothing useful to read. */
#define SINKS_KEYS 6
#define SINKS_VALUES 16
#define SINKS_TEXT 25
#define SINKS_VOCAB (1 + SINKS_KEYS * SINKS_VALUES + SINKS_KEYS + SINKS_VALUES + SINKS_TEXT)
#define SINKS_STORE_P 0.12
#define SINKS_QUERY_P 0.12

/* Where a target sits: what predicting it needs. */
typedef enum {
    SINKS_T_TEXT = 0, /* a text token after a text token: the bigram chain                                   */
    SINKS_T_LOOKUP,   /* the value after query(k): store(k, .) occurred earlier; recall it                  */
    SINKS_T_OTHER,    /* the first token, a store, a query, text after a query's value                      */
    SINKS_T_KINDS
} sinks_target_kind;

typedef struct sinks_data {
    bool from_file;        /* bytes of a file (vocab 257, BOS 256) instead of the synthetic language */
    int64_t vocab;
    uint8_t *bytes;        /* the file (from_file) */
    int64_t n_bytes, n_train; /* the first 90% trains, the rest is held out */
    double chain[SINKS_VOCAB][2]; /* synthetic: the two successors' probabilities */
    int32_t succ[SINKS_VOCAB][2];
    uint64_t seed;
} sinks_data;

/* The synthetic language of seed; or the bytes of path (at least 10 n_ctx of them), false with a message in
 * err. Free with sinks_data_free. */
void sinks_data_synthetic(sinks_data *d, uint64_t seed);
bool sinks_data_file(sinks_data *d, const char *path, int64_t n_ctx, char *err, size_t size);
void sinks_data_free(sinks_data *d);

/* ids [B * n] (row-major), each row BOS then n-1 tokens, a function of (data seed, split, step, row): split 0
 * trains, 1 is held out. kind [B * n] (may be NULL): the kind of the target ids[i] (kind of position 0 is
 * SINKS_T_OTHER; from a file every target is SINKS_T_OTHER). */
void sinks_batch(const sinks_data *d, int split, int64_t step, int64_t B, int64_t n, int32_t *ids, uint8_t *kind);

/* ---- the measures -------------------------------------------------------------------------------------- */

/* A [BH, n, n] f32 weights, BH = batch x H (row b*H + h is batch element b, head h): per head h, first[h],
 * mass[h] and entropy[h] as defined above (rows i in [1, n-1]; n >= 2). */
void sinks_head_stats(const float *A, int64_t BH, int64_t H, int64_t n, double *first, double *mass,
                      double *entropy);
/* The share of the count heads whose first-token weight exceeds eps. */
double sinks_sink_rate(const double *first, int count, double eps);

typedef struct sinks_massive_act {
    double max_abs, median_abs; /* the largest |x| and the median |x| over every element */
    int64_t row, pos, dim;      /* where the largest sits                                  */
    int32_t token;              /* ids[row, pos]                                           */
} sinks_massive_act;
/* x [B, n, d] f32 (a residual stream), ids [B * n]. scratch: B n d floats. */
sinks_massive_act sinks_massive(const float *x, const int32_t *ids, int64_t B, int64_t n, int64_t d, float *scratch);

/* ---- the experiment ------------------------------------------------------------------------------------ */

typedef struct sinks_config {
    int64_t n_layer, d_model, n_head, d_mlp, n_ctx; /* pre-layernorm, RoPE (so dropping a token shifts no
                                                      relative position), f32                            */
    int64_t batch, steps, warmup;   /* AdamW (0.9, 0.95), linear warm-up then cosine to lr/10               */
    double lr, weight_decay;        /* AdamW's decoupled decay (p -= lr wd p), on every parameter           */
    int64_t probe_every;            /* steps between probes (and the last step)                            */
    int64_t eval_batches;           /* held-out batches of `batch` sequences for the final losses          */
    int64_t shift;                  /* the StreamingLLM window starts at this position (>= 1)             */
} sinks_config;

/* The default run (docs/sinks.md): 2 attention-only layers (d_mlp 0), d_model 64, 4 heads, n_ctx 64, 4000 steps
 * of 16 sequences, AdamW lr 1e-2, weight decay 0.1, a probe every 100 steps, 8 held-out batches; quick (the
 * test's): d_model 32, n_ctx 32, 200 steps of 8, a probe every 20 steps, 2 held-out batches. */
sinks_config sinks_default_config(bool quick);
/* NULL if c is usable, else a message naming the flag. */
const char *sinks_config_problem(const sinks_config *c, char *buf, size_t size);

typedef struct sinks_options {
    const char *out_dir;       /* existing folder for the CSV and SVG files                 */
    sinks_config cfg;
    const sinks_arm *arms[SINKS_MAX_ARMS];
    int n_arms;                /* 0: every arm of sinks_arms                                 */
    const char *data_path;     /* NULL: the synthetic language                               */
    uint64_t seed;             /* the data, the initialisation (the same in every arm), batches */
    int jobs;                  /* arms trained at once, one context each (>= 1)              */
    int threads;               /* kernel threads per context                                 */
    FILE *log;                 /* tables; NULL: silence                                      */
    FILE *progress;            /* a line per finished arm (has times: not part of the tables) */
} sinks_options;

typedef struct sinks_arm_result {
    const char *name;
    int n_probes;
    int64_t step[SINKS_MAX_PROBES];
    double probe_loss[SINKS_MAX_PROBES];                  /* held-out loss of the probe batch          */
    double probe_sink_rate[SINKS_MAX_PROBES];
    double probe_first[SINKS_MAX_PROBES][SINKS_MAX_LAYERS]; /* mean over heads of alpha_h, per layer    */
    double probe_mass[SINKS_MAX_PROBES][SINKS_MAX_LAYERS];
    double probe_massive[SINKS_MAX_PROBES];               /* largest max|x| / median|x| over layers     */
    /* at the end, per layer and head (the last probe, on the probe batch) */
    double first[SINKS_MAX_LAYERS][SINKS_MAX_HEADS], mass[SINKS_MAX_LAYERS][SINKS_MAX_HEADS];
    double entropy[SINKS_MAX_LAYERS][SINKS_MAX_HEADS];
    double sink_rate;
    sinks_massive_act massive[SINKS_MAX_LAYERS];          /* hook_resid_post of each layer               */
    /* held-out losses (nats/token) over eval_batches batches */
    double init_loss, final_loss, loss_kind[SINKS_T_KINDS]; /* NaN for a kind with no targets          */
    /* the StreamingLLM test on the same batches: targets t in [2, n-1] with the sequence as it is and with
     * BOS dropped (every token one position earlier); targets t in [shift+1, n-1] of the window ids[shift ..]
     * with BOS put in front and without it */
    double loss_bos, loss_nobos, loss_window_bos, loss_window_nobos;
    double lookup_nobos;                                  /* the lookup targets' loss with BOS dropped   */
    double seconds;
} sinks_arm_result;

typedef struct sinks_result {
    sinks_config cfg;
    int64_t vocab, params;
    int n_arms;
    sinks_arm_result arm[SINKS_MAX_ARMS];
    double seconds;
} sinks_result;

/* The held-out losses of m (a causal model of data's vocabulary and opt->cfg's n_ctx) on opt->cfg.eval_batches
 * batches: r->final_loss, r->loss_kind, and the StreamingLLM fields (loss_bos, loss_nobos, lookup_nobos,
 * loss_window_bos, loss_window_nobos). False with the error in ctx. */
bool sinks_evaluate(qkv_ctx *ctx, qkv_model *m, const sinks_options *opt, const sinks_data *data, sinks_arm_result *r);
/* Train one model of arm on data and measure it (r filled; false with a message on stderr on an error). */
bool sinks_train_arm(const sinks_options *opt, const sinks_data *data, const sinks_arm *arm, sinks_arm_result *r);
/* Everything: every arm, the tables, the files. False on an error (message on stderr). */
bool sinks_run(const sinks_options *opt, sinks_result *r);

#endif
