/*
 * bench/model — training steps per second of the model layer (include/qkv/model.h): a causal decoder built
 * with qkv_model_new, trained with AdamW on random token batches. It prints figures and asserts nothing.
 * bench/compare_model.py runs the same model in PyTorch in the same run and prints the ratio;
 * bench/model_breakdown.py samples one of these runs with perf and prints each operator's share of a step.
 *
 *   build/bench/model [--preset a|b|c|llama] [--vocab V] [--n N] [--d-model D] [--layers L] [--heads H] [--d-mlp M]
 *                     [--batch B] [--runs R] [--steps S] [--warmup W] [--threads T] [--keep-grads] [--json]
 *                     [--softcap C]   (config.attn_softcap: the attention's scores soft-capped at C)
 *   a: 2 layers, attention-only, d_model 64, 4 heads, n 64, batch 32, V 64
 *   b: 4 layers, d_model 256, 4 heads, d_mlp 1024, n 128, batch 8, V 256
 *   c: GPT-2-small-shaped: 12 layers, d_model 768, 12 heads, d_mlp 3072, n 64, batch 4, V 8192
 *   (a, b and c: layer norm, learned positions, GELU)
 *   llama: Llama-shaped: 4 layers, d_model 256, 8 query heads and 2 key/value heads (grouped-query), SwiGLU
 *      MLP of width 768 (Llama's 2/3 of 4 d_model, rounded up to a multiple of 256), RMS norm, RoPE, n 128,
 *      batch 8, V 256
 *   (all: f32, AdamW lr 1e-3, weight decay 0.01, the model's GPT-2 initialisation; flags after --preset
 *   change its fields)
 *
 * A timed step is what a training loop does: ids and next-token targets, forward, loss, backward, AdamW
 * step, zero grad, step end. After W warm-up steps (the arena and the gradients reach their size), R rounds
 * of S steps are timed; the figure is the median round's steps/s. Memory: the step arena's capacity after a
 * step (activations, tape, gradients of intermediates), the parameters, their gradients and AdamW's two
 * moments, and the process's peak resident set (getrusage ru_maxrss) before the model and at the end.
 * Bits: the last step's loss (as the bits of its float) and a hash (FNV-1a, 64 bits) of every parameter's bytes
 * after the last step, so two runs (--threads 1 and 2) can be checked to train to the same bits.
 * The context runs with qkv_options.release_grads, as a training loop should (each intermediate's gradient
 * goes back to the step arena once its node's backward has run, as in PyTorch); --keep-grads turns it off
 * (every gradient lives until qkv_step_end) to measure what it saves.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "args.h"
#include "bench.h"
#include "qkv.h"

#define PROG "model"

static void usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " [--preset a|b|c|llama] [--vocab V] [--n N] [--d-model D] [--layers L] [--heads H] [--d-mlp M]\n"
            "             [--batch B] [--runs R] [--steps S] [--warmup W] [--threads T] [--keep-grads] [--json]\n"
            "Training steps per second of a qkv_model (forward, loss, backward, AdamW, zero grad, step end),\n"
            "the median of R timed rounds of S steps, and the memory a step uses.\n\n"
            "  --preset P       a: 2 layers attention-only, d_model 64, 4 heads, n 64, batch 32, V 64      (a)\n"
            "                   b: 4 layers, d_model 256, 4 heads, d_mlp 1024, n 128, batch 8, V 256\n"
            "                   c: GPT-2-small-shaped: 12 layers, d_model 768, 12 heads, d_mlp 3072, n 64,\n"
            "                      batch 4, V 8192\n"
            "                      (a, b, c: layer norm, learned positions, GELU)\n"
            "                   llama: Llama-shaped: 4 layers, d_model 256, 8 query and 2 key/value heads,\n"
            "                      SwiGLU d_mlp 768, RMS norm, RoPE, n 128, batch 8, V 256\n"
            "  --vocab V        vocabulary, 2..1000000\n"
            "  --n N            sequence length (= n_ctx), 2..65536\n"
            "  --d-model D      residual width, 1..65536 (a multiple of the heads)\n"
            "  --layers L       blocks, 1..1000\n"
            "  --heads H        heads per block, 1..1024\n"
            "  --d-mlp M        MLP width, 0 (attention-only)..1000000\n"
            "  --batch B        sequences per step, 1..100000\n"
            "  --runs R         timed rounds, 1..100                                   (5)\n"
            "  --steps S        steps per round, 1..1000000 (40 for a, 4 for b and llama, 1 for c; else 10)\n"
            "  --warmup W       untimed steps first, 1..1000                          (3)\n"
            "  --threads T      kernel threads, 1..256                                (1)\n"
            "  --keep-grads     keep every intermediate's gradient until the step ends (release_grads off)\n"
            "  --softcap C      soft-cap the attention scores at C > 0 (config.attn_softcap; after --preset)\n"
            "  --json           one line of JSON instead of the table\n"
            "  --help           this text\n");
}

static long max_rss_kib(void) {
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) ? -1 : u.ru_maxrss;
}

/* A small deterministic generator for the token ids (splitmix64): the data are uniform random tokens. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One training step; false with the context's error on failure. *loss_value gets the step's loss. */
static bool train_step(qkv_ctx *ctx, qkv_model *m, qkv_optimizer *opt, int64_t batch, int64_t n, uint64_t *rng,
                       float *loss_value) {
    int64_t vocab = qkv_model_get_config(m)->vocab;
    qkv_tensor *ids = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){batch, n});
    if (ids)
        for (int64_t i = 0; i < batch * n; i++) qkv_i32(ids)[i] = (int32_t)(next_u64(rng) % (uint64_t)vocab);
    qkv_tensor *targets = qkv_next_token_targets(ctx, ids);
    qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), targets);
    if (loss) *loss_value = qkv_f32(loss)[0];
    if (qkv_backward(ctx, loss, NULL) == QKV_OK) qkv_optim_step(opt);
    qkv_optim_zero_grad(opt);
    bool ok = !qkv_error(ctx);
    if (ok) qkv_step_end(ctx);
    return ok;
}

