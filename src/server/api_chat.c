/* POST /v1/chat/completions and POST /v1/completions (OpenAI): requests
 * into jobs, events into chat.completion(.chunk) and text_completion
 * objects, streamed as `data: JSON` frames ending with `data: [DONE]`. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api.h"

typedef struct chat_enc {
    srv_enc base;
    int completions;                 /* /v1/completions: text_completion objects */
    json_t *model;
    long long created;
    int include_usage;
    int logprobs;
    int n_calls;
    size_t text_len;                 /* answer text so far (the completions API's text_offset) */
    /* collected (not stream) or pending (stream: logprobs wait for the next text) */
    sbuf content, reasoning;
    json_t *tool_calls;
    json_t *lp;                      /* chat: [{token, logprob, bytes, top_logprobs}]; completions: parallel lists */
    srv_finish finish;               /* the DONE event's */
    srv_usage usage;
} chat_enc;

static json_t *usage_json(const srv_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u->cached_tokens, "completion_tokens_details",
                     "reasoning_tokens", u->reasoning_tokens);
}

static const char *finish_name(const chat_enc *c, srv_finish f) {
    switch (f) {
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_TOOL: return "tool_calls";
    default: return c->n_calls ? "tool_calls" : "stop";
    }
}

static double finite_lp(float v) { return isfinite(v) ? v : -9999.0; }

/* One token's entry in chat logprobs.content. */
static json_t *chat_lp_entry(const srv_event *ev) {
    json_t *top = json_array();
    for (int k = 0; k < ev->lp.n_top; k++)
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                             srv_json_bytes(ev->top[k].p, ev->top[k].n), "logprob",
                                             finite_lp(ev->lp.top_logprobs[k]), "bytes",
                                             srv_json_byte_list(ev->top[k].p, ev->top[k].n)));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", srv_json_bytes(ev->token.p, ev->token.n), "logprob",
                     finite_lp(ev->lp.logprob), "bytes", srv_json_byte_list(ev->token.p, ev->token.n), "top_logprobs", top);
}

/* The completions API's logprobs: tokens, token_logprobs, top_logprobs
 * ({token: logprob}), text_offset. */
static json_t *completion_lp_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static void completion_lp_add(json_t *lp, const srv_event *ev, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), srv_json_bytes(ev->token.p, ev->token.n));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(finite_lp(ev->lp.logprob)));
    json_t *top = json_object();
    for (int k = 0; k < ev->lp.n_top; k++) {
        json_t *key = srv_json_bytes(ev->top[k].p, ev->top[k].n);
        if (key) json_object_set_new(top, json_string_value(key), json_real(finite_lp(ev->lp.top_logprobs[k])));
        json_decref(key);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

static void lp_add(chat_enc *c, const srv_event *ev) {
    if (!c->lp) c->lp = c->completions ? completion_lp_new() : json_array();
    if (c->completions) completion_lp_add(c->lp, ev, c->text_len);
    else json_array_append_new(c->lp, chat_lp_entry(ev));
}

/* The pending logprobs as the choice's field (and forgets them). */
static json_t *lp_take(chat_enc *c) {
    if (!c->logprobs) return json_null();
    json_t *lp = c->lp;
    c->lp = NULL;
    if (c->completions) return lp ? lp : completion_lp_new();
    return json_pack("{s:o}", "content", lp ? lp : json_array());
}

static json_t *chunk(chat_enc *c, json_t *choice) {
    json_t *ch = json_pack("{s:s, s:s, s:I, s:O, s:[]}", "id", c->base.id, "object",
                           c->completions ? "text_completion" : "chat.completion.chunk", "created",
                           (json_int_t)c->created, "model", c->model, "choices");
    if (choice) {
        json_object_set_new(choice, "index", json_integer(0));
        json_array_append_new(json_object_get(ch, "choices"), choice);
    }
    return ch;
}

static json_t *delta_choice(chat_enc *c, json_t *delta, const char *finish) {
    json_t *choice = c->completions ? json_object() : json_pack("{s:o}", "delta", delta);
    if (c->completions) {
        json_t *text = json_object_get(delta, "content");
        json_object_set_new(choice, "text", text ? json_incref(text) : json_string(""));
        json_decref(delta);
    }
    json_object_set_new(choice, "logprobs", lp_take(c));
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    return choice;
}

static void chat_start(srv_enc *e, sbuf *out) {
    chat_enc *c = (chat_enc *)e;
    if (c->completions) return;
    json_t *delta = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    sbuf_sse(out, NULL, chunk(c, delta_choice(c, delta, NULL)));
}

/* Arguments in pieces of at most 1024 bytes, cut between characters. */
static void stream_arguments(chat_enc *c, const srv_event *ev, sbuf *out) {
    size_t n = strlen(ev->arguments), at = 0;
    while (at < n) {
        size_t k = n - at > 1024 ? 1024 : n - at;
        while (k < n - at && k > 0 && (ev->arguments[at + k] & 0xC0) == 0x80) k--;
        json_t *tc = json_pack("{s:i, s:{s:s%}}", "index", ev->index, "function", "arguments", ev->arguments + at, k);
        json_t *delta = json_pack("{s:[o]}", "tool_calls", tc);
        sbuf_sse(out, NULL, chunk(c, delta_choice(c, delta, NULL)));
        at += k;
    }
}

static json_t *tool_call_json(const srv_event *ev) {
    char id[64];
    srv_new_id(id, sizeof id, "call_");
    return json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index", ev->index, "id", id, "type", "function", "function",
                     "name", ev->name, "arguments", ev->arguments);
}

