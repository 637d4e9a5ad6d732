/* POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages
 * API, what Claude Code speaks): content blocks into a chat conversation,
 * events into thinking, text and tool_use blocks, streamed as
 * message_start, content_block_start/delta/stop, message_delta and
 * message_stop. */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

typedef struct msg_enc {
    srv_enc base;
    json_t *model;
    int prompt_tokens;
    json_t *content;                 /* the blocks so far */
    int open;                        /* the open block's index, or -1 */
    srv_ev_kind open_kind;
    sbuf text;                       /* the open text or thinking block's text */
    int n_calls;
    char **stops;                    /* the job's stop strings (for stop_sequence) */
    const char *stop_reason;         /* from the DONE event */
    json_t *stop_sequence;
    srv_usage usage;
} msg_enc;

static void emit(msg_enc *m, sbuf *out, const char *type, json_t *ev) {
    json_object_set_new(ev, "type", json_string(type));
    if (m->base.stream) sbuf_sse(out, type, ev);
    else json_decref(ev);
}

static json_t *usage_json(const srv_usage *u, int output) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", u->prompt_tokens - u->cached_tokens,
                     "cache_read_input_tokens", u->cached_tokens, "cache_creation_input_tokens", 0, "output_tokens",
                     output);
}

static void close_block(msg_enc *m, sbuf *out) {
    if (m->open < 0) return;
    json_t *block = json_array_get(m->content, (size_t)m->open);
    if (m->open_kind == SRV_EV_REASONING) {
        json_object_set_new(block, "thinking", json_stringn(m->text.data ? m->text.data : "", m->text.len));
        emit(m, out, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", m->open, "delta", "type",
                                                      "signature_delta", "signature", ""));
    } else if (m->open_kind == SRV_EV_CONTENT) {
        json_object_set_new(block, "text", json_stringn(m->text.data ? m->text.data : "", m->text.len));
    }
    emit(m, out, "content_block_stop", json_pack("{s:i}", "index", m->open));
    m->open = -1;
    sbuf_reset(&m->text);
}

static int open_block(msg_enc *m, sbuf *out, srv_ev_kind kind, json_t *block) {
    close_block(m, out);
    json_array_append_new(m->content, block);
    m->open = (int)json_array_size(m->content) - 1;
    m->open_kind = kind;
    json_t *shown = json_deep_copy(block);
    if (kind == SRV_EV_TOOL_CALL) json_object_set_new(shown, "input", json_object());
    emit(m, out, "content_block_start", json_pack("{s:i, s:o}", "index", m->open, "content_block", shown));
    return m->open;
}

static void msg_start(srv_enc *e, sbuf *out) {
    msg_enc *m = (msg_enc *)e;
    srv_usage u = {.prompt_tokens = m->prompt_tokens};
    emit(m, out, "message_start",
         json_pack("{s:{s:s, s:s, s:s, s:O, s:[], s:n, s:n, s:o}}", "message", "id", m->base.id, "type", "message",
                   "role", "assistant", "model", m->model, "content", "stop_reason", "stop_sequence", "usage",
                   usage_json(&u, 0)));
}

static void msg_event(srv_enc *e, const srv_event *ev, sbuf *out) {
    msg_enc *m = (msg_enc *)e;
    switch (ev->kind) {
    case SRV_EV_REASONING:
    case SRV_EV_CONTENT: {
        int thinking = ev->kind == SRV_EV_REASONING;
        if (m->open < 0 || m->open_kind != ev->kind)
            open_block(m, out, ev->kind, thinking ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
                                                              "signature", "")
                                                  : json_pack("{s:s, s:s}", "type", "text", "text", ""));
        sbuf_add(&m->text, ev->text, ev->len);
        emit(m, out, "content_block_delta",
             json_pack("{s:i, s:{s:s, s:s%}}", "index", m->open, "delta", "type",
                       thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text", ev->text, ev->len));
        return;
    }
    case SRV_EV_TOOL_CALL: {
        char id[64];
        srv_new_id(id, sizeof id, "toolu_");
        json_t *input = json_loads(ev->arguments, 0, NULL);
        int at = open_block(m, out, SRV_EV_TOOL_CALL,
                            json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", ev->name, "input",
                                      input ? input : json_object()));
        emit(m, out, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", at, "delta", "type",
                                                      "input_json_delta", "partial_json", ev->arguments));
        m->n_calls++;
        close_block(m, out);
        return;
    }
    case SRV_EV_LOGPROBS: return;
    case SRV_EV_DONE:
        close_block(m, out);
        m->usage = ev->usage;
        m->stop_sequence = json_null();
        switch (ev->finish) {
        case SRV_FINISH_LENGTH: m->stop_reason = "max_tokens"; break;
        case SRV_FINISH_STOP:
            m->stop_reason = "stop_sequence";
            if (ev->stop_index >= 0) m->stop_sequence = json_string(m->stops[ev->stop_index]);
            break;
        case SRV_FINISH_TOOL: m->stop_reason = "tool_use"; break;
        default: m->stop_reason = m->n_calls ? "tool_use" : "end_turn";
        }
        emit(m, out, "message_delta", json_pack("{s:{s:s, s:O}, s:o}", "delta", "stop_reason", m->stop_reason,
                                                "stop_sequence", m->stop_sequence, "usage",
                                                usage_json(&ev->usage, ev->usage.completion_tokens)));
        emit(m, out, "message_stop", json_object());
        return;
    case SRV_EV_ERROR: {
        srv_err err;
        srv_fail(&err, 500, NULL, "generation failed: %.400s", ev->text);
        sbuf_sse(out, "error", srv_error_json(SRV_API_ANTHROPIC, &err));
        return;
    }
    }
}

