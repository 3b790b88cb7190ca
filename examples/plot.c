/*
 * plot.c — heat maps (terminal and SVG) and line charts (SVG) for the examples.
 */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "atomic_file.h"

static double clamp01(double v) { return v != v ? 0 : v < 0 ? 0 : v > 1 ? 1 : v; }

void plot_heatmap_text(FILE *out, const double *values, int rows, int cols, bool color) {
    static const char ramp[] = " .:-=+*#%@";
    /* the 24 grey levels of the 256-colour palette, from dark (232) to light (255) */
    for (int i = 0; i < rows; i++) {
        fprintf(out, "  %3d ", i);
        for (int j = 0; j < cols; j++) {
            double v = clamp01(values[i * cols + j]);
            if (color) fprintf(out, "\x1b[48;5;%dm  ", 232 + (int)lround(v * 23));
            else fprintf(out, "%c%c", ramp[(int)lround(v * 9)], ramp[(int)lround(v * 9)]);
        }
        fprintf(out, color ? "\x1b[0m\n" : "\n");
    }
}

void plot_heat_color(double v, char *buf, size_t size) {
    v = clamp01(v);
    int r = (int)lround(255 - v * (255 - 8)), g = (int)lround(255 - v * (255 - 48)), b = (int)lround(255 - v * (255 - 107));
    snprintf(buf, size, "rgb(%d,%d,%d)", r, g, b);
}

void plot_svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *text, double rotate) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-family=\"sans-serif\" font-size=\"%d\"", x, y,
            anchor, size);
    if (rotate != 0) fprintf(f, " transform=\"rotate(%.0f %.1f %.1f)\"", rotate, x, y);
    fputc('>', f);
    for (const char *c = text; *c; c++) { /* escape XML */
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '>') fputs("&gt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else fputc(*c, f);
    }
    fputs("</text>\n", f);
}

/* ---- ticks ---------------------------------------------------------------------------------------- */

/* m * 10^e, computed so that decimal ticks come out as the nearest double (0.3, not 0.30000000000000004). */
static double decimal(double m, int e) { return e >= 0 ? m * pow(10, e) : m / pow(10, -e); }

/* Linear: steps of m * 10^e, m in 1, 2, 5; the smallest such step that needs at most max_ticks ticks and
 * not much more than five intervals. */
static int linear_ticks(double lo, double hi, double *ticks, int max_ticks) {
    static const double M[] = {1, 2, 5};
    int e = (int)floor(log10((hi - lo) / 5)) - 1;
    for (int tries = 0; tries < 12; tries++, e++)
        for (int k = 0; k < 3; k++) {
            double step = decimal(M[k], e);
            double first = floor(lo / step * (1 + 1e-12)), last = ceil(hi / step * (1 - 1e-12));
            if (lo / step < 0) first = floor(lo / step * (1 - 1e-12));
            if (hi / step < 0) last = ceil(hi / step * (1 + 1e-12));
            int count = (int)(last - first) + 1;
            if (count > max_ticks || last - first > 6) continue;
            for (int i = 0; i < count; i++) {
                double t = decimal(M[k] * (first + i), e);
                ticks[i] = t == 0 ? 0 : t; /* no "-0" */
            }
            return count;
        }
    return 0;
}

static int log_ticks(double lo, double hi, double *ticks, int max_ticks) {
    double l0 = log10(lo), l1 = log10(hi);
    int e0 = (int)floor(l0 + 1e-12), e1 = (int)ceil(l1 - 1e-12);
    if (e1 == e0) e1++;
    int count = 0;
    if (l1 - l0 < 2) { /* 1, 2, 5 times the powers of ten: from the one at or below lo to the one at or above hi */
        static const double M[] = {1, 2, 5};
        double below = decimal(1, e0), above = decimal(1, e1);
        for (int e = e0; e <= e1; e++)
            for (int k = 0; k < 3; k++) {
                double t = decimal(M[k], e);
                if (t <= lo * (1 + 1e-12)) below = t;
                if (t >= hi * (1 - 1e-12) && t < above) above = t;
            }
        for (int e = e0; e <= e1 && count < max_ticks; e++)
            for (int k = 0; k < 3 && count < max_ticks; k++) {
                double t = decimal(M[k], e);
                if (t >= below && t <= above) ticks[count++] = t;
            }
        return count;
    }
    int stride = 1;
    while ((e1 - e0 + stride - 1) / stride + 1 > max_ticks) stride++;
    e1 = e0 + (e1 - e0 + stride - 1) / stride * stride;
    for (int e = e0; e <= e1; e += stride) ticks[count++] = decimal(1, e);
    return count;
}

