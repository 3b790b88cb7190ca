/*
 * sinks_lib.c — examples/sinks (sinks.h): the arms, the data, the measures of attention sinks and massive
 * activations, one training run per arm (each in its own context, so the result does not depend on how arms
 * are spread over threads), the StreamingLLM test, and the tables, CSV files and plots.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "sinks.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "atomic_file.h"
#include "plot.h"
#include "plot_heatmap.h"

#define PROG "sinks"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: every random number of the data, a function of (seed, counters). */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static double uniform01(uint64_t *state) { return ((double)(mix((*state)++) >> 11) + 0.5) * 0x1p-53; }

/* ---- the data ------------------------------------------------------------------------------------------ */

enum {
    BOS = 0,
    STORE0 = 1,                                /* store(k, v) = STORE0 + k VALUES + v */
    QUERY0 = STORE0 + SINKS_KEYS * SINKS_VALUES, /* query(k) = QUERY0 + k              */
    VALUE0 = QUERY0 + SINKS_KEYS,
    TEXT0 = VALUE0 + SINKS_VALUES
};
#define TEXT_COUNT SINKS_TEXT
#define FILE_BOS 256

void sinks_data_synthetic(sinks_data *d, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->vocab = SINKS_VOCAB, d->seed = seed;
    uint64_t st = mix(seed ^ 0x5151c5ull);
    for (int t = TEXT0; t < SINKS_VOCAB; t++) { // two distinct text successors, weights 3:1
        int a = TEXT0 + (int)(mix(st++) % TEXT_COUNT), b;
        do b = TEXT0 + (int)(mix(st++) % TEXT_COUNT);
        while (b == a);
        d->succ[t][0] = a, d->succ[t][1] = b, d->chain[t][0] = 0.75, d->chain[t][1] = 0.25;
    }
}

