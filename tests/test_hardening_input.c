/* Input hardening (issue 34): sources `tern pack` must refuse as the loader
 * does, sizes from a file that wrap, allocations a small file could make
 * huge, and values outside their domain in config.json,
 * generation_config.json, tokenizer.json and on the command line. Each
 * refusal is one line naming the file, field or flag. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensors.h"
#include "tern.h"
#include "testutil.h"

static char *dir;
static void setup(void) { dir = make_temp_dir(); cr_assert(dir); }
static void teardown(void) { rm_rf(dir); free(dir); }

TestSuite(hardening_input, .init = setup, .fini = teardown, .timeout = 120);

static const char *in_dir(const char *name) { return dir_path(dir, name); }

/* Runs a shell command (stderr joined to stdout) and checks it failed with
 * exactly one line, "tern...", holding `frag`. */
static void expect_one_line(const char *cmd, const char *frag) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    int rc;
    char *out = run_sh(full, &rc);
    cr_assert_neq(rc, 0, "expected a failure from: %s\n%s", cmd, out);
    cr_assert_neq(rc, 124, "timed out: %s", cmd);
    size_t n = strlen(out);
    while (n && out[n - 1] == '\n') out[--n] = '\0';
    cr_assert(!strchr(out, '\n'), "not one line from: %s\n%s", cmd, out);
    cr_assert(!strncmp(out, "tern", 4), "the line does not start with 'tern': %s", out);
    cr_assert(strstr(out, frag), "'%s' lacks '%s' (from: %s)", out, frag, cmd);
    cr_assert(strcmp(out, "tern:") != 0 && strcmp(out, "tern: ") != 0, "an empty message from: %s", cmd);
    free(out);
}

/* ---- tiny-fixture variants with a rewritten model.safetensors ----------- */

enum variant {
    V_PLAIN,          /* the same tensors, rewritten: must still pack */
    V_OVERLAP,        /* the second tensor's offsets moved 2 bytes into the first */
    V_MISALIGN,       /* one byte before the data: every bf16 tensor at an odd offset */
    V_HLEN_SHORT,     /* the header length one byte short (the JSON still parses) */
    V_DROP,           /* tensor `name` left out */
    V_INDEX_GHOST,    /* an index that names a tensor no shard holds */
    V_HUGE,           /* an extra tensor whose byte size wraps to 0 */
};

static void write_file(const char *path, const void *a, size_t an, const void *b, size_t bn) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fwrite(a, 1, an, f), an);
    if (bn) cr_assert_eq(fwrite(b, 1, bn, f), bn);
    cr_assert_eq(fclose(f), 0);
}

static void write_st(const char *path, json_t *hdr, const uint8_t *data, size_t n, int hlen_short) {
    char *text = json_dumps(hdr, JSON_COMPACT);
    size_t hl = strlen(text), padded = (hl + 8) / 8 * 8;   /* at least one space of padding */
    uint64_t len = padded - (hlen_short ? 1 : 0);
    uint8_t *head = malloc(8 + padded);
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
    memcpy(head + 8, text, hl);
    memset(head + 8 + hl, ' ', padded - hl);
    write_file(path, head, 8 + padded, data, n);
    free(head);
    free(text);
}

static void copy_configs(const char *dst) {
    const char *files[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        char from[2048], to[2048];
        snprintf(from, sizeof from, "%s/%s", fixture_dir("tiny"), files[i]);
        snprintf(to, sizeof to, "%s/%s", dst, files[i]);
        cr_assert_eq(copy_file(from, to), 0, "%s", from);
    }
}

