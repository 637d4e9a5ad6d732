/* The server's pieces without HTTP: each API's encoder driven by the output
 * parser's fixtures (tests/fixtures/tool_parse/streams.json), decoded back
 * from its SSE frames and from its whole-response body, must give the
 * parser's events; and conversations with tool calls, written in each
 * API's own form, must render exactly as the chat template fixtures
 * (tests/fixtures/chat/template_cases.json). The end-to-end tests with the
 * real clients are in tests/server/ (Python). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "server/job.h"
#include "server/sbuf.h"
#include "tern.h"

static srv_ctx ctx;

static void setup(void) {
    memset(&ctx, 0, sizeof ctx);
    tern_error err;
    ctx.tok = tern_tokenizer_load("models/tern-tiny", &err);
    cr_assert(ctx.tok, "%s", err.msg);
    pthread_mutex_init(&ctx.tok_mu, NULL);
    ctx.responses = srv_store_create(8);
    ctx.model_id = "test-model";
    ctx.n_ctx = 4096;
    ctx.think = 1;
    ctx.max_tokens = -1;
    tern_sampler_params_default(&ctx.sampling);
}

static void teardown(void) {
    srv_store_destroy(ctx.responses);
    tern_tokenizer_free(ctx.tok);
    pthread_mutex_destroy(&ctx.tok_mu);
}

TestSuite(server, .init = setup, .fini = teardown);

/* ---- segments: what a response says, in order ------------------------------
 * R (reasoning) and C (answer) text, consecutive pieces of one kind joined;
 * T one tool call (name and arguments). Written as R[..]C[..]T[name|args]. */

typedef struct segs {
    sbuf out;
    char last;                       /* kind of the open text segment, or 0 */
} segs;

static void seg_text(segs *s, char kind, const char *text, size_t n) {
    if (!n) return;
    if (s->last == kind) s->out.len--;   /* reopen: drop the ']' */
    else { char open[3] = {kind, '[', 0}; sbuf_puts(&s->out, open); }
    sbuf_add(&s->out, text, n);
    sbuf_puts(&s->out, "]");
    s->last = kind;
}

static void seg_call(segs *s, const char *name, const char *args) {
    sbuf_printf(&s->out, "T[%s|%s]", name, args);
    s->last = 0;
}

static const char *seg_str(segs *s) { return s->out.data ? s->out.data : ""; }

/* ---- the parser's events for a fixture ------------------------------------- */

typedef struct events {
    srv_event *ev[256];
    int n;
    segs want;
} events;

static int collect(void *user, const tern_out_event *o, tern_error *err) {
    (void)err;
    events *es = user;
    srv_event *ev = srv_event_from_output(o);
    if (!ev) return 0;   /* MALFORMED: its raw text follows as content */
    cr_assert_lt(es->n, 256);
    es->ev[es->n++] = ev;
    if (o->kind == TERN_OUT_TOOL_CALL) seg_call(&es->want, o->name, o->arguments);
    else seg_text(&es->want, o->kind == TERN_OUT_REASONING ? 'R' : 'C', o->text, o->len);
    return 0;
}

/* The text fed in pieces of 3 bytes, so the encoders see many events. */
static void parse_case(json_t *c, events *es) {
    memset(es, 0, sizeof *es);
    json_t *tools = json_object_get(c, "tools");
    char *tj = json_is_array(tools) ? json_dumps(tools, 0) : NULL;
    tern_output_params p = {json_is_true(json_object_get(c, "start_in_reasoning")),
                            json_is_true(json_object_get(c, "parse_tool_calls")), tj};
    tern_error err;
    tern_output_parser *op = tern_output_parser_create(&p, collect, es, &err);
    cr_assert(op, "%s", err.msg);
    const char *text = json_string_value(json_object_get(c, "text"));
    size_t n = strlen(text);
    for (size_t at = 0; at < n; at += 3) tern_output_parser_feed(op, text + at, n - at < 3 ? n - at : 3, &err);
    tern_output_parser_finish(op, &err);
    tern_output_parser_destroy(op);
    free(tj);
}

static void events_free(events *es) {
    for (int i = 0; i < es->n; i++) srv_event_free(es->ev[i]);
    sbuf_free(&es->want.out);
}

/* ---- requests per API -------------------------------------------------------- */

enum api { CHAT, RESPONSES, MESSAGES };
static const char *API_NAME[] = {"chat", "responses", "messages"};

