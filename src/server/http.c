#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/web.h"
#include "util/clock.h"

/* How often a waiting handler looks at its client's socket and its job. */
#define POLL_S 0.05

/* ---- connections: the read deadline ----------------------------------------
 * A request's headers and body must arrive within read_timeout_s of the
 * connection opening (or of the previous response on a kept-alive one,
 * plus the idle timeout), so a client that trickles bytes (slowloris)
 * cannot hold a connection: the reaper thread shuts such sockets down.
 * libmicrohttpd's own timeout closes connections that send nothing. */

typedef struct conn_track {
    struct conn_track *next, *prev;
    int fd;
    double deadline;                 /* 0: none (a request is being answered) */
} conn_track;

struct srv_http {
    struct MHD_Daemon *d;
    srv_params p;
    srv_metrics *metrics;
    _Atomic(srv_ctx *) ctx;
    atomic_int closing;
    atomic_int in_flight;
    int port;
    long long started;
    pthread_mutex_t mu;
    conn_track *conns;
    pthread_t reaper;
    pthread_cond_t reaper_cv;
    int reaper_quit;
};

static void set_deadline(srv_http *h, conn_track *ct, double deadline) {
    if (!ct) return;
    pthread_mutex_lock(&h->mu);
    ct->deadline = deadline;
    pthread_mutex_unlock(&h->mu);
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_track *ct = calloc(1, sizeof *ct);
        *socket_context = ct;
        if (!ct) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        ct->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&h->mu);
        ct->deadline = tern_now_s() + h->p.read_timeout_s;
        ct->next = h->conns;
        if (h->conns) h->conns->prev = ct;
        h->conns = ct;
        pthread_mutex_unlock(&h->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_track *ct = *socket_context;
        if (!ct) return;
        pthread_mutex_lock(&h->mu);
        if (ct->prev) ct->prev->next = ct->next;
        else h->conns = ct->next;
        if (ct->next) ct->next->prev = ct->prev;
        pthread_mutex_unlock(&h->mu);
        free(ct);
        *socket_context = NULL;
    }
}

static void *reaper_main(void *arg) {
    srv_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->reaper_quit) {
        double t = tern_now_s();
        for (conn_track *ct = h->conns; ct; ct = ct->next) {
            if (ct->deadline > 0 && t > ct->deadline && ct->fd >= 0) {
                shutdown(ct->fd, SHUT_RDWR);
                ct->deadline = 0;
            }
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&h->reaper_cv, &h->mu, &until);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Whether the client has closed its side (or the socket broke). */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- routes ---------------------------------------------------------------- */

typedef enum route_id {
    R_HEALTH, R_MODELS, R_MODEL, R_UNLOAD, R_METRICS, R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MESSAGES,
    R_COUNT_TOKENS, R_WEB,
} route_id;

typedef struct route {
    route_id id;
    const char *method, *path, *name;
    int prefix;                      /* path is a prefix (R_MODEL: /v1/models/ID) */
    srv_api_kind api;
} route;

/* Paths after an optional "/v1" (clients configured with or without it). */
static const route ROUTES[] = {
    {R_HEALTH, "GET", "/health", "health", 0, SRV_API_OPENAI},
    {R_MODELS, "GET", "/models", "models", 0, SRV_API_OPENAI},
    {R_UNLOAD, "POST", "/models/unload", "unload", 0, SRV_API_OPENAI},
    {R_MODEL, "GET", "/models/", "models", 1, SRV_API_OPENAI},
    {R_METRICS, "GET", "/metrics", "metrics", 0, SRV_API_OPENAI},
    {R_CHAT, "POST", "/chat/completions", "chat", 0, SRV_API_OPENAI},
    {R_COMPLETIONS, "POST", "/completions", "completions", 0, SRV_API_OPENAI},
    {R_RESPONSES, "POST", "/responses", "responses", 0, SRV_API_OPENAI},
    {R_MESSAGES, "POST", "/messages", "messages", 0, SRV_API_ANTHROPIC},
    {R_COUNT_TOKENS, "POST", "/messages/count_tokens", "count_tokens", 0, SRV_API_ANTHROPIC},
};

/* The chat page's files (web.c), at their own paths (no "/v1"). */
static const route WEB_ROUTE = {R_WEB, "GET", "/", "web", 0, SRV_API_OPENAI};

static const char *unversioned(const char *url) { return strncmp(url, "/v1/", 4) ? url : url + 3; }
#define N_ROUTES (sizeof ROUTES / sizeof *ROUTES)

static int path_matches(const route *rt, const char *url) {
    size_t n = strlen(rt->path);
    return rt->prefix ? strncmp(url, rt->path, n) == 0 && url[n] && !strchr(url + n, '/') : strcmp(url, rt->path) == 0;
}

/* The route for url and method; *wrong_method when only the method differs. */
static const route *find_route(const srv_http *h, const char *url, const char *method, int *wrong_method) {
    *wrong_method = 0;
    int head = !strcmp(method, "HEAD");
    if (h->p.webui && srv_web_is_path(url)) {
        if (head || !strcmp(method, "GET")) return &WEB_ROUTE;
        *wrong_method = 1;
        return NULL;
    }
    url = unversioned(url);
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (!path_matches(&ROUTES[i], url)) continue;
        if (!strcmp(method, ROUTES[i].method) || (head && !strcmp(ROUTES[i].method, "GET"))) return &ROUTES[i];
        *wrong_method = 1;
    }
    return NULL;
}

