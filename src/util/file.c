#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

static const char *kind_of(mode_t mode) {
    if (S_ISFIFO(mode)) return "is a named pipe";
    if (S_ISDIR(mode)) return "is a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device";
    if (S_ISSOCK(mode)) return "is a socket";
    return "is of an unusual file type";
}

/* fd (just opened non-blocking) kept only if it is a regular file. */
static int keep_regular(int fd, const char *label, tern_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return tern_fail(err, "%s: cannot stat: %s", label, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return tern_fail(err, "%s: %s, not a regular file (refused)", label, kind_of(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return tern_fail(err, "%s: fcntl failed: %s", label, strerror(e));
    }
    return fd;
}

static int open_failed(const char *label, tern_error *err) {
    int e = errno;
    if (e == ELOOP) tern_fail(err, "%s: is a symbolic link (refused)", label);
    else tern_fail(err, "%s: cannot open: %s", label, strerror(e));
    errno = e;
    return -1;
}

int tern_file_openat(int dfd, const char *name, int flags, const char *label, tern_error *err) {
    int fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC | flags);
    if (fd < 0) return open_failed(label, err);
    return keep_regular(fd, label, err);
}

int tern_file_open(const char *path, int flags, tern_error *err) {
    return tern_file_openat(AT_FDCWD, path, flags, path, err);
}

int tern_file_exists(const char *path) { return access(path, F_OK) == 0; }

int tern_file_read_fd(int fd, const char *label, size_t max_bytes, char **out, size_t *len, tern_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return tern_fail(err, "%s: cannot stat: %s", label, strerror(errno));
    if (st.st_size < 0 || (uint64_t)st.st_size > max_bytes)
        return tern_fail(err, "%s: %lld bytes, larger than the %zu this file may have", label,
                         (long long)st.st_size, max_bytes);
    /* Read to EOF but never past max_bytes: the file may grow meanwhile. */
    size_t cap = (size_t)st.st_size + 1, got = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (got == cap) {
            if (cap > max_bytes) break;
            size_t ncap = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap = ncap;
        }
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return tern_fail(err, "%s: read failed: %s", label, strerror(e));
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    if (!buf) return tern_fail(err, "%s: out of memory", label);
    if (got > max_bytes) {
        free(buf);
        return tern_fail(err, "%s: larger than the %zu bytes this file may have", label, max_bytes);
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

int tern_file_read(const char *path, int flags, size_t max_bytes, char **out, size_t *len, tern_error *err) {
    int fd = tern_file_open(path, flags, err);
    if (fd < 0) return -1;
    int rc = tern_file_read_fd(fd, path, max_bytes, out, len, err);
    close(fd);
    return rc;
}

json_t *tern_json_load_fd(int fd, const char *label, size_t json_flags, size_t max_bytes, tern_error *err) {
    char *text;
    size_t len;
    if (tern_file_read_fd(fd, label, max_bytes, &text, &len, err) != 0) return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, json_flags, &je);
    free(text);
    if (!root) tern_fail(err, "%s: not valid JSON (%s, line %d)", label, je.text, je.line);
    return root;
}

json_t *tern_json_load(const char *path, size_t json_flags, size_t max_bytes, tern_error *err) {
    int fd = tern_file_open(path, 0, err);
    if (fd < 0) return NULL;
    json_t *root = tern_json_load_fd(fd, path, json_flags, max_bytes, err);
    close(fd);
    errno = root ? 0 : EINVAL;
    return root;
}