/* OpenAI chat tools as the API writes them. */
static json_t *tools_for(enum api api, json_t *tools) {
    if (!json_is_array(tools) || api == CHAT) return json_incref(tools);
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters");
        json_t *o = api == RESPONSES ? json_pack("{s:s, s:O, s:O}", "type", "function", "name",
                                                 json_object_get(fn, "name"), "parameters", params)
                                     : json_pack("{s:O, s:O}", "name", json_object_get(fn, "name"), "input_schema",
                                                 params);
        if (json_object_get(fn, "description")) json_object_set(o, "description", json_object_get(fn, "description"));
        json_array_append_new(out, o);
    }
    return out;
}

static srv_enc *prepare(enum api api, json_t *tools, int stream, srv_job *j) {
    json_t *req;
    if (api == CHAT)
        req = json_pack("{s:[{s:s, s:s}], s:b}", "messages", "role", "user", "content", "hi", "stream", stream);
    else if (api == RESPONSES)
        req = json_pack("{s:s, s:b}", "input", "hi", "stream", stream);
    else
        req = json_pack("{s:s, s:i, s:[{s:s, s:s}], s:b}", "model", "m", "max_tokens", 64, "messages", "role", "user",
                        "content", "hi", "stream", stream);
    json_t *t = tools_for(api, tools);
    if (json_is_array(t)) json_object_set(req, "tools", t);
    json_decref(t);
    srv_err e = {0};
    srv_enc *enc = api == CHAT ? srv_chat_prepare(&ctx, req, j, &e)
                   : api == RESPONSES ? srv_responses_prepare(&ctx, req, j, &e)
                                      : srv_messages_prepare(&ctx, req, j, &e);
    cr_assert(enc, "%s prepare: %s", API_NAME[api], e.msg);
    json_decref(req);
    return enc;
}

/* Feeds the events and a DONE through the encoder; the stream's bytes, or
 * the body. */
static void encode(srv_enc *enc, events *es, sbuf *out) {
    if (enc->stream) enc->start(enc, out);
    sbuf scratch = {0};
    for (int i = 0; i < es->n; i++) enc->event(enc, es->ev[i], enc->stream ? out : &scratch);
    srv_event done = {.kind = SRV_EV_DONE, .finish = SRV_FINISH_EOS,
                      .usage = {.prompt_tokens = 9, .cached_tokens = 4, .completion_tokens = 7}};
    enc->event(enc, &done, enc->stream ? out : &scratch);
    cr_assert_eq(scratch.len, 0, "a whole-response encoder wrote frames");
    sbuf_free(&scratch);
    if (!enc->stream) enc->body(enc, out);
    cr_assert(!out->oom);
}

/* ---- decoding the SSE frames ------------------------------------------------- */

typedef struct frame {
    char event[64];
    json_t *data;                    /* NULL for [DONE] */
} frame;

