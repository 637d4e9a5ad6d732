/* Tokenizer, streaming detokenizer and stop-string tests.
 *
 * Expected ids come from Hugging Face `tokenizers` (tools/tokenizer/
 * make_fixtures.py writes tests/fixtures/tokenizer/cases.json); the real
 * Qwen3.5/3.6 vocabulary is tested only when TERN_QWEN_TOKENIZER names a
 * directory made by tools/tokenizer/fetch_qwen_tokenizer.sh. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "text/detok.h"
#include "text/stop.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

#define FIX "tests/fixtures/tokenizer/"

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    cr_assert_not_null(j, "%s:%d: %s", path, je.line, je.text);
    return j;
}

static tern_tokenizer *load_tok(const char *dir) {
    tern_error err = {{0}};
    tern_tokenizer *t = tern_tokenizer_load(dir, &err);
    cr_assert_not_null(t, "load %s: %s", dir, err.msg);
    return t;
}

/* Prints a text with escapes so a failing case can be read. */
static const char *show(const char *s, size_t n) {
    static char buf[400];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < sizeof buf; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F) buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* Encodes every {"text", "ids"} case and compares; returns the number
 * checked. */
static size_t check_cases(tern_tokenizer *t, json_t *cases, unsigned flags, const char *what) {
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *jt = json_object_get(c, "text"), *jids = json_object_get(c, "ids");
        const char *text = json_string_value(jt);
        size_t len = json_string_length(jt);
        int32_t *ids = NULL;
        size_t n = 0;
        tern_error err = {{0}};
        cr_assert_eq(tern_tokenizer_encode(t, text, len, flags, &ids, &n, &err), 0,
                     "%s case %zu: %s", what, i, err.msg);
        size_t want = json_array_size(jids);
        size_t k = 0;
        while (k < n && k < want && ids[k] == json_integer_value(json_array_get(jids, k))) k++;
        cr_assert(k == n && k == want,
                  "%s case %zu \"%s\": %zu ids, want %zu; first difference at %zu (got %d, want %d)",
                  what, i, show(text, len), n, want, k, k < n ? ids[k] : -1,
                  k < want ? (int)json_integer_value(json_array_get(jids, k)) : -1);
        free(ids);
    }
    return i;
}

Test(tokenizer, qwen_like_matches_hf) {
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    json_t *set = json_object_get(all, "qwen-like");
    cr_assert_gt(check_cases(t, json_object_get(set, "cases"), 0, "qwen-like"), 150);
    cr_assert_gt(check_cases(t, json_object_get(set, "split_special"), TERN_ENCODE_SPLIT_SPECIAL,
                             "qwen-like split-special"), 10);
    tern_tokenizer_free(t);
    json_decref(all);
}

/* ByteLevel(use_regex=true), "a b" merges, and added tokens with lstrip,
 * rstrip, single_word and normalized=true. */
Test(tokenizer, legacy_matches_hf) {
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(FIX "legacy");
    json_t *set = json_object_get(all, "legacy");
    cr_assert_gt(check_cases(t, json_object_get(set, "cases"), 0, "legacy"), 150);
    cr_assert_gt(check_cases(t, json_object_get(set, "split_special"), TERN_ENCODE_SPLIT_SPECIAL,
                             "legacy split-special"), 10);
    tern_tokenizer_free(t);
    json_decref(all);
}

/* ---- the ~1 MB document ------------------------------------------------- */

/* Same generator as make_document() in tools/tokenizer/make_fixtures.py. */
static char *make_document(json_t *doc, size_t *len) {
    json_t *frags = json_object_get(doc, "fragments"), *seps = json_object_get(doc, "separators");
    size_t nbytes = 1u << 20, cap = nbytes + 4096, n = 0;
    char *s = malloc(cap);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    while (n < nbytes) {
        json_t *parts[2] = {frags, seps};
        for (int p = 0; p < 2; p++) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            uint64_t r = x * 0x2545F4914F6CDD1Dull;
            json_t *str = json_array_get(parts[p], r % json_array_size(parts[p]));
            size_t l = json_string_length(str);
            if (n + l > cap) s = realloc(s, cap = 2 * (n + l));
            memcpy(s + n, json_string_value(str), l);
            n += l;
        }
    }
    *len = n;
    return s;
}