/* FNV-1a over every parameter's bytes: equal hashes after equal steps mean (but for a 2^-64 chance) equal bits. */
static uint64_t params_hash(const qkv_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    qkv_tensor *const *params = qkv_model_params(m);
    for (int64_t p = 0; p < qkv_model_param_count(m); p++) {
        const unsigned char *bytes = params[p]->data;
        size_t size = (size_t)params[p]->numel * qkv_dtype_size(params[p]->dtype);
        for (size_t i = 0; i < size; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
    }
    return h;
}

int main(int argc, char **argv) {
    static const char *const presets[] = {"a", "b", "c", "llama"};
    qkv_model_config c = qkv_model_default_config();
    int64_t batch = 32, runs = 5, steps = 0, warmup = 3, threads = 1;
    const char *preset = "a";
    bool json = false, keep_grads = false;
    /* preset a, the default */
    c.n_layer = 2, c.d_model = 64, c.n_head = 4, c.d_mlp = 0, c.n_ctx = 64, c.vocab = 64;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        bool ok = true;
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--preset")) {
            const char *s = args_value(PROG, argc, argv, &i);
            int k = s ? args_choice(PROG, f, s, presets, 4) : -1;
            ok = k >= 0;
            if (k >= 0) c = qkv_model_default_config(); /* every field the preset does not set: the default */
            if (k == 0) {
                c.n_layer = 2, c.d_model = 64, c.n_head = 4, c.d_mlp = 0, c.n_ctx = 64, c.vocab = 64, batch = 32;
                preset = "a";
            } else if (k == 1) {
                c.n_layer = 4, c.d_model = 256, c.n_head = 4, c.d_mlp = 1024, c.n_ctx = 128, c.vocab = 256, batch = 8;
                preset = "b";
            } else if (k == 2) {
                c.n_layer = 12, c.d_model = 768, c.n_head = 12, c.d_mlp = 3072, c.n_ctx = 64, c.vocab = 8192, batch = 4;
                preset = "c";
            } else if (k == 3) {
                c.n_layer = 4, c.d_model = 256, c.n_head = 8, c.n_kv_head = 2, c.d_mlp = 768, c.n_ctx = 128, c.vocab = 256;
                c.norm = QKV_NORM_RMS, c.positions = QKV_POS_ROPE, c.activation = QKV_ACT_SWIGLU, batch = 8;
                preset = "llama";
            }
        } else if (!strcmp(f, "--vocab")) ok = args_int_flag(PROG, argc, argv, &i, 2, 1000000, &c.vocab), preset = "custom";
        else if (!strcmp(f, "--n")) ok = args_int_flag(PROG, argc, argv, &i, 2, 65536, &c.n_ctx), preset = "custom";
        else if (!strcmp(f, "--d-model")) ok = args_int_flag(PROG, argc, argv, &i, 1, 65536, &c.d_model), preset = "custom";
        else if (!strcmp(f, "--layers")) ok = args_int_flag(PROG, argc, argv, &i, 1, 1000, &c.n_layer), preset = "custom";
        else if (!strcmp(f, "--heads")) ok = args_int_flag(PROG, argc, argv, &i, 1, 1024, &c.n_head), preset = "custom";
        else if (!strcmp(f, "--d-mlp")) ok = args_int_flag(PROG, argc, argv, &i, 0, 1000000, &c.d_mlp), preset = "custom";
        else if (!strcmp(f, "--batch")) ok = args_int_flag(PROG, argc, argv, &i, 1, 100000, &batch), preset = "custom";
        else if (!strcmp(f, "--runs")) ok = args_int_flag(PROG, argc, argv, &i, 1, 100, &runs);
        else if (!strcmp(f, "--steps")) ok = args_int_flag(PROG, argc, argv, &i, 1, 1000000, &steps);
        else if (!strcmp(f, "--warmup")) ok = args_int_flag(PROG, argc, argv, &i, 1, 1000, &warmup);
        else if (!strcmp(f, "--threads")) ok = args_int_flag(PROG, argc, argv, &i, 1, 256, &threads);
        else if (!strcmp(f, "--json")) json = true;
        else if (!strcmp(f, "--keep-grads")) keep_grads = true;
        else if (!strcmp(f, "--softcap")) {
            char *end = NULL;
            c.attn_softcap = i + 1 < argc ? strtod(argv[i + 1], &end) : 0.0;
            ok = i + 1 < argc && end && !*end && c.attn_softcap > 0 && isfinite(c.attn_softcap);
            if (!ok) fprintf(stderr, PROG ": --softcap takes a finite number > 0\n");
            i++;
        }
        else return args_unknown(PROG, f);
        if (!ok) return ARGS_USAGE_ERROR;
    }
    if (!steps) steps = !strcmp(preset, "a") ? 40 : !strcmp(preset, "c") ? 1 : !strcmp(preset, "b") || !strcmp(preset, "llama") ? 4 : 10;
    int64_t n = c.n_ctx;
    long rss_before = max_rss_kib();

    qkv_options o = qkv_default_options();
    o.threads = (int)threads;
    o.release_grads = !keep_grads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return fprintf(stderr, PROG ": cannot make a context\n"), 1;
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW); /* lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01 */
    oo.param_names = qkv_model_param_names(m);
    qkv_optimizer *opt = m ? qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m)) : NULL;
    if (!opt) {
        fprintf(stderr, PROG ": %s\n", qkv_errmsg(ctx));
        qkv_ctx_free(ctx);
        return 1;
    }
    uint64_t rng = 1234;
    float last_loss = 0.0f;
    for (int64_t w = 0; w < warmup; w++)
        if (!train_step(ctx, m, opt, batch, n, &rng, &last_loss)) goto failed;
    double rates[100];
    for (int64_t r = 0; r < runs; r++) {
        double t0 = bench_now();
        for (int64_t s = 0; s < steps; s++)
            if (!train_step(ctx, m, opt, batch, n, &rng, &last_loss)) goto failed;
        rates[r] = (double)steps / (bench_now() - t0);
    }
    qsort(rates, (size_t)runs, sizeof rates[0], bench_cmp_double);
    double median = runs % 2 ? rates[runs / 2] : 0.5 * (rates[runs / 2 - 1] + rates[runs / 2]);
    size_t arena = qkv_arena_capacity(ctx);
    int64_t elems = qkv_model_param_elements(m);
    double param_bytes = (double)elems * (double)qkv_dtype_size(c.dtype);
    /* gradients (one per parameter) and AdamW's exp_avg and exp_avg_sq: three more copies of the parameters */
    double grad_bytes = param_bytes, optim_bytes = 2.0 * param_bytes;
    long rss_after = max_rss_kib();
    uint32_t loss_bits;
    memcpy(&loss_bits, &last_loss, sizeof loss_bits);
    uint64_t hash = params_hash(m);
    const double MiB = 1024.0 * 1024.0;
    if (json)
        printf("{\"preset\":\"%s\",\"layers\":%ld,\"d_model\":%ld,\"heads\":%ld,\"kv_heads\":%ld,\"d_mlp\":%ld,\"n\":%ld,\"batch\":%ld,"
               "\"vocab\":%ld,\"threads\":%d,\"runs\":%d,\"steps\":%ld,\"median_steps_per_s\":%.3f,\"min\":%.3f,"
               "\"max\":%.3f,\"params\":%ld,\"param_bytes\":%.0f,\"grad_bytes\":%.0f,\"optim_bytes\":%.0f,"
               "\"arena_bytes\":%zu,\"release_grads\":%s,\"maxrss_before_kib\":%ld,\"maxrss_after_kib\":%ld,"
               "\"final_loss\":%.9g,\"final_loss_bits\":\"%08" PRIx32 "\",\"params_hash\":\"%016" PRIx64 "\"}\n",
               preset, (long)c.n_layer, (long)c.d_model, (long)c.n_head, (long)(c.n_kv_head ? c.n_kv_head : c.n_head),
               (long)c.d_mlp, (long)n, (long)batch, (long)c.vocab, (int)threads, (int)runs, (long)steps, median, rates[0], rates[runs - 1], (long)elems,
               param_bytes, grad_bytes, optim_bytes, arena, keep_grads ? "false" : "true", rss_before, rss_after,
               (double)last_loss, loss_bits, hash);
    else {
        printf("model %s: %ld layers, d_model %ld, %ld heads (%ld key/value), d_mlp %ld (%s), %s norm, %s positions, "
               "n %ld, batch %ld, V %ld, f32, AdamW, %d thread%s\n",
               preset, (long)c.n_layer, (long)c.d_model, (long)c.n_head, (long)(c.n_kv_head ? c.n_kv_head : c.n_head),
               (long)c.d_mlp, qkv_activation_kind_name(c.activation), qkv_norm_kind_name(c.norm),
               qkv_positions_kind_name(c.positions), (long)n, (long)batch, (long)c.vocab, (int)threads,
               threads > 1 ? "s" : "");
        printf("  %.2f steps/s (median of %d rounds of %ld steps; min %.2f, max %.2f), %.0f tokens/s\n", median,
               (int)runs, (long)steps, rates[0], rates[runs - 1], median * (double)(batch * n));
        printf("  parameters %ld (%.2f MiB), gradients %.2f MiB, AdamW state %.2f MiB\n", (long)elems,
               param_bytes / MiB, grad_bytes / MiB, optim_bytes / MiB);
        printf("  step arena %.2f MiB (capacity after a step; intermediates' gradients %s)\n", (double)arena / MiB,
               keep_grads ? "kept to the step's end" : "released in the backward");
        printf("  peak RSS %.1f MiB (%.1f MiB before the model)\n", (double)rss_after / 1024.0,
               (double)rss_before / 1024.0);
        printf("  last loss %.9g (bits %08" PRIx32 "), parameters' hash %016" PRIx64 " after %ld steps\n",
               (double)last_loss, loss_bits, hash, (long)(warmup + runs * steps));
    }
    qkv_ctx_free(ctx);
    return 0;
failed:
    fprintf(stderr, PROG ": %s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return 1;
}