bool sinks_data_file(sinks_data *d, const char *path, int64_t n_ctx, char *err, size_t size) {
    memset(d, 0, sizeof *d);
    d->from_file = true, d->vocab = 257;
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(err, size, "--data %s: %s", path, strerror(errno)), false;
    int64_t cap = 1 << 20, len = 0, limit = (int64_t)1 << 30;
    uint8_t *buf = malloc((size_t)cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, (size_t)(cap - len), f)) > 0) {
        len += (int64_t)got;
        if (len == cap) {
            if (cap >= limit) break; /* the first GiB is plenty */
            uint8_t *grown = realloc(buf, (size_t)(cap *= 2));
            if (!grown) free(buf);
            buf = grown;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return snprintf(err, size, "--data %s: out of memory", path), false;
    if (bad) return free(buf), snprintf(err, size, "--data %s: read error", path), false;
    if (len < 10 * n_ctx) {
        free(buf);
        snprintf(err, size, "--data %s has %" PRId64 " bytes: it needs at least 10 x --n-ctx = %" PRId64, path, len,
                 10 * n_ctx);
        return false;
    }
    d->bytes = buf, d->n_bytes = len, d->n_train = len - len / 10;
    return true;
}

void sinks_data_free(sinks_data *d) {
    free(d->bytes);
    d->bytes = NULL;
}

void sinks_batch(const sinks_data *d, int split, int64_t step, int64_t B, int64_t n, int32_t *ids, uint8_t *kind) {
    for (int64_t b = 0; b < B; b++) {
        int32_t *row = ids + b * n;
        uint8_t *kr = kind ? kind + b * n : NULL;
        uint64_t st = mix(d->seed ^ mix((uint64_t)split * 0x9e37u ^ mix((uint64_t)step * 1000003u + (uint64_t)b)));
        if (kr) memset(kr, SINKS_T_OTHER, (size_t)n);
        if (d->from_file) { // BOS, then n-1 bytes from the split's part of the file
            int64_t lo = split ? d->n_train : 0, hi = split ? d->n_bytes : d->n_train, span = hi - lo - (n - 1);
            int64_t start = lo + (int64_t)(mix(st) % (uint64_t)(span > 0 ? span + 1 : 1));
            row[0] = FILE_BOS;
            for (int64_t i = 1; i < n; i++) row[i] = start + i - 1 < hi ? d->bytes[start + i - 1] : 0;
            continue;
        }
        int32_t map[SINKS_KEYS];
        bool stored[SINKS_KEYS] = {false};
        int stored_keys[SINKS_KEYS], n_stored = 0;
        for (int k = 0; k < SINKS_KEYS; k++) map[k] = (int32_t)(mix(st++) % SINKS_VALUES);
        int32_t cur = TEXT0 + (int32_t)(mix(st++) % TEXT_COUNT); // the chain's state
        row[0] = BOS;
        bool first_text = true;
        for (int64_t i = 1; i < n;) {
            double u = uniform01(&st);
            int k = (int)(mix(st++) % SINKS_KEYS);
            if (u < SINKS_STORE_P) { // "k holds map[k]"
                row[i++] = STORE0 + k * SINKS_VALUES + map[k];
                if (!stored[k]) stored[k] = true, stored_keys[n_stored++] = k;
            } else if (u < SINKS_STORE_P + SINKS_QUERY_P && n_stored > 0) { // query(k) of a stored k, its value
                k = stored_keys[mix(st++) % (uint64_t)n_stored];
                row[i++] = QUERY0 + k;
                if (i < n) {
                    if (kr) kr[i] = SINKS_T_LOOKUP;
                    row[i++] = VALUE0 + map[k];
                }
            } else {
                int32_t next = first_text ? cur : d->succ[cur][uniform01(&st) < d->chain[cur][0] ? 0 : 1];
                if (kr && !first_text && row[i - 1] == cur) kr[i] = SINKS_T_TEXT; // the previous token says it
                row[i++] = cur = next;
                first_text = false;
            }
        }
    }
}

/* ---- the measures -------------------------------------------------------------------------------------- */

void sinks_head_stats(const float *A, int64_t BH, int64_t H, int64_t n, double *first, double *mass,
                      double *entropy) {
    for (int64_t h = 0; h < H; h++) {
        double sum_first = 0, sum_mass = 0, sum_entropy = 0;
        int64_t rows = 0, entropy_rows = 0;
        for (int64_t bh = h; bh < BH; bh += H)
            for (int64_t i = 1; i < n; i++, rows++) {
                const float *a = A + (bh * n + i) * n;
                double m = 0, m_abs = 0, s = 0; // m = sum_j a_j; m_abs = sum_j |a_j| (= m unless a is signed)
                for (int64_t j = 0; j <= i; j++) m += (double)a[j], m_abs += fabs((double)a[j]);
                for (int64_t j = 0; m_abs > 0 && j <= i; j++) { // H = -sum p ln p, p = |a| / m_abs
                    double p = fabs((double)a[j]) / m_abs;
                    if (p > 0) s -= p * log(p);
                }
                sum_first += (double)a[0], sum_mass += m;
                if (m_abs > 0) sum_entropy += s, entropy_rows++;
            }
        first[h] = sum_first / (double)rows, mass[h] = sum_mass / (double)rows;
        entropy[h] = entropy_rows ? sum_entropy / (double)entropy_rows : NAN;
    }
}

double sinks_sink_rate(const double *first, int count, double eps) {
    int sinks = 0;
    for (int k = 0; k < count; k++) sinks += first[k] > eps;
    return count > 0 ? (double)sinks / count : NAN;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

sinks_massive_act sinks_massive(const float *x, const int32_t *ids, int64_t B, int64_t n, int64_t d, float *scratch) {
    sinks_massive_act r = {0, 0, 0, 0, 0, 0};
    int64_t count = B * n * d, at = 0;
    for (int64_t k = 0; k < count; k++) {
        scratch[k] = fabsf(x[k]);
        if (!(scratch[k] <= r.max_abs)) r.max_abs = scratch[k], at = k; // a NaN wins
    }
    qsort(scratch, (size_t)count, sizeof *scratch, cmp_float);
    r.median_abs = count % 2 ? scratch[count / 2] : 0.5 * ((double)scratch[count / 2 - 1] + scratch[count / 2]);
    r.row = at / (n * d), r.pos = at / d % n, r.dim = at % d, r.token = ids[r.row * n + r.pos];
    return r;
}

/* ---- the settings -------------------------------------------------------------------------------------- */

sinks_config sinks_default_config(bool quick) {
    sinks_config c;
    c.n_layer = 2, c.d_model = quick ? 32 : 64, c.n_head = 4, c.d_mlp = 0, c.n_ctx = quick ? 32 : 64;
    c.batch = quick ? 8 : 16, c.steps = quick ? 200 : 4000, c.warmup = c.steps / 10, c.lr = 1e-2, c.weight_decay = 0.1;
    c.probe_every = quick ? 20 : 100, c.eval_batches = quick ? 2 : 8, c.shift = c.n_ctx / 2;
    return c;
}

const char *sinks_config_problem(const sinks_config *c, char *buf, size_t size) {
#define BAD(...) return snprintf(buf, size, __VA_ARGS__), buf
    if (c->n_layer < 1 || c->n_layer > SINKS_MAX_LAYERS)
        BAD("--layers %" PRId64 " must be in [1, %d]", c->n_layer, SINKS_MAX_LAYERS);
    if (c->n_head < 1 || c->n_head > SINKS_MAX_HEADS)
        BAD("--heads %" PRId64 " must be in [1, %d]", c->n_head, SINKS_MAX_HEADS);
    if (c->d_model < 1 || c->d_model % c->n_head || (c->d_model / c->n_head) % 2)
        BAD("--d-model %" PRId64 " must be a multiple of --heads %" PRId64 " with an even d_head (RoPE)", c->d_model,
            c->n_head);
    if (c->d_mlp < 0) BAD("--d-mlp %" PRId64 " must be >= 0", c->d_mlp);
    if (c->n_ctx < 4 || c->n_ctx > 1024) BAD("--n-ctx %" PRId64 " must be in [4, 1024]", c->n_ctx);
    if (c->shift < 1 || c->shift > c->n_ctx - 3)
        BAD("--shift %" PRId64 " must be in [1, --n-ctx - 3 = %" PRId64 "]", c->shift, c->n_ctx - 3);
    if (c->batch < 1) BAD("--batch %" PRId64 " must be >= 1", c->batch);
    if (c->steps < 1) BAD("--steps %" PRId64 " must be >= 1", c->steps);
    if (c->warmup < 1 || c->warmup > c->steps)
        BAD("--warmup %" PRId64 " must be in [1, --steps %" PRId64 "]", c->warmup, c->steps);
    if (c->probe_every < 1 || c->steps / c->probe_every + 2 > SINKS_MAX_PROBES)
        BAD("--steps %" PRId64 " with a probe every %" PRId64 " steps makes more than %d probes", c->steps,
            c->probe_every, SINKS_MAX_PROBES);
    if (c->eval_batches < 1) BAD("--eval-batches %" PRId64 " must be >= 1", c->eval_batches);
    if (!(c->lr > 0) || !isfinite(c->lr)) BAD("--lr %g must be finite and > 0", c->lr);
    if (!(c->weight_decay >= 0 && c->weight_decay * c->lr < 1))
        BAD("--weight-decay %g must be >= 0 with lr x decay < 1", c->weight_decay);
    return NULL;
#undef BAD
}

/* ---- one run ------------------------------------------------------------------------------------------ */

/* The learning rate of step t: linear warm-up to lr, then cosine to lr / 10. */
static double lr_at(const sinks_config *c, int64_t t) {
    if (t < c->warmup) return c->lr * (double)(t + 1) / (double)c->warmup;
    double progress = c->steps > c->warmup ? (double)(t - c->warmup) / (double)(c->steps - c->warmup) : 1;
    return c->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}

static qkv_tensor *ids_tensor(qkv_ctx *ctx, const int32_t *ids, int64_t B, int64_t n) {
    qkv_tensor *t = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){B, n});
    if (t) memcpy(qkv_i32(t), ids, (size_t)(B * n) * sizeof *ids);
    return t;
}

