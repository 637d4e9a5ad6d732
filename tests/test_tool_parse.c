/* Streaming output parser: reasoning, answer and Qwen XML tool calls.
 * Every stream is fed whole, cut in two at every byte offset, and byte by
 * byte; all must give the same events (consecutive text pieces of one
 * kind are joined before comparing, since only the cut points differ). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "text/chat_template.h"
#include "text/reasoning_parse.h"
#include "text/tool_parse.h"

/* ---- event log ------------------------------------------------------------- */

/* Events as text: R[...] reasoning, C[...] content, T[name|args] call,
 * M[reason] malformed. */
typedef struct event_log {
    chat_buf text;
    int last_kind;  /* kind of the open text event, or -1 */
} event_log;

static int on_event(void *user, const tern_out_event *ev, tern_error *err) {
    event_log *log = user;
    static const char tags[] = "CRTM";
    int is_text = ev->kind == TERN_OUT_CONTENT || ev->kind == TERN_OUT_REASONING;
    cr_assert(!is_text || ev->len > 0, "empty text event");
    if (is_text && log->last_kind == (int)ev->kind) {
        log->text.len--;  /* reopen the previous piece: drop its ']' */
    } else {
        char open[3] = {tags[ev->kind], '[', 0};
        if (chat_buf_puts(&log->text, open, err)) return -1;
    }
    if (ev->kind == TERN_OUT_TOOL_CALL) {
        if (chat_buf_puts(&log->text, ev->name, err) || chat_buf_puts(&log->text, "|", err) ||
            chat_buf_puts(&log->text, ev->arguments, err))
            return -1;
    } else if (chat_buf_append(&log->text, ev->text, ev->len, err)) {
        return -1;
    }
    log->last_kind = is_text ? (int)ev->kind : -1;
    return chat_buf_puts(&log->text, "]", err);
}

typedef struct stream_case {
    const char *name;
    int start_in_reasoning;
    int parse_tool_calls;
    const char *tools_json;  /* NULL: no tools */
    const char *text;
    const char *want;
} stream_case;

/* Feeds text cut at the offsets in cuts (sorted, n_cuts of them). */
static char *run_cuts(const stream_case *c, const size_t *cuts, size_t n_cuts) {
    event_log log = {.last_kind = -1};
    tern_output_params params = {c->start_in_reasoning, c->parse_tool_calls, c->tools_json};
    tern_error err = {{0}};
    tern_output_parser *p = tern_output_parser_create(&params, on_event, &log, &err);
    cr_assert(p, "%s", err.msg);
    size_t n = strlen(c->text), at = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        cr_assert_eq(tern_output_parser_feed(p, c->text + at, end - at, &err), 0, "%s", err.msg);
        at = end;
    }
    cr_assert_eq(tern_output_parser_finish(p, &err), 0, "%s", err.msg);
    tern_output_parser_destroy(p);
    return chat_buf_take(&log.text, &err);
}

static void check_stream(const stream_case *c) {
    char *whole = run_cuts(c, NULL, 0);
    cr_expect_str_eq(whole, c->want, "%s: whole stream", c->name);
    size_t n = strlen(c->text);
    for (size_t k = 0; k <= n; k++) {
        char *got = run_cuts(c, &k, 1);
        cr_expect_str_eq(got, c->want, "%s: cut at %zu", c->name, k);
        free(got);
    }
    size_t *bytes = malloc((n + 1) * sizeof *bytes);
    for (size_t k = 0; k < n; k++) bytes[k] = k + 1;
    char *got = run_cuts(c, bytes, n ? n - 1 : 0);
    cr_expect_str_eq(got, c->want, "%s: byte by byte", c->name);
    free(got);
    free(bytes);
    free(whole);
}

/* ---- streams ------------------------------------------------------------------ */

#define TOOLS                                                                              \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"     \
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"                 \
    "\"zip\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"                      \
    "\"temp\":{\"type\":\"number\"},\"exact\":{\"type\":\"boolean\"},"                    \
    "\"note\":{\"type\":[\"string\",\"null\"]},\"opts\":{\"type\":\"object\"},"           \
    "\"ids\":{\"type\":\"array\"}}}}}]"

/* The streams and the events each must give: tests/fixtures/tool_parse/
 * streams.json (the server's encoder tests read the same file). */
