/* JSON grammar rules (json_gram.h). */
#include "grammar/json_gram.h"

#include <stdlib.h>
#include <string.h>

void jg_init(jg_rules *j, gr_grammar *g) {
    memset(j, -1, sizeof *j);
    j->g = g;
}

static int single(gr_grammar *g, unsigned lo, unsigned hi) {
    gr_class c = {{0}};
    gr_class_range(&c, lo, hi);
    return gr_class_id(g, &c);
}

static int class_of(gr_grammar *g, const char *bytes) {
    gr_class c = {{0}};
    for (const char *p = bytes; *p; p++) gr_class_add(&c, (unsigned char)*p);
    return gr_class_id(g, &c);
}

/* A rule of one literal alternative. */
static int lit_rule(gr_grammar *g, const char *hint, const char *text) {
    gr_seq s = {0};
    gr_seq_str(g, &s, text);
    int r = gr_rule_of_seq(g, hint, &s);
    gr_seq_free(&s);
    return r;
}

int jg_ws(jg_rules *j) {
    if (j->ws >= 0) return j->ws;
    gr_grammar *g = j->g;
    gr_seq sp = {0}, empty = {0}, nl = {0};
    gr_seq_class(&sp, class_of(g, " \t"));
    int indent = gr_repeat(g, &sp, 0, JG_INDENT);
    j->ws = gr_rule_new(g, "ws");
    gr_alt(g, j->ws, &empty);
    gr_seq_free(&sp);
    gr_seq_str(g, &sp, " ");
    gr_alt(g, j->ws, &sp);
    gr_seq_str(g, &nl, "\n");
    gr_seq_ref(&nl, indent);
    gr_alt(g, j->ws, &nl);
    gr_seq_free(&sp);
    gr_seq_free(&nl);
    return j->ws;
}

int jg_lead(jg_rules *j) {
    if (j->lead >= 0) return j->lead;
    gr_seq s = {0};
    gr_seq_class(&s, class_of(j->g, " \n"));
    j->lead = gr_repeat(j->g, &s, 0, 2);
    gr_seq_free(&s);
    return j->lead;
}

/* \u and four hex digits naming neither U+0000 nor a surrogate. */
static int hex4(gr_grammar *g) {
    const char *hex = "0123456789abcdefABCDEF";
    int h = class_of(g, hex), nz = class_of(g, "123456789abcdefABCDEF"), zero = class_of(g, "0");
    int r = gr_rule_new(g, "hex4");
    gr_seq s = {0};
    for (int lead_zeros = 3; lead_zeros >= 0; lead_zeros--) {
        s.n = 0;
        for (int i = 0; i < lead_zeros; i++) gr_seq_class(&s, zero);
        gr_seq_class(&s, lead_zeros ? nz : class_of(g, "123456789abcefABCEF"));
        for (int i = lead_zeros + 1; i < 4; i++) gr_seq_class(&s, h);
        gr_alt(g, r, &s);
    }
    s.n = 0;
    gr_seq_class(&s, class_of(g, "dD"));
    gr_seq_class(&s, single(g, '0', '7'));
    gr_seq_class(&s, h);
    gr_seq_class(&s, h);
    gr_alt(g, r, &s);
    gr_seq_free(&s);
    return r;
}

static int kmp_next(const char *stop, int k, unsigned b);

/* A string body: in xml mode a KMP automaton over "</parameter>" (state
 * k: the last k bytes are its start), so the text never holds it; else
 * one state. Each state: plain ASCII to the state it leads to, a
 * multibyte character or an escape back to the first state (neither can
 * be part of the stop string), or the end. */
static int string_body(jg_rules *j, const char *stop) {
    gr_grammar *g = j->g;
    int n = stop ? (int)strlen(stop) : 1, sb[32];
    for (int k = 0; k < n; k++) sb[k] = gr_rule_new(g, stop ? "xstr-body" : "str-body");
    int mb = gr_rule_new(g, "str-mb"), u4 = hex4(g);
    uint32_t lo = 0x80, hi = 0x10FFFF;
    gr_class unused = {{0}};
    gr_utf8_alts(g, mb, &lo, &hi, 1, sb[0], &unused);
    gr_seq s = {0};
    for (int k = 0; k < n; k++) {
        gr_class to[33];
        memset(to, 0, sizeof to);
        for (unsigned b = 0x20; b < 0x80; b++)
            if (b != '"' && b != '\\') gr_class_add(&to[stop ? kmp_next(stop, k, b) : 0], b);
        for (int t = 0; t < n; t++) {
            if (!gr_class_count(&to[t])) continue;
            s.n = 0;
            gr_seq_class(&s, gr_class_id(g, &to[t]));
            gr_seq_ref(&s, sb[t]);
            gr_alt(g, sb[k], &s);
        }
        s.n = 0;
        gr_seq_ref(&s, mb);
        gr_alt(g, sb[k], &s);
        s.n = 0;
        gr_seq_str(g, &s, "\\");
        gr_seq_class(&s, class_of(g, "\"\\/bfnrt"));
        gr_seq_ref(&s, sb[0]);
        gr_alt(g, sb[k], &s);
        s.n = 0;
        gr_seq_str(g, &s, "\\u");
        gr_seq_ref(&s, u4);
        gr_seq_ref(&s, sb[0]);
        gr_alt(g, sb[k], &s);
        s.n = 0;
        gr_alt(g, sb[k], &s);
    }
    gr_seq_free(&s);
    return sb[0];
}

