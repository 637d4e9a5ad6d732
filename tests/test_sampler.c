/* Sampler: the truncated distributions are checked against an independent
 * straightforward computation, both exactly (tern_sampler_probs) and by a
 * chi-square goodness-of-fit test over many draws. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/sampler.h"

#define N_VOCAB 16
#define N_VALID 12

/* Rows 12..15 are padding with logits no real token can beat. */
static const float LOGITS[N_VOCAB] = {2.0f, 1.5f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f,
                                      3.0f, -2.0f, 0.2f, 1.2f, 50, 50, 50, 50};

/* ---- the reference: sort everything, cut, renormalise ---------------------- */

static void reference(const float *logits, float t, int top_k, float top_p, float min_p,
                      double *p) {
    int order[N_VALID];
    double z = 0;
    for (int i = 0; i < N_VALID; i++) {
        p[i] = exp((double)logits[i] / t);
        z += p[i];
        order[i] = i;
    }
    for (int i = 0; i < N_VALID; i++) p[i] /= z;
    for (int i = 0; i < N_VALID; i++)  /* selection sort: probability down, id up */
        for (int j = i + 1; j < N_VALID; j++)
            if (p[order[j]] > p[order[i]]) {
                int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
    int keep = top_k > 0 && top_k < N_VALID ? top_k : N_VALID;
    double mass = 0, cum = 0;
    for (int i = 0; i < keep; i++) mass += p[order[i]];
    if (top_p < 1)
        for (int i = 0; i < keep; i++) {
            cum += p[order[i]] / mass;
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
    if (min_p > 0)
        for (int i = 1; i < keep; i++)
            if (p[order[i]] < min_p * p[order[0]]) {
                keep = i;
                break;
            }
    double kept = 0;
    for (int i = 0; i < keep; i++) kept += p[order[i]];
    double q[N_VALID] = {0};
    for (int i = 0; i < keep; i++) q[order[i]] = p[order[i]] / kept;
    memcpy(p, q, sizeof q);
}

/* Upper 1e-5 tail of chi-square with df degrees (Wilson-Hilferty). */
static double chi2_critical(int df) {
    double z = 4.265, a = 2.0 / (9.0 * df);
    return df * pow(1 - a + z * sqrt(a), 3);
}

typedef struct config {
    const char *name;
    float t;
    int top_k;
    float top_p, min_p;
} config;

static void check_config(const config *c) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.do_sample = 1;
    sp.temperature = c->t;
    sp.top_k = c->top_k;
    sp.top_p = c->top_p;
    sp.min_p = c->min_p;
    sp.seed = 1234;
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, N_VOCAB, N_VALID, &err);
    cr_assert(s, "%s", err.msg);

    double want[N_VALID];
    reference(LOGITS, c->t, c->top_k, c->top_p, c->min_p, want);
    float probs[N_VOCAB];
    cr_assert_eq(tern_sampler_probs(s, LOGITS, NULL, 0, probs, &err), 0);
    for (int i = 0; i < N_VOCAB; i++)
        cr_expect(fabs(probs[i] - (i < N_VALID ? want[i] : 0)) < 1e-6,
                  "%s: p[%d] = %g, want %g", c->name, i, probs[i], i < N_VALID ? want[i] : 0);

    enum { DRAWS = 200000 };
    long seen[N_VOCAB] = {0};
    for (int d = 0; d < DRAWS; d++) {
        int32_t id = tern_sampler_sample(s, LOGITS, NULL, 0, &err);
        cr_assert(id >= 0 && id < N_VOCAB);
        seen[id]++;
    }
    double chi2 = 0;
    int support = 0;
    for (int i = 0; i < N_VOCAB; i++) {
        double e = i < N_VALID ? want[i] * DRAWS : 0;
        if (e == 0) {
            cr_expect_eq(seen[i], 0, "%s: id %d drawn %ld times outside the support", c->name,
                         i, seen[i]);
            continue;
        }
        support++;
        chi2 += (seen[i] - e) * (seen[i] - e) / e;
    }
    if (support > 1)
        cr_expect(chi2 < chi2_critical(support - 1), "%s: chi2 %.2f over %d ids (critical %.2f)",
                  c->name, chi2, support, chi2_critical(support - 1));
    tern_sampler_destroy(s);
}

