/* POST /v1/responses (OpenAI's Responses API, what Codex speaks): input
 * items into a chat conversation (and back out of the store for
 * previous_response_id), events into output items (reasoning, message,
 * function_call) and the event sequence response.created ...
 * response.completed. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api.h"

/* ---- the store: recent conversations by response id, LRU-bounded -------- */

typedef struct store_entry {
    char id[64];
    json_t *messages;                /* the conversation after the response (no instructions) */
    unsigned long long used;
} store_entry;

struct srv_store {
    pthread_mutex_t mu;
    store_entry *e;
    int cap, n;
    unsigned long long clock;
};

srv_store *srv_store_create(int capacity) {
    srv_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cap = capacity;
    if (capacity > 0 && !(s->e = calloc((size_t)capacity, sizeof *s->e))) { free(s); return NULL; }
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void srv_store_destroy(srv_store *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) json_decref(s->e[i].messages);
    free(s->e);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void store_put(srv_store *s, const char *id, json_t *messages) {
    if (s->cap == 0) return;
    pthread_mutex_lock(&s->mu);
    int at = s->n < s->cap ? s->n++ : 0;
    if (at == 0 && s->n == s->cap)
        for (int i = 1; i < s->n; i++) if (s->e[i].used < s->e[at].used) at = i;
    json_decref(s->e[at].messages);
    snprintf(s->e[at].id, sizeof s->e[at].id, "%s", id);
    s->e[at].messages = json_incref(messages);
    s->e[at].used = ++s->clock;
    pthread_mutex_unlock(&s->mu);
}

/* A deep copy of the stored conversation, or NULL. */
static json_t *store_get(srv_store *s, const char *id) {
    json_t *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->e[i].id, id) != 0) continue;
        s->e[i].used = ++s->clock;
        out = json_deep_copy(s->e[i].messages);
        break;
    }
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* ---- the encoder --------------------------------------------------------- */

enum item_kind { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

typedef struct resp_enc {
    srv_enc base;
    srv_store *store;
    json_t *resp;                    /* the response object (status, output, usage ...) */
    json_t *conversation;            /* for the store: the messages before this response; NULL: not stored */
    json_t *reply;                   /* the assistant message it adds */
    json_t *namespaces;              /* function name -> its namespace, for namespaced tools */
    long long seq;
    enum item_kind open;
    char item_id[64];
    sbuf text;                       /* the open item's text */
} resp_enc;

static void emit(resp_enc *r, sbuf *out, const char *type, json_t *ev) {
    if (!ev) ev = json_object();
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer(r->seq++));
    if (r->base.stream) sbuf_sse(out, type, ev);
    else json_decref(ev);
}

static json_t *output(resp_enc *r) { return json_object_get(r->resp, "output"); }
static int out_index(resp_enc *r) { return (int)json_array_size(output(r)) - 1; }

static json_t *text_part(const sbuf *t) {
    return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", t->data ? t->data : "", t->len,
                     "annotations", "logprobs");
}

static void reply_append(resp_enc *r, const char *key, const sbuf *t) {
    json_t *cur = json_object_get(r->reply, key);
    sbuf b = {0};
    if (json_is_string(cur)) sbuf_add(&b, json_string_value(cur), json_string_length(cur));
    sbuf_add(&b, t->data ? t->data : "", t->len);
    json_object_set_new(r->reply, key, json_stringn(b.data ? b.data : "", b.len));
    sbuf_free(&b);
}