int jg_string(jg_rules *j, int xml) {
    if (j->string[xml] >= 0) return j->string[xml];
    gr_grammar *g = j->g;
    int body = string_body(j, xml ? "</parameter>" : NULL);
    gr_seq s = {0};
    gr_seq_str(g, &s, "\"");
    gr_seq_ref(&s, body);
    gr_seq_str(g, &s, "\"");
    j->string[xml] = gr_rule_of_seq(g, "string", &s);
    gr_seq_free(&s);
    return j->string[xml];
}

int jg_integer(jg_rules *j) {
    if (j->integer >= 0) return j->integer;
    gr_grammar *g = j->g;
    gr_seq s = {0};
    gr_seq_class(&s, single(g, '0', '9'));
    int digits = gr_repeat(g, &s, 0, JG_INT_DIGITS - 1);
    int uint = gr_rule_new(g, "uint");
    s.n = 0;
    gr_seq_str(g, &s, "0");
    gr_alt(g, uint, &s);
    s.n = 0;
    gr_seq_class(&s, single(g, '1', '9'));
    gr_seq_ref(&s, digits);
    gr_alt(g, uint, &s);
    j->integer = gr_rule_new(g, "integer");
    s.n = 0;
    gr_seq_str(g, &s, "-");
    gr_seq_ref(&s, uint);
    gr_alt(g, j->integer, &s);
    s.n = 0;
    gr_seq_ref(&s, uint);
    gr_alt(g, j->integer, &s);
    gr_seq_free(&s);
    return j->integer;
}

int jg_number(jg_rules *j) {
    if (j->number >= 0) return j->number;
    gr_grammar *g = j->g;
    gr_seq d = {0}, s = {0};
    gr_seq_class(&d, single(g, '0', '9'));
    gr_seq_str(g, &s, ".");
    gr_seq_ref(&s, gr_repeat(g, &d, 1, 15));
    int frac = gr_opt(g, &s);
    s.n = 0;
    gr_seq_class(&s, class_of(g, "eE"));
    gr_seq sign = {0};
    gr_seq_class(&sign, class_of(g, "+-"));
    gr_seq_ref(&s, gr_opt(g, &sign));
    gr_seq_ref(&s, gr_repeat(g, &d, 1, 2));
    int exp = gr_opt(g, &s);
    s.n = 0;
    gr_seq_ref(&s, jg_integer(j));
    gr_seq_ref(&s, frac);
    gr_seq_ref(&s, exp);
    j->number = gr_rule_of_seq(g, "number", &s);
    gr_seq_free(&d);
    gr_seq_free(&s);
    gr_seq_free(&sign);
    return j->number;
}

int jg_boolean(jg_rules *j) {
    if (j->boolean >= 0) return j->boolean;
    j->boolean = lit_rule(j->g, "boolean", "true");
    gr_seq s = {0};
    gr_seq_str(j->g, &s, "false");
    gr_alt(j->g, j->boolean, &s);
    gr_seq_free(&s);
    return j->boolean;
}

int jg_null(jg_rules *j) {
    if (j->null_ < 0) j->null_ = lit_rule(j->g, "null", "null");
    return j->null_;
}

/* open ws (item ws ("," ws item ws)*)? close */
static int container(jg_rules *j, const char *hint, const char *open, const char *close, const gr_seq *item) {
    gr_grammar *g = j->g;
    int ws = jg_ws(j);
    gr_seq more = {0}, s = {0}, empty = {0};
    gr_seq_str(g, &more, ",");
    gr_seq_ref(&more, ws);
    gr_seq_cat(&more, item);
    gr_seq_ref(&more, ws);
    gr_seq_cat(&s, item);
    gr_seq_ref(&s, ws);
    gr_seq_ref(&s, gr_star(g, &more));
    int body = gr_rule_new(g, hint);
    gr_alt(g, body, &s);
    gr_alt(g, body, &empty);
    s.n = 0;
    gr_seq_str(g, &s, open);
    gr_seq_ref(&s, ws);
    gr_seq_ref(&s, body);
    gr_seq_str(g, &s, close);
    int r = gr_rule_of_seq(g, hint, &s);
    gr_seq_free(&more);
    gr_seq_free(&s);
    return r;
}