/* Splits a stream into frames; returns their count. */
static int split_frames(const char *s, frame *f, int max) {
    int n = 0;
    while (*s) {
        const char *end = strstr(s, "\n\n");
        cr_assert(end, "a frame does not end with a blank line: %.80s", s);
        cr_assert_lt(n, max);
        frame *fr = &f[n++];
        memset(fr, 0, sizeof *fr);
        const char *line = s;
        while (line < end) {
            const char *nl = memchr(line, '\n', (size_t)(end - line));
            if (!nl) nl = end;
            if (!strncmp(line, "event: ", 7)) snprintf(fr->event, sizeof fr->event, "%.*s", (int)(nl - line - 7), line + 7);
            else if (!strncmp(line, "data: ", 6)) {
                size_t len = (size_t)(nl - line - 6);
                if (len == 6 && !strncmp(line + 6, "[DONE]", 6)) fr->data = NULL;
                else {
                    json_error_t je;
                    fr->data = json_loadb(line + 6, len, 0, &je);
                    cr_assert(fr->data, "a data line is not JSON (%s): %.*s", je.text, (int)len, line + 6);
                }
            } else {
                cr_assert_fail("unexpected line in a frame: %.*s", (int)(nl - line), line);
            }
            line = nl + 1;
        }
        s = end + 2;
    }
    return n;
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* Tool calls whose arguments arrive in pieces: the open one. */
typedef struct call_acc {
    sbuf name, args;
    int open;
} call_acc;

static void call_flush(segs *s, call_acc *c) {
    if (!c->open) return;
    seg_call(s, c->name.data ? c->name.data : "", c->args.data ? c->args.data : "");
    sbuf_free(&c->name);
    sbuf_free(&c->args);
    c->open = 0;
}

static void call_open(segs *s, call_acc *c, const char *name) {
    call_flush(s, c);
    sbuf_puts(&c->name, name);
    sbuf_puts(&c->args, "");
    c->open = 1;
}

static void text(segs *s, call_acc *c, char kind, json_t *v) {
    if (!json_is_string(v) || !json_string_length(v)) return;
    call_flush(s, c);
    seg_text(s, kind, json_string_value(v), json_string_length(v));
}

static void decode_chat_stream(frame *f, int n, segs *s) {
    call_acc c = {0};
    int finished = 0;
    cr_assert_eq(json_object_get(json_object_get(json_array_get(json_object_get(f[0].data, "choices"), 0), "delta"),
                                 "role") != NULL, 1, "the first chunk gives the role");
    for (int i = 0; i < n; i++) {
        if (!f[i].data) { cr_assert_eq(i, n - 1, "[DONE] is the last frame"); continue; }
        cr_assert_str_eq(str(f[i].data, "object"), "chat.completion.chunk");
        json_t *choice = json_array_get(json_object_get(f[i].data, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        finished |= json_is_string(json_object_get(choice, "finish_reason"));
        text(s, &c, 'R', json_object_get(delta, "reasoning_content"));
        text(s, &c, 'C', json_object_get(delta, "content"));
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(delta, "tool_calls"), k, tc) {
            json_t *fn = json_object_get(tc, "function");
            if (json_object_get(fn, "name")) {
                cr_assert(json_string_length(json_object_get(tc, "id")) > 0, "a call's first delta has its id");
                call_open(s, &c, str(fn, "name"));
            }
            cr_assert(c.open, "arguments before the call's name");
            sbuf_puts(&c.args, str(fn, "arguments"));
        }
    }
    call_flush(s, &c);
    cr_assert(finished, "no finish_reason");
    cr_assert(f[n - 1].data == NULL, "the stream does not end with [DONE]");
}

static void decode_responses_stream(frame *f, int n, segs *s) {
    call_acc c = {0};
    cr_assert_str_eq(f[0].event, "response.created");
    cr_assert_str_eq(f[n - 1].event, "response.completed");
    for (int i = 0; i < n; i++) {
        cr_assert(f[i].data, "no [DONE] in the Responses API");
        cr_assert_str_eq(str(f[i].data, "type"), f[i].event, "event name and type differ");
        cr_assert_eq(json_integer_value(json_object_get(f[i].data, "sequence_number")), i);
        const char *ev = f[i].event;
        if (!strcmp(ev, "response.reasoning_text.delta")) text(s, &c, 'R', json_object_get(f[i].data, "delta"));
        else if (!strcmp(ev, "response.output_text.delta")) text(s, &c, 'C', json_object_get(f[i].data, "delta"));
        else if (!strcmp(ev, "response.output_item.added") &&
                 !strcmp(str(json_object_get(f[i].data, "item"), "type"), "function_call"))
            call_open(s, &c, str(json_object_get(f[i].data, "item"), "name"));
        else if (!strcmp(ev, "response.function_call_arguments.delta"))
            sbuf_puts(&c.args, str(f[i].data, "delta"));
    }
    call_flush(s, &c);
}

static void decode_messages_stream(frame *f, int n, segs *s) {
    call_acc c = {0};
    cr_assert_str_eq(f[0].event, "message_start");
    cr_assert_str_eq(f[n - 1].event, "message_stop");
    for (int i = 0; i < n; i++) {
        cr_assert(f[i].data);
        cr_assert_str_eq(str(f[i].data, "type"), f[i].event);
        json_t *d = json_object_get(f[i].data, "delta");
        if (!strcmp(f[i].event, "content_block_start")) {
            json_t *b = json_object_get(f[i].data, "content_block");
            if (!strcmp(str(b, "type"), "tool_use")) call_open(s, &c, str(b, "name"));
        } else if (!strcmp(f[i].event, "content_block_delta")) {
            const char *t = str(d, "type");
            if (!strcmp(t, "thinking_delta")) text(s, &c, 'R', json_object_get(d, "thinking"));
            else if (!strcmp(t, "text_delta")) text(s, &c, 'C', json_object_get(d, "text"));
            else if (!strcmp(t, "input_json_delta")) sbuf_puts(&c.args, str(d, "partial_json"));
        }
    }
    call_flush(s, &c);
}

/* ---- decoding whole responses ----------------------------------------------- */

static void decode_responses_body(json_t *b, segs *s) {
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(b, "output"), i, it) {
        const char *type = str(it, "type");
        json_t *part = json_array_get(json_object_get(it, "content"), 0);
        if (!strcmp(type, "reasoning")) seg_text(s, 'R', str(part, "text"), strlen(str(part, "text")));
        else if (!strcmp(type, "message")) seg_text(s, 'C', str(part, "text"), strlen(str(part, "text")));
        else if (!strcmp(type, "function_call")) seg_call(s, str(it, "name"), str(it, "arguments"));
        else cr_assert_fail("unexpected output item %s", type);
    }
}

static void decode_messages_body(json_t *b, segs *s) {
    size_t i;
    json_t *blk;
    json_array_foreach(json_object_get(b, "content"), i, blk) {
        const char *type = str(blk, "type");
        if (!strcmp(type, "thinking")) seg_text(s, 'R', str(blk, "thinking"), strlen(str(blk, "thinking")));
        else if (!strcmp(type, "text")) seg_text(s, 'C', str(blk, "text"), strlen(str(blk, "text")));
        else if (!strcmp(type, "tool_use")) {
            char *args = json_dumps(json_object_get(blk, "input"), JSON_COMPACT);
            json_t *want = json_object_get(blk, "input");
            cr_assert(json_is_object(want));
            seg_call(s, str(blk, "name"), args);
            free(args);
        } else cr_assert_fail("unexpected block %s", type);
    }
}

/* Chat gathers the whole answer in one message: the reasoning, the text
 * and the calls, each joined. */
static void chat_summary(const char *want_segments, json_t *msg, const events *es) {
    sbuf r = {0}, c = {0};
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t k = 0;
    for (int i = 0; i < es->n; i++) {
        srv_event *ev = es->ev[i];
        if (ev->kind == SRV_EV_REASONING) sbuf_add(&r, ev->text, ev->len);
        else if (ev->kind == SRV_EV_CONTENT) sbuf_add(&c, ev->text, ev->len);
        else {
            json_t *fn = json_object_get(json_array_get(calls, k++), "function");
            cr_expect_str_eq(str(fn, "name"), ev->name, "%s", want_segments);
            cr_expect_str_eq(str(fn, "arguments"), ev->arguments, "%s", want_segments);
        }
    }
    cr_expect_eq(json_array_size(calls), k, "%s: calls", want_segments);
    cr_expect_str_eq(str(msg, "reasoning_content"), r.data ? r.data : "", "%s", want_segments);
    cr_expect_str_eq(str(msg, "content"), c.data ? c.data : "", "%s", want_segments);
    cr_expect(c.len || !k || json_is_null(json_object_get(msg, "content")), "content is null beside calls");
    sbuf_free(&r);
    sbuf_free(&c);
}

Test(server, encoders_give_back_the_parser_events) {
    json_error_t je;
    json_t *cases = json_load_file("tests/fixtures/tool_parse/streams.json", 0, &je);
    cr_assert(json_is_array(cases), "%s", je.text);
    size_t ci;
    json_t *c;
    int checked = 0;
    json_array_foreach(cases, ci, c) {
        events es;
        parse_case(c, &es);
        const char *want = seg_str(&es.want);
        for (int api = CHAT; api <= MESSAGES; api++) {
            for (int stream = 0; stream <= 1; stream++) {
                srv_job *j = srv_job_create();
                srv_enc *enc = prepare(api, json_object_get(c, "tools"), stream, j);
                sbuf out = {0};
                encode(enc, &es, &out);
                segs got = {0};
                if (stream) {
                    static frame f[2048];
                    int n = split_frames(out.data, f, 2048);
                    if (api == CHAT) decode_chat_stream(f, n, &got);
                    else if (api == RESPONSES) decode_responses_stream(f, n, &got);
                    else decode_messages_stream(f, n, &got);
                    cr_expect_str_eq(seg_str(&got), want, "%s %s stream", str(c, "name"), API_NAME[api]);
                    for (int i = 0; i < n; i++) json_decref(f[i].data);
                } else {
                    json_t *body = json_loadb(out.data, out.len, 0, &je);
                    cr_assert(body, "%s body: %s", API_NAME[api], je.text);
                    if (api == CHAT) {
                        json_t *msg = json_object_get(json_array_get(json_object_get(body, "choices"), 0), "message");
                        chat_summary(want, msg, &es);
                    } else {
                        if (api == RESPONSES) decode_responses_body(body, &got);
                        else decode_messages_body(body, &got);
                        /* the body's tool input is re-serialised: compare the values */
                        if (api == MESSAGES) {
                            segs want_c = {0};
                            for (int i = 0; i < es.n; i++) {
                                srv_event *ev = es.ev[i];
                                if (ev->kind == SRV_EV_TOOL_CALL) {
                                    json_t *v = json_loads(ev->arguments, 0, NULL);
                                    char *a = json_dumps(v, JSON_COMPACT);
                                    seg_call(&want_c, ev->name, a);
                                    free(a);
                                    json_decref(v);
                                } else {
                                    seg_text(&want_c, ev->kind == SRV_EV_REASONING ? 'R' : 'C', ev->text, ev->len);
                                }
                            }
                            cr_expect_str_eq(seg_str(&got), seg_str(&want_c), "%s messages body", str(c, "name"));
                            sbuf_free(&want_c.out);
                        } else {
                            cr_expect_str_eq(seg_str(&got), want, "%s responses body", str(c, "name"));
                        }
                    }
                    json_decref(body);
                }
                checked++;
                sbuf_free(&got.out);
                sbuf_free(&out);
                enc->destroy(enc);
                srv_job_release(j);
            }
        }
        events_free(&es);
    }
    json_decref(cases);
    cr_assert_gt(checked, 100);
}

/* ---- conversations ------------------------------------------------------------ */

/* The fixture's messages with the ids an API requires: each call gets one,
 * each tool result answers the oldest open call. NULL when a tool result
 * answers nothing or a call stays unanswered (not a valid API
 * conversation). */
static json_t *with_ids(json_t *messages) {
    json_t *m = json_deep_copy(messages), *open = json_array();
    size_t i, k;
    json_t *msg, *tc;
    int n = 0, ok = 1;
    json_array_foreach(m, i, msg) {
        const char *role = str(msg, "role");
        json_array_foreach(json_object_get(msg, "tool_calls"), k, tc) {
            char id[32];
            snprintf(id, sizeof id, "call_%d", n++);
            if (!json_object_get(tc, "id")) json_object_set_new(tc, "id", json_string(id));
            json_array_append(open, json_object_get(tc, "id"));
        }
        if (!strcmp(role, "tool")) {
            if (!json_array_size(open)) { ok = 0; break; }
            json_object_set(msg, "tool_call_id", json_array_get(open, 0));
            json_array_remove(open, 0);
        }
    }
    if (json_array_size(open)) ok = 0;
    json_decref(open);
    if (!ok) { json_decref(m); return NULL; }
    return m;
}

static char *render(json_t *msgs, json_t *tools, json_t *options) {
    tern_chat_options o;
    tern_chat_options_default(&o);
    json_t *v;
    if ((v = json_object_get(options, "add_generation_prompt"))) o.add_generation_prompt = json_is_true(v);
    if ((v = json_object_get(options, "enable_thinking"))) o.enable_thinking = json_is_true(v);
    if ((v = json_object_get(options, "preserve_thinking"))) o.preserve_thinking = json_is_true(v);
    char *mj = json_dumps(msgs, 0), *tj = json_is_array(tools) ? json_dumps(tools, 0) : NULL;
    tern_error err;
    char *out = tern_chat_render(mj, tj, &o, &err);
    cr_assert(out, "render: %s", err.msg);
    free(mj);
    free(tj);
    return out;
}

/* The arguments of a call as an object (they may be a JSON string). */
static json_t *args_object(json_t *fn) {
    json_t *a = json_object_get(fn, "arguments");
    if (json_is_object(a)) return json_incref(a);
    json_t *v = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : NULL;
    return json_is_object(v) ? v : (json_decref(v), json_object());
}

static int plain(json_t *content) { return !content || json_is_string(content) || json_is_null(content); }

/* The conversation in Anthropic's form, or NULL where it has no exact
 * equivalent (content parts, a system message after the start). */
static json_t *as_anthropic(json_t *msgs, json_t *tools) {
    json_t *req = json_pack("{s:s, s:i, s:[]}", "model", "m", "max_tokens", 16, "messages");
    json_t *out = json_object_get(req, "messages"), *results = NULL;
    size_t i, k;
    json_t *m, *tc;
    json_array_foreach(msgs, i, m) {
        const char *role = str(m, "role");
        json_t *content = json_object_get(m, "content");
        if (!plain(content)) goto none;
        if (strcmp(role, "tool")) results = NULL;
        if (!strcmp(role, "system")) {
            if (i) goto none;
            json_object_set(req, "system", content);
        } else if (!strcmp(role, "user")) {
            json_array_append_new(out, json_pack("{s:s, s:O}", "role", "user", "content", content ? content : json_string("")));
        } else if (!strcmp(role, "tool")) {
            if (!results) {
                results = json_array();
                json_array_append_new(out, json_pack("{s:s, s:o}", "role", "user", "content", results));
            }
            json_array_append_new(results, json_pack("{s:s, s:O, s:O}", "type", "tool_result", "tool_use_id",
                                                     json_object_get(m, "tool_call_id"), "content",
                                                     content ? content : json_string("")));
        } else {
            json_t *blocks = json_array();
            json_t *r = json_object_get(m, "reasoning_content");
            if (json_is_string(r)) json_array_append_new(blocks, json_pack("{s:s, s:O, s:s}", "type", "thinking", "thinking", r, "signature", ""));
            if (json_string_length(content)) json_array_append_new(blocks, json_pack("{s:s, s:O}", "type", "text", "text", content));
            json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
                json_t *fn = json_object_get(tc, "function") ? json_object_get(tc, "function") : tc;
                json_array_append_new(blocks, json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id",
                                                        json_object_get(tc, "id"), "name", json_object_get(fn, "name"),
                                                        "input", args_object(fn)));
            }
            json_array_append_new(out, json_pack("{s:s, s:o}", "role", "assistant", "content", blocks));
        }
    }
    json_t *t = tools_for(MESSAGES, tools);
    if (json_is_array(t)) json_object_set(req, "tools", t);
    json_decref(t);
    return req;
