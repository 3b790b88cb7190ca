/*
 * induction_run.c — the data, one training run and its measurements (induction.h).
 *
 *   ids [B, n] -> logits = model(ids) [B, n, V]   (qkv_model_forward, causal, attention-only)
 *   loss = mean_i CE(logits[:, i], ids[:, i+1])   (qkv_model_loss with qkv_next_token_targets)
 *   evaluation: per-position losses from the logits, -log softmax(logits[b, i])[ids[b, i+1]], in double;
 *   per-head scores from the attention patterns A [B*n_head, n, n] of each layer (qkv_model_inspect).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "induction.h"

const char *ind_data_name(ind_data_kind kind) { return kind == IND_DATA_REPEAT ? "repeat" : "segment"; }
const char *ind_place_name(ind_place_kind kind) { return kind == IND_PLACE_RANDOM ? "random" : "end"; }
int64_t ind_max_segment(const ind_config *c) { return c->max_segment > 0 ? c->max_segment : c->n / 2; }

ind_config ind_default_config(bool quick) {
    ind_config c = {0};
    c.data = IND_DATA_SEGMENT;
    c.vocab = 64;
    c.n = 32;
    c.min_segment = 8;
    c.max_segment = 0;
    c.place = IND_PLACE_END;
    c.init_std = 0.02;
    c.init_embed_std = 0.02;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_model = 32;
    c.scale = QKV_SCALE_DEFAULT;
    c.norm = QKV_NORM_LAYER;
    c.qk_norm = QKV_NORM_NONE;
    c.positions = QKV_POS_ROPE;
    c.lr = 3e-3;
    c.weight_decay = 0.01;
    c.clip = 1.0;
    c.steps = quick ? 1500 : 3000;
    c.warmup = 100;
    c.batch = 32;
    c.eval_every = quick ? 50 : 50;
    c.eval_batch = quick ? 32 : 64;
    c.seed = 0;
    c.threads = 1;
    return c;
}

void ind_literature_preset(ind_config *c, bool quick) {
    c->data = IND_DATA_SEGMENT;
    c->place = IND_PLACE_RANDOM;
    c->vocab = 64;
    c->n = 64;
    c->min_segment = 8;
    c->max_segment = 24;
    c->n_layer = 2;
    c->n_head = 4;
    c->d_model = 64;
    c->positions = QKV_POS_LEARNED;
    c->init_embed_std = 1.0;
    c->init_std = 0.02;
    c->lr = 3e-3;
    c->batch = 32;
    c->steps = quick ? 1500 : 3000;
}

bool ind_config_check(const ind_config *c, char *err, size_t size) {
#define BAD(...) return snprintf(err, size, __VA_ARGS__), false
    if (c->vocab < 2 || c->vocab > 1 << 20) BAD("vocab %" PRId64 " must be in [2, 2^20]", c->vocab);
    if (c->n < 8 || c->n > IND_MAX_N) BAD("n %" PRId64 " must be in [8, %d]", c->n, IND_MAX_N);
    if (c->min_segment < 4 || c->min_segment > c->n / 2)
        BAD("min segment %" PRId64 " must be in [4, n/2 = %" PRId64 "]", c->min_segment, c->n / 2);
    if (c->max_segment != 0 && (c->max_segment < c->min_segment || c->max_segment > c->n / 2))
        BAD("max segment %" PRId64 " must be in [min segment %" PRId64 ", n/2 = %" PRId64 "] (or 0: n/2)", c->max_segment,
            c->min_segment, c->n / 2);
    if (!(c->init_std >= 0) || !isfinite(c->init_std) || !(c->init_embed_std >= 0) || !isfinite(c->init_embed_std))
        BAD("the initial stds (%g, embeddings %g) must be finite and >= 0", c->init_std, c->init_embed_std);
    if (c->n_layer < 1 || c->n_layer > IND_MAX_LAYERS) BAD("layers %" PRId64 " must be in [1, %d]", c->n_layer, IND_MAX_LAYERS);
    if (c->n_head < 1 || c->n_head > IND_MAX_HEADS) BAD("heads %" PRId64 " must be in [1, %d]", c->n_head, IND_MAX_HEADS);
    if (c->d_model < 1 || c->d_model % c->n_head)
        BAD("d_model %" PRId64 " must be a positive multiple of the heads (%" PRId64 ")", c->d_model, c->n_head);
    if (c->steps < 1 || c->eval_every < 1 || c->steps / c->eval_every + 1 > IND_MAX_EVALS)
        BAD("steps %" PRId64 " / eval every %" PRId64 " gives more than %d measurements", c->steps, c->eval_every,
            IND_MAX_EVALS - 1);
    if (c->batch < 1 || c->eval_batch < 1) BAD("the batch sizes must be positive");
    if (c->warmup < 0) BAD("warmup %" PRId64 " must be >= 0", c->warmup);
    if (!(c->lr > 0) || !isfinite(c->lr)) BAD("lr must be a positive number");
    return true;
#undef BAD
}

/* splitmix64 of (seed, step, row, k): every token is a function of its coordinates. */
static uint64_t mix(uint64_t seed, uint64_t step, uint64_t row, uint64_t k) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + step * 0xbf58476d1ce4e5b9ull + row * 0x94d049bb133111ebull +
                 k * 0xd6e8feb86659fd93ull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ind_batch(const ind_config *c, int64_t step, int64_t B, int32_t *ids, int64_t *prefix, int64_t *segment,
               int64_t *repeat) {
    uint64_t s = (uint64_t)step + (step < 0 ? 0x7f4a7c15ull << 32 : 0); /* the evaluation stream apart */
    int64_t n = c->n, max_L = ind_max_segment(c);
    for (int64_t b = 0; b < B; b++) {
        int64_t L = n / 2;
        if (c->data == IND_DATA_SEGMENT)
            L = c->min_segment + (int64_t)(mix(c->seed, s, (uint64_t)b, 0) % (uint64_t)(max_L - c->min_segment + 1));
        int64_t spare = n - 2 * L, p = spare, q = p + L; // end: S at p, again at q = p + L, ending the sequence
        if (c->place == IND_PLACE_RANDOM) { // keys n+1, n+2: apart from the tokens' keys 1 .. n
            p = (int64_t)(mix(c->seed, s, (uint64_t)b, (uint64_t)n + 1) % (uint64_t)(spare + 1));
            q = p + L + (int64_t)(mix(c->seed, s, (uint64_t)b, (uint64_t)n + 2) % (uint64_t)(spare - p + 1));
        }
        int32_t *row = ids + b * n;
        for (int64_t i = 0; i < n; i++)
            if (i < q || i >= q + L) row[i] = (int32_t)(mix(c->seed, s, (uint64_t)b, (uint64_t)i + 1) % (uint64_t)c->vocab);
        for (int64_t i = q; i < q + L; i++) row[i] = row[i - (q - p)]; // the second copy of S
        prefix[b] = p;
        segment[b] = L;
        repeat[b] = q;
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static qkv_model_config model_config(const ind_config *c, int64_t n_layer) {
    qkv_model_config m = qkv_model_default_config();
    m.vocab = c->vocab;
    m.n_ctx = c->n;
    m.d_model = c->d_model;
    m.n_layer = n_layer;
    m.n_head = c->n_head;
    m.d_mlp = 0; /* attention-only */
    m.norm = c->norm;
    m.qk_norm = c->qk_norm;
    m.positions = c->positions;
    m.attn_scale = c->scale;
    m.seed = c->seed;
    m.init_std = c->init_std;
    m.init_embed_std = c->init_embed_std;
    return m;
}

/* The evaluation batch, fixed for a run. */
typedef struct eval_set {
    int64_t B;
    int32_t *ids;
    int64_t *prefix, *segment, *repeat;
} eval_set;

/* Losses of logits [B, n, V] (f32) against the next tokens of e: the three means and the ICL score. */
static void losses(const ind_config *c, const eval_set *e, const qkv_tensor *logits, double *all, double *first,
                   double *repeat, double *icl) {
    int64_t n = c->n, V = c->vocab, w = n / 8 > 0 ? n / 8 : 1;
    const float *z = qkv_f32(logits);
    double s_all = 0, s_first = 0, s_rep = 0, s_early = 0, s_late = 0;
    int64_t c_all = 0, c_first = 0, c_rep = 0, c_early = 0, c_late = 0;
    for (int64_t b = 0; b < e->B; b++) {
        int64_t q = e->repeat[b], L = e->segment[b];
        for (int64_t i = 0; i + 1 < n; i++) {
            const float *row = z + (b * n + i) * V;
            double mx = -INFINITY, sum = 0;
            for (int64_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
            for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
            // loss_i = log sum_v exp(z_v - max) + max - z_target
            double loss = log(sum) + mx - (double)row[e->ids[b * n + i + 1]];
            s_all += loss, c_all++;
            if (i >= q && i <= q + L - 2) s_rep += loss, c_rep++; // the target is in the second copy
            else s_first += loss, c_first++;
            if (i < w) s_early += loss, c_early++;
            if (i >= n - 1 - w) s_late += loss, c_late++;
        }
    }
    *all = s_all / (double)c_all;
    *first = c_first ? s_first / (double)c_first : NAN;
    *repeat = c_rep ? s_rep / (double)c_rep : NAN;
    *icl = s_late / (double)c_late - s_early / (double)c_early;
}

/* Previous-token, duplicate-token and induction scores of layer l's pattern A [B*H, n, n] (f32). */
static void head_scores(const ind_config *c, const eval_set *e, const qkv_tensor *A, int64_t l, ind_eval *ev) {
    int64_t n = c->n, H = c->n_head;
    const float *a = qkv_f32(A);
    for (int64_t h = 0; h < H; h++) {
        double prev = 0, ind = 0, dup = 0;
        int64_t c_prev = 0, c_ind = 0;
        for (int64_t b = 0; b < e->B; b++) {
            const float *m = a + (b * H + h) * n * n;
            int64_t q = e->repeat[b], L = e->segment[b], gap = q - e->prefix[b];
            for (int64_t i = 1; i < n; i++) prev += m[i * n + i - 1], c_prev++; // A[i, i-1]
            for (int64_t i = q; i < q + L; i++) {
                ind += m[i * n + i - gap + 1], c_ind++; // A[i, i-(q-p)+1]: the token after the earlier occurrence
                dup += m[i * n + i - gap];              // A[i, i-(q-p)]: the earlier occurrence itself
            }
        }
        ev->prev[l][h] = prev / (double)c_prev;
        ev->induction[l][h] = ind / (double)c_ind;
        ev->dup[l][h] = dup / (double)c_ind;
    }
}

/* One forward of the evaluation batch with recording off and inspection on; fills ev (losses and scores of
 * the first n_layer layers). pattern_out, when not NULL, receives every head's attention on sequence 0. */
static bool evaluate(qkv_ctx *ctx, qkv_model *m, const ind_config *c, const eval_set *e, ind_eval *ev,
                     double *pattern_out, int64_t n_layer) {
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_model_set_inspect(m, true);
    int64_t n = c->n, H = c->n_head;
    qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){e->B, n}, e->ids);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    if (logits) losses(c, e, logits, &ev->loss_all, &ev->loss_first, &ev->loss_repeat, &ev->icl);
    for (int64_t l = 0; l < n_layer && logits; l++) {
        qkv_tensor *A = qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, l);
        if (!A) break;
        head_scores(c, e, A, l, ev);
        if (pattern_out)
            for (int64_t h = 0; h < H; h++)
                for (int64_t k = 0; k < n * n; k++) pattern_out[(l * H + h) * n * n + k] = qkv_f32(A)[h * n * n + k];
    }
    qkv_model_set_inspect(m, false);
    qkv_step_end(ctx);
    qkv_set_grad_enabled(ctx, was);
    return !qkv_error(ctx);
}

