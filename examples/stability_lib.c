/*
 * stability_lib.c — the learning-rate sweep of examples/stability (stability.h): the synthetic language,
 * one training run with its probes, the sweep over arm x learning rate x seed on a few worker threads
 * (each run in its own context, so the result does not depend on how runs are spread), and the tables,
 * CSV files and plots.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "stability.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atomic_file.h"
#include "plot.h"
#include "qkv.h"
#include "sinks.h"

#define PROG "stability"

const char *stab_arm_name(int arm) {
    static const char *const names[STAB_ARMS] = {"1/sqrt(d_head)", "scale 1", "qk-layernorm", "soft-cap 5"};
    return names[arm];
}
const char *stab_arm_key(int arm) {
    static const char *const keys[STAB_ARMS] = {"sqrt", "one", "qknorm", "softcap"};
    return keys[arm];
}
static const char *arm_color(int arm) {
    static const char *const colors[STAB_MAX_ARMS] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
    return colors[arm];
}
static plot_marker arm_marker(int arm) {
    static const plot_marker markers[STAB_MAX_ARMS] = {PLOT_MARKER_CIRCLE, PLOT_MARKER_SQUARE, PLOT_MARKER_TRIANGLE,
                                                       PLOT_MARKER_DIAMOND, PLOT_MARKER_SQUARE, PLOT_MARKER_CIRCLE,
                                                       PLOT_MARKER_DIAMOND, PLOT_MARKER_TRIANGLE};
    return markers[arm];
}
/* The arm's line: solid, dashed, dotted, dash-dot, so arms whose curves coincide stay apart. */
static const char *arm_dash(int arm) {
    static const char *const dashes[STAB_MAX_ARMS] = {NULL, "8 3", "2 2", "8 3 2 3", NULL, "8 3", "2 2", "8 3 2 3"};
    return dashes[arm];
}

/* A learning rate as it appears in a file name: 2 significant digits, mantissa and exponent ("1e0", "1e-1",
 * "3.2e-4"), so stability_logit_lr_1e-1.svg names the rate and not its index in the sweep. */