static void write_variant(const char *dst, enum variant v, const char *name) {
    mkdir(dst, 0755);
    copy_configs(dst);
    tern_st_file f;
    tern_error err;
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors", fixture_dir("tiny"));
    cr_assert_eq(tern_st_open(&f, path, &err), 0, "%s", err.msg);
    size_t total = 1;
    for (int i = 0; i < f.n_tensors; i++) total += f.tensors[i].nbytes;
    uint8_t *data = calloc(1, total);
    json_t *hdr = json_object(), *map = json_object();
    uint64_t off = v == V_MISALIGN ? 1 : 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const tern_tensor *t = &f.tensors[i];
        if (v == V_DROP && !strcmp(t->name, name)) continue;
        memcpy(data + off, t->data, t->nbytes);
        uint64_t b = off - (v == V_OVERLAP && i == 1 ? 2 : 0);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(hdr, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", tern_dtype_name(t->dtype), "shape",
                                                    shape, "data_offsets", (json_int_t)b, (json_int_t)(b + t->nbytes)));
        json_object_set_new(map, t->name, json_string("model.safetensors"));
        off += t->nbytes;
    }
    if (v == V_HUGE)
        json_object_set_new(hdr, "model.language_model.layers.0.huge.weight",
                            json_pack("{s:s, s:[I], s:[I, I]}", "dtype", "F64", "shape", (json_int_t)1 << 61,
                                      "data_offsets", (json_int_t)off, (json_int_t)off));
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    write_st(path, hdr, data, off, v == V_HLEN_SHORT);
    if (v == V_INDEX_GHOST) {
        json_object_set_new(map, "model.language_model.layers.0.ghost.weight", json_string("model.safetensors"));
        json_t *index = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dst);
        cr_assert_eq(json_dump_file(index, path, 0), 0);
        json_decref(index);
    } else {
        json_decref(map);
    }
    json_decref(hdr);
    free(data);
    tern_st_close(&f);
}

/* ---- class 4: tern pack refuses what the loader refuses ----------------- */

static void expect_pack_refused(enum variant v, const char *name, const char *frag) {
    write_variant(in_dir("src"), v, name);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s pack %s %s --bits 8", tern_bin(), in_dir("src"), in_dir("out"));
    expect_one_line(cmd, frag);
    cr_assert_eq(access(in_dir("out"), F_OK), -1, "a refused pack wrote its output directory");
    cr_assert_eq(access(in_dir("out.partial"), F_OK), -1, "a refused pack left a partial directory");
}

Test(hardening_input, pack_accepts_the_rewritten_source) {
    write_variant(in_dir("src"), V_PLAIN, NULL);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s pack %s %s --bits 8 2>&1", tern_bin(), in_dir("src"), in_dir("out"));
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "the unmodified rewrite must pack:\n%s", out);
    free(out);
    cr_assert_eq(access(in_dir("out/manifest.json"), F_OK), 0);
}

Test(hardening_input, pack_refuses_overlapping_offsets) { expect_pack_refused(V_OVERLAP, NULL, "overlap"); }
Test(hardening_input, pack_refuses_misaligned_offsets) { expect_pack_refused(V_MISALIGN, NULL, "not aligned"); }
Test(hardening_input, pack_refuses_header_length_off_by_one) {
    expect_pack_refused(V_HLEN_SHORT, NULL, "model.safetensors");
}
Test(hardening_input, pack_refuses_missing_lm_head) {
    expect_pack_refused(V_DROP, "lm_head.weight", "missing tensor 'lm_head.weight'");
}
Test(hardening_input, pack_refuses_missing_q_norm) {
    const char *q = "model.language_model.layers.3.self_attn.q_norm.weight";
    expect_pack_refused(V_DROP, q, q);
}
Test(hardening_input, pack_refuses_index_naming_an_absent_tensor) {
    expect_pack_refused(V_INDEX_GHOST, NULL, "layers.0.ghost.weight");
}

/* ---- class 5: sizes that wrap ------------------------------------------- */