/* Ends the open item: its .done events and its final form in output. */
static void close_item(resp_enc *r, sbuf *out) {
    int oi = out_index(r);
    json_t *item = json_array_get(output(r), (size_t)oi);
    if (r->open == ITEM_REASONING) {
        emit(r, out, "response.reasoning_text.done",
             json_pack("{s:s, s:i, s:i, s:s%}", "item_id", r->item_id, "output_index", oi, "content_index", 0, "text",
                       r->text.data ? r->text.data : "", r->text.len));
        json_object_set_new(item, "content", json_pack("[{s:s, s:s%}]", "type", "reasoning_text", "text",
                                                       r->text.data ? r->text.data : "", r->text.len));
        reply_append(r, "reasoning_content", &r->text);
    } else if (r->open == ITEM_MESSAGE) {
        emit(r, out, "response.output_text.done",
             json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", r->item_id, "output_index", oi, "content_index", 0,
                       "text", r->text.data ? r->text.data : "", r->text.len, "logprobs"));
        emit(r, out, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", r->item_id,
                                                             "output_index", oi, "content_index", 0, "part",
                                                             text_part(&r->text)));
        json_object_set_new(item, "content", json_pack("[o]", text_part(&r->text)));
        json_object_set_new(item, "status", json_string("completed"));
        reply_append(r, "content", &r->text);
    } else {
        return;
    }
    emit(r, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", oi, "item", item));
    r->open = ITEM_NONE;
    sbuf_reset(&r->text);
}

static void open_item(resp_enc *r, sbuf *out, enum item_kind kind) {
    close_item(r, out);
    r->open = kind;
    json_t *item;
    if (kind == ITEM_REASONING) {
        srv_new_id(r->item_id, sizeof r->item_id, "rs_");
        item = json_pack("{s:s, s:s, s:[], s:[]}", "id", r->item_id, "type", "reasoning", "summary", "content");
    } else {
        srv_new_id(r->item_id, sizeof r->item_id, "msg_");
        item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", r->item_id, "type", "message", "status", "in_progress",
                         "role", "assistant", "content");
    }
    json_array_append_new(output(r), item);
    int oi = out_index(r);
    emit(r, out, "response.output_item.added", json_pack("{s:i, s:O}", "output_index", oi, "item", item));
    if (kind == ITEM_MESSAGE) {
        sbuf empty = {0};
        emit(r, out, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", r->item_id,
                                                              "output_index", oi, "content_index", 0, "part",
                                                              text_part(&empty)));
    }
}

static void add_call(resp_enc *r, const srv_event *ev, sbuf *out) {
    close_item(r, out);
    char id[64], call_id[64];
    srv_new_id(id, sizeof id, "fc_");
    srv_new_id(call_id, sizeof call_id, "call_");
    json_t *item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status",
                             "in_progress", "call_id", call_id, "name", ev->name, "arguments", "");
    json_t *ns = json_object_get(r->namespaces, ev->name);
    if (ns) json_object_set(item, "namespace", ns);
    json_array_append_new(output(r), item);
    int oi = out_index(r);
    emit(r, out, "response.output_item.added", json_pack("{s:i, s:O}", "output_index", oi, "item", item));
    emit(r, out, "response.function_call_arguments.delta",
         json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", oi, "delta", ev->arguments));
    emit(r, out, "response.function_call_arguments.done",
         json_pack("{s:s, s:i, s:s, s:s}", "item_id", id, "output_index", oi, "name", ev->name, "arguments",
                   ev->arguments));
    json_object_set_new(item, "arguments", json_string(ev->arguments));
    json_object_set_new(item, "status", json_string("completed"));
    emit(r, out, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", oi, "item", item));
    json_t *calls = json_object_get(r->reply, "tool_calls");
    if (!calls) json_object_set_new(r->reply, "tool_calls", calls = json_array());
    json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call_id, "type", "function", "function",
                                           "name", ev->name, "arguments", ev->arguments));
}

static void finish(resp_enc *r, const srv_event *ev, sbuf *out) {
    close_item(r, out);
    const srv_usage *u = &ev->usage;
    int incomplete = ev->finish == SRV_FINISH_LENGTH;
    json_object_set_new(r->resp, "status", json_string(incomplete ? "incomplete" : "completed"));
    if (incomplete)
        json_object_set_new(r->resp, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(r->resp, "usage",
                        json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->prompt_tokens,
                                  "input_tokens_details", "cached_tokens", u->cached_tokens, "output_tokens",
                                  u->completion_tokens, "output_tokens_details", "reasoning_tokens",
                                  u->reasoning_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens));
    if (r->conversation) {
        if (!json_object_get(r->reply, "content")) json_object_set_new(r->reply, "content", json_string(""));
        json_array_append(r->conversation, r->reply);
        store_put(r->store, json_string_value(json_object_get(r->resp, "id")), r->conversation);
    }
    emit(r, out, incomplete ? "response.incomplete" : "response.completed", json_pack("{s:O}", "response", r->resp));
}