/* ---- requests -------------------------------------------------------------- */

typedef struct req {
    srv_http *h;
    const route *rt;
    srv_api_kind api;                /* the error envelope (also for unknown routes) */
    conn_track *ct;
    sbuf body;
    int too_large;
    int status;                      /* what was answered, for the metrics */
    double t_start;
} req;

static enum MHD_Result send_buffer(req *r, struct MHD_Connection *c, int status, const char *type, sbuf *b) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(b->len, b->data ? b->data : (void *)"", MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    return rc;
}

static enum MHD_Result send_json(req *r, struct MHD_Connection *c, int status, json_t *v) {
    sbuf b = {0};
    sbuf_json(&b, v);
    if (b.oom) { sbuf_free(&b); return MHD_NO; }
    enum MHD_Result rc = send_buffer(r, c, status, "application/json", &b);
    sbuf_free(&b);
    return rc;
}

static enum MHD_Result send_error(req *r, struct MHD_Connection *c, const srv_err *e) {
    return send_json(r, c, e->status, srv_error_json(r->api, e));
}

static enum MHD_Result fail(req *r, struct MHD_Connection *c, int status, const char *param, const char *fmt,
                            const char *arg) {
    srv_err e;
    srv_fail(&e, status, param, fmt, arg);
    return send_error(r, c, &e);
}

static enum MHD_Result refuse_too_large(req *r, struct MHD_Connection *c) {
    srv_err e;
    srv_fail(&e, 413, NULL, "the request body is larger than %zu bytes (tern serve --max-body)", r->h->p.max_body);
    return send_error(r, c, &e);
}

/* libmicrohttpd keeps a header whose name ends in whitespace ("Name :"),
 * which HTTP/1.1 requires a server to refuse. */
static enum MHD_Result header_name_ok(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind; (void)value;
    int *bad = cls;
    if (strpbrk(key, " \t")) *bad = 1;
    return *bad ? MHD_NO : MHD_YES;
}

/* Constant-time comparison of the presented key with the configured one. */
static int key_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static int authorized(srv_http *h, struct MHD_Connection *c) {
    if (!h->p.api_key) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0 && key_equal(auth + 7, h->p.api_key)) return 1;
    return xkey && key_equal(xkey, h->p.api_key);
}

/* ---- streams ----------------------------------------------------------------
 * The response's reader runs on the connection's thread: it waits for the
 * job's events, encodes them, and while nothing comes sends the encoder's
 * heartbeat and watches for the client leaving (which cancels the job). */

typedef struct stream {
    srv_http *h;
    const route *rt;
    double t0;
    srv_job *job;
    srv_enc *enc;
    sbuf out;
    size_t off;
    int ended;                       /* DONE or ERROR encoded */
    int fd;
    double last_sent;
} stream;

static const char *finish_word(srv_finish f) {
    switch (f) {
    case SRV_FINISH_EOS: return "eos";
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_STOP: return "stop";
    case SRV_FINISH_TOOL: return "tool";
    default: return "cancel";
    }
}