/* 64-bit FNV-1a of the ids as little-endian int32 (a hash instead of a
 * megabyte of expected ids in the repository). */
static uint64_t fnv1a_ids(const int32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= ((uint32_t)ids[i] >> (8 * b)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    return h;
}

static void check_document(const char *dir, json_t *doc, json_t *expect) {
    size_t len;
    char *text = make_document(doc, &len);
    cr_assert_eq(len, (size_t)json_integer_value(json_object_get(doc, "bytes")),
                 "document length differs from the Python generator");
    tern_tokenizer *t = load_tok(dir);
    int32_t *ids;
    size_t n;
    tern_error err = {{0}};
    cr_assert_eq(tern_tokenizer_encode(t, text, len, 0, &ids, &n, &err), 0, "%s", err.msg);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a_ids(ids, n));
    cr_assert_eq(n, (size_t)json_integer_value(json_object_get(expect, "n_ids")), "%s: id count",
                 dir);
    cr_assert_str_eq(hex, json_string_value(json_object_get(expect, "fnv1a64")), "%s: id hash", dir);
    free(ids);
    free(text);
    tern_tokenizer_free(t);
}

Test(tokenizer, megabyte_document_matches_hf) {
    json_t *all = load_json(FIX "cases.json");
    json_t *doc = json_object_get(all, "document");
    check_document(FIX "qwen-like", doc, json_object_get(doc, "qwen-like"));
    check_document(FIX "legacy", doc, json_object_get(doc, "legacy"));
    json_decref(all);
}

/* ---- decode ------------------------------------------------------------- */

static char *nfc(const char *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    cr_assert_geq(r, 0);
    *out_len = (size_t)r;
    return (char *)d;
}

Test(tokenizer, decode_of_encode_is_nfc) {
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    json_t *cases = json_object_get(json_object_get(all, "qwen-like"), "cases"), *c;
    size_t i;
    json_array_foreach(cases, i, c) {
        json_t *jt = json_object_get(c, "text");
        int32_t *ids;
        size_t n, dl, nl;
        char *back;
        tern_error err = {{0}};
        cr_assert_eq(tern_tokenizer_encode(t, json_string_value(jt), json_string_length(jt), 0, &ids,
                                           &n, &err), 0, "%s", err.msg);
        cr_assert_eq(tern_tokenizer_decode(t, ids, n, 0, &back, &dl, &err), 0, "%s", err.msg);
        char *want = nfc(json_string_value(jt), json_string_length(jt), &nl);
        cr_assert(dl == nl && memcmp(back, want, nl) == 0, "case %zu: \"%s\" does not round-trip",
                  i, show(json_string_value(jt), json_string_length(jt)));
        free(want);
        free(back);
        free(ids);
    }
    tern_tokenizer_free(t);
    json_decref(all);
}

/* HF decodes the bytes and replaces invalid UTF-8 (from_utf8_lossy);
 * decode + tern_utf8_sanitize must give the same text. */
