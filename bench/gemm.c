/*
 * bench/gemm.c — GFLOP/s of qkv's f32 and f64 GEMMs, C[m,p] = op(A)[m,k] op(B)[k,p], one thread, each with
 * its share of the core's measured FMA peak (bench/peak.h: independent FMA chains in registers, per dtype).
 *
 * Shapes: square 64 .. 2048, and the attention shapes at d = 64 for n = 128, 512, 2048:
 *   S = Q K^T      [n,64] x [64,n]^T     (forward scores; backward dA = dO V^T has the same shape)
 *   O = A V        [n,n] x [n,64]        (forward; backward dQ = dS K has the same shape)
 *   dV = A^T dO    [n,n]^T x [n,64]      (backward; dK = dS^T Q has the same shape)
 * and the small shapes of a (1, 64, 16) attention.
 *
 * Columns: qkv (qkv_gemm_f32_ / qkv_gemm_f64_, what the operators call) and its % of peak, each compiled
 * micro-kernel forced (avx512, avx2, portable; in f64 an AVX-512 CPU runs the AVX2 kernel), the reference
 * loops (qkv_gemm_f32_ref_ / qkv_gemm_f64_ref_) and qkv / reference; with --openblas, OpenBLAS's
 * cblas_sgemm / cblas_dgemm loaded at run time (run with OPENBLAS_NUM_THREADS=1; bench/compare_gemm.py does),
 * its % of peak, and qkv / OpenBLAS. The f32 table comes first, then the f64 one (--dtype picks one). Each figure is the median of --runs runs (default 11); a run repeats the GEMM for at least
 * 5 ms; the columns of one shape are timed interleaved, run by run, and each ratio is the median over runs
 * of the ratio within a run, so load on the machine hits both sides of a ratio alike.
 * The reference is only timed up to 2*512^3 flops per call (it is slow): "-" above that.
 * It prints figures and asserts nothing.
 *
 *   build/bench/gemm [--runs N] [--quick] [--min] [--cpu] [--dtype f32|f64|both] [--shape M K P TA TB]
 *                    [--openblas [path/to/libopenblas.so]]
 * --shape times that one shape only (M, K, P in 1..16384; TA, TB: 0 or 1). A bad flag or value is an error
 * naming it (exit 2); --help prints the usage. --min reports the fastest run instead of the median
 * (an estimate of the speed on a quiet machine, for tuning); --cpu times in process CPU time (OpenBLAS
 * runs on the calling thread at one thread, so both columns are timed alike).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "bench.h"
#include "peak.h"
#include "qkv_internal.h"

#define MAX_RUNS 51
#define REF_MAX_FLOPS (2.0 * 512 * 512 * 512)
#define PORTABLE_MAX_FLOPS (2.0 * 1024 * 1024 * 1024)

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*dgemm_fn)(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                         const double *b, int ldb, double beta, double *c, int ldc);
static sgemm_fn openblas_sgemm;
static dgemm_fn openblas_dgemm;
static bool use_min; /* report the fastest run, not the median */
static double (*now)(void) = bench_now; /* --cpu: bench_cpu_now */
static bool f64;     /* the table being timed: f64 (else f32) */
static double peak;  /* the measured FMA peak of this table's dtype, GFLOP/s */

enum { COL_QKV, COL_AVX512, COL_AVX2, COL_PORTABLE, COL_REF, COL_OPENBLAS, N_COLS };
static const char *col_name[N_COLS] = {"qkv", "avx512", "avx2", "portable", "ref", "openblas"};

typedef struct shape {
    const char *name;
    int64_t m, k, p;
    bool ta, tb;
} shape;

