/* The grammar automaton on hand-written text: each JSON Schema construct,
 * GBNF, tool calls, the reasoning prefix, and the refusals. A string is
 * "whole" when the matcher takes all of it and may end there, "prefix"
 * when it takes it but may not end, "bad" when it refuses it. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "tern.h"
#include "text/chat_template.h"
#include "text/tool_parse.h"

enum { BAD, PREFIX, WHOLE };

static int run(const tern_grammar *g, const char *text) {
    tern_error err;
    tern_matcher *m = tern_matcher_create(g, &err);
    cr_assert(m, "%s", err.msg);
    int r = tern_matcher_accept_bytes(m, text, strlen(text)) ? BAD : tern_matcher_complete(m) ? WHOLE : PREFIX;
    tern_matcher_destroy(m);
    return r;
}

static tern_grammar *compile(const tern_grammar_spec *s) {
    tern_error err;
    tern_grammar *g = tern_grammar_create(s, NULL, &err);
    cr_assert(g, "compile failed: %s", err.msg);
    return g;
}

static tern_grammar *schema(const char *json) { return compile(&(tern_grammar_spec){.json_schema = json}); }

#define EXPECT(g, text, want) cr_expect_eq(run(g, text), want, "%s: %s", #want, text)

/* The error a schema gets, which must name needle. */
static void refused(const char *json, const char *needle) {
    tern_error err;
    tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.json_schema = json}, NULL, &err);
    cr_expect_null(g, "accepted: %s", json);
    tern_grammar_destroy(g);
    if (!g) cr_expect(strstr(err.msg, needle), "error '%s' does not name '%s'", err.msg, needle);
}