Test(tokenizer, decode_matches_hf) {
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    json_t *cases = json_object_get(all, "decode"), *c;
    size_t i;
    json_array_foreach(cases, i, c) {
        json_t *jids = json_object_get(c, "ids"), *jt = json_object_get(c, "text");
        size_t n = json_array_size(jids), dl, sl;
        int32_t ids[64];
        for (size_t k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
        char *raw;
        tern_error err = {{0}};
        cr_assert_eq(tern_tokenizer_decode(t, ids, n, 0, &raw, &dl, &err), 0, "%s", err.msg);
        char *text = tern_utf8_sanitize(raw, dl, &sl);
        cr_assert(sl == json_string_length(jt) && memcmp(text, json_string_value(jt), sl) == 0,
                  "decode case %zu: got \"%s\"", i, show(text, sl));
        free(text);
        free(raw);
    }
    tern_tokenizer_free(t);
    json_decref(all);
}

Test(tokenizer, decode_skip_special_and_bad_id) {
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    int32_t im_start = tern_tokenizer_token_id(t, "<|im_start|>");
    int32_t think = tern_tokenizer_token_id(t, "<think>");
    int32_t a = tern_tokenizer_token_id(t, "a");
    cr_assert(im_start >= 0 && think >= 0 && a >= 0);
    int32_t ids[] = {im_start, a, think, a};
    char *s;
    size_t n;
    tern_error err = {{0}};
    cr_assert_eq(tern_tokenizer_decode(t, ids, 4, 1, &s, &n, &err), 0);
    cr_assert_str_eq(s, "a<think>a");   /* <think> is added but not special */
    free(s);
    cr_assert_eq(tern_tokenizer_decode(t, ids, 4, 0, &s, &n, &err), 0);
    cr_assert_str_eq(s, "<|im_start|>a<think>a");
    free(s);
    int32_t bad[] = {a, tern_tokenizer_vocab_size(t)};
    cr_assert_eq(tern_tokenizer_decode(t, bad, 2, 0, &s, &n, &err), -1);
    cr_assert(strstr(err.msg, "position 1"), "%s", err.msg);
    tern_tokenizer_free(t);
}

/* ---- lookups and config ------------------------------------------------- */

Test(tokenizer, lookups_and_config) {
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    cr_assert_eq(tern_tokenizer_vocab_size(t), 3009);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|endoftext|>"), 3000);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|im_end|>"), 3002);
    cr_assert_eq(tern_tokenizer_token_id(t, "</think>"), 3008);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|nope|>"), -1);
    cr_assert_eq(tern_tokenizer_eos_id(t), 3002);
    cr_assert_eq(tern_tokenizer_pad_id(t), 3000);
    cr_assert_eq(tern_tokenizer_bos_id(t), -1);
    cr_assert_eq(tern_tokenizer_is_added(t, 3002), 2);
    cr_assert_eq(tern_tokenizer_is_added(t, 3007), 1);
    cr_assert_eq(tern_tokenizer_is_added(t, 5), 0);
    /* byte-level spelling vs bytes: "Ġ" is the space byte */
    int32_t sp = tern_tokenizer_token_id(t, "\xC4\xA0");
    cr_assert_geq(sp, 0);
    size_t n;
    const char *b = tern_tokenizer_token_bytes(t, sp, &n);
    cr_assert(n == 1 && b[0] == ' ');
    cr_assert_str_eq(tern_tokenizer_token_text(t, sp), "\xC4\xA0");
    cr_assert_str_eq(tern_tokenizer_token_text(t, 3001), "<|im_start|>");
    cr_assert_null(tern_tokenizer_token_text(t, 3009));
    cr_assert_null(tern_tokenizer_token_bytes(t, -1, &n));
    tern_tokenizer_free(t);
}

Test(tokenizer, encode_append_concatenates) {
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    int32_t *all = NULL, *one;
    size_t n = 0, cap = 0, n1;
    tern_error err = {{0}};
    cr_assert_eq(tern_tokenizer_encode_append(t, "<|im_start|>", 12, 0, &all, &n, &cap, &err), 0);
    cr_assert_eq(tern_tokenizer_encode_append(t, "user\nhi", 7, 0, &all, &n, &cap, &err), 0);
    cr_assert_eq(tern_tokenizer_encode(t, "<|im_start|>user\nhi", 19, 0, &one, &n1, &err), 0);
    cr_assert_eq(n, n1);
    cr_assert_arr_eq(all, one, n * sizeof *one);
    /* a failed append leaves the array as it was */
    cr_assert_eq(tern_tokenizer_encode_append(t, "x\xFF", 2, 0, &all, &n, &cap, &err), -1);
    cr_assert_eq(n, n1);
    free(all);
    free(one);
    tern_tokenizer_free(t);
}

/* ---- invalid UTF-8 ------------------------------------------------------ */

