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
/* The shared SVG pieces: a heat-map colour for v in [0, 1] (white to dark blue; NaN as 0) as "rgb(r,g,b)", and a
 * text element at (x, y) with the given anchor ("start", "middle", "end"), font size and rotation, XML-escaped. */
void plot_heat_color(double v, char *buf, size_t size);
void plot_svg_text(FILE *f, double x, double y, const char *anchor, int size, const char *text, double rotate);

void plot_heatmap_text(FILE *out, const double *values, int rows, int cols, bool color);

/* Write an SVG heat map with a colour bar, atomically; returns false (errno set) if the file cannot be
 * written (any old file is then left as it was). */
bool plot_heatmap_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                      const double *values, int rows, int cols);

typedef struct plot_series {
    const char *name;
    const double *x, *y; /* n points; a NaN y leaves a gap */
    int n;
} plot_series;

/* An SVG line chart of several series with a legend. log_x / log_y: logarithmic axes (non-positive values
 * skipped). Each axis is plot_axis of the data: a linear one runs from one round tick to another around the
 * data, a log one over the data's decades only. Series are drawn in order, each a little thinner and with
 * smaller marks than the one before, so a series that lies on another never hides it; the legend shows each
 * series' colour, dash, width and mark. Written atomically (atomic_file.h): a failure leaves any old file as
 * it was. */
bool plot_lines_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                    const plot_series *series, int n_series, bool log_x, bool log_y);

/* The mark at each point of a series. The zero value is a circle, so a style that names none gets one. */
typedef enum { PLOT_MARKER_CIRCLE, PLOT_MARKER_NONE, PLOT_MARKER_SQUARE, PLOT_MARKER_TRIANGLE, PLOT_MARKER_DIAMOND } plot_marker;

/* How one series is drawn: color (an SVG colour, NULL for the palette's), dash (an SVG stroke-dasharray
 * such as "6 3", NULL for a solid line) and marker. Draw a reference (a formula, not a measurement) dashed
 * with PLOT_MARKER_NONE: such lines are drawn over the measured ones, whose marks show through the dashes. Markers are thinned to about 12 a series,
 * each series starting at another point, so curves that lie on each other still show all their marks. */
typedef struct plot_style {
    const char *color, *dash;
    plot_marker marker;
} plot_style;

/* plot_lines_svg with a style per series (n_series entries; styles NULL is plot_lines_svg). */
bool plot_lines_styled_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                           const plot_series *series, int n_series, bool log_x, bool log_y,
                           const plot_style *styles);

/* Round ticks that cover [lo, hi]: ticks[0] <= lo and ticks[count - 1] >= hi, 3 to max_ticks of them (max_ticks
 * >= 6 leaves room for every case). Linear: equal steps of 1, 2 or 5 times a power of ten, about five of them.
 * Log (lo > 0): powers of ten (every second or more when many decades would not fit), and 2 and 5 times
 * them when [lo, hi] spans under two decades. lo == hi gets a range around it. Returns the count, 0 for
 * a range that is not finite (or lo <= 0 on a log axis). */
int plot_ticks(double lo, double hi, bool log_scale, double *ticks, int max_ticks);

/* The extent [*axis_lo, *axis_hi] of an axis over the data [lo, hi], and its ticks (returns their count, 0 as
 * plot_ticks does). Linear: the ticks of plot_ticks, the axis from the first to the last. Log (lo > 0): the
 * axis is the data's range widened by 4% of its span in decades (at least 0.05 decade) at each end, so it draws
 * no decade without data (d_k from 2 to 1024 gets about 1.6 to 1300, not 1 to 10000), with the ticks of
 * plot_ticks that fall inside; when fewer than two do, the axis runs from tick to tick as a linear one. */
int plot_axis(double lo, double hi, bool log_scale, double *ticks, int max_ticks, double *axis_lo, double *axis_hi);

/* A tick's label with no more digits than the ticks need: 0.2, 1.5 (step 0.5), 1000, 0.001, 2e-05 -> "2e-5". */
void plot_tick_label(double value, double step, bool log_scale, char *buf, size_t size);

#endif
