/* Speculative decoding with the MTP head (tern_gen_params.mtp_depth) on
 * tern-tiny, whose head is trained: greedy ids, text, stops and the state
 * left behind equal decoding without drafts; sampled ids have the model's
 * distribution. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu_backend.h"
#include "engine/mtp_auto.h"
#include "engine/sampler.h"
#include "model/manifest.h"
#include "tern.h"
#include "packutil.h"
#include "testutil.h"

#define MAX_IDS 512

typedef struct {
    int32_t ids[MAX_IDS];
    int n;
    char text[16384];
    size_t len;
} out;

static void on_token(void *ctx, int32_t id) {
    out *o = ctx;
    if (o->n < MAX_IDS) o->ids[o->n++] = id;
}

static int on_text(void *ctx, const char *t, size_t n) {
    out *o = ctx;
    if (o->len + n < sizeof o->text) {
        memcpy(o->text + o->len, t, n);
        o->len += n;
    }
    return 0;
}

static tern_model *tiny(int recompute) {
    tern_error err;
    tern_load_params lp = {.n_threads = 2};
    lp.debug.mtp_recompute = recompute;
    tern_model *m = tern_model_load("models/tern-tiny", &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_assert(tern_model_has_mtp(m));
    return m;
}

/* The held-out text's ids (never seen in training). */
static int32_t *heldout(tern_tokenizer *tok, size_t *n) {
    tern_error err;
    size_t len;
    char *text = NULL;
    FILE *f = fopen("tests/fixtures/tern-tiny-heldout.txt", "rb");
    cr_assert(f);
    text = malloc(1 << 16);
    len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    int32_t *ids = NULL;
    cr_assert_eq(tern_tokenizer_encode(tok, text, len, 0, &ids, n, &err), 0, "%s", err.msg);
    free(text);
    return ids;
}

static tern_gen_params greedy(int n_predict, int depth) {
    tern_gen_params p;
    memset(&p, 0, sizeof p);
    tern_sampler_params_default(&p.sampling);
    p.n_predict = n_predict;
    p.on_token = on_token;
    p.mtp_depth = depth;
    return p;
}

/* A generation on a new session of context ctx (0: the model's); the
 * session is returned for the state checks. */
static tern_session *gen(tern_model *m, tern_tokenizer *tok, const int32_t *prompt, int n, const tern_gen_params *p,
                         int ctx, int track, out *o, tern_gen_stats *st) {
    tern_error err;
    tern_session_params sp = {.max_context = ctx};
    tern_session *s = tern_session_create(m, &sp, &err);
    cr_assert_not_null(s, "%s", err.msg);
    if (track) cr_assert_eq(tern_session_set_mtp(s, 1, &err), 0, "%s", err.msg);
    memset(o, 0, sizeof *o);
    cr_assert_eq(tern_generate(s, tok, prompt, (size_t)n, p, on_text, o, st, &err), 0, "%s", err.msg);
    return s;
}

/* A snapshot's file bytes (header, state, hash). */
static char *snap_bytes(tern_session *s, size_t *len) {
    tern_error err;
    tern_snapshot *snap = tern_session_snapshot(s, &err);
    cr_assert_not_null(snap, "%s", err.msg);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    cr_assert_eq(tern_snapshot_write(snap, f, &err), 0, "%s", err.msg);
    fclose(f);
    tern_snapshot_free(snap);
    return buf;
}

/* The model's state alone (every attention row held, the DeltaNet state,
 * the last hidden state, the position), the MTP head's left out. */
static void same_model_state(const tern_session *a, const tern_session *b) {
    const tern_model *m = a->m;
    cr_assert_eq(a->pos, b->pos);
    tern_span sa[2 * TERN_MAX_LAYERS], sb[2 * TERN_MAX_LAYERS];
    const tern_cpu_state *ca = a->state, *cb = b->state;
    int na = tern_state_spans(&m->cfg, ca->kv, ca->gdn, a->kvf.row_bytes, 0, a->pos, 1, sa);
    int nb = tern_state_spans(&m->cfg, cb->kv, cb->gdn, b->kvf.row_bytes, 0, b->pos, 1, sb);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++) {
        cr_assert_eq(sa[i].n, sb[i].n);
        cr_assert_eq(memcmp(sa[i].p, sb[i].p, sa[i].n), 0, "state piece %d differs", i);
    }
    cr_assert_eq(memcmp(a->hidden, b->hidden, (size_t)m->cfg.hidden * sizeof(float)), 0);
}

/* Greedy, the same prompt and limits, with and without drafts: the same
 * ids, text, stop, and state, whatever the depth; and a plain generation
 * that keeps the head in step leaves the same snapshot, byte for byte. */
