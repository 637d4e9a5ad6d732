/* File-system steps of installing a model directory (docs/FORMAT.md,
 * "Writing"): an exclusive lock, paths that refuse symlinks (util/path.h),
 * durable writes (fsync of the file, then of the directory that names it),
 * atomic replacement by rename, and a free-space check. Every path tern creates
 * goes through these, so a symlink planted at any of them is refused
 * rather than followed. */
#ifndef TERN_PACK_INSTALL_H
#define TERN_PACK_INSTALL_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"
#include "util/path.h"

/* ---- locking ---- */

typedef struct tern_install_lock {
    int fd;                      /* -1 when not held */
    char *path;
} tern_install_lock;

/* Creates/opens path (O_NOFOLLOW) and takes flock(LOCK_EX|LOCK_NB);
 * another holder gives "install busy". */
int tern_lock_acquire(tern_install_lock *l, const char *path, tern_error *err);
/* Removes the lock file (while still holding it, so nobody can take a
 * lock on a file that is about to vanish) and releases it. */
void tern_lock_release(tern_install_lock *l);

/* ---- durable writes ---- */

int tern_write_all(int fd, const void *data, size_t n, const char *label, tern_error *err);
int tern_fsync_fd(int fd, const char *label, tern_error *err);

/* Writes data to `name`.tmp in dfd, fsyncs it, renames it to `name` and
 * fsyncs dfd: readers see the old file or the new one, never a part. */
int tern_atomic_write(int dfd, const char *name, const void *data, size_t n, const char *label,
                      tern_error *err);

/* statvfs of the file system holding path: error unless at least `need`
 * bytes are free to an unprivileged writer. */
int tern_check_free_space(const char *path, uint64_t need, tern_error *err);

/* realpath of the parent of path, joined with its last component: where
 * path will live once created (path itself need not exist). malloc'd. */
char *tern_future_realpath(const char *path, tern_error *err);

#endif