static void log_done(srv_http *h, const route *rt, const srv_enc *enc, const srv_event *ev, double t0) {
    FILE *f = h->p.log ? h->p.log : stderr;
    if (ev->kind == SRV_EV_ERROR) {
        fprintf(f, "tern serve: %s %s failed: %s\n", rt->name, enc->id, ev->text);
        return;
    }
    const srv_usage *u = &ev->usage;
    double total = tern_now_s() - t0, engine = u->queue_s + u->prefill_s + u->decode_s;
    fprintf(f, "tern serve: %s %s %s, prompt %d (cached %d) completion %d, %.3f s: request %.1f ms, queue %.1f ms, "
            "first token %.1f ms (restore %.1f, prefill %.1f, snapshot %.1f), decode %.1f tok/s\n", rt->name,
            enc->id, finish_word(ev->finish), u->prompt_tokens, u->cached_tokens, u->completion_tokens, total,
            (total - engine) * 1e3, u->queue_s * 1e3, u->prefill_s * 1e3, u->restore_s * 1e3, u->eval_s * 1e3, u->snapshot_s * 1e3,
            u->decode_s > 0 && u->completion_tokens > 1 ? (u->completion_tokens - 1) / u->decode_s : 0.0);
    fflush(f);
}

/* Encodes what the job has pushed, waiting up to wait_s for the first.
 * The ERROR of a whole response stays in *failed (its answer is the API's
 * error envelope, not the encoder's). */
