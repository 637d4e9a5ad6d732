/* The tokenizer's pre-tokenization: added tokens found leftmost-longest
 * with the HF flags (lstrip, rstrip, single_word, normalized), and the
 * PCRE2 regex splits (Isolated) whose pieces go to BPE. */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/utf8.h"

/* ---- added tokens ------------------------------------------------------- */

/* Unicode White_Space, what `tokenizers` strips for lstrip/rstrip. */
static bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex's Unicode \w, used by single_word: letters, marks, decimal
 * digits, letter numbers, connector punctuation, ZWNJ/ZWJ. */
static bool is_word_char(uint32_t c) {
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* The code point that ends s[0..end) (valid UTF-8). */
static uint32_t last_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp = 0;
    tern_utf8_decode(s + i, end - i, &cp);
    return cp;
}

static uint32_t first_cp(const char *s, size_t len) {
    uint32_t cp = 0;
    tern_utf8_decode(s, len, &cp);
    return cp;
}

/* Splits s into added tokens and the text between them, the way
 * `tokenizers` does (AddedVocabulary::find_matches): non-overlapping
 * leftmost-longest matches in order; a match that fails single_word, or a
 * special token under TERN_ENCODE_SPLIT_SPECIAL, is dropped but still
 * consumed; lstrip/rstrip take the adjacent White_Space into the token. The
 * splits are left in sc->splits (id -1 = text); returns their count or -1. */
long tern_tok_find_added(const added_set *set, scratch *sc, const char *s, size_t len,
                         unsigned flags) {
    size_t n = 0, start_offset = 0;
    for (size_t i = set->n ? 0 : len; i < len;) {
        unsigned char c = (unsigned char)s[i];
        const added_token *hit = NULL;
        for (uint32_t k = set->first[c]; k < set->first[c + 1]; k++) {
            const added_token *a = set->tok[k];
            if (a->len <= len - i && memcmp(s + i, a->content, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->len;
        i = stop;
        if ((flags & TERN_ENCODE_SPLIT_SPECIAL) && hit->special) continue;
        if (hit->single_word) {
            bool start_ok = start == 0 || !is_word_char(last_cp(s, start));
            bool stop_ok = stop == len || !is_word_char(first_cp(s + stop, len - stop));
            if (!start_ok || !stop_ok) continue;
        }
        if (hit->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                uint32_t cp = 0;
                tern_utf8_decode(s + p, ns - p, &cp);
                if (!is_white_space(cp)) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (hit->rstrip) {
            while (stop < len) {
                uint32_t cp = 0;
                int k = tern_utf8_decode(s + stop, len - stop, &cp);
                if (k == 0 || !is_white_space(cp)) break;
                stop += (size_t)k;
            }
        }
        /* rstrip may have run past where the next search starts; a later
         * match can then begin inside it, and `tokenizers` would emit
         * overlapping pieces. Clamping keeps the pieces a partition. */
        if (start < start_offset) start = start_offset;
        if (tern_tok_grow((void **)&sc->splits, &sc->splits_cap, n + 2, sizeof *sc->splits)) return -1;
        if (start_offset < start) sc->splits[n++] = (struct split){start_offset, start, -1};
        sc->splits[n++] = (struct split){start, stop, hit->id};
        start_offset = stop;
    }
    if (tern_tok_grow((void **)&sc->splits, &sc->splits_cap, n + 1, sizeof *sc->splits)) return -1;
    if (start_offset < len) sc->splits[n++] = (struct split){start_offset, len, -1};
    return (long)n;
}

/* ---- pre-tokenizer ------------------------------------------------------ */

/* Applies regex `level` to s (Isolated: matches and the gaps between them
 * are all pieces, empty ones dropped), passing each piece to the next level
 * and finally to BPE. Each piece is its own subject, so lookarounds such as
 * (?!\S) see the piece's end, as in `tokenizers`. */
int tern_tok_pre_tokenize(const tern_tokenizer *t, scratch *sc, size_t level, const char *s,
                          size_t len, idvec *out, tern_error *err) {
    if (len == 0) return 0;
    if (level == t->n_re) {
        if (tern_tok_bpe_word(t, sc, s, len, out)) return tern_fail(err, "out of memory");
        return 0;
    }
    size_t start = 0, pos = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    while (pos <= len) {
        int rc = pcre2_match(t->re[level], (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, sc->md,
                             sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tern_fail(err, "pre-tokenizer regex %zu: %s", level, (char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match still splits, as in `tokenizers` (Oniguruma's
             * find_iter): the gap before it is a piece of its own. Then
             * step over one character. */
            if (ms > start && tern_tok_pre_tokenize(t, sc, level + 1, s + start, ms - start, out, err)) return -1;
            if (ms > start) start = ms;
            if (ms >= len) break;
            pos = ms + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > start && tern_tok_pre_tokenize(t, sc, level + 1, s + start, ms - start, out, err)) return -1;
        if (tern_tok_pre_tokenize(t, sc, level + 1, s + ms, me - ms, out, err)) return -1;
        start = pos = me;
    }
    if (start < len) return tern_tok_pre_tokenize(t, sc, level + 1, s + start, len - start, out, err);
    return 0;
}
