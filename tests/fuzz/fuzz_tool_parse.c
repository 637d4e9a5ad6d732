/* The output parser (tool calls and reasoning, tern.h "output parsing")
 * on arbitrary generated text, fed whole and then in pieces cut by the
 * input's own hash: the events must be the same. Every TOOL_CALL must
 * carry a non-empty name and arguments that are a JSON object; answer and
 * reasoning pieces of valid UTF-8 input must be valid UTF-8. First byte:
 *   bit 0  start in the reasoning      bit 1  parse tool calls
 *   bit 2  with the tools of tests/fixtures/tool_parse (typed values)
 *   bit 3  the tools are the input's own: "TOOLS_JSON\0TEXT" */
#include <jansson.h>

#include "events.h"
#include "tern.h"
#include "text/utf8.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"type\": \"string\"}, \"days\": {\"type\": "
    "\"integer\"}, \"temp\": {\"type\": \"number\"}, \"exact\": {\"type\": \"boolean\"}, \"note\": {\"type\": "
    "[\"string\", \"null\"]}, \"opts\": {\"type\": \"object\"}, \"ids\": {\"type\": \"array\"}, \"any\": {\"anyOf\": "
    "[{\"type\": \"null\"}, {\"type\": \"integer\"}]}}}}}]";

typedef struct sink {
    ev_log log;
    int valid_input;
} sink;

static int on_event(void *user, const tern_out_event *ev, tern_error *err) {
    sink *s = user;
    if (ev->kind == TERN_OUT_CONTENT || ev->kind == TERN_OUT_REASONING) {
        FUZZ_CHECK(!s->valid_input || tern_utf8_valid_prefix(ev->text, ev->len) == ev->len,
                   "a text piece of valid input is not valid UTF-8");
        ev_text(&s->log, ev->kind, ev->text, ev->len);
    } else if (ev->kind == TERN_OUT_TOOL_CALL) {
        FUZZ_CHECK(ev->name && ev->name[0], "a tool call without a name");
        json_t *args = json_loads(ev->arguments, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        FUZZ_CHECK(json_is_object(args), "arguments are not a JSON object: %s", ev->arguments);
        json_decref(args);
        char idx[16];
        snprintf(idx, sizeof idx, "%d", ev->call_index);
        ev_mark(&s->log, idx, ev->name, ev->arguments);
    } else {
        FUZZ_CHECK(ev->kind == TERN_OUT_MALFORMED, "unknown event kind %d", (int)ev->kind);
        ev_mark(&s->log, "malformed", NULL, NULL);
    }
    return 0;
}

static void run(const tern_output_params *p, const char *text, size_t n, fuzz_cuts *cuts, sink *s) {
    tern_error err;
    tern_output_parser *op = tern_output_parser_create(p, on_event, s, &err);
    if (!op) {
        FUZZ_CHECK(p->tools_json && err.msg[0], "create with the fixture's tools: %s", err.msg);
        return;
    }
    for (size_t at = 0; at < n;) {
        size_t k = cuts ? fuzz_cuts_next(cuts, n - at) : n - at;
        FUZZ_CHECK(tern_output_parser_feed(op, text + at, k, &err) == 0, "feed: %s", err.msg);
        at += k;
    }
    FUZZ_CHECK(tern_output_parser_finish(op, &err) == 0, "finish: %s", err.msg);
    tern_output_parser_destroy(op);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    char *own = NULL;
    if (mode & 8) {
        const char *nul = memchr(text, 0, n);
        if (!nul) return 0;
        own = fuzz_strndup((const uint8_t *)text, (size_t)(nul - text));
        n -= (size_t)(nul + 1 - text);
        text = nul + 1;
    }
    tern_output_params p = {mode & 1, mode >> 1 & 1, own ? own : mode & 4 ? TOOLS : NULL};
    int valid = tern_utf8_valid_prefix(text, n) == n;
    sink whole = {{.last = -1}, valid}, cut = {{.last = -1}, valid};
    fuzz_cuts cuts = fuzz_cuts_seed(data, size);
    run(&p, text, n, NULL, &whole);
    run(&p, text, n, &cuts, &cut);
    ev_same(&whole.log, &cut.log);
    free(whole.log.s);
    free(cut.log.s);
    free(own);
    return 0;
}
