/* srv_run: listen, load, serve, and on SIGINT/SIGTERM drain and stop. */
#include "server/server.h"

#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/flag_names.h"
#include "server/api.h"
#include "util/err.h"
#include "server/http.h"
#include "server/metrics.h"

/* Signals are taken by one thread (sigwait): the first asks for a drain,
 * a second cancels what is still running; during the load at start one
 * exits, and so does a second during a later load. */
typedef struct sigstate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
    int loaded;
    srv_sched *sched;
    sigset_t set;
} sigstate;

static void *signal_main(void *arg) {
    sigstate *ss = arg;
    for (;;) {
        int sig;
        if (sigwait(&ss->set, &sig) != 0) continue;
        pthread_mutex_lock(&ss->mu);
        int n = ++ss->count;
        if (!ss->loaded) {
            fprintf(stderr, "tern serve: stopped while loading\n");
            _exit(1);
        }
        if (n == 1) fprintf(stderr, "tern serve: %s: finishing the requests in flight (again to cancel them)\n",
                            sig == SIGINT ? "interrupt" : "terminate");
        srv_residency rs = {0};
        if (n >= 2 && ss->sched) srv_sched_residency(ss->sched, &rs);
        if (n >= 2 && rs.state == SRV_MODEL_LOADING) {
            fprintf(stderr, "tern serve: stopped while loading\n");
            _exit(1);
        }
        if (n >= 2 && ss->sched) {
            fprintf(stderr, "tern serve: cancelling the requests in flight\n");
            srv_sched_cancel_all(ss->sched);
        }
        pthread_cond_broadcast(&ss->cv);
        pthread_mutex_unlock(&ss->mu);
    }
    return NULL;
}

static void on_generation(void *ud, const srv_usage *u, double ttft_s) { srv_metrics_generation(ud, u, ttft_s); }

static tern_model *load_model(const srv_params *p, tern_error *err) {
    tern_model *m = p->synth ? tern_model_synth(p->synth, &p->load, err) : tern_model_load(p->model_dir, &p->load, err);
    if (m && p->mlock && tern_model_lock(m, err)) {
        tern_model_free(m);
        return NULL;
    }
    return m;
}

