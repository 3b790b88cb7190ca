/*
 * bench/bandwidth.c — this machine's single-thread memory bandwidth by working-set size (bench/bandwidth.h):
 * the stream b[i] = a[i] * c, 8 bytes an element (4 read, 4 written), CPU time, median of 5 samples.
 * The caches' plateaus and DRAM's are what bench/attention_skinny.c's memory floors divide by.
 * Prints figures, asserts nothing.
 *
 *   build/bench/bandwidth          the table, 16 KiB .. 256 MiB
 *   build/bench/bandwidth --tsv    one line per size: "bandwidth <bytes> <bytes per second>"
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bandwidth.h"

int main(int argc, char **argv) {
    bool tsv = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tsv")) tsv = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bandwidth [--tsv]\nSingle-thread stream bandwidth (b = c a, read + write) by working "
                   "set, CPU time.\n");
            return 0;
        } else {
            fprintf(stderr, "bandwidth: unknown flag '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (!tsv) printf("%12s %10s\n", "working set", "GB/s");
    for (size_t kib = 16; kib <= 256 * 1024; kib *= 2) {
        double bw = bench_bandwidth(kib * 1024);
        if (tsv) printf("bandwidth\t%zu\t%.6g\n", kib * 1024, bw);
        else if (kib < 1024) printf("%8zu KiB %10.2f\n", kib, bw * 1e-9);
        else printf("%8zu MiB %10.2f\n", kib / 1024, bw * 1e-9);
    }
    return 0;
}
