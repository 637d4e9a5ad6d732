/* `tern bench`: prefill and decode speed, time to first token, peak memory
 * and expert-streaming figures of a model directory or an in-memory
 * synthetic model, with warm-up, repeats (median, min, max), the memory
 * bandwidth floor, and the machine, commit and command printed with every
 * result. Speaks only the public API (tern.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/bench_machine.h"
#include "cli/cli.h"
#include "cli/cmd_pack.h"
#include "tern.h"
#include "util/clock.h"
#include "util/err.h"

#ifndef TERN_COMMIT
#define TERN_COMMIT "unknown"
#endif

#define MAX_LIST 16

typedef struct {
    const char *model, *synth_shape, *routing, *json_path, *device;
    int bits, expert_bits, threads, kv_bits, reps, warmup, force, policy, home, io_threads, reference;
    uint64_t seed, budget, bandwidth;   /* bandwidth: GB/s given instead of measured (a GPU's HBM) */
    int prompt[MAX_LIST], n_prompt;
    int depth;                    /* prefill after a context of this many tokens */
    int gen[MAX_LIST], n_gen;
    int ctx[MAX_LIST], n_ctx;
    int curve;
    int fill;                     /* decode contexts filled (tern_session_fill), not prefilled */
    int no_graphs, cpu_sampling, kernel_stats;   /* the GPU engine's debugging aids */
    const char *phase_trace;
    int top_k;                    /* decode sampling: 0 = the full vocabulary */
    float top_p;
    int rope_scaling;             /* enum tern_rope_scaling */
    double rope_factor;           /* 0: the longest context a test needs over the native one */
    char command[4096];
} bench_opts;

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: tern bench (-m DIR | --synth SHAPE) [options]\n"
            "Measures prefill and decode speed, time to first token, peak memory and (when experts stream)\n"
            "hit rate and read bandwidth; prints a markdown table (and JSON with --json).\n"
            "options:\n"
            "  -m DIR               a model directory (packed or Hugging Face)\n"
            "  --synth SHAPE        an in-memory synthetic model (tern synth --list), with --bits 4|8 (4),\n"
            "                       --expert-bits 4|8 (--bits; --bits 8 --expert-bits 4: tern pack's default\n"
            "                       mix), --seed N (0), --routing prose|uniform (prose)\n"
            "  -p LIST              prefill prompt lengths (default 512,4096,32768)\n"
            "  --depth N            prefill after a context of N tokens (default 0: an empty one), as a\n"
            "                       turn that continues a cached conversation does\n"
            "  -n LIST              decode lengths (default 128,512)\n"
            "  -c LIST              decode contexts (default 512,4096,32768)\n"
            "  --fill               decode contexts of zero KV rows set in place of a prefill: a step's cost\n"
            "                       at contexts too long to prefill, its output meaningless (\"decode, filled\")\n"
            "  -r N                 timed repeats of each test (default 3); one untimed warm-up before them\n"
            "  -t N                 threads (default: all cores)\n"
            "  --kv-bits B          KV cache bits 32, 16, 8 or 4 (default 16)\n"
            "  --expert-budget SIZE stream routed experts through a cache of SIZE bytes (packed directories)\n"
            "  --expert-policy P    lfu (default) or lru\n"
            "  --expert-home H      ram (default) or disk: a GPU budget's other experts (tern --help)\n"
            "  --hit-curve          also replay the decode's routing through caches of 8..256 slots (LRU, LFU)\n"
            "  --top-k K, --top-p P decode sampling (default: temperature 1 over the full vocabulary)\n"
            "  --json FILE          write the results as JSON (- for stdout)\n"
            "  --force              measure even when other processes keep the CPU or the GPU busy\n"
            "  --reference          the plain fp32 reference kernels only (the checked baseline)\n"
            "  --device auto|cpu|cuda[:N]  where the model runs (default auto: the GPU when possible)\n"
            "  --rope-scaling none|yarn, --rope-factor F   RoPE scaling (tern --help): contexts past the native\n"
            "                       one (YaRN's factor by default: the longest test's context over it)\n"
            "  --bandwidth GB/S     the memory bandwidth of the floor column instead of measuring the host's\n"
            "                       (for a GPU: its measured HBM read rate, e.g. 4430 on an H200)\n"
            "GPU debugging aids (tern_load_params.debug; not for official numbers):\n"
            "  --no-graphs          decode steps launched op by op, never captured as CUDA graphs\n"
            "  --cpu-sampling       draw each token on the CPU from downloaded logits\n"
            "  --kernel-stats MODE  GPU time per op role, printed at the end: decode (graphs off), prefill,\n"
            "                       or graph (each replayed one-token graph against the host's wall time)\n"
            "  --phase-trace FILE   a make CUDA=1 TRACE=1 build: the decode kernels' phase trace as CSV\n"
            "Prompts are random token ids (seeded); decode samples at temperature 1 (over the full vocabulary\n"
            "unless --top-k/--top-p cut it).\n");
}