static const char *default_model_id(const srv_params *p, char *buf, size_t cap) {
    if (p->model_id) return p->model_id;
    if (p->synth) return p->synth->shape ? p->synth->shape : "qwen3.6-35b-a3b";
    snprintf(buf, cap, "%s", p->model_dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    return basename(buf);
}

/* Bytes the system could still give without swapping: MemAvailable, or
 * the free pages where /proc/meminfo has none. */
static unsigned long long available_ram(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (unsigned long long)pages * (unsigned long long)size : 0;
}

/* The prefix cache's default budget: a quarter of the available RAM, at
 * most 32 GiB. A GPU session's checkpoints live in device memory, which
 * the model mostly fills: there at most 4 GiB. */
static size_t default_cache_bytes(void) {
    unsigned long long b = available_ram() / 4, cap = 32ull << 30;
    return (size_t)(b < cap ? b : cap);
}

/* The prefix cache's budgets, or -1 when --cache-vram is given for a model
 * that does not run on a GPU. */
static int cache_budgets(const srv_params *p, const tern_model *m, srv_loaded *ld, tern_error *err) {
    int gpu = strcmp(tern_model_device(m), "cpu") != 0;
    if (p->cache_vram >= 0 && !gpu)
        return tern_fail(err, "--cache-vram applies to a model on a GPU; this one runs on the CPU (--cache-ram)");
    ld->cache_ram_bytes = p->cache_ram < 0 ? default_cache_bytes() : (size_t)p->cache_ram;
    ld->cache_vram_bytes = !gpu ? 0 : p->cache_vram < 0 ? (size_t)4 << 30 : (size_t)p->cache_vram;
    return 0;
}

/* The scheduler's loader (srv_load_fn), with what the loads found. */
typedef struct loader {
    const srv_params *p;
    int n_ctx;                   /* the sessions' context; 0: the model's, known once it is loaded */
    int tok_vocab;               /* the tokenizer's ids */
    /* the model's vocabulary and end-of-sequence ids (from config.json with
     * --lazy-load, else from the first load) */
    int vocab, n_eos;
    int32_t eos[TERN_SAMPLER_MAX_EOS];
    char device[160], rope[192];
    size_t cache_ram, cache_vram;
    int has_mtp;                 /* the model has an MTP head */
} loader;

/* What the first load tells of the model: its vocabulary and its
 * end-of-sequence ids among the tokenizer's. */
static void note_vocab(loader *L, const tern_model *m) {
    if (L->vocab) return;
    L->vocab = tern_model_vocab_size(m);
    for (int32_t id = 0; id < L->tok_vocab && L->n_eos < TERN_SAMPLER_MAX_EOS; id++)
        if (tern_model_is_eos(m, id)) L->eos[L->n_eos++] = id;
}

static int load_cb(void *ud, srv_loaded *out, tern_error *err) {
    loader *L = ud;
    tern_model *m = load_model(L->p, err);
    if (!m) {
        tern_flag_names(err);
        return -1;
    }
    int n_ctx = L->n_ctx > 0 ? L->n_ctx : tern_model_max_context(m);
    if (tern_model_check_context(m, n_ctx, err) != 0) {
        tern_flag_names(err);
        tern_err_prefix(err, "--ctx");
    } else if (cache_budgets(L->p, m, out, err) == 0) {
        L->n_ctx = n_ctx;
        note_vocab(L, m);
        snprintf(L->device, sizeof L->device, "%s", tern_model_device(m));
        L->has_mtp = tern_model_has_mtp(m);
        tern_model_rope_describe(m, L->rope, sizeof L->rope);
        L->cache_ram = out->cache_ram_bytes;
        L->cache_vram = out->cache_vram_bytes;
        out->m = m;
        return 0;
    }
    tern_model_free(m);
    return -1;
}

/* Without the model (--lazy-load): its context, vocabulary and
 * end-of-sequence ids from its directory, for the requests' limits and
 * structured output. */
static int probe_model(loader *L, tern_error *err) {
    tern_model_dir_info info;
    if (tern_model_dir_probe(L->p->model_dir, &L->p->load, L->n_ctx, &info, err)) return -1;
    if (L->n_ctx <= 0) L->n_ctx = info.max_context;
    L->vocab = info.vocab_size;
    for (int i = 0; i < info.n_eos; i++)
        if (info.eos[i] >= 0 && info.eos[i] < L->tok_vocab) L->eos[L->n_eos++] = info.eos[i];
    return 0;
}

/* The prefix cache's budgets, for the log. */
static void describe_cache(const loader *L, const srv_sched_params *sp, char *cache, size_t cap) {
    snprintf(cache, cap, "off");
    if (!L->cache_ram && !L->cache_vram) return;
    cache[0] = 0;
    if (L->cache_vram) snprintf(cache, cap, "%.0f MiB in device memory + ", (double)L->cache_vram / (1 << 20));
    snprintf(cache + strlen(cache), cap - strlen(cache), "%.0f MiB in RAM", (double)L->cache_ram / (1 << 20));
    if (sp->cache_disk)
        snprintf(cache + strlen(cache), cap - strlen(cache), " + %.0f MiB on disk",
                 (double)sp->cache_disk_bytes / (1 << 20));
}

/* The vocabulary structured output compiles against, its end-of-sequence
 * ids those the generation stops at (generation_config.json's, else the
 * model's), and the tables of the rules most requests share (JSON
 * values, reasoning, raw tool arguments) computed before the first
 * request needs them. */
static int grammar_vocab(srv_ctx *c, const loader *L, tern_error *err) {
    int32_t eos[TERN_SAMPLER_MAX_EOS];
    int n = 0;
    for (int i = 0; i < c->sampling.n_eos; i++) eos[n++] = c->sampling.eos_ids[i];
    for (int i = 0; !c->sampling.n_eos && i < L->n_eos; i++) eos[n++] = L->eos[i];
    if (!(c->gvocab = tern_grammar_vocab_create(c->tok, L->vocab, eos, n, err))) return -1;
    static const char warm_tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"s\":{\"type\":\"string\"},\"a\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}}}]";
    tern_grammar_spec warm[] = {{.json_object = 1}, {.json_object = 1, .after_think = 1},
                                {.tools_json = warm_tools, .tools_required = 1, .parallel_tool_calls = 1}};
    for (size_t i = 0; i < sizeof warm / sizeof *warm; i++) {
        tern_grammar *g = tern_grammar_create(&warm[i], c->gvocab, err);
        if (!g) return -1;
        tern_grammar_destroy(g);
    }
    return 0;
}

int srv_run(const srv_params *p) {
    static sigstate ss = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, {{0}}};
    sigemptyset(&ss.set);
    sigaddset(&ss.set, SIGINT);
    sigaddset(&ss.set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &ss.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_thread;
    pthread_create(&sig_thread, NULL, signal_main, &ss);
    pthread_detach(sig_thread);

    tern_error err = {{0}};
    srv_metrics *metrics = srv_metrics_create();
    srv_http *http = metrics ? srv_http_start(p, metrics, &err) : NULL;
    if (!http) {
        fprintf(stderr, "tern serve: %s\n", metrics ? err.msg : "out of memory");
        srv_metrics_destroy(metrics);
        return 1;
    }
    fprintf(stderr, "tern serve: listening on http://%s:%d%s\n", p->host, srv_http_port(http),
            p->lazy_load ? "" : " (loading the model)");

    srv_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    pthread_mutex_init(&ctx.tok_mu, NULL);
    char idbuf[4096];
    int rc = 1;
    loader L = {.p = p, .n_ctx = p->session.max_context};
    const char *tok_dir = p->tokenizer_dir ? p->tokenizer_dir : p->model_dir;
    if (!(ctx.tok = tern_tokenizer_load(tok_dir, &err))) {
        fprintf(stderr, "tern serve: %s\n", err.msg);
        goto done;
    }
    L.tok_vocab = tern_tokenizer_vocab_size(ctx.tok);
    if (p->lazy_load && probe_model(&L, &err)) {
        tern_flag_names(&err);
        fprintf(stderr, "tern serve: %s%s\n", p->session.max_context > 0 ? "--ctx: " : "", err.msg);
        goto done;
    }
    ctx.model_id = default_model_id(p, idbuf, sizeof idbuf);
    ctx.strict_model = p->strict_model;
    ctx.think = p->think;
    ctx.preserve_thinking = p->preserve_thinking;
    ctx.concise = p->concise;
    ctx.sampling = p->sampling;
    ctx.fixed_seed = p->fixed_seed;
    ctx.max_tokens = p->max_tokens;
    ctx.ignore_eos = p->ignore_eos;
    ctx.mtp = p->mtp;
    srv_sched_params sp = {.n_slots = p->slots, .max_seqs = p->max_seqs, .queue_limit = p->queue_limit,
                           .prefill_chunk = p->prefill_chunk,
                           .session = p->session,
                           .checkpoint_interval = p->checkpoint_interval, .mtp_track = p->mtp != 0,
                           .load = load_cb, .load_ud = &L, .lazy = p->lazy_load,
                           .idle_unload_s = p->idle_unload_s, .kv_budget = p->kv_budget};
    sp.session.max_context = L.n_ctx;
    sp.cache_disk = p->cache_disk;
    sp.cache_disk_bytes = p->cache_disk_size < 0 ? (size_t)16 << 30 : (size_t)p->cache_disk_size;
    if (!(ctx.responses = srv_store_create(p->responses_store)) ||
        !(ctx.sched = srv_sched_create(ctx.tok, &sp, on_generation, metrics, &err))) {
        fprintf(stderr, "tern serve: %s\n", ctx.responses ? err.msg : "out of memory");
        goto done;
    }
    ctx.n_ctx = L.n_ctx;   /* (the loader's, since create loaded the model unless lazy) */
    /* why a request's mtp is refused, where the model is known (loaded
     * lazily, on a device not named: the scheduler runs it without drafts) */
    const char *dev = p->lazy_load ? (p->load.device ? p->load.device : "auto") : L.device;
    if (!p->lazy_load && !L.has_mtp) ctx.mtp_why = "the model has no MTP head (mtp.* weights)";
    else if (!strncmp(dev, "cuda", 4)) ctx.mtp_why = "speculative decoding does not run on the GPU yet";
    if (grammar_vocab(&ctx, &L, &err)) {
        fprintf(stderr, "tern serve: %s\n", err.msg);
        goto done;
    }
    pthread_mutex_lock(&ss.mu);
    ss.loaded = 1;
    ss.sched = ctx.sched;
    pthread_mutex_unlock(&ss.mu);
    srv_http_ready(http, &ctx);
    char idle[96] = "";
    if (p->idle_unload_s > 0) snprintf(idle, sizeof idle, ", unloaded after %g s idle", p->idle_unload_s);
    if (p->mtp > 0) snprintf(idle + strlen(idle), sizeof idle - strlen(idle), ", MTP %d drafts a step", p->mtp);
    if (p->mtp == TERN_MTP_AUTO)
        snprintf(idle + strlen(idle), sizeof idle - strlen(idle), ", MTP depth chosen by measured speed");
    if (p->lazy_load) {
        fprintf(stderr, "tern serve: ready: model '%s' not loaded yet (the first request loads it%s), context %d, "
                        "%d slots, queue %d%s\n",
                ctx.model_id, idle, ctx.n_ctx, p->slots, p->queue_limit, p->api_key ? ", API key required" : "");
    } else {
        char cache[128];
        describe_cache(&L, &sp, cache, sizeof cache);
        fprintf(stderr, "tern serve: ready: model '%s' on %s, context %d (rope scaling %s), %d slots, queue %d, "
                        "prefix cache %s%s%s\n",
                ctx.model_id, L.device, ctx.n_ctx, L.rope, p->slots, p->queue_limit, cache, idle,
                p->api_key ? ", API key required" : "");
    }
    if (p->webui) {
        int v6 = strchr(p->host, ':') != NULL;
        fprintf(stderr, "tern serve: chat page on http://%s%s%s:%d/\n", v6 ? "[" : "", p->host, v6 ? "]" : "",
                srv_http_port(http));
    }

    pthread_mutex_lock(&ss.mu);
    while (ss.count == 0) pthread_cond_wait(&ss.cv, &ss.mu);
    pthread_mutex_unlock(&ss.mu);
    srv_http_quiesce(http);
    srv_sched_drain(ctx.sched);
    srv_http_wait_idle(http, 10.0);
    rc = 0;
done:
    srv_http_stop(http);
    pthread_mutex_lock(&ss.mu);
    ss.sched = NULL;
    pthread_mutex_unlock(&ss.mu);
    srv_sched_destroy(ctx.sched);
    srv_store_destroy(ctx.responses);
    tern_grammar_vocab_destroy(ctx.gvocab);
    tern_tokenizer_free(ctx.tok);
    srv_metrics_destroy(metrics);
    pthread_mutex_destroy(&ctx.tok_mu);
    if (rc == 0) fprintf(stderr, "tern serve: stopped\n");
    return rc;
}
