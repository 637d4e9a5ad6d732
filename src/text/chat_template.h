/* The Qwen3.6 chat template, written out in C.
 *
 * Renders an OpenAI-style conversation into the prompt text that the
 * published Qwen/Qwen3.6-35B-A3B chat_template.jinja produces (the template
 * is kept verbatim in tests/fixtures/chat/qwen3.6.jinja; the tests compare
 * this renderer with transformers' apply_chat_template over every case in
 * tests/fixtures/chat/template_cases.json, byte for byte). There is no
 * Jinja engine: each branch of the template is one C function below, in the
 * template's order.
 *
 * Input (jansson values, not modified):
 *   messages  array of {role, content, reasoning_content?, tool_calls?}.
 *             role: system (first message only), user, assistant, tool.
 *             content: string, null, or a list of parts {type:"text",text},
 *             {type:"image_url"|"image",...}, {type:"video",...}.
 *             tool_calls: [{function:{name, arguments}}] (or {name,
 *             arguments} without the wrapper); arguments an object or a
 *             JSON string holding one (parsed first, as vLLM does for
 *             OpenAI requests; null or "" means no arguments).
 *   tools     NULL or an array of tool definitions, each written as JSON.
 *
 * The template has no `developer` role: like the published template this
 * renderer rejects it ("Unexpected message role."); a server that accepts
 * developer messages must map them to system before calling this.
 */
#ifndef TERN_TEXT_CHAT_TEMPLATE_H
#define TERN_TEXT_CHAT_TEMPLATE_H

#include <jansson.h>

#include "tern.h"



/* Returns the rendered prompt (malloc'd UTF-8, caller frees), or NULL with
 * err naming the message and the problem; where the template raises, the
 * message contains the template's own words (e.g. "messages[2]: System
 * message must be at the beginning."). opt may be NULL for the defaults. */
char *tern_chat_template_render(json_t *messages, json_t *tools,
                                const tern_chat_options *opt, tern_error *err);

#endif
