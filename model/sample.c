/*
 * sample.c — text from a causal model: greedy, temperature and top-k sampling from the context RNG.
 *
 * For each new token: logits = model(last min(n, n_ctx) tokens)[-1] with recording off. While the sequence
 * fits in n_ctx the model's key/value cache serves it: the prompt's keys and values are computed once, and
 * each new token costs one position (O(n) attention instead of rerunning O(n^2)); once the window slides every
 * position moves, and the window is rerun. A user's attention weights or a mean ablation run uncached.
 * greedy: argmax; else p = softmax(logits / T) over the k most likely ids (all when k = 0), drawn by one
 * uniform number u from the context RNG: the first id whose cumulative p exceeds u.
 */
#include "model_internal.h"

#include <inttypes.h>
#include <math.h>

/* The id to emit from one row of logits [V] (as doubles); order [V] is scratch. */
static int32_t pick_token(qkv_ctx *ctx, const double *logit, int64_t V, const qkv_sample_options *o, int32_t *order,
                          double *p) {
    if (o->temperature == 0) { // greedy: the first largest logit
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (logit[j] > logit[best]) best = j;
        return (int32_t)best;
    }
    int64_t k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    // the k largest logits in decreasing order (ties: lower id first), by selection: O(V k)
    for (int64_t j = 0; j < V; j++) order[j] = (int32_t)j;
    for (int64_t i = 0; i < k; i++) {
        int64_t best = i;
        for (int64_t j = i + 1; j < V; j++)
            if (logit[order[j]] > logit[order[best]] ||
                (logit[order[j]] == logit[order[best]] && order[j] < order[best]))
                best = j;
        int32_t t = order[i];
        order[i] = order[best];
        order[best] = t;
    }
    // p_i = exp((logit_i - max) / T) / sum
    double sum = 0.0, top = logit[order[0]];
    for (int64_t i = 0; i < k; i++) sum += p[i] = exp((logit[order[i]] - top) / o->temperature);
    double u = qkv_rng_uniform_(ctx) * sum, acc = 0.0;
    for (int64_t i = 0; i < k; i++)
        if ((acc += p[i]) > u) return order[i];
    return order[k - 1];
}

bool qkv_model_set_sample_cache(qkv_model *m, bool on) {
    if (!m) return false;
    bool was = !m->no_sample_cache;
    m->no_sample_cache = !on;
    return was;
}

qkv_status qkv_model_sample(qkv_ctx *ctx, qkv_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const qkv_sample_options *options, int32_t *out) {
    const char *fn = "qkv_model_sample";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!m || !prompt || !out)
        return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, !m ? "model" : !prompt ? "prompt" : "out");
    qkv_sample_options o = options ? *options : (qkv_sample_options){0, 0};
    if (!(o.temperature >= 0) || !isfinite(o.temperature))
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: temperature is %g: it must be finite and >= 0 (0 = greedy)", fn,
                          o.temperature);
    if (o.top_k < 0) return qkv_failc_(ctx, QKV_ERR_ARG, "%s: top_k is %" PRId64 ": it must be >= 0", fn, o.top_k);
    if (n_prompt < 1 || n_new < 0)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: n_prompt is %" PRId64 " and n_new %" PRId64
                          ": the prompt needs a token and n_new must be >= 0", fn, n_prompt, n_new);
    int64_t V = m->cfg.vocab, n_ctx = m->cfg.n_ctx;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return qkv_failc_(ctx, QKV_ERR_ARG, "%s: prompt[%" PRId64 "] is %" PRId32 ": outside [0, vocab = %" PRId64
                              ")", fn, i, prompt[i], V);
    qkv_mark_ mark = qkv_mark_now_(ctx);
    bool was = qkv_set_grad_enabled(ctx, false);
    bool inspect = qkv_model_set_inspect(m, false);
    m->hooks_no_keep = true; // the cache keeps nothing of sampling's forwards, whose steps are rewound
    int32_t *window = qkv_arena_array_(ctx, fn, (size_t)n_ctx, sizeof *window);
    int32_t *order = qkv_arena_array_(ctx, fn, (size_t)V, sizeof *order);
    double *p = qkv_arena_array_(ctx, fn, (size_t)V, sizeof *p);
    double *row = qkv_arena_array_(ctx, fn, (size_t)V, sizeof *row);
    bool cached = !m->no_sample_cache && qkv_model_cache_serves_(m);
    for (int64_t t = 0; t < n_new && !ctx->status; t++) {
        // window = the last min(n_prompt + t, n_ctx) tokens of prompt ++ out[0 .. t-1]
        int64_t len = n_prompt + t < n_ctx ? n_prompt + t : n_ctx;
        for (int64_t i = 0; i < len; i++) {
            int64_t src = n_prompt + t - len + i;
            window[i] = src < n_prompt ? prompt[src] : out[src - n_prompt];
        }
        qkv_mark_ step = qkv_mark_now_(ctx);
        qkv_tensor *logits; // [1, len or 1, V]
        if (cached && n_prompt + t <= n_ctx) {
            // the window has not slid: fill the cache with the prompt, then one new token a step
            bool fill = t == 0 || m->cache_len != n_prompt + t - 1;
            qkv_tensor *ids = fill ? qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, len}, window)
                                   : qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, 1}, &window[len - 1]);
            logits = ids ? qkv_model_forward_cached_(ctx, m, ids, fill ? QKV_CACHE_FILL_ : QKV_CACHE_STEP_) : NULL;
        } else { // positions shift as the window slides: every cached k and v would change, so rerun it
            qkv_tensor *ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, len}, window);
            logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        }
        if (!logits) break;
        int64_t last = logits->shape[1] - 1;
        for (int64_t j = 0; j < V; j++) {
            int64_t at = last * V + j;
            row[j] = logits->dtype == QKV_F64 ? qkv_f64(logits)[at] : (double)qkv_f32(logits)[at];
            if (!isfinite(row[j])) {
                qkv_failc_(ctx, QKV_ERR_NUMERIC, "%s: the logit of id %" PRId64 " is %g at token %" PRId64
                           ": the model's parameters are not finite", fn, j, row[j], t);
                break;
            }
        }
        if (ctx->status) break;
        out[t] = pick_token(ctx, row, V, &o, order, p);
        qkv_rewind_to_(ctx, step);
    }
    m->cache_len = 0; // a later sampling starts by filling it again
    qkv_model_set_inspect(m, inspect);
    m->hooks_no_keep = false;
    m->hook_epoch = 0;
    qkv_set_grad_enabled(ctx, was);
    qkv_rewind_to_(ctx, mark);
    return ctx->status;
}
