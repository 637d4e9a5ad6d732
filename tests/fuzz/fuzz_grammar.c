/* Grammar inputs (tern.h "structured output"): a GBNF text or a JSON
 * Schema, compiled without a vocabulary, then the rest of the input read
 * by the matcher byte by byte. Compiling either succeeds or fails with a
 * message; a refused byte leaves the matcher as it was (the next bytes
 * are tried from there); the shortest way to end never grows by more
 * than the grammar allows. First byte:
 *   bit 0  JSON Schema (else GBNF)      bit 1  the reasoning comes first
 *   bit 2  answer or the tool calls of a fixed tools list
 * then "GRAMMAR\0TEXT". */
#include "fuzz.h"
#include "tern.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},\"o\":{\"type\":\"object\"}},\"required\":[\"s\"]}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    unsigned mode = data[0];
    char *all = fuzz_strndup(data + 1, n - 1);
    size_t glen = strlen(all);
    const char *text = glen < n - 1 ? all + glen + 1 : "";
    size_t tlen = glen < n - 1 ? n - 2 - glen : 0;
    tern_grammar_spec spec = {.after_think = (mode >> 1) & 1};
    if (mode & 1) spec.json_schema = all;
    else spec.gbnf = all;
    if (mode & 4) spec.tools_json = TOOLS, spec.parallel_tool_calls = 1;
    tern_error err = {{0}};
    tern_grammar *g = tern_grammar_create(&spec, NULL, &err);
    if (!g) {
        FUZZ_CHECK(err.msg[0], "a grammar refused without a message");
        FUZZ_NOTE("refused: %s", err.msg);
        free(all);
        return 0;
    }
    tern_matcher *m = tern_matcher_create(g, &err);
    FUZZ_CHECK(m, "matcher: %s", err.msg);
    for (size_t i = 0; i < tlen; i++) {
        int before = tern_matcher_min_bytes(m), complete = tern_matcher_complete(m);
        if (tern_matcher_accept_bytes(m, text + i, 1)) {
            FUZZ_CHECK(tern_matcher_min_bytes(m) == before && tern_matcher_complete(m) == complete,
                       "a refused byte changed the matcher");
        }
    }
    tern_matcher_destroy(m);
    tern_grammar_destroy(g);
    free(all);
    return 0;
}
