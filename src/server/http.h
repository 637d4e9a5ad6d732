/* The HTTP side of tern serve, on libmicrohttpd: one thread per connection
 * (so a handler may wait for its job), the routes, limits (body size,
 * connections, read and idle timeouts), API keys, and each response: JSON
 * at once, or an SSE stream fed by a job's events. */
#ifndef TERN_SERVER_HTTP_H
#define TERN_SERVER_HTTP_H

#include "server/api.h"
#include "server/metrics.h"
#include "server/server.h"

typedef struct srv_http srv_http;

/* Binds and starts serving; until srv_http_ready, model routes answer 503. */
srv_http *srv_http_start(const srv_params *p, srv_metrics *metrics, tern_error *err);
int srv_http_port(const srv_http *h);
void srv_http_ready(srv_http *h, srv_ctx *c);
/* Stops accepting connections; requests on open ones get 503 from now on. */
void srv_http_quiesce(srv_http *h);
/* Waits (at most timeout_s) until no request is being handled. */
void srv_http_wait_idle(srv_http *h, double timeout_s);
void srv_http_stop(srv_http *h);

#endif