/* ---- options ------------------------------------------------------------ */

static int parse_list(const char *flag, const char *s, int *out, int *n) {
    *n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        char *end;
        errno = 0;
        v = strtoull(tok, &end, 10);
        if (*end == 'K' || *end == 'k') { v *= 1024; end++; }
        if (!*tok || *end || errno || tok[0] == '-' || v < 1 || v > 1 << 20 || *n == MAX_LIST) {
            fprintf(stderr, "tern bench: %s needs a comma-separated list of token counts (1..1M), got '%s'\n",
                    flag, s ? s : "");
            return -1;
        }
        out[(*n)++] = (int)v;
    }
    if (*n == 0) {
        fprintf(stderr, "tern bench: %s needs at least one value\n", flag);
        return -1;
    }
    return 0;
}

static void join_command(bench_opts *o, int argc, char **argv) {
    size_t at = (size_t)snprintf(o->command, sizeof o->command, "tern");
    for (int i = 0; i < argc && at < sizeof o->command; i++)
        at += (size_t)snprintf(o->command + at, sizeof o->command - at, " %s", argv[i]);
}

static int parse_bench(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->reps = 3;
    o->warmup = 1;
    o->kv_bits = 16;
    o->device = "auto";
    static const int prompts[] = {512, 4096, 32768}, gens[] = {128, 512}, ctxs[] = {512, 4096, 32768};
    memcpy(o->prompt, prompts, sizeof prompts);
    o->n_prompt = 3;
    memcpy(o->gen, gens, sizeof gens);
    o->n_gen = 2;
    memcpy(o->ctx, ctxs, sizeof ctxs);
    o->n_ctx = 3;
    join_command(o, argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        int takes = 1, rc = 0;
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "--synth")) o->synth_shape = v;
        else if (!strcmp(a, "--routing")) o->routing = v;
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "-p")) rc = parse_list(a, v, o->prompt, &o->n_prompt);
        else if (!strcmp(a, "-n")) rc = parse_list(a, v, o->gen, &o->n_gen);
        else if (!strcmp(a, "-c")) rc = parse_list(a, v, o->ctx, &o->n_ctx);
        else if (!strcmp(a, "--bits")) { rc = cli_parse_u64("bench", a, v, 8, &n); o->bits = (int)n; }
        else if (!strcmp(a, "--expert-bits")) { rc = cli_parse_u64("bench", a, v, 8, &n); o->expert_bits = (int)n; }
        else if (!strcmp(a, "--seed")) rc = cli_parse_u64("bench", a, v, ~0ull, &o->seed);
        else if (!strcmp(a, "--bandwidth")) rc = cli_parse_u64("bench", a, v, 1000000, &o->bandwidth);
        else if (!strcmp(a, "-r")) { rc = cli_parse_u64("bench", a, v, 1000, &n); o->reps = (int)n; }
        else if (!strcmp(a, "--depth")) { rc = cli_parse_u64("bench", a, v, 1 << 24, &n); o->depth = (int)n; }
        else if (!strcmp(a, "-t")) { rc = cli_parse_u64("bench", a, v, 4096, &n); o->threads = (int)n; }
        else if (!strcmp(a, "--io-threads")) { rc = cli_parse_u64("bench", a, v, 64, &n); o->io_threads = (int)n; }
        else if (!strcmp(a, "--kv-bits")) { rc = cli_parse_u64("bench", a, v, 32, &n); o->kv_bits = (int)n; }
        else if (!strcmp(a, "--top-k")) { rc = cli_parse_u64("bench", a, v, 1 << 20, &n); o->top_k = (int)n; }
        else if (!strcmp(a, "--rope-scaling")) {
            if (!v || (strcmp(v, "none") && strcmp(v, "yarn"))) {
                fprintf(stderr, "tern bench: --rope-scaling must be none or yarn\n");
                return 2;
            }
            o->rope_scaling = !strcmp(v, "yarn") ? TERN_ROPE_YARN : TERN_ROPE_NONE;
        } else if (!strcmp(a, "--rope-factor")) {
            char *end;
            o->rope_factor = v ? strtod(v, &end) : 0;
            if (!v || *end || !(o->rope_factor >= 1 && o->rope_factor <= (1 << 20))) {
                fprintf(stderr, "tern bench: --rope-factor needs a number in [1, 1048576]\n");
                return 2;
            }
        }
        else if (!strcmp(a, "--top-p")) {
            char *end;
            o->top_p = v ? strtof(v, &end) : 0;
            if (!v || *end || !(o->top_p > 0 && o->top_p <= 1)) {
                fprintf(stderr, "tern bench: --top-p needs a number in (0, 1]\n");
                return 2;
            }
        }
        else if (!strcmp(a, "--expert-budget")) {
            tern_error err;
            if (!v || tern_parse_size(v, &o->budget, &err) != 0) {
                fprintf(stderr, "tern bench: --expert-budget: %s\n", v ? err.msg : "needs a size");
                return 2;
            }
        } else if (!strcmp(a, "--expert-policy")) {
            if (!v || (strcmp(v, "lfu") && strcmp(v, "lru"))) {
                fprintf(stderr, "tern bench: --expert-policy must be lfu or lru\n");
                return 2;
            }
            o->policy = !strcmp(v, "lru") ? TERN_POLICY_LRU : TERN_POLICY_LFU;
        } else if (!strcmp(a, "--expert-home")) {
            if (!v || (strcmp(v, "ram") && strcmp(v, "disk"))) {
                fprintf(stderr, "tern bench: --expert-home must be ram or disk\n");
                return 2;
            }
            o->home = !strcmp(v, "disk") ? TERN_HOME_DISK : TERN_HOME_RAM;
        } else if (!strcmp(a, "--kernel-stats")) {
            static const char *modes[] = {"decode", "prefill", "graph"};
            static const int kinds[] = {TERN_STATS_DECODE, TERN_STATS_PREFILL, TERN_STATS_GRAPH};
            o->kernel_stats = -1;
            for (int k = 0; v && k < 3; k++)
                if (!strcmp(v, modes[k])) o->kernel_stats = kinds[k];
            if (o->kernel_stats < 0) {
                fprintf(stderr, "tern bench: --kernel-stats must be decode, prefill or graph\n");
                return 2;
            }
        } else if (!strcmp(a, "--phase-trace")) {
            o->phase_trace = v;
        } else {
            takes = 0;
            if (!strcmp(a, "--force")) o->force = 1;
            else if (!strcmp(a, "--no-graphs")) o->no_graphs = 1;
            else if (!strcmp(a, "--cpu-sampling")) o->cpu_sampling = 1;
            else if (!strcmp(a, "--hit-curve")) o->curve = 1;
            else if (!strcmp(a, "--fill")) o->fill = 1;
            else if (!strcmp(a, "--reference")) o->reference = 1;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bench_usage(stdout); return 1; }
            else {
                fprintf(stderr, "tern bench: unknown option '%s' (see tern bench --help)\n", a);
                return 2;
            }
        }
        if (rc != 0) return 2;
        if (takes && !v) {
            fprintf(stderr, "tern bench: %s needs a value\n", a);
            return 2;
        }
        i += takes;
    }
    if (!o->model == !o->synth_shape) {
        fprintf(stderr, "tern bench: give exactly one of -m DIR and --synth SHAPE\n");
        return 2;
    }
    if (o->kv_bits != 32 && o->kv_bits != 16 && o->kv_bits != 8 && o->kv_bits != 4) {
        fprintf(stderr, "tern bench: --kv-bits must be 32, 16, 8 or 4\n");
        return 2;
    }
    if (o->reps < 1) {
        fprintf(stderr, "tern bench: -r must be at least 1\n");
        return 2;
    }
    return 0;
}

