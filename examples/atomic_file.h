/*
 * atomic_file.h — how the examples write their SVG and CSV files: into a temporary file in the target's
 * folder, then fsync and rename over the target, so a reader (or a crash) sees the old file or the whole new
 * one, never half of it. The same steps as the library's checkpoint writer (tensor/fileio.c), for programs
 * that cannot call internal functions. Only a missing path or a regular file (also behind a symlink) is
 * replaced: a folder there fails with EISDIR, a FIFO, device or socket with EEXIST, and it is left as it was.
 * Also the folder those files go in (make_out_dir).
 *
 *   atomic_file a;
 *   FILE *f = atomic_open(&a, "plot.svg");
 *   if (!f) ... errno says why
 *   fprintf(f, ...);
 *   if (!atomic_commit(&a)) ... errno says why; the target is untouched and the temporary file removed
 */
#ifndef QKV_EXAMPLES_ATOMIC_FILE_H
#define QKV_EXAMPLES_ATOMIC_FILE_H

#include <stdbool.h>
#include <stdio.h>

typedef struct atomic_file {
    FILE *f;
    char path[4096], tmp[4096 + 32];
} atomic_file;

/* Create the temporary file beside path; returns the stream to write, or NULL with errno set. */
FILE *atomic_open(atomic_file *a, const char *path);
/* Flush, fsync, close, rename over the target and fsync its folder; false (errno set) if any step failed
 * or the stream had an error, and then the temporary file is removed. */
bool atomic_commit(atomic_file *a);
/* Give up: close and remove the temporary file, keep the target as it was. */
void atomic_abandon(atomic_file *a);

/* Make the output folder path (one level: its parent must exist); a folder already there is fine. false, with
 * "prog: ..." on stderr, when path is something else or cannot be made. */
bool make_out_dir(const char *prog, const char *path);

#endif