none:
    json_decref(req);
    return NULL;
}

/* The conversation as Responses input items (system first as a developer
 * item), or NULL where it has no exact equivalent. */
static json_t *as_responses(json_t *msgs) {
    json_t *items = json_array();
    size_t i, k;
    json_t *m, *tc;
    json_array_foreach(msgs, i, m) {
        const char *role = str(m, "role");
        json_t *content = json_object_get(m, "content");
        if (!plain(content) || (!strcmp(role, "system") && i)) { json_decref(items); return NULL; }
        json_t *text = content && !json_is_null(content) ? content : json_string("");
        if (!strcmp(role, "tool")) {
            json_array_append_new(items, json_pack("{s:s, s:O, s:O}", "type", "function_call_output", "call_id",
                                                   json_object_get(m, "tool_call_id"), "output", text));
        } else if (!strcmp(role, "assistant")) {
            json_t *r = json_object_get(m, "reasoning_content");
            if (json_is_string(r))
                json_array_append_new(items, json_pack("{s:s, s:[{s:s, s:O}], s:[]}", "type", "reasoning", "content",
                                                       "type", "reasoning_text", "text", r, "summary"));
            if (json_string_length(text) || !json_array_size(json_object_get(m, "tool_calls")))
                json_array_append_new(items, json_pack("{s:s, s:s, s:[{s:s, s:O}]}", "type", "message", "role",
                                                       "assistant", "content", "type", "output_text", "text", text));
            json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
                json_t *fn = json_object_get(tc, "function") ? json_object_get(tc, "function") : tc;
                json_t *a = args_object(fn);
                char *aj = json_dumps(a, 0);
                json_array_append_new(items, json_pack("{s:s, s:O, s:O, s:s}", "type", "function_call", "call_id",
                                                       json_object_get(tc, "id"), "name", json_object_get(fn, "name"),
                                                       "arguments", aj));
                free(aj);
                json_decref(a);
            }
        } else {
            json_array_append_new(items, json_pack("{s:s, s:s, s:O}", "type", "message", "role",
                                                   !strcmp(role, "system") ? "developer" : role, "content", text));
        }
        if (text != content) json_decref(text);
    }
    return items;
}