/* Sums of -log p(target) of logits [B, n, V] (f32): position i of row b predicts target[b n + i] (< 0: not
 * counted), in bin[b n + i] (0 .. bins-1). */
static void add_losses(const qkv_tensor *logits, const int32_t *target, const int *bin, double *sum, int64_t *count) {
    int64_t B = logits->shape[0], n = logits->shape[1], V = logits->shape[2];
    const float *z = qkv_f32(logits);
    for (int64_t r = 0; r < B * n; r++) {
        if (target[r] < 0) continue;
        const float *row = z + r * V;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) m = fmax(m, (double)row[v]);
        for (int64_t v = 0; v < V; v++) s += exp((double)row[v] - m);
        sum[bin[r]] += m + log(s) - (double)row[target[r]]; // -log softmax(z)_t = logsumexp(z) - z_t
        count[bin[r]]++;
    }
}

/* The logits of ids [B, n] with recording off (a step tensor), or NULL with the error in ctx. */
static qkv_tensor *logits_of(qkv_ctx *ctx, qkv_model *m, const int32_t *ids, int64_t B, int64_t n) {
    return qkv_model_forward(ctx, m, ids_tensor(ctx, ids, B, n), QKV_CAUSAL);
}

/* The held-out losses: r->final_loss (or *init_only), per kind, and the StreamingLLM test. */
enum { BIN_SKIP = 0, BIN_ALL, BIN_TEXT, BIN_LOOKUP, BIN_OTHER, BIN_BOS, BIN_NOBOS, BIN_WIN_BOS, BIN_WIN_NOBOS,
       BIN_LOOKUP_NOBOS, BINS };
static bool evaluate(qkv_ctx *ctx, qkv_model *m, const sinks_options *opt, const sinks_data *data,
                     sinks_arm_result *r, double *init_only) {
    if (qkv_error(ctx)) return false;
    const sinks_config *c = &opt->cfg;
    int64_t B = c->batch, n = c->n_ctx, s = c->shift;
    size_t cells = (size_t)(B * (n + 1));
    int32_t *ids = malloc(cells * sizeof *ids), *in = malloc(cells * sizeof *in), *tg = malloc(cells * sizeof *tg);
    int *bin = malloc(cells * sizeof *bin);
    uint8_t *kind = malloc(cells);
    double sum[BINS] = {0};
    int64_t count[BINS] = {0};
    bool ok = ids && in && tg && bin && kind, was = qkv_set_grad_enabled(ctx, false);
    int32_t bos = data->from_file ? FILE_BOS : BOS;
    for (int64_t e = 0; ok && e < c->eval_batches; e++) {
        sinks_batch(data, 1, e, B, n, ids, kind);
        // the sequence as it is: position i predicts ids[i+1]; counted in the whole loss and in its kind
        double part[BINS] = {0};
        int64_t cnt[BINS] = {0};
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < n; i++) {
                int64_t k = b * n + i;
                tg[k] = i + 1 < n ? ids[k + 1] : -1;
                int kd = i + 1 < n ? kind[k + 1] : SINKS_T_OTHER;
                bin[k] = kd == SINKS_T_TEXT ? BIN_TEXT : kd == SINKS_T_LOOKUP ? BIN_LOOKUP : BIN_OTHER;
            }
        qkv_tensor *z = logits_of(ctx, m, ids, B, n);
        if (!(ok = z != NULL)) break;
        add_losses(z, tg, bin, part, cnt); // by kind
        for (int64_t k = 0; k < B * n; k++) bin[k] = BIN_ALL;
        add_losses(z, tg, bin, part, cnt); // all of them
        for (int64_t k = 0; k < B * n; k++) bin[k] = BIN_BOS, tg[k] = k % n < 1 ? -1 : tg[k];
        add_losses(z, tg, bin, part, cnt); // targets t >= 2, for the StreamingLLM comparison
        qkv_step_end(ctx);
        if (init_only) {
            for (int k = 0; k < BINS; k++) sum[k] += part[k], count[k] += cnt[k];
            continue;
        }
        // BOS dropped: in[b, j] = ids[b, j+1], position j predicts ids[j+2] (targets t in [2, n-1])
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < n - 1; j++) {
                int64_t k = b * (n - 1) + j;
                in[k] = ids[b * n + j + 1];
                tg[k] = j + 2 < n ? ids[b * n + j + 2] : -1;
                bin[k] = BIN_NOBOS;
            }
        z = logits_of(ctx, m, in, B, n - 1);
        if ((ok = z != NULL)) add_losses(z, tg, bin, part, cnt);
        for (int64_t b = 0; ok && b < B; b++) // the lookup targets alone
            for (int64_t j = 0; j < n - 1; j++) {
                int64_t k = b * (n - 1) + j;
                tg[k] = j + 2 < n && kind[b * n + j + 2] == SINKS_T_LOOKUP ? ids[b * n + j + 2] : -1;
                bin[k] = BIN_LOOKUP_NOBOS;
            }
        if (ok) add_losses(z, tg, bin, part, cnt);
        qkv_step_end(ctx);
        // the window ids[s .. n-1] without BOS (length n-s: position j predicts ids[s+j+1]) and with BOS in front
        for (int with_bos = 0; ok && with_bos < 2; with_bos++) {
            int64_t len = n - s + with_bos;
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < len; j++) {
                    int64_t k = b * len + j, t = s + j + 1 - with_bos; // the target's position in ids
                    in[k] = with_bos && j == 0 ? bos : ids[b * n + t - 1];
                    tg[k] = (with_bos && j == 0) || t >= n ? -1 : ids[b * n + t];
                    bin[k] = with_bos ? BIN_WIN_BOS : BIN_WIN_NOBOS;
                }
            z = logits_of(ctx, m, in, B, len);
            if ((ok = z != NULL)) add_losses(z, tg, bin, part, cnt);
            qkv_step_end(ctx);
        }
        for (int k = 0; k < BINS; k++) sum[k] += part[k], count[k] += cnt[k];
    }
    qkv_set_grad_enabled(ctx, was);
    free(ids), free(in), free(tg), free(bin), free(kind);
    if (!ok) return false;