Test(hardening_input, safetensors_byte_size_overflow_refused) {
    /* 2^61 x 8 bytes and 2^62 x 4 bytes are 2^64: 0 in 64 bits */
    const char *hdrs[] = {"{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}",
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}",
                          "{\"w\":{\"dtype\":\"U64\",\"shape\":[1073741824,2147483648],\"data_offsets\":[0,0]}}"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(write_raw_safetensors(in_dir("w.safetensors"), hdrs[i], NULL, 0), 0);
        tern_st_file f;
        tern_error err = {{0}};
        cr_assert_eq(tern_st_open(&f, in_dir("w.safetensors"), &err), -1, "accepted: %s", hdrs[i]);
        cr_assert(strstr(err.msg, "'w'") && strstr(err.msg, "overflows"), "%s", err.msg);
    }
}

Test(hardening_input, info_and_run_refuse_a_wrapping_tensor) {
    write_variant(in_dir("m"), V_HUGE, NULL);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s info -m %s", tern_bin(), in_dir("m"));
    expect_one_line(cmd, "overflows");
    snprintf(cmd, sizeof cmd, "%s run -m %s --tokens 1 -n 1", tern_bin(), in_dir("m"));
    expect_one_line(cmd, "overflows");
}

/* ---- class 6: allocations bounded by the input -------------------------- */

static void tiny_tokenizer_with(json_t *(*edit)(json_t *), const char *path) {
    json_t *tj = json_load_file("models/tern-tiny/tokenizer.json", 0, NULL);
    cr_assert(tj);
    tj = edit(tj);
    cr_assert_eq(json_dump_file(tj, path, 0), 0);
    json_decref(tj);
}

static json_t *huge_vocab_id(json_t *tj) {
    json_object_set_new(json_object_get(json_object_get(tj, "model"), "vocab"), "zqzqzq", json_integer(300000000));
    return tj;
}

static json_t *huge_added_id(json_t *tj) {
    json_array_append_new(json_object_get(tj, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 300000000, "content", "<|zq|>", "special", 1));
    return tj;
}

Test(hardening_input, tokenizer_id_beyond_the_files_counts_refused) {
    json_t *(*edits[])(json_t *) = {huge_vocab_id, huge_added_id};
    for (int i = 0; i < 2; i++) {
        tiny_tokenizer_with(edits[i], in_dir("tokenizer.json"));
        tern_error err = {{0}};
        tern_tokenizer *t = tern_tokenizer_load_files(in_dir("tokenizer.json"), NULL, &err);
        cr_assert_null(t, "an id of 300,000,000 in a vocabulary of ~8,000 was accepted");
        cr_assert(strstr(err.msg, "tokenizer.json") && strstr(err.msg, "not an id in [0, "), "%s", err.msg);
        cr_assert(i == 0 ? strstr(err.msg, "zqzqzq") != NULL : strstr(err.msg, "300000000") != NULL, "%s", err.msg);
    }
}

/* Without the fix the read below runs until memory is gone: the address
 * space limit keeps that from taking the machine. An ASan build reserves
 * terabytes of address space at start, so there the timeout alone bounds it. */
#ifdef __SANITIZE_ADDRESS__
#define MEMORY_LIMIT ""
#else
#define MEMORY_LIMIT "ulimit -v 4000000; "
#endif

Test(hardening_input, run_file_that_never_ends_refused) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, MEMORY_LIMIT "timeout 60 %s run -f /dev/zero -n 1 -t 1", tern_bin());
    expect_one_line(cmd, "/dev/zero: longer than");
}

