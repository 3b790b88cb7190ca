/*
 * plot_heatmap.c — a grid of heat maps in one SVG (plot_heatmap.h).
 */
#include "plot.h"
#include "plot_heatmap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "atomic_file.h"


bool plot_heatmap_grid_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                           const plot_panel *panels, int n_panels, int grid_cols, int rows, int cols,
                           const int *guides, int n_guides) {
    if (!path || !panels || n_panels < 1 || grid_cols < 1 || rows < 1 || cols < 1) {
        errno = EINVAL;
        return false;
    }
    if (grid_cols > n_panels) grid_cols = n_panels;
    int grid_rows = (n_panels + grid_cols - 1) / grid_cols;
    int side = rows > cols ? rows : cols;
    // a cell of up to 12 px for attention patterns; a small table (layers x heads, say) gets larger cells
    double cell = side <= 8 ? 40.0 : fmax(3.0, fmin(12.0, 260.0 / side));
    double pw = cols * cell, ph = rows * cell;        /* one panel */
    double gap_x = 50, gap_y = 70, left = 60, top = 60; /* room for ticks, labels and panel titles */
    double width = left + grid_cols * pw + (grid_cols - 1) * gap_x + 90;
    double height = top + grid_rows * ph + (grid_rows - 1) * gap_y + 60;
    if (title && width < 9.0 * (double)strlen(title) + 40) width = 9.0 * (double)strlen(title) + 40;
    atomic_file file;
    FILE *f = atomic_open(&file, path);
    if (!f) return false;
    char fill[32], label[32];
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    if (title) plot_svg_text(f, width / 2, 26, "middle", 16, title, 0);
    int tick = side > 16 ? (side + 7) / 8 : 1;
    for (int p = 0; p < n_panels; p++) {
        double x0 = left + (p % grid_cols) * (pw + gap_x), y0 = top + (p / grid_cols) * (ph + gap_y);
        if (panels[p].title) plot_svg_text(f, x0 + pw / 2, y0 - 8, "middle", 12, panels[p].title, 0);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                double v = panels[p].values ? panels[p].values[(size_t)i * (size_t)cols + (size_t)j] : NAN;
                if (!(v > 0)) continue; /* white on white: leave the cell out */
                plot_heat_color(v, fill, sizeof fill);
                fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%d,%d: %.4f"
                        "</title></rect>\n", x0 + j * cell, y0 + i * cell, cell + 0.05, cell + 0.05, fill, i, j, v);
            }
        for (int g = 0; g < n_guides && guides; g++) {
            int guide = guides[g];
            if (guide < 0 || guide >= rows || guide >= cols) continue;
            fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-width=\"0.8\"/>\n",
                    x0 + guide * cell, y0, x0 + guide * cell, y0 + ph);
            fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-width=\"0.8\"/>\n",
                    x0, y0 + guide * cell, x0 + pw, y0 + guide * cell);
        }
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", x0,
                y0, pw, ph);
        for (int i = 0; i < rows; i += tick) {
            snprintf(label, sizeof label, "%d", i);
            plot_svg_text(f, x0 - 4, y0 + (i + 0.5) * cell + 3, "end", 9, label, 0);
        }
        for (int j = 0; j < cols; j += tick) {
            snprintf(label, sizeof label, "%d", j);
            plot_svg_text(f, x0 + (j + 0.5) * cell, y0 + ph + 12, "middle", 9, label, 0);
        }
        if (x_label) plot_svg_text(f, x0 + pw / 2, y0 + ph + 28, "middle", 11, x_label, 0);
        if (y_label && p % grid_cols == 0) plot_svg_text(f, x0 - 34, y0 + ph / 2, "middle", 11, y_label, -90);
    }
    /* one colour bar 0 .. 1 for every panel */
    double bx = width - 60, bh = ph;
    for (int k = 0; k < 50; k++) {
        plot_heat_color(1.0 - k / 49.0, fill, sizeof fill);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"%.2f\" fill=\"%s\"/>\n", bx, top + k * bh / 50,
                bh / 50 + 0.5, fill);
    }
    plot_svg_text(f, bx + 20, top + 10, "start", 11, "1", 0);
    plot_svg_text(f, bx + 20, top + bh, "start", 11, "0", 0);
    fprintf(f, "</svg>\n");
    return atomic_commit(&file);
}
