/* JSON Schema to grammar rules: the subset OpenAI's strict structured
 * outputs take, and a little more (see schema.h). Each schema object gets
 * one rule, made before its parts, so a $ref cycle (a recursive schema)
 * refers back to the rule being built. */
#include "grammar/schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tool_parse.h"
#include "util/err.h"

#define MAX_DEPTH 64
#define MAX_ITEMS 4096

typedef struct memo {
    json_t *schema;
    int rule;
} memo;

typedef struct sc_ctx {
    jg_rules *j;
    gr_grammar *g;
    json_t *root;
    int xml;
    const char *what;
    tern_error *err;
    memo *m;
    int n_m, cap_m;
    int depth;
} sc_ctx;

static const char *const REFUSED[] = {
    "pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minProperties", "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "if", "then", "else", "not", "uniqueItems", "contains", "minContains",
    "maxContains", "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef", "contentSchema",
};

/* Keywords that constrain a value (the rest are annotations). */
static const char *const VALIDATING[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref",
};

static int fail(sc_ctx *c, const char *path, const char *fmt, const char *arg) {
    char msg[300];
    snprintf(msg, sizeof msg, fmt, arg);
    return tern_fail(c->err, "%s at %.160s: %s", c->what, path, msg);
}

static int in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return 1;
    return 0;
}

#define N_OF(a) (sizeof(a) / sizeof *(a))

static int check_keywords(sc_ctx *c, json_t *s, const char *path) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (in_list(key, REFUSED, N_OF(REFUSED)))
            return fail(c, path, "\"%s\" is not supported (structured output enforces type, properties, required, "
                        "additionalProperties, items, minItems, maxItems, enum, const, anyOf, $ref and $defs)", key);
    }
    return 0;
}

/* Validating keywords other than those named in keep. */
static const char *other_keyword(json_t *s, const char *const *keep, size_t n) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (in_list(key, VALIDATING, N_OF(VALIDATING)) && !in_list(key, keep, n)) return key;
    }
    return NULL;
}

static void sub_path(char *out, size_t cap, const char *path, const char *a, const char *b) {
    snprintf(out, cap, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

static int value_rule(sc_ctx *c, json_t *s, const char *path);

static int alt_ref(sc_ctx *c, int rule, int target) {
    gr_seq s = {0};
    gr_seq_ref(&s, target);
    gr_alt(c->g, rule, &s);
    gr_seq_free(&s);
    return 0;
}

/* ---- objects ------------------------------------------------------------ */

typedef struct member {
    const char *key;
    json_t *schema;
    int required;
} member;

static int is_required(json_t *req, const char *key) {
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), key)) return 1;
    return 0;
}

/* "key" ws ":" ws value ws */
static int member_seq(sc_ctx *c, const member *m, const char *path, gr_seq *out) {
    json_t *k = json_string(m->key);
    char p[256];
    sub_path(p, sizeof p, path, "properties", m->key);
    int v = k ? value_rule(c, m->schema, p) : -1;
    if (v < 0 || jg_literal(c->j, out, k, c->xml)) {
        json_decref(k);
        return v < 0 ? -1 : tern_fail(c->err, "out of memory");
    }
    json_decref(k);
    int ws = jg_ws(c->j);
    gr_seq_ref(out, ws);
    gr_seq_str(c->g, out, ":");
    gr_seq_ref(out, ws);
    gr_seq_ref(out, v);
    gr_seq_ref(out, ws);
    return 0;
}

/* The members in order, each optional one skippable: S_i (none written
 * yet) and R_i (one was: a comma first), built from the end. */
static int members_rule(sc_ctx *c, const member *m, int n, const char *path) {
    int S = gr_rule_new(c->g, "members"), R = gr_rule_new(c->g, "more");
    gr_seq empty = {0}, kv = {0}, s = {0};
    gr_alt(c->g, S, &empty);
    gr_alt(c->g, R, &empty);
    for (int i = n - 1; i >= 0; i--) {
        kv.n = 0;
        if (member_seq(c, &m[i], path, &kv)) {
            gr_seq_free(&kv);
            gr_seq_free(&s);
            return -1;
        }
        int S2 = gr_rule_new(c->g, "members"), R2 = gr_rule_new(c->g, "more");
        s.n = 0;
        gr_seq_cat(&s, &kv);
        gr_seq_ref(&s, R);
        gr_alt(c->g, S2, &s);
        if (!m[i].required) alt_ref(c, S2, S);
        s.n = 0;
        gr_seq_str(c->g, &s, ",");
        gr_seq_ref(&s, jg_ws(c->j));
        gr_seq_cat(&s, &kv);
        gr_seq_ref(&s, R);
        gr_alt(c->g, R2, &s);
        if (!m[i].required) alt_ref(c, R2, R);
        S = S2;
        R = R2;
    }
    gr_seq_free(&kv);
    gr_seq_free(&s);
    return S;
}

