/* The Qwen3.6 chat template in C; see chat_template.h. Sections follow the
 * template top to bottom: render_content (the macro), the system/tools
 * header, the backwards scan for the last real user query, the message
 * loop (user, assistant with reasoning and tool calls, tool results) and
 * the generation prompt. Strings are handled as (pointer, length) views so
 * that embedded NULs in JSON strings survive, as they do in Python. */
#include "text/chat_template.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "util/err.h"

/* ---- string views with Python's str semantics ---------------------------- */

typedef struct sview {
    const char *p;
    size_t n;
} sview;

static sview sv(const char *p, size_t n) { return (sview){p, n}; }
static sview sv_json(json_t *s) { return sv(json_string_value(s), json_string_length(s)); }

/* Decodes one UTF-8 sequence (input is valid UTF-8: jansson checks it). */
static uint32_t utf8_decode(const unsigned char *s, size_t *len) {
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if (s[0] < 0xE0) { *len = 2; return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu); }
    if (s[0] < 0xF0) {
        *len = 3;
        return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    }
    *len = 4;
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) |
           (s[3] & 0x3Fu);
}

/* Python's str.isspace(): the template's `|trim` is str.strip(), which also
 * strips e.g. NBSP and the ideographic space, not only ASCII blanks. */
static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 ||
           c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static sview sv_strip(sview s) {
    const unsigned char *p = (const unsigned char *)s.p;
    size_t a = 0, b = s.n, len;
    while (a < b && py_isspace(utf8_decode(p + a, &len))) a += len;
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (p[k] & 0xC0) == 0x80) k--;  /* back to the lead byte */
        if (!py_isspace(utf8_decode(p + k, &len))) break;
        b = k;
    }
    return sv(s.p + a, b - a);
}

static sview sv_lstrip_nl(sview s) {
    while (s.n && s.p[0] == '\n') { s.p++; s.n--; }
    return s;
}

static sview sv_rstrip_nl(sview s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* Offset of the first (last) occurrence of needle, or -1. */
static long sv_find(sview s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++)
        if (memcmp(s.p + i, needle, m) == 0) return (long)i;
    return -1;
}

static long sv_rfind(sview s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + m <= s.n && memcmp(s.p + i, needle, m) == 0) return (long)i;
    return -1;
}

static int sv_starts(sview s, const char *x) {
    size_t m = strlen(x);
    return s.n >= m && memcmp(s.p, x, m) == 0;
}

static int sv_ends(sview s, const char *x) {
    size_t m = strlen(x);
    return s.n >= m && memcmp(s.p + s.n - m, x, m) == 0;
}

static int put(chat_buf *b, sview s, tern_error *err) { return chat_buf_append(b, s.p, s.n, err); }

/* ---- JSON values as the template sees them ------------------------------- */

