#include "text/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Bounds of the second byte for each lead byte (RFC 3629 table 3-7): these
 * are what exclude overlongs, surrogates and > U+10FFFF. 0 = not a lead. */
static int lead_info(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

int tern_utf8_decode(const char *s, size_t len, uint32_t *cp) {
    if (len == 0) return 0;
    const unsigned char *u = (const unsigned char *)s;
    unsigned char lo, hi;
    int n = lead_info(u[0], &lo, &hi);
    if (n == 0 || (size_t)n > len) return 0;
    if (n == 1) {
        *cp = u[0];
        return 1;
    }
    if (u[1] < lo || u[1] > hi) return 0;
    uint32_t c = u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (u[i] & 0x3F);
    }
    *cp = c;
    return n;
}

size_t tern_utf8_valid_prefix(const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        /* ASCII runs are the common case: check 8 bytes at a time. */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int n = tern_utf8_decode(s + i, len - i, &cp);
        if (n == 0) return i;
        i += (size_t)n;
    }
    return len;
}

int tern_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tern_utf8_maximal_subpart(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char lo, hi;
    int n = lead_info(u[0], &lo, &hi);
    if (n <= 1) return 1;
    size_t k = 1;
    if (k < len && u[k] >= lo && u[k] <= hi) {
        k++;
        while (k < (size_t)n && k < len && (u[k] & 0xC0) == 0x80) k++;
    }
    return k;
}

size_t tern_utf8_incomplete_tail(const char *s, size_t len) {
    /* A sequence is at most 4 bytes, so only the last 3 can be an unfinished
     * start. Look for the lead byte and check that what follows is a valid
     * prefix of its sequence. */
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        size_t at = len - back;
        unsigned char lo, hi;
        int n = lead_info(u[at], &lo, &hi);
        if (n == 0) {
            if ((u[at] & 0xC0) == 0x80) continue;   /* continuation: go further back */
            return 0;
        }
        if (n == 1 || (size_t)n <= back) return 0;   /* complete (or ASCII) */
        if (back >= 2 && (u[at + 1] < lo || u[at + 1] > hi)) return 0;
        for (size_t i = 2; i < back; i++)
            if ((u[at + i] & 0xC0) != 0x80) return 0;
        return back;
    }
    return 0;
}

char *tern_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    /* Worst case every byte becomes 3 bytes of U+FFFD. */
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        uint32_t cp;
        int n = tern_utf8_decode(s + i, len - i, &cp);
        if (n > 0) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += tern_utf8_maximal_subpart(s + i, len - i);
        }
    }
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}