Test(hardening_input, run_file_longer_than_the_context_refused) {
    FILE *f = fopen(in_dir("long.txt"), "w");
    for (int i = 0; i < 20000; i++) fputs("word ", f);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run -f %s --ctx 64 -n 1 -t 1", tern_bin(), in_dir("long.txt"));
    expect_one_line(cmd, "64-token context");
    /* a text of the context's size is read (and refused by the session
     * only when its tokens overflow) */
    f = fopen(in_dir("fits.txt"), "w");
    for (int i = 0; i < 60; i++) fputs("word ", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s run -f %s --ctx 64 -n 1 -t 1 2>&1", tern_bin(), in_dir("fits.txt"));
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
}

/* ---- class 7: domains --------------------------------------------------- */

/* A model directory of tern-tiny's files (linked) with one file replaced. */
static const char *tiny_with(const char *file, const char *text) {
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "chat_template.jinja"};
    const char *m = in_dir("tiny");
    mkdir(m, 0755);
    char cwd[1024], from[2048], to[2048];
    cr_assert(getcwd(cwd, sizeof cwd));
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(to, sizeof to, "%s/%s", m, files[i]);
        unlink(to);
        if (!strcmp(files[i], file)) {
            cr_assert_eq(write_text(to, text), 0);
            continue;
        }
        snprintf(from, sizeof from, "%s/models/tern-tiny/%s", cwd, files[i]);
        cr_assert_eq(symlink(from, to), 0, "%s", to);
    }
    return m;
}

