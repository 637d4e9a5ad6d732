#include "text/stop.h"

#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"
#include "util/err.h"

struct tern_stop {
    char **stop;
    size_t *stop_len;
    size_t n;
    char *buf;          /* held text + the new chunk; released text is a prefix */
    size_t len, cap;
    size_t released;    /* bytes of buf handed out by the last call */
    int stopped;        /* -1 or the index of the stop string seen */
};

tern_stop *tern_stop_create(const char *const *stops, size_t n, tern_error *err) {
    tern_stop *st = calloc(1, sizeof *st);
    if (!st) goto oom;
    st->stopped = -1;
    st->stop = calloc(n + 1, sizeof *st->stop);
    st->stop_len = calloc(n + 1, sizeof *st->stop_len);
    if (!st->stop || !st->stop_len) goto oom;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) {
            tern_fail(err, "stop string %zu is empty", i);
            goto fail;
        }
        if (tern_utf8_valid_prefix(stops[i], l) != l) {
            tern_fail(err, "stop string %zu is not valid UTF-8", i);
            goto fail;
        }
        if (!(st->stop[i] = strdup(stops[i]))) goto oom;
        st->stop_len[i] = l;
        st->n = i + 1;
    }
    return st;
oom:
    tern_fail(err, "out of memory");
fail:
    tern_stop_free(st);
    return NULL;
}

void tern_stop_free(tern_stop *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free(st->stop[i]);
    free(st->stop);
    free(st->stop_len);
    free(st->buf);
    free(st);
}

void tern_stop_reset(tern_stop *st) {
    st->len = st->released = 0;
    st->stopped = -1;
}

size_t tern_stop_held(const tern_stop *st) { return st->len - st->released; }

/* Drops what the previous call released, keeping the held tail. */
static void drop_released(tern_stop *st) {
    if (st->released == 0) return;
    memmove(st->buf, st->buf + st->released, st->len - st->released);
    st->len -= st->released;
    st->released = 0;
}

int tern_stop_push(tern_stop *st, const char *chunk, size_t len, const char **text,
                   size_t *text_len, int *which) {
    *text = "";
    *text_len = 0;
    if (st->stopped >= 0) {
        if (which) *which = st->stopped;
        return 1;
    }
    drop_released(st);
    if (st->len + len > st->cap) {
        size_t c = st->cap ? st->cap : 64;
        while (c < st->len + len) c *= 2;
        char *p = realloc(st->buf, c);
        if (!p) return -1;
        st->buf = p;
        st->cap = c;
    }
    if (len) memcpy(st->buf + st->len, chunk, len);
    st->len += len;

    /* Report the stop that completes first in stream order (the smallest
     * end; at equal ends the longer, earlier-starting one), so the result
     * does not depend on how the text was cut into chunks. The held tail
     * never contains a whole stop string (the call that added its last byte
     * would have reported it), so only ends in the new chunk are checked. */
    for (size_t e = st->len - len + 1; e <= st->len; e++) {
        size_t best = 0;
        int k_best = -1;
        for (size_t k = 0; k < st->n; k++) {
            size_t sl = st->stop_len[k];
            if (sl <= e && sl > best && memcmp(st->buf + e - sl, st->stop[k], sl) == 0) {
                best = sl;
                k_best = (int)k;
            }
        }
        if (k_best >= 0) {
            st->stopped = k_best;
            if (which) *which = k_best;
            *text = st->buf;
            *text_len = e - best;
            st->released = st->len;     /* nothing more comes out */
            return 1;
        }
    }
    /* No stop string is complete. One could still start at the earliest
     * position whose tail is a proper prefix of a stop string, so only the
     * bytes before it are safe to release. */
    size_t hold_from = st->len;
    for (size_t i = 0; i < st->len && hold_from == st->len; i++) {
        size_t rest = st->len - i;
        for (size_t k = 0; k < st->n; k++)
            if (rest < st->stop_len[k] && memcmp(st->buf + i, st->stop[k], rest) == 0) {
                hold_from = i;
                break;
            }
    }
    *text = st->buf;
    *text_len = hold_from;
    st->released = hold_from;
    return 0;
}

void tern_stop_flush(tern_stop *st, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (st->stopped >= 0) return;
    drop_released(st);
    *text = st->buf ? st->buf : "";
    *len = st->len;
    st->released = st->len;
}