static void resp_start(srv_enc *e, sbuf *out) {
    resp_enc *r = (resp_enc *)e;
    emit(r, out, "response.created", json_pack("{s:O}", "response", r->resp));
    emit(r, out, "response.in_progress", json_pack("{s:O}", "response", r->resp));
}

static void resp_event(srv_enc *e, const srv_event *ev, sbuf *out) {
    resp_enc *r = (resp_enc *)e;
    switch (ev->kind) {
    case SRV_EV_REASONING:
    case SRV_EV_CONTENT: {
        enum item_kind kind = ev->kind == SRV_EV_REASONING ? ITEM_REASONING : ITEM_MESSAGE;
        if (r->open != kind) open_item(r, out, kind);
        sbuf_add(&r->text, ev->text, ev->len);
        if (kind == ITEM_REASONING)
            emit(r, out, "response.reasoning_text.delta",
                 json_pack("{s:s, s:i, s:i, s:s%}", "item_id", r->item_id, "output_index", out_index(r),
                           "content_index", 0, "delta", ev->text, ev->len));
        else
            emit(r, out, "response.output_text.delta",
                 json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", r->item_id, "output_index", out_index(r),
                           "content_index", 0, "delta", ev->text, ev->len, "logprobs"));
        return;
    }
    case SRV_EV_TOOL_CALL: add_call(r, ev, out); return;
    case SRV_EV_LOGPROBS: return;
    case SRV_EV_DONE: finish(r, ev, out); return;
    case SRV_EV_ERROR:
        json_object_set_new(r->resp, "status", json_string("failed"));
        json_object_set_new(r->resp, "error", json_pack("{s:s, s:o}", "code", "server_error", "message",
                                                        srv_json_bytes(ev->text, ev->len)));
        emit(r, out, "response.failed", json_pack("{s:O}", "response", r->resp));
        return;
    }
}

static void resp_body(srv_enc *e, sbuf *out) { sbuf_json(out, json_incref(((resp_enc *)e)->resp)); }

static void resp_destroy(srv_enc *e) {
    resp_enc *r = (resp_enc *)e;
    json_decref(r->resp);
    json_decref(r->conversation);
    json_decref(r->reply);
    json_decref(r->namespaces);
    sbuf_free(&r->text);
    free(r);
}

/* ---- requests ------------------------------------------------------------ */

/* Tools the provider runs itself (search, code execution, ...): this
 * server has none of them, so they are left out of the prompt and the
 * model answers without them. */
static int hosted_tool(const char *type) {
    static const char *const hosted[] = {"web_search", "web_search_preview", "file_search", "code_interpreter",
                                         "image_generation", "computer_use_preview", "mcp"};
    for (size_t i = 0; i < sizeof hosted / sizeof *hosted; i++)
        if (!strncmp(type, hosted[i], strlen(hosted[i]))) return 1;
    return 0;
}

/* Responses' flat function tools as chat tools; a namespace's functions
 * join the list under their own names (namespaces[name] = the namespace,
 * for the calls' items). */
