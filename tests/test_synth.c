/* tern synth and the routing traces: the synthetic directory verifies and
 * runs, the in-memory model is the same model, the output is a function of
 * the seed, the full shape is exactly Qwen 3.6's, prose routing is less
 * uniform than uniform routing, the cache replay predicts the real cache's
 * hits exactly, and tern bench runs end to end. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "model/config.h"
#include "model/manifest.h"
#include "synth/synth.h"
#include "tern.h"
#include "testutil.h"

static char *synth_dir(const char *shape, const char *routing, uint64_t seed, int bits) {
    char *tmp = make_temp_dir(), *dst;
    cr_assert(asprintf(&dst, "%s/model", tmp) > 0);
    free(tmp);
    tern_synth_params p = {.shape = shape, .routing = routing, .seed = seed, .bits = bits, .dst = dst, .n_threads = 2};
    tern_error err;
    cr_assert_eq(tern_synth(&p, &err), 0, "%s", err.msg);
    return dst;
}

static void rm_model(char *dst) {
    char *parent = strdup(dst);
    *strrchr(parent, '/') = '\0';
    rm_rf(parent);
    free(parent);
    free(dst);
}

/* Greedy ids and the last logits of n decode steps after a short prompt. */
static void decode(tern_model *m, int n, int32_t *ids, float *last) {
    tern_error err;
    tern_session_params sp = {.kv_bits = 16};
    tern_session *s = tern_session_create(m, &sp, &err);
    cr_assert_not_null(s, "%s", err.msg);
    int V = tern_model_vocab_size(m);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t prompt[5] = {1, 7, 42, 3, 99};
    cr_assert_eq(tern_session_eval(s, prompt, 5, logits, 0, &err), 0, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        int32_t best = 0;
        for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        for (int v = 0; v < V; v++) cr_assert(isfinite(logits[v]), "logit %d of step %d is %f", v, i, logits[v]);
        ids[i] = best;
        cr_assert_eq(tern_session_eval(s, &best, 1, logits, 0, &err), 0, "%s", err.msg);
    }
    memcpy(last, logits, (size_t)V * sizeof *logits);
    free(logits);
    tern_session_destroy(s);
}

Test(synth, directory_verifies_and_equals_the_in_memory_model) {
    char *dst = synth_dir("small", NULL, 5, 4);
    tern_error err;
    cr_assert_eq(tern_verify(dst, NULL, &err), 0, "%s", err.msg);
    tern_load_params lp = {.n_threads = 2};
    tern_model *file = tern_model_load(dst, &lp, &err);
    cr_assert_not_null(file, "%s", err.msg);
    tern_synth_params sp = {.shape = "small", .seed = 5, .bits = 4};
    tern_model *mem = tern_model_synth(&sp, &lp, &err);
    cr_assert_not_null(mem, "%s", err.msg);
    int V = tern_model_vocab_size(file);
    int32_t a[24], b[24];
    float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
    decode(file, 24, a, la);
    decode(mem, 24, b, lb);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "greedy ids differ between the directory and the in-memory model");
    cr_assert_eq(memcmp(la, lb, (size_t)V * sizeof *la), 0, "logits differ (the same bytes must give the same bits)");
    free(la);
    free(lb);
    tern_model_free(file);
    tern_model_free(mem);
    rm_model(dst);
}

