/* Paths inside a model directory that refuse symbolic links: every
 * component is opened with O_NOFOLLOW, so a link planted anywhere in a
 * directory tern reads or writes is refused rather than followed. */
#ifndef TERN_UTIL_PATH_H
#define TERN_UTIL_PATH_H

#include "tern.h"

/* 0 if path does not exist or is not a symlink; an error naming it if it
 * is one. *exists gets 1 if something is there (may be NULL). */
int tern_refuse_symlink(const char *path, int *exists, tern_error *err);

/* Opens (creating with mkdirat if `create`) directory `name` inside dfd
 * (AT_FDCWD for a path) without following a symlink. Returns the fd. */
int tern_open_dir(int dfd, const char *name, int create, const char *label, tern_error *err);

/* Opens the directory part of `rel` under root (O_NOFOLLOW per component;
 * with `create`, missing directories are made); *last points at rel's
 * final component. Returns a fd the caller closes (root itself is
 * duplicated), or -1 with err naming rel (*missing, may be NULL: 1 when a
 * directory does not exist). */
int tern_open_parent(int root, const char *rel, int create, const char **last, int *missing, tern_error *err);

/* Opens relative path `rel` under directory fd `root` for reading, one
 * component at a time with O_NOFOLLOW: no symlink anywhere inside the
 * model directory is followed. Returns the fd, or -1 with err naming rel
 * (*missing set to 1 when it does not exist). */
int tern_open_in(int root, const char *rel, int *missing, tern_error *err);

/* Creates (truncating) `rel` under root for writing; the directories of
 * rel must exist. O_NOFOLLOW on every component. */
int tern_create_in(int root, const char *rel, tern_error *err);

#endif
