/* Several sessions in one forward pass (tern_session_eval_many): each
 * session's logits are bit for bit the ones it gets alone, whatever else
 * shares the step: prefill chunks beside decode steps, sessions joining
 * and leaving, different KV precisions, and experts streamed through a
 * slot cache. Bad calls are refused before any session moves. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"
#include "tern.h"
#include "testutil.h"

#define SEQS 4
#define STEPS 12
#define PROMPT_MAX 40

typedef struct {
    int32_t prompt[PROMPT_MAX];
    int n_prompt, start, stop;   /* joins at step `start`, leaves after step `stop` */
    int chunk;                   /* prompt tokens per step while it prefills */
    int kv_bits;
} plan;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

static void make_plans(plan *p, int V) {
    static const int len[SEQS] = {5, 33, 1, 17}, start[SEQS] = {0, 0, 3, 5}, stop[SEQS] = {STEPS, 7, STEPS, 10};
    static const int chunk[SEQS] = {5, 8, 1, 17}, bits[SEQS] = {16, 8, 32, 16};
    for (int i = 0; i < SEQS; i++) {
        p[i] = (plan){.n_prompt = len[i], .start = start[i], .stop = stop[i], .chunk = chunk[i], .kv_bits = bits[i]};
        for (int t = 0; t < len[i]; t++) p[i].prompt[t] = (int32_t)((t * 7919 + i * 131 + 5) % V);
    }
}

/* The logits of every step session i takes, run alone: its prompt in the
 * plan's chunks, then greedy decode steps (each step's last logits). */
static float *alone(tern_model *m, const plan *p, int V, int *n_steps) {
    tern_error err;
    tern_session_params sp = {.kv_bits = p->kv_bits};
    tern_session *s = tern_session_create(m, &sp, &err);
    cr_assert_not_null(s, "%s", err.msg);
    float *out = malloc((size_t)(STEPS + 1) * V * sizeof *out);
    int k = 0, done = 0;
    for (int step = p->start; step <= p->stop; step++, k++) {
        float *lg = out + (size_t)k * V;
        if (done < p->n_prompt) {
            int n = p->n_prompt - done < p->chunk ? p->n_prompt - done : p->chunk;
            cr_assert_eq(tern_session_eval(s, p->prompt + done, n, lg, 0, &err), 0, "%s", err.msg);
            done += n;
        } else {
            int32_t next = argmax(lg - V, V);
            cr_assert_eq(tern_session_eval(s, &next, 1, lg, 0, &err), 0, "%s", err.msg);
        }
    }
    *n_steps = k;
    tern_session_destroy(s);
    return out;
}

static void check_model(tern_model *m) {
    int V = tern_model_vocab_size(m);
    plan p[SEQS];
    make_plans(p, V);
    float *ref[SEQS];
    int n_ref[SEQS];
    for (int i = 0; i < SEQS; i++) ref[i] = alone(m, &p[i], V, &n_ref[i]);

    tern_error err;
    tern_session *s[SEQS];
    float *mine[SEQS];
    int done[SEQS] = {0}, k[SEQS] = {0};
    for (int i = 0; i < SEQS; i++) {
        tern_session_params sp = {.kv_bits = p[i].kv_bits};
        s[i] = tern_session_create(m, &sp, &err);
        cr_assert_not_null(s[i], "%s", err.msg);
        mine[i] = malloc((size_t)(STEPS + 1) * V * sizeof(float));
    }
    float *logits = malloc((size_t)SEQS * V * sizeof *logits);
    for (int step = 0; step <= STEPS; step++) {
        tern_session *in[SEQS];
        const int32_t *tok[SEQS];
        int32_t next[SEQS];
        int n[SEQS], who[SEQS], b = 0;
        for (int i = 0; i < SEQS; i++) {
            if (step < p[i].start || step > p[i].stop) continue;
            if (done[i] < p[i].n_prompt) {
                n[b] = p[i].n_prompt - done[i] < p[i].chunk ? p[i].n_prompt - done[i] : p[i].chunk;
                tok[b] = p[i].prompt + done[i];
                done[i] += n[b];
            } else {
                next[i] = argmax(mine[i] + (size_t)(k[i] - 1) * V, V);
                n[b] = 1;
                tok[b] = &next[i];
            }
            in[b] = s[i];
            who[b++] = i;
        }
        if (!b) continue;
        cr_assert_eq(tern_session_eval_many(in, tok, n, b, logits, &err), 0, "step %d: %s", step, err.msg);
        for (int j = 0; j < b; j++) {
            int i = who[j];
            memcpy(mine[i] + (size_t)k[i]++ * V, logits + (size_t)j * V, (size_t)V * sizeof(float));
        }
    }
    for (int i = 0; i < SEQS; i++) {
        cr_assert_eq(k[i], n_ref[i], "session %d took %d steps, %d alone", i, k[i], n_ref[i]);
        for (int t = 0; t < k[i]; t++)
            cr_assert(!memcmp(mine[i] + (size_t)t * V, ref[i] + (size_t)t * V, (size_t)V * sizeof(float)),
                      "session %d, its step %d: the logits differ from the ones it gets alone", i, t);
        cr_assert_eq(tern_session_pos(s[i]), p[i].n_prompt + k[i] - (p[i].n_prompt + p[i].chunk - 1) / p[i].chunk);
        tern_session_destroy(s[i]);
        free(mine[i]);
        free(ref[i]);
    }
    free(logits);
}