static void file_hashes(const char *dir, char *out, size_t n) {
    tern_manifest m;
    tern_error err;
    cr_assert_eq(tern_manifest_read(&m, dir, &err), 0, "%s", err.msg);
    out[0] = '\0';
    for (int i = 0; i < m.n_files; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s=%s\n", m.files[i].path, m.files[i].sha256);
    tern_manifest_free(&m);
}

Test(synth, output_is_a_function_of_the_seed) {
    char *a = synth_dir("small", "uniform", 1, 8), *b = synth_dir("small", "uniform", 1, 8),
         *c = synth_dir("small", "uniform", 2, 8);
    static char ha[8192], hb[8192], hc[8192];
    file_hashes(a, ha, sizeof ha);
    file_hashes(b, hb, sizeof hb);
    file_hashes(c, hc, sizeof hc);
    cr_assert_str_eq(ha, hb, "same seed, different files");
    cr_assert(strstr(hc, "resident.bin=") && strcmp(ha, hc) != 0, "another seed gave the same files");
    rm_model(a);
    rm_model(b);
    rm_model(c);
}

Test(synth, full_shape_is_qwen36_exactly) {
    tern_synth_params p = {.shape = "qwen3.6-35b-a3b"};
    synth s;
    tern_error err;
    cr_assert_eq(synth_create(&s, &p, &err), 0, "%s", err.msg);
    tern_config want;
    cr_assert_eq(tern_config_load(&want, fixture_dir("qwen36-config"), &err), 0, "%s", err.msg);
    const tern_config *got = &s.cfg;
    cr_assert_eq(got->hidden, want.hidden);
    cr_assert_eq(got->n_layers, want.n_layers);
    cr_assert_eq(memcmp(got->layer_kind, want.layer_kind, (size_t)want.n_layers), 0);
    cr_assert_eq(got->vocab, want.vocab);
    cr_assert_eq(got->n_heads, want.n_heads);
    cr_assert_eq(got->n_kv_heads, want.n_kv_heads);
    cr_assert_eq(got->head_dim, want.head_dim);
    cr_assert_eq(got->rope_dim, want.rope_dim);
    cr_assert_eq(got->rope_theta, want.rope_theta);
    cr_assert_eq(got->gdn_k_heads, want.gdn_k_heads);
    cr_assert_eq(got->gdn_v_heads, want.gdn_v_heads);
    cr_assert_eq(got->gdn_k_dim, want.gdn_k_dim);
    cr_assert_eq(got->gdn_v_dim, want.gdn_v_dim);
    cr_assert_eq(got->gdn_conv_kernel, want.gdn_conv_kernel);
    cr_assert_eq(got->n_experts, want.n_experts);
    cr_assert_eq(got->top_k, want.top_k);
    cr_assert_eq(got->expert_inter, want.expert_inter);
    cr_assert_eq(got->shared_inter, want.shared_inter);
    cr_assert_eq(got->mtp_layers, want.mtp_layers);
    cr_assert_eq(got->tie_embeddings, want.tie_embeddings);
    /* the parameter count of the text model (MTP excluded), as tern info prints it */
    double params = 0;
    for (int i = 0; i < s.n_tensors; i++) {
        if (!strncmp(s.tensors[i].name, "mtp.", 4)) continue;
        double n = 1;
        for (int d = 0; d < s.tensors[i].ndim; d++) n *= (double)s.tensors[i].shape[d];
        params += n;
    }
    cr_assert_eq((int64_t)params, 34660610688LL, "%.0f parameters", params);
    synth_free(&s);
}

Test(synth, bad_options_are_named) {
    tern_error err;
    tern_synth_params p = {.shape = "qwen9", .dst = "/tmp/never-written"};
    cr_assert_neq(tern_synth(&p, &err), 0);
    cr_assert(strstr(err.msg, "unknown shape 'qwen9'"), "%s", err.msg);
    p = (tern_synth_params){.shape = "small", .routing = "zipf", .dst = "/tmp/never-written"};
    cr_assert_neq(tern_synth(&p, &err), 0);
    cr_assert(strstr(err.msg, "unknown routing mode 'zipf'"), "%s", err.msg);
    p = (tern_synth_params){.shape = "small", .bits = 5, .dst = "/tmp/never-written"};
    cr_assert_neq(tern_synth(&p, &err), 0);
    cr_assert(strstr(err.msg, "4 or 8"), "%s", err.msg);
    tern_load_params lp = {.expert_budget = 1 << 20};
    p = (tern_synth_params){.shape = "small"};
    cr_assert_null(tern_model_synth(&p, &lp, &err));
    cr_assert(strstr(err.msg, "no files to stream"), "%s", err.msg);
}

/* ---- routing traces ----------------------------------------------------- */

static tern_route_summary trace_of(const char *routing, int tokens) {
    tern_error err;
    tern_load_params lp = {.n_threads = 2};
    tern_synth_params sp = {.shape = "small", .routing = routing, .seed = 9};
    tern_model *m = tern_model_synth(&sp, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    int L, E, K;
    tern_model_moe_shape(m, &L, &E, &K);
    tern_route_trace *t = tern_route_trace_create(L, E, K, &err);
    cr_assert_not_null(t, "%s", err.msg);
    tern_session *s = tern_session_create(m, NULL, &err);
    tern_session_set_route_observer(s, tern_route_trace_record, t);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < tokens; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int32_t id = (int32_t)(x % (uint64_t)tern_model_vocab_size(m));
        cr_assert_eq(tern_session_eval(s, &id, 1, NULL, 0, &err), 0, "%s", err.msg);
    }
    tern_route_summary rs;
    tern_route_trace_summary(t, &rs);
    cr_assert_eq(rs.tokens, tokens);
    tern_session_destroy(s);
    tern_route_trace_destroy(t);
    tern_model_free(m);
    return rs;
}

Test(synth, prose_routing_reuses_experts_more_than_uniform) {
    /* random tokens: any reuse beyond chance comes from the router's shape */
    tern_route_summary u = trace_of("uniform", 160), p = trace_of("prose", 160);
    /* 4 of 16 experts: independent tokens reuse 25 % */
    cr_assert_lt(u.reuse, 0.40, "uniform reuse %.3f", u.reuse);
    cr_assert_gt(p.reuse, u.reuse + 0.15, "prose reuse %.3f vs uniform %.3f", p.reuse, u.reuse);
    cr_assert_lt(p.distinct8, u.distinct8, "prose %.2f vs uniform %.2f distinct per 8 tokens", p.distinct8, u.distinct8);
}

Test(synth, summary_of_a_known_trace) {
    tern_error err;
    tern_route_trace *t = tern_route_trace_create(2, 16, 2, &err);
    cr_assert_not_null(t);
    /* layer 0: the same pair every token; layer 1: alternating disjoint pairs */
    for (int i = 0; i < 64; i++) {
        int same[2] = {3, 5}, alt[2] = {i % 2 ? 0 : 2, i % 2 ? 1 : 3};
        tern_route_trace_record(t, 0, i, same, 2);
        tern_route_trace_record(t, 1, i, alt, 2);
        tern_route_trace_record(t, 2, i, same, 2);   /* beyond the layers (MTP): ignored */
    }
    tern_route_summary s;
    tern_route_trace_summary(t, &s);
    cr_assert_eq(s.tokens, 64);
    cr_assert_float_eq(s.reuse, 0.5, 1e-12);          /* (1 + 0) / 2 */
    cr_assert_float_eq(s.distinct8, 3.0, 1e-12);      /* (2 + 4) / 2 */
    cr_assert_float_eq(s.lifetime, 3.0, 1e-12);
    cr_assert_float_eq(s.first_touch_ceiling, 1.0 - 6.0 / 256.0, 1e-12);
    /* 2 slots: layer 0 always hits after its first token, layer 1 never */
    cr_assert_float_eq(tern_route_trace_simulate(t, 2, TERN_POLICY_LRU), (126.0 + 0.0) / 256.0, 1e-12);
    cr_assert_float_eq(tern_route_trace_simulate(t, 4, TERN_POLICY_LFU), (126.0 + 124.0) / 256.0, 1e-12);
    tern_route_trace_destroy(t);
}

/* The replay must plan like the cache: on a streamed decode its hit count
 * equals the cache's own. */
static void replay_matches(int policy) {
    char *dst = synth_dir("small", "prose", 3, 4);
    tern_error err;
    tern_manifest man;
    cr_assert_eq(tern_manifest_read(&man, dst, &err), 0, "%s", err.msg);
    int files = man.n_layer_files + (man.mtp_file ? 1 : 0), slots = 6;
    tern_load_params lp = {.n_threads = 2, .expert_budget = (uint64_t)man.stride * files * slots, .expert_policy = policy};
    tern_manifest_free(&man);
    tern_model *m = tern_model_load(dst, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    int L, E, K;
    tern_model_moe_shape(m, &L, &E, &K);
    tern_route_trace *t = tern_route_trace_create(L, E, K, &err);
    tern_session *s = tern_session_create(m, NULL, &err);
    tern_session_set_route_observer(s, tern_route_trace_record, t);
    for (int i = 0; i < 96; i++) {
        int32_t id = (int32_t)((i * 7919) % 1024);
        cr_assert_eq(tern_session_eval(s, &id, 1, NULL, 0, &err), 0, "%s", err.msg);
    }
    tern_stream_stats st;
    tern_model_stream_stats(m, &st);
    cr_assert_eq(st.slots_per_layer, slots);
    double real = (double)st.hits / (double)(st.hits + st.misses);
    double sim = tern_route_trace_simulate(t, slots, policy);
    cr_assert_float_eq(sim, real, 1e-12, "replay %.6f, cache %.6f (%llu hits, %llu misses)", sim, real,
                       (unsigned long long)st.hits, (unsigned long long)st.misses);
    cr_assert(real > 0.05 && real < 0.95, "a test that hits always or never proves little: %.3f", real);
    tern_session_destroy(s);
    tern_route_trace_destroy(t);
    tern_model_free(m);
    rm_model(dst);
}

Test(synth, replay_predicts_the_lfu_cache) { replay_matches(TERN_POLICY_LFU); }
Test(synth, replay_predicts_the_lru_cache) { replay_matches(TERN_POLICY_LRU); }

/* ---- the commands ------------------------------------------------------- */

Test(synth, bench_smoke) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --synth small -p 48 -n 8 -c 40 -r 2 -t 2 --force --hit-curve --json - 2>/dev/null",
             tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "| prefill | 48 | 48 |"), "%s", out);
    cr_assert(strstr(out, "| decode | 40 | 8 |"), "%s", out);
    cr_assert(strstr(out, "command: tern bench --synth small"), "%s", out);
    cr_assert(strstr(out, "| slots per layer | LRU hit rate | LFU hit rate |"), "%s", out);
    json_error_t je;
    json_t *js = json_loads(strchr(strstr(out, "\n{"), '{'), JSON_DISABLE_EOF_CHECK, &je);
    cr_assert_not_null(js, "JSON: %s\n%s", je.text, out);
    json_t *res = json_object_get(js, "results");
    cr_assert_eq(json_array_size(res), 2);
    double dec = json_real_value(json_object_get(json_array_get(res, 1), "tok_s_median"));
    cr_assert_gt(dec, 0.0);
    cr_assert(json_object_get(json_array_get(res, 0), "ttft_ms"));
    json_decref(js);
    free(out);
}

