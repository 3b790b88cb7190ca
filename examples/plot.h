/*
 * plot.h — small, dependency-free pictures for the examples: heat maps in the terminal and as SVG, and
 * line charts as SVG. SVG because any browser opens it and it needs no library to write.
 */
#ifndef QKV_EXAMPLES_PLOT_H
#define QKV_EXAMPLES_PLOT_H

#include <stdbool.h>
#include <stdio.h>

/* values: rows x cols, row-major, each in [0, 1]. color: ANSI 256-colour blocks (for a terminal),
 * otherwise an ASCII ramp " .:-=+*#%@". */
void plot_heatmap_text(FILE *out, const double *values, int rows, int cols, bool color);

/* Write an SVG heat map with a colour bar; returns false (errno set) if the file cannot be written. */
bool plot_heatmap_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const double *values, int rows, int cols);

typedef struct plot_series {
    const char *name;
    const double *x, *y; /* n points; a NaN y leaves a gap */
    int n;
} plot_series;

/* An SVG line chart of several series. log_x / log_y: logarithmic axes (non-positive values skipped). */
bool plot_lines_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                    const plot_series *series, int n_series, bool log_x, bool log_y);

/* How one series is drawn: color (an SVG colour, NULL for the palette's) and dash (an SVG
 * stroke-dasharray such as "6 3", NULL for a solid line). */
typedef struct plot_style {
    const char *color, *dash;
} plot_style;

/* plot_lines_svg with a style per series (n_series entries; styles NULL is plot_lines_svg). */
bool plot_lines_styled_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                           const plot_series *series, int n_series, bool log_x, bool log_y,
                           const plot_style *styles);

#endif