/* ---- measuring ---------------------------------------------------------- */

typedef struct {
    char test[16];
    int ctx, tokens;
    double median, min, max;     /* tok/s */
    double ttft_ms;              /* prefill rows: median time to the first token's logits */
    double floor_tps;            /* decode rows: bandwidth / bytes per token */
    double hit, mb_per_tok, read_gbs;   /* streaming decode rows (hit < 0: not streaming) */
} result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void summarize(double *v, int n, result *r) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    r->min = v[0];
    r->max = v[n - 1];
    r->median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    tern_model *m;
    const bench_opts *o;
    int vocab;
    uint64_t rng;
    double bandwidth;
    tern_route_trace *trace;
    int on_gpu;
    double vram_mib;              /* the largest reading while a decode session lived */
} bench;

static int32_t random_token(bench *b) {
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return (int32_t)(b->rng % (uint64_t)b->vocab);
}

static tern_session *new_session(bench *b, int max_ctx, tern_error *err) {
    int most = tern_model_max_context(b->m);
    tern_session_params sp = {.max_context = max_ctx + 8 > most && max_ctx <= most ? most : max_ctx + 8,
                              .kv_bits = b->o->kv_bits};
    return tern_session_create(b->m, &sp, err);
}

/* A session holding a context of D random tokens (and room for P more),
 * and a snapshot of it to start each repeat from. */
