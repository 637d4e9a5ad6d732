/* The tokenizer's loader: tokenizer.json (the BPE model, the added tokens,
 * the normalizer and pre-tokenizer it supports) and tokenizer_config.json
 * (the BOS/EOS/PAD tokens) via jansson, into the tables of tokenizer.c. */
#include "text/tokenizer_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/utf8.h"
#include "util/file.h"

/* The regex ByteLevel(use_regex=true) applies (GPT-2's), as `tokenizers`
 * hard-codes it. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading ------------------------------------------------------------ */

static bool json_flag(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *json_type_of(json_t *o) {
    return json_string_value(json_object_get(o, "type"));
}

/* `\s` and `\S` mean Unicode White_Space in the Oniguruma regexes that
 * `tokenizers` runs; PCRE2's UCP \s also takes U+180E. Rewriting them to the
 * White_Space property (valid inside and outside classes) makes PCRE2 agree. */
static char *rewrite_regex(const char *in, size_t len) {
    char *out = malloc(len * 8 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (in[i] != '\\' || i + 1 >= len) {
            out[o++] = in[i];
            continue;
        }
        char c = in[i + 1];
        if (c == 's' || c == 'S') {
            memcpy(out + o, c == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15);
            o += 15;
            i++;
        } else if (c == 'Q') {          /* \Q...\E is literal: copy as is */
            const char *e = NULL;
            for (size_t j = i + 2; j + 1 < len; j++)
                if (in[j] == '\\' && in[j + 1] == 'E') {
                    e = in + j;
                    break;
                }
            size_t stop = e ? (size_t)(e - in) + 2 : len;
            memcpy(out + o, in + i, stop - i);
            o += stop - i;
            i = stop - 1;
        } else {
            out[o++] = in[i];
            out[o++] = c;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

static int add_regex(tern_tokenizer *t, const char *pat, size_t len, bool literal,
                     const char *where, tern_error *err) {
    char *rewritten = literal ? NULL : rewrite_regex(pat, len);
    if (!literal && !rewritten) return tern_fail(err, "out of memory");
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : rewritten),
                                   literal ? len : PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tern_fail(err, "%s: regex does not compile at offset %zu: %s", where, (size_t)eo,
                         (char *)msg);
    }
    /* JIT is a speed-up only; without it (no JIT on this CPU) the
     * interpreter runs the same pattern. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    uint32_t caps = 0;
    pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &caps);
    if (caps > t->max_captures) t->max_captures = caps;
    pcre2_code **r = realloc(t->re, (t->n_re + 1) * sizeof *r);
    if (!r) {
        pcre2_code_free(re);
        return tern_fail(err, "out of memory");
    }
    t->re = r;
    t->re[t->n_re++] = re;
    return 0;
}

/* ByteLevel: the byte mapping itself needs nothing here (the vocabulary is
 * converted once); use_regex adds the GPT-2 split. */
static int load_byte_level(tern_tokenizer *t, json_t *pt, bool last, const char *where,
                           tern_error *err) {
    if (!last)
        return tern_fail(err, "%s: ByteLevel must be the last pre-tokenizer", where);
    if (json_flag(pt, "add_prefix_space", false))
        return tern_fail(err, "%s.add_prefix_space=true is not supported", where);
    if (json_flag(pt, "use_regex", true))
        return add_regex(t, GPT2_REGEX, strlen(GPT2_REGEX), false, where, err);
    return 0;
}

static int load_split(tern_tokenizer *t, json_t *pt, const char *where, tern_error *err) {
    const char *behavior = json_string_value(json_object_get(pt, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return tern_fail(err, "%s.behavior '%s' is not supported (only Isolated)", where,
                         behavior ? behavior : "(missing)");
    if (json_flag(pt, "invert", false))
        return tern_fail(err, "%s.invert=true is not supported", where);
    json_t *pat = json_object_get(pt, "pattern");
    json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (json_is_string(re))
        return add_regex(t, json_string_value(re), json_string_length(re), false, where, err);
    if (json_is_string(lit))
        return add_regex(t, json_string_value(lit), json_string_length(lit), true, where, err);
    return tern_fail(err, "%s.pattern must be {\"Regex\": ...} or {\"String\": ...}", where);
}

static int load_pre_tokenizer(tern_tokenizer *t, json_t *pt, tern_error *err) {
    const char *type = json_type_of(pt);
    if (json_is_null(pt) || !pt)
        return tern_fail(err, "pre_tokenizer is null; a byte-level BPE needs ByteLevel");
    if (!type) return tern_fail(err, "pre_tokenizer has no type");
    if (strcmp(type, "ByteLevel") == 0) return load_byte_level(t, pt, true, "pre_tokenizer", err);
    if (strcmp(type, "Sequence") != 0)
        return tern_fail(err, "pre_tokenizer.type '%s' is not supported", type);
    json_t *list = json_object_get(pt, "pretokenizers");
    if (!json_is_array(list)) return tern_fail(err, "pre_tokenizer.pretokenizers is not an array");
    size_t n = json_array_size(list);
    bool have_byte_level = false;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(list, i);
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i);
        const char *ty = json_type_of(p);
        int rc;
        if (ty && strcmp(ty, "Split") == 0) {
            rc = load_split(t, p, where, err);
        } else if (ty && strcmp(ty, "ByteLevel") == 0) {
            rc = load_byte_level(t, p, i + 1 == n, where, err);
            have_byte_level = true;
        } else {
            return tern_fail(err, "%s.type '%s' is not supported", where, ty ? ty : "(missing)");
        }
        if (rc) return rc;
    }
    if (!have_byte_level)
        return tern_fail(err, "pre_tokenizer: Sequence without ByteLevel is not supported");
    return 0;
}

static int load_normalizer(tern_tokenizer *t, json_t *nm, const char *where, tern_error *err) {
    if (!nm || json_is_null(nm)) return 0;
    const char *type = json_type_of(nm);
    if (type && strcmp(type, "NFC") == 0) {
        t->nfc = true;
        return 0;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(nm, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[64];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            if (load_normalizer(t, json_array_get(list, i), w, err)) return -1;
        }
        return 0;
    }
    return tern_fail(err, "%s.type '%s' is not supported (only NFC)", where,
                     type ? type : "(missing)");
}

static int check_optional(json_t *root, const char *field, const char *allowed, tern_error *err) {
    json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    const char *type = json_type_of(v);
    if (allowed && type && strcmp(type, allowed) == 0) return 0;
    if (allowed)
        return tern_fail(err, "%s.type '%s' is not supported (only null or %s)", field,
                         type ? type : "(missing)", allowed);
    return tern_fail(err, "%s must be null", field);
}

/* Registers a token: id, bytes, spelling. A token seen twice (an added token
 * that is also in the vocabulary) keeps the added token's entry. */
typedef struct builder {
    char *bytes;
    size_t bytes_len, bytes_cap;
    char *text;
    size_t text_len, text_cap;
} builder;

static int set_token(tern_tokenizer *t, builder *b, int32_t id, const char *bytes, size_t n,
                     const char *text, size_t text_n, uint8_t flags) {
    if (tern_tok_grow((void **)&b->bytes, &b->bytes_cap, b->bytes_len + n, 1) ||
        tern_tok_grow((void **)&b->text, &b->text_cap, b->text_len + text_n + 1, 1))
        return -1;
    token *k = &t->tok[id];
    k->off = (uint32_t)b->bytes_len;
    k->len = (uint32_t)n;
    k->text_off = (uint32_t)b->text_len;
    k->flags = flags;
    if (n) memcpy(b->bytes + b->bytes_len, bytes, n); /* an empty token has no buffer yet */
    b->bytes_len += n;
    memcpy(b->text + b->text_len, text, text_n);
    b->text[b->text_len + text_n] = '\0';
    b->text_len += text_n + 1;
    return 0;
}

/* NFC of s into a malloc'ed string; *out_len its length. */
char *tern_tok_nfc_dup(const char *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return NULL;
    *out_len = (size_t)r;
    return (char *)dst;
}

static int cmp_added(const void *a, const void *b) {
    const added_token *x = *(added_token *const *)a, *y = *(added_token *const *)b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_added_set(tern_tokenizer *t, added_set *set, bool normalized) {
    set->tok = calloc(t->n_added + 1, sizeof *set->tok);
    if (!set->tok) return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].len > 0)
            set->tok[set->n++] = &t->added[i];
    qsort(set->tok, set->n, sizeof *set->tok, cmp_added);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < set->n && (unsigned char)set->tok[j]->content[0] < b) j++;
        set->first[b] = (uint32_t)j;
    }
    return 0;
}

