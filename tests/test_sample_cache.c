/*
 * test_sample_cache.c — qkv_model_sample's key/value cache: every cached step's logits equal the rerun
 * forward's last row (f64 to 1e-12, f32 to 1e-5) over configurations of positions, norms, soft-cap, tied
 * embeddings and MLP; sampled tokens are the same cached and uncached, greedy and drawn, across the window's
 * slide; the cache is made once and reused by later calls (no allocation after the first); configurations the
 * cache does not serve fall back to the rerun.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "../model/model_internal.h"
#include "test_ops.h"

static qkv_model_config config_variant(int v, qkv_dtype dt) {
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 13, c.n_ctx = 12, c.d_model = 16, c.n_layer = 2, c.n_head = 4, c.d_mlp = 24, c.dtype = dt;
    c.seed = (uint64_t)(v + 1);
    switch (v) {
    case 0: break;                                                                 // learned positions, layer norm
    case 1: c.positions = QKV_POS_ROPE, c.qk_norm = QKV_NORM_RMS, c.norm = QKV_NORM_RMS; break;
    case 2: c.positions = QKV_POS_SINUSOIDAL, c.attn_softcap = 3.0, c.tied_embeddings = true; break;
    case 3: c.positions = QKV_POS_NONE, c.d_mlp = 0, c.n_layer = 3; break;
    default: c.positions = QKV_POS_ROPE, c.qk_norm = QKV_NORM_LAYER, c.n_head = 1; break;
    }
    return c;
}
#define N_VARIANTS 5

/* Make the parameters less regular than their initialisation (logits far from ties). */
static void perturb(qkv_ctx *ctx, qkv_model *m) {
    for (int i = 0; i < qkv_model_param_count(m); i++) {
        qkv_tensor *p = qkv_model_params(m)[i];
        qkv_tensor *noise = qkv_randn(ctx, p->dtype, p->ndim, p->shape, 0, 0.5);
        for (int64_t j = 0; j < p->numel; j++) qkv_set_flat(ctx, p, j, at(p, j) + at(noise, j));
    }
    qkv_step_end(ctx);
}

/* Filling the cache with a prompt of n_prompt tokens, then stepping one token at a time to n_ctx: each step's
 * logits equal qkv_model_forward's last row on the whole sequence so far. */
Test(sample_cache, every_cached_step_gives_the_rerun_logits) {
    for (int d = 0; d < 2; d++)
        for (int v = 0; v < N_VARIANTS; v++)
            for (int n_prompt = 1; n_prompt <= 5; n_prompt += 4) {
                qkv_dtype dt = d ? QKV_F64 : QKV_F32;
                double tol = d ? 1e-12 : 1e-5;
                qkv_ctx *ctx = qkv_ctx_new(NULL);
                qkv_model_config c = config_variant(v, dt);
                qkv_model *m = qkv_model_new(ctx, &c);
                cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
                perturb(ctx, m);
                bool was = qkv_set_grad_enabled(ctx, false);
                int32_t seq[12];
                for (int i = 0; i < 12; i++) seq[i] = (int32_t)((i * 7 + v) % 13);
                for (int64_t len = n_prompt; len <= c.n_ctx; len++) {
                    bool fill = len == n_prompt;
                    qkv_tensor *ids = fill ? qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, len}, seq)
                                           : qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, 1}, &seq[len - 1]);
                    qkv_tensor *cached = qkv_model_forward_cached_(ctx, m, ids, fill ? QKV_CACHE_FILL_ : QKV_CACHE_STEP_);
                    qkv_tensor *full = qkv_model_forward(ctx, m, qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){1, len}, seq),
                                                         QKV_CAUSAL);
                    cr_assert(cached && full, "%s", qkv_errmsg(ctx));
                    cr_assert_eq(m->cache_len, len);
                    int64_t last = cached->shape[1] - 1;
                    double worst = 0;
                    for (int64_t j = 0; j < c.vocab; j++)
                        worst = fmax(worst, fabs(at(cached, last * c.vocab + j) - at(full, (len - 1) * c.vocab + j)));
                    cr_expect(worst <= tol, "%s variant %d prompt %d length %lld: logits differ by %g", qkv_dtype_name(dt),
                              v, n_prompt, (long long)len, worst);
                    qkv_step_end(ctx);
                }
                qkv_set_grad_enabled(ctx, was);
                qkv_ctx_free(ctx);
            }
}

/* Sampled tokens are the same cached and uncached: greedy and drawn (temperature 0.8, top-k 5, the same seed),
 * for prompts of 1, 4 and n_ctx tokens, with n_new taking the sequence past n_ctx (the window slides). */
