#include "text/detok.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

struct tern_detok {
    const tern_tokenizer *tok;
    int skip_special;
    char held[4];           /* an unfinished character: at most 3 bytes */
    size_t n_held;
    char *out;              /* text handed back by the last call */
    size_t out_cap;
};

tern_detok *tern_detok_create(const tern_tokenizer *tok, int skip_special, tern_error *err) {
    tern_detok *d = calloc(1, sizeof *d);
    if (!d) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    d->tok = tok;
    d->skip_special = skip_special;
    return d;
}

void tern_detok_free(tern_detok *d) {
    if (!d) return;
    free(d->out);
    free(d);
}

void tern_detok_reset(tern_detok *d) { d->n_held = 0; }

static int reserve(tern_detok *d, size_t n) {
    if (n <= d->out_cap) return 0;
    size_t c = d->out_cap ? d->out_cap : 64;
    while (c < n) c *= 2;
    char *p = realloc(d->out, c);
    if (!p) return -1;
    d->out = p;
    d->out_cap = c;
    return 0;
}

/* Copies src to out with invalid subparts replaced, stopping before an
 * unfinished character at the end when hold is set; returns bytes written
 * and leaves the unfinished bytes in d->held. */
static size_t emit(tern_detok *d, const char *src, size_t n, int hold) {
    size_t tail = hold ? tern_utf8_incomplete_tail(src, n) : 0;
    size_t o = 0, i = 0, end = n - tail;
    while (i < end) {
        uint32_t cp;
        int k = tern_utf8_decode(src + i, end - i, &cp);
        if (k > 0) {
            memcpy(d->out + o, src + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(d->out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += tern_utf8_maximal_subpart(src + i, end - i);
        }
    }
    memmove(d->held, src + end, tail);
    d->n_held = tail;
    return o;
}

int tern_detok_push(tern_detok *d, int32_t id, const char **text, size_t *len, tern_error *err) {
    size_t n;
    const char *b = tern_tokenizer_token_bytes(d->tok, id, &n);
    if (!b) return tern_fail(err, "detokenizer: id %d is not in the vocabulary", (int)id);
    if (d->skip_special && tern_tokenizer_is_added(d->tok, id) == 2) n = 0;
    /* held bytes + the token, then at most 3 bytes of U+FFFD per input byte */
    size_t in = d->n_held + n;
    if (reserve(d, in * 4 + 4)) return tern_fail(err, "out of memory");
    char *joined = d->out + in * 3 + 4;     /* the tail of out is free room */
    memcpy(joined, d->held, d->n_held);
    memcpy(joined + d->n_held, b, n);
    /* emit writes forwards from d->out and reads joined, which starts past
     * anything written (at most 3 bytes out per byte in). */
    *len = emit(d, joined, in, 1);
    *text = d->out;
    return 0;
}

void tern_detok_flush(tern_detok *d, const char **text, size_t *len) {
    char tmp[4];
    size_t n = d->n_held;
    memcpy(tmp, d->held, n);
    *text = "";
    *len = 0;
    if (n == 0 || reserve(d, 16)) {
        d->n_held = 0;
        return;
    }
    *len = emit(d, tmp, n, 0);
    *text = d->out;
}