static int load_added_tokens(tern_tokenizer *t, builder *b, json_t *list, tern_error *err) {
    size_t n = json_array_size(list);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return tern_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(list, i);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return tern_fail(err, "added_tokens[%zu] needs an integer id and a string content", i);
        json_int_t v = json_integer_value(id);
        if (v < 0 || v >= t->n_tok)
            return tern_fail(err, "added_tokens[%zu].id %lld out of range", i, (long long)v);
        added_token *a = &t->added[t->n_added++];
        a->id = (int32_t)v;
        a->special = json_flag(o, "special", false);
        a->normalized = json_flag(o, "normalized", !a->special);
        a->single_word = json_flag(o, "single_word", false);
        a->lstrip = json_flag(o, "lstrip", false);
        a->rstrip = json_flag(o, "rstrip", false);
        const char *c = json_string_value(content);
        size_t clen = json_string_length(content);
        uint8_t flags = TOK_PRESENT | TOK_ADDED | (a->special ? TOK_SPECIAL : 0);
        if (set_token(t, b, a->id, c, clen, c, clen, flags)) return tern_fail(err, "out of memory");
        /* Normalized tokens are looked for in NFC'd text, so their content
         * is NFC'd too (as `tokenizers` does with the normalizer). */
        if (a->normalized && t->nfc) {
            a->content = tern_tok_nfc_dup(c, clen, &a->len);
        } else {
            a->content = malloc(clen + 1);
            if (a->content) memcpy(a->content, c, clen + 1);
            a->len = clen;
        }
        if (!a->content) return tern_fail(err, "added_tokens[%zu]: out of memory", i);
    }
    if (build_added_set(t, &t->raw_set, false) || build_added_set(t, &t->norm_set, true))
        return tern_fail(err, "out of memory");
    return 0;
}