static void check_same(tern_model *m, tern_tokenizer *tok, const int32_t *prompt, int n, tern_gen_params p, int ctx) {
    out want, got;
    tern_gen_stats ws, gs;
    p.mtp_depth = 0;
    tern_session *plain = gen(m, tok, prompt, n, &p, ctx, 0, &want, &ws);
    tern_session *tracked = gen(m, tok, prompt, n, &p, ctx, 1, &got, &gs);
    size_t tl, gl;
    char *tb = snap_bytes(tracked, &tl);
    for (int d = 1; d <= TERN_MTP_MAX_DEPTH + 1; d++) {   /* (the last: TERN_MTP_AUTO) */
        p.mtp_depth = d > TERN_MTP_MAX_DEPTH ? TERN_MTP_AUTO : d;
        tern_session *s = gen(m, tok, prompt, n, &p, ctx, 0, &got, &gs);
        cr_assert_eq(got.n, want.n, "depth %d: %d ids, %d without drafts", d, got.n, want.n);
        cr_assert_eq(memcmp(got.ids, want.ids, (size_t)want.n * sizeof(int32_t)), 0, "depth %d: other ids", d);
        cr_assert_eq(got.len, want.len);
        cr_assert_eq(memcmp(got.text, want.text, want.len), 0, "depth %d: other text", d);
        cr_assert_eq(gs.n_generated, ws.n_generated);
        cr_assert_eq(gs.stop_reason, ws.stop_reason, "depth %d: stop %d, %d without", d, gs.stop_reason,
                     ws.stop_reason);
        cr_assert_eq(gs.stop_index, ws.stop_index);
        cr_assert_eq(gs.last_token, ws.last_token);
        cr_assert_leq(gs.n_accepted, gs.n_drafted);
        if (ws.n_generated > 2) cr_assert_gt(gs.n_verify, 0, "depth %d: no step verified drafts", d);
        same_model_state(s, plain);
        char *b = snap_bytes(s, &gl);
        cr_assert_eq(gl, tl);
        cr_assert_eq(memcmp(b, tb, tl), 0, "depth %d: the snapshot differs from the tracked plain one", d);
        free(b);
        tern_session_destroy(s);
    }
    free(tb);
    tern_session_destroy(plain);
    tern_session_destroy(tracked);
}

typedef struct {
    tern_model *m;
    tern_tokenizer *tok;
    int32_t *ids;
    size_t n;
} setup;

static void open_setup(setup *u, int recompute) {
    tern_error err;
    u->m = tiny(recompute);
    u->tok = tern_tokenizer_load("models/tern-tiny", &err);
    cr_assert_not_null(u->tok, "%s", err.msg);
    u->ids = heldout(u->tok, &u->n);
    cr_assert_gt(u->n, 3000);
}

static void close_setup(setup *u) {
    free(u->ids);
    tern_tokenizer_free(u->tok);
    tern_model_free(u->m);
}

Test(mtp, greedy_same_ids_any_depth) {
    setup u;
    open_setup(&u, 0);
    const int starts[] = {0, 700, 1500, 2600}, lens[] = {1, 9, 40, 70};
    for (int i = 0; i < 4; i++) check_same(u.m, u.tok, u.ids + starts[i], lens[i], greedy(48, 0), 0);
    close_setup(&u);
}

/* n_predict reached on every position a step may cover. */
Test(mtp, greedy_max_tokens_mid_draft) {
    setup u;
    open_setup(&u, 0);
    for (int n = 1; n <= 9; n++) check_same(u.m, u.tok, u.ids + 300, 12, greedy(n, 0), 0);
    close_setup(&u);
}

/* The context ends mid-step: the verify holds fewer drafts. */
Test(mtp, greedy_context_end) {
    setup u;
    open_setup(&u, 0);
    for (int room = 1; room <= 6; room++) check_same(u.m, u.tok, u.ids + 900, 20, greedy(-1, 0), 20 + room);
    close_setup(&u);
}

/* An EOS id and a stop string at each of several positions of the plain
 * output: the generation ends there, never past it. */
Test(mtp, greedy_stops_mid_draft) {
    setup u;
    open_setup(&u, 0);
    out base;
    tern_gen_stats st;
    tern_gen_params p = greedy(40, 0);
    tern_session *s = gen(u.m, u.tok, u.ids + 1200, 16, &p, 0, 0, &base, &st);
    tern_session_destroy(s);
    cr_assert_eq(base.n, 40);
    for (int at = 2; at < 12; at++) {
        tern_gen_params e = greedy(40, 0);
        e.sampling.n_eos = 1;
        e.sampling.eos_ids[0] = base.ids[at];
        check_same(u.m, u.tok, u.ids + 1200, 16, e, 0);
        /* a stop string: the text of tokens at..at+1 */
        char *text = NULL;
        size_t len = 0;
        tern_error err;
        cr_assert_eq(tern_tokenizer_decode(u.tok, base.ids + at, 2, 0, &text, &len, &err), 0, "%s", err.msg);
        if (len > 0) {
            const char *stop[1] = {text};
            tern_gen_params t = greedy(40, 0);
            t.stop = stop;
            t.n_stop = 1;
            check_same(u.m, u.tok, u.ids + 1200, 16, t, 0);
        }
        free(text);
    }
    close_setup(&u);
}

/* Rolling back by restoring the DeltaNet state and evaluating the kept
 * tokens again gives what the kept per-token state gives. */
Test(mtp, recompute_rollback_same_ids) {
    setup u;
    open_setup(&u, 1);
    check_same(u.m, u.tok, u.ids + 1500, 30, greedy(40, 0), 0);
    close_setup(&u);
}

/* A session that generated with drafts goes on as the plain one does, and
 * a second turn with drafts keeps the head's rows in step across turns. */
