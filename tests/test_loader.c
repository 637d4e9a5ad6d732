/* Loading model directories, and every malformed input giving one clear
 * line that names the file and the tensor or field, never a crash. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "tern.h"
#include "testutil.h"

static char *dir;
static void setup(void) { dir = make_temp_dir(); cr_assert(dir); }
static void teardown(void) { rm_rf(dir); free(dir); }

TestSuite(loader, .init = setup, .fini = teardown);

/* Opens `path` with the safetensors parser, expecting failure with a
 * message containing each of the given fragments. */
static void expect_st_error(const char *path, const char *frag1, const char *frag2) {
    tern_st_file f;
    tern_error err = {{0}};
    cr_assert_eq(tern_st_open(&f, path, &err), -1, "expected %s to be rejected", path);
    cr_assert(strstr(err.msg, frag1), "message '%s' lacks '%s'", err.msg, frag1);
    if (frag2) cr_assert(strstr(err.msg, frag2), "message '%s' lacks '%s'", err.msg, frag2);
    cr_assert(strchr(err.msg, '\n') == NULL, "message is not one line: %s", err.msg);
}

static void expect_load_error(const char *model_dir, const char *frag1, const char *frag2) {
    tern_error err = {{0}};
    tern_model *m = tern_model_load(model_dir, NULL, &err);
    cr_assert_null(m, "expected the load of %s to fail", model_dir);
    cr_assert(strstr(err.msg, frag1), "message '%s' lacks '%s'", err.msg, frag1);
    if (frag2) cr_assert(strstr(err.msg, frag2), "message '%s' lacks '%s'", err.msg, frag2);
}