static int add_tools(json_t *tools, const char *ns, json_t *chat, json_t *namespaces, const char *where, srv_err *e) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && !strcmp(type, "namespace") && !ns && json_is_string(json_object_get(t, "name")) &&
            json_is_array(json_object_get(t, "tools"))) {
            char inner[96];
            snprintf(inner, sizeof inner, "%s[%zu].tools", where, i);
            if (add_tools(json_object_get(t, "tools"), json_string_value(json_object_get(t, "name")), chat,
                          namespaces, inner, e))
                return -1;
            continue;
        }
        if (type && hosted_tool(type)) continue;
        if (!type || strcmp(type, "function") != 0)
            return srv_fail(e, 400, "tools", "%s[%zu]: tools of type '%.64s' are not supported (function tools, "
                            "namespaces of them, and provider-hosted tools, which are left out)",
                            where, i, type ? type : "(none)");
        json_t *fn = json_object();
        const char *keys[] = {"name", "description", "parameters"};
        for (int k = 0; k < 3; k++)
            if (json_object_get(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
        if (ns && json_is_string(json_object_get(t, "name")))
            json_object_set_new(namespaces, json_string_value(json_object_get(t, "name")), json_string(ns));
        json_array_append_new(chat, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return 0;
}

static int convert_tools(json_t *tools, json_t **out, json_t *namespaces, srv_err *e) {
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return srv_fail(e, 400, "tools", "tools must be a list");
    json_t *chat = json_array();
    int rc = add_tools(tools, NULL, chat, namespaces, "tools", e);
    if (rc == 0) rc = srv_check_tools(chat, "tools", out, e);
    json_decref(chat);
    return rc;
}

/* The text of a reasoning item: its reasoning_text content, else its
 * summary. */
static json_t *reasoning_text(json_t *item) {
    sbuf b = {0};
    const char *keys[] = {"content", "summary"};
    for (int k = 0; k < 2 && b.len == 0; k++) {
        size_t i;
        json_t *part;
        json_array_foreach(json_object_get(item, keys[k]), i, part) {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) sbuf_add(&b, json_string_value(t), json_string_length(t));
        }
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    sbuf_free(&b);
    return s;
}

/* The last message if it is an assistant's that tool calls may join. */
static json_t *open_assistant(json_t *msgs) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    return role && !strcmp(role, "assistant") ? last : NULL;
}

/* Input items as chat messages (appended to msgs), roles as sent
 * (srv_late_system_as_user makes them renderable). */
int srv_responses_input(json_t *input, json_t *msgs, srv_err *e) {
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return 0;
    }
    if (!json_is_array(input)) return srv_fail(e, 400, "input", "input must be a string or a list of items");
    json_t *reasoning = NULL;
    size_t i;
    json_t *it;
    char where[64];
    json_array_foreach(input, i, it) {
        snprintf(where, sizeof where, "input[%zu]", i);
        if (!json_is_object(it)) { json_decref(reasoning); return srv_fail(e, 400, where, "%s must be an object", where); }
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type && json_object_get(it, "role")) type = "message";
        if (!type) { json_decref(reasoning); return srv_fail(e, 400, where, "%s needs a type", where); }
        if (!strcmp(type, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (!role) { json_decref(reasoning); return srv_fail(e, 400, where, "%s.role must be a string", where); }
            json_t *m = json_pack("{s:s, s:O}", "role", role, "content",
                                  json_object_get(it, "content") ? json_object_get(it, "content") : json_null());
            if (!strcmp(role, "assistant") && reasoning) json_object_set_new(m, "reasoning_content", reasoning), reasoning = NULL;
            json_array_append_new(msgs, m);
        } else if (!strcmp(type, "function_call")) {
            json_t *call_id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                   *args = json_object_get(it, "arguments");
            if (!json_is_string(call_id) || !json_is_string(name) || (args && !json_is_string(args))) {
                json_decref(reasoning);
                return srv_fail(e, 400, where, "%s: a function_call needs call_id and name (strings) and arguments (a JSON string)", where);
            }
            json_t *a = open_assistant(msgs);
            if (!a || reasoning) {
                a = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                if (reasoning) json_object_set_new(a, "reasoning_content", reasoning), reasoning = NULL;
                json_array_append_new(msgs, a);
            }
            json_t *calls = json_object_get(a, "tool_calls");
            if (!calls) json_object_set_new(a, "tool_calls", calls = json_array());
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", call_id, "type", "function",
                                                   "function", "name", name, "arguments",
                                                   args ? json_string_value(args) : "{}"));
        } else if (!strcmp(type, "function_call_output")) {
            json_t *call_id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            if (!json_is_string(call_id)) {
                json_decref(reasoning);
                return srv_fail(e, 400, where, "%s: a function_call_output needs call_id (a string)", where);
            }
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id", call_id,
                                                  "content", out ? out : json_null()));
        } else if (!strcmp(type, "reasoning")) {
            json_decref(reasoning);
            reasoning = reasoning_text(it);
        } else {
            json_decref(reasoning);
            return srv_fail(e, 400, where, "%s: items of type '%.64s' are not supported", where, type);
        }
    }
    json_decref(reasoning);
    return 0;
}

