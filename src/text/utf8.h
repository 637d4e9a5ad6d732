/* UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the
 * stop-string matcher. Strict RFC 3629 decoding: overlong forms, UTF-16
 * surrogates (U+D800..U+DFFF) and code points past U+10FFFF are invalid. */
#ifndef TERN_TEXT_UTF8_H
#define TERN_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid prefix of s: len when all of s is valid UTF-8,
 * otherwise the offset of the first byte that starts an invalid or truncated
 * sequence. */
size_t tern_utf8_valid_prefix(const char *s, size_t len);

/* Decodes the scalar at s[0..len). Returns its length in bytes (1..4) and
 * sets *cp, or returns 0 when s does not start with a complete valid
 * sequence. */
int tern_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Writes cp (must be a Unicode scalar value) to out; returns 1..4. */
int tern_utf8_encode(uint32_t cp, char out[4]);

/* How many bytes at the end of s[0..len) are the start of a valid sequence
 * that is not complete yet (0..3): what a stream must hold back. */
size_t tern_utf8_incomplete_tail(const char *s, size_t len);

/* Length of the maximal subpart at s (1..3 bytes): the longest prefix of a
 * valid sequence that s starts with, at least one byte. This is what gets one
 * U+FFFD when invalid input is replaced (Unicode's recommended practice,
 * which Python's errors="replace" and Rust's from_utf8_lossy follow). Call
 * only where tern_utf8_decode returned 0. */
size_t tern_utf8_maximal_subpart(const char *s, size_t len);

/* Copies s to a malloc'ed, NUL-terminated string with every maximal invalid
 * subpart replaced by U+FFFD (EF BF BD). Returns NULL only when out of
 * memory. *out_len gets the length (may be NULL). */
char *tern_utf8_sanitize(const char *s, size_t len, size_t *out_len);

#endif
