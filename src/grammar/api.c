/* tern_grammar_create: the answer's form, tool calls, the reasoning
 * before them, into one grammar compiled against a vocabulary. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/costs.h"
#include "grammar/schema.h"
#include "util/err.h"

static int check_spec(const tern_grammar_spec *s, tern_error *err) {
    int forms = !!s->json_schema + !!s->json_object + !!s->gbnf;
    if (forms > 1) return tern_fail(err, "grammar: give one of a JSON schema, json_object and a GBNF grammar");
    if (s->tool_name && !s->tools_json) return tern_fail(err, "grammar: a tool name without tools");
    if (s->tools_json && s->tools_required && forms)
        return tern_fail(err, "grammar: required tool calls exclude another answer form");
    if (!forms && !(s->tools_json && s->tools_required))
        return tern_fail(err, "grammar: nothing to enforce (no schema, grammar or required tool calls)");
    return 0;
}

static int schema_answer(jg_rules *j, const char *text, tern_error *err) {
    json_error_t je;
    json_t *schema = json_loads(text, JSON_DECODE_ANY, &je);
    if (!schema) return tern_fail(err, "json_schema: not valid JSON: %s (line %d)", je.text, je.line);
    int r = gs_schema_rule(j, schema, schema, 0, "json_schema", err);
    json_decref(schema);
    return r;
}

static int tools_answer(jg_rules *j, const tern_grammar_spec *s, tern_error *err) {
    json_error_t je;
    json_t *tools = json_loads(s->tools_json, 0, &je);
    if (!tools) return tern_fail(err, "tools: not valid JSON: %s", je.text);
    int r = gs_tool_calls_rule(j, tools, s->tool_name, s->parallel_tool_calls, err);
    json_decref(tools);
    return r;
}

/* root ::= [reasoning "</think>"] [lead] (answer | calls) */
static int build(gr_grammar *g, const tern_grammar_spec *s, tern_error *err) {
    jg_rules j;
    jg_init(&j, g);
    int answer = -1, calls = -1;
    if (s->gbnf) answer = gbnf_parse(g, s->gbnf, err);
    else if (s->json_schema) answer = schema_answer(&j, s->json_schema, err);
    else if (s->json_object) answer = jg_object(&j, 0);
    if ((s->gbnf || s->json_schema || s->json_object) && answer < 0) return -1;
    if (s->tools_json && (calls = tools_answer(&j, s, err)) < 0) return -1;
    int body = gr_rule_new(g, "answer");
    gr_seq seq = {0};
    if (answer >= 0) {
        gr_seq_ref(&seq, answer);
        gr_alt(g, body, &seq);
    }
    if (calls >= 0) {
        seq.n = 0;
        gr_seq_ref(&seq, calls);
        gr_alt(g, body, &seq);
    }
    seq.n = 0;
    if (s->after_think) {
        gr_seq_ref(&seq, jg_text_without(&j, "</think>", 0));
        gr_seq_str(g, &seq, "</think>");
    }
    if (!s->gbnf || s->after_think) gr_seq_ref(&seq, jg_lead(&j));
    gr_seq_ref(&seq, body);
    int root = gr_rule_of_seq(g, "start", &seq);
    gr_seq_free(&seq);
    return root;
}

tern_grammar *tern_grammar_create(const tern_grammar_spec *spec, tern_grammar_vocab *v, tern_error *err) {
    if (!spec) {
        tern_fail(err, "grammar: no specification");
        return NULL;
    }
    if (check_spec(spec, err)) return NULL;
    tern_grammar *G = calloc(1, sizeof *G);
    if (!G || !(G->g = gr_create())) {
        free(G);
        tern_fail(err, "out of memory");
        return NULL;
    }
    G->v = v;
    int root = build(G->g, spec, err);
    int rc = root < 0 ? -1 : gr_finish(G->g, root, err);
    if (rc == 0 && v) {
        gr_token_costs(G->g, v);
        rc = gt_compile(v, G->g, &G->tab, err);
    }
    if (rc) {
        tern_grammar_destroy(G);
        return NULL;
    }
    return G;
}

void tern_grammar_destroy(tern_grammar *G) {
    if (!G) return;
    if (G->tab) gt_release(G->v, G->tab, G->g->n_elems);
    gr_destroy(G->g);
    free(G);
}

const tern_grammar_vocab *tern_grammar_vocabulary(const tern_grammar *G) { return G ? G->v : NULL; }
