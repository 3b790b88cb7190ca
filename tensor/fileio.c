/*
 * fileio.c — the atomic file writer (temporary file, write, fsync, rename, fsync the directory) and
 * the bounded whole-file reader the .npy and safetensors code use. See fileio.h for the contract.
 */
#define _DEFAULT_SOURCE /* flock, gethostname, and the POSIX calls of _XOPEN_SOURCE 700 */
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fault injection ----------------------------------------------------------------------------- */

static ssize_t default_write(int fd, const void *buf, size_t count) { return write(fd, buf, count); }
static int default_fsync(int fd) { return fsync(fd); }
static int default_rename(const char *from, const char *to) { return rename(from, to); }

static qkv_fileio_hooks_ hooks = {default_write, default_fsync, default_rename};

void qkv_fileio_set_hooks_(const qkv_fileio_hooks_ *h) {
    hooks.write = h && h->write ? h->write : default_write;
    hooks.fsync = h && h->fsync ? h->fsync : default_fsync;
    hooks.rename = h && h->rename ? h->rename : default_rename;
}

/* ---- atomic writer ------------------------------------------------------------------------------- */

/* What st describes, for messages: "a FIFO", "a character device", ... */
static const char *kind_of(const struct stat *st) {
    if (S_ISDIR(st->st_mode)) return "a directory";
    if (S_ISFIFO(st->st_mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(st->st_mode)) return "a character device";
    if (S_ISBLK(st->st_mode)) return "a block device";
    if (S_ISSOCK(st->st_mode)) return "a socket";
    return "not a regular file";
}


static void release(qkv_writer_ *w, bool remove_tmp) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp) {
        if (remove_tmp) unlink(w->tmp);
        qkv_raw_free_(w->ctx, w->tmp);
        w->tmp = NULL;
    }
}

/* The target may be replaced: it is missing (or a dangling symlink) or, through any symlinks, a
 * regular file. A device, FIFO, socket or directory there is refused, so a save to /dev/null or a
 * FIFO never swaps it for a regular file. */
static bool target_replaceable(qkv_ctx *ctx, const char *fn, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return true;
        int err = errno;
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot stat the target: %s", fn, path, strerror(err)),
               false;
    }
    if (S_ISREG(st.st_mode)) return true;
    return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: the target is %s; qkv replaces only regular files", fn,
                     path, kind_of(&st)),
           false;
}

/* Store "fn: path: what: strerror(errno)" and mark the writer failed. */
static bool writer_fail(qkv_writer_ *w, const char *what, int err) {
    qkv_fail_(w->ctx, QKV_ERR_IO, "%s: %s: %s: %s", w->fn, w->path, what, strerror(err));
    w->failed = true;
    return false;
}

/* This machine's name as it goes into a temporary file's name: gethostname, with '/' and '.' made '_' (so the
 * name stays one path component and its fields split at dots), "host" if it has none. */
static void host_tag(char *buf, size_t size) {
    if (gethostname(buf, size) != 0 || !buf[0]) snprintf(buf, size, "host");
    buf[size - 1] = '\0';
    for (char *c = buf; *c; c++)
        if (*c == '/' || *c == '.') *c = '_';
}

/* Remove what earlier saves of path left behind when their process died mid-save (a SIGKILL, a crash, a power
 * cut): files "<target>.tmp.<host>.<pid>.<n>" beside it whose host is this machine, whose pid is not a live
 * process (kill(pid, 0) says ESRCH; our own pid's are skipped, another thread may be saving) and on which no one
 * holds the lock a writer takes for as long as its file is open. A live writer's file is never touched: its pid is
 * alive, on this machine, and its lock is held; a file of another machine (a shared file system) is left alone.
 * Best effort: a directory that cannot be read is skipped, and nothing here fails a save. */
static void remove_stale_temporaries(const char *path) {
    char dir[4096], prefix[512], host[256], full[4096 + 512];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t dir_len = slash ? (size_t)(slash - path) : 1;
    if (dir_len >= sizeof dir) return;
    if (slash) memcpy(dir, path, dir_len), dir[dir_len] = '\0';
    else snprintf(dir, sizeof dir, ".");
    if (slash && dir_len == 0) snprintf(dir, sizeof dir, "/");
    host_tag(host, sizeof host);
    int plen = snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host);
    if (plen < 0 || (size_t)plen >= sizeof prefix) return;
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
        // the rest is "<pid>.<n>", both decimal
        const char *rest = e->d_name + plen;
        char *end;
        errno = 0;
        long pid = strtol(rest, &end, 10);
        if (errno || end == rest || *end != '.' || pid <= 0 || end[1] < '0' || end[1] > '9') continue;
        strtoul(end + 1, &end, 10);
        if (*end || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask): leave it */
        int n = snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof full) continue;
        int fd = open(full, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) unlink(full);
        close(fd);
    }
    closedir(d);
}