/* Losses only, with the ablations in force (inspection off). */
static bool eval_losses(qkv_ctx *ctx, qkv_model *m, const ind_config *c, const eval_set *e, double *first,
                        double *repeat) {
    bool was = qkv_set_grad_enabled(ctx, false);
    qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){e->B, c->n}, e->ids);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    double all, icl;
    if (logits) losses(c, e, logits, &all, first, repeat, &icl);
    qkv_step_end(ctx);
    qkv_set_grad_enabled(ctx, was);
    return !qkv_error(ctx);
}

/* The metric of the patching sweep: the repeated-half loss of a forward's logits against the clean targets. */
typedef struct patch_metric {
    const ind_config *c;
    const eval_set *clean;
} patch_metric;

static double repeated_half_loss(qkv_ctx *ctx, const qkv_tensor *logits, void *user) {
    (void)ctx;
    const patch_metric *pm = user;
    double all, first, repeat, icl;
    losses(pm->c, pm->clean, logits, &all, &first, &repeat, &icl);
    return repeat;
}

/* The corrupted evaluation batch: the first copy of S replaced by other random tokens (each one differs from
 * the clean token there), so the second copy can no longer be predicted by copying. */
static void corrupt_first_copy(const ind_config *c, const eval_set *e, int32_t *out) {
    int64_t n = c->n;
    memcpy(out, e->ids, (size_t)(e->B * n) * sizeof *out);
    for (int64_t b = 0; b < e->B; b++)
        for (int64_t i = e->prefix[b]; i < e->prefix[b] + e->segment[b]; i++) {
            uint64_t shift = 1 + mix(c->seed, 0x5eedull, (uint64_t)b, (uint64_t)i) % (uint64_t)(c->vocab - 1);
            out[b * n + i] = (int32_t)(((uint64_t)out[b * n + i] + shift) % (uint64_t)c->vocab);
        }
}

