/* Stop strings over streamed text.
 *
 * Text arrives in chunks (what the detokenizer emits). The matcher releases
 * at once every byte that can no longer be part of a stop string, and holds
 * back only the shortest tail that is still the beginning of one (so with
 * stop "</answer>", "x</an" releases "x" and holds "</an"). When a stop
 * string is complete, push reports it and releases the text before it; the
 * stop string and everything after it are dropped. The stop reported is the
 * one that completes first in the stream (for overlapping stops such as
 * "abcd" and "bc", "bc"), whatever the chunking. Stop strings are matched
 * as bytes; with valid UTF-8 in and valid UTF-8 stop strings, released text
 * never splits a character.
 *
 *     tern_stop *st = tern_stop_create(stops, n_stops, &err);
 *     for each chunk:
 *         int hit = tern_stop_push(st, chunk, n, &s, &len, &which);
 *         send(s, len);  if (hit) break;
 *     tern_stop_flush(st, &s, &len);  send(s, len);   (no stop seen)
 */
#ifndef TERN_TEXT_STOP_H
#define TERN_TEXT_STOP_H

#include <stddef.h>

#include "tern.h"

typedef struct tern_stop tern_stop;

/* Copies the n stop strings (NUL-terminated, non-empty, valid UTF-8). n may
 * be 0: then everything is released at once. */
tern_stop *tern_stop_create(const char *const *stops, size_t n, tern_error *err);
void tern_stop_free(tern_stop *st);

/* Feeds a chunk. *text and *text_len get the released text, valid until the next
 * call. Returns 1 when a stop string completed (*which = its index; the text
 * released is everything before it), 0 otherwise, -1 when out of memory.
 * Once stopped, further pushes release nothing and return 1 again. which may
 * be NULL. */
int tern_stop_push(tern_stop *st, const char *chunk, size_t len, const char **text,
                   size_t *text_len, int *which);

/* End of stream without a stop: releases what is held. */
void tern_stop_flush(tern_stop *st, const char **text, size_t *len);

/* Bytes held back now. */
size_t tern_stop_held(const tern_stop *st);

/* Forgets the stream (held text and a stop) to start a new one. */
void tern_stop_reset(tern_stop *st);

#endif