static int refuse_unsupported(json_t *req, srv_err *e) {
    int bg;
    if (srv_get_bool(req, "background", 0, &bg, e)) return -1;
    if (bg) return srv_fail(e, 400, "background", "background responses are not supported");
    json_t *text = json_object_get(req, "text");
    if (text && !json_is_null(text) && !json_is_object(text)) return srv_fail(e, 400, "text", "text must be an object");
    const char *unsupported[] = {"conversation", "prompt", "max_tool_calls"};
    for (int i = 0; i < 3; i++)
        if (!srv_absent(req, unsupported[i])) return srv_fail(e, 400, unsupported[i], "%s is not supported", unsupported[i]);
    return 0;
}

/* tool_choice: "auto", "none", "required" or {"type": "function", "name":
 * ...}; the last two are enforced by constrained decoding. */
static int parse_tool_choice(json_t *req, int *use_tools, srv_constraint *k, srv_err *e) {
    json_t *tc = json_object_get(req, "tool_choice");
    const char *s = json_string_value(tc);
    *use_tools = !(s && !strcmp(s, "none"));
    k->tool_param = "tool_choice";
    if (!tc || json_is_null(tc) || (s && (!strcmp(s, "auto") || !strcmp(s, "none")))) return 0;
    if (s && !strcmp(s, "required")) { k->tools_required = 1; return 0; }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (json_is_object(tc) && type && !strcmp(type, "function") && name) {
        k->tools_required = 1;
        k->tool_name = name;
        return 0;
    }
    return srv_fail(e, 400, "tool_choice",
                    "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

static int parse_reasoning(const srv_ctx *c, json_t *req, int *thinking, srv_err *e) {
    json_t *r = json_object_get(req, "reasoning");
    *thinking = c->think;
    if (!r || json_is_null(r)) return 0;
    if (!json_is_object(r)) return srv_fail(e, 400, "reasoning", "reasoning must be an object");
    json_t *effort = json_object_get(r, "effort");
    if (effort && !json_is_null(effort)) {
        if (!json_is_string(effort)) return srv_fail(e, 400, "reasoning.effort", "reasoning.effort must be a string");
        *thinking = strcmp(json_string_value(effort), "none") != 0;
    }
    return 0;
}

srv_enc *srv_responses_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    int stream, store, parallel, use_tools;
    srv_prompt_opts po = {.preserve_thinking = c->preserve_thinking};
    srv_constraint k = {0};
    json_t *tools = NULL, *msgs = NULL, *conv = NULL, *checked = NULL, *namespaces = json_object();
    json_t *instructions = json_object_get(req, "instructions"), *prev = json_object_get(req, "previous_response_id");
    if (srv_check_model(c, req, 0, e) || refuse_unsupported(req, e) || srv_get_bool(req, "stream", 0, &stream, e) ||
        srv_get_bool(req, "store", 1, &store, e) || srv_get_bool(req, "parallel_tool_calls", 1, &parallel, e) ||
        parse_tool_choice(req, &use_tools, &k, e) ||
        srv_parse_format(json_object_get(json_object_get(req, "text"), "format"), "text.format", 0, &k, e) ||
        parse_reasoning(c, req, &po.thinking, e) ||
        convert_tools(json_object_get(req, "tools"), &tools, namespaces, e))
        goto fail;
    if (instructions && !json_is_null(instructions) && !json_is_string(instructions)) {
        srv_fail(e, 400, "instructions", "instructions must be a string");
        goto fail;
    }
    if (prev && !json_is_null(prev)) {
        if (!json_is_string(prev)) { srv_fail(e, 400, "previous_response_id", "previous_response_id must be a string"); goto fail; }
        if (!(conv = store_get(c->responses, json_string_value(prev)))) {
            srv_fail(e, 404, "previous_response_id",
                     "previous response '%.100s' not found (the last %d stored responses are kept, in memory)",
                     json_string_value(prev), c->responses->cap);
            goto fail;
        }
    } else {
        conv = json_array();
    }
    if (srv_absent(req, "input")) { srv_fail(e, 400, "input", "input: field required"); goto fail; }
    if (srv_responses_input(json_object_get(req, "input"), conv, e)) goto fail;
    msgs = json_array();
    if (json_is_string(instructions)) json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", instructions));
    json_array_extend(msgs, conv);
    if (!use_tools) { json_decref(tools); tools = NULL; }
    /* (the stored conversation and the echoed instructions stay as sent) */
    if (srv_model_fast(c, req)) srv_fast_view(&msgs, &tools, &k);
    srv_late_system_as_user(msgs);
    if (!(checked = srv_check_conversation(msgs, "input", e)) || srv_build_chat_prompt(c, checked, tools, &po, j, e) ||
        srv_parse_sampling(c, req, 2.0, j, e) || srv_parse_max_tokens(c, req, "max_output_tokens", 0, c->max_tokens, j, e) ||
        srv_build_grammar(c, &k, tools, parallel, j, e))
        goto fail;
    j->parse_tool_calls = tools != NULL;
    j->single_tool_call = !parallel;
    if (tools) j->tools_json = json_dumps(tools, JSON_COMPACT);
    resp_enc *r = calloc(1, sizeof *r);
    if (!r) { srv_fail(e, 500, NULL, "out of memory"); goto fail; }
    r->base = (srv_enc){stream, SRV_API_OPENAI, resp_start, resp_event, resp_body, NULL, resp_destroy, ""};
    r->store = c->responses;
    srv_new_id(r->base.id, sizeof r->base.id, "resp_");
    json_t *req_tools = json_object_get(req, "tools");
    r->resp = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:O, s:O, s:O, s:[], s:b, s:o, s:b}", "id", r->base.id,
                        "object", "response", "created_at", (json_int_t)time(NULL), "status", "in_progress", "error",
                        "incomplete_details",
                        "instructions", instructions ? instructions : json_null(), "max_output_tokens",
                        json_object_get(req, "max_output_tokens") ? json_object_get(req, "max_output_tokens") : json_null(),
                        "previous_response_id", prev ? prev : json_null(), "output", "parallel_tool_calls", parallel,
                        "tools", json_is_array(req_tools) ? json_incref(req_tools) : json_array(),
                        "store", store);
    json_object_set_new(r->resp, "model", json_string(c->model_id));
    json_object_set_new(r->resp, "usage", json_null());
    json_t *fmt = json_object_get(json_object_get(req, "text"), "format");
    json_object_set_new(r->resp, "text", json_pack("{s:o}", "format",
                                                   json_is_object(fmt) ? json_deep_copy(fmt) : json_pack("{s:s}", "type", "text")));
    json_object_set_new(r->resp, "reasoning", json_pack("{s:s}", "effort", po.thinking ? "medium" : "none"));
    r->reply = json_pack("{s:s}", "role", "assistant");
    r->namespaces = namespaces;
    if (store) r->conversation = json_incref(conv);
    json_decref(tools);
    json_decref(msgs);
    json_decref(conv);
    json_decref(checked);
    return &r->base;
fail:
    json_decref(tools);
    json_decref(msgs);
    json_decref(conv);
    json_decref(checked);
    json_decref(namespaces);
    return NULL;
}