static void stream_pump(stream *st, double wait_s, srv_event **failed) {
    srv_event *ev = srv_job_pop(st->job, wait_s);
    while (ev) {
        int end = ev->kind == SRV_EV_DONE || ev->kind == SRV_EV_ERROR;
        if (end) log_done(st->h, st->rt, st->enc, ev, st->t0);
        st->ended = end;
        if (ev->kind == SRV_EV_ERROR && failed) {
            *failed = ev;
            return;
        }
        st->enc->event(st->enc, ev, &st->out);
        srv_event_free(ev);
        if (end) return;
        ev = srv_job_pop(st->job, 0);
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    for (;;) {
        if (st->off < st->out.len) {
            size_t n = st->out.len - st->off < max ? st->out.len - st->off : max;
            memcpy(buf, st->out.data + st->off, n);
            st->off += n;
            st->last_sent = tern_now_s();
            return (ssize_t)n;
        }
        sbuf_reset(&st->out);
        st->off = 0;
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        stream_pump(st, POLL_S, NULL);
        if (st->out.len) continue;
        if (client_gone(st->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (tern_now_s() - st->last_sent < st->h->p.heartbeat_s) continue;
        if (st->enc->heartbeat) st->enc->heartbeat(st->enc, &st->out);
        else sbuf_puts(&st->out, ": ping\n\n");
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    srv_ctx *c = atomic_load(&st->h->ctx);
    if (!st->ended && c) srv_sched_cancel(c->sched, st->job);
    srv_job_release(st->job);
    st->enc->destroy(st->enc);
    sbuf_free(&st->out);
    free(st);
}

static enum MHD_Result start_stream(req *r, struct MHD_Connection *c, srv_job *j, srv_enc *enc, int fd) {
    stream *st = calloc(1, sizeof *st);
    if (!st) { srv_job_release(j); enc->destroy(enc); return MHD_NO; }
    *st = (stream){.h = r->h, .rt = r->rt, .t0 = r->t_start, .job = j, .enc = enc, .fd = fd, .last_sent = tern_now_s()};
    enc->start(enc, &st->out);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                  stream_free);
    if (!resp) { stream_free(st); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result rc = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    return rc;
}

/* A job's error event as the API's error: its status (a load that failed,
 * the model in use) or a 500 for a generation that failed. */
static void event_error(const srv_event *ev, srv_err *e) {
    if (ev->status) srv_fail(e, ev->status, NULL, "%s", ev->text);
    else srv_fail(e, 500, NULL, "generation failed: %.400s", ev->text);
}

/* Not streamed: waits for the job's end on this thread (the job wakes it
 * only then; between, it looks at the client every POLL_S), then answers. */
static enum MHD_Result wait_job(req *r, struct MHD_Connection *c, srv_ctx *ctx, srv_job *j, srv_enc *enc, int fd) {
    stream st = {.h = r->h, .rt = r->rt, .t0 = r->t_start, .job = j, .enc = enc, .fd = fd};
    srv_event *failed = NULL;
    enum MHD_Result rc = MHD_NO;
    while (!st.ended && !client_gone(fd)) stream_pump(&st, POLL_S, &failed);
    if (!st.ended) {
        srv_sched_cancel(ctx->sched, j);
        r->status = 499;
    } else if (failed) {
        srv_err e;
        event_error(failed, &e);
        rc = send_error(r, c, &e);
    } else {
        sbuf_reset(&st.out);   /* a whole response's encoder writes only its body */
        enc->body(enc, &st.out);
        rc = st.out.oom ? MHD_NO : send_buffer(r, c, 200, "application/json", &st.out);
    }
    srv_event_free(failed);
    sbuf_free(&st.out);
    srv_job_release(j);
    enc->destroy(enc);
    return rc;
}

/* A stream whose job waits for the model to load: its answer begins once
 * the model is loaded or the job has its first event, so a load that
 * fails is answered with an error status, not inside a stream. 1: the
 * stream may begin; 0: answered here (*rc), the job and encoder
 * released. */
static int await_model(req *r, struct MHD_Connection *c, srv_ctx *ctx, srv_job *j, srv_enc *enc, int fd,
                       enum MHD_Result *rc) {
    int kind;
    while ((kind = srv_job_peek(j, POLL_S)) < 0) {
        srv_residency rs;
        srv_sched_residency(ctx->sched, &rs);
        if (rs.state == SRV_MODEL_LOADED) return 1;
        if (client_gone(fd)) break;
    }
    if (kind >= 0 && kind != SRV_EV_ERROR) return 1;
    if (kind < 0) {
        srv_sched_cancel(ctx->sched, j);
        r->status = 499;
        *rc = MHD_NO;
    } else {
        srv_event *ev = srv_job_pop(j, 0);
        log_done(r->h, r->rt, enc, ev, r->t_start);
        srv_err e;
        event_error(ev, &e);
        srv_event_free(ev);
        *rc = send_error(r, c, &e);
    }
    srv_job_release(j);
    enc->destroy(enc);
    return 0;
}

/* A generation request: parse, build the job, queue it, answer. */
static enum MHD_Result generate(req *r, struct MHD_Connection *c, srv_ctx *ctx, json_t *body) {
    srv_err e = {0};
    srv_job *j = srv_job_create();
    if (!j) return fail(r, c, 500, NULL, "%s", "out of memory");
    srv_enc *enc = NULL;
    switch (r->rt->id) {
    case R_CHAT: enc = srv_chat_prepare(ctx, body, j, &e); break;
    case R_COMPLETIONS: enc = srv_completions_prepare(ctx, body, j, &e); break;
    case R_RESPONSES: enc = srv_responses_prepare(ctx, body, j, &e); break;
    case R_MESSAGES: enc = srv_messages_prepare(ctx, body, j, &e); break;
    default: break;
    }
    if (!enc) {
        srv_job_release(j);
        return send_error(r, c, &e);
    }
    j->wake_at_end = !enc->stream;
    srv_residency rs;
    srv_sched_residency(ctx->sched, &rs);
    int rc = srv_sched_submit(ctx->sched, j);
    if (rc != SRV_SUBMIT_OK) {
        srv_job_release(j);
        enc->destroy(enc);
        if (rc == SRV_SUBMIT_FULL) {
            srv_fail(&e, 429, NULL, "the server is busy: %d requests are already queued (tern serve --queue-limit)",
                     r->h->p.queue_limit);
            e.code = "rate_limit_exceeded";
        } else {
            srv_fail(&e, 503, NULL, "the server is shutting down");
        }
        return send_error(r, c, &e);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    enum MHD_Result answered = MHD_NO;
    if (!enc->stream) return wait_job(r, c, ctx, j, enc, fd);
    if (rs.state != SRV_MODEL_LOADED && !await_model(r, c, ctx, j, enc, fd, &answered)) return answered;
    return start_stream(r, c, j, enc, fd);
}

/* ---- the other routes ------------------------------------------------------ */

static json_t *model_json(srv_http *h, const char *id) {
    char created_at[32];
    time_t t = (time_t)h->started;
    strftime(created_at, sizeof created_at, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s}", "id", id, "object", "model", "created",
                     (json_int_t)h->started, "owned_by", "tern", "type", "model", "display_name", id, "created_at",
                     created_at);
}

static enum MHD_Result answer_models(req *r, struct MHD_Connection *c, srv_ctx *ctx, const char *url) {
    char *fast = NULL;   /* the fast view's name (prompt_view.c) */
    if (asprintf(&fast, "%s-fast", ctx->model_id) < 0) return fail(r, c, 500, NULL, "%s", "out of memory");
    enum MHD_Result rc;
    if (r->rt->id == R_MODEL) {
        const char *id = unversioned(url) + strlen(r->rt->path);
        int is_fast = srv_model_is_fast(ctx, id);
        if (ctx->strict_model && strcmp(id, ctx->model_id) != 0 && !is_fast)
            rc = fail(r, c, 404, "model", "model '%.200s' is not served here", id);
        else
            rc = send_json(r, c, 200, model_json(r->h, is_fast ? fast : ctx->model_id));
    } else {
        rc = send_json(r, c, 200, json_pack("{s:s, s:[o, o], s:b, s:s, s:s}", "object", "list", "data",
                                            model_json(r->h, ctx->model_id), model_json(r->h, fast), "has_more", 0,
                                            "first_id", ctx->model_id, "last_id", fast));
    }
    free(fast);
    return rc;
}

static enum MHD_Result answer_metrics(req *r, struct MHD_Connection *c, srv_ctx *ctx) {
    srv_gauges g = {0};
    tern_stream_stats ss;
    srv_cache_stats cs;
    srv_residency rs;
    srv_kv_stats kv;
    if (ctx) {
        srv_sched_load(ctx->sched, &g.queued, &g.generating);
        srv_sched_cache_stats(ctx->sched, &cs);
        g.cache = &cs;
        if (srv_sched_stream_stats(ctx->sched, &ss) == 0) g.experts = &ss;
        srv_sched_residency(ctx->sched, &rs);
        g.model = &rs;
        srv_sched_kv_stats(ctx->sched, &kv);
        g.kv = &kv;
    }
    g.in_flight = atomic_load(&r->h->in_flight);
    sbuf b = {0};
    srv_metrics_render(r->h->metrics, &g, &b);
    enum MHD_Result rc = b.oom ? MHD_NO : send_buffer(r, c, 200, "text/plain; version=0.0.4", &b);
    sbuf_free(&b);
    return rc;
}

/* GET /health: 503 while the server starts (loading the model unless
 * --lazy-load), then 200 with the model's state. */
static enum MHD_Result answer_health(req *r, struct MHD_Connection *c, srv_ctx *ctx) {
    if (!ctx) return send_json(r, c, 503, json_pack("{s:s}", "status", "loading"));
    srv_residency rs;
    srv_sched_residency(ctx->sched, &rs);
    return send_json(r, c, 200, json_pack("{s:s, s:s}", "status", "ok", "model", srv_model_state_name(rs.state)));
}

/* POST /v1/models/unload (body optional: {"model": ...}): frees the model
 * now, or 409 while requests use it. */
static enum MHD_Result answer_unload(req *r, struct MHD_Connection *c, srv_ctx *ctx, json_t *body) {
    srv_err e = {0};
    if (body && srv_check_model(ctx, body, 0, &e)) return send_error(r, c, &e);
    if (srv_sched_unload(ctx->sched) != SRV_UNLOAD_OK) {
        srv_fail(&e, 409, NULL, "the model is in use: requests are running or queued (it can be unloaded once "
                                "they are done)");
        e.code = "model_in_use";
        return send_error(r, c, &e);
    }
    return send_json(r, c, 200, json_pack("{s:s, s:s, s:s}", "id", ctx->model_id, "object", "model", "status",
                                          "unloaded"));
}

/* The body complete: parse it and answer the route. */
static enum MHD_Result dispatch(req *r, struct MHD_Connection *c, const char *url) {
    srv_ctx *ctx = atomic_load(&r->h->ctx);
    if (r->rt->id == R_WEB) return srv_web_answer(c, url, &r->status);
    if (r->rt->id == R_HEALTH) return answer_health(r, c, ctx);
    if (r->rt->id == R_METRICS) return answer_metrics(r, c, ctx);
    if (!ctx) return fail(r, c, 503, NULL, "%s", "the model is still loading");
    if (atomic_load(&r->h->closing)) return fail(r, c, 503, NULL, "%s", "the server is shutting down");
    if (r->rt->id == R_MODELS || r->rt->id == R_MODEL) return answer_models(r, c, ctx, url);
    if (r->too_large) return refuse_too_large(r, c);
    if (r->rt->id == R_UNLOAD && r->body.len == 0) return answer_unload(r, c, ctx, NULL);
    json_error_t je;
    json_t *body = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &je);
    if (!body) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s (line %d, column %d)", je.text, je.line, je.column);
        return fail(r, c, 400, NULL, "the body is not valid JSON: %s", msg);
    }
    if (!json_is_object(body)) {
        json_decref(body);
        return fail(r, c, 400, NULL, "%s", "the body must be a JSON object");
    }
    enum MHD_Result rc;
    if (r->rt->id == R_UNLOAD) {
        rc = answer_unload(r, c, ctx, body);
    } else if (r->rt->id == R_COUNT_TOKENS) {
        srv_err e = {0};
        json_t *out = srv_count_tokens(ctx, body, &e);
        rc = out ? send_json(r, c, 200, out) : send_error(r, c, &e);
    } else {
        rc = generate(r, c, ctx, body);
    }
    json_decref(body);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_http *h = cls;
    req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        r->h = h;
        r->t_start = tern_now_s();
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->ct = ci ? ci->socket_context : NULL;
        atomic_fetch_add(&h->in_flight, 1);
        int wrong_method;
        r->rt = find_route(h, url, method, &wrong_method);
        if (!r->rt) {
            r->api = strncmp(unversioned(url), "/messages", 9) == 0 ? SRV_API_ANTHROPIC : SRV_API_OPENAI;
            if (wrong_method) return fail(r, c, 405, NULL, "%s is not allowed here", method);
            return fail(r, c, 404, NULL, "no route %.200s", url);
        }
        r->api = r->rt->api;
        int bad_header = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, header_name_ok, &bad_header);
        if (bad_header) return fail(r, c, 400, NULL, "%s", "a header name holds whitespace");
        /* the page holds no data: it loads, then asks for the key the API wants */
        if (r->rt->id != R_HEALTH && r->rt->id != R_WEB && !authorized(h, c)) {
            srv_err e;
            srv_fail(&e, 401, NULL, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)");
            e.code = "invalid_api_key";
            return send_error(r, c, &e);
        }
        /* refused before the body is read (no 100 Continue either) */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->p.max_body) return refuse_too_large(r, c);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_large && r->body.len + *upload_size > h->p.max_body) {
            r->too_large = 1;
            sbuf_free(&r->body);
        }
        if (!r->too_large) sbuf_add(&r->body, upload, *upload_size);
        *upload_size = 0;
        return r->body.oom ? MHD_NO : MHD_YES;
    }
    set_deadline(h, r->ct, 0);
    return dispatch(r, c, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv_http *h = cls;
    req *r = *con_cls;
    if (!r) return;
    if (r->rt) srv_metrics_request(h->metrics, r->rt->name, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? r->status : 499);
    else srv_metrics_request(h->metrics, "other", r->status);
    set_deadline(h, r->ct, tern_now_s() + h->p.idle_timeout_s + h->p.read_timeout_s);
    atomic_fetch_sub(&h->in_flight, 1);
    sbuf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls; (void)fmt; (void)ap;   /* malformed requests are answered, not logged */
}

