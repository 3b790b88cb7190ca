/*
 * plot.c — heat maps (terminal and SVG) and line charts (SVG) for the examples.
 */
#include "plot.h"

#include <math.h>
#include <string.h>

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

/* White (0) to dark blue (1). */
static void color_of(double v, char *buf, size_t size) {
    v = clamp01(v);
    int r = (int)lround(255 - v * (255 - 8)), g = (int)lround(255 - v * (255 - 48)), b = (int)lround(255 - v * (255 - 107));
    snprintf(buf, size, "rgb(%d,%d,%d)", r, g, b);
}

static void svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *text, double rotate) {
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

static bool finish(FILE *f) {
    bool ok = !ferror(f);
    return fclose(f) == 0 && ok;
}

bool plot_heatmap_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const double *values, int rows, int cols) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    double cell = fmax(12.0, fmin(40.0, 480.0 / (rows > cols ? rows : cols)));
    double left = 70, top = 50, w = cols * cell, h = rows * cell;
    double width = fmax(left + w + 100, 9.0 * (double)strlen(title) + 40), height = top + h + 60;
    char fill[32];
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    svg_text(f, width / 2, 28, "middle", 16, title, 0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            color_of(values[i * cols + j], fill, sizeof fill);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%d,%d: %.4f</title></rect>\n",
                    left + j * cell, top + i * cell, cell, cell, fill, i, j, values[i * cols + j]);
        }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", left,
            top, w, h);
    char label[32];
    int step = rows > 16 ? (rows + 15) / 16 : 1;
    for (int i = 0; i < rows; i += step) {
        snprintf(label, sizeof label, "%d", i);
        svg_text(f, left - 6, top + (i + 0.5) * cell + 4, "end", 11, label, 0);
    }
    step = cols > 16 ? (cols + 15) / 16 : 1;
    for (int j = 0; j < cols; j += step) {
        snprintf(label, sizeof label, "%d", j);
        svg_text(f, left + (j + 0.5) * cell, top + h + 16, "middle", 11, label, 0);
    }
    svg_text(f, left + w / 2, top + h + 40, "middle", 13, x_label, 0);
    svg_text(f, 22, top + h / 2, "middle", 13, y_label, -90);
    /* colour bar 0 .. 1 */
    double bx = left + w + 30, bh = h;
    for (int k = 0; k < 50; k++) {
        color_of(1.0 - k / 49.0, fill, sizeof fill);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"%.2f\" fill=\"%s\"/>\n", bx, top + k * bh / 50,
                bh / 50 + 0.5, fill);
    }
    svg_text(f, bx + 22, top + 10, "start", 11, "1", 0);
    svg_text(f, bx + 22, top + bh, "start", 11, "0", 0);
    fprintf(f, "</svg>\n");
    return finish(f);
}

static const char *const PALETTE[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

static double axis_value(double v, bool log_scale) { return log_scale ? (v > 0 ? log10(v) : NAN) : v; }

/* The line chart behind plot_lines_svg and plot_lines_styled_svg; styles NULL: palette colours, solid. */
static bool lines_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const plot_series *series, int n_series, bool log_x, bool log_y, const plot_style *styles) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < n_series; s++)
        for (int i = 0; i < series[s].n; i++) {
            double x = axis_value(series[s].x[i], log_x), y = axis_value(series[s].y[i], log_y);
            if (!isfinite(x) || !isfinite(y)) continue;
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (!(x0 < x1)) x0 = isfinite(x0) ? x0 - 1 : 0, x1 = x0 + 2;
    if (!(y0 < y1)) y0 = isfinite(y0) ? y0 - 1 : 0, y1 = y0 + 2;
    FILE *f = fopen(path, "w");
    if (!f) return false;
    double left = 80, top = 50, w = 560, h = 340;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", left + w + 190, top + h + 70);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    svg_text(f, left + w / 2, 28, "middle", 16, title, 0);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", left, top, w, h);
    char label[48];
    for (int k = 0; k <= 5; k++) { /* ticks */
        double fx = x0 + (x1 - x0) * k / 5, fy = y0 + (y1 - y0) * k / 5;
        double px = left + w * k / 5, py = top + h - h * k / 5;
        snprintf(label, sizeof label, "%.3g", log_x ? pow(10, fx) : fx);
        svg_text(f, px, top + h + 16, "middle", 11, label, 0);
        snprintf(label, sizeof label, "%.3g", log_y ? pow(10, fy) : fy);
        svg_text(f, left - 6, py + 4, "end", 11, label, 0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/>\n", px, top, px, top + h);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, py, left + w, py);
    }
    svg_text(f, left + w / 2, top + h + 42, "middle", 13, x_label, 0);
    svg_text(f, 20, top + h / 2, "middle", 13, y_label, -90);
    for (int s = 0; s < n_series; s++) {
        const char *color = styles && styles[s].color ? styles[s].color : PALETTE[s % 8];
        const char *dash = styles ? styles[s].dash : NULL;
        char dash_attr[64] = "";
        if (dash) snprintf(dash_attr, sizeof dash_attr, " stroke-dasharray=\"%s\"", dash);
        bool pen_down = false;
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s d=\"", color, dash_attr);
        for (int i = 0; i < series[s].n; i++) {
            double x = axis_value(series[s].x[i], log_x), y = axis_value(series[s].y[i], log_y);
            if (!isfinite(x) || !isfinite(y)) {
                pen_down = false;
                continue;
            }
            fprintf(f, "%c%.1f %.1f ", pen_down ? 'L' : 'M', left + w * (x - x0) / (x1 - x0), top + h - h * (y - y0) / (y1 - y0));
            pen_down = true;
        }
        fprintf(f, "\"/>\n");
        for (int i = 0; i < series[s].n; i++) {
            double x = axis_value(series[s].x[i], log_x), y = axis_value(series[s].y[i], log_y);
            if (isfinite(x) && isfinite(y))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", left + w * (x - x0) / (x1 - x0),
                        top + h - h * (y - y0) / (y1 - y0), color);
        }
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"3\"%s/>\n",
                left + w + 15, top + 10 + s * 20.0, left + w + 40, top + 10 + s * 20.0, color, dash_attr);
        svg_text(f, left + w + 46, top + 14 + s * 20.0, "start", 12, series[s].name, 0);
    }
    fprintf(f, "</svg>\n");
    return finish(f);
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