/* Keys and values of one schema ("additionalProperties": a schema, or
 * any value) in any number. */
static int map_rule(sc_ctx *c, json_t *vs, const char *path) {
    char p[256];
    sub_path(p, sizeof p, path, "additionalProperties", NULL);
    int v = vs && json_is_object(vs) ? value_rule(c, vs, p) : jg_value(c->j, c->xml);
    if (v < 0) return -1;
    int ws = jg_ws(c->j);
    gr_seq kv = {0}, more = {0}, s = {0}, empty = {0};
    gr_seq_ref(&kv, jg_string(c->j, c->xml));
    gr_seq_ref(&kv, ws);
    gr_seq_str(c->g, &kv, ":");
    gr_seq_ref(&kv, ws);
    gr_seq_ref(&kv, v);
    gr_seq_ref(&kv, ws);
    gr_seq_str(c->g, &more, ",");
    gr_seq_ref(&more, ws);
    gr_seq_cat(&more, &kv);
    gr_seq_cat(&s, &kv);
    gr_seq_ref(&s, gr_star(c->g, &more));
    int body = gr_rule_new(c->g, "entries");
    gr_alt(c->g, body, &s);
    gr_alt(c->g, body, &empty);
    gr_seq_free(&kv);
    gr_seq_free(&more);
    gr_seq_free(&s);
    return body;
}

static int object_rule(sc_ctx *c, json_t *s, const char *path) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, path, "\"%s\" must be an object", "properties");
    if (req && !json_is_array(req)) return fail(c, path, "\"%s\" must be a list of names", "required");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, path, "\"%s\" must be a boolean or a schema", "additionalProperties");
    size_t n = json_object_size(props) + json_array_size(req);
    member *m = calloc(n + 1, sizeof *m);
    if (!m) return tern_fail(c->err, "out of memory");
    int k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) m[k++] = (member){key, v, is_required(req, key)};
    size_t i;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v)) { free(m); return fail(c, path, "\"%s\" must be a list of names", "required"); }
        if (json_object_get(props, json_string_value(v))) continue;
        if (json_is_false(addl)) {
            free(m);
            return fail(c, path, "\"required\" names '%s', which is not in properties, and additionalProperties is "
                        "false: no object can match", json_string_value(v));
        }
        m[k++] = (member){json_string_value(v), json_is_object(addl) ? addl : json_true(), 1};
    }
    int body = k ? members_rule(c, m, k, path) : json_is_false(addl) ? -2 : map_rule(c, addl, path);
    free(m);
    if (body == -1) return -1;
    gr_seq seq = {0};
    gr_seq_str(c->g, &seq, "{");
    gr_seq_ref(&seq, jg_ws(c->j));
    if (body >= 0) gr_seq_ref(&seq, body);
    gr_seq_str(c->g, &seq, "}");
    int r = gr_rule_of_seq(c->g, "obj", &seq);
    gr_seq_free(&seq);
    return r;
}

/* ---- arrays ------------------------------------------------------------- */

static int count_field(sc_ctx *c, json_t *s, const char *key, const char *path, long long dflt, long long *out) {
    json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(c, path, "\"%s\" must be an integer >= 0", key);
    if (json_integer_value(v) > MAX_ITEMS) return fail(c, path, "\"%s\" above 4096 is not supported", key);
    *out = json_integer_value(v);
    return 0;
}

static int array_rule(sc_ctx *c, json_t *s, const char *path) {
    json_t *items = json_object_get(s, "items");
    long long lo, hi;
    if (count_field(c, s, "minItems", path, 0, &lo) || count_field(c, s, "maxItems", path, -1, &hi)) return -1;
    if (json_is_array(items)) return fail(c, path, "\"%s\" as a list (a tuple) is not supported", "items");
    if (json_is_false(items)) hi = 0;
    if (hi >= 0 && hi < lo) return fail(c, path, "\"%s\" is below minItems: no array can match", "maxItems");
    char p[256];
    sub_path(p, sizeof p, path, "items", NULL);
    int item = hi == 0 ? -1 : json_is_object(items) ? value_rule(c, items, p) : jg_value(c->j, c->xml);
    if (hi != 0 && item < 0) return -1;
    int ws = jg_ws(c->j);
    gr_seq seq = {0}, first = {0}, more = {0};
    gr_seq_str(c->g, &seq, "[");
    gr_seq_ref(&seq, ws);
    if (hi != 0) {
        gr_seq_ref(&first, item);
        gr_seq_ref(&first, ws);
        gr_seq_str(c->g, &more, ",");
        gr_seq_ref(&more, ws);
        gr_seq_cat(&more, &first);
        gr_seq_ref(&first, gr_repeat(c->g, &more, lo > 1 ? (int)lo - 1 : 0, hi < 0 ? -1 : (int)hi - 1));
        gr_seq_ref(&seq, lo > 0 ? gr_rule_of_seq(c->g, "items", &first) : gr_opt(c->g, &first));
    }
    gr_seq_str(c->g, &seq, "]");
    int r = gr_rule_of_seq(c->g, "arr", &seq);
    gr_seq_free(&seq);
    gr_seq_free(&first);
    gr_seq_free(&more);
    return r;
}

