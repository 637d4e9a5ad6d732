/* Speculative decoding with the MTP head (tern_gen_params.mtp_depth) on a
 * model with a trained head (tern-tiny by default):
 *
 *   build/bench/bench_mtp [-m DIR] [-f TEXT] [-P POSITIONS] [-p PROMPTS] [-n TOKENS] [-r REPEATS] [-t THREADS]
 *
 * 1. Teacher-forced on a held-out text: at each position the head drafts
 *    3 tokens greedily from the model's state and the text's next token,
 *    the model verifies them in one pass (the engine's verify and
 *    rollback), and the drafts kept before the first miss are counted: a
 *    depth-N step keeps min(that, N). Also the expected share of kept
 *    first drafts when sampling at the model's generation_config
 *    (sum over ids of min(p, q), p and q after the sampler's steps).
 * 2. Generation: PROMPTS prompts of 32 tokens from the text, TOKENS ids
 *    each, greedy and sampled (the generation_config), without drafts and
 *    with 1..3, the rollback keeping each verified token's state or
 *    restoring and evaluating again (debug.mtp_recompute): decode tok/s
 *    (the best of REPEATS), drafts kept, tokens a verify step.
 *
 *   build/bench/bench_mtp -m DIR -a RATE [-c COST_REPEATS] [-p PROMPTS] [-n TOKENS] [-r REPEATS] [-t THREADS]
 *
 * A set acceptance (debug.mtp_force_accept: each draft kept with
 * probability RATE, whatever the model says; labelled simulated), for a
 * model whose head accepts nothing, such as tern synth's random weights:
 * the step's costs, then greedy generation without drafts and at depths
 * 1..3, the measured speedup beside the one the costs predict,
 * (1 + a + .. + a^N) / (c(N + 1) + N x draft). A model without a
 * tokenizer gets seeded random prompts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "util/clock.h"

#define D 3   /* drafts a teacher-forced position checks */

typedef struct {
    const char *model, *text;
    int positions, prompts, tokens, reps, threads, cost_reps;
    double force;             /* -a: the set acceptance, 0: the model's */
} opts;

static void die(const char *what, const tern_error *err) {
    fprintf(stderr, "bench_mtp: %s: %s\n", what, err->msg);
    exit(1);
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static tern_model *load(const opts *o, int recompute) {
    tern_error err;
    tern_load_params lp = {.n_threads = o->threads};
    lp.debug.mtp_recompute = recompute;
    lp.debug.mtp_force_accept = o->force;
    tern_model *m = tern_model_load(o->model, &lp, &err);
    if (!m) die("load", &err);
    if (!tern_model_has_mtp(m)) {
        fprintf(stderr, "bench_mtp: %s has no MTP head\n", o->model);
        exit(1);
    }
    return m;
}

/* Seeded random ids, for a model without a tokenizer. */
static int32_t *random_ids(const tern_model *m, size_t n) {
    int32_t *ids = malloc(n * sizeof *ids);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)tern_model_vocab_size(m));
    }
    return ids;
}

static int32_t *read_ids(const opts *o, const tern_model *m, size_t *n) {
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load(o->model, &err);
    if (!tok) {
        printf("(%s: no tokenizer, random prompts)\n", o->model);
        *n = 4096;
        return random_ids(m, *n);
    }
    FILE *f = fopen(o->text, "rb");
    if (!f) {
        fprintf(stderr, "bench_mtp: %s: cannot open\n", o->text);
        exit(1);
    }
    char *text = malloc(1 << 22);
    size_t len = fread(text, 1, (1 << 22) - 1, f);
    fclose(f);
    int32_t *ids = NULL;
    if (tern_tokenizer_encode(tok, text, len, 0, &ids, n, &err)) die("encode", &err);
    free(text);
    tern_tokenizer_free(tok);
    return ids;
}

/* sum over ids of min(p, q) after the sampler's steps */
static double overlap(tern_sampler *sm, const float *pl, const float *ql, const int32_t *hist, int n, float *p, float *q,
                      int V) {
    tern_error err;
    if (tern_sampler_probs(sm, pl, hist, n, p, &err) || tern_sampler_probs(sm, ql, hist, n, q, &err))
        die("probs", &err);
    double s = 0;
    for (int i = 0; i < V; i++) s += p[i] < q[i] ? p[i] : q[i];
    return s;
}

