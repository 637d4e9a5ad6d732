/* GBNF, the grammar text llama.cpp takes (the "grammar" request field,
 * tern run --grammar-file):
 *
 *     root  ::= answer ("\n" answer)*
 *     answer ::= "yes" | "no" | [0-9]+ | ( [^"\\] | "\\" . ){1,16}
 *
 * Rules name ::= alternatives; elements are "literals" (escapes \n \r \t
 * \\ \" \xHH \uHHHH \UHHHHHHHH), [character classes] (ranges, ^ to
 * negate), . (any character), rule names and ( groups ), each optionally
 * followed by *, +, ?, {m}, {m,} or {m,n}; # starts a comment. A rule's
 * alternatives may span lines: it ends where the next "name ::=" begins.
 * Characters are Unicode code points, matched as UTF-8. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "util/err.h"
#include "util/strmap.h"

#define MAX_REPEAT 4096
#define MAX_NEST 64

typedef struct gp {
    gr_grammar *g;
    const char *s, *p;
    tern_error *err;
    int depth;
    int failed;
} gp;

static int line_of(const gp *c) {
    int n = 1;
    for (const char *q = c->s; q < c->p; q++) n += *q == '\n';
    return n;
}

static int fail(gp *c, const char *what) {
    if (!c->failed) tern_fail(c->err, "grammar line %d: %s", line_of(c), what);
    c->failed = 1;
    return -1;
}

static void skip_space(gp *c) {
    for (;;) {
        while (*c->p && isspace((unsigned char)*c->p)) c->p++;
        if (*c->p != '#') return;
        while (*c->p && *c->p != '\n') c->p++;
    }
}

static int is_word(char ch) { return isalnum((unsigned char)ch) || ch == '-' || ch == '_'; }

static size_t word_len(const char *p) {
    size_t n = 0;
    while (is_word(p[n])) n++;
    return n;
}

/* At "name ::=": the next rule begins. */
static int at_rule_start(gp *c) {
    size_t n = word_len(c->p);
    if (!n) return 0;
    const char *q = c->p + n;
    while (*q && isspace((unsigned char)*q)) q++;
    return !strncmp(q, "::=", 3);
}

static int hex_value(gp *c, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        char ch = *c->p;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return fail(c, "a hex escape needs hex digits");
        v = v * 16 + (uint32_t)d;
        c->p++;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class (an escape or UTF-8). */
static int read_char(gp *c, uint32_t *cp) {
    unsigned char ch = (unsigned char)*c->p;
    if (!ch) return fail(c, "unexpected end of the grammar");
    if (ch == '\\') {
        c->p++;
        char e = *c->p++;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case 'x': return hex_value(c, 2, cp);
        case 'u': return hex_value(c, 4, cp);
        case 'U': return hex_value(c, 8, cp);
        case '\0': return fail(c, "unexpected end of the grammar");
        default: *cp = (unsigned char)e; return 0;
        }
    }
    int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
    if (!n) return fail(c, "invalid UTF-8");
    uint32_t v = n == 1 ? ch : ch & (0xFF >> (n + 1));
    for (int i = 1; i < n; i++) {
        unsigned char k = (unsigned char)c->p[i];
        if ((k & 0xC0) != 0x80) return fail(c, "invalid UTF-8");
        v = v << 6 | (k & 0x3F);
    }
    c->p += n;
    *cp = v;
    return 0;
}

static size_t utf8_encode(uint32_t cp, char *b) {
    if (cp < 0x80) { b[0] = (char)cp; return 1; }
    if (cp < 0x800) { b[0] = (char)(0xC0 | cp >> 6); b[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12); b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); b[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | cp >> 18); b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int literal(gp *c, gr_seq *s) {
    c->p++;
    while (*c->p != '"') {
        uint32_t cp;
        if (read_char(c, &cp)) return -1;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail(c, "a literal names no valid character");
        char b[4];
        gr_seq_lit(c->g, s, b, utf8_encode(cp, b));
    }
    c->p++;
    return 0;
}

/* Sorts ranges and merges those that touch; returns the count. */
static int merge_ranges(uint32_t *lo, uint32_t *hi, int n) {
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && lo[k] < lo[k - 1]; k--) {
            uint32_t a = lo[k], b = hi[k];
            lo[k] = lo[k - 1], hi[k] = hi[k - 1], lo[k - 1] = a, hi[k - 1] = b;
        }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && lo[i] <= hi[m - 1] + 1) {
            if (hi[i] > hi[m - 1]) hi[m - 1] = hi[i];
        } else {
            lo[m] = lo[i], hi[m] = hi[i], m++;
        }
    }
    return m;
}