/* ---- values ------------------------------------------------------------- */

static int type_matches(const char *t, json_t *v) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (json_int_t)json_real_value(v));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return 0;
}

static int types_match(json_t *type, json_t *v) {
    if (!type) return 1;
    if (json_is_string(type)) return type_matches(json_string_value(type), v);
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t) if (json_is_string(t) && type_matches(json_string_value(t), v)) return 1;
    return 0;
}

static int literals(sc_ctx *c, int rule, json_t *s, const char *path) {
    json_t *vals = json_object_get(s, "enum"), *cv = json_object_get(s, "const"), *type = json_object_get(s, "type");
    const char *other = other_keyword(s, (const char *const[]){"enum", "const", "type"}, 3);
    if (other) return fail(c, path, "\"enum\"/\"const\" together with \"%s\" is not supported", other);
    if (vals && !json_is_array(vals)) return fail(c, path, "\"%s\" must be a list", "enum");
    size_t n = cv ? 1 : json_array_size(vals), kept = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = cv ? cv : json_array_get(vals, i);
        if (!types_match(type, v)) continue;
        int listed = !cv || !vals;
        for (size_t k = 0; !listed && k < json_array_size(vals); k++) listed = json_equal(v, json_array_get(vals, k));
        if (!listed) continue;
        gr_seq seq = {0};
        if (jg_literal(c->j, &seq, v, c->xml)) return tern_fail(c->err, "out of memory");
        gr_alt(c->g, rule, &seq);
        gr_seq_free(&seq);
        kept++;
    }
    if (!kept) return fail(c, path, "%s: no value can match", cv ? "\"const\"" : "\"enum\"");
    return 0;
}

static int one_type(sc_ctx *c, json_t *s, const char *t, const char *path) {
    jg_rules *j = c->j;
    if (!strcmp(t, "string")) return jg_string(j, c->xml);
    if (!strcmp(t, "integer")) return jg_integer(j);
    if (!strcmp(t, "number")) return jg_number(j);
    if (!strcmp(t, "boolean")) return jg_boolean(j);
    if (!strcmp(t, "null")) return jg_null(j);
    if (!strcmp(t, "object")) return object_rule(c, s, path);
    if (!strcmp(t, "array")) return array_rule(c, s, path);
    return fail(c, path, "\"type\" \"%s\" is not a JSON Schema type", t);
}

static int typed(sc_ctx *c, int rule, json_t *s, const char *path) {
    json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) {
        int r = one_type(c, s, json_string_value(type), path);
        return r < 0 ? -1 : alt_ref(c, rule, r);
    }
    if (json_is_array(type)) {
        if (!json_array_size(type)) return fail(c, path, "\"%s\" is an empty list: no value can match", "type");
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t)) return fail(c, path, "\"%s\" must be a string or a list of strings", "type");
            int r = one_type(c, s, json_string_value(t), path);
            if (r < 0) return -1;
            alt_ref(c, rule, r);
        }
        return 0;
    }
    if (type) return fail(c, path, "\"%s\" must be a string or a list of strings", "type");
    int obj = json_object_get(s, "properties") || json_object_get(s, "required") ||
              json_object_get(s, "additionalProperties");
    int arr = json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems");
    if (!obj && !arr) return alt_ref(c, rule, jg_value(c->j, c->xml));
    int r1 = obj ? object_rule(c, s, path) : 0, r2 = arr && r1 >= 0 ? array_rule(c, s, path) : 0;
    if (r1 < 0 || r2 < 0) return -1;
    if (obj) alt_ref(c, rule, r1);
    if (arr) alt_ref(c, rule, r2);
    return 0;
}

/* oneOf is anyOf when no value can match two branches: here, when the
 * branches name distinct single types (integer and number overlap). */
