/* Qwen3.6 output parsing: answer text, reasoning and tool calls, streamed.
 *
 * The model writes tool calls in the XML form its chat template teaches:
 *
 *     <tool_call>
 *     <function=NAME>
 *     <parameter=KEY>
 *     VALUE
 *     </parameter>
 *     ...
 *     </function>
 *     </tool_call>
 *
 * (vLLM's parser for it is `qwen3_coder`). The output parser takes the
 * generated text in pieces of any size, separates the reasoning (see
 * reasoning_parse.h), and turns each complete call into an event with the
 * function name and the arguments as a JSON object. Events:
 *
 *   CONTENT    a piece of the answer text
 *   REASONING  a piece of the reasoning text
 *   TOOL_CALL  one complete call: name, arguments (JSON text and value)
 *   MALFORMED  a <tool_call> that could not be read (the reason is in
 *              text); its raw text then continues as CONTENT, so nothing
 *              the model wrote is lost
 *
 * Text-level rules (kept from vLLM's qwen3_coder where it has one):
 *  - a value loses one leading and one trailing newline (the template adds
 *    exactly those around every value);
 *  - a "</parameter>" ends a value only when whitespace and then
 *    "<parameter=", "</function>" or "</tool_call>" follow it, so a value
 *    may itself contain "</parameter>" (code that mentions it);
 *  - a call without </tool_call> ends at its </function>; a "<function="
 *    at the start of a line is read as a call even without <tool_call>
 *    (the model sometimes drops it);
 *  - whitespace between the answer and a call, and between calls, is
 *    markup (the template writes "\n\n" and "\n" there) and is dropped;
 *  - function names must be non-empty without whitespace, quotes or any
 *    of {}<>; anything else is MALFORMED;
 *  - a call still open when the text ends is MALFORMED (unterminated).
 *
 * Values are typed as described at tern_tool_param_value. The events are
 * the same however the text is cut into pieces (the tests feed every split
 * point and byte by byte).
 */
#ifndef TERN_TEXT_TOOL_PARSE_H
#define TERN_TEXT_TOOL_PARSE_H

#include <jansson.h>
#include <stddef.h>

#include "tern.h"

typedef enum tern_out_kind {
    TERN_OUT_CONTENT = 0,
    TERN_OUT_REASONING = 1,
    TERN_OUT_TOOL_CALL = 2,
    TERN_OUT_MALFORMED = 3,
} tern_out_kind;

typedef struct tern_out_event {
    tern_out_kind kind;
    const char *text;       /* CONTENT/REASONING piece, or MALFORMED reason */
    size_t len;
    int call_index;         /* TOOL_CALL: 0, 1, ... in order of completion */
    const char *name;       /* TOOL_CALL: function name */
    const char *arguments;  /* TOOL_CALL: JSON object text (json.dumps style) */
    json_t *arguments_json; /* TOOL_CALL: the same object (borrowed) */
} tern_out_event;

/* Receives each event; the pointers are valid during the call only.
 * Returns 0, or -1 with err set to stop the parser. */
typedef int (*tern_out_fn)(void *user, const tern_out_event *ev, tern_error *err);

typedef struct tern_output_params {
    int start_in_reasoning;  /* the prompt ended in "<think>\n" (thinking on) */
    int parse_tool_calls;    /* 0: tool-call markup is plain answer text */
    json_t *tools;           /* the request's tools (schemas type the values), or NULL */
} tern_output_params;

typedef struct tern_output_parser tern_output_parser;

/* Keeps a reference to params->tools. */
tern_output_parser *tern_output_parser_create(const tern_output_params *params,
                                              tern_out_fn fn, void *user, tern_error *err);
void tern_output_parser_destroy(tern_output_parser *p);

/* Feeds the next piece of generated text. Returns 0, or -1 if the callback
 * failed or memory ran out; malformed text is never an error here. */
int tern_output_parser_feed(tern_output_parser *p, const char *text, size_t len,
                            tern_error *err);
/* End of generation: flushes held-back text and reports an unterminated
 * call as MALFORMED. */
int tern_output_parser_finish(tern_output_parser *p, tern_error *err);

int tern_output_parser_n_tool_calls(const tern_output_parser *p);

/* The typed value of one parameter's text, as a new reference (never NULL
 * unless malloc fails). `schema` is the parameter's JSON schema or NULL.
 *  - With a schema type (also the first non-null type of a type list or of
 *    anyOf/oneOf), vLLM's qwen3_coder conversion: string types keep the
 *    text; "null"/"none" become null for other types (and for nullable
 *    strings); integer types parse as Python int(), number types as
 *    float() (integral values become integers); boolean is text ==
 *    "true" (any case); object/array parse as JSON; text that does not
 *    convert stays a string.
 *  - Without a type: text that parses as a JSON number, true/false/null,
 *    object or array becomes that value; anything else is the string.
 *    (vLLM keeps such values as strings; reading JSON is what the template
 *    wrote for non-string values, so the round trip restores them.) */
json_t *tern_tool_param_value(const char *text, size_t len, json_t *schema);

/* The parameter schemas (the "properties" object) of function `name` in an
 * OpenAI tools array, or NULL. Borrowed. */
json_t *tern_tool_properties(json_t *tools, const char *name);

#endif
