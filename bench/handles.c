/*
 * handles.c — what validating a tensor pointer costs: qkv_check_tensor_ (by address first: a range test
 * on the current header ring, then the live set of persistent tensors) against the check it replaced
 * (read t->magic_ and t->epoch_, which read released memory for stale or freed tensors), in the same run;
 * and a tiny forward + backward step, whose time is dominated by everything else an operator does.
 *
 *   build/bench/handles [rounds] [steps]   (rounds of 2,000,000 checks each; default 7; prints medians;
 *                                           "steps": only the step figure, e.g. under perf stat)
 *
 * Figures only, no assertions. The step figure can be compared with the same program built from an
 * earlier tree (it uses the public API only).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "qkv_internal.h"

/* The check before header rings: two loads from the pointer, whatever it points to. */
static __attribute__((noinline)) bool legacy_check(qkv_ctx *ctx, const char *fn, const char *name,
                                                   const qkv_tensor *t) {
    if (!t) return qkv_fail_(ctx, QKV_ERR_NULL, "%s: %s is NULL", fn, name), false;
    if (t->magic_ != QKV_TENSOR_MAGIC) return qkv_fail_(ctx, QKV_ERR_ARG, "%s: %s is not a qkv tensor", fn, name), false;
    if (t->epoch_ != 0 && t->epoch_ != ctx->epoch) return qkv_fail_(ctx, QKV_ERR_STALE, "%s: %s stale", fn, name), false;
    return true;
}

enum { CHECKS = 2000000, TENSORS = 64 };

/* ns per check over TENSORS tensors in turn (as operators check their inputs). */
static double time_checks(qkv_ctx *ctx, qkv_tensor *const *ts, bool legacy) {
    volatile int ok = 0;
    double t0 = bench_now();
    for (int i = 0; i < CHECKS; i++) {
        const qkv_tensor *t = ts[i % TENSORS];
        ok += legacy ? legacy_check(ctx, "bench", "t", t) : qkv_check_tensor_(ctx, "bench", "t", t);
    }
    double dt = bench_now() - t0;
    if (ok != CHECKS) fprintf(stderr, "check failed: %s\n", qkv_errmsg(ctx));
    return dt / CHECKS * 1e9;
}

/* One tiny step: y = x W + b, loss = mean(y * y), backward, step end. Microseconds per step. */
static double time_steps(qkv_ctx *ctx, qkv_tensor *w, qkv_tensor *b, int steps) {
    double t0 = bench_now();
    for (int s = 0; s < steps; s++) {
        qkv_tensor *x = qkv_full(ctx, QKV_F32, 2, (int64_t[]){4, 8}, 0.25);
        qkv_tensor *y = qkv_projection(ctx, x, w, b);
        qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, y, y));
        if (qkv_backward(ctx, loss, NULL) != QKV_OK) fprintf(stderr, "step: %s\n", qkv_errmsg(ctx));
        qkv_zero_grads(ctx);
        qkv_step_end(ctx);
    }
    return (bench_now() - t0) / steps * 1e6;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 101) rounds = 7;
    bool checks = !(argc > 2 && strcmp(argv[2], "steps") == 0);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *params[TENSORS], *steps[TENSORS];
    for (int i = 0; i < TENSORS; i++) params[i] = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){4}));
    qkv_step_end(ctx);
    for (int i = 0; i < TENSORS; i++) steps[i] = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){4});
    double s_new[101], s_old[101], p_new[101], p_old[101], step[101];
    for (int r = 0; r < rounds && checks; r++) {
        s_old[r] = time_checks(ctx, steps, true);
        s_new[r] = time_checks(ctx, steps, false);
        p_old[r] = time_checks(ctx, params, true);
        p_new[r] = time_checks(ctx, params, false);
    }
    if (checks) {
        double so = median(s_old, rounds), sn = median(s_new, rounds), po = median(p_old, rounds),
               pn = median(p_new, rounds);
        printf("tensor check, ns per call (median of %d rounds of %d calls over %d tensors)\n", rounds, CHECKS,
               TENSORS);
        printf("  %-22s %8s %8s %7s\n", "tensor", "before", "now", "ratio");
        printf("  %-22s %8.2f %8.2f %7.2f\n", "step tensor", so, sn, sn / so);
        printf("  %-22s %8.2f %8.2f %7.2f\n", "persistent tensor", po, pn, pn / po);
    }
    qkv_ctx_free(ctx);

    ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_param(ctx, qkv_full(ctx, QKV_F32, 2, (int64_t[]){8, 8}, 0.1));
    qkv_tensor *b = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){8}));
    qkv_step_end(ctx);
    time_steps(ctx, w, b, 100); /* warm: rings and arena at their steady size */
    for (int r = 0; r < rounds; r++) step[r] = time_steps(ctx, w, b, 20000);
    printf("tiny step (x[4,8] W[8,8] + b, mean(y*y), backward, step end): %.3f us (median of %d rounds)\n",
           median(step, rounds), rounds);
    qkv_ctx_free(ctx);
    return 0;
}
