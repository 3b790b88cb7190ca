/*
 * bandwidth.h — the memory bandwidth probe of the benchmarks (bench/bandwidth.c prints it; bench/attention_skinny.c
 * divides a shape's compulsory bytes by it to get the memory floor). One thread streams
 *   b[i] = a[i] * c                     (read a, write b: the mix of a forward + backward pass)
 * over two f32 buffers whose sum is the working set asked for, repeated until a sample lasts >= 10 ms of
 * CPU time, and counts 8 bytes per element (4 read, 4 written). The figure is the median of 5 samples, in
 * bytes per second of CPU time (CLOCK_PROCESS_CPUTIME_ID: on a shared machine the process is charged only for
 * its own cycles). A working set that fits the caches gives their bandwidth, which is the right floor for a
 * shape of that size; 256 MiB gives DRAM's.
 * Include after <time.h> with _POSIX_C_SOURCE >= 200809L defined.
 */
#ifndef QKV_BENCH_BANDWIDTH_H
#define QKV_BENCH_BANDWIDTH_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds of this process's CPU time. */
static inline double bench_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int bench_bw_cmp_(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* b = a * c over n floats (kept out of line so the loop is the one measured, vectorised by -O2/-O3). */
__attribute__((noinline)) static void bench_bw_scale_(float *restrict b, const float *restrict a, size_t n,
                                                      float c) {
    for (size_t i = 0; i < n; i++) b[i] = a[i] * c;
}

/* Bytes per CPU second of the stream b = c a over a working set of `bytes` (a and b, half each); 0 if the
 * buffers cannot be allocated. */
static inline double bench_bandwidth(size_t bytes) {
    size_t n = bytes / 8;
    if (n < 1024) n = 1024;
    float *a = aligned_alloc(64, (n * 4 + 63) / 64 * 64), *b = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    if (!a || !b) {
        free(a);
        free(b);
        return 0.0;
    }
    for (size_t i = 0; i < n; i++) a[i] = (float)(i % 1000) * 1e-3f, b[i] = 0.0f;
    bench_bw_scale_(b, a, n, 1.0001f); /* warm: pages touched, the set in the caches if it fits */
    double t0 = bench_cpu_now();
    bench_bw_scale_(a, b, n, 0.9999f);
    double once = bench_cpu_now() - t0;
    long reps = once > 0 ? (long)(0.01 / once) + 1 : 1000;
    double samples[5];
    for (int s = 0; s < 5; s++) {
        double start = bench_cpu_now();
        for (long r = 0; r < reps; r++) {
            bench_bw_scale_(b, a, n, 1.0001f);
            bench_bw_scale_(a, b, n, 0.9999f);
        }
        samples[s] = (double)reps * 2.0 * 8.0 * (double)n / (bench_cpu_now() - start);
    }
    free(a);
    free(b);
    qsort(samples, 5, sizeof samples[0], bench_bw_cmp_);
    return samples[2];
}

#endif