Test(tool_parse, every_split_gives_the_same_events) {
    json_error_t je;
    json_t *cases = json_load_file("tests/fixtures/tool_parse/streams.json", 0, &je);
    cr_assert(json_is_array(cases), "streams.json: %s", je.text);
    cr_assert_gt(json_array_size(cases), 20);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *tools = json_object_get(c, "tools");
        char *tools_json = json_is_array(tools) ? json_dumps(tools, 0) : NULL;
        stream_case sc = {json_string_value(json_object_get(c, "name")),
                          json_is_true(json_object_get(c, "start_in_reasoning")),
                          json_is_true(json_object_get(c, "parse_tool_calls")), tools_json,
                          json_string_value(json_object_get(c, "text")),
                          json_string_value(json_object_get(c, "want"))};
        cr_assert(sc.name && sc.text && sc.want, "streams.json[%zu]: name, text and want are strings", i);
        check_stream(&sc);
        free(tools_json);
    }
    json_decref(cases);
}

/* ---- pieces ------------------------------------------------------------------- */

static int utf8_complete(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (i + need > n) return 0;
        i += need;
    }
    return 1;
}

static int check_utf8(void *user, const tern_out_event *ev, tern_error *err) {
    int *bad = user;
    if (ev->kind == TERN_OUT_CONTENT || ev->kind == TERN_OUT_REASONING)
        *bad += !utf8_complete(ev->text, ev->len);
    return 0;
}

Test(tool_parse, pieces_hold_whole_utf8_characters) {
    const char *text = "ü東👋\n</think>\n\nZürich 👋";
    tern_output_params params = {1, 1, NULL};
    tern_error err;
    int bad = 0;
    tern_output_parser *p = tern_output_parser_create(&params, check_utf8, &bad, &err);
    cr_assert(p);
    for (size_t i = 0; text[i]; i++) tern_output_parser_feed(p, text + i, 1, &err);
    tern_output_parser_finish(p, &err);
    tern_output_parser_destroy(p);
    cr_expect_eq(bad, 0, "%d pieces cut a character", bad);
}

static int count_calls(void *user, const tern_out_event *ev, tern_error *err) {
    json_t **args = user;
    if (ev->kind == TERN_OUT_TOOL_CALL) *args = json_loads(ev->arguments, 0, NULL);
    return 0;
}