Test(tokenizer, invalid_utf8_is_rejected) {
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    struct { const char *s; size_t len, at; } bad[] = {
        {"ab\xFF", 3, 2},             /* never valid */
        {"a\xC3", 2, 1},              /* truncated */
        {"\xC0\xAF", 2, 0},           /* overlong '/' */
        {"x\xED\xA0\x80", 4, 1},      /* surrogate U+D800 */
        {"xy\xF4\x90\x80\x80", 6, 2}, /* U+110000 */
        {"ok\x80", 3, 2},             /* lone continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n;
        tern_error err = {{0}};
        cr_assert_eq(tern_tokenizer_encode(t, bad[i].s, bad[i].len, 0, &ids, &n, &err), -1,
                     "case %zu accepted", i);
        char want[64];
        snprintf(want, sizeof want, "invalid UTF-8 at byte %zu", bad[i].at);
        cr_assert(strstr(err.msg, want), "case %zu: %s", i, err.msg);
        /* sanitizing first gives the ids of the text with U+FFFD */
        size_t sl;
        char *clean = tern_utf8_sanitize(bad[i].s, bad[i].len, &sl);
        cr_assert_eq(tern_tokenizer_encode(t, clean, sl, 0, &ids, &n, &err), 0, "%s", err.msg);
        cr_assert_gt(n, 0);
        free(ids);
        free(clean);
    }
    tern_tokenizer_free(t);
}