static void msg_body(srv_enc *e, sbuf *out) {
    msg_enc *m = (msg_enc *)e;
    sbuf_json(out, json_pack("{s:s, s:s, s:s, s:O, s:O, s:s, s:O, s:o}", "id", m->base.id, "type", "message", "role",
                             "assistant", "model", m->model, "content", m->content, "stop_reason", m->stop_reason,
                             "stop_sequence", m->stop_sequence, "usage",
                             usage_json(&m->usage, m->usage.completion_tokens)));
}

static void msg_heartbeat(srv_enc *e, sbuf *out) {
    sbuf_sse(out, "ping", json_pack("{s:s}", "type", "ping"));
    (void)e;
}

static void msg_destroy(srv_enc *e) {
    msg_enc *m = (msg_enc *)e;
    json_decref(m->model);
    json_decref(m->content);
    json_decref(m->stop_sequence);
    sbuf_free(&m->text);
    free(m);
}

/* ---- requests ------------------------------------------------------------ */

/* The text of a string or a list of text blocks (tool results, system),
 * the blocks joined by a blank line. */
static json_t *blocks_text(json_t *v, const char *where, srv_err *e) { return srv_text_content(v, where, "\n\n", e); }

/* One Anthropic message as chat messages: a user turn's tool results
 * become tool messages (in order) before its text; an assistant turn's
 * thinking, text and tool_use blocks one assistant message. A system
 * message among them (Claude Code sends reminders so) joins the system
 * prompt before the conversation, and is a user message after it began:
 * the chat template takes a system message only first. */
static int convert_message(json_t *msg, size_t i, json_t *out, srv_err *e) {
    char where[64];
    snprintf(where, sizeof where, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (!json_is_object(msg) || !role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
        return srv_fail(e, 400, where, "%s.role must be \"user\", \"assistant\" or \"system\"", where);
    json_t *content = json_object_get(msg, "content");
    if (!strcmp(role, "system")) {
        char cw[96];
        snprintf(cw, sizeof cw, "%s.content", where);
        json_t *text = blocks_text(content, cw, e);
        if (!text) return -1;
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", text));
        return 0;
    }
    int user = !strcmp(role, "user");
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", content));
        return 0;
    }
    if (!json_is_array(content)) return srv_fail(e, 400, where, "%s.content must be a string or a list of blocks", where);
    sbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    size_t k;
    json_t *b;
    int rc = 0;
    json_array_foreach(content, k, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content[%zu]", where, k);
        json_t *t = json_object_get(b, "text");
        if (type && !strcmp(type, "text") && json_is_string(t)) {
            sbuf_add(&text, json_string_value(t), json_string_length(t));
        } else if (user && type && !strcmp(type, "tool_result")) {
            json_t *id = json_object_get(b, "tool_use_id");
            json_t *body = blocks_text(json_object_get(b, "content"), bw, e);
            if (!json_is_string(id) || !body) {
                json_decref(body);
                rc = body ? srv_fail(e, 400, bw, "%s.tool_use_id must be a string", bw) : -1;
                break;
            }
            json_array_append_new(out, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", body));
        } else if (!user && type && !strcmp(type, "thinking")) {
            json_t *th = json_object_get(b, "thinking");
            if (json_is_string(th)) sbuf_add(&thinking, json_string_value(th), json_string_length(th));
        } else if (!user && type && !strcmp(type, "redacted_thinking")) {
            continue;
        } else if (!user && type && !strcmp(type, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                rc = srv_fail(e, 400, bw, "%s: tool_use needs id and name (strings) and input (an object)", bw);
                break;
            }
            char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args ? args : "{}"));
            free(args);
        } else {
            rc = srv_fail(e, 400, bw, "%s: blocks of type '%.64s' are not supported in a%s message", bw,
                          type ? type : "(none)", user ? " user" : "n assistant");
            break;
        }
    }
    if (rc == 0 && (!user || text.len || json_array_size(out) == 0 ||
                    strcmp(json_string_value(json_object_get(json_array_get(out, json_array_size(out) - 1), "role")), "tool"))) {
        json_t *m = json_pack("{s:s, s:s%}", "role", role, "content", text.data ? text.data : "", text.len);
        if (thinking.len) json_object_set_new(m, "reasoning_content", json_stringn(thinking.data, thinking.len));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_array_append_new(out, m);
    }
    sbuf_free(&text);
    sbuf_free(&thinking);
    json_decref(calls);
    return rc;
}