/* A class as code point ranges; a rule of their UTF-8 forms, or one
 * class element when every character is ASCII. */
static int char_class(gp *c, gr_seq *s, int *set_rule) {
    uint32_t lo[512], hi[512];
    int n = 0, neg = 0;
    c->p++;
    if (*c->p == '^') neg = 1, c->p++;
    while (*c->p != ']') {
        uint32_t a, b;
        if (read_char(c, &a)) return -1;
        b = a;
        if (c->p[0] == '-' && c->p[1] != ']') {
            c->p++;
            if (read_char(c, &b)) return -1;
        }
        if (b < a) return fail(c, "a class range runs backwards");
        if (n == 512) return fail(c, "a class of more than 512 ranges");
        lo[n] = a, hi[n] = b, n++;
    }
    c->p++;
    n = merge_ranges(lo, hi, n);
    if (neg) {
        uint32_t nlo[513], nhi[513], at = 0;
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (lo[i] > at) nlo[m] = at, nhi[m] = lo[i] - 1, m++;
            at = hi[i] + 1;
        }
        if (at <= 0x10FFFF) nlo[m] = at, nhi[m] = 0x10FFFF, m++;
        memcpy(lo, nlo, (size_t)m * sizeof *lo);
        memcpy(hi, nhi, (size_t)m * sizeof *hi);
        n = m;
    }
    int ascii = 1;
    for (int i = 0; i < n; i++) ascii &= hi[i] < 0x80;
    if (ascii && n) {
        gr_class cl = {{0}};
        for (int i = 0; i < n; i++) gr_class_range(&cl, lo[i], hi[i]);
        gr_seq_class(s, gr_class_id(c->g, &cl));
        return 0;
    }
    int r = gr_utf8_rule(c->g, lo, hi, n);
    gr_seq_ref(s, r);
    *set_rule = r;
    return 0;
}

static int alternates(gp *c, int rule);

static int read_int(gp *c, int *out) {
    if (!isdigit((unsigned char)*c->p)) return fail(c, "a repetition count needs digits");
    long v = 0;
    while (isdigit((unsigned char)*c->p)) {
        v = v * 10 + (*c->p++ - '0');
        if (v > MAX_REPEAT) return fail(c, "repetition counts above 4096 are not supported");
    }
    *out = (int)v;
    return 0;
}

/* R ::= alt_1 R | ... | alt_k R | empty, the alternatives of a character
 * set rule copied in, so the repetition stays one rule. */
static int star_of_set(gr_grammar *g, int set) {
    int r = gr_rule_new(g, "star");
    gr_seq s = {0}, empty = {0};
    for (int a = 0; a < g->rules[set].n_alts; a++) {
        s.n = 0;
        gr_seq_cat(&s, &g->rules[set].alts[a]);
        gr_seq_ref(&s, r);
        gr_alt(g, r, &s);
    }
    gr_alt(g, r, &empty);
    gr_seq_free(&s);
    return r;
}