int plot_ticks(double lo, double hi, bool log_scale, double *ticks, int max_ticks) {
    if (!isfinite(lo) || !isfinite(hi) || max_ticks < 6 || (log_scale && !(lo > 0))) return 0;
    if (hi < lo) {
        double t = lo;
        lo = hi, hi = t;
    }
    if (log_scale) {
        if (hi == lo) lo /= 2, hi *= 2;
        return log_ticks(lo, hi, ticks, max_ticks);
    }
    if (hi == lo) {
        double pad = lo == 0 ? 1 : fabs(lo) / 10;
        lo -= pad, hi += pad;
    }
    return linear_ticks(lo, hi, ticks, max_ticks);
}

int plot_axis(double lo, double hi, bool log_scale, double *ticks, int max_ticks, double *axis_lo, double *axis_hi) {
    int n = plot_ticks(lo, hi, log_scale, ticks, max_ticks);
    if (n < 2) return n;
    *axis_lo = ticks[0], *axis_hi = ticks[n - 1];
    if (!log_scale) return n;
    if (hi < lo) {
        double t = lo;
        lo = hi, hi = t;
    }
    /* the data's range in decades, widened by 4% of its span (at least 0.05 decade) at each end */
    double l0 = log10(lo), l1 = log10(hi), pad = fmax(0.04 * (l1 - l0), 0.05);
    double a0 = l0 - pad, a1 = l1 + pad;
    int inside = 0;
    for (int i = 0; i < n; i++) {
        double l = log10(ticks[i]);
        if (l >= a0 - 1e-12 && l <= a1 + 1e-12) ticks[inside++] = ticks[i];
    }
    if (inside < 2) return plot_ticks(lo, hi, true, ticks, max_ticks); /* too narrow: tick to tick */
    *axis_lo = pow(10, a0), *axis_hi = pow(10, a1);
    return inside;
}

void plot_tick_label(double value, double step, bool log_scale, char *buf, size_t size) {
    if (value == 0) {
        snprintf(buf, size, "0");
        return;
    }
    if (log_scale) {
        int e = (int)floor(log10(value) + 1e-9);
        double m = value / pow(10, e);
        if (e >= -4 && e <= 5) snprintf(buf, size, "%.*f", e < 0 ? -e : 0, value);
        else snprintf(buf, size, "%.0fe%d", m, e);
        return;
    }
    double a = fabs(value);
    if (a >= 1e6 || (step > 0 && step < 1e-4)) {
        snprintf(buf, size, "%g", value);
        return;
    }
    int decimals = step > 0 ? (int)ceil(-log10(step) - 1e-9) : 3;
    snprintf(buf, size, "%.*f", decimals > 0 ? decimals : 0, value);
}

/* ---- files ---------------------------------------------------------------------------------------- */

static FILE *begin(atomic_file *a, const char *path) { return atomic_open(a, path); }

static bool finish(atomic_file *a) { return atomic_commit(a); }

bool plot_heatmap_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const double *values, int rows, int cols) {
    atomic_file file;
    FILE *f = begin(&file, path);
    if (!f) return false;
    double cell = fmax(12.0, fmin(40.0, 480.0 / (rows > cols ? rows : cols)));
    double left = 70, top = 50, w = cols * cell, h = rows * cell;
    double width = fmax(left + w + 100, 9.0 * (double)strlen(title) + 40), height = top + h + 60;
    char fill[32];
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    plot_svg_text(f, width / 2, 28, "middle", 16, title, 0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            plot_heat_color(values[i * cols + j], fill, sizeof fill);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%d,%d: %.4f</title></rect>\n",
                    left + j * cell, top + i * cell, cell, cell, fill, i, j, values[i * cols + j]);
        }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", left,
            top, w, h);
    char label[32];
    int step = rows > 16 ? (rows + 15) / 16 : 1;
    for (int i = 0; i < rows; i += step) {
        snprintf(label, sizeof label, "%d", i);
        plot_svg_text(f, left - 6, top + (i + 0.5) * cell + 4, "end", 11, label, 0);
    }
    step = cols > 16 ? (cols + 15) / 16 : 1;
    for (int j = 0; j < cols; j += step) {
        snprintf(label, sizeof label, "%d", j);
        plot_svg_text(f, left + (j + 0.5) * cell, top + h + 16, "middle", 11, label, 0);
    }
    plot_svg_text(f, left + w / 2, top + h + 40, "middle", 13, x_label, 0);
    plot_svg_text(f, 22, top + h / 2, "middle", 13, y_label, -90);
    /* colour bar 0 .. 1 */
    double bx = left + w + 30, bh = h;
    for (int k = 0; k < 50; k++) {
        plot_heat_color(1.0 - k / 49.0, fill, sizeof fill);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"%.2f\" fill=\"%s\"/>\n", bx, top + k * bh / 50,
                bh / 50 + 0.5, fill);
    }
    plot_svg_text(f, bx + 22, top + 10, "start", 11, "1", 0);
    plot_svg_text(f, bx + 22, top + bh, "start", 11, "0", 0);
    fprintf(f, "</svg>\n");
    return finish(&file);
}