/* value, object and array refer to each other: value's id comes first,
 * and object or array asked for alone make value (which makes them). */
int jg_value(jg_rules *j, int xml) {
    if (j->value[xml] >= 0) return j->value[xml];
    gr_grammar *g = j->g;
    int v = j->value[xml] = gr_rule_new(g, "value");
    int alts[] = {jg_object(j, xml), jg_array(j, xml), jg_string(j, xml), jg_number(j), jg_boolean(j), jg_null(j)};
    gr_seq s = {0};
    for (int i = 0; i < 6; i++) {
        s.n = 0;
        gr_seq_ref(&s, alts[i]);
        gr_alt(g, v, &s);
    }
    gr_seq_free(&s);
    return v;
}

int jg_object(jg_rules *j, int xml) {
    if (j->object[xml] >= 0) return j->object[xml];
    if (j->value[xml] < 0) {
        jg_value(j, xml);
        return j->object[xml];
    }
    gr_grammar *g = j->g;
    gr_seq kv = {0};
    gr_seq_ref(&kv, jg_string(j, xml));
    gr_seq_ref(&kv, jg_ws(j));
    gr_seq_str(g, &kv, ":");
    gr_seq_ref(&kv, jg_ws(j));
    gr_seq_ref(&kv, j->value[xml]);
    j->object[xml] = container(j, "object", "{", "}", &kv);
    gr_seq_free(&kv);
    return j->object[xml];
}

int jg_array(jg_rules *j, int xml) {
    if (j->array[xml] >= 0) return j->array[xml];
    if (j->value[xml] < 0) {
        jg_value(j, xml);
        return j->array[xml];
    }
    gr_seq item = {0};
    gr_seq_ref(&item, j->value[xml]);
    j->array[xml] = container(j, "array", "[", "]", &item);
    gr_seq_free(&item);
    return j->array[xml];
}

int jg_literal(jg_rules *j, gr_seq *s, json_t *v, int xml) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | (xml ? JSON_ESCAPE_SLASH : 0));
    if (!text) return -1;
    gr_seq_str(j->g, s, text);
    free(text);
    return 0;
}

/* The KMP step: the length of the longest prefix of stop that is a suffix of
 * stop[0..k) + b. */
static int kmp_next(const char *stop, int k, unsigned b) {
    for (;;) {
        if ((unsigned char)stop[k] == b) return k + 1;
        if (k == 0) return 0;
        /* the longest proper border of stop[0..k) */
        int m = k - 1;
        while (m > 0 && memcmp(stop, stop + k - m, (size_t)m)) m--;
        k = m;
    }
}

int jg_text_without(jg_rules *j, const char *stop, int utf8) {
    gr_grammar *g = j->g;
    int n = (int)strlen(stop);
    if (n < 1 || n > 32) return -1;
    int rule[32], mb = -1;
    for (int k = 0; k < n; k++) rule[k] = gr_rule_new(g, utf8 ? "text" : "bytes");
    gr_class allowed = {{0}};
    if (utf8) {
        gr_class_range(&allowed, 0x20, 0x7E);
        gr_class_add(&allowed, '\t');
        gr_class_add(&allowed, '\n');
        gr_class_add(&allowed, '\r');
        mb = gr_rule_new(g, "text-mb");
        uint32_t lo = 0x80, hi = 0x10FFFF;
        gr_class unused = {{0}};
        gr_utf8_alts(g, mb, &lo, &hi, 1, rule[0], &unused);
    } else {
        gr_class_range(&allowed, 0, 255);
    }
    gr_seq s = {0};
    for (int k = 0; k < n; k++) {
        gr_class to[33];
        memset(to, 0, sizeof to);
        for (unsigned b = 0; b < 256; b++)
            if (gr_class_has(&allowed, b)) gr_class_add(&to[kmp_next(stop, k, b)], b);
        for (int t = 0; t < n; t++) {
            if (!gr_class_count(&to[t])) continue;
            s.n = 0;
            gr_seq_class(&s, gr_class_id(g, &to[t]));
            gr_seq_ref(&s, rule[t]);
            gr_alt(g, rule[k], &s);
        }
        if (mb >= 0) {
            s.n = 0;
            gr_seq_ref(&s, mb);
            gr_alt(g, rule[k], &s);
        }
        s.n = 0;
        gr_alt(g, rule[k], &s);
    }
    gr_seq_free(&s);
    return rule[0];
}
