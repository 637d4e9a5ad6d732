/* The generation loop (tern_generate) on the oracle fixtures: greedy ids
 * equal the reference's, and each stop condition ends it as documented. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "model/safetensors.h"
#include "tern.h"
#include "testutil.h"

typedef struct {
    int32_t ids[64];
    int n;
} collected;

static void collect(void *ctx, int32_t id) {
    collected *c = ctx;
    if (c->n < 64) c->ids[c->n++] = id;
}

static tern_model *load(const char *name) {
    tern_error err;
    tern_load_params lp = {.n_threads = 2};
    tern_model *m = tern_model_load(fixture_dir(name), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    return m;
}

static tern_gen_params greedy(int n) {
    tern_gen_params p;
    memset(&p, 0, sizeof p);
    tern_sampler_params_default(&p.sampling);   /* do_sample 0 */
    p.n_predict = n;
    p.on_token = collect;
    p.ignore_eos = 1;   /* the references run past EOS ids */
    return p;
}

Test(generate, greedy_ids_match_reference) {
    tern_model *m = load("tiny");
    reference ref;
    cr_assert_eq(reference_open(&ref, "tiny"), 0);
    const tern_tensor *gp = reference_get(&ref, "greedy.prompt"), *gt = reference_get(&ref, "greedy.tokens");
    tern_error err;
    tern_session *s = tern_session_create(m, NULL, &err);
    tern_gen_params p = greedy((int)gt->numel);
    collected c = {{0}, 0};
    tern_gen_stats st;
    cr_assert_eq(tern_generate(s, NULL, gp->data, (size_t)gp->numel, &p, NULL, &c, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(st.n_generated, gt->numel);
    cr_assert_eq(st.stop_reason, TERN_STOP_LENGTH);
    cr_assert_eq(memcmp(c.ids, gt->data, (size_t)gt->numel * sizeof(int32_t)), 0);
    /* every generated token entered the session */
    cr_assert_eq(tern_session_pos(s), gp->numel + gt->numel);
    tern_session_destroy(s);
    reference_close(&ref);
    tern_model_free(m);
}

Test(generate, stops_at_eos_and_keeps_it) {
    tern_model *m = load("tiny");
    reference ref;
    cr_assert_eq(reference_open(&ref, "tiny"), 0);
    const tern_tensor *gp = reference_get(&ref, "greedy.prompt"), *gt = reference_get(&ref, "greedy.tokens");
    const int32_t *want = gt->data;
    tern_error err;
    tern_session *s = tern_session_create(m, NULL, &err);
    tern_gen_params p = greedy(32);
    p.ignore_eos = 0;
    p.sampling.n_eos = 1;
    p.sampling.eos_ids[0] = want[5];            /* the 6th greedy token ends it */
    int first = 0;
    while (want[first] != want[5]) first++;       /* unless it occurs earlier */
    collected c = {{0}, 0};
    tern_gen_stats st;
    cr_assert_eq(tern_generate(s, NULL, gp->data, (size_t)gp->numel, &p, NULL, &c, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(st.stop_reason, TERN_STOP_EOS);
    cr_assert_eq(st.n_generated, first + 1);
    cr_assert_eq(st.last_token, want[5]);
    cr_assert_eq(tern_session_pos(s), gp->numel + first + 1);
    tern_session_destroy(s);
    reference_close(&ref);
    tern_model_free(m);
}

Test(generate, stops_at_context_end) {
    tern_model *m = load("tiny");
    tern_error err;
    tern_session_params sp = {.max_context = 20};
    tern_session *s = tern_session_create(m, &sp, &err);
    tern_gen_params p = greedy(100);
    int32_t prompt[4] = {1, 2, 3, 4};
    collected c = {{0}, 0};
    tern_gen_stats st;
    cr_assert_eq(tern_generate(s, NULL, prompt, 4, &p, NULL, &c, &st, &err), 0, "%s", err.msg);
    cr_assert_eq(st.stop_reason, TERN_STOP_CONTEXT);
    cr_assert_eq(tern_session_pos(s), 20);
    tern_session_destroy(s);
    tern_model_free(m);
}

Test(generate, same_seed_same_tokens) {
    tern_model *m = load("odd");
    tern_error err;
    int32_t prompt[3] = {7, 8, 9};
    collected a = {{0}, 0}, b = {{0}, 0};
    for (int run = 0; run < 2; run++) {
        tern_session *s = tern_session_create(m, NULL, &err);
        tern_gen_params p = greedy(24);
        p.sampling.do_sample = 1;
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 0;
        p.sampling.seed = 1234;
        tern_gen_stats st;
        cr_assert_eq(tern_generate(s, NULL, prompt, 3, &p, NULL, run ? &b : &a, &st, &err), 0, "%s", err.msg);
        tern_session_destroy(s);
    }
    cr_assert_eq(a.n, 24);
    cr_assert_eq(memcmp(a.ids, b.ids, sizeof a.ids), 0);
    tern_model_free(m);
}
