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
static char *run_cuts(const stream_case *c, json_t *tools, const size_t *cuts, size_t n_cuts) {
    event_log log = {.last_kind = -1};
    tern_output_params params = {c->start_in_reasoning, c->parse_tool_calls, tools};
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
    json_t *tools = c->tools_json ? json_loads(c->tools_json, 0, NULL) : NULL;
    cr_assert(!c->tools_json || tools, "%s: bad tools JSON", c->name);
    char *whole = run_cuts(c, tools, NULL, 0);
    cr_expect_str_eq(whole, c->want, "%s: whole stream", c->name);
    size_t n = strlen(c->text);
    for (size_t k = 0; k <= n; k++) {
        char *got = run_cuts(c, tools, &k, 1);
        cr_expect_str_eq(got, c->want, "%s: cut at %zu", c->name, k);
        free(got);
    }
    size_t *bytes = malloc((n + 1) * sizeof *bytes);
    for (size_t k = 0; k < n; k++) bytes[k] = k + 1;
    char *got = run_cuts(c, tools, bytes, n ? n - 1 : 0);
    cr_expect_str_eq(got, c->want, "%s: byte by byte", c->name);
    free(got);
    free(bytes);
    free(whole);
    json_decref(tools);
}

/* ---- streams ------------------------------------------------------------------ */

#define TOOLS                                                                              \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"     \
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"                 \
    "\"zip\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"                      \
    "\"temp\":{\"type\":\"number\"},\"exact\":{\"type\":\"boolean\"},"                    \
    "\"note\":{\"type\":[\"string\",\"null\"]},\"opts\":{\"type\":\"object\"},"           \
    "\"ids\":{\"type\":\"array\"}}}}}]"

#define CALL(name, params) "<tool_call>\n<function=" name ">\n" params "</function>\n</tool_call>"
#define PARAM(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"

