/*
 * test_examples.c — the helpers the example programs share (examples/): the tick chooser of the plots
 * (round ticks that cover the data), the tick labels, the atomic file writer, the argument parser's number
 * checks, and what copy_load says about a checkpoint it refuses (the differing flag by name, a non-finite
 * tensor by name).
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "atomic_file.h"
#include "copy_model.h"
#include "plot.h"

/* ---- ticks ---------------------------------------------------------------------------------------- */

/* v is m * 10^e with m in {1, 2, 5} (or m == 1 only), to 1e-9 relative. */
static bool is_125(double v, bool powers_only) {
    if (v == 0) return !powers_only;
    double a = fabs(v);
    int e = (int)floor(log10(a) + 1e-9);
    double m = a / pow(10, e);
    if (powers_only) return fabs(m - 1) < 1e-9;
    return fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9;
}

static void check_linear(double lo, double hi) {
    double t[12];
    int n = plot_ticks(lo, hi, false, t, 12);
    cr_assert(n >= 3 && n <= 7, "[%g, %g]: %d ticks", lo, hi, n);
    cr_expect(t[0] <= lo && t[n - 1] >= hi, "[%g, %g]: ticks %g .. %g do not cover it", lo, hi, t[0], t[n - 1]);
    double step = t[1] - t[0];
    cr_expect(is_125(step, false), "[%g, %g]: step %.17g is not 1, 2 or 5 times a power of ten", lo, hi, step);
    for (int i = 0; i < n; i++) {
        double k = t[i] / step;
        cr_expect(fabs(k - round(k)) < 1e-9, "[%g, %g]: tick %.17g is not a multiple of the step %g", lo, hi, t[i], step);
        if (i) cr_expect(fabs(t[i] - t[i - 1] - step) < 1e-9 * fabs(step) * 10, "[%g, %g]: uneven ticks", lo, hi);
    }
    /* not too loose: the ticks' span is at most about 2.5 times the data's (a 1-2-5 step, at most 6 of them) */
    cr_expect(t[n - 1] - t[0] <= 2.5 * (hi - lo) + 1e-12, "[%g, %g]: ticks %g .. %g are too wide", lo, hi, t[0], t[n - 1]);
}