static tern_session *deep_session(bench *b, int D, int P, tern_snapshot **snap, tern_error *err) {
    *snap = NULL;
    tern_session *s = new_session(b, D + P, err);
    if (!s) return NULL;
    int32_t *toks = malloc((size_t)D * sizeof *toks);
    int rc = toks ? 0 : tern_fail(err, "out of memory");
    for (int i = 0; rc == 0 && i < D; i++) toks[i] = random_token(b);
    if (rc == 0) rc = tern_session_eval(s, toks, D, NULL, 0, err);
    free(toks);
    if (rc == 0 && !(*snap = tern_session_snapshot(s, err))) rc = -1;
    if (rc == 0) return s;
    tern_session_destroy(s);
    return NULL;
}

static int run_prefill(bench *b, int P, result *r, tern_error *err) {
    int D = b->o->depth;
    int32_t *toks = malloc((size_t)P * sizeof *toks);
    float *logits = malloc((size_t)b->vocab * sizeof *logits);
    double tps[1000], ttft[1000];
    int rc = toks && logits ? 0 : -1, n = 0;
    /* at depth 0 each repeat is a new session, its allocations timed too */
    tern_snapshot *snap = NULL;
    tern_session *s = rc == 0 && D > 0 ? deep_session(b, D, P, &snap, err) : NULL;
    if (D > 0 && !s) rc = -1;
    for (int rep = 0; rc == 0 && rep < b->o->warmup + b->o->reps; rep++) {
        for (int i = 0; i < P; i++) toks[i] = random_token(b);
        if (D == 0) tern_session_destroy(s);
        if (D == 0 && !(s = new_session(b, P, err))) rc = -1;
        if (rc == 0 && snap) rc = tern_session_restore(s, snap, err);
        if (rc != 0) break;
        double t0 = tern_now_s();
        rc = tern_session_eval(s, toks, P, logits, 0, err);
        double dt = tern_now_s() - t0;
        if (rc == 0 && rep >= b->o->warmup) {
            tps[n] = P / dt;
            ttft[n++] = dt * 1e3;
        }
    }
    tern_snapshot_free(snap);
    tern_session_destroy(s);
    free(toks);
    free(logits);
    if (rc != 0) return -1;
    *r = (result){.ctx = D + P, .tokens = P, .hit = -1};
    snprintf(r->test, sizeof r->test, "prefill");
    summarize(ttft, n, r);
    r->ttft_ms = r->median;
    summarize(tps, n, r);
    return 0;
}

static void count_token(void *ctx, int32_t id) { (void)ctx; (void)id; }

/* Decode n tokens after a context of C random tokens: the context is
 * prefilled once and snapshotted; every repeat restores it and samples. */