static void lr_name(double lr, char *buf, size_t size) {
    int e = (int)floor(log10(lr) + 1e-9);
    double m = lr / pow(10, e);
    if (m >= 9.95) m /= 10, e++; /* 9.96e-3 rounds to 1.0e-2 */
    char mant[16];
    snprintf(mant, sizeof mant, "%.1f", m);
    size_t n = strlen(mant);
    if (n >= 2 && !strcmp(mant + n - 2, ".0")) mant[n - 2] = '\0';
    snprintf(buf, size, "%se%d", mant, e);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: the language's and the batches' random numbers, a function of (seed, counters). */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static double uniform01(uint64_t *state) { return ((double)(mix((*state)++) >> 11) + 0.5) * 0x1p-53; }

/* ---- the language: an order-2 Markov source over V tokens ----------------------------------------- */

#define LANG_V 16
#define LANG_SUCC 3 /* each context (a, b) is followed by one of 3 tokens */
#define STREAM 65536

typedef struct language {
    double p[LANG_V * LANG_V][LANG_V]; /* p[a V + b][c] = P(c | a, b) */
    int32_t train[STREAM], held[STREAM];
    double entropy_rate, first_entropy; /* H(x_t | x_t-1, x_t-2) and H(x_t | x_t-1), stationary */
} language;

static void stream(const language *L, uint64_t *st, int32_t *out, int64_t len) {
    int32_t a = (int32_t)(mix((*st)++) % LANG_V), b = (int32_t)(mix((*st)++) % LANG_V);
    for (int64_t t = 0; t < len; t++) {
        double u = uniform01(st), acc = 0;
        int32_t c = LANG_V - 1;
        for (int32_t j = 0; j < LANG_V; j++)
            if ((acc += L->p[a * LANG_V + b][j]) > u && L->p[a * LANG_V + b][j] > 0) {
                c = j;
                break;
            }
        out[t] = c, a = b, b = c;
    }
}

static void make_language(language *L, uint64_t seed) {
    uint64_t st = mix(seed ^ 0x5ab1e5ab1eull);
    memset(L->p, 0, sizeof L->p);
    for (int s = 0; s < LANG_V * LANG_V; s++) { // 3 distinct successors, weights Dirichlet(1, 1, 1)
        int succ[LANG_SUCC] = {0}, n = 0;
        while (n < LANG_SUCC) {
            int c = (int)(mix(st++) % LANG_V), fresh = 1;
            for (int k = 0; k < n; k++) fresh &= succ[k] != c;
            if (fresh) succ[n++] = c;
        }
        double w[LANG_SUCC], sum = 0;
        for (int k = 0; k < LANG_SUCC; k++) sum += w[k] = -log(uniform01(&st));
        for (int k = 0; k < LANG_SUCC; k++) L->p[s][succ[k]] = w[k] / sum;
    }
    // stationary distribution pi over the pair states (a, b) -> (b, c), by power iteration
    static double pi[LANG_V * LANG_V], next[LANG_V * LANG_V];
    for (int s = 0; s < LANG_V * LANG_V; s++) pi[s] = 1.0 / (LANG_V * LANG_V);
    for (int it = 0; it < 2000; it++) {
        memset(next, 0, sizeof next);
        for (int s = 0; s < LANG_V * LANG_V; s++)
            for (int c = 0; c < LANG_V; c++) next[(s % LANG_V) * LANG_V + c] += pi[s] * L->p[s][c];
        // average with the old vector: converges also when the chain is periodic
        for (int s = 0; s < LANG_V * LANG_V; s++) pi[s] = 0.5 * (pi[s] + next[s]);
    }
    double h2 = 0, pb[LANG_V] = {0}, pbc[LANG_V][LANG_V] = {{0}};
    for (int s = 0; s < LANG_V * LANG_V; s++)
        for (int c = 0; c < LANG_V; c++) {
            double pc = L->p[s][c];
            if (pc > 0) h2 -= pi[s] * pc * log(pc); // H2 = -sum pi(a,b) p(c|a,b) ln p(c|a,b)
            pbc[s % LANG_V][c] += pi[s] * pc;
        }
    for (int s = 0; s < LANG_V * LANG_V; s++) pb[s % LANG_V] += pi[s];
    double h1 = 0; // H1 = -sum p(b, c) ln p(c | b)
    for (int b = 0; b < LANG_V; b++)
        for (int c = 0; c < LANG_V; c++)
            if (pbc[b][c] > 0) h1 -= pbc[b][c] * log(pbc[b][c] / pb[b]);
    L->entropy_rate = h2, L->first_entropy = h1;
    stream(L, &st, L->train, STREAM);
    stream(L, &st, L->held, STREAM);
}

/* ---- the settings -------------------------------------------------------------------------------------- */

stab_config stab_default_config(bool quick) {
    stab_config c = {0};
    c.n_layer = 2, c.d_model = 64, c.n_head = 4, c.d_mlp = 128, c.n_ctx = 32;
    c.batch = 8, c.steps = quick ? 40 : 300, c.warmup = c.steps / 10;
    c.final_lr_frac = 0.1, c.decay_per_step = 1e-4, c.clip = 0, c.z_loss = 0;
    // default 1e-4 .. 1 in half decades; quick 1e-3, 3.2e-2, 1 (every decade and a half)
    c.lr_lo = quick ? 1e-3 : 1e-4, c.lr_hi = 1.0, c.lr_per_decade = quick ? 0 : 2;
    c.n_seeds = quick ? 1 : 3;
    c.probe_every = quick ? 5 : 10;
    return c;
}

stab_config stab_wortsman_config(bool quick) {
    stab_config c = stab_default_config(quick);
    c.d_mlp = 256, c.n_ctx = 64, c.batch = 32, c.steps = quick ? 40 : 500, c.warmup = c.steps / 10;
    c.z_loss = 1e-4, c.clip = 1.0;
    c.lr_lo = 3e-4, c.lr_hi = 0.3, c.lr_per_decade = quick ? 0 : 2;
    c.probe_every = quick ? 5 : 10;
    return c;
}

/* The sweep's learning rates, evenly spaced in log10: 10^(log10 lr_lo + k / per_decade) while the exponent
 * stays within log10 lr_hi; per_decade 0: three rates, lr_lo, the geometric middle and lr_hi. */
static int lr_grid(const stab_config *c, double *lr) {
    double e0 = log10(c->lr_lo), e1 = log10(c->lr_hi);
    if (c->lr_per_decade == 0) {
        for (int k = 0; k < 3; k++) lr[k] = pow(10.0, e0 + 0.5 * (e1 - e0) * k);
        return 3;
    }
    double step = 1.0 / c->lr_per_decade;
    int n = 0;
    for (int k = 0; n < STAB_MAX_LR && e0 + step * k <= e1 + 1e-9; k++) lr[n++] = pow(10.0, e0 + step * k);
    return n;
}

const char *stab_config_problem(const stab_config *c, char *buf, size_t size) {
#define BAD(...) return snprintf(buf, size, __VA_ARGS__), buf
    if (c->n_layer < 1 || c->n_layer > 64) BAD("--layers %" PRId64 " must be in [1, 64]", c->n_layer);
    if (c->n_head < 1 || c->d_model < 1 || c->d_model % c->n_head)
        BAD("--d-model %" PRId64 " must be a positive multiple of --heads %" PRId64, c->d_model, c->n_head);
    if (c->d_mlp < 0) BAD("--d-mlp %" PRId64 " must be >= 0", c->d_mlp);
    if (c->n_ctx < 3 || c->n_ctx > 4096) BAD("--n-ctx %" PRId64 " must be in [3, 4096]", c->n_ctx);
    if (c->batch < 1) BAD("--batch %" PRId64 " must be >= 1", c->batch);
    if (c->steps < 1) BAD("--steps %" PRId64 " must be >= 1", c->steps);
    if (c->warmup < 1 || c->warmup >= c->steps)
        BAD("--warmup %" PRId64 " must be in [1, --steps %" PRId64 ")", c->warmup, c->steps);
    if (c->steps / c->probe_every + 1 > STAB_MAX_PROBES)
        BAD("--steps %" PRId64 " with a probe every %" PRId64 " steps makes more than %d probes", c->steps,
            c->probe_every, STAB_MAX_PROBES);
    if (!(c->final_lr_frac >= 0 && c->final_lr_frac <= 1)) BAD("--final-lr %g must be in [0, 1]", c->final_lr_frac);
    if (!(c->decay_per_step >= 0 && c->decay_per_step < 1)) BAD("--decay %g must be in [0, 1)", c->decay_per_step);
    if (!(c->clip >= 0) || !isfinite(c->clip)) BAD("--clip %g must be finite and >= 0 (0: off)", c->clip);
    if (!(c->z_loss >= 0) || !isfinite(c->z_loss)) BAD("--z-loss %g must be finite and >= 0 (0: off)", c->z_loss);
    if (!(c->lr_lo > 0 && c->lr_hi >= c->lr_lo) || !isfinite(c->lr_hi))
        BAD("--lr-min %g and --lr-max %g: the rates must be positive and ordered", c->lr_lo, c->lr_hi);
    if (c->lr_per_decade < 0 || c->lr_per_decade > 12) BAD("--lr-per-decade %d must be in [0, 12]", c->lr_per_decade);
    if (c->lr_per_decade > 0 && (log10(c->lr_hi) - log10(c->lr_lo)) * c->lr_per_decade + 1 > STAB_MAX_LR + 1e-9)
        BAD("--lr-min %g to --lr-max %g at --lr-per-decade %d makes more than %d rates", c->lr_lo, c->lr_hi,
            c->lr_per_decade, STAB_MAX_LR);
    if (c->n_variant_arms < 0 || c->n_variant_arms > STAB_MAX_ARMS || (c->n_variant_arms && !c->variant_arms))
        BAD("--arms: %d attention-variant arms; 1 to %d, or 0 for the four scale arms", c->n_variant_arms, STAB_MAX_ARMS);
    for (int a = 0; a < c->n_variant_arms; a++) {
        if (!c->variant_arms[a] || !c->variant_arms[a]->apply) BAD("--arms: attention-variant arm %d is missing", a);
        if (!stab_arm_probeable(c->variant_arms[a]))
            BAD("--arms: arm '%s' has differential attention, whose two score matrices per layer the sweep's probe "
                "(one largest logit, one entropy per head) cannot read", c->variant_arms[a]->name);
    }
    if (c->n_seeds < 1 || c->n_seeds > STAB_MAX_SEEDS) BAD("--seeds %d must be in [1, %d]", c->n_seeds, STAB_MAX_SEEDS);
    return NULL;
#undef BAD
}

bool stab_arm_probeable(const struct sinks_arm *arm) {
    qkv_model_config c = qkv_model_default_config();
    arm->apply(&c);
    return !c.attn_diff; // the probe reads one score matrix (QKV_INSPECT_SCORES) per layer
}

/* ---- one run ----------------------------------------------------------------------------------------- */

typedef struct sweep {
    const stab_options *opt;
    const language *L;
    stab_result *r;
    pthread_mutex_t lock;
    int next, total, done, failed;
    double t0;
} sweep;

#define EVAL_BATCHES 4

/* ids [B, n] from windows of src at offsets that are a function of (seed, salt, step, row). */
static qkv_tensor *window_batch(qkv_ctx *ctx, const int32_t *src, int64_t B, int64_t n, uint64_t seed, uint64_t salt,
                                int64_t step) {
    qkv_tensor *ids = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){B, n});
    if (!ids) return NULL;
    for (int64_t b = 0; b < B; b++) {
        uint64_t start = mix(seed ^ mix(salt ^ mix((uint64_t)step * 1000003u + (uint64_t)b))) % (STREAM - (uint64_t)n);
        memcpy(qkv_i32(ids) + b * n, src + start, (size_t)n * sizeof(int32_t));
    }
    return ids;
}