static const char *const PALETTE[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

static double axis_value(double v, bool log_scale) { return log_scale ? (v > 0 ? log10(v) : NAN) : v; }

/* The mark of a point at (x, y), radius r, outlined in white so that marks on top of each other stay apart. */
#define OUTLINE " stroke=\"white\" stroke-width=\"0.8\""
static void marker_svg(FILE *f, plot_marker marker, double x, double y, double r, const char *color) {
    switch (marker) {
    case PLOT_MARKER_NONE: break;
    case PLOT_MARKER_SQUARE:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"%s/>\n", x - r, y - r, 2 * r,
                2 * r, color, OUTLINE);
        break;
    case PLOT_MARKER_TRIANGLE:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"%s/>\n", x, y - 1.25 * r, x + 1.15 * r,
                y + 0.75 * r, x - 1.15 * r, y + 0.75 * r, color, OUTLINE);
        break;
    case PLOT_MARKER_DIAMOND:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"%s/>\n", x, y - 1.3 * r, x + 1.3 * r,
                y, x, y + 1.3 * r, x - 1.3 * r, y, color, OUTLINE);
        break;
    default: fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"%s/>\n", x, y, r, color, OUTLINE);
    }
}

enum { MAX_TICKS = 12 };

/* The data's range on one axis (data units; positive values only on a log axis); false if none. */
static bool data_range(const plot_series *series, int n_series, bool use_x, bool log_scale, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int s = 0; s < n_series; s++)
        for (int i = 0; i < series[s].n; i++) {
            double v = use_x ? series[s].x[i] : series[s].y[i];
            double other = use_x ? series[s].y[i] : series[s].x[i];
            if (!isfinite(v) || !isfinite(other) || (log_scale && !(v > 0))) continue;
            *lo = fmin(*lo, v), *hi = fmax(*hi, v);
        }
    return *lo <= *hi;
}

/* Ticks for one axis and its extent [*a0, *a1] in axis units (log10 on a log axis): plot_axis over the data. */
static int axis_ticks(const plot_series *series, int n_series, bool use_x, bool log_scale, double *ticks, double *a0,
                      double *a1) {
    double lo, hi, axis_lo = 0, axis_hi = 0;
    if (!data_range(series, n_series, use_x, log_scale, &lo, &hi)) lo = log_scale ? 1 : 0, hi = log_scale ? 10 : 1;
    int n = plot_axis(lo, hi, log_scale, ticks, MAX_TICKS, &axis_lo, &axis_hi);
    if (n < 2) {
        ticks[0] = axis_lo = log_scale ? 1 : 0, ticks[1] = axis_hi = log_scale ? 10 : 1, n = 2;
    }
    *a0 = axis_value(axis_lo, log_scale), *a1 = axis_value(axis_hi, log_scale);
    return n;
}

