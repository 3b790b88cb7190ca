/*
 * doc_quotes.h — the quick-run numbers a page of docs/ quotes, checked against a fresh quick run.
 *
 * A page marks the lines it copies from a quick run of an example program as a block:
 *
 *     <!-- quick-run NAME ISA: any explanation -->
 *         an indented line, exactly as the program printed it
 *         ...
 *     <!-- /quick-run NAME -->
 *
 * ISA (portable, avx2 or avx512: the widest kernel set qkv dispatches to on the CPU) says where the lines were
 * made: training is chaotic, so the last digits (and with them whole trajectories) depend on the rounding of
 * the kernels. (The compiler does not matter here: gcc 12 -O3, clang and the ASan+UBSan -O2 build gave the
 * quick runs of docs/scaling.md and docs/induction.md digit for digit on AVX2.) The test that
 * made the same quick run in-process (its tables printed into memory) calls doc_quotes_check: every line of
 * the block must be a line of that output, character for character, so every number the page quotes agrees
 * at the precision it is quoted. A CPU with another kernel set cannot reproduce them: the check then says so
 * and compares nothing, rather than fail on numbers it cannot reproduce.
 */
#ifndef QKV_TESTS_DOC_QUOTES_H
#define QKV_TESTS_DOC_QUOTES_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The widest kernel set the CPU offers (the library's dispatch picks the same: tensor/qkv_internal.h,
 * qkv_isa_best_). */
static const char *doc_quotes_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f")) return "avx512";
    if (avx2) return "avx2";
#endif
    return "portable";
}

/* The whole file, NUL-terminated, or NULL. */
static char *doc_quotes_read(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (cap - len < 2) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
        }
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

/* Is `line` (len characters, trailing blanks ignored) a whole line of `text` (trailing blanks ignored)? */
static bool doc_quotes_has_line(const char *text, const char *line, size_t len) {
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\r')) len--;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        size_t m = n;
        while (m && (p[m - 1] == ' ' || p[m - 1] == '\r')) m--;
        if (m == len && !memcmp(p, line, len)) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

/* Print the lines of `text` that start like `line` (its first `key` characters after the leading blanks), to
 * show what the fresh run says where the page differs. */
static void doc_quotes_show_fresh(const char *text, const char *line, size_t len) {
    while (len && *line == ' ') line++, len--;
    size_t key = len < 24 ? len : 24;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *q = p;
        while (q < p + n && *q == ' ') q++;
        if ((size_t)(p + n - q) >= key && !memcmp(q, line, key)) cr_log_error("   fresh run: %.*s", (int)n, p);
        if (!end) break;
        p = end + 1;
    }
}

/* Check the block NAME of the page at `page_path` against `fresh` (the quick run's printed output). Every
 * indented line of the block must be a line of `fresh`; returns the number of lines checked (the caller
 * expects at least the count the page should quote, so a block that lost its lines fails too). When the block
 * was made on another ISA it compares nothing, says so on stderr and returns -1 (the test's other
 * checks still count). */
static int doc_quotes_check(const char *page_path, const char *name, const char *fresh) {
    char *page = doc_quotes_read(page_path);
    cr_assert_not_null(page, "cannot read %s", page_path);
    char open[128], close[128];
    snprintf(open, sizeof open, "<!-- quick-run %s ", name);
    snprintf(close, sizeof close, "<!-- /quick-run %s -->", name);
    char *begin = strstr(page, open), *end = begin ? strstr(begin, close) : NULL;
    cr_assert(begin && end, "%s has no block <!-- quick-run %s ... --> ... %s", page_path, name, close);
    char isa[32] = "";
    cr_assert_eq(sscanf(begin + strlen(open), "%31[a-z0-9]", isa), 1, "%s: the block %s must name its ISA",
                 page_path, name);
    if (strcmp(isa, doc_quotes_isa())) {
        free(page);
        /* on stderr, which meson's log keeps: a Criterion warning would fail the run, and info is not shown */
        fprintf(stderr, "[INFO] not compared: %s quotes a quick run made with the %s kernels; this CPU runs the %s "
                "ones, whose rounding gives other trajectories\n", page_path, isa, doc_quotes_isa());
        return -1;
    }
    int checked = 0, wrong = 0;
    char *p = strchr(begin, '\n');
    for (p = p ? p + 1 : end; p < end;) {
        char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        if (n > 4 && !strncmp(p, "    ", 4)) { /* an indented line: quoted from the program */
            checked++;
            if (!doc_quotes_has_line(fresh, p + 4, n - 4)) {
                wrong++;
                cr_log_error("%s (%s) quotes a line the fresh quick run did not print:\n   page:      %.*s",
                             page_path, name, (int)(n - 4), p + 4);
                doc_quotes_show_fresh(fresh, p + 4, n - 4);
            }
        }
        if (!eol) break;
        p = eol + 1;
    }
    free(page);
    cr_expect_eq(wrong, 0, "%d of the %d lines %s quotes from the quick run (block %s) differ from a fresh run",
                 wrong, checked, page_path, name);
    return checked;
}

#endif