static double held_out_loss(qkv_ctx *ctx, qkv_model *m, const stab_result *r, const language *L, uint64_t seed) {
    bool was = qkv_set_grad_enabled(ctx, false);
    double sum = 0;
    for (int64_t e = 0; e < EVAL_BATCHES; e++) {
        qkv_tensor *ids = window_batch(ctx, L->held, r->batch, r->n_ctx, seed, 0xe7a1u, e);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), qkv_next_token_targets(ctx, ids));
        sum += loss ? qkv_get_flat(ctx, loss, 0) : NAN;
        qkv_step_end(ctx);
    }
    qkv_set_grad_enabled(ctx, was);
    return sum / EVAL_BATCHES;
}

/* After an inspected forward: the largest |S_ij| over j <= i, and the smallest over (layer, head) of the
 * mean over rows i >= 1 of the row entropy -sum_j A_ij ln A_ij (row 0 has one key: its entropy is 0). */
static bool probe(qkv_ctx *ctx, qkv_model *m, const stab_result *r, double *max_logit, double *min_entropy) {
    int64_t n = r->n_ctx, H = r->n_head;
    *max_logit = 0, *min_entropy = INFINITY;
    for (int64_t l = 0; l < r->n_layer; l++) {
        qkv_tensor *S = qkv_model_inspect(ctx, m, QKV_INSPECT_SCORES, l);
        qkv_tensor *A = qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, l);
        if (!S || !A) return false;
        const float *s = qkv_f32(S), *a = qkv_f32(A);
        for (int64_t bh = 0; bh < S->shape[0]; bh++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j <= i; j++) {
                    double v = fabs((double)s[(bh * n + i) * n + j]);
                    if (!(v <= *max_logit)) *max_logit = v; // a NaN logit wins
                }
        for (int64_t h = 0; h < H; h++) {
            double sum = 0;
            int64_t rows = 0;
            for (int64_t bh = h; bh < A->shape[0]; bh += H)
                for (int64_t i = 1; i < n; i++, rows++)
                    for (int64_t j = 0; j <= i; j++) {
                        double p = (double)a[(bh * n + i) * n + j];
                        if (p > 0) sum -= p * log(p);
                    }
            double mean = sum / (double)rows;
            if (!(mean >= *min_entropy)) *min_entropy = mean;
        }
    }
    return true;
}