static int one_of_disjoint(sc_ctx *c, json_t *branches) {
    int seen_int = 0, seen_num = 0;
    size_t i, k;
    json_t *b, *b2;
    json_array_foreach(branches, i, b) {
        json_t *t = json_object_get(tern_schema_resolve(c->root, b), "type");
        if (!json_is_string(t)) return 0;
        seen_int |= !strcmp(json_string_value(t), "integer");
        seen_num |= !strcmp(json_string_value(t), "number");
        json_array_foreach(branches, k, b2) {
            if (k >= i) break;
            if (json_equal(t, json_object_get(tern_schema_resolve(c->root, b2), "type"))) return 0;
        }
    }
    return !(seen_int && seen_num);
}

static int union_rule(sc_ctx *c, int rule, json_t *s, const char *key, const char *path) {
    json_t *branches = json_object_get(s, key);
    if (!json_is_array(branches) || !json_array_size(branches))
        return fail(c, path, "\"%s\" must be a non-empty list of schemas", key);
    const char *other = other_keyword(s, (const char *const[]){key}, 1);
    if (other) return fail(c, path, "\"%s\" together with other keywords is not supported", key);
    if (!strcmp(key, "oneOf") && !one_of_disjoint(c, branches))
        return fail(c, path, "\"%s\" is supported only when its branches have distinct types (use anyOf)", key);
    if (!strcmp(key, "allOf") && json_array_size(branches) > 1)
        return fail(c, path, "\"%s\" with more than one schema is not supported", key);
    size_t i;
    json_t *b;
    json_array_foreach(branches, i, b) {
        char p[256], idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        sub_path(p, sizeof p, path, key, idx);
        int r = value_rule(c, b, p);
        if (r < 0) return -1;
        alt_ref(c, rule, r);
    }
    return 0;
}

static int ref_rule(sc_ctx *c, int rule, json_t *s, const char *path) {
    json_t *ref = json_object_get(s, "$ref");
    const char *other = other_keyword(s, (const char *const[]){"$ref"}, 1);
    if (other) return fail(c, path, "\"$ref\" together with \"%s\" is not supported", other);
    if (!json_is_string(ref) || json_string_value(ref)[0] != '#')
        return fail(c, path, "\"$ref\" must be a local reference (\"#/...\"); \"%s\" is not supported",
                    json_is_string(ref) ? json_string_value(ref) : "?");
    json_t *target = tern_schema_resolve(c->root, s);
    if (target == s) return fail(c, path, "\"$ref\" \"%s\" does not resolve", json_string_value(ref));
    int r = value_rule(c, target, json_string_value(ref));
    return r < 0 ? -1 : alt_ref(c, rule, r);
}

static int value_rule(sc_ctx *c, json_t *s, const char *path) {
    if (json_is_true(s)) return jg_value(c->j, c->xml);
    if (json_is_false(s)) return fail(c, path, "%s", "the schema false: no value can match");
    if (!json_is_object(s)) return fail(c, path, "%s", "a schema must be an object or a boolean");
    for (int i = 0; i < c->n_m; i++)
        if (c->m[i].schema == s) return c->m[i].rule;
    if (c->depth >= MAX_DEPTH) return fail(c, path, "%s", "schemas nested deeper than 64 are not supported");
    if (check_keywords(c, s, path)) return -1;
    if (c->n_m == c->cap_m) {
        int cap = c->cap_m ? c->cap_m * 2 : 16;
        memo *m = realloc(c->m, (size_t)cap * sizeof *m);
        if (!m) return tern_fail(c->err, "out of memory");
        c->m = m;
        c->cap_m = cap;
    }
    int rule = gr_rule_new(c->g, "schema");
    c->m[c->n_m++] = (memo){s, rule};
    c->depth++;
    int rc;
    if (json_object_get(s, "$ref")) rc = ref_rule(c, rule, s, path);
    else if (json_object_get(s, "anyOf")) rc = union_rule(c, rule, s, "anyOf", path);
    else if (json_object_get(s, "oneOf")) rc = union_rule(c, rule, s, "oneOf", path);
    else if (json_object_get(s, "allOf")) rc = union_rule(c, rule, s, "allOf", path);
    else if (json_object_get(s, "enum") || json_object_get(s, "const")) rc = literals(c, rule, s, path);
    else rc = typed(c, rule, s, path);
    c->depth--;
    return rc < 0 ? -1 : rule;
}

int gs_schema_rule(jg_rules *j, json_t *root, json_t *schema, int xml, const char *what, tern_error *err) {
    sc_ctx c = {.j = j, .g = j->g, .root = root, .xml = xml, .what = what, .err = err};
    int r = value_rule(&c, schema, "#");
    free(c.m);
    return r;
}
