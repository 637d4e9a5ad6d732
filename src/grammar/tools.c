/* The tool-call grammar: calls in the XML form the chat template writes
 *
 *     <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 *
 * (calls separated by "\n"), with each VALUE written the way the output
 * parser (text/tool_parse.c) reads it back for the parameter's schema:
 * string parameters raw (text without "</parameter>", or one of the
 * enum's strings), numbers and booleans as JSON, objects and arrays as
 * JSON whose strings never hold "</". Parameters come in the schema's
 * order; required ones always, optional ones maybe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema.h"
#include "text/tool_parse.h"
#include "util/err.h"

static const char PARAM_END[] = "</parameter>";

typedef struct tool_ctx {
    jg_rules *j;
    gr_grammar *g;
    tern_error *err;
    char what[200];
} tool_ctx;

static void alt_ref(gr_grammar *g, int rule, int target) {
    gr_seq s = {0};
    gr_seq_ref(&s, target);
    gr_alt(g, rule, &s);
    gr_seq_free(&s);
}

static void alt_str(gr_grammar *g, int rule, const char *text, size_t n) {
    gr_seq s = {0};
    gr_seq_lit(g, &s, text, n);
    gr_alt(g, rule, &s);
    gr_seq_free(&s);
}

static const char *named_type(json_t *s) {
    json_t *t = json_object_get(s, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* The branches of a schema (anyOf / oneOf / a type list / itself). */
static size_t branches(json_t *root, json_t *schema, json_t **out, size_t cap) {
    schema = tern_schema_resolve(root, schema);
    json_t *u = json_object_get(schema, "anyOf");
    if (!json_is_array(u)) u = json_object_get(schema, "oneOf");
    if (json_is_array(u)) {
        size_t n = 0, i;
        json_t *b;
        json_array_foreach(u, i, b) if (n < cap) out[n++] = tern_schema_resolve(root, b);
        return n;
    }
    out[0] = schema;
    return 1;
}

/* A string parameter: the raw text of each branch that takes strings. */
static int raw_value(tool_ctx *c, json_t *root, json_t *schema, int nullable) {
    gr_grammar *g = c->g;
    int rule = gr_rule_new(g, "raw");
    json_t *br[64];
    size_t n = branches(root, schema, br, 64);
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *b = br[i], *vals = json_object_get(b, "enum"), *cv = json_object_get(b, "const");
        const char *t = named_type(b);
        if (t && strcmp(t, "string")) continue;
        if (!t && !vals && !cv) continue;
        /* the string keywords a raw value could break */
        static const char *const refused[] = {"pattern", "format", "minLength", "maxLength"};
        for (int k = 0; k < 4; k++)
            if (json_object_get(b, refused[k]))
                return tern_fail(c->err, "%s: \"%s\" is not supported", c->what, refused[k]);
        if (!vals && !cv) {
            alt_ref(g, rule, jg_text_without(c->j, PARAM_END, 1));
            any = 1;
            continue;
        }
        size_t m = cv ? 1 : json_array_size(vals);
        for (size_t k = 0; k < m; k++) {
            json_t *v = cv ? cv : json_array_get(vals, k);
            if (!json_is_string(v) || strstr(json_string_value(v), PARAM_END)) continue;
            alt_str(g, rule, json_string_value(v), json_string_length(v));
            any = 1;
        }
    }
    if (nullable) alt_str(g, rule, "null", 4), any = 1;
    if (!any) return tern_fail(c->err, "%s: no string value can match its schema", c->what);
    return rule;
}

/* Numbers and booleans: the JSON of the branches of that type. */
static int typed_value(tool_ctx *c, json_t *root, json_t *schema, int kind, int nullable) {
    gr_grammar *g = c->g;
    int rule = gr_rule_new(g, "typed");
    json_t *br[64];
    size_t n = branches(root, schema, br, 64);
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        int k2, nul2;
        k2 = tern_tool_param_kind(br[i], root, &nul2);
        int fits = k2 == kind || (kind == TERN_PARAM_NUMBER && k2 == TERN_PARAM_INT);
        if (!fits || (named_type(br[i]) && !strcmp(named_type(br[i]), "null"))) continue;
        int r = gs_schema_rule(c->j, root, br[i], 1, c->what, c->err);
        if (r < 0) return -1;
        alt_ref(g, rule, r);
        any = 1;
    }
    if (nullable) alt_str(g, rule, "null", 4), any = 1;
    if (!any) return tern_fail(c->err, "%s: no value can match its schema", c->what);
    return rule;
}

/* Without a type the parser reads JSON, else keeps the text: a string
 * the schema constrains could come back quoted, so those are refused. */