#define MEAN(k) (count[k] ? sum[k] / (double)count[k] : NAN)
    if (init_only) {
        *init_only = MEAN(BIN_ALL);
        return true;
    }
    r->final_loss = MEAN(BIN_ALL);
    r->loss_kind[SINKS_T_TEXT] = MEAN(BIN_TEXT), r->loss_kind[SINKS_T_LOOKUP] = MEAN(BIN_LOOKUP);
    r->loss_kind[SINKS_T_OTHER] = MEAN(BIN_OTHER);
    r->loss_bos = MEAN(BIN_BOS), r->loss_nobos = MEAN(BIN_NOBOS);
    r->loss_window_bos = MEAN(BIN_WIN_BOS), r->loss_window_nobos = MEAN(BIN_WIN_NOBOS);
    r->lookup_nobos = MEAN(BIN_LOOKUP_NOBOS);
#undef MEAN
    return true;
}

bool sinks_evaluate(qkv_ctx *ctx, qkv_model *m, const sinks_options *opt, const sinks_data *data, sinks_arm_result *r) {
    return evaluate(ctx, m, opt, data, r, NULL);
}

/* One probe on the held-out batch 0: its loss, every head's statistics, the sink rate, the massive
 * activations of every layer. Fills probe p of r and the final fields (the last probe's stay). */
static bool probe(qkv_ctx *ctx, qkv_model *m, const sinks_options *opt, const sinks_data *data,
                  sinks_arm_result *r, int64_t step, float *scratch) {
    const sinks_config *c = &opt->cfg;
    int64_t B = c->batch, n = c->n_ctx, L = c->n_layer, H = c->n_head;
    int32_t *ids = malloc((size_t)(B * n) * sizeof *ids), *tg = malloc((size_t)(B * n) * sizeof *tg);
    int *bin = calloc((size_t)(B * n), sizeof *bin);
    bool ok = ids && tg && bin, was = qkv_set_grad_enabled(ctx, false);
    qkv_model_set_inspect(m, true);
    int p = r->n_probes;
    if (ok) {
        sinks_batch(data, 1, 0, B, n, ids, NULL);
        for (int64_t k = 0; k < B * n; k++) tg[k] = k % n + 1 < n ? ids[k + 1] : -1;
        qkv_tensor *z = logits_of(ctx, m, ids, B, n);
        double sum[1] = {0};
        int64_t count[1] = {0};
        if ((ok = z != NULL)) add_losses(z, tg, bin, sum, count);
        r->step[p] = step, r->probe_loss[p] = sum[0] / (double)count[0], r->probe_massive[p] = 0;
        double all_first[SINKS_MAX_LAYERS * SINKS_MAX_HEADS];
        for (int64_t l = 0; ok && l < L; l++) {
            qkv_tensor *A = qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, l);
            qkv_tensor *X = qkv_model_inspect(ctx, m, QKV_INSPECT_RESID_POST, l);
            if (!(ok = A && X)) break;
            sinks_head_stats(qkv_f32(A), A->shape[0], H, n, r->first[l], r->mass[l], r->entropy[l]);
            double f = 0, ms = 0;
            for (int64_t h = 0; h < H; h++) f += r->first[l][h], ms += r->mass[l][h], all_first[l * H + h] = r->first[l][h];
            r->probe_first[p][l] = f / (double)H, r->probe_mass[p][l] = ms / (double)H;
            r->massive[l] = sinks_massive(qkv_f32(X), ids, B, n, c->d_model, scratch);
            double ratio = r->massive[l].max_abs / r->massive[l].median_abs;
            if (!(ratio <= r->probe_massive[p])) r->probe_massive[p] = ratio;
        }
        r->sink_rate = r->probe_sink_rate[p] = sinks_sink_rate(all_first, (int)(L * H), SINKS_EPSILON);
        r->n_probes++;
    }
    qkv_model_set_inspect(m, false);
    qkv_step_end(ctx);
    qkv_set_grad_enabled(ctx, was);
    free(ids), free(tg), free(bin);
    return ok;
}

