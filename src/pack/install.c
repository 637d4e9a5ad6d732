#include "pack/install.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "util/err.h"

/* ---- locking ------------------------------------------------------------ */

int tern_lock_acquire(tern_install_lock *l, const char *path, tern_error *err) {
    l->fd = -1;
    l->path = NULL;
    if (tern_refuse_symlink(path, NULL, err) != 0) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return tern_fail(err, "%s: cannot open the install lock: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) return tern_fail(err, "%s: install busy (another tern pack holds the lock)", path);
        return tern_fail(err, "%s: cannot lock: %s", path, strerror(e));
    }
    /* The previous holder unlinks the file before releasing it: if we
     * locked a file that is no longer the one at `path`, someone else may
     * lock the new one, so treat it as busy. */
    struct stat a, b;
    if (fstat(fd, &a) != 0 || lstat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev ||
        !S_ISREG(a.st_mode)) {
        close(fd);
        return tern_fail(err, "%s: install busy (the lock file was replaced while locking)", path);
    }
    l->path = strdup(path);
    if (!l->path) {
        close(fd);
        return tern_fail(err, "out of memory");
    }
    l->fd = fd;
    return 0;
}

void tern_lock_release(tern_install_lock *l) {
    if (l->fd >= 0) {
        unlink(l->path);
        close(l->fd);
    }
    free(l->path);
    l->fd = -1;
    l->path = NULL;
}

/* ---- durable writes ----------------------------------------------------- */

int tern_write_all(int fd, const void *data, size_t n, const char *label, tern_error *err) {
    const char *p = data;
    while (n > 0) {
        /* chunks below 1 GiB: some kernels cap a single write */
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return tern_fail(err, "%s: write failed: %s", label, w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tern_fsync_fd(int fd, const char *label, tern_error *err) {
    if (fsync(fd) != 0) return tern_fail(err, "%s: fsync failed: %s", label, strerror(errno));
    return 0;
}

int tern_atomic_write(int dfd, const char *name, const void *data, size_t n, const char *label, tern_error *err) {
    char tmp[NAME_MAX + 1];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", name) >= sizeof tmp) return tern_fail(err, "%s: name too long", label);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return tern_fail(err, "%s: cannot create %s: %s", label, tmp, strerror(errno));
    int rc = tern_write_all(fd, data, n, label, err);
    if (rc == 0) rc = tern_fsync_fd(fd, label, err);
    if (close(fd) != 0 && rc == 0) rc = tern_fail(err, "%s: close failed: %s", label, strerror(errno));
    if (rc == 0 && renameat(dfd, tmp, dfd, name) != 0)
        rc = tern_fail(err, "%s: rename failed: %s", label, strerror(errno));
    if (rc != 0) {
        unlinkat(dfd, tmp, 0);
        return -1;
    }
    return tern_fsync_fd(dfd, label, err);
}

int tern_check_free_space(const char *path, uint64_t need, tern_error *err) {
    struct statvfs vs;
    if (statvfs(path, &vs) != 0) return tern_fail(err, "%s: statvfs failed: %s", path, strerror(errno));
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    if (avail < need)
        return tern_fail(err, "%s: not enough disk space: %.1f MB free, the pack needs %.1f MB (with reserve)", path,
                         avail / 1e6, need / 1e6);
    return 0;
}

char *tern_future_realpath(const char *path, tern_error *err) {
    char *copy = strdup(path);
    if (!copy) { tern_fail(err, "out of memory"); return NULL; }
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *slash = strrchr(copy, '/');
    const char *base = slash ? slash + 1 : copy;
    const char *parent = slash ? (slash == copy ? "/" : copy) : ".";
    if (slash && slash != copy) *slash = '\0';
    char *out = NULL;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        tern_fail(err, "%s: the destination must end in a directory name", path);
    } else {
        char *rp = realpath(parent, NULL);
        if (!rp) tern_fail(err, "%s: cannot resolve its parent directory: %s", path, strerror(errno));
        else if (asprintf(&out, "%s/%s", strcmp(rp, "/") ? rp : "", base) < 0) out = NULL;
        free(rp);
    }
    free(copy);
    return out;
}
