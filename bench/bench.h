/*
 * bench.h — what the benchmark programs share: a monotonic clock and the comparison qsort needs to take a
 * median of samples. Include after <time.h> with _POSIX_C_SOURCE >= 200809L defined.
 */
#ifndef QKV_BENCH_H
#define QKV_BENCH_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* qsort comparison of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