/* The patching sweep of r (corrupt_repeat, patch_repeat) on the evaluation batch e. */
static bool patching(qkv_ctx *ctx, qkv_model *m, const ind_config *c, const eval_set *e, ind_run *r) {
    int64_t n = c->n;
    int32_t *bad = malloc((size_t)(e->B * n) * sizeof *bad);
    if (!bad) return fprintf(stderr, "induction: out of memory\n"), false;
    corrupt_first_copy(c, e, bad);
    bool was = qkv_set_grad_enabled(ctx, false);
    patch_metric pm = {c, e};
    qkv_tensor *clean = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){e->B, n}, e->ids);
    qkv_tensor *corrupted = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){e->B, n}, bad);
    qkv_tensor *logits = qkv_model_forward(ctx, m, corrupted, QKV_CAUSAL);
    if (logits) r->corrupt_repeat = repeated_half_loss(ctx, logits, &pm);
    // noising: the corrupted run is the source, the clean run is patched (the sweep's "clean" argument is the source)
    qkv_tensor *t = logits ? qkv_model_patch_sweep(ctx, m, "attn.hook_z", corrupted, clean, QKV_CAUSAL, QKV_PATCH_BY_HEAD,
                                                   repeated_half_loss, &pm)
                           : NULL;
    for (int64_t l = 0; t && l < c->n_layer; l++) // t: f64 [n_layer, n_head]
        for (int64_t h = 0; h < c->n_head; h++) r->patch_repeat[l][h] = qkv_f64(t)[l * c->n_head + h];
    qkv_step_end(ctx);
    qkv_set_grad_enabled(ctx, was);
    free(bad);
    return !qkv_error(ctx);
}