Test(tokenizer, sanitize_replaces_maximal_subparts) {
    /* Unicode's recommended practice (Python errors="replace"): one U+FFFD
     * per maximal subpart. */
    size_t n;
    char *s = tern_utf8_sanitize("a\xF0\x9F\x94" "b\xE2\x82\xAC\xC0\xAF" "c\xED\xA0\x80", 14, &n);
    cr_assert_str_eq(s, "a\xEF\xBF\xBD" "b\xE2\x82\xAC\xEF\xBF\xBD\xEF\xBF\xBD" "c"
                        "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
}

/* ---- unsupported files fail with the field named ------------------------ */

static const char *BASE_JSON =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
    "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":"
    "{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"%s\",\"byte_fallback\":%s,"
    "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[%s]}}";

static char *write_tokenizer(const char *normalizer, const char *pre, const char *model,
                             const char *byte_fallback, const char *merges) {
    char *dir = strdup("/tmp/tern-tok-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, BASE_JSON, normalizer, pre, model, byte_fallback, merges);
    fclose(f);
    return dir;
}

static void remove_dir(char *dir) {
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    free(dir);
}

Test(tokenizer, unsupported_features_name_the_field) {
    const char *bl = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
    struct {
        const char *norm, *pre, *model, *fallback, *merges, *want;
    } c[] = {
        {"null", bl, "BPE", "false", "\"a b\"", NULL},
        {"null", bl, "BPE", "false", "[\"a\",\"b\"]", NULL},
        {"{\"type\":\"NFKC\"}", bl, "BPE", "false", "", "normalizer.type 'NFKC'"},
        {"null", "{\"type\":\"Metaspace\"}", "BPE", "false", "", "pre_tokenizer.type 'Metaspace'"},
        {"null", "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", "BPE", "false", "",
         "add_prefix_space"},
        {"null", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                 "{\"Regex\":\"a\"},\"behavior\":\"Removed\",\"invert\":false},"
                 "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
         "BPE", "false", "", "behavior 'Removed'"},
        {"null", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                 "{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false},"
                 "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
         "BPE", "false", "", "regex does not compile"},
        {"null", bl, "WordPiece", "false", "", "model.type 'WordPiece'"},
        {"null", bl, "BPE", "true", "", "byte_fallback"},
        {"null", bl, "BPE", "false", "\"a c\"", "merges[0]: 'c' is not in the vocabulary"},
        {"null", bl, "BPE", "false", "\"b a\"", "merges[0]: the merge of 'b' and 'a'"},
        {"null", bl, "BPE", "false", "\"a b c\"", "merges[0]"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char *dir = write_tokenizer(c[i].norm, c[i].pre, c[i].model, c[i].fallback, c[i].merges);
        tern_error err = {{0}};
        tern_tokenizer *t = tern_tokenizer_load(dir, &err);
        if (!c[i].want) {
            cr_assert_not_null(t, "case %zu: %s", i, err.msg);
            int32_t *ids;
            size_t n;
            cr_assert_eq(tern_tokenizer_encode(t, "ab", 2, 0, &ids, &n, &err), 0);
            cr_assert(n == 1 && ids[0] == 2, "case %zu: merge not applied", i);
            free(ids);
            tern_tokenizer_free(t);
        } else {
            cr_assert_null(t, "case %zu loaded", i);
            cr_assert(strstr(err.msg, c[i].want), "case %zu: \"%s\" lacks \"%s\"", i, err.msg,
                      c[i].want);
        }
        remove_dir(dir);
    }
    tern_error err = {{0}};
    cr_assert_null(tern_tokenizer_load("/nonexistent-dir", &err));
    cr_assert(strstr(err.msg, "/nonexistent-dir/tokenizer.json"), "%s", err.msg);
}

/* ---- threads ------------------------------------------------------------ */

struct job { tern_tokenizer *t; const char *text; size_t len; int32_t *ids; size_t n; int rc; };

static void *encode_job(void *p) {
    struct job *j = p;
    tern_error err;
    j->rc = tern_tokenizer_encode(j->t, j->text, j->len, 0, &j->ids, &j->n, &err);
    return NULL;
}

Test(tokenizer, concurrent_encode_agrees) {
    json_t *all = load_json(FIX "cases.json");
    size_t len;
    char *text = make_document(json_object_get(all, "document"), &len);
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    struct job j[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        j[i] = (struct job){t, text, len, NULL, 0, -1};
        pthread_create(&th[i], NULL, encode_job, &j[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(j[i].rc, 0);
        cr_assert_eq(j[i].n, j[0].n);
        cr_assert_arr_eq(j[i].ids, j[0].ids, j[0].n * sizeof(int32_t));
    }
    for (int i = 0; i < 4; i++) free(j[i].ids);
    free(text);
    tern_tokenizer_free(t);
    json_decref(all);
}

/* ---- the real Qwen3.5/3.6 vocabulary (opt-in) --------------------------- */

static const char *qwen_dir(void) {
    const char *d = getenv("TERN_QWEN_TOKENIZER");
    if (!d || !*d) {
        cr_skip("TERN_QWEN_TOKENIZER not set (tools/tokenizer/fetch_qwen_tokenizer.sh makes one)");
        return NULL;
    }
    return d;
}

/* Public Qwen3.5 base vectors (see the file's "note" for what was left out). */
Test(tokenizer, qwen35_public_vectors) {
    const char *dir = qwen_dir();
    if (!dir) return;
    json_t *v = load_json(FIX "qwen35-base-vectors.json");
    tern_tokenizer *t = load_tok(dir);
    cr_assert_gt(check_cases(t, json_object_get(v, "cases"), 0, "qwen35-base"), 150);
    tern_tokenizer_free(t);
    json_decref(v);
}

/* Ids of the fixture cases and the 1 MB document with the real vocabulary,
 * as HF encodes them (tools/tokenizer/make_qwen_expectations.py). */
Test(tokenizer, qwen36_matches_hf) {
    const char *dir = qwen_dir();
    if (!dir) return;
    json_t *e = load_json(FIX "qwen36-expect.json");
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(dir);
    cr_assert_eq(tern_tokenizer_vocab_size(t), 248077);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|endoftext|>"), 248044);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|im_start|>"), 248045);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|im_end|>"), 248046);
    cr_assert_eq(tern_tokenizer_token_id(t, "<think>"), 248068);
    cr_assert_eq(tern_tokenizer_token_id(t, "</think>"), 248069);
    cr_assert_eq(tern_tokenizer_token_id(t, "<|audio_pad|>"), 248076);
    cr_assert_eq(tern_tokenizer_eos_id(t), 248046);
    cr_assert_gt(check_cases(t, json_object_get(e, "cases"), 0, "qwen36"), 150);
    tern_tokenizer_free(t);
    json_t *doc = json_object_get(all, "document");
    check_document(dir, doc, json_object_get(e, "document"));
    json_decref(all);
    json_decref(e);
}

/* ---- streaming detokenizer ---------------------------------------------- */

/* Feeds ids one by one and checks, after every id, that exactly the complete
 * part of the stream has come out: the sanitized bytes of ids[0..k] minus an
 * unfinished character at the end. After flush the whole output must equal
 * `want` (HF's decode) when given. */
static void check_stream(tern_tokenizer *t, const int32_t *ids, size_t n, const char *want,
                         size_t want_len) {
    tern_error err = {{0}};
    tern_detok *d = tern_detok_create(t, 0, &err);
    cr_assert_not_null(d);
    char *got = malloc(16 * n * 64 + 16);
    size_t gl = 0;
    for (size_t k = 0; k < n; k++) {
        const char *s;
        size_t l;
        cr_assert_eq(tern_detok_push(d, ids[k], &s, &l, &err), 0, "%s", err.msg);
        cr_assert_eq(tern_utf8_valid_prefix(s, l), l, "emitted invalid UTF-8 at id %zu", k);
        memcpy(got + gl, s, l);
        gl += l;
        char *raw;
        size_t rl, el;
        cr_assert_eq(tern_tokenizer_decode(t, ids, k + 1, 0, &raw, &rl, &err), 0);
        size_t tail = tern_utf8_incomplete_tail(raw, rl);
        char *exp = tern_utf8_sanitize(raw, rl - tail, &el);
        cr_assert(gl == el && memcmp(got, exp, el) == 0,
                  "after id %zu: emitted \"%s\"", k, show(got, gl));
        free(exp);
        free(raw);
    }
    const char *s;
    size_t l;
    tern_detok_flush(d, &s, &l);
    memcpy(got + gl, s, l);
    gl += l;
    if (want)
        cr_assert(gl == want_len && memcmp(got, want, gl) == 0, "stream gave \"%s\"", show(got, gl));
    free(got);
    tern_detok_free(d);
}

Test(tokenizer, detok_stream_matches_hf_decode) {
    json_t *all = load_json(FIX "cases.json");
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(all, "decode"), i, c) {
        json_t *jids = json_object_get(c, "ids"), *jt = json_object_get(c, "text");
        int32_t ids[64];
        size_t n = json_array_size(jids);
        for (size_t k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
        check_stream(t, ids, n, json_string_value(jt), json_string_length(jt));
    }
    /* encoded multilingual text: each character split over tokens comes out
     * whole */
    json_array_foreach(json_object_get(json_object_get(all, "qwen-like"), "cases"), i, c) {
        json_t *jt = json_object_get(c, "text"), *jids = json_object_get(c, "ids");
        size_t n = json_array_size(jids);
        if (n > 200) continue;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));
        size_t nl;
        char *want = nfc(json_string_value(jt), json_string_length(jt), &nl);
        check_stream(t, ids, n, want, nl);
        free(want);
        free(ids);
    }
    tern_tokenizer_free(t);
    json_decref(all);
}

/* One byte per token: every split point of 4-, 3- and 2-byte characters,
 * and broken sequences. */
Test(tokenizer, detok_holds_partial_characters) {
    tern_tokenizer *t = load_tok(FIX "qwen-like");
    const char *streams[] = {
        "a\xF0\x9F\x94\xA5" "b",               /* fire emoji, 4 bytes */
        "\xE4\xB8\xAD\xE6\x96\x87",            /* 2 CJK characters */
        "\xC3\xA9\xC3",                        /* e-acute, then a truncated one at the end */
        "\xF0\x9F\x94" "x\xE2\x82" "\xE2\x82\xAC",   /* broken, then a complete euro sign */
        "\x80\xBF\xC0\xAF\xED\xA0\x80",        /* lone continuations, overlong, surrogate */
    };
    for (size_t s = 0; s < sizeof streams / sizeof streams[0]; s++) {
        size_t n = strlen(streams[s]);
        int32_t ids[32];
        for (size_t k = 0; k < n; k++) {
            char one = streams[s][k];
            size_t bl;
            /* the single-byte token for this byte */
            int32_t id = -1;
            for (int32_t v = 0; v < tern_tokenizer_vocab_size(t) && id < 0; v++) {
                const char *b = tern_tokenizer_token_bytes(t, v, &bl);
                if (b && bl == 1 && b[0] == one) id = v;
            }
            cr_assert_geq(id, 0);
            ids[k] = id;
        }
        size_t wl;
        char *want = tern_utf8_sanitize(streams[s], n, &wl);
        check_stream(t, ids, n, want, wl);
        free(want);
    }
    tern_error err = {{0}};
    tern_detok *d = tern_detok_create(t, 1, &err);
    const char *s;
    size_t l;
    cr_assert_eq(tern_detok_push(d, tern_tokenizer_token_id(t, "<|im_end|>"), &s, &l, &err), 0);
    cr_assert_eq(l, 0, "special token not skipped");
    cr_assert_eq(tern_detok_push(d, tern_tokenizer_token_id(t, "<think>"), &s, &l, &err), 0);
    cr_assert(l == 7 && memcmp(s, "<think>", 7) == 0);
    cr_assert_eq(tern_detok_push(d, 99999, &s, &l, &err), -1);
    cr_assert(strstr(err.msg, "99999"), "%s", err.msg);
    tern_detok_free(d);
    tern_tokenizer_free(t);
}

/* ---- stop strings ------------------------------------------------------- */

/* The longest tail of s[0..n) that is a proper prefix of some stop string,
 * by brute force: what the matcher must hold back. */
static size_t held_reference(const char *s, size_t n, const char *const *stops, size_t ns) {
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < ns; k++) {
            size_t sl = strlen(stops[k]);
            if (n - i < sl && memcmp(s + i, stops[k], n - i) == 0) return n - i;
        }
    return 0;
}