static void teacher_forced(const opts *o, tern_model *m, const int32_t *ids, size_t n_ids) {
    tern_error err;
    const int V = tern_model_vocab_size(m), H = m->cfg.hidden, W = 512, warm = 16;
    tern_sampler_params sp;
    if (tern_sampler_params_load(&sp, o->model, &err)) die("generation_config", &err);
    tern_sampler *sm = tern_sampler_create(&sp, V, V, &err);
    if (!sm) die("sampler", &err);
    float *q = malloc((size_t)D * V * sizeof(float)), *L = malloc((size_t)(D + 1) * V * sizeof(float));
    float *hd = malloc((size_t)(D + 1) * H * sizeof(float)), *ho = malloc(2 * (size_t)H * sizeof(float));
    float *pp = malloc((size_t)V * sizeof(float)), *qp = malloc((size_t)V * sizeof(float));
    long kept[D + 1] = {0}, total = 0;
    double beta = 0;
    double t0 = tern_now_s();
    for (size_t start = 0; start + warm + D + 2 < n_ids && total < o->positions; start += W) {
        int w = n_ids - start < (size_t)W ? (int)(n_ids - start) : W;
        const int32_t *x = ids + start;
        tern_session *s = tern_session_create(m, NULL, &err);
        if (!s || tern_session_set_mtp(s, 1, &err) || tern_session_eval(s, x, warm, NULL, 0, &err)) die("warm", &err);
        for (int t = warm - 1; t + D + 2 < w && total < o->positions; t++) {
            int32_t tok[D + 1] = {x[t + 1]};
            const float *in = s->hidden;
            for (int i = 0; i < D; i++) {
                float *out = ho + (size_t)(i % 2) * H;
                if (tern_mtp_forward(s, in, &tok[i], 1, q + (size_t)i * V, out, &err)) die("draft", &err);
                tok[i + 1] = argmax(q + (size_t)i * V, V);
                in = out;
            }
            tern_spec_verify v;
            if (tern_mtp_verify(s, tok, D + 1, L, hd, &v, &err)) die("verify", &err);
            int a = 0;
            while (a < D && argmax(L + (size_t)a * V, V) == tok[a + 1]) a++;
            kept[a]++;
            beta += overlap(sm, L, q, x, t + 2, pp, qp, V);
            total++;
            if (tern_mtp_keep(s, &v, 1, hd, &err)) die("keep", &err);
        }
        tern_session_destroy(s);
    }
    printf("teacher-forced, %ld positions of %s (%.1f s):\n", total, o->text, tern_now_s() - t0);
    printf("| depth | drafts kept (greedy) | tokens a verify step (greedy) |\n|---|---|---|\n");
    for (int N = 1; N <= D; N++) {
        double sum = 0;
        for (int a = 0; a <= D; a++) sum += (double)(a < N ? a : N) * kept[a];
        printf("| %d | %.3f | %.3f |\n", N, sum / total / N, 1 + sum / total);
    }
    printf("first draft kept when sampling (T %.2f, top-k %d, top-p %.2f): %.3f expected\n\n", sp.temperature,
           sp.top_k, sp.top_p, beta / total);
    free(q); free(L); free(hd); free(ho); free(pp); free(qp);
    tern_sampler_destroy(sm);
}

typedef struct {
    double decode, draft, c[D + 2];   /* seconds; c[T]: a verify of T (rolled back to one) in decode steps */
} step_costs;

/* The step's parts on a session past a 256-token prompt, each the best
 * of cost_reps: a decode step, a verify of T tokens (rolled back to one),
 * a draft (the head and its lm_head). */
