/* Counters and histograms for GET /metrics, in Prometheus' text format. */
#ifndef TERN_SERVER_METRICS_H
#define TERN_SERVER_METRICS_H

#include "server/job.h"
#include "server/sbuf.h"
#include "server/sched.h"
#include "tern.h"

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_create(void);
void srv_metrics_destroy(srv_metrics *m);
/* One answered request (endpoint: a fixed name such as "chat"). */
void srv_metrics_request(srv_metrics *m, const char *endpoint, int status);
/* One finished generation; ttft_s from submission to the first token. */
void srv_metrics_generation(srv_metrics *m, const srv_usage *u, double ttft_s);

typedef struct srv_gauges {
    int queued, generating, in_flight;
    const tern_stream_stats *experts;   /* NULL: not loaded */
    const srv_cache_stats *cache;       /* NULL: not loaded */
    const srv_residency *model;         /* NULL: the server is starting */
    const srv_kv_stats *kv;             /* NULL: the server is starting */
} srv_gauges;
void srv_metrics_render(srv_metrics *m, const srv_gauges *g, sbuf *out);

/* The process's resident memory (VmRSS) in bytes; 0 where unknown. */
long long srv_rss_bytes(void);

#endif