bool sinks_train_arm(const sinks_options *opt, const sinks_data *data, const sinks_arm *arm, sinks_arm_result *r) {
    double t0 = now_seconds();
    const sinks_config *c = &opt->cfg;
    memset(r, 0, sizeof *r);
    r->name = arm->name;
    qkv_options o = qkv_default_options();
    o.threads = opt->threads > 0 ? opt->threads : 1;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return fprintf(stderr, PROG ": cannot make a context\n"), false;
    qkv_model_config mc = qkv_model_default_config();
    mc.vocab = data->vocab, mc.n_ctx = c->n_ctx, mc.d_model = c->d_model, mc.n_layer = c->n_layer;
    mc.n_head = c->n_head, mc.d_mlp = c->d_mlp, mc.positions = QKV_POS_ROPE;
    mc.seed = mix(opt->seed * 31u + 1u); // the same initialisation in every arm (where the parameters agree)
    arm->apply(&mc);
    qkv_model *m = qkv_model_new(ctx, &mc);
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    oo.lr = c->lr, oo.beta2 = 0.95, oo.eps = 1e-8, oo.weight_decay = c->weight_decay;
    qkv_optimizer *adam = m ? qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m)) : NULL;
    int64_t B = c->batch, n = c->n_ctx;
    int32_t *ids = malloc((size_t)(B * n) * sizeof *ids);
    float *scratch = malloc((size_t)(B * n * c->d_model) * sizeof *scratch);
    bool ok = adam && ids && scratch;
    if (ok) ok = evaluate(ctx, m, opt, data, r, &r->init_loss);
    for (int64_t t = 0; ok && t <= c->steps; t++) {
        if ((t % c->probe_every == 0 || t == c->steps) && r->n_probes < SINKS_MAX_PROBES)
            if (!(ok = probe(ctx, m, opt, data, r, t, scratch))) break;
        if (t == c->steps) break;
        sinks_batch(data, 0, t, B, n, ids, NULL);
        qkv_tensor *in = ids_tensor(ctx, ids, B, n);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, in, QKV_CAUSAL), qkv_next_token_targets(ctx, in));
        qkv_optim_set_lr(adam, lr_at(c, t));
        if (loss && qkv_backward(ctx, loss, NULL) == QKV_OK) qkv_optim_step(adam);
        qkv_optim_zero_grad(adam);
        qkv_step_end(ctx);
        ok = !qkv_error(ctx);
    }
    if (ok) ok = evaluate(ctx, m, opt, data, r, NULL);
    if (!ok) fprintf(stderr, PROG ": arm %s: %s\n", arm->name, qkv_error(ctx) ? qkv_errmsg(ctx) : "out of memory");
    free(ids), free(scratch);
    qkv_ctx_free(ctx);
    r->seconds = now_seconds() - t0;
    return ok;
}

/* ---- the arms in parallel ------------------------------------------------------------------------------- */

typedef struct sweep {
    const sinks_options *opt;
    const sinks_data *data;
    sinks_result *r;
    pthread_mutex_t lock;
    int next, failed;
    double t0;
} sweep;

static void *worker(void *arg) {
    sweep *sw = arg;
    for (;;) {
        pthread_mutex_lock(&sw->lock);
        int job = sw->failed ? sw->r->n_arms : sw->next++;
        pthread_mutex_unlock(&sw->lock);
        if (job >= sw->r->n_arms) return NULL;
        sinks_arm_result *a = &sw->r->arm[job];
        bool ok = sinks_train_arm(sw->opt, sw->data, sw->opt->arms[job], a);
        pthread_mutex_lock(&sw->lock);
        sw->failed |= !ok;
        if (ok && sw->opt->progress) {
            fprintf(sw->opt->progress, "  %-9s loss %.4f -> %.4f, sink rate %.3f  (%.1f s, %.0f s since the start)\n",
                    a->name, a->init_loss, a->final_loss, a->sink_rate, a->seconds, now_seconds() - sw->t0);
            fflush(sw->opt->progress);
        }
        pthread_mutex_unlock(&sw->lock);
    }
}

/* ---- tables -------------------------------------------------------------------------------------------- */

static void print_tables(const sinks_options *opt, const sinks_result *r) {
    FILE *o = opt->log;
    if (!o) return;
    const sinks_config *c = &r->cfg;
    int64_t L = c->n_layer, H = c->n_head;
    fprintf(o, "\nheld-out loss (nats/token): before and after training, and by target kind\n");
    fprintf(o, "%-9s %7s %7s %7s %7s %7s\n", "arm", "init", "final", "text", "lookup", "other");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(o, "%-9s %7.3f %7.3f %7.3f %7.3f %7.3f\n", u->name, u->init_loss, u->final_loss,
                u->loss_kind[SINKS_T_TEXT], u->loss_kind[SINKS_T_LOOKUP], u->loss_kind[SINKS_T_OTHER]);
    }
    fprintf(o, "\nsinks after training: sink rate (heads with mean first-token weight > %.1f), and per layer the mean\n"
               "over heads of the first-token weight, of the row mass sum_j A_ij and of the attention entropy (nats; of\n"
               "the heads that attend at all)\n",
            SINKS_EPSILON);
    fprintf(o, "%-9s %5s", "arm", "rate");
    for (int64_t l = 0; l < L; l++) fprintf(o, "  first%-2" PRId64, l);
    for (int64_t l = 0; l < L; l++) fprintf(o, "  mass%-3" PRId64, l);
    for (int64_t l = 0; l < L; l++) fprintf(o, "  ent%-4" PRId64, l);
    fprintf(o, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(o, "%-9s %5.3f", u->name, u->sink_rate);
        for (int64_t l = 0; l < L; l++) fprintf(o, "  %7.3f", u->probe_first[u->n_probes - 1][l]);
        for (int64_t l = 0; l < L; l++) fprintf(o, "  %7.3f", u->probe_mass[u->n_probes - 1][l]);
        for (int64_t l = 0; l < L; l++) { // over the heads that attend at all (a head of mass 0 has no entropy)
            double e = 0;
            int live = 0;
            for (int64_t h = 0; h < H; h++)
                if (!isnan(u->entropy[l][h])) e += u->entropy[l][h], live++;
            fprintf(o, "  %7.3f", live ? e / live : NAN);
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nfirst-token weight per head after training (layer.head)\n%-9s", "arm");
    for (int64_t l = 0; l < L; l++)
        for (int64_t h = 0; h < H; h++) fprintf(o, " %2" PRId64 ".%-3" PRId64, l, h);
    fprintf(o, "\n");
    for (int a = 0; a < r->n_arms; a++) {
        fprintf(o, "%-9s", r->arm[a].name);
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++) fprintf(o, " %6.3f", r->arm[a].first[l][h]);
        fprintf(o, "\n");
    }
    fprintf(o, "\nsink rate during training (step: rate)\n");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(o, "%-9s", u->name);
        int shown = u->n_probes < 7 ? u->n_probes : 7;
        for (int k = 0; k < shown; k++) {
            int p = shown > 1 ? (int)((int64_t)k * (u->n_probes - 1) / (shown - 1)) : 0;
            fprintf(o, " %5" PRId64 ": %.3f", u->step[p], u->probe_sink_rate[p]);
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nmassive activations after training: per layer the largest |x| of hook_resid_post, its ratio to the\n"
               "median |x|, and where it sits (position, token, dimension)\n");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(o, "%-9s", u->name);
        for (int64_t l = 0; l < L; l++) {
            const sinks_massive_act *v = &u->massive[l];
            fprintf(o, "  L%" PRId64 " %7.2f x%-6.1f pos %2" PRId64 " tok %3d dim %2" PRId64, l, v->max_abs,
                    v->max_abs / v->median_abs, v->pos, (int)v->token, v->dim);
        }
        fprintf(o, "\n");
    }
    fprintf(o, "\nthe StreamingLLM test: held-out loss on the same targets with the first token and without it\n"
               "  whole: targets 2..%" PRId64 ", the sequence as it is / with BOS dropped (lookup targets: the same)\n"
               "  window: targets %" PRId64 "..%" PRId64 " of the window from position %" PRId64
               ", with BOS put in front / without\n",
            c->n_ctx - 1, c->shift + 1, c->n_ctx - 1, c->shift);
    fprintf(o, "%-9s %7s %7s %7s   %7s %7s %7s   %7s %7s\n", "arm", "BOS", "no BOS", "change", "lk BOS", "lk none",
            "change", "win BOS", "win no");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(o, "%-9s %7.3f %7.3f %+7.3f   %7.3f %7.3f %+7.3f   %7.3f %7.3f %+7.3f\n", u->name, u->loss_bos,
                u->loss_nobos, u->loss_nobos - u->loss_bos, u->loss_kind[SINKS_T_LOOKUP], u->lookup_nobos,
                u->lookup_nobos - u->loss_kind[SINKS_T_LOOKUP], u->loss_window_bos, u->loss_window_nobos,
                u->loss_window_nobos - u->loss_window_bos);
    }
}