static int convert_tools(json_t *tools, json_t **out, srv_err *e) {
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return srv_fail(e, 400, "tools", "tools must be a list");
    json_t *chat = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || (type && strcmp(type, "custom"))) {
            json_decref(chat);
            return srv_fail(e, 400, "tools", "tools[%zu]: only client tools (name, description, input_schema) are supported, got type '%.64s'",
                            i, type ? type : "?");
        }
        json_t *fn = json_object();
        if (json_object_get(t, "name")) json_object_set(fn, "name", json_object_get(t, "name"));
        if (json_object_get(t, "description")) json_object_set(fn, "description", json_object_get(t, "description"));
        if (json_object_get(t, "input_schema")) json_object_set(fn, "parameters", json_object_get(t, "input_schema"));
        json_array_append_new(chat, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    int rc = srv_check_tools(chat, "tools", out, e);
    json_decref(chat);
    return rc;
}

/* tool_choice {type: auto | none | any | tool (with name)}: any and tool
 * are enforced by constrained decoding; disable_parallel_tool_use: one
 * call ends the turn. */
static int parse_tool_choice(json_t *req, int *use_tools, int *single, srv_constraint *k, srv_err *e) {
    json_t *tc = json_object_get(req, "tool_choice");
    *use_tools = 1;
    *single = 0;
    if (k) k->tool_param = "tool_choice";
    if (!tc || json_is_null(tc)) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type) return srv_fail(e, 400, "tool_choice", "tool_choice must be an object with a type");
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (!strcmp(type, "none")) {
        *use_tools = 0;
    } else if (!strcmp(type, "any") || (!strcmp(type, "tool") && name)) {
        if (k) k->tools_required = 1, k->tool_name = name;
    } else if (strcmp(type, "auto")) {
        return srv_fail(e, 400, "tool_choice", "tool_choice.type must be auto, none, any or tool (with a name)");
    }
    return srv_get_bool(tc, "disable_parallel_tool_use", 0, single, e);
}

static int parse_thinking(const srv_ctx *c, json_t *req, int *on, srv_err *e) {
    json_t *t = json_object_get(req, "thinking");
    *on = c->think;
    if (!t || json_is_null(t)) return 0;
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type) return srv_fail(e, 400, "thinking", "thinking must be an object with a type");
    if (!strcmp(type, "disabled")) *on = 0;
    else if (!strcmp(type, "enabled") || !strcmp(type, "adaptive")) *on = 1;
    else return srv_fail(e, 400, "thinking", "thinking.type must be enabled, adaptive or disabled");
    return 0;
}

int srv_messages_conversation(json_t *req, int fast, json_t **msgs, json_t **tools, int *single, srv_constraint *k,
                              srv_err *e) {
    int use_tools;
    *msgs = NULL;
    *tools = NULL;
    json_t *conv = json_array(), *messages = json_object_get(req, "messages");
    if (!srv_absent(req, "system")) {
        json_t *sys = blocks_text(json_object_get(req, "system"), "system", e);
        if (!sys) goto fail;
        json_array_append_new(conv, json_pack("{s:s, s:o}", "role", "system", "content", sys));
    }
    if (!json_is_array(messages)) { srv_fail(e, 400, "messages", "messages must be a list"); goto fail; }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) if (convert_message(m, i, conv, e)) goto fail;
    if (parse_tool_choice(req, &use_tools, single, k, e) || convert_tools(json_object_get(req, "tools"), tools, e)) goto fail;
    if (!use_tools) { json_decref(*tools); *tools = NULL; }
    if (fast) srv_fast_view(&conv, tools, k);
    srv_late_system_as_user(conv);
    if (!(*msgs = srv_check_conversation(conv, "messages", e))) goto fail;
    json_decref(conv);
    return 0;