/* Jinja truthiness of a value (Python bool()). */
static int json_truthy(json_t *x) {
    switch (json_typeof(x)) {
    case JSON_OBJECT: return json_object_size(x) > 0;
    case JSON_ARRAY: return json_array_size(x) > 0;
    case JSON_STRING: return json_string_length(x) > 0;
    case JSON_INTEGER: return json_integer_value(x) != 0;
    case JSON_REAL: return json_real_value(x) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static int role_is(json_t *msg, const char *role) {
    json_t *r = json_is_object(msg) ? json_object_get(msg, "role") : NULL;
    return json_is_string(r) && strcmp(json_string_value(r), role) == 0;
}

/* `{{ x }}` of a scalar: Python's str(), e.g. True, None, 2.0. */
static int put_py_str(chat_buf *b, json_t *x, const char *where, tern_error *err) {
    switch (json_typeof(x)) {
    case JSON_STRING: return put(b, sv_json(x), err);
    case JSON_INTEGER:
    case JSON_REAL: return chat_json_put_number(b, x, err);
    case JSON_TRUE: return chat_buf_puts(b, "True", err);
    case JSON_FALSE: return chat_buf_puts(b, "False", err);
    case JSON_NULL: return chat_buf_puts(b, "None", err);
    default: return tern_fail(err, "%s: text must be a string", where);
    }
}

/* ---- render_content (the template's macro) ------------------------------- */

typedef struct render {
    json_t *messages;
    const tern_chat_options *opt;
    int image_count, video_count;  /* the template's namespace counters */
    tern_error *err;
} render;

static int key_in(json_t *obj, const char *key) { return json_object_get(obj, key) != NULL; }

static int type_is(json_t *item, const char *type) {
    json_t *t = json_object_get(item, "type");
    return json_is_string(t) && strcmp(json_string_value(t), type) == 0;
}

/* One vision placeholder; `kind` is "Picture"/"Video" for add_vision_id. */
static int render_vision(render *r, chat_buf *out, int *counter, int count,
                         const char *kind, const char *pad) {
    if (count) (*counter)++;
    if (r->opt->add_vision_id) {
        char label[48];
        snprintf(label, sizeof label, "%s %d: ", kind, *counter);
        if (chat_buf_puts(out, label, r->err)) return -1;
    }
    if (chat_buf_puts(out, "<|vision_start|>", r->err)) return -1;
    if (chat_buf_puts(out, pad, r->err)) return -1;
    return chat_buf_puts(out, "<|vision_end|>", r->err);
}

static int render_part(render *r, json_t *item, int count, int is_system, chat_buf *out,
                       const char *where) {
    if (!json_is_object(item))
        return tern_fail(r->err, "%s: Unexpected item type in content.", where);
    if (key_in(item, "image") || key_in(item, "image_url") || type_is(item, "image")) {
        if (is_system)
            return tern_fail(r->err, "%s: System message cannot contain images.", where);
        return render_vision(r, out, &r->image_count, count, "Picture", "<|image_pad|>");
    }
    if (key_in(item, "video") || type_is(item, "video")) {
        if (is_system)
            return tern_fail(r->err, "%s: System message cannot contain videos.", where);
        return render_vision(r, out, &r->video_count, count, "Video", "<|video_pad|>");
    }
    if (key_in(item, "text")) return put_py_str(out, json_object_get(item, "text"), where, r->err);
    return tern_fail(r->err, "%s: Unexpected item type in content.", where);
}

/* Appends the content (string, parts, or nothing) to out. `count` says
 * whether images/videos advance the counters (only the main loop counts). */
static int render_content(render *r, json_t *content, int count, int is_system, chat_buf *out,
                          const char *where) {
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) return put(out, sv_json(content), r->err);
    if (!json_is_array(content))
        return tern_fail(r->err, "%s: Unexpected content type.", where);
    size_t i;
    json_t *item;
    json_array_foreach(content, i, item) {
        if (render_part(r, item, count, is_system, out, where)) return -1;
    }
    return 0;
}

/* render_content(...)|trim into tmp; returns the stripped view. */
static int content_of(render *r, json_t *msg, size_t index, int count, int is_system,
                      chat_buf *tmp, sview *view) {
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", index);
    tmp->len = 0;
    if (chat_buf_append(tmp, "", 0, r->err)) return -1;
    json_t *c = json_is_object(msg) ? json_object_get(msg, "content") : NULL;
    if (render_content(r, c, count, is_system, tmp, where)) return -1;
    *view = sv_strip(sv(tmp->data, tmp->len));
    return 0;
}

/* ---- system turn with the tool list --------------------------------------- */

static const char TOOL_INSTRUCTIONS[] =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your "
    "current knowledge and do not tell the user about function calls\n</IMPORTANT>";

static int render_tool_list(render *r, json_t *tools, chat_buf *out) {
    if (chat_buf_puts(out, "<|im_start|>system\n# Tools\n\nYou have access to the "
                           "following functions:\n\n<tools>", r->err))
        return -1;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (chat_buf_puts(out, "\n", r->err) || chat_json_dump_py(out, t, r->err)) return -1;
    }
    if (chat_buf_puts(out, "\n</tools>", r->err)) return -1;
    return chat_buf_puts(out, TOOL_INSTRUCTIONS, r->err);
}