static int postfix(gp *c, gr_seq *s, const gr_seq *item, int set_rule) {
    gr_grammar *g = c->g;
    char op = *c->p;
    if (op == '*' || op == '+' || op == '?') {
        c->p++;
        if (op == '?') gr_seq_ref(s, gr_opt(g, item));
        else if (set_rule >= 0) {
            if (op == '+') gr_seq_cat(s, item);
            gr_seq_ref(s, star_of_set(g, set_rule));
        } else {
            gr_seq_ref(s, op == '*' ? gr_star(g, item) : gr_plus(g, item));
        }
        return 0;
    }
    if (op == '{') {
        int lo, hi;
        c->p++;
        skip_space(c);
        if (read_int(c, &lo)) return -1;
        skip_space(c);
        hi = lo;
        if (*c->p == ',') {
            c->p++;
            skip_space(c);
            hi = -1;
            if (*c->p != '}' && read_int(c, &hi)) return -1;
            skip_space(c);
        }
        if (*c->p != '}') return fail(c, "expected '}' after a repetition count");
        c->p++;
        if (hi >= 0 && hi < lo) return fail(c, "a repetition's maximum is below its minimum");
        gr_seq_ref(s, gr_repeat(g, item, lo, hi));
        return 0;
    }
    gr_seq_cat(s, item);
    return 0;
}

static int sequence(gp *c, gr_seq *s) {
    gr_grammar *g = c->g;
    for (;;) {
        skip_space(c);
        char ch = *c->p;
        gr_seq item = {0};
        int set_rule = -1, rc = 0;
        if (ch == '"') {
            rc = literal(c, &item);
        } else if (ch == '[') {
            rc = char_class(c, &item, &set_rule);
        } else if (ch == '.') {
            c->p++;
            uint32_t lo = 0, hi = 0x10FFFF;
            set_rule = gr_utf8_rule(g, &lo, &hi, 1);
            gr_seq_ref(&item, set_rule);
        } else if (ch == '(') {
            if (++c->depth > MAX_NEST) return fail(c, "groups nested deeper than 64");
            c->p++;
            int r = gr_rule_new(g, "group");
            rc = alternates(c, r);
            if (!rc && *c->p != ')') rc = fail(c, "expected ')'");
            if (!rc) c->p++;
            c->depth--;
            gr_seq_ref(&item, r);
        } else if (is_word(ch) && !at_rule_start(c)) {
            size_t n = word_len(c->p);
            char name[128];
            if (n >= sizeof name) return fail(c, "a rule name longer than 127 characters");
            memcpy(name, c->p, n);
            name[n] = '\0';
            c->p += n;
            gr_seq_ref(&item, gr_rule_named(g, name));
        } else {
            return 0;
        }
        if (!rc) rc = postfix(c, s, &item, set_rule);
        gr_seq_free(&item);
        if (rc) return -1;
    }
}

static int alternates(gp *c, int rule) {
    for (;;) {
        gr_seq s = {0};
        int rc = sequence(c, &s);
        if (!rc) gr_alt(c->g, rule, &s);
        gr_seq_free(&s);
        if (rc) return -1;
        skip_space(c);
        if (*c->p != '|') return 0;
        c->p++;
    }
}

int gbnf_parse(gr_grammar *g, const char *text, tern_error *err) {
    gp c = {.g = g, .s = text, .p = text, .err = err};
    for (;;) {
        skip_space(&c);
        if (!*c.p) break;
        size_t n = word_len(c.p);
        if (!n || !at_rule_start(&c)) return fail(&c, "expected a rule: name ::= ...");
        char name[128];
        if (n >= sizeof name) return fail(&c, "a rule name longer than 127 characters");
        memcpy(name, c.p, n);
        name[n] = '\0';
        int r = gr_rule_named(g, name);
        if (g->oom) return tern_fail(err, "out of memory");
        /* (only a definition gives a named rule alternatives) */
        if (g->rules[r].defined) {
            char msg[200];
            snprintf(msg, sizeof msg, "rule '%s' is defined twice", name);
            return fail(&c, msg);
        }
        c.p = strstr(c.p, "::=") + 3;
        if (alternates(&c, r)) return -1;
        skip_space(&c);
        if (*c.p && !at_rule_start(&c)) return fail(&c, "unexpected character");
    }
    intptr_t root = g->names ? (intptr_t)tern_strmap_get(g->names, "root") : 0;   /* (rule id + 1) */
    return root ? (int)root - 1 : tern_fail(err, "grammar: no rule named root");
}