/* The learning rate of step t: linear warm-up to peak, then cosine to peak x final_lr_frac. */
static double lr_at(const stab_result *r, double peak, int64_t t) {
    if (t < r->warmup) return peak * (double)(t + 1) / (double)r->warmup;
    double progress = (double)(t - r->warmup) / (double)(r->steps - r->warmup), f = r->cfg.final_lr_frac;
    return peak * (f + (1 - f) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}

/* The training loss: cross-entropy of logits [B, n, V] against the next tokens, plus z_loss x mean (log Z)^2. */
static qkv_tensor *training_loss(qkv_ctx *ctx, qkv_tensor *logits, qkv_tensor *ids, double z_loss) {
    qkv_tensor *ce = qkv_model_loss(ctx, logits, qkv_next_token_targets(ctx, ids));
    if (z_loss == 0) return ce;
    // log Z [B, n] = logsumexp over the vocabulary; z = mean (log Z)^2 over positions (the last one too)
    qkv_tensor *z = qkv_mean(ctx, qkv_square(ctx, qkv_logsumexp_dim(ctx, logits, -1, false)));
    return qkv_add(ctx, ce, qkv_mul_scalar(ctx, z, z_loss));
}

static bool train_one(const sweep *sw, int arm, int li, int si, stab_run *out) {
    const stab_result *r = sw->r;
    const stab_options *opt = sw->opt;
    qkv_options o = qkv_default_options();
    o.threads = opt->threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return fprintf(stderr, PROG ": cannot make a context\n"), false;
    uint64_t seed = mix(opt->seed * 31u + (uint64_t)si + 1u); // the same init and batches in every arm and lr
    qkv_model_config c = qkv_model_default_config();
    c.vocab = r->vocab, c.n_ctx = r->n_ctx, c.d_model = r->d_model, c.n_layer = r->n_layer;
    c.n_head = r->n_head, c.d_mlp = r->d_mlp, c.seed = seed;
    if (r->cfg.n_variant_arms > 0) {
        r->cfg.variant_arms[arm]->apply(&c); // an attention variant at 1/sqrt(d_head)
    } else {
        if (arm == STAB_ARM_ONE) c.attn_scale = 1.0;
        if (arm == STAB_ARM_QKNORM) c.qk_norm = QKV_NORM_LAYER;
        if (arm == STAB_ARM_SOFTCAP) c.attn_softcap = STAB_SOFTCAP;
    }
    qkv_model *m = qkv_model_new(ctx, &c);
    double peak = r->lr[li];
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    oo.lr = peak, oo.beta2 = 0.95, oo.eps = 1e-8;
    oo.weight_decay = r->cfg.decay_per_step / peak; // p *= 1 - lr wd: an independent decay per step at the peak
    qkv_optimizer *adam = m ? qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m)) : NULL;
    bool ok = adam != NULL;
    memset(out, 0, sizeof *out);
    out->collapse_step = -1, out->min_entropy = INFINITY;
    if (ok) out->init_loss = held_out_loss(ctx, m, r, sw->L, seed);
    bool nan_seen = false;
    for (int64_t t = 0; ok && t <= r->steps; t++) {
        bool probing = t % r->probe_every == 0 && out->n_probes < STAB_MAX_PROBES;
        qkv_model_set_inspect(m, probing);
        qkv_tensor *ids = window_batch(ctx, sw->L->train, r->batch, r->n_ctx, seed, 0x7a1au, t);
        qkv_tensor *loss = training_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), ids, r->cfg.z_loss);
        if (probing && loss) {
            double lg, en;
            if (!probe(ctx, m, r, &lg, &en)) break;
            out->logit[out->n_probes] = lg, out->entropy[out->n_probes] = en;
            out->n_probes++;
            if (!(lg <= out->max_logit)) out->max_logit = lg;
            if (!(en >= out->min_entropy)) out->min_entropy = en;
            if (out->collapse_step < 0 && en < STAB_ENTROPY_THRESHOLD) out->collapse_step = t;
        }
        double lv = loss ? qkv_get_flat(ctx, loss, 0) : NAN;
        if (isnan(lv) || t == r->steps) { // the last index only probes; a NaN ends the run
            nan_seen = isnan(lv);
            qkv_step_end(ctx);
            break;
        }
        qkv_optim_set_lr(adam, lr_at(r, peak, t));
        if (qkv_backward(ctx, loss, NULL) == QKV_OK) {
            if (r->cfg.clip > 0) qkv_clip_grad_norm(ctx, qkv_model_params(m), qkv_model_param_count(m), r->cfg.clip);
            if (!qkv_error(ctx)) qkv_optim_step(adam);
        }
        qkv_optim_zero_grad(adam);
        qkv_step_end(ctx);
        ok = !qkv_error(ctx);
    }
    ok = ok && !qkv_error(ctx);
    if (ok) {
        qkv_model_set_inspect(m, false);
        out->final_loss = nan_seen ? NAN : held_out_loss(ctx, m, r, sw->L, seed);
        out->diverged = !(out->final_loss <= out->init_loss);
        ok = !qkv_error(ctx);
    }
    if (!ok) fprintf(stderr, PROG ": %s lr %g seed %d: %s\n", r->arm_key[arm], peak, si, qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return ok;
}

