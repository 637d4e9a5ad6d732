/* The tokenizer and the streaming detokenizer on arbitrary bytes, with
 * tern-tiny's tokenizer (loaded once). The first byte picks the mode:
 *   bit 0  TERN_ENCODE_SPLIT_SPECIAL
 *   bit 1  the rest is not text but token ids (2 bytes each, modulo the vocabulary)
 * Text: valid UTF-8 must encode; NFC text must decode back to itself.
 * Both: the ids streamed through the detokenizer give valid UTF-8 equal to
 * the lossy decode of all of them (text/detok.h). */
#include <utf8proc.h>

#include "fuzz.h"
#include "tern.h"
#include "text/detok.h"
#include "text/utf8.h"

static tern_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tern_error err;
    tok = tern_tokenizer_load(FUZZ_ROOT "/models/tern-tiny", &err);
    if (!tok) { fprintf(stderr, "fuzz_tokenize: %s\n", err.msg); abort(); }
    return 0;
}

/* Streams ids through a detokenizer and compares with the lossy decode. */
static void check_detok(const int32_t *ids, size_t n, int skip_special) {
    tern_error err;
    tern_detok *d = tern_detok_create(tok, skip_special, &err);
    FUZZ_CHECK(d, "detok_create: %s", err.msg);
    char *streamed = NULL;
    size_t len = 0;
    const char *s;
    size_t sn;
    for (size_t i = 0; i <= n; i++) {
        if (i < n) FUZZ_CHECK(tern_detok_push(d, ids[i], &s, &sn, &err) == 0, "detok_push %d: %s", ids[i], err.msg);
        else tern_detok_flush(d, &s, &sn);
        FUZZ_CHECK(tern_utf8_valid_prefix(s, sn) == sn, "detok gave invalid UTF-8");
        if (!(streamed = realloc(streamed, len + sn + 1))) abort();
        memcpy(streamed + len, s, sn);
        len += sn;
    }
    tern_detok_free(d);
    char *raw;
    size_t rn, want_n;
    FUZZ_CHECK(tern_tokenizer_decode(tok, ids, n, skip_special, &raw, &rn, &err) == 0, "decode: %s", err.msg);
    char *want = tern_utf8_sanitize(raw, rn, &want_n);
    FUZZ_CHECK(want, "sanitize failed");
    FUZZ_CHECK(want_n == len && memcmp(want, streamed, len) == 0,
               "streamed detok (%zu bytes) differs from the lossy decode (%zu bytes)", len, want_n);
    free(want);
    free(raw);
    free(streamed);
}

static void text_mode(const char *text, size_t n, unsigned flags) {
    int32_t *ids = NULL;
    size_t nid = 0;
    tern_error err;
    int valid = tern_utf8_valid_prefix(text, n) == n;
    int rc = tern_tokenizer_encode(tok, text, n, flags, &ids, &nid, &err);
    FUZZ_CHECK(rc == 0 || !valid, "valid UTF-8 refused: %s", err.msg);
    if (rc != 0) return;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t nl = n && !memchr(text, 0, n)
                              ? utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &nfc,
                                             UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                              : -1;
    if (nl == (utf8proc_ssize_t)n && memcmp(nfc, text, n) == 0) {
        char *back;
        size_t bn;
        FUZZ_CHECK(tern_tokenizer_decode(tok, ids, nid, 0, &back, &bn, &err) == 0, "decode: %s", err.msg);
        FUZZ_CHECK(bn == n && memcmp(back, text, n) == 0, "NFC text does not round-trip (%zu -> %zu bytes)", n, bn);
        free(back);
    }
    free(nfc);
    check_detok(ids, nid, 0);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned mode = data[0];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    if (!(mode & 2)) {
        text_mode(text, n, mode & 1 ? TERN_ENCODE_SPLIT_SPECIAL : 0);
        return 0;
    }
    int32_t vocab = tern_tokenizer_vocab_size(tok);
    size_t nid = n / 2;
    int32_t *ids = malloc((nid + 1) * sizeof *ids);
    if (!ids) abort();
    for (size_t i = 0; i < nid; i++) ids[i] = (int32_t)((data[1 + 2 * i] | data[2 + 2 * i] << 8) % vocab);
    check_detok(ids, nid, mode & 1);
    free(ids);
    return 0;
}