/* --fill: decode contexts set in place (tern_session_fill), named so. */
Test(synth, bench_decode_filled) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --synth small -p 8 -n 4 -c 200 -r 2 -t 2 --fill --force 2>/dev/null",
             tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "| decode, filled | 200 | 4 |"), "%s", out);
    free(out);
}

/* --depth: the prefill runs after a context of that many tokens, and the
 * ctx column counts both. */
Test(synth, bench_prefill_at_depth) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --synth small -p 16 --depth 40 -n 4 -c 8 -r 2 -t 2 --force 2>/dev/null",
             tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "| prefill | 56 | 16 |"), "%s", out);
    free(out);
}

Test(synth, commands_refuse_bad_input) {
    struct { const char *args; int rc; const char *msg; } cases[] = {
        {"bench", 2, "exactly one of -m DIR and --synth SHAPE"},
        {"bench --synth small -p 0", 2, "-p needs a comma-separated list"},
        {"bench --synth small --kv-bits 7", 2, "--kv-bits must be"},
        {"bench --synth nope --force", 1, "unknown shape 'nope'"},
        {"synth", 2, "usage: tern synth DST"},
        {"synth /tmp/x --bits 3", 1, "--bits must be 4 or 8"},
        {"synth /tmp/x --expert-bits 5", 1, "--expert-bits must be 4 or 8"},
        {"bench --synth small --expert-bits 5 --force", 1, "expert bits must be 4 or 8 (got 5)"},
        {"synth /tmp/x --seed -1", 2, "--seed needs a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", tern_bin(), cases[i].args);
        int rc;
        char *out = run_sh(cmd, &rc);
        cr_assert_eq(rc, cases[i].rc, "tern %s: exit %d\n%s", cases[i].args, rc, out);
        cr_assert(strstr(out, cases[i].msg), "tern %s:\n%s", cases[i].args, out);
        free(out);
    }
}

