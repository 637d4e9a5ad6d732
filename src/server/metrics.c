#include "server/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SERIES 96

static const double TTFT_BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double RATE_BUCKETS[] = {1, 5, 10, 25, 50, 100, 200, 400, 800, 1600, 3200};
#define N_TTFT (sizeof TTFT_BUCKETS / sizeof *TTFT_BUCKETS)
#define N_RATE (sizeof RATE_BUCKETS / sizeof *RATE_BUCKETS)

typedef struct hist {
    unsigned long long count[16];    /* per bucket (not cumulative), the last one +Inf */
    unsigned long long n;
    double sum;
} hist;

typedef struct series {
    const char *endpoint;
    int status;
    unsigned long long n;
} series;

struct srv_metrics {
    pthread_mutex_t mu;
    series req[MAX_SERIES];
    int n_req;
    unsigned long long prompt_tokens, cached_tokens, generated_tokens, generations, mtp_drafted, mtp_accepted;
    hist ttft, rate;
};

srv_metrics *srv_metrics_create(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_destroy(srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && (m->req[i].status != status || strcmp(m->req[i].endpoint, endpoint))) i++;
    if (i == m->n_req && m->n_req < MAX_SERIES) m->req[m->n_req++] = (series){endpoint, status, 0};
    if (i < m->n_req) m->req[i].n++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(hist *h, const double *bounds, size_t nb, double v) {
    size_t i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->count[i]++;
    h->n++;
    h->sum += v;
}

void srv_metrics_generation(srv_metrics *m, const srv_usage *u, double ttft_s) {
    pthread_mutex_lock(&m->mu);
    m->generations++;
    m->prompt_tokens += (unsigned long long)u->prompt_tokens;
    m->cached_tokens += (unsigned long long)u->cached_tokens;
    m->generated_tokens += (unsigned long long)u->completion_tokens;
    m->mtp_drafted += (unsigned long long)u->mtp_drafted;
    m->mtp_accepted += (unsigned long long)u->mtp_accepted;
    if (u->completion_tokens > 0) observe(&m->ttft, TTFT_BUCKETS, N_TTFT, ttft_s);
    if (u->completion_tokens > 1 && u->decode_s > 0)
        observe(&m->rate, RATE_BUCKETS, N_RATE, (u->completion_tokens - 1) / u->decode_s);
    pthread_mutex_unlock(&m->mu);
}

static void render_hist(sbuf *out, const char *name, const char *help, const hist *h, const double *bounds,
                        size_t nb) {
    sbuf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (size_t i = 0; i < nb; i++) {
        cum += h->count[i];
        sbuf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
    }
    sbuf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->n, name, h->sum, name, h->n);
}

