/* Output parsing for Qwen3.6; see tool_parse.h. Three layers, bottom up:
 * typing a parameter's text (tern_tool_param_value), reading one call body
 * (parse_call, a pure function of the text seen so far), and the streaming
 * scanner that finds calls in the answer text and runs parse_call as the
 * body grows. The output parser on top puts the reasoning splitter in
 * front of the scanner. */
#include "text/tool_parse.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "text/chat_json.h"
#include "text/reasoning_parse.h"
#include "util/err.h"

/* ---- typing parameter values ------------------------------------------- */

/* The schema a local "$ref" ("#/..." within root) points to, followed
 * to the end of a chain; the schema itself otherwise. */
json_t *tern_schema_resolve(json_t *root, json_t *schema) {
    for (int hops = 0; hops < 32 && json_is_object(schema); hops++) {
        const char *ref = json_string_value(json_object_get(schema, "$ref"));
        if (!ref || !root || ref[0] != '#') return schema;
        json_t *at = root;
        const char *p = ref + 1;
        while (at && *p == '/') {
            p++;
            char key[256];
            size_t n = 0;
            for (; *p && *p != '/' && n + 1 < sizeof key; p++) {
                if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) key[n++] = p[1] == '0' ? '~' : '/', p++;
                else key[n++] = *p;
            }
            key[n] = '\0';
            at = json_is_array(at) ? json_array_get(at, strtoul(key, NULL, 10)) : json_object_get(at, key);
        }
        if (!at || *p) return schema;
        schema = at;
    }
    return schema;
}

/* The JSON type of every value of an enum (or a const), or NULL when they
 * differ. */
static const char *values_type(json_t *schema) {
    json_t *vals = json_object_get(schema, "enum"), *c = json_object_get(schema, "const");
    const char *t = NULL;
    size_t n = c ? 1 : json_array_size(vals);
    for (size_t i = 0; i < n; i++) {
        json_t *v = c ? c : json_array_get(vals, i);
        const char *vt = json_is_string(v) ? "string" : json_is_integer(v) ? "integer" : json_is_real(v) ? "number"
                         : json_is_boolean(v) ? "boolean" : NULL;
        if (!vt || (t && strcmp(t, vt))) return NULL;
        t = vt;
    }
    return t;
}

/* The type a schema names: its "type" string, else that of its enum or
 * const values. */
static const char *named_type(json_t *schema) {
    json_t *t = json_object_get(schema, "type");
    if (json_is_string(t)) return json_string_value(t);
    if (t) return NULL;
    return values_type(schema);
}

/* The schema's type, lower-cased into out (empty when there is none);
 * *nullable when the schema also admits null. Lists of types and
 * anyOf/oneOf unions contribute their first non-null type; local $refs
 * are followed. */
static void schema_type(json_t *schema, json_t *root, char out[32], int *nullable) {
    out[0] = '\0';
    *nullable = 0;
    schema = tern_schema_resolve(root, schema);
    if (!json_is_object(schema)) return;
    json_t *t = json_object_get(schema, "type"), *opts = NULL;
    const char *named = named_type(schema);
    if (named) {
        snprintf(out, 32, "%s", named);
    } else if (json_is_array(t)) {
        opts = t;
    } else {
        opts = json_object_get(schema, "anyOf");
        if (!json_is_array(opts)) opts = json_object_get(schema, "oneOf");
    }
    size_t i;
    json_t *o;
    json_array_foreach(opts, i, o) {
        json_t *r = tern_schema_resolve(root, o);
        const char *ot = json_is_object(r) ? named_type(r) : json_string_value(o);
        if (!ot) continue;
        if (strcasecmp(ot, "null") == 0) *nullable = 1;
        else if (!out[0]) snprintf(out, 32, "%s", ot);
    }
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
    if (strcmp(out, "null") == 0) *nullable = 1;
}

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int is_string_type(const char *t) {
    static const char *names[] = {"string", "str", "text", "varchar", "char", "enum"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(t, names[i]) == 0) return 1;
    return 0;
}

