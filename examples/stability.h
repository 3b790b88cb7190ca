/*
 * stability.h — examples/stability: attention logit growth at high learning rates, and what qk-layernorm
 * and a logit soft-cap do about it, after Wortsman et al. 2024 ("Small-scale proxies for large-scale
 * Transformer training instabilities"), on a small causal model of qkv's model layer.
 *
 * A run trains one model (an arm, a peak learning rate, a seed) on a synthetic order-2 Markov language
 * whose entropy rate is known, and records its held-out loss before and after training, whether it
 * diverged, the largest attention logit |scale q.k| (over unmasked pairs, layers and heads) and the
 * smallest mean attention entropy of a head, probed every few steps on the training batch.
 * stability_run sweeps learning rate x arm x seed, prints tables to opt->log, writes CSV and SVG files into
 * opt->out_dir and fills a result that tests/test_stability.c checks.
 */
#ifndef QKV_EXAMPLES_STABILITY_H
#define QKV_EXAMPLES_STABILITY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The arms: 1/sqrt(d_head) (the seed's scale), 1 (left out), qk-layernorm with 1/sqrt(d_head), and
 * 1/sqrt(d_head) with the logits soft-capped at STAB_SOFTCAP (cap tanh(s / cap)). */
enum { STAB_ARM_SQRT, STAB_ARM_ONE, STAB_ARM_QKNORM, STAB_ARM_SOFTCAP, STAB_ARMS };
#define STAB_SOFTCAP 5.0
#define STAB_MAX_ARMS 8 /* the four above, or up to 8 attention-variant arms (stab_options.variant_arms) */
const char *stab_arm_name(int arm); /* "1/sqrt(d_head)", "scale 1", "qk-layernorm", "soft-cap 5" */
const char *stab_arm_key(int arm);  /* "sqrt", "one", "qknorm", "softcap" (CSV and file names)     */

#define STAB_MAX_LR 12
#define STAB_MAX_SEEDS 3
#define STAB_MAX_PROBES 64
#define STAB_ENTROPY_THRESHOLD 0.1 /* nats: a head's mean attention entropy below this is "collapsed" */

/* Every setting of a sweep. The source is fixed (an order-2 Markov language over 16 tokens, 3 successors per
 * context: its best possible loss is known); everything else is here. */
typedef struct stab_config {
    int64_t n_layer, d_model, n_head, d_mlp, n_ctx; /* the model: pre-layernorm, learned positions, f32     */
    int64_t batch, steps, warmup;  /* AdamW (0.9, 0.95, eps 1e-8): linear warm-up, then cosine decay        */
    double final_lr_frac;          /* the cosine ends at peak x this                                        */
    double decay_per_step;         /* decoupled weight decay per step at the peak (p -= peak wd p)          */
    double clip;                   /* clip the global gradient norm to this; 0: off                         */
    double z_loss;                 /* the training loss adds z_loss x mean over positions of (log Z)^2,    */
                                   /* Z the softmax's normaliser of the logits (PaLM's z-loss); 0: off      */
    double lr_lo, lr_hi;           /* the peak learning rates lr_lo x 10^(k / lr_per_decade) up to lr_hi     */
    int lr_per_decade;
    int n_seeds;                   /* seeds 0 .. n_seeds-1 of the initialisation and batches (<= 3)         */
    int64_t probe_every;           /* steps between probes of the logits and entropies                      */
    /* Instead of the four arms above: these arms of examples/sinks' table (sinks.h: an attention variant each,
     * at scale 1/sqrt(d_head)), n_variant_arms of them (1 .. STAB_MAX_ARMS); 0 (the presets): the four arms. */
    const struct sinks_arm *const *variant_arms;
    int n_variant_arms;
} stab_config;

/* The default sweep (docs/scaling.md Part 5): 2 layers, d_model 64, 4 heads, d_mlp 128, n_ctx 32, 300 steps
 * of 8 sequences, warm-up 30, cosine to lr/10, decay 1e-4, no clipping, no z-loss, lr 1e-4 to 1 in half
 * decades, 3 seeds; quick: lr 1e-3, 3.2e-2, 1, one seed, 40 steps. */