static void counter(sbuf *out, const char *name, const char *help, unsigned long long v) {
    sbuf_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void gauge_u(sbuf *out, const char *name, const char *help, unsigned long long v) {
    sbuf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %llu\n", name, help, name, name, v);
}

static void gauge(sbuf *out, const char *name, const char *help, double v) {
    sbuf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %g\n", name, help, name, name, v);
}

static void render_cache_vram(sbuf *out, const srv_cache_stats *c) {
    gauge_u(out, "tern_prefix_cache_vram_bytes", "Bytes of checkpoints held in device memory.", c->tiers.vram_bytes);
    gauge_u(out, "tern_prefix_cache_vram_budget_bytes", "The device memory tier's budget (--cache-vram).",
            c->tiers.vram_budget);
    gauge_u(out, "tern_prefix_cache_vram_checkpoints", "Checkpoints held in device memory.",
            (unsigned long long)c->tiers.vram_checkpoints);
    counter(out, "tern_prefix_cache_vram_moves_total", "Checkpoints moved from device memory to RAM.",
            c->tiers.vram_moves);
}

static void render_cache_disk(sbuf *out, const srv_cache_stats *c) {
    gauge_u(out, "tern_prefix_cache_disk_bytes", "Bytes of checkpoint files held (disk tier).", c->tiers.disk_bytes);
    gauge_u(out, "tern_prefix_cache_disk_budget_bytes", "The disk tier's budget (--cache-disk-size).",
            c->tiers.disk_budget);
    gauge_u(out, "tern_prefix_cache_disk_checkpoints", "Checkpoints held on disk.",
            (unsigned long long)c->tiers.disk_checkpoints);
    counter(out, "tern_prefix_cache_disk_writes_total", "Checkpoints evicted from RAM and written to disk.",
            c->tiers.disk_writes);
    counter(out, "tern_prefix_cache_disk_reads_total", "Checkpoint files read back (hits on the disk tier).",
            c->tiers.disk_reads);
    counter(out, "tern_prefix_cache_disk_corrupt_total",
            "Checkpoint files missing or failing verification, dropped.", c->tiers.disk_corrupt);
}

static void render_cache(sbuf *out, const srv_cache_stats *c) {
    sbuf_puts(out, "# HELP tern_prefix_cache_hits_total Generations that reused a prompt prefix: a live session "
                   "continued, or a checkpoint restored.\n# TYPE tern_prefix_cache_hits_total counter\n");
    sbuf_printf(out, "tern_prefix_cache_hits_total{source=\"live\"} %llu\n", c->hits_live);
    sbuf_printf(out, "tern_prefix_cache_hits_total{source=\"checkpoint\"} %llu\n", c->hits_restored);
    counter(out, "tern_prefix_cache_misses_total", "Generations that prefilled their whole prompt.", c->misses);
    counter(out, "tern_prefix_cache_restored_tokens_total", "Prompt tokens restored from checkpoints.",
            c->restored_tokens);
    counter(out, "tern_prefix_cache_checkpoints_total", "Checkpoints added to the prefix cache.", c->tiers.inserted);
    counter(out, "tern_prefix_cache_evictions_total", "Checkpoints evicted to stay within the budget.", c->tiers.evicted);
    gauge_u(out, "tern_prefix_cache_checkpoints", "Checkpoints held in RAM.", (unsigned long long)c->tiers.checkpoints);
    gauge_u(out, "tern_prefix_cache_bytes", "Bytes of checkpoints held (RAM tier).", c->tiers.bytes);
    gauge_u(out, "tern_prefix_cache_budget_bytes", "The prefix cache's budget (--cache-ram).", c->tiers.budget);
    if (c->tiers.vram_budget) render_cache_vram(out, c);
    if (c->tiers.disk_budget) render_cache_disk(out, c);
}

long long srv_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static void render_model(sbuf *out, const srv_residency *r) {
    gauge(out, "tern_model_loaded", "1 while the model is loaded (--lazy-load, --idle-unload).",
          r->state == SRV_MODEL_LOADED);
    gauge(out, "tern_model_loading", "1 while the model is being loaded.", r->state == SRV_MODEL_LOADING);
    counter(out, "tern_model_loads_total", "Loads of the model that succeeded.", r->loads);
    counter(out, "tern_model_load_failures_total", "Loads of the model that failed.", r->load_failures);
    counter(out, "tern_model_unloads_total", "Times the model was freed (idle, or POST /v1/models/unload).",
            r->unloads);
    gauge(out, "tern_model_load_seconds", "The last load's duration.", r->last_load_s);
}

static void render_kv(sbuf *out, const srv_kv_stats *k) {
    gauge_u(out, "tern_kv_budget_bytes", "The bound on all sessions' KV rows (--kv-budget).", k->budget);
    gauge_u(out, "tern_kv_bytes", "KV rows the sessions hold, after the last step.", k->held);
    counter(out, "tern_preemptions_total", "Requests preempted to stay within the KV budget.", k->preemptions);
    counter(out, "tern_preempted_resumed_exact_total", "Preempted requests brought back from their own checkpoint.",
            k->resumed_exact);
    counter(out, "tern_preempted_recomputed_tokens_total",
            "Tokens of preempted requests computed again (their checkpoint was gone).", k->resumed_tokens);
}

void srv_metrics_render(srv_metrics *m, const srv_gauges *g, sbuf *out) {
    pthread_mutex_lock(&m->mu);
    sbuf_puts(out, "# HELP tern_requests_total HTTP requests answered, by endpoint and status.\n"
                   "# TYPE tern_requests_total counter\n");
    for (int i = 0; i < m->n_req; i++)
        sbuf_printf(out, "tern_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->req[i].endpoint,
                    m->req[i].status, m->req[i].n);
    counter(out, "tern_generations_total", "Generations finished.", m->generations);
    counter(out, "tern_prompt_tokens_total", "Prompt tokens of finished generations.", m->prompt_tokens);
    counter(out, "tern_cached_prompt_tokens_total", "Prompt tokens reused (a live session or a checkpoint), not prefilled.",
            m->cached_tokens);
    counter(out, "tern_generated_tokens_total", "Tokens generated.", m->generated_tokens);
    counter(out, "tern_mtp_drafted_tokens_total", "Draft tokens the MTP head proposed (speculative decoding).",
            m->mtp_drafted);
    counter(out, "tern_mtp_accepted_tokens_total", "Draft tokens kept by the verify.", m->mtp_accepted);
    render_hist(out, "tern_time_to_first_token_seconds", "From a request's submission to its first token.", &m->ttft,
                TTFT_BUCKETS, N_TTFT);
    render_hist(out, "tern_decode_tokens_per_second", "Decode rate of each generation after its first token.",
                &m->rate, RATE_BUCKETS, N_RATE);
    pthread_mutex_unlock(&m->mu);
    gauge(out, "tern_queue_depth", "Requests waiting for the engine.", g->queued);
    gauge(out, "tern_requests_generating", "Requests the engine is running.", g->generating);
    gauge(out, "tern_requests_in_flight", "HTTP requests being handled.", g->in_flight);
    gauge_u(out, "process_resident_memory_bytes", "Resident memory size in bytes.",
            (unsigned long long)srv_rss_bytes());
    if (g->model) render_model(out, g->model);
    if (g->cache) render_cache(out, g->cache);
    if (g->kv && g->kv->budget) render_kv(out, g->kv);
    if (g->experts && g->experts->streaming) {
        const tern_stream_stats *s = g->experts;
        unsigned long long req = s->hits + s->misses;
        gauge(out, "tern_expert_cache_hit_ratio", "Routed experts found in the slot cache, since load.",
              req ? (double)s->hits / (double)req : 0.0);
        counter(out, "tern_expert_bytes_read_total", "Bytes of routed experts read from disk.", s->bytes_read);
    }
}