Test(batch, sessions_together_give_their_own_logits) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    check_model(m);
    tern_model_free(m);
}

/* The same through a slot cache of top_k + 1 experts per layer (the
 * synthetic small shape: 16 experts, top 4), so a step's experts come in
 * waves that depend on what the other sessions chose. */
Test(batch, streamed_experts_give_their_own_logits) {
    char *tmp = make_temp_dir(), dst[1200], path[1300];
    snprintf(dst, sizeof dst, "%s/model", tmp);
    tern_synth_params sp = {.shape = "small", .routing = "prose", .bits = 4, .dst = dst, .n_threads = 2};
    tern_error err;
    cr_assert_eq(tern_synth(&sp, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/manifest.json", dst);
    json_t *man = json_load_file(path, 0, NULL), *ex = json_object_get(man, "experts");
    uint64_t stride = (uint64_t)json_integer_value(json_object_get(ex, "stride"));
    uint64_t files = json_array_size(json_object_get(ex, "layers"));
    json_decref(man);
    cr_assert(stride && files);
    tern_load_params lp = {.n_threads = 2, .expert_budget = stride * files * 5};
    tern_model *m = tern_model_load(dst, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    check_model(m);
    tern_model_free(m);
    rm_rf(tmp);
    free(tmp);
}

Test(batch, bad_calls_are_refused_before_any_session_moves) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    tern_model *m2 = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m2, "%s", err.msg);
    tern_session *a = tern_session_create(m, NULL, &err), *b = tern_session_create(m, NULL, &err);
    tern_session *c = tern_session_create(m2, NULL, &err);
    cr_assert(a && b && c);
    int32_t ok[2] = {3, 4}, bad[1] = {1 << 30};
    const int32_t *tok[2] = {ok, bad};
    int n[2] = {2, 1};
    tern_session *two[2] = {a, b};
    cr_assert_neq(tern_session_eval_many(two, tok, n, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "session 1") && strstr(err.msg, "out of range"), "%s", err.msg);
    cr_assert_eq(tern_session_pos(a), 0, "session 0 moved though session 1 was refused");
    tok[1] = ok;
    tern_session *same[2] = {a, a};
    cr_assert_neq(tern_session_eval_many(same, tok, n, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "session 1 is also session 0"), "%s", err.msg);
    tern_session *mixed[2] = {a, c};
    cr_assert_neq(tern_session_eval_many(mixed, tok, n, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "another model"), "%s", err.msg);
    cr_assert_neq(tern_session_eval_many(two, NULL, n, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "are needed"), "%s", err.msg);
    const int32_t *hole[2] = {ok, NULL};
    cr_assert_neq(tern_session_eval_many(two, hole, n, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "session 1: its tokens are NULL"), "%s", err.msg);
    int zero[2] = {2, 0};
    cr_assert_neq(tern_session_eval_many(two, tok, zero, 2, NULL, &err), 0);
    cr_assert(strstr(err.msg, "no tokens"), "%s", err.msg);
    cr_assert_neq(tern_session_eval_many(two, tok, n, 0, NULL, &err), 0);
    cr_assert_eq(tern_session_eval_many(two, tok, n, 2, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_pos(a), 2);
    cr_assert_eq(tern_session_pos(b), 1);
    tern_session_destroy(a);
    tern_session_destroy(b);
    tern_session_destroy(c);
    tern_model_free(m);
    tern_model_free(m2);
}

/* ---- generations in steps, batched ---------------------------------------- */

typedef struct {
    int32_t ids[64];
    int n;
    char text[4096];
    size_t len;
} gen_out;

static void collect_id(void *ctx, int32_t id) {
    gen_out *o = ctx;
    if (o->n < 64) o->ids[o->n++] = id;
}

static int collect_text(void *ctx, const char *text, size_t len) {
    gen_out *o = ctx;
    if (o->len + len < sizeof o->text) memcpy(o->text + o->len, text, len), o->len += len;
    return 0;
}

/* Three sampled generations (own seeds, penalties, lengths, a stop
 * string) run as tern_gen steps through tern_session_eval_many, sessions
 * finishing at different steps: each gives the ids, the text and the stop
 * reason tern_generate gives alone. */
Test(batch, generations_in_steps_match_tern_generate) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    tern_tokenizer *tok = tern_tokenizer_load(fixture_dir("tern_tiny"), &err);
    cr_assert_not_null(tok, "%s", err.msg);
    enum { G = 3 };
    static const int32_t prompts[G][6] = {{11, 400, 23, 999, 5, 17}, {7, 8, 9, 10, 11, 12}, {300, 2, 44, 81, 6, 90}};
    static const char *stops[] = {"the"};
    tern_gen_params p[G];
    for (int i = 0; i < G; i++) {
        p[i] = (tern_gen_params){.n_predict = 12 + 9 * i, .ignore_eos = i != 1, .on_token = collect_id};
        p[i].sampling = (tern_sampler_params){.do_sample = 1, .temperature = 1.0f, .top_k = 40, .top_p = 0.9f,
                                              .repetition_penalty = i == 2 ? 1.3f : 1.0f, .seed = 100 + (uint64_t)i};
        if (i == 1) p[i].stop = stops, p[i].n_stop = 1;
    }
    gen_out alone[G] = {0}, mine[G] = {0};
    tern_gen_stats st_alone[G], st_mine[G];
    for (int i = 0; i < G; i++) {
        tern_session *s = tern_session_create(m, NULL, &err);
        cr_assert_not_null(s, "%s", err.msg);
        cr_assert_eq(tern_generate(s, tok, prompts[i], 6, &p[i], collect_text, &alone[i], &st_alone[i], &err), 0,
                     "%s", err.msg);
        tern_session_destroy(s);
    }
    tern_session *s[G];
    tern_gen *g[G];
    for (int i = 0; i < G; i++) {
        s[i] = tern_session_create(m, NULL, &err);
        cr_assert_not_null(s[i], "%s", err.msg);
        g[i] = tern_gen_create(s[i], tok, prompts[i], 6, &p[i], collect_text, &mine[i], &err);
        cr_assert_not_null(g[i], "%s", err.msg);
    }
    int V = tern_model_vocab_size(m);
    float *logits = malloc((size_t)G * V * sizeof *logits);
    for (int running = G; running > 0;) {
        tern_session *in[G];
        const int32_t *tokens[G];
        int n[G], who[G], b = 0;
        for (int i = 0; i < G; i++) {
            if (!g[i] || !(n[b] = tern_gen_input(g[i], &tokens[b]))) continue;
            in[b] = s[i];
            who[b++] = i;
        }
        for (int i = 0; i < G; i++)
            if (g[i] && !tern_gen_input(g[i], &(const int32_t *){NULL})) {
                tern_gen_end(g[i], 1, &st_mine[i]);
                g[i] = NULL;
                running--;
            }
        if (!b) continue;
        cr_assert_eq(tern_session_eval_many(in, tokens, n, b, logits, &err), 0, "%s", err.msg);
        for (int j = 0; j < b; j++)
            cr_assert_eq(tern_gen_take(g[who[j]], logits + (size_t)j * V, &err), 0, "%s", err.msg);
    }
    for (int i = 0; i < G; i++) {
        cr_assert_eq(mine[i].n, alone[i].n, "generation %d: %d ids in steps, %d alone", i, mine[i].n, alone[i].n);
        cr_assert(!memcmp(mine[i].ids, alone[i].ids, (size_t)alone[i].n * sizeof(int32_t)), "generation %d: ids differ",
                  i);
        cr_assert_eq(mine[i].len, alone[i].len, "generation %d: text lengths differ", i);
        cr_assert(!memcmp(mine[i].text, alone[i].text, alone[i].len), "generation %d: texts differ", i);
        cr_assert_eq(st_mine[i].stop_reason, st_alone[i].stop_reason, "generation %d", i);
        cr_assert_eq(st_mine[i].n_generated, st_alone[i].n_generated, "generation %d", i);
        cr_assert_eq(tern_session_pos(s[i]), 6 + alone[i].n, "generation %d: every sampled id is evaluated", i);
        tern_session_destroy(s[i]);
    }
    free(logits);
    tern_tokenizer_free(tok);
    tern_model_free(m);
}

static void collect(void *ctx, int32_t id) {
    int32_t **at = ctx;
    *(*at)++ = id;
}

/* tern_gen_step_many: three sampled generations stepping together, one of
 * them joining late with a session prefilled in chunks beside them (the
 * server's chunked prefill), draw the tokens each draws alone with
 * tern_generate (each its own seed). */
Test(batch, generations_step_together) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    int V = tern_model_vocab_size(m);
    enum { G = 3, N = 20, P = 23, CHUNK = 5 };
    int32_t prompt[G][P], got[G][N], want[G][N];
    tern_gen_params gp[G];
    for (int i = 0; i < G; i++) {
        for (int t = 0; t < P; t++) prompt[i][t] = (int32_t)((t * 7919 + i * 131 + 5) % V);
        gp[i] = (tern_gen_params){.n_predict = N, .ignore_eos = 1, .on_token = collect};
        tern_sampler_params_default(&gp[i].sampling);
        gp[i].sampling.do_sample = 1;
        gp[i].sampling.temperature = 0.9f;
        gp[i].sampling.top_k = 20;
        gp[i].sampling.seed = 11 + (uint64_t)i;
    }
    tern_session *s[G];
    for (int i = 0; i < G; i++) {
        cr_assert_not_null(s[i] = tern_session_create(m, &(tern_session_params){0}, &err), "%s", err.msg);
        int32_t *at = want[i];
        tern_gen_stats st;
        cr_assert_eq(tern_generate(s[i], NULL, prompt[i], P, &gp[i], NULL, &at, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(st.n_generated, N);
        cr_assert_eq(tern_session_reset(s[i], &err), 0, "%s", err.msg);
    }
    /* generations 0 and 1 start at once; 2's prompt is prefilled in
     * chunks beside them (all but its last token), then it joins */
    int32_t *at[G] = {got[0], got[1], got[2]};
    tern_gen *g[G] = {0};
    for (int i = 0; i < 2; i++)
        cr_assert_not_null(g[i] = tern_gen_create(s[i], NULL, prompt[i], P, &gp[i], NULL, &at[i], &err), "%s", err.msg);
    float *logits = malloc((size_t)G * V * sizeof *logits);
    int done2 = 0, rc[G];
    for (;;) {
        tern_gen *live[G];
        int n_live = 0;
        const int32_t *tok;
        for (int i = 0; i < G; i++)
            if (g[i] && tern_gen_input(g[i], &tok) > 0) live[n_live++] = g[i];
        if (!n_live) break;
        int pn = P - 1 - done2 < CHUNK ? P - 1 - done2 : CHUNK;
        const int32_t *ptok = prompt[2] + done2;
        int extra = !g[2] && pn > 0;
        cr_assert_eq(tern_gen_step_many(live, n_live, &s[2], &ptok, &pn, extra, logits, rc, &err), 0, "%s", err.msg);
        for (int k = 0; k < n_live; k++) cr_assert_eq(rc[k], 0, "%s", err.msg);
        if (extra && (done2 += pn) == P - 1)
            cr_assert_not_null(g[2] = tern_gen_create(s[2], NULL, prompt[2] + P - 1, 1, &gp[2], NULL, &at[2], &err),
                               "%s", err.msg);
    }
    for (int i = 0; i < G; i++) {
        tern_gen_stats st;
        tern_gen_end(g[i], 1, &st);
        cr_assert_eq(st.n_generated, N, "generation %d: %d tokens", i, st.n_generated);
        cr_assert(!memcmp(got[i], want[i], sizeof want[i]), "generation %d drew other tokens than alone", i);
        tern_session_destroy(s[i]);
    }
    free(logits);
    tern_model_free(m);
}

/* Bad calls of tern_gen_step_many are refused with a message, nothing
 * moved: nothing to step, NULL pieces, a generation that is over, a
 * session stepped twice. */
Test(batch, step_many_refuses_bad_calls) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    int V = tern_model_vocab_size(m);
    tern_session *s = tern_session_create(m, &(tern_session_params){0}, &err);
    cr_assert_not_null(s, "%s", err.msg);
    int32_t prompt[3] = {1, 2, 3};
    tern_gen_params gp = {.n_predict = 1, .ignore_eos = 1};
    tern_sampler_params_default(&gp.sampling);
    tern_gen *g = tern_gen_create(s, NULL, prompt, 3, &gp, NULL, NULL, &err);
    cr_assert_not_null(g, "%s", err.msg);
    float *logits = malloc((size_t)2 * V * sizeof *logits);
    int rc[2];
    tern_gen *none[1] = {NULL};
    const int32_t *tok = prompt;
    int n = 1;
    cr_assert_eq(tern_gen_step_many(&g, 0, NULL, NULL, NULL, 0, logits, rc, &err), -1);
    cr_assert(strstr(err.msg, "no generations"), "%s", err.msg);
    cr_assert_eq(tern_gen_step_many(none, 1, NULL, NULL, NULL, 0, logits, rc, &err), -1);
    cr_assert(strstr(err.msg, "generation 0 is NULL"), "%s", err.msg);
    cr_assert_eq(tern_gen_step_many(&g, 1, NULL, NULL, NULL, 0, NULL, rc, &err), -1);
    cr_assert_eq(tern_gen_step_many(&g, 1, NULL, &tok, &n, 1, logits, rc, &err), -1);
    cr_assert(strstr(err.msg, "extra"), "%s", err.msg);
    /* its own session again as an extra one */
    cr_assert_eq(tern_gen_step_many(&g, 1, &s, &tok, &n, 1, logits, rc, &err), -1);
    cr_assert(strstr(err.msg, "is also session"), "%s", err.msg);
    cr_assert_eq(tern_session_pos(s), 0, "a refused step moved the session");
    /* two steps end a one-token generation; a third is refused */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(tern_gen_step_many(&g, 1, NULL, NULL, NULL, 0, logits, rc, &err), 0, "%s", err.msg);
        cr_assert_eq(rc[0], 0, "%s", err.msg);
    }
    cr_assert_eq(tern_gen_step_many(&g, 1, NULL, NULL, NULL, 0, logits, rc, &err), -1);
    cr_assert(strstr(err.msg, "is over"), "%s", err.msg);
    tern_gen_end(g, 1, NULL);
    free(logits);
    tern_session_destroy(s);
    tern_model_free(m);
}

