/*
 * study_common.c — what the four parts of the softmax study share: the scales, output paths, timing
 * and a mean/std.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "plot.h"
#include "study.h"

double study_scale_value(int scale, int64_t d_k) {
    switch (scale) {
    case STUDY_SCALE_SQRT: return 1.0 / sqrt((double)d_k);
    case STUDY_SCALE_ONE: return 1.0;
    default: return 1.0 / (double)d_k;
    }
}

const char *study_scale_name(int scale) {
    return scale == STUDY_SCALE_SQRT ? "1/sqrt(d_k)" : scale == STUDY_SCALE_ONE ? "1" : "1/d_k";
}

const char *study_scale_key(int scale) {
    return scale == STUDY_SCALE_SQRT ? "sqrt" : scale == STUDY_SCALE_ONE ? "one" : "dk";
}

const char *study_scale_color(int scale) {
    return scale == STUDY_SCALE_SQRT ? "#1f77b4" : scale == STUDY_SCALE_ONE ? "#d62728" : "#2ca02c";
}

plot_marker study_scale_marker(int scale) {
    return scale == STUDY_SCALE_SQRT ? PLOT_MARKER_CIRCLE : scale == STUDY_SCALE_ONE ? PLOT_MARKER_SQUARE : PLOT_MARKER_TRIANGLE;
}

bool study_path(const study_options *opt, const char *name, char *buf, size_t size) {
    int len = snprintf(buf, size, "%s/%s", opt->out_dir, name);
    return len > 0 && (size_t)len < size;
}

FILE *study_open(const study_options *opt, const char *name, atomic_file *file) {
    char path[4096];
    if (!study_path(opt, name, path, sizeof path)) {
        fprintf(stderr, "softmax_study: output path too long: %s/%s\n", opt->out_dir, name);
        return NULL;
    }
    FILE *f = atomic_open(file, path);
    if (!f) fprintf(stderr, "softmax_study: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

bool study_close(atomic_file *file, const char *name) {
    bool ok = atomic_commit(file);
    if (!ok) fprintf(stderr, "softmax_study: error writing %s: %s\n", name, strerror(errno));
    return ok;
}

bool study_plot_done(const study_options *opt, const char *name, bool ok) {
    if (!ok) fprintf(stderr, "softmax_study: cannot write %s/%s: %s\n", opt->out_dir, name, strerror(errno));
    else if (opt->log) fprintf(opt->log, "  wrote %s/%s\n", opt->out_dir, name);
    return ok;
}

bool study_lines(const study_options *opt, const char *name, const char *title, const char *x_label,
                 const char *y_label, const plot_series *series, int n_series, bool log_x, bool log_y,
                 const plot_style *styles) {
    char path[4096];
    bool ok = study_path(opt, name, path, sizeof path) &&
              plot_lines_styled_svg(path, title, x_label, y_label, series, n_series, log_x, log_y, styles);
    return study_plot_done(opt, name, ok);
}

double study_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void study_mean_std(const double *x, int64_t n, double *mean, double *std) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    double m = n > 0 ? sum / (double)n : NAN;
    for (int64_t i = 0; i < n; i++) sq += (x[i] - m) * (x[i] - m); /* two passes: no cancellation */
    *mean = m;
    *std = n > 1 ? sqrt(sq / (double)(n - 1)) : NAN;
}
