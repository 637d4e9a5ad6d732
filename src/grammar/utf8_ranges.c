/* Code point ranges as UTF-8 byte sequences: each range is cut where the
 * encoding's length changes, then where a byte other than the last would
 * not span a whole run of continuation bytes, so that every piece is a
 * sequence of byte ranges. */
#include "grammar/grammar.h"

static int encode(uint32_t cp, unsigned char *b) {
    if (cp < 0x80) { b[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { b[0] = (unsigned char)(0xC0 | cp >> 6); b[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | cp >> 18);
    b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/* lo..hi of one encoded length. */
static void pieces(gr_grammar *g, int rule, int then, gr_class *ascii, uint32_t lo, uint32_t hi) {
    int n = utf8_len(lo);
    if (n == 1) { gr_class_range(ascii, lo, hi); return; }
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) {
            pieces(g, rule, then, ascii, lo, lo | m);
            pieces(g, rule, then, ascii, (lo | m) + 1, hi);
            return;
        }
        if ((hi & m) != m) {
            pieces(g, rule, then, ascii, lo, (hi & ~m) - 1);
            pieces(g, rule, then, ascii, hi & ~m, hi);
            return;
        }
    }
    unsigned char a[4], b[4];
    encode(lo, a);
    encode(hi, b);
    gr_seq s = {0};
    for (int j = 0; j < n; j++) {
        gr_class c = {{0}};
        gr_class_range(&c, a[j], b[j]);
        gr_seq_class(&s, gr_class_id(g, &c));
    }
    if (then >= 0) gr_seq_ref(&s, then);
    gr_alt(g, rule, &s);
    gr_seq_free(&s);
}

/* Cut at the length boundaries and around the surrogates. */
static void range(gr_grammar *g, int rule, int then, gr_class *ascii, uint32_t lo, uint32_t hi) {
    static const uint32_t cuts[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (int i = 0; i < 5; i++) {
        uint32_t a = lo > cuts[i][0] ? lo : cuts[i][0], b = hi < cuts[i][1] ? hi : cuts[i][1];
        if (a <= b) pieces(g, rule, then, ascii, a, b);
    }
}

void gr_utf8_alts(gr_grammar *g, int rule, const uint32_t *lo, const uint32_t *hi, int n, int then, gr_class *ascii) {
    for (int i = 0; i < n; i++) range(g, rule, then, ascii, lo[i], hi[i]);
    g->rules[rule].defined = 1;
}

int gr_utf8_rule(gr_grammar *g, const uint32_t *lo, const uint32_t *hi, int n) {
    int rule = gr_rule_new(g, "char");
    gr_class ascii = {{0}};
    gr_utf8_alts(g, rule, lo, hi, n, -1, &ascii);
    if (gr_class_count(&ascii)) {
        gr_seq s = {0};
        gr_seq_class(&s, gr_class_id(g, &ascii));
        gr_alt(g, rule, &s);
        gr_seq_free(&s);
    }
    g->rules[rule].defined = 1;   /* an empty set: no alternative, a rule that never finishes */
    return rule;
}