/* Where the first stop string completes when text arrives in one piece:
 * the smallest end position, then the earliest start. */
static int first_stop(const char *s, size_t n, const char *const *stops, size_t ns, size_t *at) {
    for (size_t end = 1; end <= n; end++)
        for (size_t i = 0; i < end; i++)
            for (size_t k = 0; k < ns; k++) {
                size_t sl = strlen(stops[k]);
                if (end - i == sl && memcmp(s + i, stops[k], sl) == 0) {
                    *at = i;
                    return (int)k;
                }
            }
    return -1;
}

/* Feeds text split at the given cut points and checks released text and
 * what is held after every chunk. */
static void check_stop_split(const char *text, const char *const *stops, size_t ns,
                             const size_t *cuts, size_t ncuts) {
    size_t n = strlen(text), at = 0;
    int want_stop = first_stop(text, n, stops, ns, &at);
    tern_error err = {{0}};
    tern_stop *st = tern_stop_create(stops, ns, &err);
    cr_assert_not_null(st, "%s", err.msg);
    char out[512];
    size_t ol = 0, fed = 0;
    int hit = 0, which = -1;
    for (size_t c = 0; c <= ncuts && !hit; c++) {
        size_t end = c < ncuts ? cuts[c] : n;
        const char *s;
        size_t l;
        hit = tern_stop_push(st, text + fed, end - fed, &s, &l, &which);
        memcpy(out + ol, s, l);
        ol += l;
        fed = end;
        if (!hit) {
            /* everything fed is out or held, and only a stop prefix is held */
            size_t held = held_reference(text, fed, stops, ns);
            cr_assert_eq(ol + tern_stop_held(st), fed);
            cr_assert_eq(tern_stop_held(st), held, "\"%s\" fed %zu: holds %zu, want %zu", text,
                         fed, tern_stop_held(st), held);
        }
    }
    if (!hit) {
        const char *s;
        size_t l;
        tern_stop_flush(st, &s, &l);
        memcpy(out + ol, s, l);
        ol += l;
    }
    cr_assert_eq(hit ? which : -1, want_stop, "\"%s\": stop %d, want %d", text, hit ? which : -1,
                 want_stop);
    size_t want_len = want_stop >= 0 ? at : n;
    cr_assert(ol == want_len && memcmp(out, text, ol) == 0, "\"%s\": released \"%.*s\"", text,
              (int)ol, out);
    tern_stop_free(st);
}