static void *worker(void *arg) {
    sweep *sw = arg;
    stab_result *r = sw->r;
    for (;;) {
        pthread_mutex_lock(&sw->lock);
        int job = sw->failed ? sw->total : sw->next++;
        pthread_mutex_unlock(&sw->lock);
        if (job >= sw->total) return NULL;
        int si = job % r->n_seeds, li = (job / r->n_seeds) % r->n_lr, arm = job / (r->n_seeds * r->n_lr);
        stab_run run = {0};
        bool ok = train_one(sw, arm, li, si, &run);
        pthread_mutex_lock(&sw->lock);
        r->run[arm][li][si] = run;
        sw->failed |= !ok;
        sw->done++;
        if (sw->opt->log && ok)
            fprintf(sw->opt->log, "  [%3d/%d] %-15s lr %.2e seed %d: loss %.4f -> %.4f  max logit %.3g  min H %.3f%s  (%.0f s)\n",
                    sw->done, sw->total, r->arm_name[arm], r->lr[li], si, run.init_loss, run.final_loss,
                    run.max_logit, run.min_entropy, run.diverged ? "  DIVERGED" : "", now_seconds() - sw->t0);
        if (sw->opt->log) fflush(sw->opt->log);
        pthread_mutex_unlock(&sw->lock);
    }
}

/* ---- summaries, files ------------------------------------------------------------------------------- */

static void summarise(stab_result *r) {
    double best_all = INFINITY;
    for (int a = 0; a < r->n_arms; a++) {
        double best = INFINITY, sum = 0;
        for (int l = 0; l < r->n_lr; l++) {
            double s = 0, init = 0;
            for (int k = 0; k < r->n_seeds; k++) {
                const stab_run *u = &r->run[a][l][k];
                s += isnan(u->final_loss) ? u->init_loss : u->final_loss;
                init += u->init_loss;
            }
            double mean = s / r->n_seeds;
            init /= r->n_seeds;
            r->mean_loss[a][l] = mean;
            sum += fmin(mean, init); // Wortsman et al.: E_lr[min(loss, initial loss)] - min_lr loss
            best = fmin(best, mean);
        }
        r->sensitivity[a] = sum / r->n_lr - best;
        best_all = fmin(best_all, best);
    }
    for (int a = 0; a < r->n_arms; a++) {
        r->trained[a] = 0;
        for (int l = 0; l < r->n_lr; l++) {
            bool all = true;
            for (int k = 0; k < r->n_seeds; k++) {
                double f = r->run[a][l][k].final_loss;
                all &= f <= best_all + 0.1;
            }
            r->trained[a] += all;
        }
    }
}