static int is_int_type(const char *t) {
    return starts_with(t, "int") || starts_with(t, "uint") || starts_with(t, "long") ||
           starts_with(t, "short") || starts_with(t, "unsigned");
}

static int is_container_type(const char *t) {
    return !strcmp(t, "object") || !strcmp(t, "array") || !strcmp(t, "arr") ||
           starts_with(t, "dict") || starts_with(t, "list");
}

static int is_num_type(const char *t) { return starts_with(t, "num") || starts_with(t, "float"); }
static int is_bool_type(const char *t) { return !strcmp(t, "boolean") || !strcmp(t, "bool") || !strcmp(t, "binary"); }

int tern_tool_param_kind(json_t *schema, json_t *root, int *nullable) {
    char type[32];
    schema_type(schema, root, type, nullable);
    if (!type[0]) return TERN_PARAM_UNTYPED;
    if (is_string_type(type)) return TERN_PARAM_STRING;
    if (!strcmp(type, "null")) return TERN_PARAM_NULL;
    if (is_int_type(type)) return TERN_PARAM_INT;
    if (is_num_type(type)) return TERN_PARAM_NUMBER;
    if (is_bool_type(type)) return TERN_PARAM_BOOL;
    if (is_container_type(type)) return TERN_PARAM_CONTAINER;
    return TERN_PARAM_UNTYPED;
}

/* Python's int(text): surrounding whitespace, a sign, digits (single
 * underscores between digits allowed). */
static int parse_py_int(const char *s, json_int_t *out) {
    char digits[32];
    size_t n = 0;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '+' || *s == '-') digits[n++] = *s++;
    if (!isdigit((unsigned char)*s)) return 0;
    for (; *s && !isspace((unsigned char)*s); s++) {
        if (*s == '_' && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[-1])) continue;
        if (!isdigit((unsigned char)*s) || n + 1 >= sizeof digits) return 0;
        digits[n++] = *s;
    }
    while (isspace((unsigned char)*s)) s++;
    if (*s) return 0;
    digits[n] = '\0';
    errno = 0;
    long long v = strtoll(digits, NULL, 10);
    if (errno) return 0;
    *out = (json_int_t)v;
    return 1;
}

/* Python's float(text), finite values only (vLLM keeps nan/inf as text). */
static int parse_py_float(const char *s, double *out) {
    while (isspace((unsigned char)*s)) s++;
    if (strpbrk(s, "xXnNiI")) return 0;  /* no hex floats, nan or inf */
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE) return 0;
    while (isspace((unsigned char)*end)) end++;
    if (*end || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

static json_t *number_value(double v) {
    if (v == floor(v) && fabs(v) < 9.2e18) return json_integer((json_int_t)v);
    return json_real(v);
}

/* Text that reads as a JSON non-string (number, bool, null, object,
 * array); NULL otherwise. */
static json_t *json_non_string(const char *text, size_t len) {
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    if (v && json_is_string(v)) {
        json_decref(v);
        return NULL;
    }
    return v;
}

static json_t *typed_value(const char *s, size_t len, const char *type, int nullable) {
    int is_null = !strcasecmp(s, "null") || !strcasecmp(s, "none");
    if (nullable && is_null) return json_null();
    if (is_string_type(type)) return json_stringn(s, len);
    if (is_null) return json_null();
    json_int_t i;
    double d;
    if (is_int_type(type)) return parse_py_int(s, &i) ? json_integer(i) : json_stringn(s, len);
    if (is_num_type(type))
        return parse_py_float(s, &d) ? number_value(d) : json_stringn(s, len);
    if (is_bool_type(type))
        return json_boolean(!strcasecmp(s, "true"));
    json_t *v = is_container_type(type) ? json_loadb(s, len, JSON_DECODE_ANY, NULL)
                                        : json_non_string(s, len);
    return v ? v : json_stringn(s, len);
}

json_t *tern_tool_param_value(const char *text, size_t len, json_t *schema) {
    return tern_tool_param_value_in(text, len, schema, NULL);
}

json_t *tern_tool_param_value_in(const char *text, size_t len, json_t *schema, json_t *root) {
    char type[32];
    int nullable;
    schema_type(schema, root, type, &nullable);
    /* Comparisons below want a NUL-terminated copy; a value with an
     * embedded NUL is kept as a string. */
    if (memchr(text, '\0', len)) return json_stringn(text, len);
    char *s = strndup(text, len);
    if (!s) return NULL;
    json_t *v;
    if (type[0]) {
        v = typed_value(s, len, type, nullable);
    } else {
        v = json_non_string(s, len);
        if (!v) v = json_stringn(s, len);
    }
    free(s);
    return v;
}

json_t *tern_tool_parameters(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t;
        json_t *n = json_object_get(fn, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name) != 0) continue;
        json_t *params = json_object_get(fn, "parameters");
        return json_is_object(params) ? params : NULL;
    }
    return NULL;
}

