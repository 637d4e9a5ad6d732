/* A growable byte buffer for response bodies and SSE frames. Zero-initialise
 * (`sbuf b = {0};`); appends fail only when memory runs out, which sets
 * `oom` and leaves the buffer as it was (callers check once at the end). */
#ifndef TERN_SERVER_SBUF_H
#define TERN_SERVER_SBUF_H

#include <jansson.h>
#include <stddef.h>

typedef struct sbuf {
    char *data;
    size_t len, cap;
    int oom;
} sbuf;

void sbuf_add(sbuf *b, const char *s, size_t n);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends v as compact JSON and drops the reference (v may be NULL: oom). */
void sbuf_json(sbuf *b, json_t *v);
/* One server-sent event: "event: NAME\n" (when name is given) and
 * "data: JSON\n\n"; drops the reference to v. */
void sbuf_sse(sbuf *b, const char *name, json_t *v);
void sbuf_reset(sbuf *b);
void sbuf_free(sbuf *b);

#endif
