/* The stop-string matcher (text/stop.h) on arbitrary text and stops, fed
 * whole and then in pieces cut by the input's own hash. Both must release
 * the same text and report the same stop, and that must be what a plain
 * search says: the text before the first place where a stop string ends
 * (the stop reported ends there and is found there), or all of the text
 * when none occurs.
 * Input: byte 0 & 3 is the number of stop strings, each then ended by a
 * NUL byte; the rest is the text. */
#include <string.h>

#include "fuzz.h"
#include "text/stop.h"

typedef struct {
    char *s;
    size_t len;
    int hit, which;
} outcome;

static void append(outcome *o, const char *s, size_t n) {
    if (!n) return;
    o->s = realloc(o->s, o->len + n);
    FUZZ_CHECK(o->s, "out of memory");
    memcpy(o->s + o->len, s, n);
    o->len += n;
}

static outcome run(const char *const *stops, size_t n_stops, const char *text, size_t n, fuzz_cuts *cuts) {
    tern_error err;
    outcome o = {.which = -1};
    tern_stop *st = tern_stop_create(stops, n_stops, &err);
    FUZZ_CHECK(st, "create: %s", err.msg);
    const char *out;
    size_t len;
    for (size_t at = 0; at < n && !o.hit;) {
        size_t k = cuts ? fuzz_cuts_next(cuts, n - at) : n - at;
        int rc = tern_stop_push(st, text + at, k, &out, &len, &o.which);
        FUZZ_CHECK(rc >= 0, "push: out of memory");
        append(&o, out, len);
        o.hit = rc == 1;
        at += k;
    }
    if (!o.hit) {
        tern_stop_flush(st, &out, &len);
        append(&o, out, len);
        o.which = -1;
    }
    tern_stop_free(st);
    return o;
}

/* The end of the first occurrence of any stop (0: none). */
static size_t first_end(const char *const *stops, size_t n_stops, const char *text, size_t n) {
    for (size_t end = 1; end <= n; end++)
        for (size_t i = 0; i < n_stops; i++) {
            size_t l = strlen(stops[i]);
            if (l <= end && !memcmp(text + end - l, stops[i], l)) return end;
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t n_stops = data[0] & 3, at = 1;
    char *stops[3];
    size_t got = 0;
    for (; got < n_stops; got++) {
        const uint8_t *nul = memchr(data + at, 0, size - at);
        if (!nul || nul == data + at) break;   /* stops are non-empty */
        stops[got] = fuzz_strndup(data + at, (size_t)(nul - (data + at)));
        at = (size_t)(nul - data) + 1;
    }
    if (got == n_stops) {
        const char *text = (const char *)data + at;
        size_t n = size - at;
        tern_error err;
        tern_stop *probe = tern_stop_create((const char *const *)stops, n_stops, &err);
        if (probe) {   /* (stops that are not valid UTF-8 are refused: nothing to match) */
            tern_stop_free(probe);
            fuzz_cuts cuts = fuzz_cuts_seed(data, size);
            outcome whole = run((const char *const *)stops, n_stops, text, n, NULL);
            outcome cut = run((const char *const *)stops, n_stops, text, n, &cuts);
            FUZZ_CHECK(whole.hit == cut.hit && whole.which == cut.which && whole.len == cut.len &&
                           (!whole.len || !memcmp(whole.s, cut.s, whole.len)),
                       "the chunking changed the outcome");
            size_t end = first_end((const char *const *)stops, n_stops, text, n);
            FUZZ_CHECK(whole.hit == (end > 0), "a stop %s", end ? "was missed" : "was reported that never occurred");
            if (end) {
                FUZZ_CHECK(whole.which >= 0 && (size_t)whole.which < n_stops, "stop index %d", whole.which);
                size_t l = strlen(stops[whole.which]);
                FUZZ_CHECK(l <= end && !memcmp(text + end - l, stops[whole.which], l),
                           "the stop reported does not end at the first stop's end");
                FUZZ_CHECK(whole.len == end - l && (!whole.len || !memcmp(whole.s, text, whole.len)),
                           "released text is not the text before the stop");
            } else {
                FUZZ_CHECK(whole.len == n && (!n || !memcmp(whole.s, text, n)), "released text is not the text");
            }
            free(whole.s);
            free(cut.s);
        }
    }
    for (size_t i = 0; i < got; i++) free(stops[i]);
    return 0;
}