json_t *tern_tool_properties(json_t *tools, const char *name) {
    json_t *props = json_object_get(tern_tool_parameters(tools, name), "properties");
    return json_is_object(props) ? props : NULL;
}

/* ---- reading one call ------------------------------------------------------ */

static const char TOOL_OPEN[] = "<tool_call>", TOOL_CLOSE[] = "</tool_call>",
                  FN_OPEN[] = "<function=", FN_CLOSE[] = "</function>",
                  PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>";

enum parse_status { P_MORE, P_DONE, P_BAD };

/* Text of a call body with a read position; at_end: no more text comes. */
typedef struct cursor {
    const char *s;
    size_t n, i;
    int at_end;
} cursor;

typedef struct call_result {
    size_t consumed;     /* P_DONE: bytes of the body the call used */
    const char *reason;  /* P_BAD */
    char *name;          /* P_DONE, malloc'd */
    json_t *args;        /* P_DONE */
} call_result;

static void skip_ws(cursor *c) {
    while (c->i < c->n && strchr(" \t\n\r", c->s[c->i])) c->i++;
}

static int at(const cursor *c, const char *tag) {
    size_t m = strlen(tag);
    return c->n - c->i >= m && memcmp(c->s + c->i, tag, m) == 0;
}

/* The rest of the text is a proper prefix of tag (it may still become it). */
static int could_be(const cursor *c, const char *tag) {
    size_t r = c->n - c->i;
    return r < strlen(tag) && memcmp(c->s + c->i, tag, r) == 0;
}

/* Reads NAME> after an opening tag; status P_DONE with [*start, *len). */
static enum parse_status read_name(cursor *c, size_t *start, size_t *len) {
    const char *gt = memchr(c->s + c->i, '>', c->n - c->i);
    size_t end = gt ? (size_t)(gt - c->s) : c->n;
    /* The limits hold with or without the '>' so that the answer does not
     * depend on how much text had arrived when we looked. */
    if (end - c->i > 256) return P_BAD;
    for (size_t k = c->i; k < end; k++)
        if (c->s[k] == '\n' || c->s[k] == '<') return P_BAD;
    if (!gt) return c->at_end ? P_BAD : P_MORE;
    *start = c->i;
    *len = end - c->i;
    c->i = end + 1;
    return P_DONE;
}

static int valid_function_name(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t k = 0; k < n; k++)
        if (strchr("{}<>\"' \t\n\r", s[k])) return 0;
    return 1;
}