bool qkv_writer_open_(qkv_ctx *ctx, qkv_writer_ *w, const char *fn, const char *path) {
    static unsigned counter; /* distinguishes temporary files of one process */
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->fn = fn;
    w->path = path;
    w->fd = -1;
    size_t len = strlen(path), bytes;
    if (len == 0 || path[len - 1] == '/') {
        qkv_fail_(ctx, QKV_ERR_ARG, "%s: \"%s\" names a directory, not a file", fn, path);
        w->failed = true;
        return false;
    }
    if (!target_replaceable(ctx, fn, path)) {
        w->failed = true;
        return false;
    }
    remove_stale_temporaries(path);
    char host[256];
    host_tag(host, sizeof host);
    if (!qkv_add_size_(len, 48 + strlen(host), &bytes) || !(w->tmp = qkv_raw_malloc_(ctx, bytes))) {
        qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory for the temporary file name", fn, path);
        w->failed = true;
        return false;
    }
    for (int attempt = 0; attempt < 64; attempt++) {
        unsigned n = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED);
        snprintf(w->tmp, bytes, "%s.tmp.%s.%ld.%u", path, host, (long)getpid(), n);
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0) {
            flock(w->fd, LOCK_EX | LOCK_NB); /* held while the file is open: what remove_stale_temporaries asks */
            return true;
        }
        if (errno != EEXIST) break; /* a stale file of a crashed process with our pid: try another */
    }
    int err = errno;
    qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot create the temporary file %s: %s", fn, path, w->tmp,
              strerror(err));
    w->failed = true;
    qkv_raw_free_(ctx, w->tmp);
    w->tmp = NULL;
    return false;
}

bool qkv_writer_write_(qkv_writer_ *w, const void *data, size_t size) {
    if (w->failed) return false;
    const unsigned char *p = data;
    while (size > 0) {
        /* at most 1 GiB per call: some systems refuse larger counts */
        size_t chunk = size < ((size_t)1 << 30) ? size : ((size_t)1 << 30);
        ssize_t n = hooks.write(w->fd, p, chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            return writer_fail(w, "write failed", errno);
        }
        if (n == 0) return writer_fail(w, "write made no progress", EIO);
        p += n;
        size -= (size_t)n;
    }
    return true;
}

void qkv_writer_abort_(qkv_writer_ *w) { release(w, true); }

/* The directory holding path: everything before the last '/', "/" for a file at the root, "." for
 * a bare name. */