fail:
    json_decref(conv);
    json_decref(*tools);
    *tools = NULL;
    return -1;
}

/* output_config.format, or the earlier output_format: {"type":
 * "json_schema", "schema": ...}. */
static int parse_format(json_t *req, srv_constraint *k, srv_err *e) {
    json_t *oc = json_object_get(req, "output_config");
    if (oc && !json_is_null(oc) && !json_is_object(oc))
        return srv_fail(e, 400, "output_config", "output_config must be an object");
    if (!srv_absent(req, "output_format") && oc && !srv_absent(oc, "format"))
        return srv_fail(e, 400, "output_format", "give one of output_format and output_config.format");
    if (srv_parse_format(json_object_get(oc, "format"), "output_config.format", 0, k, e) ||
        srv_parse_format(json_object_get(req, "output_format"), "output_format", 0, k, e))
        return -1;
    if (k->json_object)
        return srv_fail(e, 400, k->form_param, "%s: the type must be \"json_schema\"", k->form_param);
    return 0;
}

static int refuse_unsupported(json_t *req, srv_err *e) {
    json_t *mcp = json_object_get(req, "mcp_servers");
    if (mcp && !json_is_null(mcp) && (!json_is_array(mcp) || json_array_size(mcp)))
        return srv_fail(e, 400, "mcp_servers", "mcp_servers are not supported");
    return 0;
}

srv_enc *srv_messages_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    int stream, single;
    srv_prompt_opts po = {.preserve_thinking = c->preserve_thinking};
    srv_constraint k = {0};
    json_t *msgs = NULL, *tools = NULL;
    if (srv_check_model(c, req, 1, e) || refuse_unsupported(req, e) || parse_format(req, &k, e) ||
        srv_get_bool(req, "stream", 0, &stream, e) || parse_thinking(c, req, &po.thinking, e) ||
        srv_messages_conversation(req, srv_model_fast(c, req), &msgs, &tools, &single, &k, e))
        return NULL;
    int rc = srv_build_chat_prompt(c, msgs, tools, &po, j, e) || srv_parse_sampling(c, req, 1.0, j, e) ||
             srv_parse_stop(req, "stop_sequences", j, e) || srv_parse_max_tokens(c, req, "max_tokens", 1, c->max_tokens, j, e) ||
             srv_build_grammar(c, &k, tools, !single, j, e);
    json_decref(msgs);
    if (rc) { json_decref(tools); return NULL; }
    j->parse_tool_calls = tools != NULL;
    j->single_tool_call = single;
    if (tools) j->tools_json = json_dumps(tools, JSON_COMPACT);
    json_decref(tools);
    msg_enc *m = calloc(1, sizeof *m);
    if (!m) { srv_fail(e, 500, NULL, "out of memory"); return NULL; }
    m->base = (srv_enc){stream, SRV_API_ANTHROPIC, msg_start, msg_event, msg_body, msg_heartbeat, msg_destroy, ""};
    srv_new_id(m->base.id, sizeof m->base.id, "msg_");
    m->model = json_string(c->model_id);
    m->prompt_tokens = j->n_prompt;
    m->content = json_array();
    m->open = -1;
    m->stops = j->stop;
    return &m->base;
}

json_t *srv_count_tokens(srv_ctx *c, json_t *req, srv_err *e) {
    int single;
    srv_prompt_opts po = {.preserve_thinking = c->preserve_thinking};
    json_t *msgs = NULL, *tools = NULL;
    if (srv_check_model(c, req, 1, e) || parse_thinking(c, req, &po.thinking, e) ||
        srv_messages_conversation(req, srv_model_fast(c, req), &msgs, &tools, &single, NULL, e))
        return NULL;
    srv_job *j = srv_job_create();
    int rc = j ? srv_build_chat_prompt(c, msgs, tools, &po, j, e) : srv_fail(e, 500, NULL, "out of memory");
    json_t *out = rc ? NULL : json_pack("{s:i}", "input_tokens", j->n_prompt);
    srv_job_release(j);
    json_decref(msgs);
    json_decref(tools);
    return out;
}