static int render_header(render *r, json_t *tools, chat_buf *out, chat_buf *tmp) {
    json_t *first = json_array_get(r->messages, 0);
    int has_system = role_is(first, "system");
    sview sys = sv("", 0);
    /* The template iterates any non-mapping iterable; a string of tools
     * can only be a caller's mistake. Mappings and scalars it ignores. */
    if (json_is_string(tools) && json_string_length(tools) > 0)
        return tern_fail(r->err, "tools: must be a list of tool definitions");
    int has_tools = json_is_array(tools) && json_array_size(tools) > 0;
    if (has_tools && render_tool_list(r, tools, out)) return -1;
    if (has_system && content_of(r, first, 0, 0, 1, tmp, &sys)) return -1;
    if (has_tools) {
        if (sys.n && (chat_buf_puts(out, "\n\n", r->err) || put(out, sys, r->err))) return -1;
        return chat_buf_puts(out, "<|im_end|>\n", r->err);
    }
    if (!has_system) return 0;
    if (chat_buf_puts(out, "<|im_start|>system\n", r->err) || put(out, sys, r->err)) return -1;
    return chat_buf_puts(out, "<|im_end|>\n", r->err);
}

/* ---- last real user query -------------------------------------------------- */

/* A user turn that is only a wrapped tool response does not count as a
 * query; reasoning is kept for the assistant turns after the last query. */
static int find_last_query(render *r, chat_buf *tmp, size_t *last) {
    for (size_t i = json_array_size(r->messages); i-- > 0;) {
        json_t *m = json_array_get(r->messages, i);
        if (!role_is(m, "user")) continue;
        sview c;
        if (content_of(r, m, i, 0, 0, tmp, &c)) return -1;
        if (!(sv_starts(c, "<tool_response>") && sv_ends(c, "</tool_response>"))) {
            *last = i;
            return 0;
        }
    }
    return tern_fail(r->err, "messages: No user query found in messages.");
}

/* ---- assistant turn ---------------------------------------------------------- */

/* arguments as the template iterates them: an object, or a JSON string that
 * holds one (vLLM parses OpenAI's string form before rendering). *owned is
 * set when the returned object must be released. */
static int call_arguments(render *r, json_t *call, const char *where, json_t **args,
                          json_t **owned) {
    json_t *a = json_object_get(call, "arguments");
    *args = NULL;
    *owned = NULL;
    if (!a || json_is_null(a) || (json_is_string(a) && json_string_length(a) == 0)) return 0;
    if (json_is_string(a)) {
        json_error_t je;
        a = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, &je);
        if (!a) return tern_fail(r->err, "%s.arguments: not valid JSON: %s", where, je.text);
        *owned = a;
    }
    if (!json_is_object(a)) {
        json_decref(*owned);
        *owned = NULL;
        return tern_fail(r->err, "%s.arguments: Can only get item pairs from a mapping.", where);
    }
    *args = a;
    return 0;
}

static int render_parameters(render *r, json_t *args, chat_buf *out) {
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v) {
        if (chat_buf_puts(out, "<parameter=", r->err) || chat_buf_puts(out, key, r->err) ||
            chat_buf_puts(out, ">\n", r->err))
            return -1;
        /* Strings go in raw; everything else as JSON (so 3 and "3" differ). */
        int rc = json_is_string(v) ? put(out, sv_json(v), r->err)
                                   : chat_json_dump_py(out, v, r->err);
        if (rc || chat_buf_puts(out, "\n</parameter>\n", r->err)) return -1;
    }
    return 0;
}