Test(grammar, object_properties_in_order) {
    tern_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                             "\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"c\"],"
                             "\"additionalProperties\":false}");
    EXPECT(g, "{\"a\":1,\"c\":true}", WHOLE);
    EXPECT(g, "{\"a\": 1, \"b\": \"x\", \"c\": false}", WHOLE);
    EXPECT(g, "{\n  \"a\": -7,\n  \"c\": true\n}", WHOLE);
    EXPECT(g, "{\"a\":1", PREFIX);
    EXPECT(g, "{\"a\":1}", BAD);
    EXPECT(g, "{\"c\":true,\"a\":1}", BAD);
    EXPECT(g, "{\"a\":1,\"d\":2,\"c\":true}", BAD);
    EXPECT(g, "{\"a\":1,,\"c\":true}", BAD);
    EXPECT(g, "{\"a\":1,\"c\":true,}", BAD);
    EXPECT(g, "{\"b\":\"x\",\"c\":true}", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, all_optional_and_empty_objects) {
    tern_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"},\"y\":{\"type\":"
                             "\"number\"}}}");
    EXPECT(g, "{}", WHOLE);
    EXPECT(g, "{\"y\":2.5e3}", WHOLE);
    EXPECT(g, "{\"x\":null}", WHOLE);
    EXPECT(g, "{\"x\":null,\"y\":0}", WHOLE);
    EXPECT(g, "{,\"y\":0}", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"object\",\"additionalProperties\":false}");
    EXPECT(g, "{ }", WHOLE);
    EXPECT(g, "{\"k\":1}", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, required_names_outside_properties) {
    tern_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\","
                             "\"b\"],\"additionalProperties\":{\"type\":\"boolean\"}}");
    EXPECT(g, "{\"a\":\"x\",\"b\":true}", WHOLE);
    EXPECT(g, "{\"a\":\"x\",\"b\":1}", BAD);
    EXPECT(g, "{\"a\":\"x\"}", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, maps_of_additional_properties) {
    tern_grammar *g = schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
    EXPECT(g, "{}", WHOLE);
    EXPECT(g, "{\"any\": 1, \"keys\": 2}", WHOLE);
    EXPECT(g, "{\"any\": \"no\"}", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, strings_and_escapes) {
    tern_grammar *g = schema("{\"type\":\"string\"}");
    EXPECT(g, "\"plain\"", WHOLE);
    EXPECT(g, "\"\"", WHOLE);
    EXPECT(g, "\"tab\\t quote\\\" slash\\/ back\\\\ \\u00e9 \\uD7FF \\uE000\"", WHOLE);
    EXPECT(g, "\"h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"", WHOLE);
    EXPECT(g, "\"raw\ttab\"", BAD);
    EXPECT(g, "\"raw\nnewline\"", BAD);
    EXPECT(g, "\"\\x41\"", BAD);
    EXPECT(g, "\"\\u0000\"", BAD);
    EXPECT(g, "\"\\uD800\"", BAD);
    EXPECT(g, "\"\\udfff\"", BAD);
    EXPECT(g, "\"\xc3\x28\"", BAD);
    EXPECT(g, "\"\xed\xa0\x80\"", BAD);
    EXPECT(g, "\"\xc0\xaf\"", BAD);
    EXPECT(g, "\"open", PREFIX);
    tern_grammar_destroy(g);
}

Test(grammar, numbers) {
    tern_grammar *g = schema("{\"type\":\"integer\"}");
    EXPECT(g, "0", WHOLE);
    EXPECT(g, "-12", WHOLE);
    EXPECT(g, "123456789012345", WHOLE);
    EXPECT(g, "1234567890123456", BAD);
    EXPECT(g, "01", BAD);
    EXPECT(g, "1.5", BAD);
    EXPECT(g, "+1", BAD);
    EXPECT(g, "-", PREFIX);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"number\"}");
    EXPECT(g, "3.14159", WHOLE);
    EXPECT(g, "-0.5e-10", WHOLE);
    EXPECT(g, "6E+23", WHOLE);
    EXPECT(g, "42", WHOLE);
    EXPECT(g, "1e100", BAD);
    EXPECT(g, ".5", BAD);
    EXPECT(g, "1.", PREFIX);
    EXPECT(g, "NaN", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, booleans_null_enum_const) {
    tern_grammar *g = schema("{\"type\":[\"boolean\",\"null\"]}");
    EXPECT(g, "true", WHOLE);
    EXPECT(g, "false", WHOLE);
    EXPECT(g, "null", WHOLE);
    EXPECT(g, "True", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1]}]}");
    EXPECT(g, "\"red\"", WHOLE);
    EXPECT(g, "\"green\"", WHOLE);
    EXPECT(g, "3", WHOLE);
    EXPECT(g, "null", WHOLE);
    EXPECT(g, "{\"a\":[1]}", WHOLE);
    EXPECT(g, "\"blue\"", BAD);
    EXPECT(g, "\"re\"", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}");
    EXPECT(g, "\"b\"", WHOLE);
    EXPECT(g, "1", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"const\":\"fixed/value\"}");
    EXPECT(g, "\"fixed/value\"", WHOLE);
    EXPECT(g, "\"fixed\"", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, arrays_with_bounds) {
    tern_grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}");
    EXPECT(g, "[1,2]", WHOLE);
    EXPECT(g, "[1, 2, 3, 4]", WHOLE);
    EXPECT(g, "[1]", BAD);
    EXPECT(g, "[]", BAD);
    EXPECT(g, "[1,2,3,4,5]", BAD);
    EXPECT(g, "[1,\"x\"]", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"array\"}");
    EXPECT(g, "[]", WHOLE);
    EXPECT(g, "[1, \"two\", [3], {\"four\": null}]", WHOLE);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"array\",\"maxItems\":0}");
    EXPECT(g, "[]", WHOLE);
    EXPECT(g, "[1]", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, any_of_and_nullable) {
    tern_grammar *g = schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"k\":"
                             "{\"type\":\"string\"}},\"required\":[\"k\"],\"additionalProperties\":false}]}");
    EXPECT(g, "5", WHOLE);
    EXPECT(g, "{\"k\":\"v\"}", WHOLE);
    EXPECT(g, "\"v\"", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}");
    EXPECT(g, "null", WHOLE);
    EXPECT(g, "\"s\"", WHOLE);
    tern_grammar_destroy(g);
    g = schema("{\"allOf\":[{\"type\":\"boolean\"}],\"description\":\"a flag\"}");
    EXPECT(g, "true", WHOLE);
    EXPECT(g, "1", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, recursive_refs) {
    tern_grammar *g = schema(
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":"
        "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"],\"additionalProperties\":"
        "false}},\"$ref\":\"#/$defs/node\"}");
    EXPECT(g, "{\"v\":1,\"kids\":[]}", WHOLE);
    EXPECT(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]},{\"v\":4,\"kids\":[]}]}", WHOLE);
    EXPECT(g, "{\"v\":1,\"kids\":[{\"v\":2}]}", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
               "\"required\":[\"next\"],\"additionalProperties\":false}");
    EXPECT(g, "{\"next\":{\"next\":{\"next\":null}}}", WHOLE);
    EXPECT(g, "{\"next\":{}}", BAD);
    tern_grammar_destroy(g);
    g = schema("{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":"
               "\"#/definitions/s\"}}");
    EXPECT(g, "[\"a\",\"b\"]", WHOLE);
    tern_grammar_destroy(g);
}

