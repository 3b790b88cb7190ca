/*
 * peak.h — a measured FMA peak of one core, so that every benchmark figure can be printed with its share of
 * it ("x% of peak") and figures from different machines compare.
 *
 * The probe: NCHAIN independent multiply-add chains held in vector registers, acc_i = acc_i * x + y, each
 * step one fused multiply-add per chain, no memory traffic; enough chains to cover the FMA latency of every
 * current core (4 or 5 cycles on 2 pipes: 10 in flight). Run for each vector width the CPU has (AVX-512F,
 * AVX2+FMA, compiled through target attributes, so the benchmarks keep the library's default flags; on other
 * CPUs a plain C loop of the same shape); the peak is the best, in GFLOP/s (2 flops an FMA lane), for f32 and
 * f64. Each figure is the fastest of PEAK_RUNS runs of about 10 ms of process CPU time (the probe's only
 * noise is other work on the core, which only slows it). One core: the benchmarks that print against it run one thread.
 *
 *   bench_peak p = bench_peak_get();  // measured at the first call, then cached
 *   printf("%.0f%% of peak", 100 * gflops / p.f64);
 *
 * Include after bench.h.
 */
#ifndef QKV_BENCH_PEAK_H
#define QKV_BENCH_PEAK_H

#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

#define PEAK_NCHAIN 12
#define PEAK_RUNS 7

typedef struct bench_peak {
    double f32, f64;  /* GFLOP/s of one core */
    const char *isa;  /* the vector width that gave it */
} bench_peak;

/* Seconds of CPU time this process has used (all its threads): on a shared machine, what one-thread
 * figures are timed with under --cpu, since wall time also counts the time slices other processes took. */
static inline double bench_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile double peak_sink; /* the chains' sum, so that no compiler drops them */

#ifdef PEAK_X86
#define PEAK_LOOP(V, SET1, FMA, ADD, STORE_T, T, LANES)                                                \
    V acc[PEAK_NCHAIN], x = SET1((T)0.9999999), y = SET1((T)1e-7);                                   \
    for (int i = 0; i < PEAK_NCHAIN; i++) acc[i] = SET1((T)i);                                         \
    for (long it = 0; it < iters; it++)                                                                \
        for (int i = 0; i < PEAK_NCHAIN; i++) acc[i] = FMA(acc[i], x, y);                              \
    for (int i = 1; i < PEAK_NCHAIN; i++) acc[0] = ADD(acc[0], acc[i]);                                \
    T out[LANES];                                                                                      \
    STORE_T(out, acc[0]);                                                                              \
    peak_sink = (double)out[0];

__attribute__((target("avx2,fma"))) static void peak_avx2_f32(long iters) {
    PEAK_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, float, 8)
}
__attribute__((target("avx2,fma"))) static void peak_avx2_f64(long iters) {
    PEAK_LOOP(__m256d, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_add_pd, _mm256_storeu_pd, double, 4)
}
__attribute__((target("avx512f"))) static void peak_avx512_f32(long iters) {
    PEAK_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, float, 16)
}
__attribute__((target("avx512f"))) static void peak_avx512_f64(long iters) {
    PEAK_LOOP(__m512d, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_add_pd, _mm512_storeu_pd, double, 8)
}
#undef PEAK_LOOP
#endif

/* The portable probe: the same chains in scalar code (what a CPU without these vector units can do). */
static void peak_scalar_f64(long iters) {
    double acc[PEAK_NCHAIN];
    for (int i = 0; i < PEAK_NCHAIN; i++) acc[i] = i;
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < PEAK_NCHAIN; i++) acc[i] = acc[i] * 0.9999999 + 1e-7;
    double s = 0;
    for (int i = 0; i < PEAK_NCHAIN; i++) s += acc[i];
    peak_sink = s;
}

/* GFLOP/s of probe fn with `lanes` lanes a chain: the fastest of PEAK_RUNS runs, in process CPU time (the
 * probe runs on the calling thread; time slices that other processes take on a shared core are not its). */
static double peak_measure(void (*fn)(long), int lanes) {
    long iters = 1 << 16;
    for (;;) { /* grow the run to about 10 ms */
        double t0 = bench_cpu_now();
        fn(iters);
        double t = bench_cpu_now() - t0;
        if (t > 0.01 || iters > (1L << 30)) break;
        iters *= 2;
    }
    double best = 1e30;
    for (int r = 0; r < PEAK_RUNS; r++) {
        double t0 = bench_cpu_now();
        fn(iters);
        double t = bench_cpu_now() - t0;
        if (t < best) best = t;
    }
    return 2.0 * (double)iters * PEAK_NCHAIN * lanes / best * 1e-9;
}

static bench_peak bench_peak_get(void) {
    static bench_peak cached;
    if (cached.isa) return cached;
    bench_peak p = {0.0, 0.0, "scalar"};
#ifdef PEAK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        p.f32 = peak_measure(peak_avx512_f32, 16);
        p.f64 = peak_measure(peak_avx512_f64, 8);
        p.isa = "avx512";
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        double f32 = peak_measure(peak_avx2_f32, 8), f64 = peak_measure(peak_avx2_f64, 4);
        if (f32 > p.f32) p.f32 = f32, p.f64 = f64, p.isa = "avx2";
    }
#endif
    if (p.f64 <= 0.0) p.f64 = p.f32 = peak_measure(peak_scalar_f64, 1);
    cached = p;
    return p;
}


/* share = 100 * gflops / peak, for printing as "x% of peak" */
static inline double bench_peak_pct(double gflops, double peak) { return peak > 0.0 ? 100.0 * gflops / peak : 0.0; }

#endif