static int render_call(render *r, json_t *call, size_t j, int has_text, const char *where,
                       chat_buf *out) {
    if (json_is_object(call) && json_object_get(call, "function"))
        call = json_object_get(call, "function");
    if (!json_is_object(call)) return tern_fail(r->err, "%s: not a tool call object", where);
    json_t *name = json_object_get(call, "name");
    if (!json_is_string(name))
        return tern_fail(r->err, "%s: tool call has no function name", where);
    const char *open = j > 0 ? "\n<tool_call>\n<function="
                     : has_text ? "\n\n<tool_call>\n<function="
                                : "<tool_call>\n<function=";
    if (chat_buf_puts(out, open, r->err) || put(out, sv_json(name), r->err) ||
        chat_buf_puts(out, ">\n", r->err))
        return -1;
    json_t *args, *owned;
    if (call_arguments(r, call, where, &args, &owned)) return -1;
    int rc = args ? render_parameters(r, args, out) : 0;
    json_decref(owned);
    if (rc) return -1;
    return chat_buf_puts(out, "</function>\n</tool_call>", r->err);
}

static int render_tool_calls(render *r, json_t *msg, size_t index, int has_text, chat_buf *out) {
    json_t *calls = json_object_get(msg, "tool_calls");
    char where[64];
    if (json_is_string(calls) && json_string_length(calls) > 0)
        return tern_fail(r->err, "messages[%zu].tool_calls: must be a list", index);
    if (!json_is_array(calls)) return 0;  /* null, or a mapping the template skips */
    size_t j;
    json_t *call;
    json_array_foreach(calls, j, call) {
        snprintf(where, sizeof where, "messages[%zu].tool_calls[%zu]", index, j);
        if (render_call(r, call, j, has_text, where, out)) return -1;
    }
    return 0;
}

/* Reasoning comes from reasoning_content, or is split out of the content at
 * </think> (text between the last <think> before the first </think>, and
 * the content after the last </think>), exactly as the template does. */
static void split_reasoning(json_t *msg, sview *content, sview *reasoning) {
    json_t *rc = json_object_get(msg, "reasoning_content");
    *reasoning = sv("", 0);
    if (json_is_string(rc)) {
        *reasoning = sv_json(rc);
    } else if (sv_find(*content, "</think>") >= 0) {
        sview head = sv_rstrip_nl(sv(content->p, (size_t)sv_find(*content, "</think>")));
        long open = sv_rfind(head, "<think>");
        if (open >= 0) head = sv(head.p + open + 7, head.n - (size_t)open - 7);
        *reasoning = sv_lstrip_nl(head);
        size_t tail = (size_t)sv_rfind(*content, "</think>") + 8;
        *content = sv_lstrip_nl(sv(content->p + tail, content->n - tail));
    }
    *reasoning = sv_strip(*reasoning);
}

static int render_assistant(render *r, json_t *msg, size_t index, size_t last_query,
                            sview content, chat_buf *out) {
    sview reasoning;
    split_reasoning(msg, &content, &reasoning);
    if (chat_buf_puts(out, "<|im_start|>assistant\n", r->err)) return -1;
    if (r->opt->preserve_thinking || index > last_query) {
        if (chat_buf_puts(out, "<think>\n", r->err) || put(out, reasoning, r->err) ||
            chat_buf_puts(out, "\n</think>\n\n", r->err))
            return -1;
    }
    if (put(out, content, r->err)) return -1;
    if (render_tool_calls(r, msg, index, sv_strip(content).n > 0, out)) return -1;
    return chat_buf_puts(out, "<|im_end|>\n", r->err);
}

/* ---- tool results -------------------------------------------------------------- */

/* Consecutive tool messages share one user turn. */
static int render_tool_result(render *r, size_t index, sview content, chat_buf *out) {
    size_t n = json_array_size(r->messages);
    json_t *prev = index > 0 ? json_array_get(r->messages, index - 1) : NULL;
    json_t *next = index + 1 < n ? json_array_get(r->messages, index + 1) : NULL;
    if (prev && json_truthy(prev) && !role_is(prev, "tool") &&
        chat_buf_puts(out, "<|im_start|>user", r->err))
        return -1;
    if (chat_buf_puts(out, "\n<tool_response>\n", r->err) || put(out, content, r->err) ||
        chat_buf_puts(out, "\n</tool_response>", r->err))
        return -1;
    if (!next || !role_is(next, "tool")) return chat_buf_puts(out, "<|im_end|>\n", r->err);
    return 0;
}

