/* File-system steps of installing a model directory (docs/FORMAT.md,
 * "Writing"): an exclusive lock, paths that refuse symlinks, durable writes
 * (fsync of the file, then of the directory that names it), atomic
 * replacement by rename, and a free-space check. Every path tern creates
 * goes through these, so a symlink planted at any of them is refused
 * rather than followed. */
#ifndef TERN_PACK_INSTALL_H
#define TERN_PACK_INSTALL_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

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

/* ---- paths ---- */

/* 0 if path does not exist or is not a symlink; an error naming it if it
 * is one. *exists gets 1 if something is there (may be NULL). */
int tern_refuse_symlink(const char *path, int *exists, tern_error *err);

/* Opens (creating with mkdirat if `create`) directory `name` inside dfd
 * (AT_FDCWD for a path) without following a symlink. Returns the fd. */
int tern_open_dir(int dfd, const char *name, int create, const char *label, tern_error *err);

/* Opens relative path `rel` under directory fd `root` for reading, one
 * component at a time with O_NOFOLLOW: no symlink anywhere inside the
 * model directory is followed. Returns the fd, or -1 with err naming rel
 * (*missing set to 1 when it does not exist). */
int tern_open_in(int root, const char *rel, int *missing, tern_error *err);

/* Creates (truncating) `rel` under root for writing; the directories of
 * rel must exist. O_NOFOLLOW on every component. */
int tern_create_in(int root, const char *rel, tern_error *err);

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
