/* An event log for the streaming parsers' harnesses: text pieces of one
 * kind joined (so the log does not depend on where the input was cut),
 * other events written whole. */
#ifndef TERN_FUZZ_EVENTS_H
#define TERN_FUZZ_EVENTS_H

#include "fuzz.h"

typedef struct ev_log {
    char *s;
    size_t len, cap;
    int last;                    /* kind of the open text run, or -1 */
} ev_log;

static inline void ev_put(ev_log *l, const char *p, size_t n) {
    if (l->len + n + 1 > l->cap) {
        l->cap = (l->len + n + 1) * 2;
        if (!(l->s = realloc(l->s, l->cap))) abort();
    }
    memcpy(l->s + l->len, p, n);
    l->len += n;
    l->s[l->len] = 0;
}

/* A text piece of the given kind (joined with the previous one if alike). */
static inline void ev_text(ev_log *l, int kind, const char *p, size_t n) {
    if (!n) return;
    if (l->last != kind) {
        char head[16];
        int hn = snprintf(head, sizeof head, "\n#%d:", kind);
        ev_put(l, head, (size_t)hn);
        l->last = kind;
    }
    ev_put(l, p, n);
}

/* A whole event: ends the open text run. */
static inline void ev_mark(ev_log *l, const char *what, const char *a, const char *b) {
    ev_put(l, "\n@", 2);
    ev_put(l, what, strlen(what));
    if (a) { ev_put(l, "|", 1); ev_put(l, a, strlen(a)); }
    if (b) { ev_put(l, "|", 1); ev_put(l, b, strlen(b)); }
    l->last = -1;
}

/* Compares the log of the whole input with that of a cut one. */
static inline void ev_same(const ev_log *whole, const ev_log *cut) {
    FUZZ_CHECK(whole->len == cut->len && (!whole->len || memcmp(whole->s, cut->s, whole->len) == 0),
               "the events depend on how the text is cut:\n--- whole:%s\n--- cut:%s", whole->s ? whole->s : "",
               cut->s ? cut->s : "");
}

#endif