static step_costs costs(const opts *o, tern_model *m, const int32_t *ids) {
    tern_error err;
    const int V = tern_model_vocab_size(m), H = m->cfg.hidden, reps = o->cost_reps;
    float *L = malloc((size_t)(D + 2) * V * sizeof(float)), *hd = malloc((size_t)(D + 2) * H * sizeof(float));
    tern_session *s = tern_session_create(m, NULL, &err);
    if (!s || tern_session_set_mtp(s, 1, &err) || tern_session_eval(s, ids, 256, NULL, 0, &err)) die("prompt", &err);
    tern_snapshot *snap = tern_session_snapshot(s, &err);
    double decode = 1e9, draft = 1e9, verify[D + 2];
    for (int r = 0; r < reps; r++) {
        if (tern_session_restore(s, snap, &err)) die("restore", &err);
        double t0 = tern_now_s();
        if (tern_session_eval(s, ids + 256, 1, L, 0, &err)) die("decode", &err);
        double t1 = tern_now_s();
        if (t1 - t0 < decode) decode = t1 - t0;
        if (tern_mtp_forward(s, s->hidden, ids + 257, 1, L, hd, &err)) die("draft", &err);
        if (tern_now_s() - t1 < draft) draft = tern_now_s() - t1;
    }
    for (int T = 1; T <= D + 1; T++) {
        verify[T] = 1e9;
        for (int r = 0; r < reps; r++) {
            if (tern_session_restore(s, snap, &err)) die("restore", &err);
            tern_spec_verify v;
            double t0 = tern_now_s();
            if (tern_mtp_verify(s, ids + 256, T, L, hd, &v, &err) || tern_mtp_keep(s, &v, 1, hd, &err))
                die("verify", &err);
            if (tern_now_s() - t0 < verify[T]) verify[T] = tern_now_s() - t0;
        }
    }
    printf("costs (best of %d): decode step %.3f ms, draft %.3f ms (%.2f of a decode step)", reps, decode * 1e3,
           draft * 1e3, draft / decode);
    for (int T = 1; T <= D + 1; T++) printf(", verify %d + rollback %.3f ms (c = %.2f)", T, verify[T] * 1e3,
                                             verify[T] / decode);
    printf("\n\n");
    tern_snapshot_free(snap);
    tern_session_destroy(s);
    free(L);
    free(hd);
    step_costs sc = {decode, draft, {0}};
    for (int T = 1; T <= D + 1; T++) sc.c[T] = verify[T] / decode;
    return sc;
}

typedef struct {
    double tok_s;
    long drafted, accepted, verify, generated;
} run_stats;

static void count(void *ctx, int32_t id) { (void)ctx; (void)id; }

static run_stats generate(const opts *o, tern_model *m, const int32_t *ids, size_t n_ids, int greedy, int depth) {
    tern_error err;
    run_stats best = {0};
    for (int r = 0; r < o->reps; r++) {
        run_stats st = {0};
        double decode_s = 0;
        for (int i = 0; i < o->prompts; i++) {
            size_t at = (size_t)i * (n_ids - 64) / (size_t)o->prompts;
            tern_gen_params gp = {.n_predict = o->tokens, .ignore_eos = 1, .on_token = count, .mtp_depth = depth};
            if (tern_sampler_params_load(&gp.sampling, o->model, &err)) die("generation_config", &err);
            if (greedy) gp.sampling.do_sample = 0;
            gp.sampling.seed = 7 + (uint64_t)i;
            tern_session *s = tern_session_create(m, NULL, &err);
            tern_gen_stats gs;
            if (!s || tern_generate(s, NULL, ids + at, 32, &gp, NULL, NULL, &gs, &err)) die("generate", &err);
            decode_s += gs.decode_s;
            st.generated += gs.n_generated;
            st.drafted += gs.n_drafted;
            st.accepted += gs.n_accepted;
            st.verify += gs.n_verify;
            tern_session_destroy(s);
        }
        st.tok_s = st.generated / decode_s;
        if (st.tok_s > best.tok_s) best = st;
    }
    return best;
}