/* Finds the "</parameter>" that ends the value starting at c->i. */
static enum parse_status value_end(cursor *c, size_t *end) {
    static const char *next_tags[] = {PARAM_OPEN, FN_CLOSE, TOOL_CLOSE};
    size_t pos = c->i;
    for (;;) {
        const char *close = memmem(c->s + pos, c->n - pos, PARAM_CLOSE, 12);
        if (!close) return c->at_end ? P_BAD : P_MORE;
        cursor after = *c;
        after.i = (size_t)(close - c->s) + 12;
        skip_ws(&after);
        if (after.i == c->n) return c->at_end ? P_BAD : P_MORE;
        for (int t = 0; t < 3; t++) {
            if (at(&after, next_tags[t])) {
                *end = (size_t)(close - c->s);
                return P_DONE;
            }
            if (could_be(&after, next_tags[t])) return c->at_end ? P_BAD : P_MORE;
        }
        pos = (size_t)(close - c->s) + 12;  /* literal text inside the value */
    }
}

static enum parse_status bad(call_result *r, const char *reason) {
    r->reason = reason;
    return P_BAD;
}

/* <parameter=KEY>\nVALUE\n</parameter>: adds KEY: typed VALUE to args. */
static enum parse_status read_parameter(cursor *c, json_t *params, json_t *args, call_result *r) {
    json_t *props = json_object_get(params, "properties");
    size_t ks, kn, vend;
    c->i += strlen(PARAM_OPEN);
    enum parse_status st = read_name(c, &ks, &kn);
    if (st == P_BAD || (st == P_DONE && kn == 0)) return bad(r, "bad <parameter=NAME> tag");
    if (st == P_MORE) return P_MORE;
    st = value_end(c, &vend);
    if (st == P_BAD) return bad(r, "unterminated parameter value");
    if (st == P_MORE) return P_MORE;
    const char *v = c->s + c->i;
    size_t vn = vend - c->i;
    if (vn && v[0] == '\n') { v++; vn--; }
    if (vn && v[vn - 1] == '\n') vn--;
    char *key = strndup(c->s + ks, kn);
    json_t *val = key ? tern_tool_param_value_in(v, vn, json_object_get(props, key), params) : NULL;
    int rc = val ? json_object_set_new(args, key, val) : -1;
    free(key);
    if (rc) return bad(r, "out of memory");
    c->i = vend + strlen(PARAM_CLOSE);
    return P_DONE;
}

/* After </function>: an optional </tool_call> closes the call. */
static enum parse_status read_call_end(cursor *c, call_result *r) {
    size_t fn_end = c->i;
    skip_ws(c);
    if (at(c, TOOL_CLOSE)) {
        r->consumed = c->i + strlen(TOOL_CLOSE);
    } else if (c->i == c->n || could_be(c, TOOL_CLOSE)) {
        if (!c->at_end) return P_MORE;
        r->consumed = c->i == c->n ? c->n : fn_end;
    } else {
        r->consumed = fn_end;  /* no </tool_call>: what follows is text */
    }
    return P_DONE;
}

static enum parse_status read_body(cursor *c, json_t *params, json_t *args, call_result *r) {
    for (;;) {
        skip_ws(c);
        if (c->i == c->n) return c->at_end ? bad(r, "unterminated tool call") : P_MORE;
        if (at(c, FN_CLOSE)) {
            c->i += strlen(FN_CLOSE);
            return read_call_end(c, r);
        }
        if (at(c, TOOL_CLOSE)) return read_call_end(c, r);  /* </function> forgotten */
        if (at(c, PARAM_OPEN)) {
            enum parse_status st = read_parameter(c, params, args, r);
            if (st != P_DONE) return st;
            continue;
        }
        if (could_be(c, FN_CLOSE) || could_be(c, TOOL_CLOSE) || could_be(c, PARAM_OPEN))
            return c->at_end ? bad(r, "unterminated tool call") : P_MORE;
        return bad(r, "unexpected text inside <function>");
    }
}

/* Reads a call body: the text after <tool_call>, or from a bare
 * <function=. Pure: the same text gives the same answer. */