static int run_decode(bench *b, int C, int n, int trace_it, result *r, tern_error *err) {
    tern_session *s = new_session(b, C + n, err);
    if (!s) return -1;
    int32_t *toks = malloc((size_t)C * sizeof *toks);
    int rc = toks ? 0 : -1;
    for (int i = 0; rc == 0 && i < C; i++) toks[i] = random_token(b);
    if (rc == 0 && C > 1)
        rc = b->o->fill ? tern_session_fill(s, C - 1, err) : tern_session_eval(s, toks, C - 1, NULL, 0, err);
    tern_snapshot *snap = rc == 0 ? tern_session_snapshot(s, err) : NULL;
    if (!snap) rc = -1;
    tern_gen_params gp = {.n_predict = n, .ignore_eos = 1, .on_token = count_token};
    tern_sampler_params_default(&gp.sampling);
    gp.sampling.do_sample = 1;
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = b->o->top_k;
    gp.sampling.top_p = b->o->top_p > 0 ? b->o->top_p : 1.0f;
    double tps[1000];
    int got = 0;
    tern_stream_stats s0, s1;
    tern_model_stream_stats(b->m, &s0);
    uint64_t tokens = 0;
    double read_time = 0;
    for (int rep = 0; rc == 0 && rep < b->o->warmup + b->o->reps; rep++) {
        if ((rc = tern_session_restore(s, snap, err)) != 0) break;
        int timed = rep >= b->o->warmup;
        /* the routing is traced in the untimed warm-up (a trace on the GPU
         * reads the expert ids back every layer) */
        if (rep == 0 && !timed && trace_it && b->trace) {
            tern_route_trace_clear(b->trace);
            tern_session_set_route_observer(s, tern_route_trace_record, b->trace);
        } else {
            tern_session_set_route_observer(s, NULL, NULL);
        }
        if (rep == b->o->warmup) tern_model_stream_stats(b->m, &s0);
        gp.sampling.seed = b->o->seed + (uint64_t)rep;
        tern_gen_stats st;
        int32_t last = toks[C - 1];
        double t0 = tern_now_s();
        rc = tern_generate(s, NULL, &last, 1, &gp, NULL, NULL, &st, err);
        double dt = tern_now_s() - t0;
        if (rc == 0 && timed) {
            tps[got++] = st.n_generated / (st.decode_s > 0 ? st.decode_s : dt);
            tokens += (uint64_t)st.n_generated;
            read_time += st.decode_s;
        }
    }
    tern_session_set_route_observer(s, NULL, NULL);
    if (b->on_gpu) {
        double mib = bench_gpu_mem_mib();
        if (mib > b->vram_mib) b->vram_mib = mib;
    }
    tern_model_stream_stats(b->m, &s1);
    tern_snapshot_free(snap);
    tern_session_destroy(s);
    free(toks);
    if (rc != 0) return -1;
    *r = (result){.ctx = C, .tokens = n, .hit = -1};
    snprintf(r->test, sizeof r->test, b->o->fill ? "decode, filled" : "decode");
    summarize(tps, got, r);
    uint64_t bytes = tern_model_decode_bytes(b->m, C, b->o->kv_bits);
    r->floor_tps = bytes && b->bandwidth > 0 ? b->bandwidth * 1e9 / bytes : 0;
    if (s1.streaming) {
        uint64_t h = s1.hits - s0.hits, m = s1.misses - s0.misses, rd = s1.bytes_read - s0.bytes_read;
        r->hit = h + m ? (double)h / (double)(h + m) : 0;
        r->mb_per_tok = tokens ? rd / 1e6 / tokens : 0;
        r->read_gbs = read_time > 0 ? rd / 1e9 / read_time : 0;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------- */

static void print_table(FILE *f, const result *rs, int n) {
    int streaming = 0;
    for (int i = 0; i < n; i++) streaming |= rs[i].hit >= 0;
    fprintf(f, "| test | context | tokens | tok/s (median) | min | max | TTFT ms | floor tok/s | of floor |%s\n",
            streaming ? " hit rate | MB read/token | read GB/s |" : "");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|%s\n", streaming ? "---:|---:|---:|" : "");
    for (int i = 0; i < n; i++) {
        const result *r = &rs[i];
        char ttft[32] = "", fl[32] = "", of[32] = "";
        if (r->ttft_ms > 0) snprintf(ttft, sizeof ttft, "%.1f", r->ttft_ms);
        if (r->floor_tps > 0) {
            snprintf(fl, sizeof fl, "%.1f", r->floor_tps);
            snprintf(of, sizeof of, "%.0f %%", 100.0 * r->median / r->floor_tps);
        }
        fprintf(f, "| %s | %d | %d | %.2f | %.2f | %.2f | %s | %s | %s |", r->test, r->ctx, r->tokens, r->median,
                r->min, r->max, ttft, fl, of);
        if (streaming && r->hit >= 0) fprintf(f, " %.1f %% | %.1f | %.2f |", 100 * r->hit, r->mb_per_tok, r->read_gbs);
        else if (streaming) fprintf(f, " | | |");
        fprintf(f, "\n");
    }
}

static const int curve_slots[] = {8, 16, 24, 32, 48, 64, 96, 128, 192, 256};

static void print_routing(FILE *f, const tern_route_trace *t, int n_experts, int curve, json_t *js) {
    tern_route_summary rs;
    tern_route_trace_summary(t, &rs);
    if (rs.tokens < 2) return;
    fprintf(f, "\nrouting over %d decoded tokens (mean of layers): %.1f %% of experts reused from the previous "
               "token; distinct experts per 8 / 32 / 128 tokens: %.1f / %.1f / %.1f; over the run: %.1f; "
               "first-touch ceiling %.1f %%\n",
            rs.tokens, 100 * rs.reuse, rs.distinct8, rs.distinct32, rs.distinct128, rs.lifetime,
            100 * rs.first_touch_ceiling);
    json_object_set_new(js, "routing", json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "tokens", rs.tokens, "reuse",
                                                  rs.reuse, "distinct8", rs.distinct8, "distinct32", rs.distinct32,
                                                  "distinct128", rs.distinct128, "lifetime", rs.lifetime,
                                                  "first_touch_ceiling", rs.first_touch_ceiling));
    if (!curve) return;
    json_t *arr = json_array();
    fprintf(f, "\n| slots per layer | LRU hit rate | LFU hit rate |\n|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof curve_slots / sizeof *curve_slots; i++) {
        int s = curve_slots[i];
        if (s > n_experts) break;
        double lru = tern_route_trace_simulate(t, s, TERN_POLICY_LRU), lfu = tern_route_trace_simulate(t, s, TERN_POLICY_LFU);
        fprintf(f, "| %d | %.1f %% | %.1f %% |\n", s, 100 * lru, 100 * lfu);
        json_array_append_new(arr, json_pack("{s:i, s:f, s:f}", "slots", s, "lru", lru, "lfu", lfu));
    }
    json_object_set_new(js, "hit_curve", arr);
}

static json_t *results_json(const result *rs, int n) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        const result *r = &rs[i];
        json_t *o = json_pack("{s:s, s:i, s:i, s:f, s:f, s:f}", "test", r->test, "context", r->ctx, "tokens",
                              r->tokens, "tok_s_median", r->median, "tok_s_min", r->min, "tok_s_max", r->max);
        if (r->ttft_ms > 0) json_object_set_new(o, "ttft_ms", json_real(r->ttft_ms));
        if (r->floor_tps > 0) json_object_set_new(o, "floor_tok_s", json_real(r->floor_tps));
        if (r->hit >= 0) {
            json_object_set_new(o, "hit_rate", json_real(r->hit));
            json_object_set_new(o, "mb_read_per_token", json_real(r->mb_per_tok));
            json_object_set_new(o, "read_gb_s", json_real(r->read_gbs));
        }
        json_array_append_new(arr, o);
    }
    return arr;
}