/* The line chart behind plot_lines_svg and plot_lines_styled_svg; styles NULL: palette colours, solid. */
static bool lines_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const plot_series *series, int n_series, bool log_x, bool log_y, const plot_style *styles) {
    double xt[MAX_TICKS], yt[MAX_TICKS];
    double x0, x1, y0, y1;
    int nx = axis_ticks(series, n_series, true, log_x, xt, &x0, &x1);
    int ny = axis_ticks(series, n_series, false, log_y, yt, &y0, &y1);
    atomic_file file;
    FILE *f = begin(&file, path);
    if (!f) return false;
    double left = 80, top = 50, w = 560, h = 340;
    double legend_h = top + 20.0 * n_series + 20;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", left + w + 210,
            fmax(top + h + 70, legend_h));
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    plot_svg_text(f, left + w / 2, 28, "middle", 16, title, 0);
    char label[48];
    for (int k = 0; k < nx; k++) {
        double px = left + w * (axis_value(xt[k], log_x) - x0) / (x1 - x0);
        plot_tick_label(xt[k], nx > 1 ? xt[1] - xt[0] : 0, log_x, label, sizeof label);
        plot_svg_text(f, px, top + h + 16, "middle", 11, label, 0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/>\n", px, top, px, top + h);
    }
    for (int k = 0; k < ny; k++) {
        double py = top + h - h * (axis_value(yt[k], log_y) - y0) / (y1 - y0);
        plot_tick_label(yt[k], ny > 1 ? yt[1] - yt[0] : 0, log_y, label, sizeof label);
        plot_svg_text(f, left - 6, py + 4, "end", 11, label, 0);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, py, left + w, py);
    }
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", left, top, w, h);
    plot_svg_text(f, left + w / 2, top + h + 42, "middle", 13, x_label, 0);
    plot_svg_text(f, 20, top + h / 2, "middle", 13, y_label, -90);
    /* Measurements first, then the references (no markers) over them, dashed, so both show. The measurements
     * are drawn in order, each a little thinner and with smaller marks than the one before (from 3.2 down
     * to 1.4 pixels, marks from 4.6 down to 3), so a line that lies exactly on an earlier one leaves that one
     * showing on both sides: no series is ever fully hidden. The legend uses each series' own width and mark. */
    int measured = 0, rank = 0;
    for (int s = 0; s < n_series; s++) measured += !styles || styles[s].marker != PLOT_MARKER_NONE;
    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < n_series; s++) {
            const char *color = styles && styles[s].color ? styles[s].color : PALETTE[s % 8];
            const char *dash = styles ? styles[s].dash : NULL;
            plot_marker marker = styles ? styles[s].marker : PLOT_MARKER_CIRCLE;
            if ((marker == PLOT_MARKER_NONE) != (pass == 1)) continue;
            double depth = pass == 0 && measured > 1 ? (double)rank++ / (measured - 1) : 0.5; /* 0 first .. 1 last */
            double width = pass ? 1.5 : 3.2 - 1.8 * depth, radius = 4.6 - 1.6 * depth;
            char dash_attr[64] = "";
            if (dash) snprintf(dash_attr, sizeof dash_attr, " stroke-dasharray=\"%s\"", dash);
            bool pen_down = false;
            fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"%.2f\"%s d=\"", color, width, dash_attr);
            for (int i = 0; i < series[s].n; i++) {
                double x = axis_value(series[s].x[i], log_x), y = axis_value(series[s].y[i], log_y);
                if (!isfinite(x) || !isfinite(y)) {
                    pen_down = false;
                    continue;
                }
                fprintf(f, "%c%.1f %.1f ", pen_down ? 'L' : 'M', left + w * (x - x0) / (x1 - x0),
                        top + h - h * (y - y0) / (y1 - y0));
                pen_down = true;
            }
            fprintf(f, "\"/>\n");
            int every = series[s].n > 12 ? (series[s].n + 11) / 12 : 1;
            for (int i = s % every; i < series[s].n; i += every) {
                double x = axis_value(series[s].x[i], log_x), y = axis_value(series[s].y[i], log_y);
                if (isfinite(x) && isfinite(y))
                    marker_svg(f, marker, left + w * (x - x0) / (x1 - x0), top + h - h * (y - y0) / (y1 - y0), radius,
                               color);
            }
            double ly = top + 10 + s * 20.0;
            fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"%.2f\"%s/>\n",
                    left + w + 15, ly, left + w + 45, ly, color, width, dash_attr);
            marker_svg(f, marker, left + w + 30, ly, radius, color);
            plot_svg_text(f, left + w + 52, ly + 4, "start", 12, series[s].name, 0);
        }
    fprintf(f, "</svg>\n");
    return finish(&file);
}

bool plot_lines_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                    const plot_series *series, int n_series, bool log_x, bool log_y) {
    return lines_svg(path, title, x_label, y_label, series, n_series, log_x, log_y, NULL);
}

bool plot_lines_styled_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                           const plot_series *series, int n_series, bool log_x, bool log_y,
                           const plot_style *styles) {
    return lines_svg(path, title, x_label, y_label, series, n_series, log_x, log_y, styles);
}
