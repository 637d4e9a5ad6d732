#include "util/path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

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

int tern_open_parent(int root, const char *rel, int create, const char **last, int *missing, tern_error *err) {
    if (missing) *missing = 0;
    int dfd = dup(root);
    if (dfd < 0) return tern_fail(err, "%s: %s", rel, strerror(errno));
    const char *s = rel;
    for (const char *slash; (slash = strchr(s, '/'));) {
        char comp[NAME_MAX + 1];
        size_t n = (size_t)(slash - s);
        if (n == 0 || n > NAME_MAX) {
            close(dfd);
            return tern_fail(err, "%s: bad path", rel);
        }
        memcpy(comp, s, n);
        comp[n] = '\0';
        int next = create ? tern_open_dir(dfd, comp, 1, rel, err)
                          : openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(dfd);
        if (next < 0) {
            if (create) return -1;
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
    int dfd = tern_open_parent(root, rel, 0, &last, missing, err);
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
    int dfd = tern_open_parent(root, rel, 0, &last, NULL, err);
    if (dfd < 0) return -1;
    int fd = openat(dfd, last, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    int e = errno;
    close(dfd);
    if (fd < 0)
        return tern_fail(err, "%s: cannot create: %s", rel, e == ELOOP ? "it is a symbolic link (refused)" : strerror(e));
    return fd;
}