/* What the template writes for a call, the parser reads back. */
Test(tool_parse, round_trip_through_the_template) {
    const char *conv =
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{"
        "\"city\":\"multi\\nline <b>\",\"zip\":\"123\",\"days\":10,\"temp\":0.1,"
        "\"exact\":true,\"note\":null,\"opts\":{\"k\":[1,2.5,\"x\"]},\"ids\":[],"
        "\"free\":{\"nested\":{}}}}}]}]";
    json_t *msgs = json_loads(conv, 0, NULL), *tools = json_loads(TOOLS, 0, NULL);
    cr_assert(msgs && tools);
    tern_error err;
    char *prompt = tern_chat_template_render(msgs, tools, NULL, &err);
    cr_assert(prompt, "%s", err.msg);
    char *call = strstr(prompt, "<tool_call>\n<function=get_weather>");
    cr_assert(call);
    *strstr(call, "<|im_end|>") = '\0';

    json_t *got = NULL;
    tern_output_params params = {0, 1, TOOLS};
    tern_output_parser *p = tern_output_parser_create(&params, count_calls, &got, &err);
    cr_assert(p);
    cr_assert_eq(tern_output_parser_feed(p, call, strlen(call), &err), 0);
    cr_assert_eq(tern_output_parser_finish(p, &err), 0);
    cr_expect_eq(tern_output_parser_n_tool_calls(p), 1);
    json_t *want = json_object_get(
        json_object_get(json_array_get(json_object_get(json_array_get(msgs, 1), "tool_calls"), 0),
                        "function"),
        "arguments");
    cr_assert(got);
    char *gs = json_dumps(got, JSON_SORT_KEYS), *ws = json_dumps(want, JSON_SORT_KEYS);
    cr_expect(json_equal(got, want), "got %s\nwant %s", gs, ws);
    free(gs);
    free(ws);
    json_decref(got);
    tern_output_parser_destroy(p);
    free(prompt);
    json_decref(msgs);
    json_decref(tools);
}

Test(tool_parse, param_value_rules) {
    json_t *s_int = json_pack("{s:s}", "type", "integer");
    json_t *s_any = json_pack("{s:[{s:s},{s:s}]}", "anyOf", "type", "null", "type", "number");
    json_t *v;

    v = tern_tool_param_value("1_000", 5, s_int);
    cr_expect(json_is_integer(v) && json_integer_value(v) == 1000);
    json_decref(v);
    v = tern_tool_param_value("12abc", 5, s_int);
    cr_expect(json_is_string(v));
    json_decref(v);
    v = tern_tool_param_value("NULL", 4, s_any);
    cr_expect(json_is_null(v));
    json_decref(v);
    v = tern_tool_param_value("nan", 3, s_any);
    cr_expect(json_is_string(v));
    json_decref(v);
    v = tern_tool_param_value("99999999999999999999", 20, NULL);
    cr_expect(json_is_string(v), "integers beyond int64 stay text");
    json_decref(v);
    v = tern_tool_param_value("a\0b", 3, NULL);
    cr_expect(json_is_string(v) && json_string_length(v) == 3);
    json_decref(v);
    json_decref(s_int);
    json_decref(s_any);
}

/* ---- the reasoning splitter alone ------------------------------------------- */

static int collect_split(void *user, int is_reasoning, const char *text, size_t len,
                         tern_error *err) {
    chat_buf *b = user;
    return chat_buf_puts(b, is_reasoning ? "R:" : "C:", err) ||
           chat_buf_append(b, text, len, err) || chat_buf_puts(b, ";", err);
}

Test(tool_parse, reasoning_splitter_state) {
    chat_buf b = {0};
    tern_error err;
    tern_reasoning_splitter *s = tern_reasoning_splitter_create(1, collect_split, &b, &err);
    cr_assert(s);
    cr_expect(tern_reasoning_splitter_in_reasoning(s));
    cr_assert_eq(tern_reasoning_splitter_feed(s, "ab\n</th", 7, &err), 0);
    cr_expect_str_eq(b.data, "R:ab;");
    cr_assert_eq(tern_reasoning_splitter_feed(s, "ink>\n\nok", 8, &err), 0);
    cr_expect(!tern_reasoning_splitter_in_reasoning(s));
    cr_assert_eq(tern_reasoning_splitter_finish(s, &err), 0);
    cr_expect_str_eq(b.data, "R:ab;C:ok;");
    tern_reasoning_splitter_destroy(s);
    chat_buf_free(&b);
}

/* ---- random streams ---------------------------------------------------------- */

/* Streams glued from tag fragments and text: whatever they mean, cutting
 * them differently must not change the events (and must not crash). */
Test(tool_parse, random_streams_are_cut_invariant) {
    static const char *frags[] = {
        "<tool_call>", "</tool_call>", "<function=f>", "<function=", "</function>",
        "<parameter=a>", "<parameter=", "</parameter>", "<think>", "</think>", "\n", "\n\n",
        " ", "x", "42", "{\"k\": 1}", "<", ">", "=", "ü", "东", "</", "<tool", "b c",
    };
    size_t nf = sizeof frags / sizeof frags[0];
    uint64_t state = 12345;
    for (int round = 0; round < 300; round++) {
        char text[512] = "";
        int pieces = 1 + (int)((state >> 33) % 40);
        for (int i = 0; i < pieces; i++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frags[(state >> 33) % nf];
            if (strlen(text) + strlen(f) < sizeof text) strcat(text, f);
        }
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        stream_case c = {"random", (int)(state >> 63), 1, NULL, text, NULL};
        char *want = run_cuts(&c, NULL, 0);
        size_t n = strlen(text), cuts[8], nc = 0;
        for (size_t k = 0; k < 8 && n > 0; k++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)((state >> 33) % n);
            if (nc == 0 || at > cuts[nc - 1]) cuts[nc++] = at;
        }
        char *got = run_cuts(&c, cuts, nc);
        cr_expect_str_eq(got, want, "random cuts of \"%s\"", text);
        free(got);
        size_t *bytes = malloc((n + 1) * sizeof *bytes);
        for (size_t k = 0; k < n; k++) bytes[k] = k + 1;
        got = run_cuts(&c, bytes, n ? n - 1 : 0);
        cr_expect_str_eq(got, want, "bytes of \"%s\"", text);
        free(got);
        free(bytes);
        free(want);
    }
}