Test(server, tool_conversations_render_as_the_template_does) {
    json_error_t je;
    json_t *cases = json_load_file("tests/fixtures/chat/template_cases.json", 0, &je);
    cr_assert(json_is_array(cases), "%s", je.text);
    size_t ci, k;
    json_t *c, *m;
    int n_chat = 0, n_anthropic = 0, n_responses = 0;
    json_array_foreach(cases, ci, c) {
        json_t *expected = json_object_get(c, "expected"), *tools = json_object_get(c, "tools");
        int has_tools = 0;
        json_array_foreach(json_object_get(c, "messages"), k, m)
            has_tools |= !strcmp(str(m, "role"), "tool") || json_array_size(json_object_get(m, "tool_calls"));
        if (!json_is_string(expected) || !has_tools) continue;
        json_t *msgs = with_ids(json_object_get(c, "messages"));
        if (!msgs) continue;
        json_t *options = json_object_get(c, "options");
        srv_err e = {0};
        json_t *checked = srv_check_conversation(msgs, "messages", &e);
        cr_assert(checked, "%s: %s", str(c, "name"), e.msg);
        char *got = render(checked, tools, options);
        cr_expect_str_eq(got, json_string_value(expected), "%s (chat completions)", str(c, "name"));
        free(got);
        json_decref(checked);
        n_chat++;

        json_t *areq = as_anthropic(msgs, tools);
        if (areq) {
            json_t *amsgs = NULL, *atools = NULL;
            int single;
            cr_assert_eq(srv_messages_conversation(areq, 0, &amsgs, &atools, &single, NULL, &e), 0, "%s: %s", str(c, "name"), e.msg);
            got = render(amsgs, atools ? atools : tools, options);
            cr_expect_str_eq(got, json_string_value(expected), "%s (messages)", str(c, "name"));
            free(got);
            json_decref(amsgs);
            json_decref(atools);
            json_decref(areq);
            n_anthropic++;
        }
        json_t *items = as_responses(msgs);
        if (items) {
            json_t *rmsgs = json_array();
            cr_assert_eq(srv_responses_input(items, rmsgs, &e), 0, "%s: %s", str(c, "name"), e.msg);
            srv_late_system_as_user(rmsgs);
            json_t *rchecked = srv_check_conversation(rmsgs, "input", &e);
            cr_assert(rchecked, "%s: %s", str(c, "name"), e.msg);
            got = render(rchecked, tools, options);
            cr_expect_str_eq(got, json_string_value(expected), "%s (responses)", str(c, "name"));
            free(got);
            json_decref(rchecked);
            json_decref(rmsgs);
            json_decref(items);
            n_responses++;
        }
        json_decref(msgs);
    }
    json_decref(cases);
    printf("tool conversations rendered: %d chat, %d messages, %d responses\n", n_chat, n_anthropic, n_responses);
    cr_assert_geq(n_chat, 5);
    cr_assert_geq(n_anthropic, 4);
    cr_assert_geq(n_responses, 4);
}

