/* YaRN RoPE scaling against transformers: the config reader's inverse
 * frequencies and attention factor for every branch of transformers'
 * _compute_yarn_parameters (tests/fixtures/yarn/rope_cases.json), the yarn
 * fixture's outputs at the positions past its native context, the same
 * model with YaRN turned on at load over a config without it, and the
 * context checks, also from the directory alone (tern_model_dir_probe).
 * (test_fixtures.c runs the whole fixture suite on it.) */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/rope.h"
#include "tern.h"
#include "testutil.h"

#define TOL 1e-4     /* as the fixture tests: max |d| / max |ref| */
#define NATIVE 64    /* the fixture's original_max_position_embeddings */

Test(fixture, yarn_rope_parameters_as_transformers) {
    json_error_t jerr;
    char path[1024];
    snprintf(path, sizeof path, "%s/rope_cases.json", fixture_dir("yarn"));
    json_t *cases = json_load_file(path, 0, &jerr);
    cr_assert(json_is_array(cases), "%s: %s", path, jerr.text);
    size_t i;
    json_t *k;
    json_array_foreach(cases, i, k) {
        const char *name = json_string_value(json_object_get(k, "name"));
        char *text = json_dumps(json_object_get(k, "config"), 0);
        tern_config c;
        tern_error err;
        cr_assert_eq(tern_config_parse(&c, text, name, &err), 0, "%s", err.msg);
        free(text);
        json_t *want = json_object_get(k, "inv_freq");
        cr_assert_eq(json_array_size(want), (size_t)c.rope_dim / 2, "%s", name);
        float got[512];
        tern_rope_inv_freq(&c, got);
        double worst = 0;
        for (int d = 0; d < c.rope_dim / 2; d++) {
            double w = json_number_value(json_array_get(want, (size_t)d)), e = fabs(got[d] - w) / w;
            if (e > worst) worst = e;
        }
        double af = json_number_value(json_object_get(k, "attention_factor"));
        cr_log_info("%s: inverse frequencies within %.1e, attention factor %.17g (transformers %.17g)", name, worst,
                    c.rope.attn_factor, af);
        /* one fp32 rounding apart at most (transformers forms them in fp32) */
        cr_expect_leq(worst, 2.5e-7, "%s: inverse frequency off by %.3e relative", name, worst);
        cr_expect_leq(fabs(c.rope.attn_factor - af), 1e-15 * af, "%s: attention factor %.17g, transformers %.17g", name,
                      c.rope.attn_factor, af);
        cr_expect_eq(c.rope.type, TERN_ROPE_YARN, "%s", name);
    }
    cr_assert_geq(i, 8);
    json_decref(cases);
}