Test(sampler, truncated_distributions_fit) {
    static const config configs[] = {
        {"temperature_only", 1.3f, 0, 1.0f, 0},
        {"top_k", 1.0f, 4, 1.0f, 0},
        {"top_p", 1.0f, 0, 0.8f, 0},
        {"min_p", 1.0f, 0, 1.0f, 0.2f},
        {"top_k_then_top_p", 1.0f, 5, 0.6f, 0},
        {"all", 0.7f, 6, 0.9f, 0.05f},
        {"min_p_cuts_after_top_p", 2.0f, 0, 0.95f, 0.3f},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) check_config(&configs[i]);
}

/* ---- determinism, greedy, masking ------------------------------------------- */

static tern_sampler *sampling(uint64_t seed, int n_vocab, int n_valid) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.do_sample = 1;
    sp.top_k = 0;
    sp.seed = seed;
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, n_vocab, n_valid, &err);
    cr_assert(s, "%s", err.msg);
    return s;
}

Test(sampler, same_seed_same_tokens) {
    tern_sampler *a = sampling(42, N_VOCAB, N_VALID), *b = sampling(42, N_VOCAB, N_VALID),
                 *c = sampling(43, N_VOCAB, N_VALID);
    int32_t first[500];
    int differ = 0;
    tern_error err;
    for (int i = 0; i < 500; i++) {
        first[i] = tern_sampler_sample(a, LOGITS, NULL, 0, &err);
        cr_expect_eq(tern_sampler_sample(b, LOGITS, NULL, 0, &err), first[i]);
        differ += tern_sampler_sample(c, LOGITS, NULL, 0, &err) != first[i];
    }
    cr_expect(differ > 100, "seeds 42 and 43 agree on %d of 500 draws", 500 - differ);
    tern_sampler_seed(a, 42);
    for (int i = 0; i < 500; i++) cr_expect_eq(tern_sampler_sample(a, LOGITS, NULL, 0, &err), first[i]);
    tern_sampler_destroy(a);
    tern_sampler_destroy(b);
    tern_sampler_destroy(c);
}

Test(sampler, greedy_is_argmax_of_valid_ids) {
    enum { V = 1000, VALID = 990 };
    float *logits = malloc(V * sizeof *logits);
    srand(7);
    for (int i = 0; i < V; i++) logits[i] = (float)rand() / RAND_MAX * 10 - 5;
    for (int i = VALID; i < V; i++) logits[i] = 100;  /* padding */
    logits[500] = logits[300] = 9;                     /* a tie: the lower id wins */
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);  /* do_sample = 0 */
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, V, VALID, &err);
    cr_assert(s);
    cr_expect_eq(tern_sampler_sample(s, logits, NULL, 0, &err), 300);
    logits[777] = 9.5f;
    cr_expect_eq(tern_sampler_sample(s, logits, NULL, 0, &err), 777);
    tern_sampler_destroy(s);

    sp.do_sample = 1;
    sp.temperature = 0;  /* temperature 0 is greedy too */
    s = tern_sampler_create(&sp, V, VALID, &err);
    cr_expect_eq(tern_sampler_sample(s, logits, NULL, 0, &err), 777);
    tern_sampler_destroy(s);
    free(logits);
}