Test(tokenizer, stop_strings_every_split) {
    const char *stops[] = {"</answer>", "\n\nUser:", "STOP", "\xE2\x82\xAC\xE2\x82\xAC"};
    const char *texts[] = {
        "plain text with no stop at all",
        "the answer is 42</answer> and more",
        "almost </answ but not quite </answer",
        "</an</answer>",
        "SSTOP",
        "STO STOP",
        "line\n\nUser: hi",
        "\n\nUse\n\nUser:",
        "price 3\xE2\x82\xAC\xE2\x82\xAC! ",
        "\xE2\x82\xAC\xE2\x82 \xE2\x82\xAC",
        "ends with a prefix </answ",
    };
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        size_t n = strlen(texts[t]);
        check_stop_split(texts[t], stops, 4, NULL, 0);
        for (size_t a = 1; a < n; a++) {            /* every single split */
            size_t cut1[] = {a};
            check_stop_split(texts[t], stops, 4, cut1, 1);
            for (size_t b = a + 1; b < n; b++) {    /* every pair of splits */
                size_t cut2[] = {a, b};
                check_stop_split(texts[t], stops, 4, cut2, 2);
            }
        }
        size_t bytes[64];                           /* one byte at a time */
        for (size_t k = 1; k < n; k++) bytes[k - 1] = k;
        check_stop_split(texts[t], stops, 4, bytes, n - 1);
    }
    /* overlapping stops: the one that completes first wins, however cut */
    const char *overlap[] = {"abcd", "bc", "cdx"};
    const char *otexts[] = {"xabcd", "abce", "zzcdx", "abcdx", "ab"};
    for (size_t t = 0; t < sizeof otexts / sizeof otexts[0]; t++) {
        size_t n = strlen(otexts[t]);
        check_stop_split(otexts[t], overlap, 3, NULL, 0);
        for (size_t a = 1; a < n; a++) {
            size_t cut1[] = {a};
            check_stop_split(otexts[t], overlap, 3, cut1, 1);
        }
    }
}