/* Looks a merge side up by its tokenizer.json spelling. */
static int32_t merge_side(const tern_tokenizer *t, const char *s, size_t n, char *buf) {
    long m = tern_tok_byte_level_decode(t->cp_to_byte, s, n, buf);
    return m < 0 ? -1 : tern_tok_byte_map_get(t, buf, (size_t)m);
}

static int load_merges(tern_tokenizer *t, json_t *merges, tern_error *err) {
    size_t n = json_array_size(merges);
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return tern_fail(err, "out of memory");
    for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->merges_mask = cap - 1;
    char *buf = NULL, *joined = NULL;
    size_t buf_cap = 0, joined_cap = 0;
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            /* legacy "a b": byte-level tokens never contain a space */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp || memchr(sp + 1, ' ', json_string_length(m) - (size_t)(sp + 1 - a))) {
                tern_fail(err, "model.merges[%zu] \"%s\" is not two tokens separated by a space",
                          i, a);
                goto out;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = json_string_length(m) - an - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            tern_fail(err, "model.merges[%zu] is neither \"a b\" nor [a, b]", i);
            goto out;
        }
        if (tern_tok_grow((void **)&buf, &buf_cap, an + bn + 1, 1) ||
            tern_tok_grow((void **)&joined, &joined_cap, an + bn + 1, 1)) {
            tern_fail(err, "out of memory");
            goto out;
        }
        int32_t ia = merge_side(t, a, an, buf);
        int32_t ib = merge_side(t, b, bn, buf);
        if (ia < 0 || ib < 0) {
            tern_fail(err, "model.merges[%zu]: '%.*s' is not in the vocabulary", i,
                      (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
            goto out;
        }
        const token *ka = &t->tok[ia], *kb = &t->tok[ib];
        memcpy(joined, t->bytes + ka->off, ka->len);
        memcpy(joined + ka->len, t->bytes + kb->off, kb->len);
        int32_t id = tern_tok_byte_map_get(t, joined, ka->len + kb->len);
        if (id < 0) {
            tern_fail(err, "model.merges[%zu]: the merge of '%.*s' and '%.*s' is not in the vocabulary",
                      i, (int)an, a, (int)bn, b);
            goto out;
        }
        tern_tok_merge_put(t, ia, ib, (int32_t)i, id);
    }
    rc = 0;
out:
    free(buf);
    free(joined);
    return rc;
}