/* ---- the command -------------------------------------------------------- */

/* The most positions a test's session holds. */
static int longest_context(const bench_opts *o) {
    int most = 0;
    for (int i = 0; i < o->n_prompt; i++) most = o->depth + o->prompt[i] > most ? o->depth + o->prompt[i] : most;
    for (int c = 0; c < o->n_ctx; c++)
        for (int g = 0; g < o->n_gen; g++) most = o->ctx[c] + o->gen[g] > most ? o->ctx[c] + o->gen[g] : most;
    return most;
}

static tern_model *open_model(const bench_opts *o, tern_error *err) {
    tern_load_params lp = {.n_threads = o->threads, .expert_budget = o->budget, .expert_policy = o->policy,
                           .expert_home = o->home,
                           .io_threads = o->io_threads, .reference_kernels = o->reference, .device = o->device,
                           .rope_scaling = o->rope_scaling, .rope_factor = o->rope_factor,
                           .rope_context = longest_context(o)};
    lp.debug.no_graphs = o->no_graphs;
    lp.debug.cpu_sampling = o->cpu_sampling;
    lp.debug.kernel_stats = o->kernel_stats;
    lp.debug.phase_trace = o->phase_trace;
    if (o->model) return tern_model_load(o->model, &lp, err);
    tern_synth_params sp = {.shape = o->synth_shape, .bits = o->bits, .expert_bits = o->expert_bits, .seed = o->seed,
                            .routing = o->routing};
    return tern_model_synth(&sp, &lp, err);
}