Test(sample_cache, cached_and_uncached_sampling_give_the_same_tokens) {
    for (int v = 0; v < N_VARIANTS; v++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_model_config c = config_variant(v, QKV_F64);
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        perturb(ctx, m);
        const int32_t prompt[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
        const int64_t lengths[3] = {1, 4, 12};
        for (int k = 0; k < 3; k++)
            for (int drawn = 0; drawn < 2; drawn++) {
                qkv_sample_options o = {drawn ? 0.8 : 0.0, drawn ? 5 : 0};
                int32_t out[2][20];
                for (int way = 0; way < 2; way++) {
                    qkv_model_set_sample_cache(m, way == 0);
                    qkv_seed(ctx, 99);
                    cr_assert_eq(qkv_model_sample(ctx, m, prompt, lengths[k], 20, &o, out[way]), QKV_OK, "%s",
                                 qkv_errmsg(ctx));
                }
                for (int i = 0; i < 20; i++)
                    cr_expect_eq(out[0][i], out[1][i], "variant %d prompt %lld %s: token %d cached %d, uncached %d", v,
                                 (long long)lengths[k], drawn ? "drawn" : "greedy", i, out[0][i], out[1][i]);
            }
        cr_expect(qkv_model_set_sample_cache(m, true) == false, "the setting reads back");
        qkv_ctx_free(ctx);
    }
}

typedef struct counting {
    int64_t allocations;
} counting;
static void *count_malloc(size_t size, void *user) {
    ((counting *)user)->allocations++;
    return malloc(size);
}
static void count_free(void *p, void *user) {
    (void)user;
    free(p);
}

/* The cache is made at the first cached sampling and reused: a second and third call allocate nothing more,
 * and a shorter prompt after a longer one samples what a fresh model samples. */
Test(sample_cache, the_cache_is_made_once_and_reused) {
    counting cnt = {0};
    qkv_options opts = qkv_default_options();
    opts.allocator = (qkv_allocator){count_malloc, count_free, &cnt};
    qkv_ctx *ctx = qkv_ctx_new(&opts);
    qkv_model_config c = config_variant(1, QKV_F32);
    qkv_model *m = qkv_model_new(ctx, &c);
    perturb(ctx, m);
    const int32_t long_prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8}, short_prompt[2] = {9, 10};
    int32_t out[3][6], fresh[6];
    qkv_sample_options greedy = {0.0, 0};
    cr_assert_eq(qkv_model_sample(ctx, m, long_prompt, 8, 4, &greedy, out[0]), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_not_null(m->cache_k, "no cache was made");
    int64_t after_first = cnt.allocations;
    cr_assert_eq(qkv_model_sample(ctx, m, short_prompt, 2, 6, &greedy, out[1]), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_model_sample(ctx, m, long_prompt, 8, 4, &greedy, out[2]), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(cnt.allocations, after_first, "%lld allocations after the first call",
                 (long long)(cnt.allocations - after_first));
    for (int i = 0; i < 4; i++) cr_expect_eq(out[0][i], out[2][i], "token %d differs on the same prompt", i);
    qkv_model *twin = qkv_model_new(ctx, &c); // the same parameters, no cache used yet
    for (int i = 0; i < qkv_model_param_count(m); i++)
        memcpy(qkv_model_params(twin)[i]->data, qkv_model_params(m)[i]->data,
               (size_t)qkv_model_params(m)[i]->numel * sizeof(float));
    cr_assert_eq(qkv_model_sample(ctx, twin, short_prompt, 2, 6, &greedy, fresh), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 6; i++) cr_expect_eq(out[1][i], fresh[i], "token %d: reused cache %d, fresh %d", i, out[1][i], fresh[i]);
    qkv_ctx_free(ctx);
}

static qkv_tensor *softmax_weights(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)user;
    qkv_tensor *ninf = qkv_full(ctx, s->dtype, 0, NULL, -INFINITY);
    return qkv_softmax_dim(ctx, mask ? qkv_where(ctx, mask, s, ninf) : s, -1);
}

/* A user's attention weights and a mean ablation are sampled by rerunning the window (the cache is never
 * made), with the tokens of the plain model where the two are the same model. */
Test(sample_cache, configurations_the_cache_does_not_serve_rerun) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = config_variant(0, QKV_F64);
    qkv_model *plain = qkv_model_new(ctx, &c);
    c.attn_weights = softmax_weights, c.attn_weights_name = "softmax_by_hand";
    qkv_model *user = qkv_model_new(ctx, &c);
    perturb(ctx, plain);
    for (int i = 0; i < qkv_model_param_count(plain); i++)
        memcpy(qkv_model_params(user)[i]->data, qkv_model_params(plain)[i]->data,
               (size_t)qkv_model_params(plain)[i]->numel * sizeof(double));
    const int32_t prompt[3] = {1, 2, 3};
    int32_t a[10], b[10];
    qkv_sample_options greedy = {0.0, 0};
    cr_assert_eq(qkv_model_sample(ctx, plain, prompt, 3, 10, &greedy, a), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_model_sample(ctx, user, prompt, 3, 10, &greedy, b), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_null(user->cache_k, "a user's attention made a cache");
    for (int i = 0; i < 10; i++) cr_expect_eq(a[i], b[i], "token %d", i);
    // a mean ablation: the mean is over the forward's positions, which a cached step does not have
    cr_assert_eq(qkv_model_ablate_head(ctx, plain, 0, 1, QKV_ABLATE_MEAN), QKV_OK);
    cr_expect(!qkv_model_cache_serves_(plain), "a mean ablation is served by the cache");
    cr_assert_eq(qkv_model_sample(ctx, plain, prompt, 3, 10, &greedy, a), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_model_set_sample_cache(plain, false);
    cr_assert_eq(qkv_model_sample(ctx, plain, prompt, 3, 10, &greedy, b), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int i = 0; i < 10; i++) cr_expect_eq(a[i], b[i], "mean ablation: token %d", i);
    qkv_ctx_free(ctx);
}
