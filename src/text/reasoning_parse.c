#include "text/reasoning_parse.h"

#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "util/err.h"

enum reasoning_state {
    R_START,      /* nothing decided yet: does the text open with <think>? */
    R_OPENED,     /* just after <think>: newlines are markup */
    R_REASONING,  /* inside the block, waiting for </think> */
    R_AFTER,      /* just after </think>: newlines are markup */
    R_CONTENT,    /* the answer: passed on as it comes */
};

struct tern_reasoning_splitter {
    enum reasoning_state state;
    int start_in_reasoning;
    chat_buf pend;  /* text not yet passed on (an undecided tag, at most) */
    tern_reasoning_fn fn;
    void *user;
};

static const char OPEN[] = "<think>", CLOSE[] = "</think>", NL_CLOSE[] = "\n</think>";

tern_reasoning_splitter *tern_reasoning_splitter_create(int start_in_reasoning,
                                                        tern_reasoning_fn fn, void *user,
                                                        tern_error *err) {
    tern_reasoning_splitter *s = calloc(1, sizeof *s);
    if (!s) {
        tern_fail(err, "out of memory (reasoning splitter)");
        return NULL;
    }
    s->start_in_reasoning = start_in_reasoning;
    s->fn = fn;
    s->user = user;
    return s;
}

void tern_reasoning_splitter_destroy(tern_reasoning_splitter *s) {
    if (!s) return;
    chat_buf_free(&s->pend);
    free(s);
}

int tern_reasoning_splitter_in_reasoning(const tern_reasoning_splitter *s) {
    return s->state == R_OPENED || s->state == R_REASONING ||
           (s->state == R_START && s->start_in_reasoning);
}

static void consume(chat_buf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

static int emit(tern_reasoning_splitter *s, int is_reasoning, size_t n, tern_error *err) {
    if (n && s->fn(s->user, is_reasoning, s->pend.data, n, err)) return -1;
    consume(&s->pend, n);
    return 0;
}

/* Length of the longest proper prefix of tag that ends `text`. */
static size_t partial_tag(const char *text, size_t n, const char *tag) {
    size_t m = strlen(tag);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (memcmp(text + n - k, tag, k) == 0) return k;
    return 0;
}

static size_t drop_newlines(chat_buf *b) {
    size_t k = 0;
    while (k < b->len && b->data[k] == '\n') k++;
    consume(b, k);
    return b->len;
}

/* One step of the state machine; returns 1 to keep going, 0 when it needs
 * more text, -1 on error. */
static int step(tern_reasoning_splitter *s, int at_end, tern_error *err) {
    chat_buf *p = &s->pend;
    switch (s->state) {
    case R_START:
        if (p->len >= 7 && memcmp(p->data, OPEN, 7) == 0) {
            consume(p, 7);
            s->state = R_OPENED;
            return 1;
        }
        if (!at_end && p->len < 7 && memcmp(p->data, OPEN, p->len) == 0) return 0;
        s->state = s->start_in_reasoning ? R_REASONING : R_CONTENT;
        return 1;
    case R_OPENED:
    case R_AFTER:
        if (!drop_newlines(p)) return 0;
        s->state = s->state == R_OPENED ? R_REASONING : R_CONTENT;
        return 1;
    case R_REASONING: {
        char *close = p->len ? memmem(p->data, p->len, CLOSE, 8) : NULL;
        if (close) {
            size_t k = (size_t)(close - p->data), end = k;
            if (end && p->data[end - 1] == '\n') end--;
            if (emit(s, 1, end, err)) return -1;
            consume(p, k - end + 8);
            s->state = R_AFTER;
            return 1;
        }
        size_t hold = 0;
        if (!at_end) {
            hold = partial_tag(p->data, p->len, NL_CLOSE);
            size_t h2 = partial_tag(p->data, p->len, CLOSE);
            if (h2 > hold) hold = h2;
        }
        if (emit(s, 1, p->len - hold, err)) return -1;
        return 0;
    }
    case R_CONTENT:
        if (emit(s, 0, p->len, err)) return -1;
        return 0;
    }
    return 0;
}

static int run(tern_reasoning_splitter *s, int at_end, tern_error *err) {
    int rc;
    while ((rc = step(s, at_end, err)) > 0) {}
    return rc;
}

int tern_reasoning_splitter_feed(tern_reasoning_splitter *s, const char *text, size_t len,
                                 tern_error *err) {
    if (chat_buf_append(&s->pend, text, len, err)) return -1;
    return run(s, 0, err);
}

int tern_reasoning_splitter_finish(tern_reasoning_splitter *s, tern_error *err) {
    if (chat_buf_append(&s->pend, "", 0, err)) return -1;
    return run(s, 1, err);
}
