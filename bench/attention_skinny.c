/*
 * bench/attention_skinny.c — forward + backward time of the fused qkv_attention (attn == NULL), f32, one
 * thread, on skinny shapes where n_q and n_k differ by far, against each shape's memory floor:
 *   (B, n_q, n_k, d) = (1, 4096, 16, 64)   many queries, few keys (the backward is D = rowsum(dO O) and dQ)
 *                      (64, 1, 512, 64)    decode-like: one query against many keys per batch element
 *                      (8, 1, 2048, 64), (1, 4096, 8, 64), (4, 2048, 32, 64)
 * The memory floor is the bytes a forward + backward must move, divided by this machine's bandwidth for a
 * working set of that shape's size, measured in the same run (bench/bandwidth.h: b = c a, one thread):
 *   forward   reads Q, K, V, writes O and L (one float a query)
 *   backward  reads Q, K, V, O, dO, L, and dQ, dK, dV, and writes dQ, dK, dV (q, k and v are parameters,
 *             whose gradients add up over steps: each gradient is read and written; the floor without
 *             those reads, used until 2026-12-03, was 1.33x lower for decoding, 1.17x for many queries)
 * (the dO a caller passes to qkv_backward and its copy into out's gradient are not counted; neither is
 * anything a kernel re-reads). "x floor" is the measured time over that floor.
 *
 * Times are CPU time (CLOCK_PROCESS_CPUTIME_ID; the machine may be shared), each the median of 5 samples of
 * >= 20 ms; the shapes are measured in --rounds (5) interleaved rounds and the table shows the median round.
 * An iteration: out = qkv_attention(q, k, v), qkv_backward(out, dO), qkv_step_end (q, k, v require grad).
 * Prints figures, asserts nothing.
 *
 *   build/bench/attention_skinny                  the table
 *   build/bench/attention_skinny --tsv            "skinny B n_q n_k d seconds floor_seconds bytes bandwidth"
 *   build/bench/attention_skinny --rounds R       R interleaved rounds (1..99)
 *   build/bench/attention_skinny --shape B n_q n_k d   that shape only, one round (bench/compare_attention_skinny.py)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "bandwidth.h"
#include "bench.h"
#include "qkv_internal.h"

#include "../ops/kernels/attention_kernels.h"

typedef struct shape {
    int64_t batch, n_q, n_k, d;
} shape;

typedef struct setup {
    qkv_ctx *ctx;
    qkv_tensor *q, *k, *v, *dout;
} setup;

static setup make_setup(shape s) {
    qkv_options o = qkv_default_options();
    o.seed = 42;
    o.threads = 1;
    setup st = {qkv_ctx_new(&o), NULL, NULL, NULL, NULL};
    st.q = qkv_param(st.ctx, qkv_randn(st.ctx, QKV_F32, 3, (int64_t[]){s.batch, s.n_q, s.d}, 0, 1));
    st.k = qkv_param(st.ctx, qkv_randn(st.ctx, QKV_F32, 3, (int64_t[]){s.batch, s.n_k, s.d}, 0, 1));
    st.v = qkv_param(st.ctx, qkv_randn(st.ctx, QKV_F32, 3, (int64_t[]){s.batch, s.n_k, s.d}, 0, 1));
    st.dout = qkv_keep(st.ctx, qkv_randn(st.ctx, QKV_F32, 3, (int64_t[]){s.batch, s.n_q, s.d}, 0, 1));
    qkv_step_end(st.ctx);
    return st;
}

static void iterate(setup *st) {
    qkv_tensor *out = qkv_attention(st->ctx, st->q, st->k, st->v, NULL, QKV_SCALE_DEFAULT, 0, NULL);
    qkv_backward(st->ctx, out, st->dout);
    qkv_step_end(st->ctx);
}

/* Median CPU seconds per forward + backward, of 5 samples of >= 20 ms. */
static double time_it(shape s) {
    setup st = make_setup(s);
    iterate(&st);
    double t0 = bench_cpu_now();
    iterate(&st);
    double once = bench_cpu_now() - t0;
    long inner = once > 0 ? (long)(0.02 / once) + 1 : 1000;
    double samples[5];
    for (int i = 0; i < 5; i++) {
        double start = bench_cpu_now();
        for (long j = 0; j < inner; j++) iterate(&st);
        samples[i] = (bench_cpu_now() - start) / (double)inner;
    }
    if (qkv_error(st.ctx)) {
        fprintf(stderr, "error: %s\n", qkv_errmsg(st.ctx));
        exit(1);
    }
    qkv_ctx_free(st.ctx);
    qsort(samples, 5, sizeof samples[0], bench_cmp_double);
    return samples[2];
}