static int open_parent_dir(qkv_writer_ *w) {
    const char *slash = strrchr(w->path, '/');
    if (!slash) return open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size_t len = slash == w->path ? 1 : (size_t)(slash - w->path);
    /* the temporary-name buffer is free now and longer than path: reuse it for the directory name */
    memcpy(w->tmp, w->path, len);
    w->tmp[len] = '\0';
    return open(w->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

qkv_status qkv_writer_commit_(qkv_writer_ *w) {
    if (w->failed) {
        release(w, true);
        return w->ctx->status;
    }
    if (hooks.fsync(w->fd) != 0) {
        writer_fail(w, "fsync of the temporary file failed", errno);
        release(w, true);
        return w->ctx->status;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        writer_fail(w, "close of the temporary file failed", errno);
        release(w, true);
        return w->ctx->status;
    }
    /* checked again: something may have been put at the target while the file was written */
    if (!target_replaceable(w->ctx, w->fn, w->path)) {
        w->failed = true;
        release(w, true);
        return w->ctx->status;
    }
    if (hooks.rename(w->tmp, w->path) != 0) {
        writer_fail(w, "rename of the temporary file over the target failed", errno);
        release(w, true);
        return w->ctx->status;
    }
    /* The new file is in place. Make the rename durable; file systems that cannot fsync a directory
     * say EINVAL (or ENOTSUP), which is not a failure. */
    int dfd = open_parent_dir(w);
    int err = 0;
    if (dfd < 0) {
        err = errno;
    } else {
        if (hooks.fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) err = errno;
        close(dfd);
    }
    release(w, false);
    if (err) {
        qkv_fail_(w->ctx, QKV_ERR_IO, "%s: %s: written, but fsync of its directory failed: %s", w->fn,
                  w->path, strerror(err));
        return w->ctx->status;
    }
    return QKV_OK;
}

/* ---- reading ------------------------------------------------------------------------------------- */

bool qkv_read_file_(qkv_ctx *ctx, const char *fn, const char *path, size_t max_size,
                    unsigned char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever; it is cleared below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot open: %s", fn, path, strerror(err)), false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot stat: %s", fn, path, strerror(err)), false;
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot read: %s", fn, path, strerror(EISDIR)), false;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot read: it is %s, and qkv reads regular files only",
                         fn, path, kind_of(&st)),
               false;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: cannot clear O_NONBLOCK: %s", fn, path, strerror(err)),
               false;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)max_size) {
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_FORMAT, "%s: %s: the file is %lld bytes, more than the %zu-byte limit",
                         fn, path, (long long)st.st_size, max_size),
               false;
    }
    /* Read at most the size fstat gave: a file that grows meanwhile is read up to that size, and one
     * that shrinks is refused. One byte of room beyond it so an empty file still gets a buffer. */
    size_t want = (size_t)st.st_size, used = 0;
    unsigned char *buf = qkv_raw_malloc_(ctx, want + 1);
    if (!buf) {
        close(fd);
        return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: %s: out of memory reading %zu bytes", fn, path, want),
               false;
    }
    while (used < want) {
        size_t chunk = want - used < ((size_t)1 << 30) ? want - used : ((size_t)1 << 30);
        ssize_t n = read(fd, buf + used, chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            close(fd);
            qkv_raw_free_(ctx, buf);
            return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: read failed: %s", fn, path, strerror(err)), false;
        }
        if (n == 0) break;
        used += (size_t)n;
    }
    close(fd);
    if (used != want) {
        qkv_raw_free_(ctx, buf);
        return qkv_fail_(ctx, QKV_ERR_IO, "%s: %s: the file shrank while being read (%zu of %zu bytes)", fn,
                         path, used, want),
               false;
    }
    *data = buf;
    *size = used;
    return true;
}

/* ---- CRC-32 ------------------------------------------------------------------------------------- */

void qkv_crc32_init_(qkv_crc32_table_ *table) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table->t[0][i] = c;
    }
    /* t[k][i]: the CRC of byte i followed by k zero bytes, so 8 bytes fold in with 8 lookups */
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            table->t[k][i] = (table->t[k - 1][i] >> 8) ^ table->t[0][table->t[k - 1][i] & 0xFF];
}

uint32_t qkv_crc32_(const qkv_crc32_table_ *table, uint32_t crc, const void *data, size_t size) {
    const uint32_t(*t)[256] = table->t;
    const unsigned char *p = data;
    crc = ~crc;
    for (; size >= 8; p += 8, size -= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
              t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    }
    for (; size > 0; p++, size--) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFF];
    return ~crc;
}

/* ---- quoting ------------------------------------------------------------------------------------ */

qkv_quoted_ qkv_quote_(const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    qkv_quoted_ q;
    size_t len = 0;
    for (size_t i = 0; i < n && i < QKV_QUOTE_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            q.s[len++] = '\\';
            q.s[len++] = '\\';
        } else if (c >= 0x20 && c < 0x7f) {
            q.s[len++] = (char)c;
        } else {
            q.s[len++] = '\\';
            q.s[len++] = 'x';
            q.s[len++] = hex[c >> 4];
            q.s[len++] = hex[c & 15];
        }
    }
    if (n > QKV_QUOTE_MAX) {
        memcpy(q.s + len, "...", 3);
        len += 3;
    }
    q.s[len] = '\0';
    return q;
}

/* ---- UTF-8 --------------------------------------------------------------------------------------- */

bool qkv_utf8_valid_(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c == 0xE0) len = 3, lo = 0xA0;               /* no overlongs            */
        else if (c == 0xED) len = 3, hi = 0x9F;               /* no surrogates           */
        else if (c >= 0xE1 && c <= 0xEF) len = 3;
        else if (c == 0xF0) len = 4, lo = 0x90;               /* no overlongs            */
        else if (c >= 0xF1 && c <= 0xF3) len = 4;
        else if (c == 0xF4) len = 4, hi = 0x8F;               /* nothing above U+10FFFF  */
        else return false;
        if (n - i < len) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}
