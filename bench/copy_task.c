/*
 * bench/copy_task — training steps per second of the copy task (examples/copy_model.c) for a named
 * configuration: median of several runs, each timing a fixed number of steps after a short warm-up.
 * It prints figures and asserts nothing. bench/compare_copy_task.py runs the same configurations in
 * PyTorch in the same run and prints the ratio.
 *
 *   build/bench/copy_task [--config d16|d256] [--runs R] [--steps S] [--threads T] [--json]
 *   d16:  onehot embeddings, V 8, n 8 (d_model 16), d_k 16, batch 32, Adam   (the default example)
 *   d256: gauss embeddings, d_model 256, otherwise the same (copy_task --embed gauss --d-model 256)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "copy_model.h"

int main(int argc, char **argv) {
    const char *config = "d16";
    int runs = 7, threads = 1;
    long steps = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = true;
        else {
            fprintf(stderr, "usage: copy_task [--config d16|d256] [--runs R] [--steps S] [--threads T] [--json]\n");
            return 2;
        }
    }
    copy_config c = copy_default_config();
    if (!strcmp(config, "d16")) {
        if (!steps) steps = 4000;
    } else if (!strcmp(config, "d256")) {
        c.embed = EMBED_GAUSS;
        c.d_model = 256;
        if (!steps) steps = 1000;
    } else {
        fprintf(stderr, "copy_task: unknown config '%s' (d16 or d256)\n", config);
        return 2;
    }
    if (runs < 1 || runs > 100 || steps < 1 || threads < 1) {
        fprintf(stderr, "copy_task: runs 1..100, steps >= 1, threads >= 1\n");
        return 2;
    }
    c.threads = threads;
    c.steps = steps + 20;
    double rates[100];
    for (int r = 0; r < runs; r++) {
        copy_model m;
        char err[512];
        if (!copy_model_init(&m, &c, err, sizeof err)) {
            fprintf(stderr, "copy_task: %s\n", err);
            return 1;
        }
        for (int w = 0; w < 20; w++) copy_train_step(&m, NULL); /* warm-up: arena and gradients sized */
        double t0 = bench_now();
        for (long s = 0; s < steps; s++)
            if (!copy_train_step(&m, NULL)) {
                fprintf(stderr, "copy_task: %s\n", qkv_errmsg(m.ctx));
                return 1;
            }
        rates[r] = (double)steps / (bench_now() - t0);
        copy_model_free(&m);
    }
    qsort(rates, (size_t)runs, sizeof rates[0], bench_cmp_double);
    double median = runs % 2 ? rates[runs / 2] : 0.5 * (rates[runs / 2 - 1] + rates[runs / 2]);
    if (json)
        printf("{\"config\":\"%s\",\"threads\":%d,\"runs\":%d,\"steps\":%ld,\"median_steps_per_s\":%.1f,"
               "\"min\":%.1f,\"max\":%.1f}\n",
               config, threads, runs, steps, median, rates[0], rates[runs - 1]);
    else
        printf("copy_task %s: %.0f steps/s (median of %d runs of %ld steps; min %.0f, max %.0f; %d thread%s)\n",
               config, median, runs, steps, rates[0], rates[runs - 1], threads, threads > 1 ? "s" : "");
    return 0;
}