static const stream_case streams[] = {
    {"reasoning_then_answer", 1, 1, NULL,
     "Let me think.\nTwo lines.\n</think>\n\nThe answer is 4.",
     "R[Let me think.\nTwo lines.]C[The answer is 4.]"},
    {"answer_only", 0, 1, NULL, "Hello there, a < b and <b>bold</b>.",
     "C[Hello there, a < b and <b>bold</b>.]"},
    {"thinking_off_but_think_block", 0, 1, NULL, "<think>\nhmm\n</think>\n\nHi",
     "R[hmm]C[Hi]"},
    {"think_tag_not_at_start_is_text", 0, 1, NULL, "x<think>y</think>z",
     "C[x<think>y</think>z]"},
    {"unterminated_reasoning", 1, 1, NULL, "still thinking about </thi",
     "R[still thinking about </thi]"},
    {"empty_reasoning", 1, 1, NULL, "</think>\n\nDirect.", "C[Direct.]"},
    {"reasoning_keeps_tool_markup", 1, 1, NULL,
     "maybe <tool_call>\n<function=f>\n</function>\n</tool_call>?\n</think>\n\nNo.",
     "R[maybe <tool_call>\n<function=f>\n</function>\n</tool_call>?]C[No.]"},
    {"trailing_whitespace_kept", 0, 1, NULL, "Hi \n", "C[Hi \n]"},
    {"partial_tag_at_end", 0, 1, NULL, "text <tool_ca", "C[text <tool_ca]"},
    {"utf8", 1, 1, NULL, "Grüße 東京 👋\n</think>\n\nZürich",
     "R[Grüße 東京 👋]C[Zürich]"},
    {"call_after_reasoning", 1, 1, TOOLS,
     "Need the weather.\n</think>\n\n" CALL("get_weather", PARAM("city", "Paris") PARAM("days", "3")),
     "R[Need the weather.]T[get_weather|{\"city\": \"Paris\", \"days\": 3}]"},
    {"content_then_two_calls", 0, 1, TOOLS,
     "Let me check.\n\n" CALL("get_weather", PARAM("city", "Paris")) "\n"
     CALL("get_weather", PARAM("city", "Rome")) "\n\nBoth fetched.",
     "C[Let me check.]T[get_weather|{\"city\": \"Paris\"}]T[get_weather|{\"city\": \"Rome\"}]"
     "C[Both fetched.]"},
    {"schema_types", 0, 1, TOOLS,
     CALL("get_weather", PARAM("zip", "01234") PARAM("days", " 042 ") PARAM("temp", "2.50")
          PARAM("exact", "True") PARAM("note", "None") PARAM("opts", "{\"a\": [1, 2]}")
          PARAM("ids", "[1, 2") PARAM("city", "null") PARAM("unknown", "7.5")),
     "T[get_weather|{\"zip\": \"01234\", \"days\": 42, \"temp\": 2.5, \"exact\": true, "
     "\"note\": null, \"opts\": {\"a\": [1, 2]}, \"ids\": \"[1, 2\", \"city\": \"null\", "
     "\"unknown\": 7.5}]"},
    {"number_schema_integral", 0, 1, TOOLS, CALL("get_weather", PARAM("temp", "3.0")),
     "T[get_weather|{\"temp\": 3}]"},
    {"untyped_values", 0, 1, NULL,
     CALL("f", PARAM("s", "plain text") PARAM("n", "-12") PARAM("x", "1.5e-07")
          PARAM("b", "false") PARAM("z", "null") PARAM("o", "{\"k\": \"v\"}")
          PARAM("a", "[1, \"two\"]") PARAM("q", "\"quoted\"") PARAM("m", "line 1\nline 2")
          PARAM("e", "") PARAM("w", "  padded  ")),
     "T[f|{\"s\": \"plain text\", \"n\": -12, \"x\": 1.5e-07, \"b\": false, \"z\": null, "
     "\"o\": {\"k\": \"v\"}, \"a\": [1, \"two\"], \"q\": \"\\\"quoted\\\"\", "
     "\"m\": \"line 1\\nline 2\", \"e\": \"\", \"w\": \"  padded  \"}]"},
    {"literal_close_tags_in_value", 0, 1, NULL,
     CALL("write", PARAM("code", "s = '</parameter>'\nt = '</function></tool_call>'\n")),
     "T[write|{\"code\": \"s = '</parameter>'\\nt = '</function></tool_call>'\\n\"}]"},
    {"no_arguments", 0, 1, NULL, CALL("ping", ""), "T[ping|{}]"},
    {"missing_tool_call_close", 0, 1, NULL,
     "<tool_call>\n<function=f>\n" PARAM("a", "1") "</function>\nDone.",
     "T[f|{\"a\": 1}]C[Done.]"},
    {"missing_function_close", 0, 1, NULL,
     "<tool_call>\n<function=f>\n" PARAM("a", "x") "</tool_call>", "T[f|{\"a\": \"x\"}]"},
    {"bare_function_at_line_start", 0, 1, NULL,
     "Sure.\n<function=f>\n" PARAM("a", "x") "</function>",
     "C[Sure.]T[f|{\"a\": \"x\"}]"},
    {"bare_function_mid_line_is_text", 0, 1, NULL, "see <function=f> here",
     "C[see <function=f> here]"},
    {"malformed_not_a_function", 0, 1, NULL,
     "Hi <tool_call>\nI am not a call\n</tool_call> ok",
     "C[Hi]M[expected <function=NAME>]C[ <tool_call>\nI am not a call\n</tool_call> ok]"},
    {"malformed_bad_name", 0, 1, NULL, "<tool_call>\n<function=my func>\n</function>\n</tool_call>",
     "M[invalid function name]C[<tool_call>\n<function=my func>\n</function>\n</tool_call>]"},
    {"malformed_junk_in_body", 0, 1, NULL,
     "<tool_call>\n<function=f>\noops\n</function>\n</tool_call>",
     "M[unexpected text inside <function>]C[<tool_call>\n<function=f>\noops\n</function>\n"
     "</tool_call>]"},
    {"malformed_then_good_call", 0, 1, NULL,
     "<tool_call>oops " CALL("g", PARAM("k", "v")),
     "M[expected <function=NAME>]C[<tool_call>oops]T[g|{\"k\": \"v\"}]"},
    {"unterminated_call", 0, 1, NULL, "<tool_call>\n<function=f>\n<parameter=a>\n1",
     "M[unterminated parameter value]C[<tool_call>\n<function=f>\n<parameter=a>\n1]"},
    {"unterminated_after_function", 0, 1, NULL, "x\n<tool_call>\n<function=f>\n",
     "C[x]M[unterminated tool call]C[\n<tool_call>\n<function=f>\n]"},
    {"tool_parsing_off", 0, 0, NULL, CALL("f", PARAM("a", "1")),
     "C[" CALL("f", PARAM("a", "1")) "]"},
    {"utf8_in_call", 0, 1, TOOLS, CALL("get_weather", PARAM("city", "Zürich 東京")),
     "T[get_weather|{\"city\": \"Zürich 東京\"}]"},
};

Test(tool_parse, every_split_gives_the_same_events) {
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) check_stream(&streams[i]);
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
    if (ev->kind == TERN_OUT_TOOL_CALL) *args = json_incref(ev->arguments_json);
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
    tern_output_params params = {0, 1, tools};
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
        char *want = run_cuts(&c, NULL, NULL, 0);
        size_t n = strlen(text), cuts[8], nc = 0;
        for (size_t k = 0; k < 8 && n > 0; k++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)((state >> 33) % n);
            if (nc == 0 || at > cuts[nc - 1]) cuts[nc++] = at;
        }
        char *got = run_cuts(&c, NULL, cuts, nc);
        cr_expect_str_eq(got, want, "random cuts of \"%s\"", text);
        free(got);
        size_t *bytes = malloc((n + 1) * sizeof *bytes);
        for (size_t k = 0; k < n; k++) bytes[k] = k + 1;
        got = run_cuts(&c, NULL, bytes, n ? n - 1 : 0);
        cr_expect_str_eq(got, want, "bytes of \"%s\"", text);
        free(got);
        free(bytes);
        free(want);
    }
}