static enum parse_status parse_call(cursor *c, json_t *tools, call_result *r) {
    size_t ns, nn;
    skip_ws(c);
    if (c->i == c->n) return c->at_end ? bad(r, "empty tool call") : P_MORE;
    if (!at(c, FN_OPEN))
        return could_be(c, FN_OPEN) && !c->at_end ? P_MORE
                                                   : bad(r, "expected <function=NAME>");
    c->i += strlen(FN_OPEN);
    enum parse_status st = read_name(c, &ns, &nn);
    if (st == P_MORE) return P_MORE;
    if (st == P_BAD || !valid_function_name(c->s + ns, nn))
        return bad(r, "invalid function name");
    json_t *args = json_object();
    char *name = strndup(c->s + ns, nn);
    if (!args || !name) {
        json_decref(args);
        free(name);
        return bad(r, "out of memory");
    }
    st = read_body(c, tern_tool_parameters(tools, name), args, r);
    if (st != P_DONE) {
        json_decref(args);
        free(name);
        return st;
    }
    r->name = name;
    r->args = args;
    return P_DONE;
}

/* ---- streaming scanner --------------------------------------------------------- */

enum scan_state { S_TEXT, S_CALL };

typedef struct scanner {
    enum scan_state state;
    chat_buf pend;     /* S_TEXT: text held back; S_CALL: the call body so far */
    chat_buf lead;     /* S_CALL: dropped whitespace + opening tag, restored if malformed */
    int bare;          /* S_CALL: opened by <function= (the tag is part of the body) */
    int recheck;       /* S_CALL: parse on the next step whatever arrived */
    int after_call;    /* drop whitespace that follows a call */
    char prev;         /* last byte passed on as answer text */
    int n_calls;
    json_t *tools;
    tern_out_fn fn;
    void *user;
} scanner;

static void buf_consume(chat_buf *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

static int emit_text(scanner *sc, tern_out_kind kind, const char *s, size_t n, tern_error *err) {
    if (!n) return 0;
    if (kind == TERN_OUT_CONTENT) sc->prev = s[n - 1];
    tern_out_event ev = {.kind = kind, .text = s, .len = n};
    return sc->fn(sc->user, &ev, err);
}

static int emit_call(scanner *sc, call_result *r, tern_error *err) {
    chat_buf args = {0};
    int rc = chat_json_dump_py(&args, r->args, err);
    if (!rc) {
        tern_out_event ev = {.kind = TERN_OUT_TOOL_CALL, .call_index = sc->n_calls++,
                             .name = r->name, .arguments = args.data};
        rc = sc->fn(sc->user, &ev, err);
    }
    chat_buf_free(&args);
    return rc;
}

/* Where a call starts in the held text: <tool_call> anywhere, or
 * <function= at the start of a line. Returns its offset or -1. */
static long find_call_start(scanner *sc, int *bare) {
    const char *s = sc->pend.data;
    size_t n = sc->pend.len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        if (n - i >= 11 && memcmp(s + i, TOOL_OPEN, 11) == 0) {
            *bare = 0;
            return (long)i;
        }
        char before = i ? s[i - 1] : sc->prev;
        if (before == '\n' && n - i >= 10 && memcmp(s + i, FN_OPEN, 10) == 0) {
            *bare = 1;
            return (long)i;
        }
    }
    return -1;
}