static void call_f64(int col, const shape *s, const double *a, const double *b, double *c) {
    switch (col) {
    case COL_QKV: qkv_gemm_f64_(a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_AVX512: qkv_gemm_f64_isa_(QKV_ISA_AVX512_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_AVX2: qkv_gemm_f64_isa_(QKV_ISA_AVX2_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_PORTABLE:
        qkv_gemm_f64_isa_(QKV_ISA_PORTABLE_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false);
        break;
    case COL_REF: qkv_gemm_f64_ref_(a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_OPENBLAS:
        openblas_dgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, (int)s->m, (int)s->p, (int)s->k, 1.0, a,
                       (int)(s->ta ? s->m : s->k), b, (int)(s->tb ? s->k : s->p), 0.0, c, (int)s->p);
        break;
    }
}

static void call(int col, const shape *s, const void *av, const void *bv, void *cv) {
    if (f64) {
        call_f64(col, s, av, bv, cv);
        return;
    }
    const float *a = av, *b = bv;
    float *c = cv;
    switch (col) {
    case COL_QKV: qkv_gemm_f32_(a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_AVX512: qkv_gemm_f32_isa_(QKV_ISA_AVX512_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_AVX2: qkv_gemm_f32_isa_(QKV_ISA_AVX2_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_PORTABLE:
        qkv_gemm_f32_isa_(QKV_ISA_PORTABLE_, a, b, c, s->m, s->k, s->p, s->ta, s->tb, false);
        break;
    case COL_REF: qkv_gemm_f32_ref_(a, b, c, s->m, s->k, s->p, s->ta, s->tb, false); break;
    case COL_OPENBLAS: /* CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 */
        openblas_sgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, (int)s->m, (int)s->p, (int)s->k, 1.0f, a,
                       (int)(s->ta ? s->m : s->k), b, (int)(s->tb ? s->k : s->p), 0.0f, c, (int)s->p);
        break;
    }
}

static void *rand_buf(int64_t n, uint64_t seed) {
    size_t es = f64 ? sizeof(double) : sizeof(float);
    void *x = aligned_alloc(64, ((size_t)n * es + 63) & ~(size_t)63);
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        double v = (double)(seed >> 40) / (double)(1u << 24) - 0.5;
        if (f64) ((double *)x)[i] = v;
        else ((float *)x)[i] = (float)v;
    }
    return x;
}

static void bench_shape(const shape *s, int runs, const bool *enabled) {
    double flops = 2.0 * (double)s->m * (double)s->k * (double)s->p;
    void *a = rand_buf(s->m * s->k, 1), *b = rand_buf(s->k * s->p, 2), *c = rand_buf(s->m * s->p, 3);
    bool on[N_COLS];
    int reps[N_COLS];
    double times[N_COLS][MAX_RUNS];
    for (int col = 0; col < N_COLS; col++) {
        on[col] = enabled[col];
        if (col == COL_REF && flops > REF_MAX_FLOPS) on[col] = false;
        if (col == COL_PORTABLE && flops > PORTABLE_MAX_FLOPS) on[col] = false;
        if (!on[col]) continue;
        call(col, s, a, b, c); /* warm up: page in, fill the packing buffers */
        double t0 = now();
        call(col, s, a, b, c);
        double one = now() - t0;
        reps[col] = one > 0.005 ? 1 : (int)(0.005 / (one > 1e-7 ? one : 1e-7)) + 1;
    }
    for (int r = 0; r < runs; r++)
        for (int col = 0; col < N_COLS; col++) {
            if (!on[col]) continue;
            double t0 = now();
            for (int i = 0; i < reps[col]; i++) call(col, s, a, b, c);
            times[col][r] = (now() - t0) / reps[col];
        }
    /* Ratios: the median over runs of the ratio within a run (the columns of one run are timed back to back,
     * so a burst of load from elsewhere hits both sides of a ratio alike), not a ratio of two medians. */
    double ratio_ref = 0.0, ratio_ob = 0.0, tmp[MAX_RUNS];
    if (on[COL_REF]) {
        for (int r = 0; r < runs; r++) tmp[r] = times[COL_REF][r] / times[COL_QKV][r];
        qsort(tmp, (size_t)runs, sizeof(double), bench_cmp_double);
        ratio_ref = tmp[runs / 2];
    }
    if (on[COL_OPENBLAS]) {
        for (int r = 0; r < runs; r++) tmp[r] = times[COL_OPENBLAS][r] / times[COL_QKV][r];
        qsort(tmp, (size_t)runs, sizeof(double), bench_cmp_double);
        ratio_ob = tmp[runs / 2];
    }
    char label[64];
    snprintf(label, sizeof label, "%s %lldx%lldx%lld %s%s", s->name, (long long)s->m, (long long)s->k,
             (long long)s->p, s->ta ? "T" : "N", s->tb ? "T" : "N");
    printf("%-30s", label);
    for (int col = 0; col < N_COLS; col++) {
        if (!enabled[col]) continue;
        if (!on[col]) {
            printf(" %9s", "-");
            continue;
        }
        qsort(times[col], (size_t)runs, sizeof(double), bench_cmp_double);
        double gf = flops / times[col][use_min ? 0 : runs / 2] * 1e-9;
        printf(" %9.1f", gf);
        if (col == COL_QKV || col == COL_OPENBLAS) printf(" %6.0f%%", bench_peak_pct(gf, peak));
    }
    if (on[COL_REF]) printf(" %9.1fx", ratio_ref);
    else printf(" %10s", "-");
    if (enabled[COL_OPENBLAS]) printf(" %9.2fx", ratio_ob);
    printf("\n");
    fflush(stdout);
    free(a), free(b), free(c);
}

/* One table (f32 or f64, as `f64` says): the shape given, or the standard ones. */
static void table(int runs, bool quick, const bool *enabled, shape one) {
    printf("# %s GEMM, GFLOP/s (%s of %d runs), one thread; qkv dispatches to %s%s; %%pk: share of the %s peak\n",
           f64 ? "f64" : "f32", use_min ? "fastest" : "median", runs, qkv_isa_name_(qkv_isa_best_()),
           f64 && qkv_isa_best_() == QKV_ISA_AVX512_ ? " (its f64 kernel: avx2)" : "", f64 ? "f64" : "f32");
    printf("# ref: reference loops, timed only up to 2*512^3 flops; portable: up to 2*1024^3 flops\n");
    printf("%-30s", "# shape (m x k x p, trans)");
    for (int col = 0; col < N_COLS; col++)
        if (enabled[col]) {
            printf(" %9s", col_name[col]);
            if (col == COL_QKV || col == COL_OPENBLAS) printf(" %7s", col == COL_QKV ? "qkv%pk" : "ob%pk");
        }
    printf(" %10s", "qkv/ref");
    if (enabled[COL_OPENBLAS]) printf(" %10s", "qkv/oblas");
    printf("\n");

    if (one.m > 0 && one.k > 0 && one.p > 0) {
        bench_shape(&one, runs, enabled);
        return;
    }
    static const int64_t square[] = {64, 128, 256, 512, 1024, 2048};
    static const int64_t seq[] = {128, 512, 2048};
    int n_square = quick ? 5 : 6, n_seq = quick ? 2 : 3;
    for (int i = 0; i < n_square; i++) {
        shape s = {"square", square[i], square[i], square[i], false, false};
        bench_shape(&s, runs, enabled);
    }
    for (int t = 1; t < 4; t++) {
        shape s = {"square", 512, 512, 512, t & 1, t & 2};
        bench_shape(&s, runs, enabled);
    }
    for (int i = 0; i < n_seq; i++) {
        int64_t n = seq[i];
        shape qk = {"QK^T", n, 64, n, false, true};
        shape av = {"AV", n, n, 64, false, false};
        shape dv = {"A^TdO", n, n, 64, true, false};
        bench_shape(&qk, runs, enabled);
        bench_shape(&av, runs, enabled);
        bench_shape(&dv, runs, enabled);
    }
    shape small[] = {
        {"QK^T", 64, 16, 64, false, true},
        {"AV", 64, 64, 16, false, false},
        {"proj", 64, 16, 48, false, false},
        {"tiny", 3, 2, 3, false, true},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) bench_shape(&small[i], runs, enabled);
}

static void usage(FILE *out) {
    fprintf(out, "usage: gemm [--runs N] [--quick] [--min] [--cpu] [--dtype f32|f64|both] [--shape M K P TA TB]\n"
                 "            [--openblas [libopenblas.so]]\n"
                 "GFLOP/s of qkv's f32 and f64 GEMMs against their reference loops (and OpenBLAS with\n"
                 "--openblas), each with its share of the core's measured FMA peak.\n\n"
                 "  --runs N             runs per figure, 1..%d                   (11)\n"
                 "  --quick              leave out the largest shapes\n"
                 "  --min                report the fastest run instead of the median\n"
                 "  --cpu                time in process CPU time, not wall time (a shared machine)\n"
                 "  --dtype D            f32, f64 or both                          (both)\n"
                 "  --shape M K P TA TB  that shape only: M, K, P in 1..16384, TA and TB 0 or 1\n"
                 "  --openblas [PATH]    add OpenBLAS's cblas_sgemm/dgemm, loaded at run time (libopenblas.so.0)\n"
                 "  --help               this text\n",
            MAX_RUNS);
}

int main(int argc, char **argv) {
    int runs = 11, dtypes = 3; /* bit 0: the f32 table, bit 1: the f64 one */
    bool quick = false;
    const char *openblas_path = NULL;
    shape one = {"shape", 0, 0, 0, false, false};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (args_is_help(f)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--runs")) {
            int64_t v;
            if (!args_int_flag("gemm", argc, argv, &i, 1, MAX_RUNS, &v)) return ARGS_USAGE_ERROR;
            runs = (int)v;
        } else if (!strcmp(f, "--quick")) quick = true;
        else if (!strcmp(f, "--dtype")) {
            if (i + 1 >= argc || (strcmp(argv[i + 1], "f32") && strcmp(argv[i + 1], "f64") && strcmp(argv[i + 1], "both"))) {
                fprintf(stderr, "gemm: --dtype takes f32, f64 or both\n");
                return ARGS_USAGE_ERROR;
            }
            i++;
            dtypes = !strcmp(argv[i], "f32") ? 1 : !strcmp(argv[i], "f64") ? 2 : 3;
        }
        else if (!strcmp(f, "--min")) use_min = true;
        else if (!strcmp(f, "--cpu")) now = bench_cpu_now;
        else if (!strcmp(f, "--shape")) {
            static const char *const part[] = {"M", "K", "P", "TA", "TB"};
            static const int64_t least[] = {1, 1, 1, 0, 0}, most[] = {16384, 16384, 16384, 1, 1};
            int64_t v[5];
            if (!args_ints_flag("gemm", argc, argv, &i, 5, part, least, most, v)) return ARGS_USAGE_ERROR;
            one.m = v[0], one.k = v[1], one.p = v[2], one.ta = v[3] != 0, one.tb = v[4] != 0;
        } else if (!strcmp(f, "--openblas")) {
            openblas_path = "libopenblas.so.0";
            if (i + 1 < argc && argv[i + 1][0] != '-') openblas_path = argv[++i];
        } else {
            return args_unknown("gemm", f);
        }
    }

    bool enabled[N_COLS] = {true, qkv_isa_supported_(QKV_ISA_AVX512_), qkv_isa_supported_(QKV_ISA_AVX2_), true,
                            true, false};
    if (openblas_path) {
        void *h = dlopen(openblas_path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "cannot load %s: %s\n", openblas_path, dlerror());
            return 1;
        }
        *(void **)&openblas_sgemm = dlsym(h, "cblas_sgemm");
        *(void **)&openblas_dgemm = dlsym(h, "cblas_dgemm");
        void (*set_threads)(int);
        *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
        char *(*get_config)(void);
        *(void **)&get_config = dlsym(h, "openblas_get_config");
        if (!openblas_sgemm || !openblas_dgemm) {
            fprintf(stderr, "%s has no cblas_sgemm or no cblas_dgemm\n", openblas_path);
            return 1;
        }
        if (set_threads) set_threads(1);
        enabled[COL_OPENBLAS] = true;
        printf("# OpenBLAS: %s (%s), 1 thread\n", openblas_path, get_config ? get_config() : "?");
    }

    bench_peak pk = bench_peak_get();
    printf("# peak of one core (bench/peak.h, %d FMA chains in %s registers, fastest of %d runs): "
           "f32 %.1f GFLOP/s, f64 %.1f GFLOP/s\n",
           PEAK_NCHAIN, pk.isa, PEAK_RUNS, pk.f32, pk.f64);
    for (int dt = 0; dt < 2; dt++) {
        if (!(dtypes >> dt & 1)) continue;
        f64 = dt == 1;
        peak = f64 ? pk.f64 : pk.f32;
        table(runs, quick, enabled, one);
    }
    return 0;
}