static double lr_at(const ind_config *c, int64_t step) {
    return step < c->warmup ? c->lr * (double)(step + 1) / (double)c->warmup : c->lr; // linear warm-up, then flat
}

/* The phase change of r (best head, phase step, loss drop step) from its measurements. */
static void phase_change(ind_run *r) {
    const ind_config *c = &r->cfg;
    const ind_eval *last = &r->evals[r->n_evals - 1];
    int64_t l = c->n_layer - 1;
    r->best_layer = (int)l;
    r->best_head = 0;
    for (int64_t h = 1; h < c->n_head; h++)
        if (last->induction[l][h] > last->induction[l][r->best_head]) r->best_head = (int)h;
    double half = 0.5 * last->induction[l][r->best_head];
    r->phase_step = -1;
    for (int k = 0; k < r->n_evals && r->phase_step < 0 && 2 * half >= IND_FORMED; k++)
        if (r->evals[k].induction[l][r->best_head] >= half) r->phase_step = r->evals[k].step;
    double mid = 0.5 * (r->evals[0].loss_repeat + last->loss_repeat);
    r->loss_drop_step = -1;
    for (int k = 0; k < r->n_evals && r->loss_drop_step < 0; k++)
        if (r->evals[k].loss_repeat <= mid) r->loss_drop_step = r->evals[k].step;
}