/* ---- files --------------------------------------------------------------------------------------------- */

static FILE *open_out(const sinks_options *opt, const char *name, atomic_file *file, char *path, size_t size) {
    int len = snprintf(path, size, "%s/%s", opt->out_dir, name);
    if (len < 0 || (size_t)len >= size) return fprintf(stderr, PROG ": path too long: %s/%s\n", opt->out_dir, name), NULL;
    FILE *f = atomic_open(file, path);
    if (!f) fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    return f;
}
static bool close_out(const sinks_options *opt, atomic_file *file, const char *path) {
    bool ok = atomic_commit(file);
    if (!ok) fprintf(stderr, PROG ": error writing %s: %s\n", path, strerror(errno));
    else if (opt->progress) fprintf(opt->progress, "  wrote %s\n", path);
    return ok;
}

static bool write_csvs(const sinks_options *opt, const sinks_result *r) {
    char path[4096], name[128];
    atomic_file file;
    int64_t L = r->cfg.n_layer, H = r->cfg.n_head;
    for (int a = 0; a < r->n_arms; a++) { // per arm: every probe's per-layer numbers
        const sinks_arm_result *u = &r->arm[a];
        snprintf(name, sizeof name, "sinks_%s.csv", u->name);
        FILE *f = open_out(opt, name, &file, path, sizeof path);
        if (!f) return false;
        fprintf(f, "arm,step,held_out_loss,sink_rate,max_ratio,layer,first_token_weight,row_mass\n");
        for (int p = 0; p < u->n_probes; p++)
            for (int64_t l = 0; l < L; l++)
                fprintf(f, "%s,%" PRId64 ",%.17g,%.17g,%.17g,%" PRId64 ",%.17g,%.17g\n", u->name, u->step[p],
                        u->probe_loss[p], u->probe_sink_rate[p], u->probe_massive[p], l, u->probe_first[p][l],
                        u->probe_mass[p][l]);
        if (!close_out(opt, &file, path)) return false;
    }
    FILE *f = open_out(opt, "sinks_heads.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,layer,head,first_token_weight,row_mass,entropy,sink\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++) {
                const sinks_arm_result *u = &r->arm[a];
                fprintf(f, "%s,%" PRId64 ",%" PRId64 ",%.17g,%.17g,%.17g,%d\n", u->name, l, h, u->first[l][h],
                        u->mass[l][h], u->entropy[l][h], u->first[l][h] > SINKS_EPSILON);
            }
    if (!close_out(opt, &file, path)) return false;
    f = open_out(opt, "sinks_massive.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,layer,max_abs,median_abs,ratio,row,position,token,dim\n");
    for (int a = 0; a < r->n_arms; a++)
        for (int64_t l = 0; l < L; l++) {
            const sinks_massive_act *v = &r->arm[a].massive[l];
            fprintf(f, "%s,%" PRId64 ",%.17g,%.17g,%.17g,%" PRId64 ",%" PRId64 ",%d,%" PRId64 "\n", r->arm[a].name, l,
                    v->max_abs, v->median_abs, v->max_abs / v->median_abs, v->row, v->pos, (int)v->token, v->dim);
        }
    if (!close_out(opt, &file, path)) return false;
    f = open_out(opt, "sinks_summary.csv", &file, path, sizeof path);
    if (!f) return false;
    fprintf(f, "arm,init_loss,final_loss,text_loss,lookup_loss,other_loss,sink_rate,loss_bos,loss_nobos,"
               "lookup_nobos,loss_window_bos,loss_window_nobos,seconds\n");
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        fprintf(f, "%s,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.3f\n", u->name, u->init_loss,
                u->final_loss, u->loss_kind[SINKS_T_TEXT], u->loss_kind[SINKS_T_LOOKUP], u->loss_kind[SINKS_T_OTHER],
                u->sink_rate, u->loss_bos, u->loss_nobos, u->lookup_nobos, u->loss_window_bos, u->loss_window_nobos,
                u->seconds);
    }
    return close_out(opt, &file, path);
}