Test(mtp, state_continues) {
    setup u;
    open_setup(&u, 0);
    out a, b;
    tern_gen_stats sa, sb;
    tern_error err;
    tern_gen_params p = greedy(20, 0);
    tern_session *plain = gen(u.m, u.tok, u.ids + 100, 30, &p, 0, 1, &a, &sa);
    p.mtp_depth = 3;
    tern_session *spec = gen(u.m, u.tok, u.ids + 100, 30, &p, 0, 0, &b, &sb);
    /* a second turn: the next logits, then 20 more ids each way */
    int V = tern_model_vocab_size(u.m);
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    p.mtp_depth = 0;
    cr_assert_eq(tern_generate(plain, u.tok, u.ids + 400, 7, &p, on_text, &a, &sa, &err), 0, "%s", err.msg);
    p.mtp_depth = 2;
    cr_assert_eq(tern_generate(spec, u.tok, u.ids + 400, 7, &p, on_text, &b, &sb, &err), 0, "%s", err.msg);
    cr_assert_eq(a.n, b.n);
    cr_assert_eq(memcmp(a.ids, b.ids, (size_t)a.n * sizeof(int32_t)), 0);
    same_model_state(plain, spec);
    size_t na, nb;
    char *ba = snap_bytes(plain, &na), *bb = snap_bytes(spec, &nb);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(ba, bb, na), 0, "the snapshots after two turns differ");
    int32_t next = u.ids[500];
    cr_assert_eq(tern_session_eval(plain, &next, 1, la, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(spec, &next, 1, lb, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(la, lb, (size_t)V * sizeof(float)), 0, "the next logits differ");
    free(ba);
    free(bb);
    free(la);
    free(lb);
    tern_session_destroy(plain);
    tern_session_destroy(spec);
    close_setup(&u);
}

typedef struct {
    tern_logprobs lp[64];
    int n;
} lps;

static void on_lp(void *ctx, const tern_logprobs *lp) {
    lps *l = ctx;
    if (l->n < 64) l->lp[l->n++] = *lp;
}

/* Log-probabilities come from the verify's rows: those of decoding
 * without drafts, bit for bit. */
Test(mtp, logprobs_same) {
    setup u;
    open_setup(&u, 0);
    lps want, got;
    tern_error err;
    tern_gen_stats st;
    for (int d = 0; d <= TERN_MTP_MAX_DEPTH; d++) {
        lps *l = d ? &got : &want;
        memset(l, 0, sizeof *l);
        tern_gen_params p = greedy(40, d);
        p.on_token = NULL;
        p.on_logprobs = on_lp;
        p.top_logprobs = 5;
        tern_session *s = tern_session_create(u.m, NULL, &err);
        cr_assert_eq(tern_generate(s, NULL, u.ids + 2200, 20, &p, NULL, l, &st, &err), 0, "%s", err.msg);
        tern_session_destroy(s);
        if (!d) continue;
        cr_assert_gt(st.n_accepted, 0);
        cr_assert_eq(got.n, want.n);
        cr_assert_eq(memcmp(got.lp, want.lp, (size_t)want.n * sizeof *want.lp), 0, "depth %d: other logprobs", d);
    }
    close_setup(&u);
}

/* A snapshot carries the head's rows and where they start: restored into
 * a session whose rows started elsewhere, it drafts as the session it was
 * taken from. */
Test(mtp, snapshot_keeps_head_rows) {
    setup u;
    open_setup(&u, 0);
    tern_error err;
    tern_session *a = tern_session_create(u.m, NULL, &err), *b = tern_session_create(u.m, NULL, &err);
    cr_assert_eq(tern_session_set_mtp(a, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(a, u.ids + 40, 50, NULL, 0, &err), 0, "%s", err.msg);
    /* b's rows restart mid-sequence: evaluated untracked first */
    cr_assert_eq(tern_session_eval(b, u.ids + 700, 30, NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_set_mtp(b, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(b, u.ids + 730, 5, NULL, 0, &err), 0, "%s", err.msg);
    tern_snapshot *snap = tern_session_snapshot(a, &err);
    cr_assert_not_null(snap, "%s", err.msg);
    cr_assert_eq(tern_session_restore(b, snap, &err), 0, "%s", err.msg);
    size_t na, nb;
    char *ba = snap_bytes(a, &na), *bb = snap_bytes(b, &nb);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(ba, bb, na), 0);
    free(ba);
    free(bb);
    out oa, ob;
    tern_gen_stats sa, sb;
    tern_gen_params p = greedy(30, 2);
    memset(&oa, 0, sizeof oa);
    memset(&ob, 0, sizeof ob);
    cr_assert_eq(tern_generate(a, NULL, u.ids + 90, 3, &p, NULL, &oa, &sa, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_generate(b, NULL, u.ids + 90, 3, &p, NULL, &ob, &sb, &err), 0, "%s", err.msg);
    cr_assert_eq(oa.n, ob.n);
    cr_assert_eq(memcmp(oa.ids, ob.ids, (size_t)oa.n * sizeof(int32_t)), 0);
    cr_assert_eq(sa.n_accepted, sb.n_accepted, "the restored head drafted otherwise");
    ba = snap_bytes(a, &na);
    bb = snap_bytes(b, &nb);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(ba, bb, na), 0);
    free(ba);
    free(bb);
    tern_snapshot_free(snap);
    tern_session_destroy(a);
    tern_session_destroy(b);
    close_setup(&u);
}

/* A filled session (tern_session_fill: positions without a last state)
 * tracked from there: the head's rows start at the first evaluated token
 * and end at the last evaluated position, across evaluations. */
Test(mtp, filled_session_head_rows) {
    tern_model *m = tiny(0);
    tern_error err;
    tern_session_params sp = {.max_context = 128};
    tern_session *s = tern_session_create(m, &sp, &err);
    cr_assert_not_null(s, "%s", err.msg);
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = 100 + 7 * i;
    cr_assert_eq(tern_session_fill(s, 40, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_set_mtp(s, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(s, ids, 5, NULL, 0, &err), 0, "%s", err.msg);
    cr_expect_eq(s->mtp_base, 40);
    cr_expect_eq(s->mtp_base + s->mtp_pos, s->pos - 1, "rows end at %d, the session at %d", s->mtp_base + s->mtp_pos,
                 s->pos);
    cr_assert_eq(tern_session_eval(s, ids + 5, 3, NULL, 0, &err), 0, "%s", err.msg);
    cr_expect_eq(s->mtp_base, 40, "the head's rows restarted");
    cr_expect_eq(s->mtp_pos, 7);
    tern_session_destroy(s);
    tern_model_free(m);
}

Test(mtp, bad_depth_refused) {
    tern_model *m = tiny(0);
    tern_error err;
    tern_session *s = tern_session_create(m, NULL, &err);
    int32_t prompt[2] = {10, 20};
    tern_gen_stats st;
    out o;
    memset(&o, 0, sizeof o);
    const int bad[] = {-2, TERN_MTP_MAX_DEPTH + 1, 1000};
    for (int i = 0; i < 3; i++) {
        tern_gen_params p = greedy(4, bad[i]);
        cr_assert_eq(tern_generate(s, NULL, prompt, 2, &p, NULL, &o, &st, &err), -1);
        cr_assert(strstr(err.msg, "mtp_depth"), "%s", err.msg);
    }
    cr_assert_eq(tern_session_pos(s), 0, "a refused generation evaluated tokens");
    tern_session_destroy(s);
    tern_model_free(m);
}

/* ---- under a grammar: drafts masked, the ids the masked plain loop gives -- */

typedef struct {
    tern_grammar_vocab *v;
    tern_grammar *g[3];
    int32_t eos[2];
} grammars;

static void open_grammars(grammars *gr, const setup *u) {
    tern_error err;
    gr->eos[0] = tern_tokenizer_token_id(u->tok, "<|im_end|>");
    gr->eos[1] = tern_tokenizer_token_id(u->tok, "<|endoftext|>");
    cr_assert(gr->eos[0] >= 0 && gr->eos[1] >= 0);
    gr->v = tern_grammar_vocab_create(u->tok, tern_model_vocab_size(u->m), gr->eos, 2, &err);
    cr_assert_not_null(gr->v, "%s", err.msg);
    const tern_grammar_spec specs[3] = {
        {.json_object = 1},
        {.json_schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"kind\":{\"enum\":"
                        "[\"seed\",\"tree\",\"fruit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"name\","
                        "\"kind\",\"days\"],\"additionalProperties\":false}"},
        {.gbnf = "root ::= (\"And \" [a-zA-Z]+ \" \")+ \"said.\""},
    };
    for (int i = 0; i < 3; i++) cr_assert_not_null(gr->g[i] = tern_grammar_create(&specs[i], gr->v, &err), "%s", err.msg);
}

static void close_grammars(grammars *gr) {
    for (int i = 0; i < 3; i++) tern_grammar_destroy(gr->g[i]);
    tern_grammar_vocab_destroy(gr->v);
}

/* Greedy under each grammar, at limits that cut the answer short and one
 * that lets it end: the same ids, text, stop and state at every depth. */
Test(mtp, greedy_under_a_grammar) {
    setup u;
    open_setup(&u, 0);
    grammars gr;
    open_grammars(&gr, &u);
    const int limits[] = {3, 11, 90};
    for (int i = 0; i < 3; i++)
        for (int l = 0; l < 3; l++) {
            tern_gen_params p = greedy(limits[l], 0);
            p.grammar = gr.g[i];
            p.sampling.n_eos = 2;
            memcpy(p.sampling.eos_ids, gr.eos, sizeof gr.eos);
            check_same(u.m, u.tok, u.ids + 40 + 300 * i, 24, p, 0);
        }
    /* the context's end as the grammar's budget: the room past each draft */
    const int rooms[] = {4, 13};
    for (int i = 0; i < 3; i++)
        for (int r = 0; r < 2; r++) {
            tern_gen_params p = greedy(-1, 0);
            p.grammar = gr.g[i];
            p.sampling.n_eos = 2;
            memcpy(p.sampling.eos_ids, gr.eos, sizeof gr.eos);
            check_same(u.m, u.tok, u.ids + 40 + 300 * i, 24, p, 24 + rooms[r]);
        }
    close_grammars(&gr);
    close_setup(&u);
}

/* Sampled under a grammar with drafts: every id is one the grammar allows
 * (a fresh matcher takes them all), and drafts are kept. */
Test(mtp, sampled_under_a_grammar) {
    setup u;
    open_setup(&u, 0);
    grammars gr;
    open_grammars(&gr, &u);
    tern_error err;
    for (int i = 0; i < 3; i++) {
        tern_gen_params p = greedy(120, 2);
        p.sampling.do_sample = 1;
        p.sampling.temperature = 1.0f;
        p.sampling.seed = 3 + (uint64_t)i;
        p.grammar = gr.g[i];
        p.sampling.n_eos = 2;
        memcpy(p.sampling.eos_ids, gr.eos, sizeof gr.eos);
        out o;
        tern_gen_stats st;
        tern_session *s = gen(u.m, u.tok, u.ids + 900, 24, &p, 0, 0, &o, &st);
        cr_assert_gt(st.n_accepted, 0, "grammar %d: no draft kept", i);
        tern_matcher *m = tern_matcher_create(gr.g[i], &err);
        cr_assert_not_null(m, "%s", err.msg);
        for (int k = 0; k < o.n; k++) cr_assert_eq(tern_matcher_accept(m, o.ids[k], &err), 0, "grammar %d id %d: %s", i, k, err.msg);
        tern_matcher_destroy(m);
        tern_session_destroy(s);
    }
    close_grammars(&gr);
    close_setup(&u);
}

/* Packed at 4 bits with the experts streamed through top_k + 1 slots a
 * layer (the head's layer too): drafts give the plain loop's ids there as
 * well, and the expert cache sees the drafts' and verifies' experts. */
Test(mtp, streamed_experts) {
    setup u;
    open_setup(&u, 0);
    tern_error err;
    char *tmp = make_temp_dir(), dst[1200];
    cr_assert(tmp);
    snprintf(dst, sizeof dst, "%s/tiny-q4", tmp);
    tern_pack_params pp = {.src = "models/tern-tiny", .dst = dst, .bits = 4, .n_threads = 2};
    cr_assert_eq(tern_pack(&pp, &err), 0, "%s", err.msg);
    tern_manifest man;
    cr_assert_eq(tern_manifest_read(&man, dst, &err), 0, "%s", err.msg);
    cr_assert(man.mtp_file, "the pack has no MTP expert file");
    tern_load_params lp = {.n_threads = 2};
    lp.expert_budget = 5 * man.stride * (uint64_t)(man.n_layer_files + 1);
    tern_manifest_free(&man);
    tern_model *m = tern_model_load(dst, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    check_same(m, u.tok, u.ids + 2000, 30, greedy(40, 0), 0);
    tern_stream_stats ss;
    tern_model_stream_stats(m, &ss);
    cr_assert(ss.streaming && ss.slots_per_layer == 5 && ss.misses > 0, "streaming %d, %d slots, %llu misses",
              ss.streaming, ss.slots_per_layer, (unsigned long long)ss.misses);
    tern_model_free(m);
    rm_rf(tmp);
    free(tmp);
    close_setup(&u);
}

/* ---- a set acceptance (debug.mtp_force_accept, for benchmarks) ------------ */

static tern_model *forced(double rate, tern_error *err) {
    tern_load_params lp = {.n_threads = 2};
    lp.debug.mtp_force_accept = rate;
    return tern_model_load("models/tern-tiny", &lp, err);
}

/* Every draft kept: the session then holds exactly the prompt and the ids
 * given, in the state plain one-token steps over them leave. */
Test(mtp, forced_acceptance_keeps_every_draft) {
    setup u;
    open_setup(&u, 0);
    tern_error err;
    tern_model *m = forced(1, &err);
    cr_assert_not_null(m, "%s", err.msg);
    for (int d = 1; d <= TERN_MTP_MAX_DEPTH; d++) {
        out o;
        tern_gen_stats st;
        tern_gen_params p = greedy(31, d);
        tern_session *s = gen(m, u.tok, u.ids + 800, 20, &p, 0, 0, &o, &st);
        cr_assert_eq(o.n, 31);
        cr_assert_gt(st.n_verify, 0);
        cr_assert_eq(st.n_accepted, st.n_drafted, "depth %d: %ld of %ld drafts kept", d, (long)st.n_accepted,
                     (long)st.n_drafted);
        int held = tern_session_pos(s) - 20;
        cr_assert(held >= o.n - 1 && held <= o.n, "depth %d: %d ids held of %d", d, held, o.n);
        tern_session *plain = tern_session_create(u.m, NULL, &err);
        cr_assert_not_null(plain, "%s", err.msg);
        cr_assert_eq(tern_session_eval(plain, u.ids + 800, 20, NULL, 0, &err), 0, "%s", err.msg);
        for (int i = 0; i < held; i++) cr_assert_eq(tern_session_eval(plain, &o.ids[i], 1, NULL, 0, &err), 0, "%s", err.msg);
        same_model_state(s, plain);
        tern_session_destroy(plain);
        tern_session_destroy(s);
    }
    tern_model_free(m);
    close_setup(&u);
}

/* At rate a and depth 3 a step keeps a + a^2 + a^3 drafts on average. */
Test(mtp, forced_acceptance_rate) {
    setup u;
    open_setup(&u, 0);
    tern_error err;
    tern_model *m = forced(0.5, &err);
    cr_assert_not_null(m, "%s", err.msg);
    out o;
    tern_gen_stats st;
    tern_gen_params p = greedy(400, 3);
    p.ignore_eos = 1;
    tern_session *s = gen(m, u.tok, u.ids + 200, 20, &p, 0, 0, &o, &st);
    /* per step: 0..3 kept with probabilities 1/2, 1/4, 1/8, 1/8; mean 0.875, sd 1.05 */
    double mean = (double)st.n_accepted / (double)st.n_verify, sd = 1.05 / sqrt((double)st.n_verify);
    cr_assert_gt(st.n_verify, 150);
    cr_assert(fabs(mean - 0.875) < 4 * sd, "%.3f drafts kept a step over %ld steps (0.875 expected)", mean,
              (long)st.n_verify);
    tern_session_destroy(s);
    tern_model_free(m);
    for (int i = 0; i < 3; i++) {
        const double bad[] = {-0.1, 1.5, NAN};
        cr_assert_null(forced(bad[i], &err));
        cr_assert(strstr(err.msg, "debug.mtp_force_accept"), "%s", err.msg);
    }
    close_setup(&u);
}

/* ---- sampling: the distribution is the model's ---------------------------- */

#define NT 3   /* ids generated per draw */

typedef struct {
    setup u;
    int32_t *prompt;
    int n_prompt;
    tern_snapshot *before;    /* the prompt but its last token, the head tracked */
    int V;
} dist_setup;

/* The distribution the sampler draws from after `hist` (n ids). */
static void probs_of(const tern_sampler_params *sp, int V, const float *logits, const int32_t *hist, int n, float *p) {
    tern_error err;
    tern_sampler *sm = tern_sampler_create(sp, V, V, &err);
    cr_assert_not_null(sm, "%s", err.msg);
    cr_assert_eq(tern_sampler_probs(sm, logits, hist, n, p, &err), 0, "%s", err.msg);
    tern_sampler_destroy(sm);
}

/* Exact marginals of the 2nd and 3rd generated ids (m[0], m[1]) under the
 * model, and of the 2nd under a rule that always kept the head's draft
 * (wrong). */
static void exact_marginals(dist_setup *d, const tern_sampler_params *sp, double *m2, double *m3, double *wrong2) {
    tern_error err;
    int V = d->V, n = d->n_prompt;
    tern_session *s = tern_session_create(d->u.m, NULL, &err);
    cr_assert_not_null(s, "%s", err.msg);
    cr_assert_eq(tern_session_set_mtp(s, 1, &err), 0, "%s", err.msg);
    int32_t *hist = malloc((size_t)(n + NT) * sizeof(int32_t));
    memcpy(hist, d->prompt, (size_t)n * sizeof(int32_t));
    float *lg = malloc((size_t)V * sizeof(float)), *p1 = malloc((size_t)V * sizeof(float));
    float *p2 = malloc((size_t)V * sizeof(float)), *p3 = malloc((size_t)V * sizeof(float));
    cr_assert_eq(tern_session_restore(s, d->before, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(s, d->prompt + n - 1, 1, lg, 0, &err), 0, "%s", err.msg);
    probs_of(sp, V, lg, hist, n, p1);
    tern_snapshot *after = tern_session_snapshot(s, &err);
    for (int a = 0; a < V; a++) {
        if (p1[a] <= 0) continue;
        hist[n] = a;
        /* the head's draft of the 2nd id, from the prompt's state and a */
        cr_assert_eq(tern_session_restore(s, after, &err), 0, "%s", err.msg);
        cr_assert_eq(tern_session_mtp_draft(s, a, lg, &err), 0, "%s", err.msg);
        probs_of(sp, V, lg, hist, n + 1, p2);
        for (int b = 0; b < V; b++) wrong2[b] += (double)p1[a] * p2[b];
        cr_assert_eq(tern_session_restore(s, after, &err), 0, "%s", err.msg);
        cr_assert_eq(tern_session_eval(s, &hist[n], 1, lg, 0, &err), 0, "%s", err.msg);
        probs_of(sp, V, lg, hist, n + 1, p2);
        tern_snapshot *at = tern_session_snapshot(s, &err);
        for (int b = 0; b < V; b++) {
            if (p2[b] <= 0) continue;
            m2[b] += (double)p1[a] * p2[b];
            hist[n + 1] = b;
            cr_assert_eq(tern_session_restore(s, at, &err), 0, "%s", err.msg);
            cr_assert_eq(tern_session_eval(s, &hist[n + 1], 1, lg, 0, &err), 0, "%s", err.msg);
            probs_of(sp, V, lg, hist, n + 2, p3);
            for (int c = 0; c < V; c++) m3[c] += (double)p1[a] * p2[b] * p3[c];
        }
        tern_snapshot_free(at);
    }
    tern_snapshot_free(after);
    free(hist); free(lg); free(p1); free(p2); free(p3);
    tern_session_destroy(s);
}

/* Pearson's chi-square of counts against a distribution (ids expected
 * fewer than 5 times pooled), as a standard normal deviate
 * (Wilson-Hilferty). */
static double chi2_z(const int *count, const double *p, int V, int draws) {
    double chi2 = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        double e = p[i] * draws;
        if (e < 5) {
            pool_e += e;
            pool_o += count[i];
            continue;
        }
        chi2 += (count[i] - e) * (count[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    } else if (pool_o > 0) {
        return INFINITY;   /* ids the distribution cannot give */
    }
    double df = bins - 1;
    return (cbrt(chi2 / df) - (1 - 2 / (9 * df))) / sqrt(2 / (9 * df));
}

static void check_distribution(tern_sampler_params sp, int depth, int draws) {
    dist_setup d;
    tern_error err;
    open_setup(&d.u, 0);
    d.prompt = d.u.ids + 2000;
    d.n_prompt = 12;
    d.V = tern_model_vocab_size(d.u.m);
    tern_session *s = tern_session_create(d.u.m, NULL, &err);
    cr_assert_eq(tern_session_set_mtp(s, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tern_session_eval(s, d.prompt, d.n_prompt - 1, NULL, 0, &err), 0, "%s", err.msg);
    d.before = tern_session_snapshot(s, &err);
    cr_assert_not_null(d.before, "%s", err.msg);
    double *m2 = calloc((size_t)d.V, sizeof(double)), *m3 = calloc((size_t)d.V, sizeof(double));
    double *w2 = calloc((size_t)d.V, sizeof(double));
    exact_marginals(&d, &sp, m2, m3, w2);
    int *c2 = calloc((size_t)d.V, sizeof(int)), *c3 = calloc((size_t)d.V, sizeof(int));
    tern_gen_stats st;
    long drafted = 0, kept = 0;
    for (int i = 0; i < draws; i++) {
        tern_gen_params p = greedy(NT, depth);
        p.sampling = sp;
        p.sampling.seed = 1000 + (uint64_t)i;
        p.history = d.prompt;
        p.n_history = (size_t)d.n_prompt - 1;
        out o;
        memset(&o, 0, sizeof o);
        cr_assert_eq(tern_session_restore(s, d.before, &err), 0, "%s", err.msg);
        cr_assert_eq(tern_generate(s, NULL, d.prompt + d.n_prompt - 1, 1, &p, NULL, &o, &st, &err), 0, "%s", err.msg);
        cr_assert_eq(o.n, NT);
        c2[o.ids[1]]++;
        c3[o.ids[2]]++;
        drafted += st.n_drafted;
        kept += st.n_accepted;
    }
    double z2 = chi2_z(c2, m2, d.V, draws), z3 = chi2_z(c3, m3, d.V, draws), zw = chi2_z(c2, w2, d.V, draws);
    fprintf(stderr, "mtp depth %d, T %.2f: 2nd id z %.2f, 3rd id z %.2f; against an always-keep rule z %.1f "
            "(%ld of %ld drafts kept)\n", depth, sp.temperature, z2, z3, zw, kept, drafted);
    cr_assert_gt(drafted, draws / 2, "the draws hardly used drafts");
    cr_assert_lt(kept, drafted, "every draft was kept: the test could not tell the rules apart");
    cr_expect_lt(z2, 4, "depth %d: the 2nd id's distribution is not the model's (z %.2f)", depth, z2);
    cr_expect_lt(z3, 4, "depth %d: the 3rd id's distribution is not the model's (z %.2f)", depth, z3);
    /* the same draws are far from what a rule that always keeps drafts gives */
    cr_expect_gt(zw, 10, "depth %d: the test cannot tell the rule from always keeping (z %.2f)", depth, zw);
    free(m2); free(m3); free(w2); free(c2); free(c3);
    tern_snapshot_free(d.before);
    tern_session_destroy(s);
    close_setup(&d.u);
}

static tern_sampler_params sampling(float temp, int top_k, float top_p, float min_p, float rep, float presence) {
    tern_sampler_params sp;
    tern_sampler_params_default(&sp);
    sp.do_sample = 1;
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.repetition_penalty = rep;
    sp.presence_penalty = presence;
    return sp;
}

Test(mtp, sampling_distribution_depth1) { check_distribution(sampling(1.0f, 12, 1, 0, 1, 0), 1, 1000); }

Test(mtp, sampling_distribution_depth2_penalties) {
    check_distribution(sampling(0.8f, 10, 0.9f, 0.05f, 1.4f, 0.3f), 2, 1000);
}

/* ---- refusals, the command line ------------------------------------------ */

Test(mtp, model_without_head_refused) {
    char *dir = make_temp_dir();
    synth_spec sp = synth_default();
    sp.mtp = 0;
    cr_assert_gt(synth_model(dir, &sp), 0);
    tern_error err;
    tern_model *m = tern_model_load(dir, NULL, &err);
    cr_assert_not_null(m, "%s", err.msg);
    tern_session *s = tern_session_create(m, NULL, &err);
    cr_assert_eq(tern_session_set_mtp(s, 1, &err), -1);
    cr_assert(strstr(err.msg, "no MTP head"), "%s", err.msg);
    int32_t prompt[2] = {1, 2};
    tern_gen_params p = greedy(4, 1);
    tern_gen_stats st;
    out o;
    cr_assert_eq(tern_generate(s, NULL, prompt, 2, &p, NULL, &o, &st, &err), -1);
    cr_assert(strstr(err.msg, "no MTP head"), "%s", err.msg);
    cr_assert_eq(tern_session_pos(s), 0);
    tern_session_destroy(s);
    tern_model_free(m);
    rm_rf(dir);
    free(dir);
}

static char *sh(const char *fmt, const char *arg, int *rc) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, tern_bin(), arg);
    return run_sh(cmd, rc);
}

/* tern run and tern chat with --mtp print what they print without. */
Test(mtp, cli_same_output) {
    int rc;
    const char *run = "%s run -p 'And the LORD spake unto Moses, saying,' --temp 0 -n 60 -t 2 --json %s 2>/dev/null";
    char *want = sh(run, "", &rc);
    cr_assert_eq(rc, 0, "%s", want);
    cr_assert(strstr(want, "\"mtp_drafted\":0,"), "%s", want);
    for (int d = 1; d <= TERN_MTP_MAX_DEPTH + 1; d++) {
        char flag[32];
        if (d > TERN_MTP_MAX_DEPTH) snprintf(flag, sizeof flag, "--mtp auto");
        else snprintf(flag, sizeof flag, "--mtp %d", d);
        char *got = sh(run, flag, &rc);
        cr_assert_eq(rc, 0, "%s", got);
        const char *a = strstr(want, "\"text\""), *b = strstr(got, "\"text\"");
        cr_assert(a && b);
        cr_assert_eq(strncmp(a, b, (size_t)(strstr(a, "\"reasoning\"") - a)), 0, "%s\nvs\n%s", want, got);
        cr_assert(strstr(got, "\"mtp_drafted\":") && !strstr(got, "\"mtp_drafted\":0,"), "%s", got);
        free(got);
    }
    free(want);
    const char *chat = "printf 'Tell me a fortune.\\nQuote a verse about light.\\n' | "
                       "%s chat --no-think --temp 0 -n 80 -t 2 %s 2>/dev/null";
    want = sh(chat, "", &rc);
    cr_assert_eq(rc, 0, "%s", want);
    char *got = sh(chat, "--mtp 3", &rc);
    cr_assert_eq(rc, 0, "%s", got);
    cr_assert_str_eq(got, want);
    free(want);
    free(got);
}

static void refused(const char *args, const char *fragment) {
    int rc;
    char *o = sh("%s %s 2>&1 </dev/null", args, &rc);
    cr_assert_eq(rc, 2, "'%s' exited %d: %s", args, rc, o);
    cr_assert(strstr(o, fragment), "'%s' said: %s", args, o);
    cr_assert_eq(strchr(o, '\n'), o + strlen(o) - 1, "'%s' said more than one line: %s", args, o);
    free(o);
}

Test(mtp, cli_bad_depth) {
    refused("run -p hi --mtp 4", "--mtp needs an integer in [0, 3]");
    refused("run -p hi --mtp -1", "--mtp needs an integer in [0, 3]");
    refused("run -p hi --mtp x", "--mtp needs an integer in [0, 3]");
    refused("run -p hi --mtp 2 --device cuda", "does not run on the GPU yet");
    refused("serve --mtp 7", "--mtp needs an integer in [0, 3]");
    refused("serve --mtp 1 --device cuda:0", "does not run on the GPU yet");
}

/* ---- TERN_MTP_AUTO's choice (engine/mtp_auto.h) ---------------------------- */

/* steps of the controller against a fixed cost model: a step at depth d
 * takes tok[d] tokens in sec[d] seconds; count[d]: the steps it chose d */
static void drive(mtp_auto *a, const int *tok, const double *sec, int steps, int *count) {
    for (int i = 0; i < steps; i++) {
        int d = mtp_auto_depth(a);
        cr_assert(d >= 0 && d <= TERN_MTP_MAX_DEPTH, "depth %d", d);
        count[d]++;
        mtp_auto_record(a, d, tok[d], sec[d]);
    }
}

Test(mtp, auto_runs_the_fastest_depth_and_probes_the_others) {
    mtp_auto a;
    mtp_auto_init(&a);
    int count[TERN_MTP_MAX_DEPTH + 1] = {0};
    /* tokens a second 1, 1.67, 1.33, 1.2: depth 1 pays most */
    const int tok[] = {1, 2, 2, 3};
    const double sec[] = {1.0, 1.2, 1.5, 2.5};
    drive(&a, tok, sec, 1000, count);
    cr_expect_eq(mtp_auto_best(&a), 1);
    cr_expect_gt(count[1], 900, "depth 1 ran %d of 1000 steps", count[1]);
    for (int d = 0; d <= TERN_MTP_MAX_DEPTH; d++)
        if (d != 1) cr_expect_gt(count[d], MTP_AUTO_WARM, "depth %d was never probed again", d);
}

Test(mtp, auto_turns_drafts_off_where_they_lose) {
    mtp_auto a;
    mtp_auto_init(&a);
    int count[TERN_MTP_MAX_DEPTH + 1] = {0};
    const int tok[] = {1, 1, 2, 2};
    const double sec[] = {1.0, 1.3, 2.5, 3.0};   /* 1, 0.77, 0.8, 0.67 */
    drive(&a, tok, sec, 1000, count);
    cr_expect_eq(mtp_auto_best(&a), 0);
    cr_expect_gt(count[0], 900, "no drafts for %d of 1000 steps", count[0]);
    cr_expect(a.settled, "no drafts led by far, yet drafts are still tried");
    /* ahead by less than the margin: drafts keep being tried */
    mtp_auto_init(&a);
    memset(count, 0, sizeof count);
    const double close[] = {1.0, 2.1, 4.2, 6.3};   /* 1, 0.95, 0.95, 0.95 */
    const int tok2[] = {1, 2, 4, 6};
    drive(&a, tok2, close, 1000, count);
    cr_expect_eq(mtp_auto_best(&a), 0);
    cr_expect(!a.settled);
    cr_expect_gt(count[1] + count[2] + count[3], 3 * MTP_AUTO_WARM + 20);
}

Test(mtp, auto_follows_a_change) {
    mtp_auto a;
    mtp_auto_init(&a);
    int count[TERN_MTP_MAX_DEPTH + 1] = {0};
    const int tok1[] = {1, 2, 2, 3}, tok2[] = {1, 2, 3, 4};
    const double sec1[] = {1.0, 1.2, 1.5, 2.5}, sec2[] = {1.0, 1.5, 1.6, 1.7};   /* then 1, 1.33, 1.88, 2.35 */
    drive(&a, tok1, sec1, 300, count);
    cr_expect_eq(mtp_auto_best(&a), 1);
    drive(&a, tok2, sec2, 600, count);
    int late[TERN_MTP_MAX_DEPTH + 1] = {0};
    drive(&a, tok2, sec2, 100, late);
    cr_expect_eq(mtp_auto_best(&a), 3);
    cr_expect_gt(late[3], 90, "after the change depth 3 ran %d of the last 100 steps", late[3]);
}