bool ind_train(const ind_config *c, ind_run *r, FILE *progress, const char *label) {
    memset(r, 0, sizeof *r);
    r->cfg = *c;
    char err[256];
    if (!ind_config_check(c, err, sizeof err)) return fprintf(stderr, "induction: %s\n", err), false;
    double t0 = now();
    int64_t n = c->n, B = c->batch, H = c->n_head, Le = c->n_layer;
    eval_set e = {c->eval_batch, NULL, NULL, NULL, NULL};
    int32_t *train_ids = malloc((size_t)(B * n) * sizeof *train_ids);
    int64_t *train_p = malloc((size_t)B * sizeof *train_p), *train_L = malloc((size_t)B * sizeof *train_L);
    int64_t *train_q = malloc((size_t)B * sizeof *train_q);
    e.ids = malloc((size_t)(e.B * n) * sizeof *e.ids);
    e.prefix = malloc((size_t)e.B * sizeof *e.prefix);
    e.segment = malloc((size_t)e.B * sizeof *e.segment);
    e.repeat = malloc((size_t)e.B * sizeof *e.repeat);
    r->pattern = calloc((size_t)(Le * H * n * n), sizeof *r->pattern);
    qkv_options o = qkv_default_options();
    o.threads = c->threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    qkv_model *m = NULL;
    qkv_optimizer *opt = NULL;
    bool ok = false;
    if (!train_ids || !train_p || !train_L || !train_q || !e.ids || !e.prefix || !e.segment || !e.repeat ||
        !r->pattern || !ctx) {
        fprintf(stderr, "induction: out of memory\n");
        goto done;
    }
    ind_batch(c, -1, e.B, e.ids, e.prefix, e.segment, e.repeat);
    qkv_model_config mc = model_config(c, Le);
    m = qkv_model_new(ctx, &mc);
    if (!m) {
        fprintf(stderr, "induction: %s\n", qkv_errmsg(ctx));
        goto done;
    }
    r->params = qkv_model_param_elements(m);
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    oo.lr = c->lr;
    oo.weight_decay = c->weight_decay;
    oo.param_names = qkv_model_param_names(m);
    opt = qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m));
    if (!opt) {
        fprintf(stderr, "induction: %s\n", qkv_errmsg(ctx));
        goto done;
    }
    bool tty = progress && isatty(fileno(progress));
    for (int64_t step = 0; step <= c->steps; step++) {
        if (step % c->eval_every == 0 || step == c->steps) {
            ind_eval *ev = &r->evals[r->n_evals++];
            ev->step = step;
            if (!evaluate(ctx, m, c, &e, ev, NULL, Le)) break;
            // the progress line: rewritten in place on a terminal, about ten lines otherwise
            int64_t tenth = c->steps / 10 > 0 ? c->steps / 10 : 1;
            if (progress && (tty || step % tenth < c->eval_every || step == c->steps)) {
                double best = 0;
                for (int64_t h = 0; h < H; h++) best = fmax(best, ev->induction[Le - 1][h]);
                fprintf(progress, "%s  %-8s step %5" PRId64 "/%" PRId64 "  loss: first half %.3f, repeated half %.3f; "
                        "best induction score %.3f  %5.1f s %s", tty ? "\r" : "", label, step, c->steps, ev->loss_first, ev->loss_repeat,
                        best, now() - t0, tty ? "" : "\n");
            }
            if (progress) fflush(progress);
        }
        if (step == c->steps) break;
        qkv_optim_set_lr(opt, lr_at(c, step));
        ind_batch(c, step, B, train_ids, train_p, train_L, train_q);
        qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){B, n}, train_ids);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), qkv_next_token_targets(ctx, ids));
        if (qkv_backward(ctx, loss, NULL) == QKV_OK && c->clip > 0)
            qkv_clip_grad_norm(ctx, qkv_model_params(m), qkv_model_param_count(m), c->clip);
        if (!qkv_error(ctx)) qkv_optim_step(opt);
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
        if (qkv_error(ctx)) break;
    }
    if (progress && tty) fputc('\n', progress);
    if (qkv_error(ctx)) {
        fprintf(stderr, "induction: %s\n", qkv_errmsg(ctx));
        goto done;
    }
    phase_change(r);
    // the patterns of evaluation sequence 0, and the ablations
    ind_eval final;
    eval_set one = {1, e.ids, e.prefix, e.segment, e.repeat};
    if (!evaluate(ctx, m, c, &one, &final, r->pattern, Le)) goto fail;
    memcpy(r->pattern_ids, e.ids, (size_t)n * sizeof *r->pattern_ids);
    r->pattern_prefix = e.prefix[0];
    r->pattern_segment = e.segment[0];
    r->pattern_repeat = e.repeat[0];
    if (!eval_losses(ctx, m, c, &e, &r->base_first, &r->base_repeat)) goto fail;
    for (int64_t l = 0; l < Le; l++)
        for (int64_t h = 0; h < H; h++) {
            qkv_model_ablate_head(ctx, m, l, h, QKV_ABLATE_ZERO);
            if (!eval_losses(ctx, m, c, &e, &r->zero_first[l][h], &r->zero_repeat[l][h])) goto fail;
            qkv_model_ablate_head(ctx, m, l, h, QKV_ABLATE_MEAN);
            if (!eval_losses(ctx, m, c, &e, &r->mean_first[l][h], &r->mean_repeat[l][h])) goto fail;
            qkv_model_clear_ablations(m);
        }
    for (int64_t l = 0; l < Le; l++) // every head of layer l at once
        for (int kind = 0; kind < 2; kind++) {
            for (int64_t h = 0; h < H; h++) qkv_model_ablate_head(ctx, m, l, h, kind ? QKV_ABLATE_MEAN : QKV_ABLATE_ZERO);
            if (!eval_losses(ctx, m, c, &e, kind ? &r->layer_mean_first[l] : &r->layer_zero_first[l],
                             kind ? &r->layer_mean_repeat[l] : &r->layer_zero_repeat[l]))
                goto fail;
            qkv_model_clear_ablations(m);
        }
    if (!patching(ctx, m, c, &e, r)) goto fail;
    r->seconds = now() - t0;
    ok = true;
    goto done;
fail:
    fprintf(stderr, "induction: %s\n", qkv_errmsg(ctx));
done:
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    free(train_ids), free(train_p), free(train_L), free(train_q), free(e.ids), free(e.prefix), free(e.segment),
        free(e.repeat);
    return ok;
}

void ind_run_free(ind_run *r) {
    if (!r) return;
    free(r->pattern);
    r->pattern = NULL;
}
