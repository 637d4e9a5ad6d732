/* manifest.json: a packed manifest reads back to the same JSON, and every
 * rule a reader owes the format (docs/FORMAT.md) rejects its violation
 * with one line naming the field. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/manifest.h"
#include "tern.h"
#include "testutil.h"

static char *dir;
static json_t *good;   /* the manifest of tiny packed at 8 bits */

static void setup(void) {
    dir = make_temp_dir();
    cr_assert(dir);
    char dst[1100];
    snprintf(dst, sizeof dst, "%s/packed", dir);
    tern_pack_params p = {.src = fixture_dir("tiny"), .dst = dst, .bits = 8, .n_threads = 1};
    tern_error err = {{0}};
    cr_assert_eq(tern_pack(&p, &err), 0, "%s", err.msg);
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", dst);
    good = json_load_file(path, 0, NULL);
    cr_assert(good);
}

static void teardown(void) {
    json_decref(good);
    rm_rf(dir);
    free(dir);
}

TestSuite(manifest, .init = setup, .fini = teardown);

static const char *packed(void) {
    static char p[1100];
    snprintf(p, sizeof p, "%s/packed", dir);
    return p;
}

/* Writes j as dir/bad/manifest.json and expects the reader to refuse it
 * with a message holding both fragments. */
static void expect_reject(json_t *j, const char *frag1, const char *frag2) {
    char d[1100], path[1200];
    snprintf(d, sizeof d, "%s/bad", dir);
    mkdir(d, 0755);
    snprintf(path, sizeof path, "%s/manifest.json", d);
    cr_assert_eq(json_dump_file(j, path, JSON_INDENT(1)), 0);
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, d, &err), -1, "expected rejection (%s)", frag1);
    cr_assert(strstr(err.msg, frag1), "message '%s' lacks '%s'", err.msg, frag1);
    if (frag2) cr_assert(strstr(err.msg, frag2), "message '%s' lacks '%s'", err.msg, frag2);
    cr_assert(!strchr(err.msg, '\n'));
    json_decref(j);
}

static json_t *copy(void) { return json_deep_copy(good); }

static json_t *tensor(json_t *j, const char *name) {
    json_t *t = json_object_get(json_object_get(j, "tensors"), name);
    cr_assert(t, "no tensor %s", name);
    return t;
}

#define QKV "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
#define NORM "model.language_model.layers.0.input_layernorm.weight"

Test(manifest, read_write_roundtrip) {
    tern_manifest m, m2;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, packed(), &err), 0, "%s", err.msg);
    cr_assert_eq(m.version, 1);
    cr_assert_eq(m.n_experts, 16);
    cr_assert_eq(m.arch.hidden, 64);
    cr_assert(m.arch.mtp);
    cr_assert_str_eq(m.mtp_file, "experts/mtp.bin");
    const tern_pk_tensor *t = tern_manifest_tensor(&m, QKV);
    cr_assert(t && t->encoding == TERN_ENC_Q8 && t->group == 64 && t->shape[0] == 128 && t->shape[1] == 64);
    cr_assert_null(tern_manifest_tensor(&m, "nope"));
    char d2[1100], path[1200];
    snprintf(d2, sizeof d2, "%s/again", dir);
    mkdir(d2, 0755);
    snprintf(path, sizeof path, "%s/manifest.json", d2);
    cr_assert_eq(tern_manifest_write(&m, path, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_manifest_read(&m2, d2, &err), 0, "%s", err.msg);
    cr_assert_str_eq(m.manifest_sha256, m2.manifest_sha256, "write(read(x)) == x byte for byte");
    tern_manifest_free(&m);
    tern_manifest_free(&m2);
}

Test(manifest, sizes_of_encodings) {
    tern_pk_tensor t = {.ndim = 2, .shape = {8, 128}, .encoding = TERN_ENC_Q4, .group = 64};
    uint64_t d, s;
    cr_assert_eq(tern_pk_tensor_bytes(&t, &d, &s), 0);
    cr_assert_eq(d, 8 * 64);
    cr_assert_eq(s, 8 * 2 * 2);
    t.encoding = TERN_ENC_BF16;
    cr_assert_eq(tern_pk_tensor_bytes(&t, &d, &s), 0);
    cr_assert_eq(d, 8 * 128 * 2);
    cr_assert_eq(s, 0);
    t.encoding = TERN_ENC_Q8;
    t.shape[1] = 96;
    cr_assert_eq(tern_pk_tensor_bytes(&t, &d, &s), -1, "96 is not a multiple of 64");
}