static const char *const arm_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                                         "#e377c2", "#17becf"};
static const char *const arm_dashes[] = {NULL, "8 3", "2 2", "8 3 2 3", NULL, "8 3", "2 2", "8 3 2 3"};
static const plot_marker arm_markers[] = {PLOT_MARKER_CIRCLE, PLOT_MARKER_SQUARE, PLOT_MARKER_TRIANGLE,
                                          PLOT_MARKER_DIAMOND, PLOT_MARKER_SQUARE, PLOT_MARKER_CIRCLE,
                                          PLOT_MARKER_DIAMOND, PLOT_MARKER_TRIANGLE};

/* A grouped bar chart: n_groups groups (along x) of n_series bars, values[g n_series + s], a legend. */
static bool bars_svg(const char *path, const char *title, const char *y_label, const char *const *groups, int n_groups,
                     const char *const *series, int n_series, const double *values) {
    double lo = 0, hi = 0;
    for (int k = 0; k < n_groups * n_series; k++)
        if (isfinite(values[k])) lo = fmin(lo, values[k]), hi = fmax(hi, values[k]);
    double ticks[16], a_lo, a_hi;
    int nt = plot_axis(lo, hi > lo ? hi : lo + 1, false, ticks, 16, &a_lo, &a_hi);
    if (nt < 2) return errno = EINVAL, false;
    double left = 80, top = 50, ph = 300, gw = 40.0 + 22.0 * n_series, pw = gw * n_groups, right = 150;
    double width = left + pw + right, height = top + ph + 70;
    atomic_file file;
    FILE *f = atomic_open(&file, path);
    if (!f) return false;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", fmax(width, 9.0 * strlen(title)), height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    plot_svg_text(f, fmax(width, 9.0 * strlen(title)) / 2, 26, "middle", 16, title, 0);
#define Y(v) (top + ph * (a_hi - (v)) / (a_hi - a_lo))
    char label[32];
    for (int k = 0; k < nt; k++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n", left, Y(ticks[k]),
                left + pw, Y(ticks[k]));
        plot_tick_label(ticks[k], ticks[1] - ticks[0], false, label, sizeof label);
        plot_svg_text(f, left - 6, Y(ticks[k]) + 4, "end", 11, label, 0);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, Y(0.0), left + pw, Y(0.0));
    plot_svg_text(f, 20, top + ph / 2, "middle", 12, y_label, -90);
    for (int g = 0; g < n_groups; g++) {
        double x0 = left + g * gw + 20;
        for (int s = 0; s < n_series; s++) {
            double v = values[g * n_series + s];
            if (!isfinite(v)) continue;
            double y0 = Y(fmax(v, 0.0)), y1 = Y(fmin(v, 0.0));
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"20\" height=\"%.1f\" fill=\"%s\"><title>%s %s: %.4g</title>"
                    "</rect>\n", x0 + 22.0 * s, y0, fmax(y1 - y0, 0.5), arm_colors[s % 8], groups[g], series[s], v);
        }
        plot_svg_text(f, left + g * gw + gw / 2, top + ph + 18, "middle", 12, groups[g], 0);
    }
    for (int s = 0; s < n_series; s++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", left + pw + 15,
                top + 10 + 20.0 * s, arm_colors[s % 8]);
        plot_svg_text(f, left + pw + 32, top + 21 + 20.0 * s, "start", 12, series[s], 0);
    }
#undef Y
    fprintf(f, "</svg>\n");
    return atomic_commit(&file);
}

static bool report_plot(const sinks_options *opt, bool ok, const char *path) {
    if (!ok) fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    else if (opt->progress) fprintf(opt->progress, "  wrote %s\n", path);
    return ok;
}