static int measure(bench *b, result *rs, int *n_rs, tern_error *err) {
    const bench_opts *o = b->o;
    for (int i = 0; i < o->n_prompt; i++) {
        fprintf(stderr, "bench: prefill %d tokens x %d ...\n", o->prompt[i], o->warmup + o->reps);
        if (run_prefill(b, o->prompt[i], &rs[(*n_rs)++], err) != 0) return -1;
    }
    for (int c = 0; c < o->n_ctx; c++)
        for (int g = 0; g < o->n_gen; g++) {
            fprintf(stderr, "bench: decode %d tokens at context %d x %d ...\n", o->gen[g], o->ctx[c],
                    o->warmup + o->reps);
            /* the routing trace: the first context's longest decode */
            int trace_it = c == 0 && g == o->n_gen - 1;
            if (run_decode(b, o->ctx[c], o->gen[g], trace_it, &rs[(*n_rs)++], err) != 0) return -1;
        }
    return 0;
}

/* 0 to go on; 1 when other processes hold the CPU or a GPU (and no
 * --force). *others gets their CPU use. */
static int preflight(const bench_opts *o, double *others, double *limit) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *others = bench_others_busy_cpus();
    *limit = 0.1 * ncpu > 0.5 ? 0.1 * ncpu : 0.5;
    if (*others > *limit && !o->force) {
        fprintf(stderr, "tern bench: other processes are using %.1f of %ld CPUs: the numbers would not be "
                        "yours (stop them, or --force)\n", *others, ncpu);
        return 1;
    }
    int gpu = o->device && strcmp(o->device, "cpu") != 0, n = gpu ? bench_gpu_other_processes() : 0;
    if (n > 0 && !o->force) {
        fprintf(stderr, "tern bench: %d other process%s hold%s a GPU context: the numbers would not be yours "
                        "(stop them, or --force)\n", n, n == 1 ? "" : "es", n == 1 ? "s" : "");
        return 1;
    }
    return 0;
}

typedef struct {
    char cpu[256], date[64];
    long ncpu;
    double load_s, others, limit;
} run_info;

/* Machine, commit, command, model and settings: printed with every result. */
static void print_header(const bench *b, const run_info *ri) {
    const bench_opts *o = b->o;
    struct utsname un;
    uname(&un);
    tern_stream_stats ss;
    tern_model_stream_stats(b->m, &ss);
    const char *dev = tern_model_device(b->m);
    int threads = tern_model_n_threads(b->m);
    printf("tern bench, commit %s, %s\nmachine: %s, %ld CPUs, %.0f GiB RAM, %s %s, %s\ncommand: %s\n", TERN_COMMIT,
           ri->date, ri->cpu, ri->ncpu, bench_ram_gib(), un.sysname, un.release, strcmp(dev, "cpu") ? dev : "no GPU used",
           o->command);
    char rope[192];
    tern_model_rope_describe(b->m, rope, sizeof rope);
    printf("model: %s, loaded in %.1f s; %d threads, %s kernels, KV cache %d-bit; rope scaling %s; experts %s",
           o->model ? o->model : o->synth_shape, ri->load_s, threads, o->reference ? "reference" : "SIMD", o->kv_bits,
           rope, ss.streaming ? "streamed" : "resident");
    if (ss.streaming)
        printf(" (%d slots per layer, %s%s)", ss.slots_per_layer, o->policy == TERN_POLICY_LRU ? "LRU" : "LFU",
               o->home == TERN_HOME_DISK ? ", the others on disk" : "");
    if (o->bandwidth) printf("\nmemory bandwidth for the floor (given): %.1f GB/s", b->bandwidth);
    else printf("\nmemory read bandwidth (%d threads): %.1f GB/s", threads, b->bandwidth);
    printf("; other processes' CPU use before the run: %.1f CPUs%s\n", ri->others, ri->others > ri->limit ? " (--force)" : "");
    int cut = o->top_k || (o->top_p > 0 && o->top_p < 1);
    printf("warm-up %d, %d timed repeats per test; decode samples at temperature 1", o->warmup, o->reps);
    if (o->top_k) printf(", top-k %d", o->top_k);
    if (o->top_p > 0 && o->top_p < 1) printf(", top-p %g", o->top_p);
    printf("%s\n\n", cut ? "" : " over the full vocabulary");
}

