/* Errors are values: a function that can fail takes a tern_error * and, on
 * failure, writes one line naming what is wrong (file, tensor, field) and
 * returns a failure value (-1 or NULL). The struct is public (tern.h). */
#ifndef TERN_UTIL_ERR_H
#define TERN_UTIL_ERR_H

#include "tern.h"

/* printf-style; err may be NULL. Always returns -1 so callers can write
 * `return tern_fail(err, "...")`. */
int tern_fail(tern_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (adds context on the way up). */
void tern_err_prefix(tern_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
