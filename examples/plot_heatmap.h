/*
 * plot_heatmap.h — a grid of heat maps in one SVG (one panel per attention head, say), in the style of
 * plot.h's single heat map: white (0) to dark blue (1), a shared colour bar, every cell's value in its
 * tooltip. Written atomically (atomic_file.h).
 */
#ifndef QKV_EXAMPLES_PLOT_HEATMAP_H
#define QKV_EXAMPLES_PLOT_HEATMAP_H

#include <stdbool.h>

typedef struct plot_panel {
    const char *title;     /* above the panel ("layer 1 head 0")                                   */
    const double *values;  /* rows x cols, row-major, each in [0, 1] (clamped; NaN drawn as 0)        */
} plot_panel;

/* n_panels panels of rows x cols cells each, grid_cols panels a row. x_label / y_label name the axes of
 * every panel. guides[0 .. n_guides-1]: thin red lines before those columns and above those rows of every
 * panel (where a segment starts and where its repeat starts, say). Returns false (errno set) if the file
 * cannot be written; any old file is then left as it was. */
bool plot_heatmap_grid_svg(const char *path, const char *title, const char *x_label, const char *y_label,
                           const plot_panel *panels, int n_panels, int grid_cols, int rows, int cols,
                           const int *guides, int n_guides);

#endif