/* The table, memory, routing, and the JSON file when asked for. */
static int report(const bench *b, const run_info *ri, const result *rs, int n_rs, int n_experts) {
    const bench_opts *o = b->o;
    print_header(b, ri);
    print_table(stdout, rs, n_rs);
    printf("\npeak RSS: %.2f GiB", bench_peak_rss_gib());
    if (b->on_gpu && b->vram_mib >= 0) printf("; GPU memory: %.2f GiB", b->vram_mib / 1024);
    printf("\n");
    json_t *js = json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:s, s:f, s:i, s:i, s:f, s:o, s:f, s:s}", "commit",
                           TERN_COMMIT, "date", ri->date, "cpu", ri->cpu, "command", o->command, "cpus", (int)ri->ncpu,
                           "ram_gib", bench_ram_gib(), "model", o->model ? o->model : o->synth_shape, "load_s", ri->load_s,
                           "threads", tern_model_n_threads(b->m), "kv_bits", o->kv_bits, "read_bandwidth_gb_s",
                           b->bandwidth, "results", results_json(rs, n_rs), "peak_rss_gib", bench_peak_rss_gib(), "device",
                           tern_model_device(b->m));
    if (b->on_gpu && b->vram_mib >= 0) json_object_set_new(js, "gpu_memory_gib", json_real(b->vram_mib / 1024));
    if (b->trace) print_routing(stdout, b->trace, n_experts, o->curve, js);
    int rc = 0;
    if (o->json_path) {
        int flags = JSON_INDENT(2) | JSON_SORT_KEYS;
        if ((!strcmp(o->json_path, "-") ? json_dumpf(js, stdout, flags) : json_dump_file(js, o->json_path, flags)) != 0) {
            fprintf(stderr, "tern bench: cannot write %s\n", o->json_path);
            rc = -1;
        }
    }
    json_decref(js);
    return rc;
}

int tern_cli_bench(int argc, char **argv) {
    bench_opts o;
    int prc = parse_bench(argc, argv, &o);
    if (prc == 1) return 0;
    if (prc != 0) return prc;
    run_info ri = {.ncpu = sysconf(_SC_NPROCESSORS_ONLN)};
    if (preflight(&o, &ri.others, &ri.limit) != 0) return 1;
    tern_error err;
    double t0 = tern_now_s();
    tern_model *m = open_model(&o, &err);
    if (!m) {
        fprintf(stderr, "tern bench: %s\n", err.msg);
        return 1;
    }
    ri.load_s = tern_now_s() - t0;
    bench b = {.m = m, .o = &o, .vocab = tern_model_vocab_size(m), .rng = 0x9E3779B97F4A7C15ull ^ (o.seed + 1),
               .on_gpu = strcmp(tern_model_device(m), "cpu") != 0, .vram_mib = -1};
    b.bandwidth = o.bandwidth ? (double)o.bandwidth : bench_read_bandwidth_apart(tern_model_n_threads(m));
    int n_layers, n_experts, top_k;
    tern_model_moe_shape(m, &n_layers, &n_experts, &top_k);
    b.trace = tern_route_trace_create(n_layers, n_experts, top_k, &err);
    result rs[2 * MAX_LIST + MAX_LIST * MAX_LIST];
    int n_rs = 0, rc = measure(&b, rs, &n_rs, &err);
    if (rc != 0) fprintf(stderr, "tern bench: %s\n", err.msg);
    bench_cpu_name(ri.cpu, sizeof ri.cpu);
    time_t now = time(NULL);
    strftime(ri.date, sizeof ri.date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    if (report(&b, &ri, rs, n_rs, n_experts) != 0) rc = -1;
    tern_route_trace_destroy(b.trace);
    tern_model_free(m);
    return rc == 0 ? 0 : 1;
}
