/* Text helpers shared by the chat template and the tool-call parser: a
 * growable byte buffer, and JSON written the way Python's
 * json.dumps(x, ensure_ascii=False) writes it.
 *
 * Why Python's format: the Qwen chat template is rendered by transformers,
 * whose `tojson` filter is json.dumps with its defaults (", " and ": "
 * separators, keys in insertion order, non-ASCII kept as UTF-8, floats in
 * Python's shortest round-trip repr such as 1e-07 or 3.0). The prompt must
 * match that byte for byte, so the separators and number spellings matter.
 */
#ifndef TERN_TEXT_CHAT_JSON_H
#define TERN_TEXT_CHAT_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "tern.h"

/* A NUL-terminated growable string. Zero-initialise (`chat_buf b = {0};`),
 * append, then take the bytes with chat_buf_take or drop them with
 * chat_buf_free. Appends fail only when malloc fails. */
typedef struct chat_buf {
    char *data;
    size_t len;
    size_t cap;
} chat_buf;

int chat_buf_append(chat_buf *b, const char *s, size_t n, tern_error *err);
int chat_buf_puts(chat_buf *b, const char *s, tern_error *err);
/* Returns the malloc'd string (never NULL: an empty buffer gives "") and
 * leaves b empty; NULL only if allocating the empty string fails. */
char *chat_buf_take(chat_buf *b, tern_error *err);
void chat_buf_free(chat_buf *b);

/* A JSON number as Python prints it (integers plain, reals as repr). */
int chat_json_put_number(chat_buf *b, json_t *x, tern_error *err);

/* Writes x as Python's json.dumps(x, ensure_ascii=False) would. */
int chat_json_dump_py(chat_buf *b, json_t *x, tern_error *err);

/* Writes v as Python's repr(float) does ("0.1", "3.0", "1e-07", "1e+20",
 * "-0.0"); out needs 32 bytes. NaN/inf are spelled NaN/Infinity/-Infinity
 * as json.dumps does. */
void chat_json_format_double(double v, char out[32]);

#endif