Test(sampler, padding_is_never_sampled) {
    tern_sampler *s = sampling(9, N_VOCAB, N_VALID);
    float probs[N_VOCAB];
    tern_error err;
    for (int i = 0; i < 20000; i++) {
        int32_t id = tern_sampler_sample(s, LOGITS, NULL, 0, &err);
        cr_assert(id >= 0 && id < N_VALID, "drew padding id %d", id);
    }
    cr_assert_eq(tern_sampler_probs(s, LOGITS, NULL, 0, probs, &err), 0);
    for (int i = N_VALID; i < N_VOCAB; i++) cr_expect_eq(probs[i], 0);
    tern_sampler_destroy(s);
}

/* A grammar's mask: only its ids are drawn, and the distribution is
 * renormalised over them. */
Test(sampler, masked_ids_are_never_sampled) {
    tern_sampler *s = sampling(9, N_VOCAB, N_VALID);
    uint32_t mask[(N_VOCAB + 31) / 32] = {0};
    int allowed[] = {1, 7, N_VALID - 1};
    for (int k = 0; k < 3; k++) mask[allowed[k] >> 5] |= 1u << (allowed[k] & 31);
    tern_sampler_set_mask(s, mask);
    float probs[N_VOCAB];
    tern_error err;
    for (int i = 0; i < 5000; i++) {
        int32_t id = tern_sampler_sample(s, LOGITS, NULL, 0, &err);
        cr_assert(id == allowed[0] || id == allowed[1] || id == allowed[2], "drew masked id %d", id);
    }
    cr_assert_eq(tern_sampler_probs(s, LOGITS, NULL, 0, probs, &err), 0);
    double total = 0;
    for (int i = 0; i < N_VOCAB; i++) {
        int ok = i == allowed[0] || i == allowed[1] || i == allowed[2];
        cr_expect(ok || probs[i] == 0, "id %d has probability %g", i, probs[i]);
        total += probs[i];
    }
    cr_expect_float_eq(total, 1.0, 1e-5);
    tern_sampler_set_mask(s, NULL);
    int other = 0;
    for (int i = 0; i < 200; i++) {
        int32_t id = tern_sampler_sample(s, LOGITS, NULL, 0, &err);
        other |= id != allowed[0] && id != allowed[1] && id != allowed[2];
    }
    cr_expect(other, "without the mask other ids come back");
    tern_sampler_destroy(s);
}

Test(sampler, no_finite_logit_is_an_error) {
    float logits[4] = {-INFINITY, NAN, -INFINITY, 5};
    tern_sampler *s = sampling(1, 4, 3);
    tern_error err = {{0}};
    cr_expect_eq(tern_sampler_sample(s, logits, NULL, 0, &err), -1);
    cr_expect(strstr(err.msg, "finite") != NULL, "%s", err.msg);
    tern_sampler_destroy(s);
}

/* ---- penalties ----------------------------------------------------------------- */

Test(sampler, penalties_change_the_right_logits) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.do_sample = 1;
    sp.temperature = 2;
    sp.repetition_penalty = 1.5f;
    sp.frequency_penalty = 0.5f;
    sp.presence_penalty = 0.25f;
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, N_VOCAB, N_VALID, &err);
    cr_assert(s);
    /* id 0 (logit 2) seen twice, id 7 (logit -1) once; 14 is padding and
     * -1 nothing: both ignored. */
    const int32_t history[] = {0, 7, 0, 14, -1};
    float out[N_VOCAB];
    cr_assert_eq(tern_sampler_logits(s, LOGITS, history, 5, out, &err), 0);
    for (int i = 0; i < N_VOCAB; i++) {
        float want = i >= N_VALID ? -INFINITY
                   : i == 0       ? (2.0f / 1.5f - 2 * 0.5f - 0.25f) / 2
                   : i == 7       ? (-1.0f * 1.5f - 0.5f - 0.25f) / 2
                                  : LOGITS[i] / 2;
        cr_expect(fabsf(out[i] - want) < 1e-6f || out[i] == want, "logit %d: %g, want %g", i,
                  out[i], want);
    }
    /* The counts are cleared between calls: the same call gives the same. */
    float again[N_VOCAB];
    tern_sampler_logits(s, LOGITS, history, 5, again, &err);
    cr_expect_arr_eq(again, out, sizeof out);
    tern_sampler_destroy(s);
}