Test(ticks, linear_round_and_covering) {
    const double cases[][2] = {{2, 1024},   {0, 1000},    {0.113, 1},   {0.0311, 0.124}, {-3.7, 12.2},
                               {-1, -0.2},  {1e-7, 3e-7}, {0, 1},       {99.5, 100.5},   {1e6, 7.3e6},
                               {0, 0.0005}, {-50, 50},    {0.97, 1.03}, {3, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_linear(cases[i][0], cases[i][1]);
}

Test(ticks, linear_exact_values) {
    double t[12];
    int n = plot_ticks(0.113, 1, false, t, 12); /* the part 4 accuracy axis */
    cr_assert_eq(n, 6);
    const double want[] = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
    for (int i = 0; i < n; i++) cr_expect(t[i] == want[i], "tick %d: %.17g, not %g", i, t[i], want[i]);
    n = plot_ticks(0, 1000, false, t, 12);
    cr_assert_eq(n, 6);
    cr_expect(t[1] == 200 && t[5] == 1000);
    n = plot_ticks(5, 5, false, t, 12); /* one value: a range around it */
    cr_expect(n >= 3 && t[0] < 5 && t[n - 1] > 5);
    cr_expect_eq(plot_ticks(NAN, 1, false, t, 12), 0);
    cr_expect_eq(plot_ticks(0, INFINITY, false, t, 12), 0);
}

static void check_log(double lo, double hi, int want_first_e, bool powers_only) {
    double t[12];
    int n = plot_ticks(lo, hi, true, t, 12);
    cr_assert(n >= 2 && n <= 12, "[%g, %g]: %d ticks", lo, hi, n);
    cr_expect(t[0] <= lo * (1 + 1e-12) && t[n - 1] >= hi * (1 - 1e-12), "[%g, %g]: ticks %g .. %g do not cover it",
              lo, hi, t[0], t[n - 1]);
    for (int i = 0; i < n; i++)
        cr_expect(is_125(t[i], powers_only), "[%g, %g]: tick %.17g is not %s", lo, hi, t[i],
                  powers_only ? "a power of ten" : "1, 2 or 5 times a power of ten");
    for (int i = 1; i < n; i++) cr_expect(t[i] > t[i - 1]);
    if (want_first_e != 99) cr_expect(fabs(t[0] - pow(10, want_first_e)) < 1e-9 * pow(10, want_first_e));
}

Test(ticks, log_powers_of_ten_and_125_under_two_decades) {
    check_log(2, 1024, 0, true);         /* part 1's d_k axis: 1, 10, 100, 1000, 10000 */
    check_log(0.0311, 32.1, -2, true);   /* three decades */
    check_log(1e-30, 1, 99, true);       /* thirty decades: every few */
    check_log(0.0311, 0.124, 99, false); /* under two decades: 0.02, 0.05, 0.1, 0.2 */
    check_log(7, 300, 99, false);
    check_log(1, 1, 99, false);
    double t[12];
    int n = plot_ticks(0.0311, 0.124, true, t, 12);
    cr_assert_eq(n, 4, "%d ticks", n);
    const double want[] = {0.02, 0.05, 0.1, 0.2};
    for (int i = 0; i < n; i++) cr_expect(fabs(t[i] - want[i]) < 1e-15, "tick %d: %.17g, not %g", i, t[i], want[i]);
    n = plot_ticks(2, 1024, true, t, 12);
    cr_assert_eq(n, 5);
    cr_expect(t[0] == 1 && t[4] == 10000);
    cr_expect_eq(plot_ticks(0, 1, true, t, 12), 0, "a log axis needs lo > 0");
}

/* A log axis spans the data's decades only: d_k from 2 to 1024 is not drawn from 1 to 10000. */
Test(ticks, log_axis_has_no_empty_decade) {
    double t[12], a0 = 0, a1 = 0;
    int n = plot_axis(2, 1024, true, t, 12, &a0, &a1);
    cr_assert_eq(n, 3, "%d ticks", n);
    cr_expect(t[0] == 10 && t[1] == 100 && t[2] == 1000, "ticks %g %g %g", t[0], t[1], t[2]);
    cr_expect(a0 < 2 && a0 > 2 / pow(10, 0.2), "the axis starts at %g", a0);
    cr_expect(a1 > 1024 && a1 < 1024 * pow(10, 0.2), "the axis ends at %g", a1);
    /* part 3's median |dL/dS|: 2.9e-8 .. 1.04e-3, not 1e-8 .. 1e-2 */
    n = plot_axis(2.92e-8, 1.04e-3, true, t, 12, &a0, &a1);
    cr_expect(a1 < 2e-3 && a0 > 1.5e-8, "axis %g .. %g", a0, a1);
    cr_expect(t[0] == 1e-7 || fabs(t[0] / 1e-7 - 1) < 1e-12, "first tick %g", t[0]);
    cr_expect(fabs(t[n - 1] / 1e-3 - 1) < 1e-12, "last tick %g", t[n - 1]);
    for (int i = 0; i < n; i++) cr_expect(t[i] >= a0 && t[i] <= a1, "tick %g outside the axis %g .. %g", t[i], a0, a1);
    /* under two decades the 1-2-5 ticks inside the data's range stay */
    n = plot_axis(0.0311, 0.124, true, t, 12, &a0, &a1);
    cr_assert_eq(n, 2, "%d ticks", n);
    cr_expect(fabs(t[0] - 0.05) < 1e-15 && fabs(t[1] - 0.1) < 1e-15);
    /* too narrow for two ticks inside: from tick to tick, covering the data */
    n = plot_axis(0.3, 0.45, true, t, 12, &a0, &a1);
    cr_expect(n >= 2 && a0 == t[0] && a1 == t[n - 1] && a0 <= 0.3 && a1 >= 0.45, "axis %g .. %g", a0, a1);
    /* a linear axis is plot_ticks' */
    n = plot_axis(0.113, 1, false, t, 12, &a0, &a1);
    cr_expect(n == 6 && a0 == 0 && a1 == 1);
    cr_expect_eq(plot_axis(0, 1, true, t, 12, &a0, &a1), 0, "a log axis needs lo > 0");
}

Test(ticks, labels) {
    char b[32];
    plot_tick_label(1000, 200, false, b, sizeof b);
    cr_expect_str_eq(b, "1000");
    plot_tick_label(0.6000000000000001, 0.2, false, b, sizeof b);
    cr_expect_str_eq(b, "0.6");
    plot_tick_label(1.5, 0.5, false, b, sizeof b);
    cr_expect_str_eq(b, "1.5");
    plot_tick_label(0, 0.05, false, b, sizeof b);
    cr_expect_str_eq(b, "0");
    plot_tick_label(-20, 10, false, b, sizeof b);
    cr_expect_str_eq(b, "-20");
    plot_tick_label(0.001, 0, true, b, sizeof b);
    cr_expect_str_eq(b, "0.001");
    plot_tick_label(10000, 0, true, b, sizeof b);
    cr_expect_str_eq(b, "10000");
    plot_tick_label(2e-5, 0, true, b, sizeof b);
    cr_expect_str_eq(b, "2e-5");
    plot_tick_label(1e7, 0, true, b, sizeof b);
    cr_expect_str_eq(b, "1e7");
}

/* ---- files ---------------------------------------------------------------------------------------- */

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int count_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

Test(atomic_file, replaces_whole_or_not_at_all) {
    char dir[] = "/tmp/qkv-atomic-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/out.csv", dir);
    atomic_file a;
    FILE *f = atomic_open(&a, path);
    cr_assert(f);
    fputs("old\n", f);
    cr_assert(atomic_commit(&a));
    cr_expect_str_eq(read_all(path), "old\n");

    f = atomic_open(&a, path); /* written but abandoned: the old file stays */
    cr_assert(f);
    fputs("half a new fi", f);
    cr_expect_str_eq(read_all(path), "old\n", "the target changed before the commit");
    atomic_abandon(&a);
    cr_expect_str_eq(read_all(path), "old\n");
    cr_expect_eq(count_temporaries(dir), 0, "a temporary file was left behind");

    double x[] = {1, 2, 3}, y[] = {0.5, 0.25, 0.125};
    plot_series s = {"y", x, y, 3};
    cr_assert(plot_lines_svg(path, "t", "x", "y", &s, 1, false, true));
    cr_expect(strstr(read_all(path), "</svg>"), "the plot was not written whole");
    cr_expect_eq(count_temporaries(dir), 0);

    char missing[96];
    snprintf(missing, sizeof missing, "%s/no/such/folder.svg", dir);
    cr_expect(!plot_lines_svg(missing, "t", "x", "y", &s, 1, false, false), "a plot into a missing folder succeeded");

    /* a FIFO, or a symlink to /dev/null, at the target: refused and left in place */
    char fifo[96], link[96];
    snprintf(fifo, sizeof fifo, "%s/fifo.svg", dir);
    snprintf(link, sizeof link, "%s/null.svg", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(symlink("/dev/null", link), 0);
    struct stat st;
    errno = 0;
    cr_expect_null(atomic_open(&a, fifo));
    cr_expect_eq(errno, EEXIST);
    cr_expect(!plot_lines_svg(link, "t", "x", "y", &s, 1, false, false), "a plot replaced a symlink to /dev/null");
    cr_expect(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    cr_expect(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the symlink was replaced");
    cr_expect(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    cr_expect_eq(count_temporaries(dir), 0);
    unlink(fifo);
    unlink(link);
    unlink(path);
    rmdir(dir);
}

/* The stroke widths of the <path> lines in an SVG, in order (at most max). */
static int stroke_widths(const char *svg, double *w, int max) {
    int n = 0;
    for (const char *p = svg; n < max && (p = strstr(p, "<path fill=\"none\"")); p++) {
        const char *a = strstr(p, "stroke-width=\"");
        if (!a) break;
        w[n++] = atof(a + strlen("stroke-width=\""));
    }
    return n;
}

/* Series that lie exactly on each other: each drawn thinner than the one before, so none is hidden, and the
 * legend draws each with its own width; a log x axis from 2 to 1024 has no tick at 1 or 10000. */
Test(plot, coinciding_lines_stay_visible) {
    char dir[] = "/tmp/qkv-plot-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/lines.svg", dir);
    double x[] = {2, 16, 128, 1024}, y[] = {20, 30, 40, 50};
    plot_series s[3] = {{"a", x, y, 4}, {"b", x, y, 4}, {"c", x, y, 4}};
    plot_style st[3] = {{"#000000", NULL, PLOT_MARKER_CIRCLE}, {"#ff0000", "6 3", PLOT_MARKER_SQUARE},
                        {"#00ff00", "2 2", PLOT_MARKER_TRIANGLE}};
    cr_assert(plot_lines_styled_svg(path, "t", "d_k", "y", s, 3, true, false, st));
    const char *svg = read_all(path);
    double w[8];
    cr_assert_eq(stroke_widths(svg, w, 8), 3);
    cr_expect(w[0] > w[1] + 0.5 && w[1] > w[2] + 0.5, "widths %g %g %g: each line must leave the one below showing",
              w[0], w[1], w[2]);
    char legend[128];
    for (int i = 0; i < 3; i++) { /* the legend's line for series i has that series' colour and width */
        snprintf(legend, sizeof legend, "stroke=\"%s\" stroke-width=\"%.2f\"", st[i].color, w[i]);
        const char *first = strstr(svg, legend);
        cr_expect(first && strstr(first + 1, legend), "series %d: the legend does not match its line (%s)", i, legend);
    }
    cr_expect(strstr(svg, ">1000</text>") && !strstr(svg, ">10000</text>") && !strstr(svg, ">1</text>"),
              "the d_k axis has an empty decade");
    unlink(path);
    rmdir(dir);
}

/* ---- the argument parser -------------------------------------------------------------------------- */

Test(args, numbers_whole_and_in_range) {
    int64_t v = 7;
    cr_expect(args_int("p", "--n", "12", 1, 100, &v) && v == 12);
    cr_expect(!args_int("p", "--n", "12x", 1, 100, &v) && v == 12);
    cr_expect(!args_int("p", "--n", "", 1, 100, &v));
    cr_expect(!args_int("p", "--n", "-1", 0, 100, &v));
    cr_expect(!args_int("p", "--n", "101", 0, 100, &v));
    cr_expect(!args_int("p", "--n", "99999999999999999999", 0, INT64_MAX, &v));
    double d = 0;
    cr_expect(args_double("p", "--lr", "1e-3", 0, 1, &d) && d == 1e-3);
    cr_expect(!args_double("p", "--lr", "nan", -1e300, 1e300, &d));
    cr_expect(!args_double("p", "--lr", "1e999", -1e300, 1e300, &d));
    cr_expect(!args_double("p", "--lr", "0.1.", 0, 1, &d));
    const char *names[] = {"copy", "shift"};
    cr_expect_eq(args_choice("p", "--task", "shift", names, 2), 1);
    cr_expect_eq(args_choice("p", "--task", "Shift", names, 2), -1);
}

/* ---- copy_load's refusals ------------------------------------------------------------------------- */

static void tmp_path(char *buf, size_t size, const char *name) {
    snprintf(buf, size, "/tmp/qkv-test-examples-%ld-%s", (long)getpid(), name);
}

Test(copy_load, names_the_differing_flags) {
    copy_config c = copy_default_config();
    c.steps = 4;
    copy_model m, other;
    char err[1024], path[128];
    tmp_path(path, sizeof path, "cfg.safetensors");
    cr_assert(copy_model_init(&m, &c, err, sizeof err), "%s", err);
    cr_assert(copy_save(&m, path, err, sizeof err), "%s", err);
    copy_config o = c;
    o.task = TASK_COPY, o.optimizer = QKV_OPTIM_SGD, o.clip = 1.5;
    cr_assert(copy_model_init(&other, &o, err, sizeof err), "%s", err);
    cr_expect(!copy_load(&other, path, err, sizeof err));
    cr_expect(strstr(err, "--task: checkpoint has reverse, flags say copy"), "%s", err);
    cr_expect(strstr(err, "--optimizer: checkpoint has adam, flags say sgd"), "%s", err);
    cr_expect(strstr(err, "--clip: checkpoint has off, flags say 1.5"), "%s", err);
    cr_expect(!strstr(err, "--lr"), "lr does not differ: %s", err);
    copy_model_free(&other);
    copy_model_free(&m);
    unlink(path);
}

Test(copy_load, refuses_a_non_finite_tensor_by_name) {
    copy_config c = copy_default_config();
    copy_model m, back;
    char err[1024], path[128];
    tmp_path(path, sizeof path, "nan.safetensors");
    cr_assert(copy_model_init(&m, &c, err, sizeof err), "%s", err);
    for (int i = 0; i < 3; i++) cr_assert(copy_train_step(&m, NULL));
    qkv_f32(m.wk)[5] = NAN; /* a damaged file, or a run saved after it diverged */
    cr_assert(copy_save(&m, path, err, sizeof err), "%s", err);
    cr_assert(copy_model_init(&back, &c, err, sizeof err), "%s", err);
    cr_expect(!copy_load(&back, path, err, sizeof err), "a NaN weight was loaded");
    cr_expect(strstr(err, "tensor wk") && strstr(err, "non-finite") && strstr(err, "element 5"), "%s", err);
    cr_expect(!strstr(err, "clip"), "%s", err);
    copy_model_free(&back);
    copy_model_free(&m);
    unlink(path);
}