static tern_model *load_yarn(const char *dir, int scaling, int context) {
    tern_load_params lp = {.n_threads = 2, .rope_scaling = scaling, .rope_context = context};
    tern_error err;
    tern_model *m = tern_model_load(dir, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    return m;
}

/* The final hidden state of the 130-token prompt, rows from NATIVE on
 * against transformers', and the last-position logits of the 65- and
 * 130-token runs (positions 64 and 129). Returns the worst error. */
static double past_native_error(tern_model *m) {
    reference ref;
    cr_assert_eq(reference_open(&ref, "yarn"), 0);
    const tern_tensor *p = reference_get(&ref, "prompt"), *hf = reference_get(&ref, "hidden.final"),
                      *last = reference_get(&ref, "logits.last");
    cr_assert(p && hf && last);
    int n = (int)p->numel, H = m->cfg.hidden, V = tern_model_vocab_size(m);
    tern_error err;
    tern_session *s = tern_session_create(m, NULL, &err);
    cr_assert_not_null(s, "%s", err.msg);
    float *hidden = malloc((size_t)n * H * sizeof(float)), *lg = malloc((size_t)n * V * sizeof(float));
    cr_assert_eq(tern_forward(s, p->data, n, lg, 1, hidden, &err), 0, "%s", err.msg);
    const float *want_h = hf->data, *want_l = last->data;
    double e = rel_err(hidden + (size_t)NATIVE * H, want_h + (size_t)NATIVE * H, (size_t)(n - NATIVE) * H);
    double e65 = rel_err(lg + (size_t)64 * V, want_l + (size_t)3 * V, (size_t)V);   /* logits.last row 3: len 65 */
    double e130 = rel_err(lg + (size_t)(n - 1) * V, want_l + (size_t)4 * V, (size_t)V);
    cr_log_info("past the native %d positions: hidden %.2e, logits at 64 %.2e, at %d %.2e", NATIVE, e, e65, n - 1,
                e130);
    free(hidden);
    free(lg);
    tern_session_destroy(s);
    reference_close(&ref);
    return fmax(e, fmax(e65, e130));
}

Test(fixture, yarn_past_native_context) {
    tern_model *m = load_yarn(fixture_dir("yarn"), TERN_ROPE_AS_CONFIG, 0);
    cr_assert_eq(tern_model_max_context(m), 4 * NATIVE);
    double e = past_native_error(m);
    cr_expect_lt(e, TOL, "YaRN past the native context: rel err %.3e", e);
    tern_model_free(m);
    /* the same weights with plain RoPE are another model, which the
     * reference tells apart within the native positions already (YaRN
     * interpolates the slow dims at every position), and the prompt no
     * longer fits */
    m = load_yarn(fixture_dir("yarn"), TERN_ROPE_NONE, 0);
    cr_assert_eq(tern_model_max_context(m), NATIVE);
    tern_error err;
    tern_session_params sp = {.max_context = 130};
    cr_expect_null(tern_session_create(m, &sp, &err));
    cr_expect(strstr(err.msg, "rope_scaling yarn"), "%s", err.msg);
    reference ref;
    cr_assert_eq(reference_open(&ref, "yarn"), 0);
    int H = m->cfg.hidden;
    float *hidden = malloc((size_t)NATIVE * H * sizeof(float));
    tern_session *s = tern_session_create(m, NULL, &err);
    cr_assert_not_null(s, "%s", err.msg);
    cr_assert_eq(tern_forward(s, reference_get(&ref, "prompt")->data, NATIVE, NULL, 0, hidden, &err), 0, "%s",
                 err.msg);
    double plain = rel_err(hidden, reference_get(&ref, "hidden.final")->data, (size_t)NATIVE * H);
    cr_log_info("plain RoPE on the YaRN fixture, first %d positions: %.2e", NATIVE, plain);
    cr_expect_gt(plain, 100 * TOL, "plain RoPE matches the YaRN reference (%.3e): the fixture does not test YaRN",
                 plain);
    free(hidden);
    tern_session_destroy(s);
    reference_close(&ref);
    tern_model_free(m);
}

/* The yarn fixture's files with rope_parameters of rope_type default (and
 * no YaRN fields): YaRN turned on at load, with the factor from the
 * context, must give transformers' YaRN outputs. */
Test(fixture, yarn_turned_on_at_load) {
    char *dir = make_temp_dir();
    const char *src = fixture_dir("yarn");
    char from[1024];
    snprintf(from, sizeof from, "%s/model.safetensors", src);
    cr_assert_eq(copy_file(from, dir_path(dir, "model.safetensors")), 0);
    snprintf(from, sizeof from, "%s/config.json", src);
    json_error_t jerr;
    json_t *cfg = json_load_file(from, 0, &jerr);
    cr_assert_not_null(cfg, "%s", jerr.text);
    json_t *rp = json_object_get(cfg, "rope_parameters");
    json_object_set_new(rp, "rope_type", json_string("default"));
    json_object_del(rp, "factor");
    json_object_del(rp, "original_max_position_embeddings");
    cr_assert_eq(json_dump_file(cfg, dir_path(dir, "config.json"), 0), 0);
    json_decref(cfg);

    tern_model *m = load_yarn(dir, TERN_ROPE_AS_CONFIG, 0);
    cr_assert_eq(tern_model_max_context(m), NATIVE);
    tern_error err;
    cr_expect_eq(tern_model_check_context(m, 4 * NATIVE, &err), -1);
    cr_expect(strstr(err.msg, "rope_scaling yarn") && !strchr(err.msg, '\n'), "%s", err.msg);
    char plain[65], scaled[65];
    cr_assert_eq(tern_model_identity(m, plain, &err), 0, "%s", err.msg);
    tern_model_free(m);

    m = load_yarn(dir, TERN_ROPE_YARN, 4 * NATIVE);
    cr_assert_eq(tern_model_max_context(m), 4 * NATIVE);
    cr_expect_eq(tern_model_check_context(m, 4 * NATIVE, &err), 0, "%s", err.msg);
    cr_expect_eq(tern_model_check_context(m, 4 * NATIVE + 1, &err), -1);
    cr_expect(strstr(err.msg, "YaRN factor 4 over the native 64"), "%s", err.msg);
    char what[256];
    tern_model_rope_describe(m, what, sizeof what);
    cr_expect(strstr(what, "yarn, factor 4 over 64 native positions, beta_fast 32, beta_slow 1, attention factor 1.13863"),
              "%s", what);
    /* a saved state of the plain model must never be restored into this one */
    cr_assert_eq(tern_model_identity(m, scaled, &err), 0, "%s", err.msg);
    cr_expect(strcmp(plain, scaled) != 0);
    double e = past_native_error(m);
    cr_expect_lt(e, TOL, "YaRN turned on at load: rel err %.3e", e);
    tern_model_free(m);
    rm_rf(dir);
    free(dir);
}

/* What a load asks for that cannot be: each a one-line error. */
Test(fixture, yarn_load_errors) {
    static const struct {
        int scaling, context;
        double factor;
        const char *dir, *frag;
    } cases[] = {
        {TERN_ROPE_YARN, 0, 0, "tiny", "YaRN needs a rope_factor or a rope_context above the native 4096"},
        {TERN_ROPE_YARN, 4096, 0, "tiny", "within the native 4096 positions"},
        {TERN_ROPE_NONE, 0, 2, "tiny", "rope_factor 2 needs YaRN (rope_scaling yarn)"},
        {TERN_ROPE_AS_CONFIG, 0, 2, "tiny", "rope_factor 2 needs YaRN (rope_scaling yarn)"},
        {TERN_ROPE_YARN, 0, 0.5, "tiny", "rope_factor must be in [1,"},
        {7, 0, 0, "tiny", "rope_scaling 7 is not a scaling"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tern_load_params lp = {.n_threads = 1, .rope_scaling = cases[i].scaling, .rope_context = cases[i].context,
                               .rope_factor = cases[i].factor};
        tern_error err = {{0}};
        tern_model *m = tern_model_load(fixture_dir(cases[i].dir), &lp, &err);
        cr_expect_null(m, "case %zu loaded", i);
        tern_model_free(m);
        cr_expect(strstr(err.msg, cases[i].frag), "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].frag);
    }
    /* a factor over a YaRN config replaces its own; the model reaches as far */
    tern_load_params lp = {.n_threads = 1, .rope_factor = 8};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("yarn"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_expect_eq(tern_model_max_context(m), 8 * NATIVE);
    cr_expect_float_eq(m->cfg.rope.attn_factor, 0.1 * log(8) + 1, 1e-15);
    tern_model_free(m);
}

/* config.json's rope fields that cannot be: each named. */
Test(fixture, yarn_config_errors) {
    static const char *cases[][2] = {
        {"\"rope_type\": \"linear\", \"factor\": 2", "rope_type 'linear' is not supported (tern runs 'default' and 'yarn')"},
        {"\"rope_type\": \"yarn\"", "rope_type 'yarn' needs 'factor'"},
        {"\"rope_type\": \"yarn\", \"factor\": 0.5", "rope_parameters.factor must be in [1, 2^20], got 0.5"},
        {"\"rope_type\": \"yarn\", \"factor\": \"4\"", "rope_parameters.factor must be a number"},
        {"\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1", "truncate must be true or false"},
        {"\"rope_type\": \"yarn\", \"factor\": 4, \"attention_factor\": -1", "attention_factor must be a positive"},
        {"\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 0.5",
         "original_max_position_embeddings must be a positive integer"},
        {"\"rope_type\": 3", "rope_type is not a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
                 "\"vocab_size\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 32, "
                 "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 16, "
                 "\"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4, \"num_experts\": 4, "
                 "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 32, "
                 "\"partial_rotary_factor\": 0.25, \"rope_parameters\": {\"rope_theta\": 100, %s}}",
                 cases[i][0]);
        tern_config c;
        tern_error err = {{0}};
        cr_expect_eq(tern_config_parse(&c, text, "config.json", &err), -1, "case %zu parsed", i);
        cr_expect(strstr(err.msg, cases[i][1]) && strstr(err.msg, "config.json"), "case %zu: '%s' lacks '%s'", i,
                  err.msg, cases[i][1]);
    }
}

/* tern_model_dir_probe (a server that loads the model later) says from the
 * directory what the loaded model says: its context with the load's RoPE
 * scaling, its vocabulary and end-of-sequence ids, and the same line for a
 * context too long. */
Test(fixture, dir_probe_matches_the_loaded_model) {
    static const struct {
        const char *dir;
        int scaling, context;
    } cases[] = {
        {"tiny", TERN_ROPE_AS_CONFIG, 0}, {"odd", TERN_ROPE_AS_CONFIG, 0}, {"qwen35", TERN_ROPE_AS_CONFIG, 0},
        {"yarn", TERN_ROPE_AS_CONFIG, 0}, {"yarn", TERN_ROPE_YARN, 8 * NATIVE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tern_load_params lp = {.n_threads = 1, .rope_scaling = cases[i].scaling, .rope_context = cases[i].context};
        tern_error err = {{0}}, merr = {{0}};
        tern_model *m = tern_model_load(fixture_dir(cases[i].dir), &lp, &err);
        cr_assert_not_null(m, "case %zu: %s", i, err.msg);
        tern_model_dir_info info;
        cr_assert_eq(tern_model_dir_probe(fixture_dir(cases[i].dir), &lp, 0, &info, &err), 0, "case %zu: %s", i,
                     err.msg);
        cr_expect_eq(info.max_context, tern_model_max_context(m), "case %zu", i);
        cr_expect_eq(info.vocab_size, tern_model_vocab_size(m), "case %zu", i);
        int n_eos = 0;
        for (int32_t id = 0; id < tern_model_vocab_size(m); id++) n_eos += tern_model_is_eos(m, id);
        cr_expect(info.n_eos > 0 && info.n_eos == n_eos, "case %zu: %d ids, the model %d", i, info.n_eos, n_eos);
        for (int k = 0; k < info.n_eos; k++) cr_expect(tern_model_is_eos(m, info.eos[k]), "case %zu", i);
        int ctx = info.max_context;
        cr_expect_eq(tern_model_dir_probe(fixture_dir(cases[i].dir), &lp, ctx, &info, &err), 0, "case %zu", i);
        cr_expect_eq(tern_model_dir_probe(fixture_dir(cases[i].dir), &lp, ctx + 1, &info, &err), -1, "case %zu", i);
        cr_expect_eq(tern_model_check_context(m, ctx + 1, &merr), -1);
        cr_expect_str_eq(err.msg, merr.msg, "case %zu", i);
        tern_model_free(m);
    }
    tern_model_dir_info info;
    tern_error err;
    cr_expect_eq(tern_model_dir_probe("/nonexistent-model", NULL, 0, &info, &err), -1);
    cr_expect(strstr(err.msg, "/nonexistent-model/config.json"), "%s", err.msg);
}
