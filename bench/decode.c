/*
 * bench/decode.c — decoding speed: tokens/s of qkv_model_sample (greedy) with the key/value cache and with it
 * off (the window rerun every token), one thread, f32, on a 4-layer model of d_model 256 (4 heads, d_mlp 1024,
 * vocab 256, n_ctx 1024, learned positions, layer norm, GELU; random initial weights: speed does not depend on
 * training). A timed run: one qkv_model_sample call extending a random prompt of --prompt tokens by --new
 * tokens; the figure is --new / its time, so the prompt's own forward (the cache's fill) is counted in it, as
 * in bench/compare_decode.py's PyTorch side. Median of --runs runs after one warm-up run. Prints figures,
 * asserts nothing.
 *
 *   build/bench/decode [--prompt 16] [--new 64] [--runs 5] [--uncached] [--tsv]
 *     --tsv   one line: prompt, new, median tokens/s, fastest, slowest (for bench/compare_decode.py)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "bench.h"
#include "qkv.h"

enum { MAX_RUNS = 50 };

static void usage(FILE *out) {
    fprintf(out, "usage: decode [--prompt N] [--new N] [--runs N] [--uncached] [--tsv]\n"
                 "  greedy decoding tokens/s of a 4-layer d_model 256 model (f32, one thread)\n"
                 "  --prompt N   prompt length (default 16; prompt + new <= 1024)\n"
                 "  --new N      tokens generated per run (default 64)\n"
                 "  --runs N     timed runs, median reported (default 5)\n"
                 "  --uncached   rerun the window every token (qkv_model_set_sample_cache off)\n"
                 "  --tsv        one tab-separated line: prompt, new, median, fastest, slowest tokens/s\n");
}

int main(int argc, char **argv) {
    int64_t prompt_len = 16, n_new = 64, runs = 5;
    bool uncached = false, tsv = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) return usage(stdout), 0;
        else if (!strcmp(f, "--prompt")) { if (!args_int_flag("decode", argc, argv, &i, 1, 1023, &prompt_len)) return 2; }
        else if (!strcmp(f, "--new")) { if (!args_int_flag("decode", argc, argv, &i, 1, 1023, &n_new)) return 2; }
        else if (!strcmp(f, "--runs")) { if (!args_int_flag("decode", argc, argv, &i, 1, MAX_RUNS, &runs)) return 2; }
        else if (!strcmp(f, "--uncached")) uncached = true;
        else if (!strcmp(f, "--tsv")) tsv = true;
        else return args_unknown("decode", f);
    }
    if (prompt_len + n_new > 1024) {
        fprintf(stderr, "decode: --prompt %lld + --new %lld is more than n_ctx 1024\n", (long long)prompt_len,
                (long long)n_new);
        return 2;
    }
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 256, c.n_ctx = 1024, c.d_model = 256, c.n_layer = 4, c.n_head = 4, c.d_mlp = 1024;
    qkv_model *m = qkv_model_new(ctx, &c);
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt), *out = malloc((size_t)n_new * sizeof *out);
    if (!m || !prompt || !out) {
        fprintf(stderr, "decode: %s\n", m ? "out of memory" : qkv_errmsg(ctx));
        return 1;
    }
    uint64_t z = 1;
    for (int64_t i = 0; i < prompt_len; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((z >> 33) % 256);
    }
    qkv_model_set_sample_cache(m, !uncached);
    qkv_sample_options greedy = {0.0, 0};
    double rate[MAX_RUNS];
    for (int64_t r = -1; r < runs; r++) { // run -1 warms up (the cache and the arena reach their size)
        double t0 = bench_now();
        if (qkv_model_sample(ctx, m, prompt, prompt_len, n_new, &greedy, out) != QKV_OK) {
            fprintf(stderr, "decode: %s\n", qkv_errmsg(ctx));
            return 1;
        }
        if (r >= 0) rate[r] = (double)n_new / (bench_now() - t0);
    }
    qsort(rate, (size_t)runs, sizeof rate[0], bench_cmp_double);
    double median = rate[runs / 2];
    if (tsv)
        printf("%lld\t%lld\t%.6g\t%.6g\t%.6g\n", (long long)prompt_len, (long long)n_new, median, rate[runs - 1], rate[0]);
    else
        printf("decode, %s: prompt %lld, %lld new tokens: %.1f tokens/s (median of %lld runs; %.1f to %.1f)\n",
               uncached ? "uncached" : "cached", (long long)prompt_len, (long long)n_new, median, (long long)runs,
               rate[0], rate[runs - 1]);
    free(prompt), free(out);
    qkv_ctx_free(ctx);
    return 0;
}
