/*
 * test_files.h — what the file-format tests share: a temporary directory per test, paths in it, a count of
 * leftover temporary files (the atomic writer's "<target>.tmp.<pid>.<n>"), and reading a whole file.
 */
#ifndef QKV_TEST_FILES_H
#define QKV_TEST_FILES_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tmpdir {
    char path[64];
} tmpdir;

/* A fresh directory /tmp/qkv_<tag>_XXXXXX (tag at most 16 characters). */
static inline tmpdir make_tmpdir_tagged(const char *tag) {
    tmpdir d;
    snprintf(d.path, sizeof d.path, "/tmp/qkv_%.16s_XXXXXX", tag);
    cr_assert_not_null(mkdtemp(d.path), "mkdtemp: %s", strerror(errno));
    return d;
}

static inline char *in_dir(const tmpdir *d, const char *name) {
    static char buf[4][128];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", d->path, name);
    return b;
}

/* Entries of the directory whose name contains ".tmp." (leftover temporary files). */
static inline int count_tmp_files(const tmpdir *d) {
    DIR *dir = opendir(d->path);
    cr_assert_not_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(dir);
    return n;
}

static inline void remove_tmpdir(const tmpdir *d) {
    DIR *dir = opendir(d->path);
    if (!dir) return;
    for (struct dirent *e; (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s", d->path, e->d_name);
            unlink(p);
        }
    }
    closedir(dir);
    rmdir(d->path);
}

static inline unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

#endif