/* The byte floor's numerator: the KV term grows by two rows per attention
 * layer per position; a streamed layer's 8 blobs are counted; no GPU here. */
Test(synth, decode_bytes_and_device) {
    tern_error err;
    tern_synth_params sp = {.shape = "small", .bits = 8};
    tern_load_params lp = {.n_threads = 1};
    tern_model *m = tern_model_synth(&sp, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_assert_str_eq(tern_model_device(m), "cpu");
    uint64_t b0 = tern_model_decode_bytes(m, 0, 8), b1 = tern_model_decode_bytes(m, 1000, 8);
    /* small: 1 attention layer of 4; 2 KV heads x 64 dims at 8 bits in groups of 64: 128 + 2 x 2 x 2 bytes */
    cr_assert_eq(b1 - b0, (uint64_t)2 * 1000 * (128 + 8), "%llu", (unsigned long long)(b1 - b0));
    int L, E, K;
    tern_model_moe_shape(m, &L, &E, &K);
    cr_assert_eq(L, 4);
    cr_assert_eq(E, 16);
    cr_assert_eq(K, 4);
    tern_model_free(m);
}

/* --expert-bits sets the routed experts alone: the bytes a token reads lie
 * between the all-4-bit and the all-8-bit model's. */
Test(synth, expert_bits_mix) {
    uint64_t bytes[3];
    const int bits[3][2] = {{4, 0}, {8, 4}, {8, 0}};
    for (int i = 0; i < 3; i++) {
        tern_error err;
        tern_synth_params sp = {.shape = "small", .bits = bits[i][0], .expert_bits = bits[i][1]};
        tern_load_params lp = {.n_threads = 1};
        tern_model *m = tern_model_synth(&sp, &lp, &err);
        cr_assert_not_null(m, "%s", err.msg);
        bytes[i] = tern_model_decode_bytes(m, 0, 16);
        tern_model_free(m);
    }
    cr_assert(bytes[0] < bytes[1] && bytes[1] < bytes[2], "%llu %llu %llu", (unsigned long long)bytes[0],
              (unsigned long long)bytes[1], (unsigned long long)bytes[2]);
}

Test(synth, cuda_device_without_cuda_is_named) {
#ifndef TERN_CUDA
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --synth small --device cuda --force 2>&1", tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "built without CUDA"), "%s", out);
    free(out);
#endif
}

/* --device auto (the default) runs where it can: on this build, the CPU. */
Test(synth, auto_device_falls_back_to_the_cpu) {
#ifndef TERN_CUDA
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench --synth small -p 8 -n 2 -c 8 -r 1 --force --device auto 2>/dev/null", tern_bin());
    int rc;
    char *out = run_sh(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "no GPU used"), "%s", out);
    free(out);
    tern_error err;
    tern_synth_params sp = {.shape = "small"};
    tern_load_params lp = {.n_threads = 1, .device = "auto"};
    tern_model *m = tern_model_synth(&sp, &lp, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_assert_str_eq(tern_model_device(m), "cpu");
    tern_model_free(m);
#endif
}