Test(sampler, penalties_steer_greedy) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.presence_penalty = 1.5f;  /* 3.0 - 1.5 < 2.0: id 8 loses to id 0 */
    tern_error err;
    tern_sampler *s = tern_sampler_create(&sp, N_VOCAB, N_VALID, &err);
    const int32_t history[] = {8};
    cr_expect_eq(tern_sampler_sample(s, LOGITS, NULL, 0, &err), 8);
    cr_expect_eq(tern_sampler_sample(s, LOGITS, history, 1, &err), 0);
    tern_sampler_destroy(s);
}

/* ---- generation_config.json --------------------------------------------------- */

static void write_config(const char *dir, const char *json) {
    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(json, f);
    fclose(f);
}

Test(sampler, generation_config_of_qwen36) {
    tern_sampler_params p;
    tern_error err;
    cr_assert_eq(tern_sampler_params_load(&p, "tests/fixtures/qwen36-config", &err), 0, "%s",
                 err.msg);
    cr_expect_eq(p.do_sample, 1);
    cr_expect_float_eq(p.temperature, 1.0f, 1e-6);
    cr_expect_eq(p.top_k, 20);
    cr_expect_float_eq(p.top_p, 0.95f, 1e-6);
    cr_expect_eq(p.min_p, 0);
    cr_expect_eq(p.repetition_penalty, 1);
    cr_expect_eq(p.n_eos, 2);
    cr_expect(tern_sampler_is_eos(&p, 248046) && tern_sampler_is_eos(&p, 248044));
    cr_expect(!tern_sampler_is_eos(&p, 248045));
}

Test(sampler, generation_config_fields_and_errors) {
    char dir[] = "/tmp/tern-sampler-XXXXXX";
    cr_assert(mkdtemp(dir));
    tern_sampler_params p;
    tern_error err = {{0}};
    write_config(dir, "{\"do_sample\": false, \"temperature\": 0.6, \"top_k\": 40, "
                      "\"min_p\": 0.05, \"repetition_penalty\": 1.1, \"eos_token_id\": 7}");
    cr_assert_eq(tern_sampler_params_load(&p, dir, &err), 0, "%s", err.msg);
    cr_expect_eq(p.do_sample, 0);
    cr_expect_float_eq(p.temperature, 0.6f, 1e-6);
    cr_expect_eq(p.top_k, 40);
    cr_expect_float_eq(p.top_p, 1.0f, 1e-6);  /* absent: transformers' default */
    cr_expect_float_eq(p.min_p, 0.05f, 1e-6);
    cr_expect_float_eq(p.repetition_penalty, 1.1f, 1e-6);
    cr_expect(p.n_eos == 1 && p.eos_ids[0] == 7);

    write_config(dir, "{\"top_k\": \"20\"}");
    cr_expect_eq(tern_sampler_params_load(&p, dir, &err), -1);
    cr_expect(strstr(err.msg, "top_k") != NULL, "%s", err.msg);
    write_config(dir, "{\"eos_token_id\": [1, \"x\"]}");
    cr_expect_eq(tern_sampler_params_load(&p, dir, &err), -1);
    cr_expect(strstr(err.msg, "eos_token_id[1]") != NULL, "%s", err.msg);

    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_config(dir, "{\"top_k\": ");
    cr_expect_eq(tern_sampler_params_load(&p, dir, &err), -1);
    cr_expect(strstr(err.msg, "generation_config.json") != NULL, "%s", err.msg);
    unlink(path);
    /* no file at all: the defaults */
    cr_expect_eq(tern_sampler_params_load(&p, dir, &err), 0, "%s", err.msg);
    cr_expect_eq(p.do_sample, 0);
    cr_expect_eq(p.top_k, 50);
    cr_expect_eq(p.n_eos, 0);
    rmdir(dir);
}
