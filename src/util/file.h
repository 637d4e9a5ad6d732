/* Opening the files of a model directory: a named pipe, a device or a
 * directory in place of a regular file must be refused, not block the open
 * or a read forever. */
#ifndef TERN_UTIL_FILE_H
#define TERN_UTIL_FILE_H

#include <errno.h>
#include <jansson.h>
#include <stddef.h>

#include "tern.h"

/* Size limits for tern_json_load: config-like files, and the tokenizer
 * and safetensors index (far above any real one). */
#define TERN_JSON_SMALL_MAX ((size_t)16 << 20)
#define TERN_JSON_LARGE_MAX ((size_t)256 << 20)

/* Opens path read-only as a regular file. The open is non-blocking (a FIFO
 * without a writer would otherwise block it), anything but a regular file
 * is refused with one line, then O_NONBLOCK is cleared. `flags` adds open
 * flags (O_NOFOLLOW, O_DIRECT); O_CLOEXEC is always set. Returns the fd, or
 * -1 with err set and errno telling why (ENOENT: no such file). */
int tern_file_open(const char *path, int flags, tern_error *err);
/* The same for name relative to the directory fd dfd; label names the file
 * in messages. */
int tern_file_openat(int dfd, const char *name, int flags, const char *label, tern_error *err);

/* 1 if something (of any kind) exists at path. */
int tern_file_exists(const char *path);

/* The whole of a regular file of at most max_bytes, NUL-terminated
 * (malloc'd; *len excludes the NUL). */
int tern_file_read(const char *path, int flags, size_t max_bytes, char **out, size_t *len, tern_error *err);
/* The same from an open fd; label names it in messages. */
int tern_file_read_fd(int fd, const char *label, size_t max_bytes, char **out, size_t *len, tern_error *err);

/* A JSON file of at most max_bytes, parsed with jansson's json_flags.
 * NULL with err set on failure; errno is ENOENT when the file is absent. */
json_t *tern_json_load(const char *path, size_t json_flags, size_t max_bytes, tern_error *err);
json_t *tern_json_load_fd(int fd, const char *label, size_t json_flags, size_t max_bytes, tern_error *err);

#endif
