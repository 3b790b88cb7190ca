/*
 * parallel.h — the elementwise and row-wise operators' split of a range over the context's threads.
 *
 * qkv_parallel_ranges_ runs fn(arg, i0, i1) over [0, n) cut into one range per thread, each range a whole
 * number of `align` items (rows, or elements in blocks that keep every vector loop on the lanes it has on
 * one thread), so that each output is computed by exactly one thread with exactly the arithmetic of the
 * one-thread loop: the same bits for any thread count. As in ops/softmax.c and the GEMM, each thread gets
 * at least `grain` units of `work`, and a call with less (or one thread, or no OpenMP) runs fn once over
 * the whole range on the calling thread, with no OpenMP region at all (qkv_grain_threads_,
 * ops/kernels/attention_kernels.h, says why a region per small call costs so much).
 */
#ifndef QKV_PARALLEL_H
#define QKV_PARALLEL_H

#include "kernels/attention_kernels.h"

#include <stdint.h>

/* Elements (or their equivalent) a thread gets at least: about 10-30 us of a memory-bound pass of one core,
 * the grain of the softmax. */
#define QKV_GRAIN_ELEMENTS_ QKV_GRAIN_SOFTMAX_

typedef void (*qkv_range_fn_)(void *arg, int64_t i0, int64_t i1);

/* The threads qkv_parallel_ranges_ would run on (1: the calling thread alone, no region). */
static inline int qkv_range_threads_(int threads, int64_t n, int64_t align, double work, double grain) {
    if (n <= 0) return 1;
    if (align < 1) align = 1;
    return qkv_grain_threads_(threads, (n + align - 1) / align, work, grain);
}

static inline void qkv_parallel_ranges_(int threads, int64_t n, int64_t align, double work, double grain,
                                        qkv_range_fn_ fn, void *arg) {
    if (n <= 0) return;
    if (align < 1) align = 1;
    int64_t blocks = (n + align - 1) / align;
    int nt = qkv_range_threads_(threads, n, align, work, grain);
    if (nt <= 1) {
        fn(arg, 0, n);
        return;
    }
    int64_t chunk = (blocks + nt - 1) / nt * align; /* whole blocks of align items */
    int64_t ranges = (n + chunk - 1) / chunk;
    qkv_parallel_region_opened_();
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(nt)
#endif
    for (int64_t t = 0; t < ranges; t++) {
        int64_t i0 = t * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        fn(arg, i0, i1);
    }
}

/* sums[c] = sum over the rows r in order of m[r * cols + c], in double, for c < cols: a bias gradient's column
 * sums, the columns split over threads in ranges of 16 (a cache line of each row), each column summed by one
 * thread, so the same bits for any count. */
typedef struct qkv_column_sums_job_ {
    const float *m;
    double *sums;
    int64_t rows, cols;
} qkv_column_sums_job_;

static inline void qkv_column_sums_range_(void *arg, int64_t c0, int64_t c1) {
    const qkv_column_sums_job_ *j = arg;
    double *restrict sums = j->sums;
    const float *restrict m = j->m;
    for (int64_t c = c0; c < c1; c++) sums[c] = 0.0;
    for (int64_t r = 0; r < j->rows; r++)
        for (int64_t c = c0; c < c1; c++) sums[c] += m[r * j->cols + c];
}

static inline void qkv_column_sums_f32_(int threads, const float *m, int64_t rows, int64_t cols, double *sums) {
    qkv_column_sums_job_ job = {m, sums, rows, cols};
    qkv_parallel_ranges_(threads, cols, 16, (double)rows * (double)cols, QKV_GRAIN_ELEMENTS_, qkv_column_sums_range_,
                         &job);
}

#endif
