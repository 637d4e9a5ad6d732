#include "text/chat_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* ---- buffer -------------------------------------------------------------- */

static int chat_buf_reserve(chat_buf *b, size_t extra, tern_error *err) {
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return tern_fail(err, "out of memory (text buffer of %zu bytes)", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int chat_buf_append(chat_buf *b, const char *s, size_t n, tern_error *err) {
    if (chat_buf_reserve(b, n, err)) return -1;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int chat_buf_puts(chat_buf *b, const char *s, tern_error *err) {
    return chat_buf_append(b, s, strlen(s), err);
}

char *chat_buf_take(chat_buf *b, tern_error *err) {
    if (chat_buf_reserve(b, 0, err)) return NULL;
    char *s = b->data;
    s[b->len] = '\0';
    *b = (chat_buf){0};
    return s;
}

void chat_buf_free(chat_buf *b) {
    free(b->data);
    *b = (chat_buf){0};
}

/* ---- Python float repr --------------------------------------------------- */

/* Shortest decimal digits that read back as v (what Python's repr uses):
 * digits without a dot into `digits`, and the exponent of the first digit. */
static void shortest_digits(double v, char digits[20], int *exp10) {
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v || prec == 17) break;
    }
    /* tmp is "d.ddddde±XX" (v > 0 here). */
    char *e = strchr(tmp, 'e');
    *exp10 = atoi(e + 1);
    int n = 0;
    for (char *p = tmp; p < e; p++)
        if (*p != '.') digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = '\0';
}

void chat_json_format_double(double v, char out[32]) {
    if (isnan(v)) { strcpy(out, "NaN"); return; }
    if (isinf(v)) { strcpy(out, v < 0 ? "-Infinity" : "Infinity"); return; }
    char *o = out;
    if (signbit(v)) { *o++ = '-'; v = -v; }
    if (v == 0) { strcpy(o, "0.0"); return; }
    char d[20];
    int e;
    shortest_digits(v, d, &e);
    int nd = (int)strlen(d), decpt = e + 1;
    /* Python switches to exponent form outside 1e-4 <= |v| < 1e16. */
    if (decpt <= -4 || decpt > 16) {
        *o++ = d[0];
        if (nd > 1) { *o++ = '.'; memcpy(o, d + 1, nd - 1); o += nd - 1; }
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) {
        *o++ = '0'; *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        strcpy(o, d);
    } else if (decpt < nd) {
        memcpy(o, d, decpt); o += decpt;
        *o++ = '.';
        strcpy(o, d + decpt);
    } else {
        memcpy(o, d, nd); o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        strcpy(o, ".0");
    }
}

/* ---- json.dumps ---------------------------------------------------------- */

/* json.dumps escapes only '"', '\\' and control characters below 0x20
 * (with ensure_ascii=False everything else, DEL included, stays raw). */
static int dump_string(chat_buf *b, const char *s, size_t n, tern_error *err) {
    if (chat_buf_append(b, "\"", 1, err)) return -1;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (chat_buf_append(b, s + run, i - run, err)) return -1;
        char esc[8];
        switch (c) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", c); break;
        }
        if (chat_buf_puts(b, esc, err)) return -1;
        run = i + 1;
    }
    if (chat_buf_append(b, s + run, n - run, err)) return -1;
    return chat_buf_append(b, "\"", 1, err);
}

static int dump_array(chat_buf *b, json_t *x, tern_error *err) {
    if (chat_buf_puts(b, "[", err)) return -1;
    size_t i;
    json_t *v;
    json_array_foreach(x, i, v) {
        if (i && chat_buf_puts(b, ", ", err)) return -1;
        if (chat_json_dump_py(b, v, err)) return -1;
    }
    return chat_buf_puts(b, "]", err);
}

static int dump_object(chat_buf *b, json_t *x, tern_error *err) {
    if (chat_buf_puts(b, "{", err)) return -1;
    /* jansson keeps object keys in insertion order, as Python dicts do. */
    const char *key;
    json_t *v;
    int first = 1;
    json_object_foreach(x, key, v) {
        if (!first && chat_buf_puts(b, ", ", err)) return -1;
        first = 0;
        if (dump_string(b, key, strlen(key), err)) return -1;
        if (chat_buf_puts(b, ": ", err)) return -1;
        if (chat_json_dump_py(b, v, err)) return -1;
    }
    return chat_buf_puts(b, "}", err);
}

int chat_json_put_number(chat_buf *b, json_t *x, tern_error *err) {
    char num[40];
    if (json_is_integer(x)) snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(x));
    else chat_json_format_double(json_real_value(x), num);
    return chat_buf_puts(b, num, err);
}

int chat_json_dump_py(chat_buf *b, json_t *x, tern_error *err) {
    switch (json_typeof(x)) {
    case JSON_OBJECT: return dump_object(b, x, err);
    case JSON_ARRAY: return dump_array(b, x, err);
    case JSON_STRING:
        return dump_string(b, json_string_value(x), json_string_length(x), err);
    case JSON_INTEGER:
    case JSON_REAL: return chat_json_put_number(b, x, err);
    case JSON_TRUE: return chat_buf_puts(b, "true", err);
    case JSON_FALSE: return chat_buf_puts(b, "false", err);
    case JSON_NULL: return chat_buf_puts(b, "null", err);
    }
    return tern_fail(err, "unknown JSON value type");
}
