/* The C chat template against transformers' rendering of the published
 * Qwen3.6 template (tests/fixtures/chat/template_cases.json, made by
 * tools/chat/make_template_fixtures.py). Every case must match byte for
 * byte, or fail where the template raises. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "text/chat_json.h"
#include "text/chat_template.h"

#define CASES "tests/fixtures/chat/template_cases.json"

static int opt_flag(json_t *options, const char *key, int dflt) {
    json_t *v = json_object_get(options, key);
    return v ? json_is_true(v) : dflt;
}

static void options_of(json_t *c, tern_chat_options *o) {
    json_t *options = json_object_get(c, "options");
    tern_chat_options_default(o);
    o->add_generation_prompt = opt_flag(options, "add_generation_prompt", 0);
    o->enable_thinking = opt_flag(options, "enable_thinking", 1);
    o->preserve_thinking = opt_flag(options, "preserve_thinking", 0);
    o->add_vision_id = opt_flag(options, "add_vision_id", 0);
}

static size_t first_diff(const char *a, const char *b) {
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    return i;
}

/* Errors raised by the template's own words must be reported in them. */
static const char *template_message(const char *python_error) {
    static const char *known[] = {
        "Unexpected message role.", "System message must be at the beginning.",
        "No user query found in messages.", "System message cannot contain images.",
        "Unexpected item type in content.", "Unexpected content type.",
        "Can only get item pairs from a mapping.",
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strstr(python_error, known[i])) return known[i];
    return NULL;
}

static int check_case(json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *expected = json_object_get(c, "expected");
    tern_chat_options o;
    options_of(c, &o);
    tern_error err = {{0}};
    char *got = tern_chat_template_render(json_object_get(c, "messages"),
                                          json_object_get(c, "tools"), &o, &err);
    int ok;
    if (expected) {
        const char *want = json_string_value(expected);
        ok = got && strcmp(got, want) == 0;
        if (!got)
            cr_log_error("%s: failed: %s", name, err.msg);
        else if (!ok)
            cr_log_error("%s: differs at byte %zu\n--- want\n%s\n--- got\n%s", name,
                         first_diff(got, want), want, got);
    } else {
        const char *python = json_string_value(json_object_get(c, "error"));
        const char *words = template_message(python);
        ok = !got && (!words || strstr(err.msg, words));
        if (!ok) cr_log_error("%s: want error \"%s\", got \"%s\"", name, python,
                              got ? "(rendered)" : err.msg);
    }
    free(got);
    return ok;
}

Test(chat_template, fixtures_match_transformers) {
    json_error_t je;
    json_t *cases = json_load_file(CASES, 0, &je);
    cr_assert(cases, "%s: %s (line %d)", CASES, je.text, je.line);
    cr_assert(json_array_size(cases) >= 30, "only %zu cases", json_array_size(cases));
    size_t i, failed = 0;
    json_t *c;
    json_array_foreach(cases, i, c) failed += !check_case(c);
    cr_expect(failed == 0, "%zu of %zu template cases differ", failed, json_array_size(cases));
    json_decref(cases);
}

Test(chat_template, python_float_repr) {
    struct { double v; const char *s; } t[] = {
        {0.1, "0.1"}, {3.0, "3.0"}, {1e20, "1e+20"}, {1.5e-7, "1.5e-07"}, {-0.0, "-0.0"},
        {1e16, "1e+16"}, {1234567890123456.0, "1234567890123456.0"}, {0.0001, "0.0001"},
        {0.00001, "1e-05"}, {123.456, "123.456"}, {2.5, "2.5"}, {1.0 / 3, "0.3333333333333333"},
        {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char out[32];
        chat_json_format_double(t[i].v, out);
        cr_expect_str_eq(out, t[i].s);
    }
}

Test(chat_template, json_dump_matches_python) {
    json_t *x = json_loads("{\"b\": [1, 2.0, \"\\u00e9\\n\\u0001\\\"\"], \"a\": {}, \"c\": null}",
                           0, NULL);
    cr_assert(x);
    chat_buf b = {0};
    tern_error err;
    cr_assert_eq(chat_json_dump_py(&b, x, &err), 0);
    cr_expect_str_eq(b.data, "{\"b\": [1, 2.0, \"\xc3\xa9\\n\\u0001\\\"\"], \"a\": {}, \"c\": null}");
    chat_buf_free(&b);
    json_decref(x);
}

Test(chat_template, errors_name_the_message) {
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"q\"},"
                           "{\"role\":\"developer\",\"content\":\"d\"}]", 0, NULL);
    tern_error err = {{0}};
    char *s = tern_chat_template_render(m, NULL, NULL, &err);
    cr_expect_null(s);
    cr_expect(strstr(err.msg, "messages[1]") && strstr(err.msg, "developer"), "%s", err.msg);
    json_decref(m);

    m = json_loads("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                   "\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                   "\"arguments\":\"[1]\"}}]}]", 0, NULL);
    s = tern_chat_template_render(m, NULL, NULL, &err);
    cr_expect_null(s);
    cr_expect(strstr(err.msg, "messages[1].tool_calls[0].arguments"), "%s", err.msg);
    json_decref(m);
}

Test(chat_template, default_options_open_thinking) {
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    tern_chat_options o;
    tern_chat_options_default(&o);
    o.add_generation_prompt = 1;
    tern_error err;
    char *s = tern_chat_template_render(m, NULL, &o, &err);
    cr_assert(s, "%s", err.msg);
    cr_expect_str_eq(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    free(s);
    json_decref(m);
}