Test(hardening_input, generation_config_values_the_cli_refuses) {
    static const struct {
        const char *json, *frag;
    } bad[] = {
        {"{\"temperature\": -1}", "\"temperature\" must be in [0, 100]"},
        {"{\"top_k\": -5}", "\"top_k\" must be an integer in [0,"},
        {"{\"top_p\": 2}", "\"top_p\" must be in [0, 1]"},
        {"{\"min_p\": -0.5}", "\"min_p\" must be in [0, 1]"},
        {"{\"repetition_penalty\": 0}", "\"repetition_penalty\" must be in [0.01, 100]"},
        {"{\"eos_token_id\": -2}", "eos_token_id[0] must be a token id"},
        {"{\"eos_token_id\": [8002, -1]}", "eos_token_id[1] must be a token id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *m = tiny_with("generation_config.json", bad[i].json);
        tern_sampler_params p;
        tern_error err = {{0}};
        cr_assert_eq(tern_sampler_params_load(&p, m, &err), -1, "accepted: %s", bad[i].json);
        cr_assert(strstr(err.msg, "generation_config.json") && strstr(err.msg, bad[i].frag), "%s: %s", bad[i].json,
                  err.msg);
    }
    /* what the CLI prints: the one line, no second empty "tern:" line */
    const char *m = tiny_with("generation_config.json", "{\"top_p\": 2}");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n 1 -t 1", tern_bin(), m);
    expect_one_line(cmd, "\"top_p\" must be in [0, 1]");
}

/* tern-tiny's config.json with `key` of its text_config set to `value`. */
static const char *tiny_config_with(const char *key, json_t *value) {
    json_t *c = json_load_file("models/tern-tiny/config.json", 0, NULL);
    cr_assert(c);
    json_object_set_new(json_object_get(c, "text_config"), key, value);
    char *text = json_dumps(c, 0);
    const char *m = tiny_with("config.json", text);
    free(text);
    json_decref(c);
    return m;
}

Test(hardening_input, config_values_outside_their_domain) {
    static const struct {
        const char *key, *json, *frag;
    } bad[] = {
        {"eos_token_id", "-1", "eos_token_id[0] must be a token id in [0, 8064)"},
        {"eos_token_id", "\"8000\"", "eos_token_id[0] must be a token id"},
        {"eos_token_id", "[8000, \"x\"]", "eos_token_id[1] must be a token id"},
        {"eos_token_id", "99999", "eos_token_id[0] must be a token id in [0, 8064)"},
        {"rms_norm_eps", "-1e-06", "rms_norm_eps must be in (0, 1)"},
        {"rms_norm_eps", "0", "rms_norm_eps must be in (0, 1)"},
        {"rms_norm_eps", "1e-300", "rms_norm_eps must be in (0, 1)"},
        {"mtp_num_hidden_layers", "\"1\"", "mtp_num_hidden_layers must be 0 or 1"},
        {"linear_key_head_dim", "1073741824", "exceed 2^30"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *m = tiny_config_with(bad[i].key, json_loads(bad[i].json, JSON_DECODE_ANY, NULL));
        tern_config c;
        tern_error err = {{0}};
        cr_assert_eq(tern_config_load(&c, m, &err), -1, "accepted %s = %s", bad[i].key, bad[i].json);
        cr_assert(strstr(err.msg, "config.json") && strstr(err.msg, bad[i].frag), "%s = %s: %s", bad[i].key,
                  bad[i].json, err.msg);
    }
    /* generation_config.json's eos list is held to the same domain */
    const char *m = tiny_with("generation_config.json", "{\"eos_token_id\": [8002, 9000]}");
    tern_config c;
    tern_error err = {{0}};
    cr_assert_eq(tern_config_load(&c, m, &err), -1);
    cr_assert(strstr(err.msg, "generation_config.json") && strstr(err.msg, "eos_token_id[1]"), "%s", err.msg);
}

/* tern-tiny's tokenizer with its Split regex replaced by `pattern`. */
static const char *pattern_now;
static json_t *with_pattern(json_t *tj) {
    json_t *split = json_array_get(json_object_get(json_object_get(tj, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(split, "pattern", json_pack("{s:s}", "Regex", pattern_now));
    return tj;
}

/* Ids recorded from Hugging Face `tokenizers` by
 * tools/tokenizer/empty_match_expectations.py. */
Test(hardening_input, empty_pre_tokenizer_matches_split_as_hf) {
    char path[2048];
    snprintf(path, sizeof path, "%s/empty-match.json", fixture_dir("tokenizer"));
    json_t *all = json_load_file(path, 0, NULL);
    cr_assert(json_array_size(all) > 0, "%s", path);
    size_t pi;
    json_t *pat;
    int checked = 0;
    json_array_foreach(all, pi, pat) {
        pattern_now = json_string_value(json_object_get(pat, "pattern"));
        tiny_tokenizer_with(with_pattern, in_dir("tokenizer.json"));
        tern_error err = {{0}};
        tern_tokenizer *t = tern_tokenizer_load_files(in_dir("tokenizer.json"), NULL, &err);
        cr_assert_not_null(t, "%s", err.msg);
        size_t ci;
        json_t *c;
        json_array_foreach(json_object_get(pat, "cases"), ci, c) {
            const char *text = json_string_value(json_object_get(c, "text"));
            json_t *want = json_object_get(c, "ids");
            int32_t *ids = NULL;
            size_t n = 0;
            cr_assert_eq(tern_tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &err), 0, "%s", err.msg);
            int same = n == json_array_size(want);
            for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
            cr_assert(same, "pattern %s, text '%s': %zu ids, HF has %zu", pattern_now, text, n, json_array_size(want));
            free(ids);
            checked++;
        }
        tern_tokenizer_free(t);
    }
    cr_assert_gt(checked, 20);
    json_decref(all);
}

Test(hardening_input, cli_edge_values_one_line_each) {
    char cmd[4096];
    const char *T = tern_bin();
    write_text(in_dir("empty.txt"), "");
    write_text(in_dir("short.txt"), "The quick brown fox jumps over the lazy dog, again and again.");
    snprintf(cmd, sizeof cmd, "%s perplexity -f %s -t 1", T, in_dir("empty.txt"));
    expect_one_line(cmd, "has 0 tokens");
    snprintf(cmd, sizeof cmd, "%s perplexity -f %s --ctx 2147483647 -t 1", T, in_dir("short.txt"));
    expect_one_line(cmd, "--ctx: a context of 2147483647 exceeds the model's 262144 positions");
    expect_one_line(cmd, "--rope-scaling yarn");
    snprintf(cmd, sizeof cmd, "%s perplexity -f %s --ctx 1 -t 1", T, in_dir("short.txt"));
    expect_one_line(cmd, "at least 2 tokens");
    snprintf(cmd, sizeof cmd, "%s perplexity -f %s -t 1", T, dir);
    expect_one_line(cmd, "is a directory");
    snprintf(cmd, sizeof cmd, "%s run -p hi --ctx 2147483647 -n 1 -t 1", T);
    expect_one_line(cmd, "a context of 2147483647");
    snprintf(cmd, sizeof cmd, "%s run -p hi --ctx 2147483647 --rope-scaling yarn --rope-factor 2 -n 1 -t 1", T);
    expect_one_line(cmd, "exceeds the 524288 positions of YaRN factor 2 over the native 262144");
    snprintf(cmd, sizeof cmd, "%s run -p hi --rope-scaling yarn -n 1 -t 1", T);
    expect_one_line(cmd, "YaRN needs a --rope-factor or a --ctx above the native 262144 positions");
    snprintf(cmd, sizeof cmd, "%s run -p hi --rope-scaling yarn --ctx 4096 -n 1 -t 1", T);
    expect_one_line(cmd, "within the native 262144 positions");
    snprintf(cmd, sizeof cmd, "%s run -p hi --rope-factor 2 -n 1 -t 1", T);
    expect_one_line(cmd, "--rope-factor 2 needs YaRN (--rope-scaling yarn)");
    snprintf(cmd, sizeof cmd, "%s run -p hi --rope-scaling linear -n 1 -t 1", T);
    expect_one_line(cmd, "--rope-scaling must be none or yarn, got 'linear'");
    snprintf(cmd, sizeof cmd, "%s run -p hi --rope-scaling yarn --rope-factor 0.5 -n 1 -t 1", T);
    expect_one_line(cmd, "--rope-factor needs a number in [1, 1.04858e+06]");
    snprintf(cmd, sizeof cmd, "%s run -f %s -n 1 -t 1", T, dir);
    expect_one_line(cmd, "is a directory");
    snprintf(cmd, sizeof cmd, "%s run -f %s/missing.txt -n 1 -t 1", T, dir);
    expect_one_line(cmd, "missing.txt: No such file");
    snprintf(cmd, sizeof cmd, "%s pack models/tern-tiny %s --group 0", T, in_dir("p"));
    expect_one_line(cmd, "--group needs a positive number, got '0'");
    snprintf(cmd, sizeof cmd, "%s pack models/tern-tiny/config.json %s", T, in_dir("p"));
    expect_one_line(cmd, "config.json: not a directory");
    cr_assert_eq(access(in_dir("p"), F_OK), -1);
    /* an engine error: its line only, no footer of meaningless numbers */
    snprintf(cmd, sizeof cmd, "%s run --tokens 999999 -n 1 -t 1", T);
    expect_one_line(cmd, "999999");
    snprintf(cmd, sizeof cmd, "%s run -p hi -n 1 -t 1 --device gpu0", T);
    expect_one_line(cmd, "device \"gpu0\": expected auto, cpu, cuda or cuda:N");
    snprintf(cmd, sizeof cmd, "%s bench -m models/tern-tiny --kernel-stats all", T);
    expect_one_line(cmd, "--kernel-stats must be decode, prefill or graph");
}

/* An index that names no tensor, or one name twice, is refused at the index. */
Test(hardening_input, index_empty_or_with_a_name_twice_refused) {
    const char *cases[][2] = {
        {"{\"weight_map\": {}}", "names no tensor"},
        {"{\"weight_map\": {\"a\": \"x.safetensors\", \"a\": \"y.safetensors\"}}", "duplicate"},
    };
    for (int i = 0; i < 2; i++) {
        write_text(in_dir("model.safetensors.index.json"), cases[i][0]);
        tern_tensor_set ts;
        tern_error err = {{0}};
        cr_assert_eq(tern_tensors_open(&ts, dir, 0, &err), -1, "accepted %s", cases[i][0]);
        cr_assert(strstr(err.msg, cases[i][1]), "%s", err.msg);
    }
}
