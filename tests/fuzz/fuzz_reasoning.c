/* The reasoning splitter (text/reasoning_parse.h) on arbitrary text, fed
 * whole and then in pieces cut by the input's own hash: both must give the
 * same reasoning and answer (the header promises the output does not
 * depend on the cuts), and nothing may be invented: every output byte is
 * an input byte, in order. First byte, bit 0: start in the reasoning. */
#include "events.h"
#include "text/reasoning_parse.h"

static int on_piece(void *user, int is_reasoning, const char *text, size_t len, tern_error *err) {
    ev_text(user, is_reasoning, text, len);
    return 0;
}

static void run(const char *text, size_t n, int start, fuzz_cuts *cuts, ev_log *log) {
    tern_error err;
    tern_reasoning_splitter *s = tern_reasoning_splitter_create(start, on_piece, log, &err);
    FUZZ_CHECK(s, "create: %s", err.msg);
    for (size_t at = 0; at < n;) {
        size_t k = cuts ? fuzz_cuts_next(cuts, n - at) : n - at;
        FUZZ_CHECK(tern_reasoning_splitter_feed(s, text + at, k, &err) == 0, "feed: %s", err.msg);
        at += k;
    }
    FUZZ_CHECK(tern_reasoning_splitter_finish(s, &err) == 0, "finish: %s", err.msg);
    tern_reasoning_splitter_destroy(s);
}

/* The output's bytes (markers aside) appear in the input in order. */
static void check_subsequence(const ev_log *l, const char *text, size_t n) {
    size_t at = 0;
    for (size_t i = 0; i < l->len; i++) {
        if (l->s[i] == '\n' && i + 2 < l->len && l->s[i + 1] == '#' && l->s[i + 3] == ':') { i += 3; continue; }
        while (at < n && text[at] != l->s[i]) at++;
        FUZZ_CHECK(at < n, "output byte %zu is not from the input", i);
        at++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    ev_log whole = {.last = -1}, cut = {.last = -1};
    fuzz_cuts cuts = fuzz_cuts_seed(data, size);
    run(text, n, data[0] & 1, NULL, &whole);
    run(text, n, data[0] & 1, &cuts, &cut);
    ev_same(&whole, &cut);
    check_subsequence(&whole, text, n);
    free(whole.s);
    free(cut.s);
    return 0;
}