static void generation(const opts *o, tern_model *keep, tern_model *recompute, const int32_t *ids, size_t n_ids) {
    printf("generation: %d prompts of 32 tokens, %d tokens each, best of %d (decode tok/s)\n", o->prompts, o->tokens,
           o->reps);
    printf("| sampling | depth | rollback | decode tok/s | speedup | drafts kept | tokens a verify step |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int greedy = 1; greedy >= 0; greedy--) {
        run_stats base = generate(o, keep, ids, n_ids, greedy, 0);
        const char *how = greedy ? "greedy" : "generation_config";
        printf("| %s | 0 | - | %.1f | 1.00 | - | - |\n", how, base.tok_s);
        for (int d = 1; d <= 3; d++)
            for (int rc = 0; rc < 2; rc++) {
                run_stats st = generate(o, rc ? recompute : keep, ids, n_ids, greedy, d);
                printf("| %s | %d | %s | %.1f | %.2f | %.3f | %.2f |\n", how, d, rc ? "recompute" : "kept states",
                       st.tok_s, st.tok_s / base.tok_s, st.drafted ? (double)st.accepted / st.drafted : 0.0,
                       st.verify ? (double)(st.accepted + st.verify) / st.verify : 0.0);
                fflush(stdout);
            }
    }
}

/* Greedy at the set acceptance: measured against predicted speedups. */
static void simulated(const opts *o, tern_model *m, const step_costs *sc, const int32_t *ids, size_t n_ids) {
    printf("simulated acceptance %.2f (each draft kept with that probability): %d prompts of 32 tokens, %d tokens "
           "each, greedy, best of %d\n", o->force, o->prompts, o->tokens, o->reps);
    printf("| depth | decode tok/s | speedup | predicted | tokens a verify step |\n|---|---|---|---|---|\n");
    run_stats base = generate(o, m, ids, n_ids, 1, 0);
    printf("| 0 | %.2f | 1.00 | 1.00 | - |\n", base.tok_s);
    for (int d = 1; d <= D; d++) {
        run_stats st = generate(o, m, ids, n_ids, 1, d);
        double tokens = 1, a = 1;
        for (int i = 0; i < d; i++) tokens += a *= o->force;
        double predicted = tokens / (sc->c[d + 1] + d * sc->draft / sc->decode);
        printf("| %d | %.2f | %.2f | %.2f | %.2f |\n", d, st.tok_s, st.tok_s / base.tok_s, predicted,
               st.verify ? (double)(st.accepted + st.verify) / st.verify : 0.0);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    opts o = {"models/tern-tiny", "tests/fixtures/tern-tiny-heldout.txt", 1500, 6, 128, 3, 0, 200, 0};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m")) o.model = v;
        else if (!strcmp(a, "-f")) o.text = v;
        else if (!strcmp(a, "-P")) o.positions = atoi(v);
        else if (!strcmp(a, "-p")) o.prompts = atoi(v);
        else if (!strcmp(a, "-n")) o.tokens = atoi(v);
        else if (!strcmp(a, "-r")) o.reps = atoi(v);
        else if (!strcmp(a, "-t")) o.threads = atoi(v);
        else if (!strcmp(a, "-c")) o.cost_reps = atoi(v);
        else if (!strcmp(a, "-a")) o.force = atof(v);
        else {
            fprintf(stderr, "bench_mtp: unknown option %s\n", a);
            return 2;
        }
    }
    if (o.prompts < 1 || o.tokens < 1 || o.reps < 1 || o.cost_reps < 1 || o.positions < 0) {
        fprintf(stderr, "bench_mtp: -p, -n, -r and -c need at least 1\n");
        return 2;
    }
    if (!(o.force >= 0 && o.force <= 1)) {
        fprintf(stderr, "bench_mtp: -a takes a rate in [0, 1]\n");
        return 2;
    }
    size_t n_ids;
    if (o.force > 0) {
        tern_model *m = load(&o, 0);
        int32_t *ids = read_ids(&o, m, &n_ids);
        step_costs sc = costs(&o, m, ids);
        simulated(&o, m, &sc, ids, n_ids);
        free(ids);
        tern_model_free(m);
        return 0;
    }
    tern_model *keep = load(&o, 0), *recompute = load(&o, 1);
    int32_t *ids = read_ids(&o, keep, &n_ids);
    if (n_ids < 128) {
        fprintf(stderr, "bench_mtp: %s is too short\n", o.text);
        return 1;
    }
    if (n_ids > 300) costs(&o, keep, ids);
    if (n_ids > 300) costs(&o, recompute, ids);
    if (o.positions > 0) teacher_forced(&o, keep, ids, n_ids);
    generation(&o, keep, recompute, ids, n_ids);
    free(ids);
    tern_model_free(keep);
    tern_model_free(recompute);
    return 0;
}