Test(manifest, path_rules) {
    cr_assert(tern_manifest_path_ok("resident.bin"));
    cr_assert(tern_manifest_path_ok("experts/layer_000.bin"));
    const char *bad[] = {"", "/abs", "../x", "a/../b", "a/./b", "a//b", "a/", ".", "a\\b", "a\nb"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) cr_assert(!tern_manifest_path_ok(bad[i]), "'%s' accepted", bad[i]);
}

Test(manifest, rejects_unknown_format_and_version) {
    json_t *j = copy();
    json_object_set_new(j, "format", json_string("gturbo"));
    expect_reject(j, "format", "gturbo");
    j = copy();
    json_object_set_new(j, "version", json_integer(2));
    expect_reject(j, "version 2", NULL);
}

Test(manifest, rejects_size_disagreeing_with_shape) {
    json_t *j = copy();
    json_array_set_new(json_object_get(tensor(j, QKV), "shape"), 0, json_integer(100));
    expect_reject(j, QKV, "needs");
    j = copy();
    json_object_set_new(tensor(j, QKV), "group", json_integer(48));
    expect_reject(j, QKV, "group");
    j = copy();
    json_object_set_new(tensor(j, NORM), "encoding", json_string("q3"));
    expect_reject(j, NORM, "q3");
}

Test(manifest, rejects_ranges_outside_file_and_overlaps) {
    json_t *j = copy();
    json_t *files = json_object_get(j, "files");
    json_object_set_new(json_object_get(files, "resident.bin"), "size", json_integer(1024));
    expect_reject(j, "lies outside resident.bin", NULL);
    j = copy();
    json_t *a = json_object_get(tensor(j, QKV), "data"), *n = json_object_get(tensor(j, NORM), "data");
    json_array_set(n, 0, json_array_get(a, 0));
    expect_reject(j, "overlaps", NULL);
    j = copy();
    json_array_set_new(json_object_get(tensor(j, NORM), "data"), 0, json_integer(65));
    expect_reject(j, "aligned", NULL);
}

Test(manifest, rejects_expert_file_size_and_bad_paths) {
    json_t *j = copy();
    json_t *f = json_object_get(json_object_get(j, "files"), "experts/layer_001.bin");
    json_object_set_new(f, "size", json_integer(4096));
    expect_reject(j, "experts/layer_001.bin", "count x stride");
    j = copy();
    json_t *files = json_object_get(j, "files");
    json_object_set(files, "../escape.bin", json_object_get(files, "config.json"));
    expect_reject(j, "../escape.bin", NULL);
    j = copy();
    json_array_set_new(json_object_get(json_object_get(j, "experts"), "layers"), 0, json_string("/etc/passwd"));
    expect_reject(j, "/etc/passwd", NULL);
    j = copy();
    json_object_set_new(json_object_get(j, "experts"), "stride", json_integer(1000));
    expect_reject(j, "stride", "4096");
    j = copy();
    json_object_set_new(json_object_get(json_object_get(j, "files"), "config.json"), "sha256", json_string("xyz"));
    expect_reject(j, "config.json", "sha256");
}

Test(manifest, rejects_parts_past_the_stride) {
    json_t *j = copy();
    json_t *down = json_object_get(json_object_get(json_object_get(j, "experts"), "parts"), "down");
    json_array_set_new(json_object_get(down, "biases"), 0, json_integer(8192));
    expect_reject(j, "down biases", "expert blob");
}

Test(manifest, rejects_duplicate_keys_and_garbage) {
    char d[1100], path[1200];
    snprintf(d, sizeof d, "%s/dup", dir);
    mkdir(d, 0755);
    snprintf(path, sizeof path, "%s/manifest.json", d);
    write_text(path, "{\"format\": \"tern-packed\", \"format\": \"tern-packed\"}");
    tern_manifest m;
    tern_error err = {{0}};
    cr_assert_eq(tern_manifest_read(&m, d, &err), -1);
    cr_assert(strstr(err.msg, "manifest.json") && strstr(err.msg, "JSON"), "%s", err.msg);
    write_text(path, "[1, 2]");
    cr_assert_eq(tern_manifest_read(&m, d, &err), -1);
}