static int untyped_ok(json_t *root, json_t *schema) {
    json_t *br[64];
    size_t n = branches(root, schema, br, 64);
    for (size_t i = 0; i < n; i++)
        if (json_object_get(br[i], "enum") || json_object_get(br[i], "const")) return 0;
    return 1;
}

static int param_value(tool_ctx *c, json_t *root, json_t *schema) {
    int nullable;
    int kind = tern_tool_param_kind(schema, root, &nullable);
    switch (kind) {
    case TERN_PARAM_STRING: return raw_value(c, root, schema, nullable);
    case TERN_PARAM_INT:
    case TERN_PARAM_NUMBER:
    case TERN_PARAM_BOOL: return typed_value(c, root, schema, kind, nullable);
    case TERN_PARAM_NULL: return jg_null(c->j);
    case TERN_PARAM_UNTYPED:
        if (!untyped_ok(root, schema))
            return tern_fail(c->err, "%s: an enum or const without a type is not supported in a forced tool call",
                             c->what);
        /* fall through */
    default: return gs_schema_rule(c->j, root, schema, 1, c->what, c->err);
    }
}

static int valid_key(const char *k) {
    size_t n = strlen(k);
    return n > 0 && n <= 256 && !strpbrk(k, "<>\n");
}

/* "<parameter=KEY>\n" VALUE "\n</parameter>\n" */
static int param_seq(tool_ctx *c, const char *fn, json_t *root, const char *key, json_t *schema, gr_seq *out) {
    snprintf(c->what, sizeof c->what, "tools: function '%.64s', parameter '%.64s'", fn, key);
    if (!valid_key(key))
        return tern_fail(c->err, "%s: a parameter name with '<', '>' or a newline cannot be written in a tool call",
                         c->what);
    int v = param_value(c, root, schema);
    if (v < 0) return -1;
    gr_seq_str(c->g, out, "<parameter=");
    gr_seq_str(c->g, out, key);
    gr_seq_str(c->g, out, ">\n");
    gr_seq_ref(out, v);
    gr_seq_str(c->g, out, "\n</parameter>\n");
    return 0;
}

static int function_rule(tool_ctx *c, const char *name, json_t *params) {
    gr_grammar *g = c->g;
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    gr_seq s = {0}, p = {0};
    gr_seq_str(g, &s, "<function=");
    gr_seq_str(g, &s, name);
    gr_seq_str(g, &s, ">\n");
    const char *key;
    json_t *sch;
    int rc = 0;
    json_object_foreach(props, key, sch) {
        int required = 0;
        size_t i;
        json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), key);
        p.n = 0;
        if ((rc = param_seq(c, name, params, key, sch, &p))) break;
        if (required) gr_seq_cat(&s, &p);
        else gr_seq_ref(&s, gr_opt(g, &p));
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        if (rc || !json_is_string(r) || json_object_get(props, json_string_value(r))) continue;
        p.n = 0;
        if ((rc = param_seq(c, name, params, json_string_value(r), json_true(), &p))) break;
        gr_seq_cat(&s, &p);
    }
    gr_seq_str(g, &s, "</function>\n");
    int rule = rc ? -1 : gr_rule_of_seq(g, "function", &s);
    gr_seq_free(&s);
    gr_seq_free(&p);
    return rule;
}

static int valid_function_name(const char *s) {
    return *s && strlen(s) <= 256 && !strpbrk(s, "{}<>\"' \t\n\r");
}

int gs_tool_calls_rule(jg_rules *j, json_t *tools, const char *name, int parallel, tern_error *err) {
    tool_ctx c = {.j = j, .g = j->g, .err = err};
    gr_grammar *g = j->g;
    if (!json_is_array(tools) || !json_array_size(tools)) return tern_fail(err, "tools: a list of tools is needed");
    int fns = gr_rule_new(g, "functions"), n = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t;
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (!fname || !valid_function_name(fname))
            return tern_fail(err, "tools[%zu]: a function name without spaces, quotes or <>{} is needed", i);
        if (name && strcmp(name, fname)) continue;
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_object(params))
            return tern_fail(err, "tools[%zu]: parameters must be a JSON Schema object", i);
        int r = function_rule(&c, fname, params);
        if (r < 0) return -1;
        alt_ref(g, fns, r);
        n++;
    }
    if (!n) return tern_fail(err, "tool_choice names the function '%.64s', which is not among the tools", name);
    gr_seq call = {0}, more = {0};
    gr_seq_str(g, &call, "<tool_call>\n");
    gr_seq_ref(&call, fns);
    gr_seq_str(g, &call, "</tool_call>");
    if (parallel) {
        gr_seq_str(g, &more, "\n");
        gr_seq_cat(&more, &call);
        gr_seq_ref(&call, gr_star(g, &more));
    }
    int r = gr_rule_of_seq(g, "tool-calls", &call);
    gr_seq_free(&call);
    gr_seq_free(&more);
    return r;
}
