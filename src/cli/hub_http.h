/* The hub client's transport (hub_http.c), shared with hub.c, which
 * speaks the hub's API over it: a libcurl handle per connection, requests
 * with retries and backoff, the last response's headers, and downloads
 * into a sink that resume with Range requests. */
#ifndef TERN_CLI_HUB_HTTP_H
#define TERN_CLI_HUB_HTTP_H

#include <curl/curl.h>
#include <stdatomic.h>

#include "cli/hub.h"

struct hub {
    char *endpoint;
    char *auth;                  /* the Authorization header line, or NULL */
    int retries;
    FILE *notes;
    atomic_int cancelled;
};

struct hub_conn {
    hub *h;
    CURL *curl;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
    /* the body: to the sink when 2xx and one is set, else to buf */
    hub_sink *sink;
    uint64_t start;
    int started, sink_failed, range_bad, too_big;
    tern_error *sink_err;
    int file_req;                /* a file's request (a 404 is the file's), not the listing */
    char *buf;
    size_t len, cap, max;
};

/* One request with retries: 0, or -1 with err set. head: HEAD rather than
 * GET; follow: follow redirects. The body (GET) is in c->buf. */
int hub_request(hub_conn *c, const char *url, int head, int follow, const char *what, tern_error *err);
/* The last response's status. */
long hub_status(hub_conn *c);
/* A header of the last response (after redirects), copied with control
 * characters as '?': the values reach messages on a terminal. "" if absent. */
const char *hub_header(hub_conn *c, const char *name, char *buf, size_t cap);
/* A header holding a decimal number: 1 with *out, 0 if absent or not one. */
int hub_header_u64(hub_conn *c, const char *name, uint64_t *out);
/* hub_get's work on a URL; what: the file, in messages. */
int hub_download(hub_conn *c, const char *url, const char *what, uint64_t size, hub_sink *s, tern_error *err);

#endif