/* ---- conversation checks --------------------------------------------------- */

static int refused(const char *messages_json, const char *needle) {
    json_t *msgs = json_loads(messages_json, 0, NULL);
    cr_assert(msgs, "bad test JSON: %s", messages_json);
    srv_err e = {0};
    json_t *out = srv_check_conversation(msgs, "messages", &e);
    json_decref(msgs);
    if (out) { json_decref(out); return 0; }
    cr_expect_eq(e.status, 400);
    cr_expect(strstr(e.msg, needle), "'%s' does not say '%s'", e.msg, needle);
    return 1;
}

Test(server, conversations_are_checked) {
    cr_expect(refused("[]", "non-empty"));
    cr_expect(refused("[{\"role\":\"critic\",\"content\":\"x\"}]", "critic"));
    cr_expect(refused("[{\"role\":\"user\",\"content\":5}]", "string"));
    cr_expect(refused("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]", "image_url"));
    cr_expect(refused("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"s\"}]", "before"));
    const char *call = "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}";
    char buf[1024];
    snprintf(buf, sizeof buf, "[{\"role\":\"user\",\"content\":\"q\"},%s,{\"role\":\"user\",\"content\":\"next\"}]", call);
    cr_expect(refused(buf, "not answered"));
    snprintf(buf, sizeof buf, "[{\"role\":\"user\",\"content\":\"q\"},%s,{\"role\":\"tool\",\"tool_call_id\":\"c1\","
                              "\"content\":\"r\"},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"r\"}]", call);
    cr_expect(refused(buf, "answers no open tool call"));
    snprintf(buf, sizeof buf, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"tool\",\"tool_call_id\":\"zz\","
                              "\"content\":\"r\"}]");
    cr_expect(refused(buf, "answers no open tool call"));
    snprintf(buf, sizeof buf, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":["
                              "{\"id\":\"a\",\"function\":{\"name\":\"f\"}},{\"id\":\"a\",\"function\":{\"name\":\"g\"}}]}]");
    cr_expect(refused(buf, "used twice"));
    snprintf(buf, sizeof buf, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":["
                              "{\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}]");
    cr_expect(refused(buf, "JSON object"));
    /* leading system and developer messages become one */
    json_t *ok = json_loads("[{\"role\":\"developer\",\"content\":\"a\"},{\"role\":\"system\",\"content\":[{\"type\":"
                            "\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"q\"}]", 0, NULL);
    srv_err e = {0};
    json_t *out = srv_check_conversation(ok, "messages", &e);
    cr_assert(out, "%s", e.msg);
    cr_expect_eq(json_array_size(out), 2);
    cr_expect_str_eq(str(json_array_get(out, 0), "content"), "a\n\nb");
    json_decref(out);
    json_decref(ok);
}