stab_config stab_default_config(bool quick);
/* Wortsman et al.'s small-model setting, where the models train close to the source's floor: d_mlp 256
 * (4x), n_ctx 64, 500 steps of 32 sequences, warm-up 50, cosine to lr/10, z-loss 1e-4, clipping at 1, lr 3e-4
 * to 0.3 in half decades, 3 seeds; quick: lr 3e-4, 1e-2, 0.3, one seed, 40 steps. */
stab_config stab_wortsman_config(bool quick);
/* NULL if c is usable, else a message naming the setting. */
const char *stab_config_problem(const stab_config *c, char *buf, size_t size);
/* Whether the sweep can probe an attention-variant arm: its largest logit and head entropy read one score
 * matrix and one pattern per layer, so an arm with differential attention (two of each) is refused. */
bool stab_arm_probeable(const struct sinks_arm *arm);

typedef struct stab_options {
    const char *out_dir; /* existing folder for the CSV and SVG files                        */
    bool quick;          /* the test's mode: fewer learning rates, steps and seeds            */
    uint64_t seed;       /* the language, the initialisations and the batches follow from it  */
    int jobs;            /* runs trained at once, each in its own context (>= 1)              */
    int threads;         /* kernel threads per run's context (>= 1)                           */
    FILE *log;           /* tables and progress; NULL for silence                             */
    const stab_config *config; /* the sweep's settings; NULL: stab_default_config(quick)      */
} stab_options;

typedef struct stab_run {
    double init_loss;        /* held-out loss (nats/token) before training                        */
    double final_loss;       /* held-out loss after training (NaN if the run produced a NaN)      */
    bool diverged;           /* final loss NaN or above init_loss                                 */
    double max_logit;        /* largest |scale q.k| seen at a probe, before any soft-cap          */
    double min_entropy;      /* smallest mean attention entropy of one head at a probe (nats)     */
    int64_t collapse_step;   /* first probed step with min entropy < STAB_ENTROPY_THRESHOLD; -1   */
    int n_probes;
    double logit[STAB_MAX_PROBES];   /* max |logit| at probe p (step p * probe_every)             */
    double entropy[STAB_MAX_PROBES]; /* min head entropy at probe p                               */
} stab_run;

typedef struct stab_result {
    int n_arms;                   /* STAB_ARMS, or n_variant_arms                                        */
    const char *arm_name[STAB_MAX_ARMS], *arm_key[STAB_MAX_ARMS]; /* as printed / in the CSV files     */
    int n_lr, n_seeds;
    double lr[STAB_MAX_LR];
    stab_config cfg;      /* the settings the sweep ran with                                          */
    int64_t steps, warmup, batch, n_ctx, d_model, n_layer, n_head, d_mlp, vocab, probe_every;
    double entropy_rate;  /* nats/token of the source (the best loss for late positions)            */
    double loss_floor;    /* the best mean loss over a window's targets (the first has one token)   */
    double uniform_loss;  /* ln(vocab)                                                              */
    stab_run run[STAB_MAX_ARMS][STAB_MAX_LR][STAB_MAX_SEEDS];
    double mean_loss[STAB_MAX_ARMS][STAB_MAX_LR]; /* mean final loss over seeds (NaN counts as init)    */
    double sensitivity[STAB_MAX_ARMS]; /* mean over lr of min(mean loss, init) - min over lr of it      */
    int trained[STAB_MAX_ARMS];       /* lrs at which every seed ends within 0.1 nats of the best mean loss
                                      of any arm at any lr ("the lrs that train")                        */
    double seconds;
} stab_result;

/* Run the whole sweep; false (with a message on stderr) on an error of the library or of a file. */
bool stability_run(const stab_options *opt, stab_result *r);

#endif