static bool write_plots(const sinks_options *opt, const sinks_result *r) {
    char path[4096 + 64];
    int64_t L = r->cfg.n_layer, H = r->cfg.n_head;
    plot_series s[SINKS_MAX_ARMS];
    plot_style st[SINKS_MAX_ARMS];
    static double xs[SINKS_MAX_ARMS][SINKS_MAX_PROBES], ys[SINKS_MAX_ARMS][SINKS_MAX_PROBES];
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        for (int p = 0; p < u->n_probes; p++) xs[a][p] = (double)u->step[p], ys[a][p] = u->probe_sink_rate[p];
        s[a] = (plot_series){u->name, xs[a], ys[a], u->n_probes};
        st[a] = (plot_style){arm_colors[a % 8], arm_dashes[a % 8], arm_markers[a % 8]};
    }
    char title[200];
    snprintf(title, sizeof title, "Sink rate (share of heads with mean first-token weight > %.1f) during training",
             SINKS_EPSILON);
    snprintf(path, sizeof path, "%s/sinks_rate.svg", opt->out_dir);
    if (!report_plot(opt, plot_lines_styled_svg(path, title, "step", "sink rate", s, r->n_arms, false, false, st), path))
        return false;
    static double fw[SINKS_MAX_ARMS][SINKS_MAX_PROBES];
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        for (int p = 0; p < u->n_probes; p++) fw[a][p] = u->probe_first[p][L - 1];
        s[a].y = fw[a];
    }
    snprintf(title, sizeof title, "Mean first-token weight of the last layer's heads during training");
    snprintf(path, sizeof path, "%s/sinks_first_weight_steps.svg", opt->out_dir);
    if (!report_plot(opt, plot_lines_styled_svg(path, title, "step", "first-token weight", s, r->n_arms, false, false, st),
                     path))
        return false;
    // heat map: one panel per arm, layers x heads
    static double cells[SINKS_MAX_ARMS][SINKS_MAX_LAYERS * SINKS_MAX_HEADS];
    plot_panel panels[SINKS_MAX_ARMS];
    for (int a = 0; a < r->n_arms; a++) {
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++) cells[a][l * H + h] = r->arm[a].first[l][h];
        panels[a] = (plot_panel){r->arm[a].name, cells[a]};
    }
    snprintf(path, sizeof path, "%s/sinks_first_weight.svg", opt->out_dir);
    if (!report_plot(opt, plot_heatmap_grid_svg(path, "Mean first-token weight per head after training", "head", "layer",
                                                panels, r->n_arms, r->n_arms > 3 ? 3 : r->n_arms, (int)L, (int)H, NULL, 0),
                     path))
        return false;
    // massive activations: the ratio max / median per arm and layer
    const char *groups[SINKS_MAX_ARMS], *layers[SINKS_MAX_LAYERS];
    static char layer_names[SINKS_MAX_LAYERS][32];
    double v[SINKS_MAX_ARMS * SINKS_MAX_LAYERS];
    for (int64_t l = 0; l < L; l++) snprintf(layer_names[l], sizeof layer_names[l], "layer %d", (int)l), layers[l] = layer_names[l];
    for (int a = 0; a < r->n_arms; a++) {
        groups[a] = r->arm[a].name;
        for (int64_t l = 0; l < L; l++) v[a * L + l] = r->arm[a].massive[l].max_abs / r->arm[a].massive[l].median_abs;
    }
    snprintf(path, sizeof path, "%s/sinks_massive.svg", opt->out_dir);
    if (!report_plot(opt, bars_svg(path, "Largest |activation| of the residual stream / median |activation|",
                                   "max |x| / median |x|", groups, r->n_arms, layers, (int)L, v),
                     path))
        return false;
    // the StreamingLLM test: the loss change when BOS is gone
    static const char *const tests[] = {"whole sequence", "lookup targets", "window"};
    for (int a = 0; a < r->n_arms; a++) {
        const sinks_arm_result *u = &r->arm[a];
        v[a * 3] = u->loss_nobos - u->loss_bos, v[a * 3 + 1] = u->lookup_nobos - u->loss_kind[SINKS_T_LOOKUP];
        v[a * 3 + 2] = u->loss_window_nobos - u->loss_window_bos;
    }
    snprintf(path, sizeof path, "%s/sinks_streaming.svg", opt->out_dir);
    return report_plot(opt, bars_svg(path, "Held-out loss change when the first token (BOS) is removed",
                                     "loss without BOS - loss with it (nats)", groups, r->n_arms, tests, 3, v),
                       path);
}

bool sinks_run(const sinks_options *opt_in, sinks_result *r) {
    double t0 = now_seconds();
    sinks_options opt = *opt_in;
    memset(r, 0, sizeof *r);
    char why[256];
    if (sinks_config_problem(&opt.cfg, why, sizeof why)) return fprintf(stderr, PROG ": %s\n", why), false;
    if (opt.n_arms <= 0) {
        opt.n_arms = sinks_arm_count < SINKS_MAX_ARMS ? sinks_arm_count : SINKS_MAX_ARMS;
        for (int a = 0; a < opt.n_arms; a++) opt.arms[a] = &sinks_arms[a];
    }
    r->cfg = opt.cfg, r->n_arms = opt.n_arms;
    static sinks_data data; // one run at a time per process
    if (opt.data_path) {
        if (!sinks_data_file(&data, opt.data_path, opt.cfg.n_ctx, why, sizeof why))
            return fprintf(stderr, PROG ": %s\n", why), false;
        data.seed = opt.seed;
    } else {
        sinks_data_synthetic(&data, opt.seed);
    }
    r->vocab = data.vocab;
    const sinks_config *c = &opt.cfg;
    if (opt.log) {
        if (opt.data_path)
            fprintf(opt.log, "data: the bytes of %s (%" PRId64 " bytes; the last 10%% held out), BOS = 256\n",
                    opt.data_path, data.n_bytes);
        else
            fprintf(opt.log, "data: BOS, then bigram text (%d tokens, 2 successors each, 3:1) mixed with stores "
                    "store(k, v) (probability %.2f a step) and queries query(k) v of a stored k (%.2f), %d keys, %d values, a fresh map "
                    "per sequence; vocabulary %d\n", TEXT_COUNT, SINKS_STORE_P, SINKS_QUERY_P, SINKS_KEYS, SINKS_VALUES,
                    SINKS_VOCAB);
        fprintf(opt.log, "model: %" PRId64 " layers, d_model %" PRId64 ", %" PRId64 " heads, d_mlp %" PRId64
                ", RoPE, n_ctx %" PRId64 "; AdamW lr %g (warm-up %" PRId64 ", cosine to lr/10), weight decay %g, %"
                PRId64 " steps of %" PRId64 " sequences; seed %llu; %d arms\n", c->n_layer, c->d_model, c->n_head,
                c->d_mlp, c->n_ctx, c->lr, c->warmup, c->weight_decay, c->steps, c->batch, (unsigned long long)opt.seed, opt.n_arms);
        fflush(opt.log);
    }
    sweep sw = {.opt = &opt, .data = &data, .r = r, .t0 = t0};
    pthread_mutex_init(&sw.lock, NULL);
    int jobs = opt.jobs < 1 ? 1 : opt.jobs > SINKS_MAX_ARMS ? SINKS_MAX_ARMS : opt.jobs;
    pthread_t tid[SINKS_MAX_ARMS];
    int started = 0;
    for (int j = 1; j < jobs; j++)
        if (pthread_create(&tid[started], NULL, worker, &sw) == 0) started++;
    worker(&sw);
    for (int j = 0; j < started; j++) pthread_join(tid[j], NULL);
    pthread_mutex_destroy(&sw.lock);
    sinks_data_free(&data);
    if (sw.failed) return false;
    print_tables(&opt, r);
    bool ok = write_csvs(&opt, r) && write_plots(&opt, r);
    r->seconds = now_seconds() - t0;
    return ok;
}