/* A session's KV rows grow in steps that kv_bytes_at foresees; released,
 * their memory is back (0 bytes held) and the session computes as a new
 * one does. */
Test(batch, kv_bytes_and_release) {
    tern_load_params lp = {.n_threads = 2};
    tern_error err;
    tern_model *m = tern_model_load(fixture_dir("tern_tiny"), &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    int V = tern_model_vocab_size(m);
    tern_session *s = tern_session_create(m, &(tern_session_params){.kv_bits = 16}, &err);
    cr_assert_not_null(s, "%s", err.msg);
    cr_expect_eq(tern_session_kv_bytes(s), 0);
    uint64_t at1 = tern_session_kv_bytes_at(s, 1, 0), at300 = tern_session_kv_bytes_at(s, 300, 0);
    cr_expect_gt(at1, 0);
    cr_expect_gt(at300, at1, "300 positions need more than the first step's rows");
    cr_expect_eq(tern_session_kv_bytes_at(s, 300, 0), at300, "kv_bytes_at allocates nothing");
    int32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = (int32_t)((i * 7919 + 3) % V);
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    cr_assert_eq(tern_session_eval(s, toks, 10, NULL, 0, &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_kv_bytes(s), at1, "10 positions fit the first rows");
    cr_assert_eq(tern_session_eval(s, toks + 10, 290, a, 0, &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_kv_bytes(s), at300);
    cr_expect_eq(tern_session_kv_bytes_at(s, 5, 0), at300, "held rows are never fewer");
    cr_expect_eq(tern_session_kv_bytes_at(s, 5, 1), at1, "released, 5 positions take the first rows");
    cr_assert_eq(tern_session_release(s, &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_kv_bytes(s), 0);
    cr_expect_eq(tern_session_pos(s), 0);
    cr_assert_eq(tern_session_eval(s, toks, 10, NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(s, toks + 10, 290, b, 0, &err), 0, "%s", err.msg);
    cr_expect_arr_eq(a, b, (size_t)V * sizeof *a, "after a release the session computes as a new one");
    free(a);
    free(b);
    tern_session_destroy(s);
    tern_model_free(m);
}