/* The job's prompt is the token ids of the whole rendered conversation
 * (split prompts tokenize as the whole text does). */
static void expect_whole_tokenization(const char *messages_json, const srv_job *j) {
    tern_chat_options o;
    tern_chat_options_default(&o);
    o.add_generation_prompt = 1;
    tern_error err;
    char *whole = tern_chat_render(messages_json, NULL, &o, &err);
    cr_assert_not_null(whole, "%s", err.msg);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tern_tokenizer_encode(ctx.tok, whole, strlen(whole), 0, &ids, &n, &err), 0);
    cr_assert_eq((int)n, j->n_prompt);
    cr_expect_arr_eq(ids, j->prompt, n * sizeof *ids);
    free(ids);
    free(whole);
}

/* The prompt splits at the last message boundary (the generation prompt
 * after it), and tokenizes as the whole text does. */
Test(server, prompt_boundary) {
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"Hello there\"}]", 0, NULL);
    srv_job *j = srv_job_create();
    srv_prompt_opts po = {.thinking = 1};
    srv_err e = {0};
    cr_assert_eq(srv_build_chat_prompt(&ctx, msgs, NULL, &po, j, &e), 0, "%s", e.msg);
    cr_expect(j->start_in_reasoning);
    cr_assert(j->boundary > 0 && j->boundary < j->n_prompt);
    expect_whole_tokenization("[{\"role\":\"user\",\"content\":\"Hello there\"}]", j);
    tern_error err;
    char *head;
    size_t hl;
    cr_assert_eq(tern_tokenizer_decode(ctx.tok, j->prompt, (size_t)j->boundary, 0, &head, &hl, &err), 0);
    cr_expect(hl >= 11 && !strcmp(head + hl - 11, "<|im_end|>\n"), "the boundary is after the last message: %s", head);
    free(head);
    srv_job_release(j);
    po.thinking = 0;
    j = srv_job_create();
    cr_assert_eq(srv_build_chat_prompt(&ctx, msgs, NULL, &po, j, &e), 0, "%s", e.msg);
    cr_expect(!j->start_in_reasoning);
    srv_job_release(j);
    ctx.n_ctx = 5;
    j = srv_job_create();
    cr_expect_neq(srv_build_chat_prompt(&ctx, msgs, NULL, &po, j, &e), 0);
    cr_expect(strstr(e.msg, "context holds 5"), "%s", e.msg);
    ctx.n_ctx = 4096;
    srv_job_release(j);
    json_decref(msgs);
}