static void chat_event(srv_enc *e, const srv_event *ev, sbuf *out) {
    chat_enc *c = (chat_enc *)e;
    switch (ev->kind) {
    case SRV_EV_LOGPROBS:
        lp_add(c, ev);
        return;
    case SRV_EV_CONTENT:
    case SRV_EV_REASONING: {
        int reasoning = ev->kind == SRV_EV_REASONING;
        if (!reasoning) c->text_len += ev->len;
        if (!e->stream) {
            sbuf_add(reasoning ? &c->reasoning : &c->content, ev->text, ev->len);
            return;
        }
        json_t *delta = json_pack("{s:s%}", reasoning ? "reasoning_content" : "content", ev->text, ev->len);
        sbuf_sse(out, NULL, chunk(c, delta_choice(c, delta, NULL)));
        return;
    }
    case SRV_EV_TOOL_CALL: {
        c->n_calls++;
        json_t *tc = tool_call_json(ev);
        if (!e->stream) {
            json_object_del(tc, "index");
            json_array_append_new(c->tool_calls, tc);
            return;
        }
        json_object_set_new(json_object_get(tc, "function"), "arguments", json_string(""));
        sbuf_sse(out, NULL, chunk(c, delta_choice(c, json_pack("{s:[o]}", "tool_calls", tc), NULL)));
        stream_arguments(c, ev, out);
        return;
    }
    case SRV_EV_DONE:
        c->finish = ev->finish;
        c->usage = ev->usage;
        if (!e->stream) return;
        sbuf_sse(out, NULL, chunk(c, delta_choice(c, json_object(), finish_name(c, ev->finish))));
        if (c->include_usage) {
            json_t *ch = chunk(c, NULL);
            json_object_set_new(ch, "usage", usage_json(&ev->usage));
            sbuf_sse(out, NULL, ch);
        }
        sbuf_puts(out, "data: [DONE]\n\n");
        return;
    case SRV_EV_ERROR: {
        srv_err err;
        srv_fail(&err, 500, NULL, "generation failed: %.400s", ev->text);
        sbuf_sse(out, NULL, srv_error_json(SRV_API_OPENAI, &err));
        sbuf_puts(out, "data: [DONE]\n\n");
        return;
    }
    }
}

static void chat_body(srv_enc *e, sbuf *out) {
    chat_enc *c = (chat_enc *)e;
    json_t *choice;
    if (c->completions) {
        choice = json_pack("{s:i, s:s%}", "index", 0, "text", c->content.data ? c->content.data : "", c->content.len);
    } else {
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(msg, "content", c->content.len || !c->n_calls
                                                ? json_stringn(c->content.data ? c->content.data : "", c->content.len)
                                                : json_null());
        if (c->reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(c->reasoning.data, c->reasoning.len));
        if (c->n_calls) json_object_set(msg, "tool_calls", c->tool_calls);
        choice = json_pack("{s:i, s:o}", "index", 0, "message", msg);
    }
    json_object_set_new(choice, "logprobs", lp_take(c));
    json_object_set_new(choice, "finish_reason", json_string(finish_name(c, c->finish)));
    json_t *body = json_pack("{s:s, s:s, s:I, s:O, s:[o], s:o}", "id", c->base.id, "object",
                             c->completions ? "text_completion" : "chat.completion", "created", (json_int_t)c->created,
                             "model", c->model, "choices", choice, "usage", usage_json(&c->usage));
    sbuf_json(out, body);
}