/* ---- message loop and generation prompt ----------------------------------------- */

static int render_message(render *r, size_t index, size_t last_query, chat_buf *out,
                          chat_buf *tmp) {
    json_t *m = json_array_get(r->messages, index);
    sview content;
    if (content_of(r, m, index, 1, 0, tmp, &content)) return -1;
    if (role_is(m, "system")) {
        if (index != 0)
            return tern_fail(r->err, "messages[%zu]: System message must be at the beginning.",
                             index);
        return 0;  /* already written by the header */
    }
    if (role_is(m, "user")) {
        if (chat_buf_puts(out, "<|im_start|>user\n", r->err) || put(out, content, r->err))
            return -1;
        return chat_buf_puts(out, "<|im_end|>\n", r->err);
    }
    if (role_is(m, "assistant")) return render_assistant(r, m, index, last_query, content, out);
    if (role_is(m, "tool")) return render_tool_result(r, index, content, out);
    json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
    return tern_fail(r->err, "messages[%zu]: Unexpected message role. (role %s%s%s)", index,
                     json_is_string(role) ? "\"" : "",
                     json_is_string(role) ? json_string_value(role) : "missing",
                     json_is_string(role) ? "\"" : "");
}

static int render_generation_prompt(render *r, chat_buf *out) {
    if (!r->opt->add_generation_prompt) return 0;
    return chat_buf_puts(out, r->opt->enable_thinking
                                  ? "<|im_start|>assistant\n<think>\n"
                                  : "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                         r->err);
}

static int render_all(render *r, json_t *tools, chat_buf *out, chat_buf *tmp) {
    if (!json_is_array(r->messages) || json_array_size(r->messages) == 0)
        return tern_fail(r->err, "messages: No messages provided.");
    size_t last_query = 0;
    if (render_header(r, tools, out, tmp)) return -1;
    if (find_last_query(r, tmp, &last_query)) return -1;
    for (size_t i = 0; i < json_array_size(r->messages); i++)
        if (render_message(r, i, last_query, out, tmp)) return -1;
    return render_generation_prompt(r, out);
}

void tern_chat_options_default(tern_chat_options *opt) {
    *opt = (tern_chat_options){.enable_thinking = 1};
}

char *tern_chat_template_render(json_t *messages, json_t *tools,
                                const tern_chat_options *opt, tern_error *err) {
    tern_chat_options defaults;
    tern_chat_options_default(&defaults);
    render r = {.messages = messages, .opt = opt ? opt : &defaults, .err = err};
    chat_buf out = {0}, tmp = {0};
    int rc = render_all(&r, tools, &out, &tmp);
    chat_buf_free(&tmp);
    if (rc) {
        chat_buf_free(&out);
        return NULL;
    }
    return chat_buf_take(&out, err);
}

char *tern_chat_render(const char *messages_json, const char *tools_json, const tern_chat_options *opt,
                       tern_error *err) {
    json_error_t jerr;
    json_t *messages = json_loads(messages_json, 0, &jerr);
    if (!messages) {
        tern_fail(err, "messages: not valid JSON (%s, line %d)", jerr.text, jerr.line);
        return NULL;
    }
    json_t *tools = NULL;
    if (tools_json && !(tools = json_loads(tools_json, 0, &jerr))) {
        json_decref(messages);
        tern_fail(err, "tools: not valid JSON (%s, line %d)", jerr.text, jerr.line);
        return NULL;
    }
    char *out = tern_chat_template_render(messages, tools, opt, err);
    json_decref(messages);
    json_decref(tools);
    return out;
}