/* With a system prompt the prompt also splits where the first message
 * ends (a checkpoint other conversations share), still tokenizing as the
 * whole text does. */
Test(server, prompt_first_message_boundary) {
    const char *mj = "[{\"role\":\"system\",\"content\":\"You tell fortunes.\"},"
                     "{\"role\":\"user\",\"content\":\"Hello there\"}]";
    json_t *msgs = json_loads(mj, 0, NULL);
    srv_job *j = srv_job_create();
    srv_prompt_opts po = {.thinking = 1};
    srv_err e = {0};
    cr_assert_eq(srv_build_chat_prompt(&ctx, msgs, NULL, &po, j, &e), 0, "%s", e.msg);
    cr_assert(j->first_boundary > 0 && j->first_boundary < j->boundary && j->boundary < j->n_prompt);
    expect_whole_tokenization(mj, j);
    tern_error err;
    char *head;
    size_t hl;
    cr_assert_eq(tern_tokenizer_decode(ctx.tok, j->prompt, (size_t)j->first_boundary, 0, &head, &hl, &err), 0);
    cr_expect(hl >= 11 && !strcmp(head + hl - 11, "<|im_end|>\n") && strstr(head, "fortunes") && !strstr(head, "Hello"),
              "the first boundary is after the system message: %s", head);
    free(head);
    srv_job_release(j);
    json_decref(msgs);
}

/* A generation that fails mid-stream ends the stream in each API's way:
 * an error chunk then [DONE] (chat), response.failed (responses), an
 * error event (messages). */
Test(server, streams_end_on_an_error) {
    static const char *last_event[] = {NULL, "response.failed", "error"};
    for (int api = CHAT; api <= MESSAGES; api++) {
        srv_job *j = srv_job_create();
        srv_enc *enc = prepare(api, NULL, 1, j);
        sbuf out = {0};
        enc->start(enc, &out);
        srv_event text = {.kind = SRV_EV_CONTENT, .text = "partial", .len = 7};
        srv_event fail = {.kind = SRV_EV_ERROR, .text = "the GPU went away", .len = 17};
        enc->event(enc, &text, &out);
        enc->event(enc, &fail, &out);
        static frame f[64];
        int n = split_frames(out.data, f, 64);
        if (api == CHAT) {
            cr_assert(f[n - 1].data == NULL, "chat: [DONE] last");
            json_t *err = json_object_get(f[n - 2].data, "error");
            cr_expect(strstr(str(err, "message"), "the GPU went away"), "chat: the error chunk names the failure");
        } else {
            cr_expect_str_eq(f[n - 1].event, last_event[api], "%s: the last event", API_NAME[api]);
            json_t *body = f[n - 1].data;
            const char *msg = api == RESPONSES ? str(json_object_get(json_object_get(body, "response"), "error"), "message")
                                               : str(json_object_get(body, "error"), "message");
            cr_expect(strstr(msg, "the GPU went away"), "%s: the error names the failure", API_NAME[api]);
        }
        for (int i = 0; i < n; i++) json_decref(f[i].data);
        sbuf_free(&out);
        enc->destroy(enc);
        srv_job_release(j);
    }
}
