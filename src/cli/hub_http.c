/* The hub client's transport: connections, requests, retries and their
 * errors. Headers are read through libcurl (those of the last response of
 * a request, after redirects); the body goes to a sink or a capped buffer. */
#include "cli/hub_http.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/err.h"

#define LISTING_MAX ((size_t)64 << 20)
#define ERROR_BODY_MAX 4096
#define BACKOFF_CAP_S 30
#define RETRY_AFTER_CAP_S 60

hub *hub_create(const char *endpoint, const char *token, int retries, FILE *notes, tern_error *err) {
    if (strncmp(endpoint, "http://", 7) != 0 && strncmp(endpoint, "https://", 8) != 0) {
        tern_fail(err, "the hub endpoint must be an http:// or https:// URL, got '%s'", endpoint);
        return NULL;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        tern_fail(err, "libcurl failed to initialize");
        return NULL;
    }
    hub *h = calloc(1, sizeof *h);
    if (h && token && *token && asprintf(&h->auth, "Authorization: Bearer %s", token) < 0) h->auth = NULL;
    if (!h || !(h->endpoint = strdup(endpoint)) || (token && *token && !h->auth)) {
        hub_destroy(h);
        if (!h) curl_global_cleanup();
        tern_fail(err, "out of memory");
        return NULL;
    }
    size_t n = strlen(h->endpoint);
    while (n > 0 && h->endpoint[n - 1] == '/') h->endpoint[--n] = '\0';
    h->retries = retries;
    h->notes = notes;
    return h;
}

void hub_destroy(hub *h) {
    if (!h) return;
    free(h->endpoint);
    free(h->auth);
    free(h);
    curl_global_cleanup();
}

void hub_cancel(hub *h) { atomic_store(&h->cancelled, 1); }
const char *hub_endpoint(const hub *h) { return h->endpoint; }

/* ---- callbacks ---------------------------------------------------------- */

const char *hub_header(hub_conn *c, const char *name, char *buf, size_t cap) {
    struct curl_header *h;
    const char *v = curl_easy_header(c->curl, name, 0, CURLH_HEADER, -1, &h) == CURLHE_OK ? h->value : "";
    size_t i = 0;
    for (; v[i] && i + 1 < cap; i++) buf[i] = (unsigned char)v[i] < 0x20 || v[i] == 0x7f ? '?' : v[i];
    buf[i] = '\0';
    return buf;
}

int hub_header_u64(hub_conn *c, const char *name, uint64_t *out) {
    char v[96], *end;
    hub_header(c, name, v, sizeof v);
    if (strlen(v) + 1 == sizeof v) return 0;   /* (cut short: its digits are not all read) */
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!isdigit((unsigned char)v[0]) || *end || errno) return 0;
    *out = x;
    return 1;
}

/* A 206 must start where we asked ("bytes START-END/TOTAL"). */
static int range_starts_at(hub_conn *c, uint64_t start) {
    char range[128], *end;
    hub_header(c, "Content-Range", range, sizeof range);
    if (strncmp(range, "bytes ", 6) != 0 || !isdigit((unsigned char)range[6])) return 0;
    errno = 0;
    unsigned long long x = strtoull(range + 6, &end, 10);
    return *end == '-' && !errno && x == start;
}

static size_t to_sink(hub_conn *c, long code, char *data, size_t len) {
    if (!c->started) {
        c->started = 1;
        if (code == 200 && c->start > 0 && c->sink->restart(c->sink->ctx, c->sink_err) != 0) {
            c->sink_failed = 1;
            return 0;
        }
        if (code == 206 && !range_starts_at(c, c->start)) {
            c->range_bad = 1;
            return 0;
        }
    }
    if (c->sink->write(c->sink->ctx, data, len, c->sink_err) != 0) {
        c->sink_failed = 1;
        return 0;
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t count, void *ud) {
    hub_conn *c = ud;
    size_t len = size * count;
    if (atomic_load(&c->h->cancelled)) return 0;
    long code = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &code);
    if (c->sink && (code == 200 || code == 206)) return to_sink(c, code, data, len);
    int success = code >= 200 && code < 300;
    size_t room = c->max - c->len;
    if (len > room) {
        if (success) { c->too_big = 1; return 0; }
        len = room;   /* an error page: its start is enough */
    }
    if (c->len + len + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + len + 1) cap *= 2;
        char *grown = realloc(c->buf, cap);
        if (!grown) return 0;
        c->buf = grown;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, data, len);
    c->len += len;
    c->buf[c->len] = '\0';
    return size * count;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t x, curl_off_t y) {
    hub_conn *c = ud;
    return atomic_load(&c->h->cancelled) ? 1 : 0;
}

