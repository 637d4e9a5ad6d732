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

/* ---- paths -------------------------------------------------------------- */

int tern_refuse_symlink(const char *path, int *exists, tern_error *err) {
    struct stat st;
    if (exists) *exists = 0;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return tern_fail(err, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (exists) *exists = 1;
    if (S_ISLNK(st.st_mode)) return tern_fail(err, "%s: is a symbolic link (refused: tern never writes through links)", path);
    return 0;
}

int tern_open_dir(int dfd, const char *name, int create, const char *label, tern_error *err) {
    if (create && mkdirat(dfd, name, 0755) != 0 && errno != EEXIST)
        return tern_fail(err, "%s: cannot create directory: %s", label, strerror(errno));
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR)
            return tern_fail(err, "%s: not a directory (or a symbolic link, refused)", label);
        return tern_fail(err, "%s: cannot open directory: %s", label, strerror(errno));
    }
    return fd;
}

/* Opens the directory part of rel under root (O_NOFOLLOW per component);
 * *last points at the final component. Returns a fd the caller closes
 * (root itself is duplicated so the caller can always close it). */
static int open_parent(int root, const char *rel, const char **last, int *missing, tern_error *err) {
    int dfd = dup(root);
    if (dfd < 0) return tern_fail(err, "%s: %s", rel, strerror(errno));
    const char *s = rel;
    for (;;) {
        const char *slash = strchr(s, '/');
        if (!slash) break;
        char comp[NAME_MAX + 1];
        size_t n = (size_t)(slash - s);
        if (n == 0 || n > NAME_MAX) {
            close(dfd);
            return tern_fail(err, "%s: bad path", rel);
        }
        memcpy(comp, s, n);
        comp[n] = '\0';
        int next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(dfd);
        if (next < 0) {
            if (missing) *missing = e == ENOENT;
            return tern_fail(err, "%s: %s", rel,
                             e == ENOENT ? "missing" : e == ELOOP || e == ENOTDIR ? "a directory on the path is a symbolic link or not a directory" : strerror(e));
        }
        dfd = next;
        s = slash + 1;
    }
    *last = s;
    return dfd;
}

int tern_open_in(int root, const char *rel, int *missing, tern_error *err) {
    if (missing) *missing = 0;
    const char *last;
    int dfd = open_parent(root, rel, &last, missing, err);
    if (dfd < 0) return -1;
    /* O_NONBLOCK: a named pipe in its place must not block the open */
    int fd = openat(dfd, last, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    int e = errno;
    close(dfd);
    if (fd < 0) {
        if (missing) *missing = e == ENOENT;
        return tern_fail(err, "%s: %s", rel, e == ENOENT ? "missing" : e == ELOOP ? "is a symbolic link (refused)" : strerror(e));
    }
    struct stat st;
    int fstat_rc = fstat(fd, &st);
    if (fstat_rc != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tern_fail(err, "%s: not a regular file%s", rel,
                         fstat_rc == 0 && S_ISFIFO(st.st_mode) ? " (a named pipe, refused)" : "");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        e = errno;
        close(fd);
        return tern_fail(err, "%s: fcntl failed: %s", rel, strerror(e));
    }
    return fd;
}

int tern_create_in(int root, const char *rel, tern_error *err) {
    const char *last;
    int dfd = open_parent(root, rel, &last, NULL, err);
    if (dfd < 0) return -1;
    int fd = openat(dfd, last, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    int e = errno;
    close(dfd);
    if (fd < 0)
        return tern_fail(err, "%s: cannot create: %s", rel, e == ELOOP ? "it is a symbolic link (refused)" : strerror(e));
    return fd;
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
