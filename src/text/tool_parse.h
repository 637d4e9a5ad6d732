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

/* The parser's types and calls are public (tern.h, "output parsing"); the
 * helpers below are the value rules it applies. */

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
/* The same, following local "$ref"s ("#/$defs/X") within root (the tool's
 * "parameters" schema; NULL: none), and typing a schema without "type"
 * by its enum or const values when they share one JSON type. */
json_t *tern_tool_param_value_in(const char *text, size_t len, json_t *schema, json_t *root);

/* How tern_tool_param_value_in reads a parameter's text, for the grammar
 * that forces tool calls (it must write what this reads back):
 *   STRING     the text itself (and "null"/"none" as null when *nullable)
 *   INT        Python int(); NUMBER: float(); BOOL: "true" (any case)
 *   CONTAINER  JSON (object and array types)
 *   NULL       "null"
 *   UNTYPED    JSON when it parses as a non-string, else the text */
enum tern_param_kind {
    TERN_PARAM_UNTYPED, TERN_PARAM_STRING, TERN_PARAM_INT, TERN_PARAM_NUMBER, TERN_PARAM_BOOL,
    TERN_PARAM_CONTAINER, TERN_PARAM_NULL,
};
int tern_tool_param_kind(json_t *schema, json_t *root, int *nullable);

/* The schema a local "$ref" ("#/..." within root) points to (chains
 * followed); the schema itself when it has none or it does not resolve. */
json_t *tern_schema_resolve(json_t *root, json_t *schema);

/* The "parameters" schema of function `name` in an OpenAI tools array,
 * or NULL; tern_tool_properties: its "properties" object. Borrowed. */
json_t *tern_tool_parameters(json_t *tools, const char *name);
json_t *tern_tool_properties(json_t *tools, const char *name);

#endif