/* ---- connections and requests ------------------------------------------- */

hub_conn *hub_conn_create(hub *h, tern_error *err) {
    hub_conn *c = calloc(1, sizeof *c);
    if (!c || !(c->curl = curl_easy_init())) {
        free(c);
        tern_fail(err, "cannot start a libcurl handle");
        return NULL;
    }
    c->h = h;
    if (h->auth && !(c->hdrs = curl_slist_append(NULL, h->auth))) {
        hub_conn_destroy(c);
        tern_fail(err, "out of memory");
        return NULL;
    }
    CURL *e = c->curl;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "tern/1 (libcurl)");
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a connection that stalls is a dropped one: retried, then resumed */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L << 10);   /* fewer, larger writes of the shards */
    return c;
}

void hub_conn_destroy(hub_conn *c) {
    if (!c) return;
    curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->hdrs);
    free(c->buf);
    free(c);
}

typedef enum { R_OK, R_RETRY, R_FAIL } outcome;

static CURLcode perform(hub_conn *c, const char *url, int head, int follow, const char *range) {
    CURL *e = c->curl;
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_RANGE, range);
    c->errbuf[0] = '\0';
    c->len = 0;
    c->max = c->sink ? ERROR_BODY_MAX : LISTING_MAX;
    c->started = c->sink_failed = c->range_bad = c->too_big = 0;
    return curl_easy_perform(e);
}

long hub_status(hub_conn *c) {
    long code = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

/* One line for an HTTP error, in the hub's terms (X-Error-Code). */
static void http_fail(hub_conn *c, long code, const char *what, tern_error *err) {
    char ec[64], msg[256];
    hub_header(c, "X-Error-Code", ec, sizeof ec);
    hub_header(c, "X-Error-Message", msg, sizeof msg);
    int token = c->h->auth != NULL;
    if (!strcmp(ec, "GatedRepo"))
        tern_fail(err, "%s: gated repository: accept its terms on the hub, then set HF_TOKEN to a token of that account",
                  what);
    else if ((code == 401 || code == 403) && !token)
        tern_fail(err, "%s: not found, or private or gated (HTTP %ld): set HF_TOKEN to a Hugging Face access token",
                  what, code);
    else if (code == 401 || code == 403)
        tern_fail(err, "%s: access denied (HTTP %ld) with the token in HF_TOKEN", what, code);
    else if (!strcmp(ec, "RevisionNotFound")) tern_fail(err, "%s: revision not found", what);
    else if (!strcmp(ec, "EntryNotFound") || (code == 404 && c->file_req && strcmp(ec, "RepoNotFound") != 0))
        tern_fail(err, "%s: no such file at this revision", what);
    else if (code == 404) tern_fail(err, "%s: repository not found on %s", what, c->h->endpoint);
    else tern_fail(err, "%s: HTTP %ld%s%s", what, code, msg[0] ? ": " : "", msg);
}

static outcome classify(hub_conn *c, CURLcode rc, const char *what, tern_error *err) {
    long code = hub_status(c);
    if (atomic_load(&c->h->cancelled)) { tern_fail(err, "%s: cancelled", what); return R_FAIL; }
    if (c->sink_failed) return R_FAIL;
    if (c->range_bad) {
        char range[128];
        tern_fail(err, "%s: the server answered a Range request with other bytes (%s)", what,
                  hub_header(c, "Content-Range", range, sizeof range));
        return R_FAIL;
    }
    if (c->too_big) { tern_fail(err, "%s: answer larger than %zu bytes", what, c->max); return R_FAIL; }
    if (rc == CURLE_OK) {
        if (code >= 200 && code < 400) return R_OK;
        if (code == 408 || code == 429 || code >= 500) {
            tern_fail(err, "%s: HTTP %ld", what, code);
            return R_RETRY;
        }
        http_fail(c, code, what, err);
        return R_FAIL;
    }
    tern_fail(err, "%s: %s", what, c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc));
    switch (rc) {
    case CURLE_UNSUPPORTED_PROTOCOL: case CURLE_URL_MALFORMAT: case CURLE_TOO_MANY_REDIRECTS:
    case CURLE_OUT_OF_MEMORY: case CURLE_PEER_FAILED_VERIFICATION: case CURLE_SSL_CACERT_BADFILE:
    case CURLE_BAD_FUNCTION_ARGUMENT:
        return R_FAIL;
    default:
        return R_RETRY;
    }
}

