#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int tern_fail(tern_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

void tern_err_prefix(tern_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Join in a buffer large enough for both, then cut to the message size. */
    char joined[2 * sizeof err->msg + 2];
    snprintf(joined, sizeof joined, "%s: %s", prefix, err->msg);
    memcpy(err->msg, joined, sizeof err->msg - 1);
    err->msg[sizeof err->msg - 1] = '\0';
}