Test(tokenizer, stop_after_stop_and_errors) {
    const char *stops[] = {"xy"};
    tern_error err = {{0}};
    tern_stop *st = tern_stop_create(stops, 1, &err);
    const char *s;
    size_t l;
    int which = -1;
    cr_assert_eq(tern_stop_push(st, "axyb", 4, &s, &l, &which), 1);
    cr_assert(l == 1 && s[0] == 'a' && which == 0);
    cr_assert_eq(tern_stop_push(st, "more", 4, &s, &l, &which), 1);
    cr_assert_eq(l, 0);
    tern_stop_flush(st, &s, &l);
    cr_assert_eq(l, 0);
    tern_stop_reset(st);
    cr_assert_eq(tern_stop_push(st, "ax", 2, &s, &l, NULL), 0);
    cr_assert(l == 1 && tern_stop_held(st) == 1);
    tern_stop_free(st);

    tern_stop *none = tern_stop_create(NULL, 0, &err);
    cr_assert_eq(tern_stop_push(none, "abc", 3, &s, &l, NULL), 0);
    cr_assert_eq(l, 3);
    tern_stop_free(none);

    const char *empty[] = {""};
    cr_assert_null(tern_stop_create(empty, 1, &err));
    cr_assert(strstr(err.msg, "empty"), "%s", err.msg);
    const char *bad[] = {"a\xFF"};
    cr_assert_null(tern_stop_create(bad, 1, &err));
    cr_assert(strstr(err.msg, "UTF-8"), "%s", err.msg);
}