/* ---- the daemon ------------------------------------------------------------ */

static int resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, tern_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err->msg, sizeof err->msg, "host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

srv_http *srv_http_start(const srv_params *p, srv_metrics *metrics, tern_error *err) {
    srv_http *h = calloc(1, sizeof *h);
    if (!h) { snprintf(err->msg, sizeof err->msg, "out of memory"); return NULL; }
    h->p = *p;
    h->metrics = metrics;
    h->started = (long long)time(NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->reaper_cv, NULL);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(p->host, p->port, &ss, &sl, err)) goto fail;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(p->idle_timeout_s + 0.999),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION,
                            notify_connection, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1,
                            MHD_OPTION_END);
    if (!h->d) {
        snprintf(err->msg, sizeof err->msg, "could not listen on %s port %d: %s", p->host, p->port,
                 errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : p->port;
    if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
        snprintf(err->msg, sizeof err->msg, "could not start a thread");
        MHD_stop_daemon(h->d);
        goto fail;
    }
    return h;
fail:
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->reaper_cv);
    free(h);
    return NULL;
}

int srv_http_port(const srv_http *h) { return h->port; }

void srv_http_ready(srv_http *h, srv_ctx *c) { atomic_store(&h->ctx, c); }

void srv_http_quiesce(srv_http *h) {
    atomic_store(&h->closing, 1);
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET) close(s);
}

void srv_http_wait_idle(srv_http *h, double timeout_s) {
    double until = tern_now_s() + timeout_s;
    while (atomic_load(&h->in_flight) > 0 && tern_now_s() < until) usleep(20 * 1000);
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    pthread_mutex_lock(&h->mu);
    h->reaper_quit = 1;
    pthread_cond_signal(&h->reaper_cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->reaper, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->reaper_cv);
    free(h);
}