static char *path_in(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

Test(loader, valid_file_parses) {
    float data[6] = {1, 2, 3, 4, 5, 6};
    write_raw_safetensors(path_in("ok.safetensors"),
                          "{\"__metadata__\":{\"format\":\"pt\"},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                          data, sizeof data);
    tern_st_file f;
    tern_error err;
    cr_assert_eq(tern_st_open(&f, path_in("ok.safetensors"), &err), 0, "%s", err.msg);
    cr_assert_eq(f.n_tensors, 1);
    cr_assert_eq(f.tensors[0].shape[1], 3);
    cr_assert_eq(((const float *)f.tensors[0].data)[5], 6.0f);
    tern_st_close(&f);
}

Test(loader, truncated_file) {
    write_text(path_in("t.safetensors"), "abc");
    expect_st_error(path_in("t.safetensors"), "t.safetensors", "truncated");
}

Test(loader, header_length_past_eof) {
    uint8_t bytes[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    FILE *f = fopen(path_in("h.safetensors"), "wb");
    fwrite(bytes, 1, sizeof bytes, f);
    fclose(f);
    expect_st_error(path_in("h.safetensors"), "h.safetensors", "header length");
}

Test(loader, header_not_json) {
    write_raw_safetensors(path_in("j.safetensors"), "{\"a\": [1, 2", NULL, 0);
    expect_st_error(path_in("j.safetensors"), "j.safetensors", "not valid JSON");
}

Test(loader, offsets_out_of_range) {
    float data[2] = {0};
    write_raw_safetensors(path_in("o.safetensors"),
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, sizeof data);
    expect_st_error(path_in("o.safetensors"), "o.safetensors", "'w'");
}

Test(loader, size_disagrees_with_shape) {
    float data[4] = {0};
    write_raw_safetensors(path_in("s.safetensors"),
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", data, sizeof data);
    expect_st_error(path_in("s.safetensors"), "s.safetensors", "'w'");
}

Test(loader, overlapping_tensors) {
    float data[4] = {0};
    write_raw_safetensors(path_in("v.safetensors"),
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                          data, sizeof data);
    expect_st_error(path_in("v.safetensors"), "v.safetensors", "overlap");
}

Test(loader, unknown_dtype) {
    float data[1] = {0};
    write_raw_safetensors(path_in("d.safetensors"),
                          "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, sizeof data);
    expect_st_error(path_in("d.safetensors"), "'w'", "unknown dtype 'Q7'");
}

Test(loader, negative_shape) {
    write_raw_safetensors(path_in("n.safetensors"),
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", NULL, 0);
    expect_st_error(path_in("n.safetensors"), "'w'", "shape");
}

Test(loader, fixture_loads) {
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tiny"), NULL, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_assert_eq(tern_model_vocab_size(m), 512);
    cr_assert(tern_model_has_mtp(m));
    tern_model_free(m);
}

Test(loader, missing_tensor) {
    const char *name = "model.language_model.layers.2.linear_attn.in_proj_z.weight";
    cr_assert_eq(write_model_variant("tiny", dir, name, NULL), 0);
    expect_load_error(dir, "missing tensor", name);
}

Test(loader, shape_disagrees_with_config) {
    const char *name = "model.language_model.layers.3.self_attn.o_proj.weight";
    cr_assert_eq(write_model_variant("tiny", dir, NULL, name), 0);
    expect_load_error(dir, "model.safetensors", name);
}

Test(loader, truncated_model_file) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    cr_assert_eq(truncate(path_in("model.safetensors"), 100000), 0);
    expect_load_error(dir, "model.safetensors", "out of range");
}

Test(loader, unsupported_architecture) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    write_text(path_in("config.json"), "{\"model_type\": \"llama\", \"hidden_size\": 64}");
    expect_load_error(dir, "config.json", "model_type 'llama'");
}

Test(loader, config_field_missing) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    write_text(path_in("config.json"), "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 64}");
    expect_load_error(dir, "config.json", "num_hidden_layers");
}

Test(loader, config_not_json) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    write_text(path_in("config.json"), "{ model_type: ");
    expect_load_error(dir, "config.json", "not valid JSON");
}

Test(loader, shard_name_escaping_dir_refused) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    write_text(path_in("model.safetensors.index.json"),
               "{\"weight_map\": {\"lm_head.weight\": \"../model.safetensors\"}}");
    expect_load_error(dir, "index.json", "../model.safetensors");
}

Test(loader, index_names_absent_tensor) {
    cr_assert_eq(write_model_variant("tiny", dir, NULL, NULL), 0);
    write_text(path_in("model.safetensors.index.json"),
               "{\"weight_map\": {\"lm_head.weight\": \"model.safetensors\", \"ghost\": \"model.safetensors\"}}");
    expect_load_error(dir, "index.json", "'ghost'");
}

Test(loader, no_weights) {
    copy_file("tests/fixtures/qwen36-config/config.json", path_in("config.json"));
    expect_load_error(dir, dir, "no model.safetensors");
}

Test(loader, describe_full_config_without_tensors) {
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    tern_error err;
    cr_assert_eq(tern_model_describe(fixture_dir("qwen36-config"), NULL, out, &err), 0, "%s", err.msg);
    fclose(out);
    cr_assert(strstr(buf, "34.66 B"), "%s", buf);
    cr_assert(strstr(buf, "34,660,610,688"), "%s", buf);
    cr_assert(strstr(buf, "2.95 B"), "%s", buf);
    cr_assert(strstr(buf, "2,946,431,616"), "%s", buf);
    cr_assert(strstr(buf, "config only"), "%s", buf);
    free(buf);
}

Test(loader, describe_counts_match_tensors) {
    /* For a real checkpoint the config arithmetic and the stored tensors
     * must agree. */
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    tern_error err;
    cr_assert_eq(tern_model_describe(fixture_dir("tiny"), NULL, out, &err), 0, "%s", err.msg);
    fclose(out);
    const char *total = strstr(buf, "total");
    const char *stored = strstr(buf, "stored text tensors");
    cr_assert(total && stored, "%s", buf);
    char a[64] = "", b[64] = "";
    sscanf(strchr(total, '('), "(%63[0-9,])", a);
    sscanf(strchr(stored, '('), "(%63[0-9,])", b);
    cr_assert(a[0] != '\0');
    cr_assert_str_eq(a, b, "%s", buf);
    free(buf);
}
