#include "server/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sbuf_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) { b->oom = 1; return; }
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sbuf_puts(sbuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if ((size_t)n < sizeof tmp) { sbuf_add(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sbuf_add(b, big, (size_t)n);
    free(big);
}

static int dump_cb(const char *buffer, size_t size, void *data) {
    sbuf *b = data;
    sbuf_add(b, buffer, size);
    return b->oom ? -1 : 0;
}

void sbuf_json(sbuf *b, json_t *v) {
    if (!v) { b->oom = 1; return; }
    if (json_dump_callback(v, dump_cb, b, JSON_COMPACT | JSON_ENCODE_ANY) != 0) b->oom = 1;
    json_decref(v);
}

void sbuf_sse(sbuf *b, const char *name, json_t *v) {
    if (name) { sbuf_puts(b, "event: "); sbuf_puts(b, name); sbuf_puts(b, "\n"); }
    sbuf_puts(b, "data: ");
    sbuf_json(b, v);
    sbuf_puts(b, "\n\n");
}

void sbuf_reset(sbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void sbuf_free(sbuf *b) {
    free(b->data);
    *b = (sbuf){0};
}