/* Sleeps before retry n (1, 2, 4 ... s, or the server's Retry-After),
 * waking early when the pull is cancelled. why: the failure, told. */
static int backoff(hub_conn *c, int n, const tern_error *why) {
    curl_off_t after = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RETRY_AFTER, &after);
    long cap = after > 0 ? RETRY_AFTER_CAP_S : BACKOFF_CAP_S;
    curl_off_t s = after > 0 ? after : 1L << (n < 5 ? n : 5);
    if (s > cap) s = cap;
    if (c->h->notes) fprintf(c->h->notes, "tern pull: %s; retrying in %ld s\n", why->msg, (long)s);
    for (long t = 0; t < s * 10; t++) {
        if (atomic_load(&c->h->cancelled)) return -1;
        nanosleep(&(struct timespec){0, 100000000L}, NULL);
    }
    return 0;
}

int hub_request(hub_conn *c, const char *url, int head, int follow, const char *what, tern_error *err) {
    for (int attempt = 0;; attempt++) {
        outcome o = classify(c, perform(c, url, head, follow, NULL), what, err);
        if (o == R_OK) return 0;
        if (o == R_FAIL) return -1;
        if (attempt >= c->h->retries) {
            tern_err_prefix(err, "network failure after %d attempts", attempt + 1);
            return -1;
        }
        if (backoff(c, attempt, err) != 0) return tern_fail(err, "%s: cancelled", what);
    }
}

int hub_download(hub_conn *c, const char *url, const char *what, uint64_t size, hub_sink *s, tern_error *err) {
    c->sink = s;
    c->sink_err = err;
    c->file_req = 1;
    int rc = -1;
    for (int fails = 0;;) {
        uint64_t off = s->offset(s->ctx);
        if (off == size) { rc = 0; break; }
        if (off > size) {
            tern_fail(err, "%s: the server sent more than the %" PRIu64 " bytes the hub announced", what, size);
            break;
        }
        char range[48];
        snprintf(range, sizeof range, "%" PRIu64 "-", off);
        c->start = off;
        outcome o = classify(c, perform(c, url, 0, 1, off ? range : NULL), what, err);
        uint64_t now = s->offset(s->ctx);
        if (o == R_OK && now < size) {
            tern_fail(err, "%s: the connection ended after %" PRIu64 " of %" PRIu64 " bytes", what, now, size);
            o = R_RETRY;
        }
        if (o == R_FAIL) break;
        if (o == R_OK) continue;
        fails = now > off ? 0 : fails + 1;   /* an attempt that made progress costs no retry */
        if (fails > c->h->retries) {
            tern_err_prefix(err, "network failure after %d attempts", fails);
            break;
        }
        if (backoff(c, fails > 0 ? fails - 1 : 0, err) != 0) { tern_fail(err, "%s: cancelled", what); break; }
    }
    c->sink = NULL;
    c->sink_err = NULL;
    c->file_req = 0;
    return rc;
}