static int load_model(tern_tokenizer *t, builder *b, json_t *model, json_t *added,
                      tern_error *err) {
    const char *type = json_type_of(model);
    if (!type || strcmp(type, "BPE") != 0)
        return tern_fail(err, "model.type '%s' is not supported (only BPE)", type ? type : "(missing)");
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v) &&
        !(json_is_number(v) && json_number_value(v) == 0.0))
        return tern_fail(err, "model.dropout is not supported (must be null)");
    if (json_flag(model, "byte_fallback", false))
        return tern_fail(err, "model.byte_fallback=true is not supported");
    const char *fields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(model, fields[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return tern_fail(err, "model.%s is not supported (must be null)", fields[i]);
    }
    if (!json_is_array(json_object_get(model, "merges")))
        return tern_fail(err, "model.merges is not an array");
    t->ignore_merges = json_flag(model, "ignore_merges", false);
    t->fuse_unk = json_flag(model, "fuse_unk", false);

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return tern_fail(err, "model.vocab is not an object");
    /* ids: the largest of the vocabulary and the added tokens. The file's
     * own counts bound them (ids may leave holes, but not more ids than
     * entries), so a small file cannot ask for a huge table. */
    json_int_t max_id = -1, n_ids = (json_int_t)(json_object_size(vocab) + json_array_size(added));
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= n_ids)
            return tern_fail(err, "model.vocab[\"%s\"] is not an id in [0, %lld) (the vocabulary and added "
                             "tokens hold %lld entries)", key, (long long)n_ids, (long long)n_ids);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (json_is_integer(id) && (json_integer_value(id) < 0 || json_integer_value(id) >= n_ids))
            return tern_fail(err, "added_tokens[%zu].id %lld is not an id in [0, %lld) (the vocabulary and added "
                             "tokens hold %lld entries)", i, (long long)json_integer_value(id), (long long)n_ids,
                             (long long)n_ids);
        if (json_is_integer(id) && json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    t->n_tok = (int32_t)(max_id + 1);
    t->tok = calloc((size_t)t->n_tok + 1, sizeof *t->tok);
    size_t cap = 16;
    while (cap < (size_t)t->n_tok * 2) cap *= 2;
    t->byte_map = malloc(cap * sizeof *t->byte_map);
    if (!t->tok || !t->byte_map) return tern_fail(err, "out of memory");
    memset(t->byte_map, 0xFF, cap * sizeof *t->byte_map);
    t->byte_map_mask = cap - 1;

    char *buf = NULL;
    size_t buf_cap = 0;
    json_object_foreach(vocab, key, val) {
        size_t klen = strlen(key);
        if (tern_tok_grow((void **)&buf, &buf_cap, klen + 1, 1)) {
            free(buf);
            return tern_fail(err, "out of memory");
        }
        int32_t id = (int32_t)json_integer_value(val);
        long n = tern_tok_byte_level_decode(t->cp_to_byte, key, klen, buf);
        /* A vocabulary string outside the byte-level alphabet cannot come
         * out of BPE; decode gives its UTF-8, as the ByteLevel decoder does. */
        uint8_t flags = TOK_PRESENT | (n >= 0 ? TOK_BYTES : 0);
        if (set_token(t, b, id, n >= 0 ? buf : key, n >= 0 ? (size_t)n : klen, key, klen, flags)) {
            free(buf);
            return tern_fail(err, "out of memory");
        }
    }
    free(buf);
    t->bytes = b->bytes;    /* final for the byte map and the merges below */
    for (int32_t id = 0; id < t->n_tok; id++)
        if (t->tok[id].flags & TOK_BYTES) tern_tok_byte_map_put(t, id);
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        t->byte_id[c] = tern_tok_byte_map_get(t, &ch, 1);
    }
    return load_merges(t, json_object_get(model, "merges"), err);
}