/* Bytes a forward + backward must move (the header's list), and the distinct bytes of its tensors. */
static double floor_bytes(shape s) {
    double qo = 4.0 * (double)(s.batch * s.n_q * s.d), kv = 4.0 * (double)(s.batch * s.n_k * s.d);
    double l = 4.0 * (double)(s.batch * s.n_q);
    double fwd = qo + 2 * kv + qo + l;               /* Q, K, V in; O, L out */
    double bwd = qo + 2 * kv + 2 * qo + l + 2 * (qo + 2 * kv); /* Q, K, V, O, dO, L in; dQ, dK, dV in and out */
    return fwd + bwd;
}

static double working_set(shape s) {
    double qo = 4.0 * (double)(s.batch * s.n_q * s.d), kv = 4.0 * (double)(s.batch * s.n_k * s.d);
    return 4 * qo + 4 * kv; /* Q, O, dO, dQ; K, V, dK, dV */
}

static void usage(FILE *out) {
    fprintf(out, "usage: attention_skinny [--tsv] [--rounds R] [--shape B n_q n_k d]\n"
                 "Fused attention forward + backward on skinny shapes against their memory floor, f32, one "
                 "thread, CPU time.\n\n"
                 "  --tsv                  one tab-separated line per shape\n"
                 "  --rounds R             interleaved rounds, 1..99 (default 5)\n"
                 "  --shape B n_q n_k d    that shape only, one round: B 1..1024, n_q and n_k 1..65536, d 1..1024\n"
                 "  --help                 this text\n");
}

int main(int argc, char **argv) {
    bool tsv = false;
    int rounds = 5;
    shape only = {0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--tsv")) {
            tsv = true;
        } else if (!strcmp(f, "--rounds")) {
            static const char *const part[] = {"R"};
            static const int64_t least[] = {1}, most[] = {99};
            int64_t v[1];
            if (!args_ints_flag("attention_skinny", argc, argv, &i, 1, part, least, most, v)) return ARGS_USAGE_ERROR;
            rounds = (int)v[0];
        } else if (!strcmp(f, "--shape")) {
            static const char *const part[] = {"B", "n_q", "n_k", "d"};
            static const int64_t least[] = {1, 1, 1, 1}, most[] = {1024, 65536, 65536, 1024};
            int64_t v[4];
            if (!args_ints_flag("attention_skinny", argc, argv, &i, 4, part, least, most, v)) return ARGS_USAGE_ERROR;
            only = (shape){v[0], v[1], v[2], v[3]};
            rounds = 1;
            tsv = true;
        } else {
            return args_unknown("attention_skinny", f);
        }
    }
    static const shape table[] = {{1, 4096, 16, 64}, {64, 1, 512, 64}, {8, 1, 2048, 64}, {1, 4096, 8, 64},
                                  {4, 2048, 32, 64}};
    const shape *shapes = only.batch ? &only : table;
    int n_shapes = only.batch ? 1 : (int)(sizeof table / sizeof table[0]);
    double times[8][99];
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n_shapes; i++) times[i][r] = time_it(shapes[i]);
    if (!tsv)
        printf("qkv fused attention forward+backward, f32, one thread, kernels %s; CPU time, median of %d "
               "interleaved rounds (each a median of 5 samples)\n%-22s %10s %10s %10s %10s %9s\n",
               qkv_attn_kernels_()->name, rounds, "(B, n_q, n_k, d)", "ms", "floor MiB", "GB/s", "floor ms",
               "x floor");
    for (int i = 0; i < n_shapes; i++) {
        shape s = shapes[i];
        qsort(times[i], (size_t)rounds, sizeof times[i][0], bench_cmp_double);
        double t = times[i][rounds / 2], bytes = floor_bytes(s), bw = bench_bandwidth((size_t)working_set(s));
        double fl = bw > 0 ? bytes / bw : 0;
        if (tsv) {
            printf("skinny\t%lld\t%lld\t%lld\t%lld\t%.9g\t%.9g\t%.9g\t%.6g\n", (long long)s.batch, (long long)s.n_q,
                   (long long)s.n_k, (long long)s.d, t, fl, bytes, bw);
        } else {
            char name[64];
            snprintf(name, sizeof name, "(%lld, %lld, %lld, %lld)", (long long)s.batch, (long long)s.n_q,
                     (long long)s.n_k, (long long)s.d);
            printf("%-22s %10.4f %10.2f %10.2f %10.4f %8.2fx\n", name, t * 1e3, bytes / 1048576.0, bw * 1e-9,
                   fl * 1e3, t / fl);
        }
    }
    return 0;
}