Test(grammar, whitespace_is_bounded) {
    tern_grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    char text[128];
    snprintf(text, sizeof text, "[\n%24s1]", "");
    EXPECT(g, text, WHOLE);
    snprintf(text, sizeof text, "[\n%25s1]", "");
    EXPECT(g, text, BAD);
    EXPECT(g, "[  1]", BAD);
    EXPECT(g, "[\n\n1]", BAD);
    EXPECT(g, "\n\n[1]", WHOLE);
    EXPECT(g, "[1] ", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, json_object_and_after_think) {
    tern_grammar *g = compile(&(tern_grammar_spec){.json_object = 1});
    EXPECT(g, "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}", WHOLE);
    EXPECT(g, "[1]", BAD);
    EXPECT(g, "\"s\"", BAD);
    tern_grammar_destroy(g);
    g = compile(&(tern_grammar_spec){.json_object = 1, .after_think = 1});
    EXPECT(g, "{}", PREFIX);
    EXPECT(g, "Let me think. </thi <think>\n</think>\n\n{}", WHOLE);
    EXPECT(g, "a</think>b</think>{}", BAD);
    EXPECT(g, "hmm</think>\n\nnot json", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, refused_keywords_are_named) {
    refused("{\"type\":\"string\",\"pattern\":\"^a\"}", "\"pattern\"");
    refused("{\"type\":\"string\",\"format\":\"email\"}", "\"format\"");
    refused("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\",\"minLength\":2}}}", "\"minLength\"");
    refused("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\",\"minLength\":2}}}", "#/properties/n");
    refused("{\"type\":\"integer\",\"minimum\":0}", "\"minimum\"");
    refused("{\"type\":\"array\",\"uniqueItems\":true}", "\"uniqueItems\"");
    refused("{\"not\":{\"type\":\"null\"}}", "\"not\"");
    refused("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf");
    refused("{\"allOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "allOf");
    refused("{\"$ref\":\"https://example.com/s.json\"}", "$ref");
    refused("{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
    refused("{\"type\":\"strin\"}", "strin");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems");
    refused("{\"type\":\"array\",\"items\":[{\"type\":\"integer\"}]}", "items");
    refused("false", "false");
    refused("{\"type\":\"object\",\"required\":[\"x\"],\"additionalProperties\":false}", "'x'");
    refused("{\"type\":\"string\",\"enum\":[1,2]}", "enum");
    refused("{\"type\": ", "not valid JSON");
    /* A bad member after a good one (members are built from the last):
     * the half-built sequence is freed (the sanitizer build checks). */
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\" integer\"},\"b\":{\"type\":\"null\"}}}",
            "#/properties/a");
}

Test(grammar, only_the_empty_string) {
    tern_grammar *g = compile(&(tern_grammar_spec){.gbnf = "root ::= \"\""});
    EXPECT(g, "", WHOLE);
    EXPECT(g, "a", BAD);
    tern_grammar_destroy(g);
}

Test(grammar, gbnf_syntax) {
    const char *text =
        "# answers\n"
        "root   ::= item (\", \" item)* tail?\n"
        "item   ::= \"yes\" | \"no\" | [0-9]+ | word\n"
        "word   ::= [a-zA-Z_\\u00e0-\\u00ff]{2,4}\n"
        "tail   ::= \".\" \n"
        "         | \"!\" [^a-z\\n]\n";
    tern_grammar *g = compile(&(tern_grammar_spec){.gbnf = text});
    EXPECT(g, "yes", WHOLE);
    EXPECT(g, "yes, no, 42, ab.", WHOLE);
    EXPECT(g, "abcd", WHOLE);
    EXPECT(g, "abcde", BAD);
    EXPECT(g, "a", PREFIX);
    EXPECT(g, "\xc3\xa9t\xc3\xa9", WHOLE);
    EXPECT(g, "no!Z", WHOLE);
    EXPECT(g, "no!\xe2\x82\xac", WHOLE);
    EXPECT(g, "no!z", BAD);
    EXPECT(g, "maybe!", BAD);
    tern_grammar_destroy(g);
    g = compile(&(tern_grammar_spec){.gbnf = "root ::= \"<\" . \">\" ( \"\\x41\" | \"\\n\" )?"});
    EXPECT(g, "<\xe6\x97\xa5>", WHOLE);
    EXPECT(g, "<x>A", WHOLE);
    EXPECT(g, "<x>\n", WHOLE);
    EXPECT(g, "<xy>", BAD);
    tern_grammar_destroy(g);
}

static void gbnf_refused(const char *text, const char *needle) {
    tern_error err;
    tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.gbnf = text}, NULL, &err);
    cr_expect_null(g, "accepted: %s", text);
    tern_grammar_destroy(g);
    if (!g) cr_expect(strstr(err.msg, needle), "error '%s' does not name '%s'", err.msg, needle);
}

Test(grammar, gbnf_errors) {
    gbnf_refused("root ::= missing", "'missing'");
    gbnf_refused("start ::= \"a\"", "root");
    gbnf_refused("root ::= root \"a\" | \"b\"", "left-recursive");
    gbnf_refused("root ::= (\"a\"?)*", "left-recursive");
    gbnf_refused("root ::= \"a\" root", "never finish");
    gbnf_refused("root ::= \"a\"\nroot ::= \"b\"", "twice");
    gbnf_refused("root ::= \"a\"\n  )", "line 2");
    gbnf_refused("root ::= [z-a]", "backwards");
    gbnf_refused("root ::= \"unterminated", "end of the grammar");
    gbnf_refused("root ::= \"a\"{3,1}", "maximum");
    char longname[300];
    snprintf(longname, sizeof longname, "root ::= \"a\"\n%0200d ::= \"b\"", 0);
    gbnf_refused(longname, "longer than 127");
}

/* A chain of n rules r_i ::= "a" r_(i+1), the last "b", written from the
 * root down (up: from the last rule up): text of exactly n a's then b. */
static char *chain(int n, int up) {
    size_t cap = (size_t)n * 32 + 64, len = 0;
    char *t = malloc(cap);
    cr_assert(t);
    len += (size_t)snprintf(t, cap, "%s", up ? "" : "root ::= r0\n");
    for (int k = 0; k < n; k++) {
        int i = up ? n - 1 - k : k;
        len += (size_t)snprintf(t + len, cap - len, "r%d ::= \"a\" r%d\n", i, i + 1);
    }
    snprintf(t + len, cap - len, "r%d ::= \"b\"\n%s", n, up ? "root ::= r0\n" : "");
    return t;
}

Test(grammar, long_rule_chains_in_either_order) {
    enum { N = 20000 };
    char *want = malloc(N + 3);
    cr_assert(want);
    for (int up = 0; up < 2; up++) {
        char *text = chain(N, up);
        tern_grammar *g = compile(&(tern_grammar_spec){.gbnf = text});
        memset(want, 'a', N);
        strcpy(want + N, "b");
        EXPECT(g, want, WHOLE);
        strcpy(want + N - 1, "b");
        EXPECT(g, want, BAD);
        want[N - 1] = '\0';
        EXPECT(g, want, PREFIX);
        tern_grammar_destroy(g);
        free(text);
    }
    free(want);
}

/* ---- tool calls ----------------------------------------------------------- */

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"C\",\"F\"]},"
    "\"days\":{\"type\":\"integer\"},\"exact\":{\"type\":\"boolean\"},\"where\":{\"$ref\":\"#/$defs/pt\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"note\":{\"anyOf\":[{\"type\":\"string\"},"
    "{\"type\":\"null\"}]}},\"required\":[\"city\",\"days\"],\"$defs\":{\"pt\":{\"type\":\"object\","
    "\"properties\":{\"lat\":{\"type\":\"number\"},\"lon\":{\"type\":\"number\"}},\"required\":[\"lat\","
    "\"lon\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{}}}}]";

/* The calls the chat template renders for the arguments (a JSON object
 * text), and what the output parser reads back from them. */
static char *render_call(const char *name, const char *args) {
    char conv[2048];
    snprintf(conv, sizeof conv,
             "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
             "[{\"function\":{\"name\":\"%s\",\"arguments\":%s}}]}]",
             name, args);
    json_t *msgs = json_loads(conv, 0, NULL), *tools = json_loads(TOOLS, 0, NULL);
    cr_assert(msgs && tools, "%s", conv);
    tern_error err;
    char *prompt = tern_chat_template_render(msgs, tools, NULL, &err);
    cr_assert(prompt, "%s", err.msg);
    char head[128];
    snprintf(head, sizeof head, "<tool_call>\n<function=%s>", name);
    char *call = strstr(prompt, head);
    cr_assert(call);
    *strstr(call, "<|im_end|>") = '\0';
    char *out = strdup(call);
    free(prompt);
    json_decref(msgs);
    json_decref(tools);
    return out;
}

static tern_grammar *tool_grammar(const char *name, int parallel) {
    return compile(&(tern_grammar_spec){.tools_json = TOOLS, .tool_name = name, .tools_required = 1,
                                        .parallel_tool_calls = parallel});
}

Test(grammar, tool_calls_take_what_the_template_writes) {
    tern_grammar *g = tool_grammar(NULL, 1);
    const char *args[] = {
        "{\"city\":\"Paris\",\"days\":3}",
        "{\"city\":\"multi\\nline <b>x</b> </parameter \",\"unit\":\"F\",\"days\":-2,\"exact\":true,"
        "\"where\":{\"lat\":48.85,\"lon\":2.35},\"tags\":[\"a</b\",\"c</parameter\"],\"note\":null}",
        "{\"city\":\"\",\"days\":0,\"note\":\"later\"}",
    };
    for (size_t i = 0; i < sizeof args / sizeof *args; i++) {
        char *text = render_call("get_weather", args[i]);
        EXPECT(g, text, WHOLE);
        free(text);
    }
    char *text = render_call("noop", "{}");
    EXPECT(g, text, WHOLE);
    free(text);
    EXPECT(g, "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n"
              "</tool_call>", WHOLE);
    EXPECT(g, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
           BAD);
    EXPECT(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=days>\nthree",
           BAD);
    EXPECT(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx</parameter>\n<parameter=days>\n1\n</parameter>"
              "\n</function>\n</tool_call>", BAD);
    EXPECT(g, "<tool_call>\n<function=nope>", BAD);
    EXPECT(g, "Sure! <tool_call>", BAD);
    tern_grammar_destroy(g);
}

/* JSON strings inside a parameter never hold "</parameter>", which would
 * end the value for the output parser; "<\/parameter>" says the same. */
Test(grammar, tool_call_json_strings_keep_out_the_value_end) {
    tern_grammar *g = tool_grammar("get_weather", 0);
    const char *head = "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=days>\n1\n"
                       "</parameter>\n<parameter=tags>\n[\"";
    char text[512];
    snprintf(text, sizeof text, "%sa</b><\\/parameter>\"]", head);
    EXPECT(g, text, PREFIX);
    snprintf(text, sizeof text, "%sa</parameter>", head);
    EXPECT(g, text, BAD);
    tern_grammar_destroy(g);
}

Test(grammar, tool_choice_by_name_and_single_call) {
    tern_grammar *g = tool_grammar("noop", 0);
    EXPECT(g, "<tool_call>\n<function=noop>\n</function>\n</tool_call>", WHOLE);
    EXPECT(g, "<tool_call>\n<function=noop>\n</function>\n</tool_call>\n", BAD);
    EXPECT(g, "<tool_call>\n<function=get_weather>", BAD);
    tern_grammar_destroy(g);
    tern_error err;
    cr_expect_null(tern_grammar_create(&(tern_grammar_spec){.tools_json = TOOLS, .tool_name = "absent",
                                                            .tools_required = 1},
                                       NULL, &err));
    cr_expect(strstr(err.msg, "absent"), "%s", err.msg);
}

/* What the grammar lets through, the parser reads as arguments valid
 * under the schema: a string parameter written raw, even one that looks
 * like a number, comes back a string. */
Test(grammar, tool_call_values_read_back_typed) {
    const char *text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
                       "<parameter=days>\n42\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n"
                       "</tool_call>";
    tern_grammar *g = tool_grammar(NULL, 1);
    EXPECT(g, text, WHOLE);
    tern_grammar_destroy(g);
    json_t *tools = json_loads(TOOLS, 0, NULL), *params = tern_tool_parameters(tools, "get_weather");
    json_t *props = json_object_get(params, "properties");
    json_t *city = tern_tool_param_value_in("42", 2, json_object_get(props, "city"), params);
    json_t *days = tern_tool_param_value_in("42", 2, json_object_get(props, "days"), params);
    json_t *note = tern_tool_param_value_in("null", 4, json_object_get(props, "note"), params);
    json_t *where = tern_tool_param_value_in("{\"lat\":1,\"lon\":2}", 17, json_object_get(props, "where"), params);
    cr_expect(json_is_string(city));
    cr_expect(json_is_integer(days));
    cr_expect(json_is_null(note));
    cr_expect(json_is_object(where), "a $ref to an object reads back as JSON");
    json_decref(city);
    json_decref(days);
    json_decref(note);
    json_decref(where);
    json_decref(tools);
}

Test(grammar, tool_schemas_that_cannot_be_written_are_refused) {
    const char *cases[][2] = {
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
         "{\"s\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}]",
         "pattern"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
         "{\"a<b\":{\"type\":\"string\"}}}}}]",
         "a<b"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
         "{\"n\":{\"type\":\"integer\",\"maximum\":3}}}}}]",
         "maximum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tern_error err;
        tern_grammar *g = tern_grammar_create(&(tern_grammar_spec){.tools_json = cases[i][0], .tools_required = 1},
                                              NULL, &err);
        cr_expect_null(g, "accepted: %s", cases[i][0]);
        tern_grammar_destroy(g);
        if (!g) cr_expect(strstr(err.msg, cases[i][1]), "error '%s' does not name '%s'", err.msg, cases[i][1]);
    }
}

Test(grammar, answer_or_tool_calls) {
    tern_grammar *g = compile(&(tern_grammar_spec){.json_schema = "{\"type\":\"integer\"}", .tools_json = TOOLS,
                                                   .parallel_tool_calls = 1});
    EXPECT(g, "7", WHOLE);
    EXPECT(g, "<tool_call>\n<function=noop>\n</function>\n</tool_call>", WHOLE);
    EXPECT(g, "\"7\"", BAD);
    tern_grammar_destroy(g);
}

/* Grammars that would make the automaton recurse without end are refused
 * or stopped, never a crash: a chain of rules each starting the next,
 * and stacks nested past the limit. */
Test(grammar, limits_of_depth) {
    size_t cap = 64 << 10, n = 0;
    char *text = malloc(cap);
    for (int i = 0; i < 2000; i++) n += (size_t)snprintf(text + n, cap - n, "r%d ::= r%d\n", i, i + 1);
    snprintf(text + n, cap - n, "r2000 ::= \"x\"\nroot ::= r0\n");
    tern_error err;
    cr_expect_null(tern_grammar_create(&(tern_grammar_spec){.gbnf = text}, NULL, &err));
    cr_expect(strstr(err.msg, "deep"), "%s", err.msg);
    free(text);
    tern_grammar *g = compile(&(tern_grammar_spec){.gbnf = "root ::= \"(\" root? \")\""});
    tern_matcher *m = tern_matcher_create(g, &err);
    int refused = 0;
    for (int i = 0; i < 10000 && !refused; i++) refused = tern_matcher_accept_bytes(m, "(", 1) != 0;
    cr_expect(refused, "nesting without a limit");
    tern_matcher_destroy(m);
    tern_grammar_destroy(g);
}

/* A saved state comes back after the text read past it, once. */
Test(grammar, save_and_restore) {
    tern_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
    tern_error err;
    tern_matcher *m = tern_matcher_create(g, &err);
    cr_assert(m, "%s", err.msg);
    tern_matcher_restore(m);   /* nothing saved: no change */
    cr_assert_eq(tern_matcher_accept_bytes(m, "{\"a\":", 5), 0);
    int left = tern_matcher_min_bytes(m);
    cr_assert_eq(tern_matcher_save(m, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_matcher_accept_bytes(m, "12}", 3), 0);
    cr_assert(tern_matcher_complete(m));
    tern_matcher_restore(m);
    cr_expect(!tern_matcher_complete(m));
    cr_expect_eq(tern_matcher_min_bytes(m), left);
    cr_expect_neq(tern_matcher_accept_bytes(m, "}", 1), 0, "the restored state took what it should not");
    cr_assert_eq(tern_matcher_accept_bytes(m, "7", 1), 0);
    tern_matcher_restore(m);   /* a second restore: no change */
    cr_assert_eq(tern_matcher_accept_bytes(m, "}", 1), 0);
    cr_expect(tern_matcher_complete(m));
    tern_matcher_destroy(m);
    tern_grammar_destroy(g);
}
