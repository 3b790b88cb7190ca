/*
 * atomic_file.c — temporary file, write, fsync, rename, fsync the folder (atomic_file.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The target may be replaced: missing, or (through symlinks) a regular file. A folder is EISDIR; a FIFO,
 * device or socket EEXIST, so writing a plot to /dev/null or a FIFO never swaps it for a regular file. */
static bool replaceable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT;
    if (S_ISREG(st.st_mode)) return true;
    errno = S_ISDIR(st.st_mode) ? EISDIR : EEXIST;
    return false;
}

FILE *atomic_open(atomic_file *a, const char *path) {
    memset(a, 0, sizeof *a);
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof a->path) {
        errno = len ? ENAMETOOLONG : ENOENT;
        return NULL;
    }
    memcpy(a->path, path, len + 1);
    if (!replaceable(path)) return NULL;
    for (unsigned n = 0; n < 100; n++) { /* O_EXCL: never reuse a file someone else is writing */
        snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld.%u", path, (long)getpid(), n);
        int fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) break;
        if (!(a->f = fdopen(fd, "w"))) {
            int e = errno;
            close(fd);
            unlink(a->tmp);
            errno = e;
        }
        return a->f;
    }
    a->tmp[0] = '\0';
    return NULL;
}

void atomic_abandon(atomic_file *a) {
    int e = errno;
    if (a->f) fclose(a->f);
    if (a->tmp[0]) unlink(a->tmp);
    a->f = NULL;
    a->tmp[0] = '\0';
    errno = e;
}

/* fsync the folder that holds path, so the rename itself survives a crash. */
static bool sync_folder(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 0;
    if (!slash) memcpy(dir, ".", 2);
    else if (len == 0) memcpy(dir, "/", 2);
    else memcpy(dir, path, len), dir[len] = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0 || errno == EINVAL || errno == ENOTSUP; /* some file systems cannot */
    int e = errno;
    close(fd);
    errno = e;
    return ok;
}

bool atomic_commit(atomic_file *a) {
    if (!a->f) {
        errno = EBADF;
        return false;
    }
    errno = 0;
    bool ok = !ferror(a->f) && fflush(a->f) == 0 && fsync(fileno(a->f)) == 0;
    int e = ok ? 0 : errno ? errno : EIO;
    if (fclose(a->f) != 0 && !e) e = errno ? errno : EIO;
    a->f = NULL;
    if (!e && !replaceable(a->path)) e = errno; /* again: something may have appeared meanwhile */
    if (!e && rename(a->tmp, a->path) != 0) e = errno;
    if (e) {
        atomic_abandon(a); /* removes the temporary file; the target is as it was */
        errno = e;
        return false;
    }
    a->tmp[0] = '\0';
    return sync_folder(a->path);
}

bool make_out_dir(const char *prog, const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return true;
        fprintf(stderr, "%s: %s exists and is not a folder\n", prog, path);
        return false;
    }
    if (mkdir(path, 0777) != 0) {
        fprintf(stderr, "%s: cannot make %s: %s\n", prog, path, strerror(errno));
        return false;
    }
    return true;
}