/* tokenizer_config.json names tokens as a string or {"content": ...}. */
static int config_token(tern_tokenizer *t, json_t *cfg, const char *field, int32_t *id,
                        tern_error *err) {
    *id = -1;
    json_t *v = json_object_get(cfg, field);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return tern_fail(err, "tokenizer_config.json: %s is not a string or {\"content\": ...}",
                         field);
    *id = tern_tokenizer_token_id(t, json_string_value(v));
    if (*id < 0)
        return tern_fail(err, "tokenizer_config.json: %s '%s' is not in the vocabulary", field,
                         json_string_value(v));
    return 0;
}

static int load_json(tern_tokenizer *t, json_t *root, tern_error *err) {
    if (!json_is_object(root)) return tern_fail(err, "not a JSON object");
    if (check_optional(root, "truncation", NULL, err) || check_optional(root, "padding", NULL, err) ||
        check_optional(root, "decoder", "ByteLevel", err) ||
        check_optional(root, "post_processor", "ByteLevel", err))
        return -1;
    if (load_normalizer(t, json_object_get(root, "normalizer"), "normalizer", err)) return -1;
    if (load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), err)) return -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return tern_fail(err, "added_tokens is not an array");
    builder b = {0};
    int rc = load_model(t, &b, json_object_get(root, "model"), added, err);
    if (rc == 0) rc = load_added_tokens(t, &b, added, err);
    t->bytes = b.bytes;     /* final: set_token is done reallocating */
    t->text = b.text;
    if (rc) return rc;
    /* unk may be an added token, so it is looked up last */
    json_t *unk = json_object_get(json_object_get(root, "model"), "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk) && (t->unk_id = tern_tokenizer_token_id(t, json_string_value(unk))) < 0)
        return tern_fail(err, "model.unk_token '%s' is not in the vocabulary", json_string_value(unk));
    return 0;
}

tern_tokenizer *tern_tokenizer_load_files(const char *path, const char *config_path,
                                          tern_error *err) {
    tern_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    uint32_t byte_to_cp[256];
    tern_tok_byte_level_map(byte_to_cp, t->cp_to_byte);

    json_t *root = tern_json_load(path, JSON_ALLOW_NUL, TERN_JSON_LARGE_MAX, err);
    if (!root) goto fail;
    int rc = load_json(t, root, err);
    json_decref(root);
    if (rc) {
        tern_err_prefix(err, "%s", path);
        goto fail;
    }
    if (config_path) {
        json_t *cfg = tern_json_load(config_path, 0, TERN_JSON_SMALL_MAX, err);
        if (!cfg) goto fail;
        rc = config_token(t, cfg, "bos_token", &t->bos_id, err) ||
             config_token(t, cfg, "eos_token", &t->eos_id, err) ||
             config_token(t, cfg, "pad_token", &t->pad_id, err);
        json_decref(cfg);
        if (rc) goto fail;
    }
    if (!(t->own = tern_tok_scratch_create(t, true))) {
        tern_fail(err, "out of memory");
        goto fail;
    }
    return t;
fail:
    tern_tokenizer_free(t);
    return NULL;
}

tern_tokenizer *tern_tokenizer_load(const char *dir, tern_error *err) {
    size_t n = strlen(dir) + 32;
    char *tj = malloc(n), *cj = malloc(n);
    if (!tj || !cj) {
        free(tj);
        free(cj);
        tern_fail(err, "out of memory");
        return NULL;
    }
    snprintf(tj, n, "%s/tokenizer.json", dir);
    snprintf(cj, n, "%s/tokenizer_config.json", dir);
    int has_config = tern_file_exists(cj);
    tern_tokenizer *t = tern_tokenizer_load_files(tj, has_config ? cj : NULL, err);
    free(tj);
    free(cj);
    return t;
}

void tern_tokenizer_free(tern_tokenizer *t) {
    if (!t) return;
    tern_tok_scratch_free(t->own);
    for (size_t i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t->re);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->raw_set.tok);
    free(t->norm_set.tok);
    free(t->merges);
    free(t->byte_map);
    free(t->tok);
    free(t->bytes);
    free(t->text);
    pthread_mutex_destroy(&t->lock);
    free(t);
}