static void chat_destroy(srv_enc *e) {
    chat_enc *c = (chat_enc *)e;
    json_decref(c->model);
    json_decref(c->tool_calls);
    json_decref(c->lp);
    sbuf_free(&c->content);
    sbuf_free(&c->reasoning);
    free(c);
}

static chat_enc *chat_enc_new(const srv_ctx *ctx, json_t *req, int completions, int stream) {
    chat_enc *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base = (srv_enc){stream, SRV_API_OPENAI, chat_start, chat_event, chat_body, NULL, chat_destroy, ""};
    c->completions = completions;
    srv_new_id(c->base.id, sizeof c->base.id, completions ? "cmpl-" : "chatcmpl-");
    (void)req;
    c->model = json_string(ctx->model_id);
    c->created = (long long)time(NULL);
    c->tool_calls = json_array();
    return c;
}

/* ---- requests ---------------------------------------------------------- */

/* Fields that would change the output and are not supported (yet). */
static int refuse_unsupported(json_t *req, int completions, srv_err *e) {
    long long n;
    if (srv_get_int(req, "n", 1, 1, 1, &n, e)) return srv_fail(e, 400, "n", "n: only one choice (n = 1) is supported");
    json_t *bias = json_object_get(req, "logit_bias");
    if (bias && !json_is_null(bias) && (!json_is_object(bias) || json_object_size(bias)))
        return srv_fail(e, 400, "logit_bias", "logit_bias is not supported");
    if (completions) {
        int echo;
        long long best;
        if (srv_get_bool(req, "echo", 0, &echo, e)) return -1;
        if (echo) return srv_fail(e, 400, "echo", "echo is not supported");
        if (!srv_absent(req, "suffix")) return srv_fail(e, 400, "suffix", "suffix is not supported");
        if (srv_get_int(req, "best_of", 1, 1, 1, &best, e))
            return srv_fail(e, 400, "best_of", "best_of: only 1 is supported");
        return 0;
    }
    if (!srv_absent(req, "functions") || !srv_absent(req, "function_call"))
        return srv_fail(e, 400, "functions", "functions and function_call are deprecated; use tools and tool_choice");
    json_t *mod = json_object_get(req, "modalities");
    if (mod && !json_is_null(mod) && !json_is_array(mod))
        return srv_fail(e, 400, "modalities", "modalities must be a list");
    if (mod && !json_is_null(mod)) {
        size_t i;
        json_t *m;
        json_array_foreach(mod, i, m) if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
            return srv_fail(e, 400, "modalities", "modalities: only \"text\" is supported");
    }
    if (!srv_absent(req, "audio")) return srv_fail(e, 400, "audio", "audio output is not supported");
    if (!srv_absent(req, "web_search_options"))
        return srv_fail(e, 400, "web_search_options", "web search is not supported");
    return 0;
}

static int parse_stream(json_t *req, int *stream, int *include_usage, srv_err *e) {
    if (srv_get_bool(req, "stream", 0, stream, e)) return -1;
    json_t *so = json_object_get(req, "stream_options");
    *include_usage = 0;
    if (!so || json_is_null(so)) return 0;
    if (!json_is_object(so)) return srv_fail(e, 400, "stream_options", "stream_options must be an object");
    if (!*stream) return srv_fail(e, 400, "stream_options", "stream_options is only allowed with stream: true");
    return srv_get_bool(so, "include_usage", 0, include_usage, e);
}

