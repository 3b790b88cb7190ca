/*
 * bench/softmax.c — f32 softmax throughput (GB/s counts the row read and the row written) of the row
 * kernels of every instruction set this CPU has (ops/kernels/attention_*.c: SLEEF's vector exp, masked
 * tails, exp flushed to 0 below FLT_MIN) and of qkv_softmax itself, against a plain reference in the same
 * run (max, libm expf, sum, divide: no flush, so saturated rows make subnormals), on ordinary rows
 * (scores ~ N(0, 3^2)) and saturated ones (~ N(0, 100^2): most exp arguments below -87, where an unflushed
 * exp gives subnormal numbers). Median of 7 samples. Prints figures, asserts nothing.
 *
 *   build/bench/softmax          (no flags; --help prints the usage, any other flag is an error, exit 2)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "bench.h"
#include "qkv_internal.h"

#include "../ops/kernels/attention_kernels.h"

#define SAMPLES 7

/* The reference: one row, plain C, no flush. */
static void reference_row(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len) {
    (void)mrow;
    float m = -INFINITY;
    for (int64_t j = 0; j < len; j++) m = s[j] > m ? s[j] : m;
    float total = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        a[j] = j < len ? expf(s[j] - m) : 0.0f;
        total += a[j];
    }
    for (int64_t j = 0; j < n; j++) a[j] /= total;
}

typedef void (*row_fn)(const float *, float *, int64_t, const uint8_t *, int64_t);

/* Median seconds to softmax `rows` rows of n. */
static double time_rows(row_fn fn, const float *s, float *a, int64_t rows, int64_t n) {
    double samples[SAMPLES];
    for (int k = 0; k < SAMPLES + 1; k++) { /* the first pass warms up */
        double t0 = bench_now();
        for (int64_t r = 0; r < rows; r++) fn(s + r * n, a + r * n, n, NULL, n);
        if (k) samples[k - 1] = bench_now() - t0;
    }
    qsort(samples, SAMPLES, sizeof samples[0], bench_cmp_double);
    return samples[SAMPLES / 2];
}

static double time_op(qkv_ctx *ctx, qkv_tensor *scores) {
    double samples[SAMPLES];
    qkv_mark_ mark = qkv_mark_now_(ctx);
    for (int k = 0; k < SAMPLES + 1; k++) {
        double t0 = bench_now();
        qkv_softmax(ctx, scores, NULL, 0);
        double t = bench_now() - t0;
        qkv_rewind_to_(ctx, mark); /* release the output: every sample reuses the same arena bytes */
        if (k) samples[k - 1] = t;
    }
    qsort(samples, SAMPLES, sizeof samples[0], bench_cmp_double);
    return samples[SAMPLES / 2];
}

int main(int argc, char **argv) {
    int status = args_none("softmax", argc, argv,
                           "f32 softmax throughput of each row kernel and of qkv_softmax against a plain\n"
                           "reference, on ordinary and saturated rows. It takes no flags but --help.\n");
    if (status >= 0) return status;
    const int64_t lens[] = {128, 512, 2048};
    const int64_t total = 1 << 19; /* elements per pass: 2 MiB in, 2 MiB out */
    float *s = aligned_alloc(64, total * sizeof(float)), *a = aligned_alloc(64, total * sizeof(float));
    if (!s || !a) return 1;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    printf("f32 softmax, one thread, GB/s (row read + row written), median of %d; speedup against the plain\n"
           "reference (libm expf, no flush) in the same run\n\n",
           SAMPLES);
    printf("%-10s %-9s %-22s %9s %9s %14s\n", "n", "input", "kernel", "GB/s", "speedup", "sat/ordinary");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li], rows = total / n;
        double ordinary_time[QKV_ISA_COUNT_ + 2] = {0};
        for (int sat = 0; sat < 2; sat++) {
            qkv_seed(ctx, 7);
            qkv_tensor *x = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){rows, n}, 0, sat ? 100.0 : 3.0);
            memcpy(s, x->data, (size_t)total * sizeof(float));
            double bytes = 2.0 * (double)total * sizeof(float);
            double ref = time_rows(reference_row, s, a, rows, n);
            int slot = 0;
            const char *label = sat ? "saturated" : "ordinary";
            if (!sat) ordinary_time[slot] = ref;
            printf("%-10lld %-9s %-22s %9.2f %8.2fx %13.2fx\n", (long long)n, label, "reference",
                   bytes / ref * 1e-9, 1.0, sat ? ref / ordinary_time[slot] : 1.0);
            for (int isa = 0; isa < QKV_ISA_COUNT_; isa++) {
                slot++;
                if (!qkv_attn_force_isa_(isa)) continue;
                const qkv_attn_kernel_set_ *ks = qkv_attn_kernels_();
                double t = time_rows(ks->softmax_row, s, a, rows, n);
                if (!sat) ordinary_time[slot] = t;
                char name[40];
                snprintf(name, sizeof name, "%s%s", ks->name, isa ? " (SLEEF)" : " (expf)");
                printf("%-10lld %-9s %-22s %9.2f %8.2fx %13.2fx\n", (long long)n, label, name, bytes / t * 1e-9,
                       ref / t, sat ? t / ordinary_time[slot] : 1.0);
            }
            qkv_attn_force_isa_(-1);
            double op = time_op(ctx, x);
            slot++;
            if (!sat) ordinary_time[slot] = op;
            printf("%-10lld %-9s %-22s %9.2f %8.2fx %13.2fx\n", (long long)n, label, "qkv_softmax",
                   bytes / op * 1e-9, ref / op, sat ? op / ordinary_time[slot] : 1.0);
            qkv_step_end(ctx);
        }
    }
    printf("\n(sat/ordinary: time on saturated rows over time on ordinary rows, same kernel; 1.00x = no "
           "slowdown)\n");
    qkv_ctx_free(ctx);
    free(s);
    free(a);
    return 0;
}