static size_t partial_suffix(const char *s, size_t n, const char *tag) {
    size_t m = strlen(tag);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* S_TEXT: passes on answer text, holding back trailing whitespace and any
 * partial tag; switches to S_CALL at a call. Returns 1 to continue. */
static int step_text(scanner *sc, int at_end, tern_error *err) {
    chat_buf *p = &sc->pend;
    if (sc->after_call) {
        size_t k = 0;
        while (k < p->len && is_ws(p->data[k])) k++;
        buf_consume(p, k);
        if (!p->len) return 0;
        sc->after_call = 0;
    }
    int bare = 0;
    long at_call = find_call_start(sc, &bare);
    if (at_call < 0) {
        size_t keep = 0;
        if (!at_end) {
            keep = partial_suffix(p->data, p->len, TOOL_OPEN);
            size_t k2 = partial_suffix(p->data, p->len, FN_OPEN);
            if (k2 > keep) keep = k2;
            while (keep < p->len && is_ws(p->data[p->len - keep - 1])) keep++;
        }
        if (emit_text(sc, TERN_OUT_CONTENT, p->data, p->len - keep, err)) return -1;
        buf_consume(p, p->len - keep);
        return 0;
    }
    size_t e = (size_t)at_call;
    while (e > 0 && is_ws(p->data[e - 1])) e--;
    if (emit_text(sc, TERN_OUT_CONTENT, p->data, e, err)) return -1;
    size_t tag = bare ? 0 : strlen(TOOL_OPEN);
    sc->lead.len = 0;
    if (chat_buf_append(&sc->lead, p->data + e, (size_t)at_call - e + tag, err)) return -1;
    buf_consume(p, (size_t)at_call + tag);
    sc->state = S_CALL;
    sc->bare = bare;
    sc->recheck = 1;
    return 1;
}

/* A call that could not be read: report it, pass its opening on as text
 * and scan the rest again (it may hold a good call). */
static int call_malformed(scanner *sc, const char *reason, tern_error *err) {
    tern_out_event ev = {.kind = TERN_OUT_MALFORMED, .text = reason, .len = strlen(reason)};
    if (sc->fn(sc->user, &ev, err)) return -1;
    if (emit_text(sc, TERN_OUT_CONTENT, sc->lead.data, sc->lead.len, err)) return -1;
    /* Pass the <function= on too: read again as a bare call it would fail
     * the same way and report the same problem twice. */
    size_t k = 0;
    while (k < sc->pend.len && is_ws(sc->pend.data[k])) k++;
    if (sc->pend.len - k >= strlen(FN_OPEN) && memcmp(sc->pend.data + k, FN_OPEN, 10) == 0) {
        k += strlen(FN_OPEN);
        if (emit_text(sc, TERN_OUT_CONTENT, sc->pend.data, k, err)) return -1;
        buf_consume(&sc->pend, k);
    }
    sc->state = S_TEXT;
    return 1;
}

/* S_CALL: parses the body when something that can finish a tag arrived
 * (parse_call is pure, so skipping a parse never changes the outcome). */
static int step_call(scanner *sc, int at_end, int new_gt, tern_error *err) {
    if (!(at_end || sc->recheck || new_gt || sc->pend.len <= 32)) return 0;
    sc->recheck = 0;
    cursor c = {sc->pend.data ? sc->pend.data : "", sc->pend.len, 0, at_end};
    call_result r = {0};
    enum parse_status st = parse_call(&c, sc->tools, &r);
    if (st == P_MORE) {
        /* after </function> only whitespace decides nothing: look again */
        sc->recheck = c.i > 0 && c.i == c.n;
        return 0;
    }
    if (st == P_BAD) return call_malformed(sc, r.reason, err);
    int rc = emit_call(sc, &r, err);
    free(r.name);
    json_decref(r.args);
    if (rc) return -1;
    buf_consume(&sc->pend, r.consumed);
    sc->state = S_TEXT;
    sc->after_call = 1;
    sc->prev = '\n';
    return 1;
}

static int scan(scanner *sc, int at_end, int new_gt, tern_error *err) {
    int rc;
    do {
        rc = sc->state == S_TEXT ? step_text(sc, at_end, err)
                                 : step_call(sc, at_end, new_gt, err);
        new_gt = 0;
    } while (rc > 0);
    return rc;
}

static int scanner_feed(scanner *sc, const char *text, size_t len, tern_error *err) {
    if (chat_buf_append(&sc->pend, text, len, err)) return -1;
    return scan(sc, 0, memchr(text, '>', len) != NULL, err);
}

/* ---- output parser ------------------------------------------------------------- */

struct tern_output_parser {
    tern_reasoning_splitter *splitter;
    scanner sc;
    int parse_tool_calls;
    char utf8_tail[4];  /* an incomplete UTF-8 sequence held for the next piece */
    size_t n_tail;
};

/* Reasoning goes straight out; answer text goes through the scanner. */
static int on_split(void *user, int is_reasoning, const char *text, size_t len,
                    tern_error *err) {
    tern_output_parser *p = user;
    if (is_reasoning) return emit_text(&p->sc, TERN_OUT_REASONING, text, len, err);
    if (!p->parse_tool_calls) return emit_text(&p->sc, TERN_OUT_CONTENT, text, len, err);
    return scanner_feed(&p->sc, text, len, err);
}

tern_output_parser *tern_output_parser_create(const tern_output_params *params,
                                              tern_out_fn fn, void *user, tern_error *err) {
    tern_output_parser *p = calloc(1, sizeof *p);
    if (!p) {
        tern_fail(err, "out of memory (output parser)");
        return NULL;
    }
    p->parse_tool_calls = params->parse_tool_calls;
    json_t *tools = NULL;
    if (params->tools_json) {
        json_error_t je;
        tools = json_loads(params->tools_json, JSON_ALLOW_NUL, &je);
        if (!json_is_array(tools)) {
            tern_fail(err, "output parser: tools_json is not a JSON array (%s)", tools ? "wrong type" : je.text);
            json_decref(tools);
            free(p);
            return NULL;
        }
    }
    p->sc = (scanner){.prev = '\n', .fn = fn, .user = user, .tools = tools};
    p->splitter = tern_reasoning_splitter_create(params->start_in_reasoning, on_split, p, err);
    if (!p->splitter) {
        tern_output_parser_destroy(p);
        return NULL;
    }
    return p;
}

void tern_output_parser_destroy(tern_output_parser *p) {
    if (!p) return;
    tern_reasoning_splitter_destroy(p->splitter);
    chat_buf_free(&p->sc.pend);
    chat_buf_free(&p->sc.lead);
    json_decref(p->sc.tools);
    free(p);
}

/* Bytes at the end of s that start a UTF-8 sequence not yet complete. */
static size_t incomplete_utf8(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue;  /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* Pieces cut inside a UTF-8 character (byte-level tokens do that) are
 * joined first, so every event carries whole characters. Tags are ASCII,
 * so holding these bytes back never changes what is parsed. */
int tern_output_parser_feed(tern_output_parser *p, const char *text, size_t len,
                            tern_error *err) {
    while (len > 0 && p->n_tail > 0) {
        p->utf8_tail[p->n_tail++] = *text++;
        len--;
        size_t held = p->n_tail;
        if (incomplete_utf8(p->utf8_tail, held) == held && held < 4) continue;
        p->n_tail = 0;
        if (tern_reasoning_splitter_feed(p->splitter, p->utf8_tail, held, err)) return -1;
    }
    size_t tail = incomplete_utf8(text, len);
    if (tern_reasoning_splitter_feed(p->splitter, text, len - tail, err)) return -1;
    memcpy(p->utf8_tail + p->n_tail, text + len - tail, tail);
    p->n_tail += tail;
    return 0;
}

int tern_output_parser_finish(tern_output_parser *p, tern_error *err) {
    size_t held = p->n_tail;
    p->n_tail = 0;
    if (held && tern_reasoning_splitter_feed(p->splitter, p->utf8_tail, held, err)) return -1;
    if (tern_reasoning_splitter_finish(p->splitter, err)) return -1;
    if (!p->parse_tool_calls) return 0;
    if (chat_buf_append(&p->sc.pend, "", 0, err)) return -1;
    return scan(&p->sc, 1, 0, err);
}

int tern_output_parser_n_tool_calls(const tern_output_parser *p) { return p->sc.n_calls; }