static int parse_logprobs(json_t *req, int completions, srv_job *j, srv_err *e) {
    long long top = 0;
    if (completions) {
        if (srv_get_int(req, "logprobs", 0, TERN_MAX_TOP_LOGPROBS, -1, &top, e)) return -1;
        j->logprobs = top >= 0;
        j->top_logprobs = top > 0 ? (int)top : 0;
        return 0;
    }
    if (srv_get_bool(req, "logprobs", 0, &j->logprobs, e) ||
        srv_get_int(req, "top_logprobs", 0, TERN_MAX_TOP_LOGPROBS, 0, &top, e))
        return -1;
    if (top > 0 && !j->logprobs) return srv_fail(e, 400, "top_logprobs", "top_logprobs needs logprobs: true");
    j->top_logprobs = (int)top;
    return 0;
}

/* tool_choice: "auto", "none" (*use_tools 0), "required" or a named
 * function ({"type": "function", "function": {"name": ...}}), which
 * constrained decoding enforces. */
static int parse_tool_choice(json_t *req, int *use_tools, srv_constraint *k, srv_err *e) {
    json_t *tc = json_object_get(req, "tool_choice");
    *use_tools = 1;
    k->tool_param = "tool_choice";
    if (!tc || json_is_null(tc)) return 0;
    const char *s = json_string_value(tc);
    if (s && !strcmp(s, "auto")) return 0;
    if (s && !strcmp(s, "none")) { *use_tools = 0; return 0; }
    if (s && !strcmp(s, "required")) { k->tools_required = 1; return 0; }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    if (json_is_object(tc) && type && !strcmp(type, "function") && name) {
        k->tools_required = 1;
        k->tool_name = name;
        return 0;
    }
    return srv_fail(e, 400, "tool_choice",
                    "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
}

/* The answer's form: response_format, or a GBNF "grammar" (llama.cpp's
 * field), not both. */
static int parse_form(json_t *req, srv_constraint *k, srv_err *e) {
    if (srv_parse_format(json_object_get(req, "response_format"), "response_format", 1, k, e)) return -1;
    json_t *g = json_object_get(req, "grammar");
    if (!g || json_is_null(g)) return 0;
    if (!json_is_string(g) || !json_string_length(g))
        return srv_fail(e, 400, "grammar", "grammar must be a non-empty string (GBNF)");
    if (k->schema || k->json_object)
        return srv_fail(e, 400, "grammar", "grammar and a JSON response_format cannot both be enforced");
    k->gbnf = json_string_value(g);
    k->form_param = "grammar";
    return 0;
}

/* The thinking switch: chat_template_kwargs.enable_thinking, else
 * reasoning_effort "none" turns it off, else the server's default; and
 * chat_template_kwargs.preserve_thinking, else the server's default. */
static int parse_thinking(const srv_ctx *c, json_t *req, srv_prompt_opts *o, srv_err *e) {
    o->thinking = c->think;
    o->preserve_thinking = c->preserve_thinking;
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    json_t *effort = json_object_get(req, "reasoning_effort");
    if (effort && !json_is_null(effort)) {
        if (!json_is_string(effort)) return srv_fail(e, 400, "reasoning_effort", "reasoning_effort must be a string");
        o->thinking = strcmp(json_string_value(effort), "none") != 0;
    }
    if (!kw || json_is_null(kw)) return 0;
    if (!json_is_object(kw)) return srv_fail(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object");
    return srv_get_bool(kw, "enable_thinking", o->thinking, &o->thinking, e) ||
                   srv_get_bool(kw, "preserve_thinking", o->preserve_thinking, &o->preserve_thinking, e)
               ? -1
               : 0;
}

srv_enc *srv_chat_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    int stream, include_usage, use_tools, parallel;
    srv_prompt_opts po;
    srv_constraint k = {0};
    json_t *tools = NULL, *msgs = NULL;
    if (srv_check_model(c, req, 0, e) || refuse_unsupported(req, 0, e) || parse_stream(req, &stream, &include_usage, e) ||
        parse_logprobs(req, 0, j, e) || parse_tool_choice(req, &use_tools, &k, e) || parse_form(req, &k, e) ||
        parse_thinking(c, req, &po, e) || srv_get_bool(req, "parallel_tool_calls", 1, &parallel, e) ||
        srv_check_tools(json_object_get(req, "tools"), "tools", &tools, e))
        return NULL;
    if (!use_tools) { json_decref(tools); tools = NULL; }
    json_t *sent = json_incref(json_object_get(req, "messages"));
    if (srv_model_fast(c, req)) srv_fast_view(&sent, &tools, &k);
    msgs = srv_check_conversation(sent, "messages", e);
    json_decref(sent);
    if (!msgs || srv_build_chat_prompt(c, msgs, tools, &po, j, e) || srv_parse_sampling(c, req, 2.0, j, e) ||
        srv_parse_stop(req, "stop", j, e) || srv_parse_ignore_eos(c, req, j, e) ||
        srv_parse_max_tokens(c, req, srv_absent(req, "max_completion_tokens") ? "max_tokens" : "max_completion_tokens",
                             0, c->max_tokens, j, e) ||
        srv_build_grammar(c, &k, tools, parallel, j, e)) {
        json_decref(tools);
        json_decref(msgs);
        return NULL;
    }
    json_decref(msgs);
    j->parse_tool_calls = tools != NULL;
    j->single_tool_call = !parallel;
    if (tools) j->tools_json = json_dumps(tools, JSON_COMPACT);
    json_decref(tools);
    chat_enc *enc = chat_enc_new(c, req, 0, stream);
    if (!enc) { srv_fail(e, 500, NULL, "out of memory"); return NULL; }
    enc->include_usage = include_usage;
    enc->logprobs = j->logprobs;
    return &enc->base;
}

/* The completions prompt: a string, a list of token ids, or a list
 * holding one of those. */
static int completion_prompt(srv_ctx *c, json_t *prompt, srv_job *j, srv_err *e) {
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        (json_is_string(json_array_get(prompt, 0)) || json_is_array(json_array_get(prompt, 0))))
        prompt = json_array_get(prompt, 0);
    if (json_is_string(prompt)) {
        size_t n = 0;
        int32_t *ids = NULL;
        if (srv_tokenize(c, json_string_value(prompt), json_string_length(prompt), &ids, &n, e)) return -1;
        j->prompt = ids;
        j->n_prompt = (int)n;
    } else if (json_is_array(prompt)) {
        int vocab = tern_tokenizer_vocab_size(c->tok);
        size_t n = json_array_size(prompt), i;
        json_t *v;
        if (!(j->prompt = malloc((n + 1) * sizeof *j->prompt))) return srv_fail(e, 500, NULL, "out of memory");
        json_array_foreach(prompt, i, v) {
            if (!json_is_integer(v)) return srv_fail(e, 400, "prompt", "prompt: a list holds one prompt (text or ids)");
            json_int_t id = json_integer_value(v);
            if (id < 0 || id >= vocab) return srv_fail(e, 400, "prompt", "prompt[%zu]: token id %lld is outside the vocabulary (%d)", i, (long long)id, vocab);
            j->prompt[i] = (int32_t)id;
        }
        j->n_prompt = (int)n;
    } else {
        return srv_fail(e, 400, "prompt", "prompt must be a string, a list of token ids, or a list of one of those");
    }
    if (j->n_prompt == 0) return srv_fail(e, 400, "prompt", "prompt is empty");
    return srv_check_prompt_len(c, j, "prompt", e);
}

srv_enc *srv_completions_prepare(srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    int stream, include_usage;
    srv_constraint k = {0};
    if (srv_check_model(c, req, 0, e) || refuse_unsupported(req, 1, e) || parse_stream(req, &stream, &include_usage, e) ||
        parse_logprobs(req, 1, j, e) || parse_form(req, &k, e) || completion_prompt(c, json_object_get(req, "prompt"), j, e) ||
        srv_parse_sampling(c, req, 2.0, j, e) || srv_parse_stop(req, "stop", j, e) ||
        srv_parse_ignore_eos(c, req, j, e))
        return NULL;
    /* 16: the completions API's documented default */
    if (srv_parse_max_tokens(c, req, "max_tokens", 0, c->max_tokens >= 0 ? c->max_tokens : 16, j, e) ||
        srv_build_grammar(c, &k, NULL, 1, j, e))
        return NULL;
    j->raw_text = 1;
    chat_enc *enc = chat_enc_new(c, req, 1, stream);
    if (!enc) { srv_fail(e, 500, NULL, "out of memory"); return NULL; }
    enc->include_usage = include_usage;
    enc->logprobs = j->logprobs;
    return &enc->base;
}