static FILE *open_out(const stab_options *opt, const char *name, atomic_file *file, char *path, size_t size) {
    int len = snprintf(path, size, "%s/%s", opt->out_dir, name);
    if (len < 0 || (size_t)len >= size) return fprintf(stderr, PROG ": path too long: %s/%s\n", opt->out_dir, name), NULL;
    FILE *f = atomic_open(file, path);
    if (!f) fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    return f;
}
static bool close_out(const stab_options *opt, atomic_file *file, const char *path) {
    bool ok = atomic_commit(file);
    if (!ok) fprintf(stderr, PROG ": error writing %s: %s\n", path, strerror(errno));
    else if (opt->log) fprintf(opt->log, "  wrote %s\n", path);
    return ok;
}

static bool write_csvs(const stab_options *opt, const stab_result *r) {
    char path[4096];
    atomic_file file;
    FILE *f = open_out(opt, "stability_runs.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,lr,seed,init_loss,final_loss,diverged,max_logit,min_entropy,collapse_step\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int l = 0; l < r->n_lr; l++)
            for (int k = 0; k < r->n_seeds; k++) {
                const stab_run *u = &r->run[a][l][k];
                fprintf(f, "%s,%.17g,%d,%.17g,%.17g,%d,%.17g,%.17g,%" PRId64 "\n", r->arm_key[a], r->lr[l], k,
                        u->init_loss, u->final_loss, (int)u->diverged, u->max_logit, u->min_entropy, u->collapse_step);
            }
    if (!close_out(opt, &file, path)) return false;
    f = open_out(opt, "stability_probes.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,lr,seed,step,max_logit,min_entropy\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int l = 0; l < r->n_lr; l++)
            for (int k = 0; k < r->n_seeds; k++) {
                const stab_run *u = &r->run[a][l][k];
                for (int p = 0; p < u->n_probes; p++)
                    fprintf(f, "%s,%.17g,%d,%" PRId64 ",%.17g,%.17g\n", r->arm_key[a], r->lr[l], k,
                            (int64_t)p * r->probe_every, u->logit[p], u->entropy[p]);
            }
    if (!close_out(opt, &file, path)) return false;
    f = open_out(opt, "stability_sensitivity.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,lr_sensitivity,lrs_within_0.1_of_best,best_mean_loss");
    for (int l = 0; l < r->n_lr; l++) fprintf(f, ",mean_loss_lr_%.3g", r->lr[l]);
    fprintf(f, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        double best = INFINITY;
        for (int l = 0; l < r->n_lr; l++) best = fmin(best, r->mean_loss[a][l]);
        fprintf(f, "%s,%.17g,%d,%.17g", r->arm_key[a], r->sensitivity[a], r->trained[a], best);
        for (int l = 0; l < r->n_lr; l++) fprintf(f, ",%.17g", r->mean_loss[a][l]);
        fprintf(f, "\n");
    }
    return close_out(opt, &file, path);
}

static bool lines(const stab_options *opt, const char *name, const char *title, const char *xl, const char *yl,
                  const plot_series *s, int n, bool log_x, bool log_y, const plot_style *st) {
    char path[4096];
    int len = snprintf(path, sizeof path, "%s/%s", opt->out_dir, name);
    bool ok = len > 0 && (size_t)len < sizeof path && plot_lines_styled_svg(path, title, xl, yl, s, n, log_x, log_y, st);
    if (!ok) fprintf(stderr, PROG ": cannot write %s/%s: %s\n", opt->out_dir, name, strerror(errno));
    else if (opt->log) fprintf(opt->log, "  wrote %s\n", path);
    return ok;
}

static bool write_plots(const stab_options *opt, const stab_result *r) {
    plot_series s[STAB_MAX_ARMS + 2];
    plot_style st[STAB_MAX_ARMS + 2];
    static double ys[STAB_MAX_ARMS][STAB_MAX_LR], init[STAB_MAX_LR], floor_y[STAB_MAX_LR];
    for (int a = 0; a < r->n_arms; a++) {
        for (int l = 0; l < r->n_lr; l++) ys[a][l] = r->mean_loss[a][l];
        s[a] = (plot_series){r->arm_name[a], r->lr, ys[a], r->n_lr};
        st[a] = (plot_style){arm_color(a), arm_dash(a), arm_marker(a)};
    }
    for (int l = 0; l < r->n_lr; l++) init[l] = r->run[0][l][0].init_loss, floor_y[l] = r->loss_floor;
    s[r->n_arms] = (plot_series){"initial loss", r->lr, init, r->n_lr};
    st[r->n_arms] = (plot_style){"#7f7f7f", "6 3", PLOT_MARKER_NONE};
    s[r->n_arms + 1] = (plot_series){"source's floor", r->lr, floor_y, r->n_lr};
    st[r->n_arms + 1] = (plot_style){"#000000", "2 3", PLOT_MARKER_NONE};
    char title[160];
    snprintf(title, sizeof title, "Final held-out loss against peak learning rate (mean of %d seeds)", r->n_seeds);
    if (!lines(opt, "stability_lr.svg", title, "peak learning rate", "loss (nats/token)", s, r->n_arms + 2, true, false, st))
        return false;
    // trajectories of seed 0 at the highest learning rate and at one a decade lower
    static double xs[STAB_MAX_PROBES], lg[STAB_MAX_ARMS][STAB_MAX_PROBES], en[STAB_MAX_ARMS][STAB_MAX_PROBES], thr[STAB_MAX_PROBES];
    for (int p = 0; p < STAB_MAX_PROBES; p++) xs[p] = (double)p * (double)r->probe_every, thr[p] = STAB_ENTROPY_THRESHOLD;
    int hi = r->n_lr - 1;
    for (int pass = 0; pass < 2; pass++) {
        int li = pass == 0 ? hi : hi - 2 >= 0 ? hi - 2 : 0;
        for (int a = 0; a < r->n_arms; a++) {
            const stab_run *u = &r->run[a][li][0];
            for (int p = 0; p < u->n_probes; p++) lg[a][p] = u->logit[p], en[a][p] = u->entropy[p];
            s[a] = (plot_series){r->arm_name[a], xs, lg[a], u->n_probes};
            st[a] = (plot_style){arm_color(a), arm_dash(a), arm_marker(a)};
        }
        char name[64], lr_text[32];
        lr_name(r->lr[li], lr_text, sizeof lr_text);
        snprintf(title, sizeof title, "Largest attention logit |scale q.k| during training, lr %.3g (seed 0)", r->lr[li]);
        snprintf(name, sizeof name, "stability_logit_lr_%s.svg", lr_text);
        if (!lines(opt, name, title, "step", "max |logit| (before any cap)", s, r->n_arms, false, true, st)) return false;
        for (int a = 0; a < r->n_arms; a++) s[a].y = en[a];
        s[r->n_arms] = (plot_series){"collapse threshold", xs, thr, r->run[0][li][0].n_probes};
        st[r->n_arms] = (plot_style){"#7f7f7f", "6 3", PLOT_MARKER_NONE};
        snprintf(title, sizeof title, "Smallest mean attention entropy of a head, lr %.3g (seed 0)", r->lr[li]);
        snprintf(name, sizeof name, "stability_entropy_lr_%s.svg", lr_text);
        if (!lines(opt, name, title, "step", "entropy (nats)", s, r->n_arms + 1, false, false, st)) return false;
    }
    return true;
}

static void print_tables(const stab_options *opt, const stab_result *r) {
    FILE *o = opt->log;
    if (!o) return;
    fprintf(o, "\nfinal held-out loss, mean of %d seeds (initial %.3f, floor %.3f); * = some seed diverged\n",
            r->n_seeds, r->run[0][0][0].init_loss, r->loss_floor);
    fprintf(o, "%-15s", "lr");
    for (int l = 0; l < r->n_lr; l++) fprintf(o, " %8.2g", r->lr[l]);
    fprintf(o, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        fprintf(o, "%-15s", r->arm_name[a]);
        for (int l = 0; l < r->n_lr; l++) {
            bool div = false;
            for (int k = 0; k < r->n_seeds; k++) div |= r->run[a][l][k].diverged;
            fprintf(o, " %7.3f%c", r->mean_loss[a][l], div ? '*' : ' ');
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nlargest attention logit over training, median of seeds\n%-15s", "lr");
    for (int l = 0; l < r->n_lr; l++) fprintf(o, " %8.2g", r->lr[l]);
    fprintf(o, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        fprintf(o, "%-15s", r->arm_name[a]);
        for (int l = 0; l < r->n_lr; l++) {
            double v[STAB_MAX_SEEDS];
            for (int k = 0; k < r->n_seeds; k++) v[k] = r->run[a][l][k].max_logit;
            for (int i = 1; i < r->n_seeds; i++) // insertion sort of <= 3 values
                for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
            fprintf(o, " %8.3g", v[r->n_seeds / 2]);
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nsmallest head entropy over training (nats), min of seeds; collapse = below %.2g\n%-15s",
            STAB_ENTROPY_THRESHOLD, "lr");
    for (int l = 0; l < r->n_lr; l++) fprintf(o, " %8.2g", r->lr[l]);
    fprintf(o, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        fprintf(o, "%-15s", r->arm_name[a]);
        for (int l = 0; l < r->n_lr; l++) {
            double v = INFINITY;
            for (int k = 0; k < r->n_seeds; k++) v = fmin(v, r->run[a][l][k].min_entropy);
            fprintf(o, " %8.3f", v);
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nLR sensitivity (Wortsman et al.: mean over lr of min(loss, initial) - best loss) and the\n"
               "learning rates at which every seed ends within 0.1 nats of the best loss of any arm\n");
    for (int a = 0; a < r->n_arms; a++)
        fprintf(o, "%-15s sensitivity %.4f   lrs that train %d of %d\n", r->arm_name[a], r->sensitivity[a],
                r->trained[a], r->n_lr);
}

bool stability_run(const stab_options *opt, stab_result *r) {
    double t0 = now_seconds();
    memset(r, 0, sizeof *r);
    r->cfg = opt->config ? *opt->config : stab_default_config(opt->quick);
    const stab_config *c = &r->cfg;
    char why[256];
    if (stab_config_problem(c, why, sizeof why)) return fprintf(stderr, PROG ": %s\n", why), false;
    r->n_arms = c->n_variant_arms > 0 ? c->n_variant_arms : STAB_ARMS;
    for (int a = 0; a < r->n_arms; a++) {
        r->arm_name[a] = c->n_variant_arms > 0 ? c->variant_arms[a]->name : stab_arm_name(a);
        r->arm_key[a] = c->n_variant_arms > 0 ? c->variant_arms[a]->name : stab_arm_key(a);
    }
    r->n_lr = lr_grid(c, r->lr);
    r->n_seeds = c->n_seeds;
    r->steps = c->steps, r->warmup = c->warmup, r->probe_every = c->probe_every;
    r->batch = c->batch, r->n_ctx = c->n_ctx, r->d_model = c->d_model, r->n_layer = c->n_layer, r->n_head = c->n_head;
    r->d_mlp = c->d_mlp, r->vocab = LANG_V;
    r->uniform_loss = log((double)LANG_V);
    static language L;
    make_language(&L, opt->seed);
    r->entropy_rate = L.entropy_rate;
    r->loss_floor = (L.first_entropy + (double)(r->n_ctx - 2) * L.entropy_rate) / (double)(r->n_ctx - 1);
    if (opt->log) {
        fprintf(opt->log, "language: order-2 Markov source over %d tokens, %d successors per context: entropy rate "
                "%.4f nats/token (uniform %.4f); a window of %" PRId64 " predicts its first target from one token "
                "(%.4f nats), so the best mean loss is %.4f\n", LANG_V, LANG_SUCC, L.entropy_rate, r->uniform_loss,
                r->n_ctx, L.first_entropy, r->loss_floor);
        if (c->final_lr_frac == 0.1 && c->clip == 0 && c->z_loss == 0) // the default's line, as the page quotes it
            fprintf(opt->log, "model: %" PRId64 " layers, d_model %" PRId64 ", %" PRId64 " heads (d_head %" PRId64
                    "), d_mlp %" PRId64 ", n_ctx %" PRId64 "; AdamW (0.9, 0.95), %" PRId64 " steps of %" PRId64
                    " sequences, warm-up %" PRId64 ", cosine to lr/10, no clipping; %d lrs x %d arms x %d seeds\n",
                    r->n_layer, r->d_model, r->n_head, r->d_model / r->n_head, r->d_mlp, r->n_ctx, r->steps, r->batch,
                    r->warmup, r->n_lr, r->n_arms, r->n_seeds);
        else
            fprintf(opt->log, "model: %" PRId64 " layers, d_model %" PRId64 ", %" PRId64 " heads (d_head %" PRId64
                    "), d_mlp %" PRId64 ", n_ctx %" PRId64 "; AdamW (0.9, 0.95), %" PRId64 " steps of %" PRId64
                    " sequences, warm-up %" PRId64 ", cosine to lr x %g, clipping at %g, z-loss %g; %d lrs x %d arms x "
                    "%d seeds\n", r->n_layer, r->d_model, r->n_head, r->d_model / r->n_head, r->d_mlp, r->n_ctx,
                    r->steps, r->batch, r->warmup, c->final_lr_frac, c->clip, c->z_loss, r->n_lr, r->n_arms, r->n_seeds);
        fflush(opt->log);
    }
    sweep sw = {.opt = opt, .L = &L, .r = r, .total = r->n_arms * r->n_lr * r->n_seeds, .t0 = t0};
    pthread_mutex_init(&sw.lock, NULL);
    int jobs = opt->jobs < 1 ? 1 : opt->jobs > 16 ? 16 : opt->jobs;
    pthread_t tid[16];
    int started = 0;
    for (int j = 1; j < jobs; j++)
        if (pthread_create(&tid[started], NULL, worker, &sw) == 0) started++;
    worker(&sw);
    for (int j = 0; j < started; j++) pthread_join(tid[j], NULL);
    pthread_mutex_destroy(&sw.lock);
    if (sw.failed) return false;
    summarise(r);
    print_tables(opt, r);
    bool ok = write_csvs(opt, r) && write_plots(opt, r);
    r->seconds = now_seconds() - t0;
    return ok;
}
