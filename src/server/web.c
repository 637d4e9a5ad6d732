#include "server/web.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JS_TYPE "text/javascript; charset=utf-8"

/* Model output is rendered in this page, so it may hold no script of its
 * own: scripts, styles and connections only from this origin, nothing
 * inline, no plugins, no framing. */
#define PAGE_CSP                                                                                              \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "     \
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* Debian's libjs-marked and libjs-highlight.js, served from where they are
 * installed; when one is not, its path answers a script that defines
 * nothing, and the page falls back to its own plain renderer. */
typedef struct vendor_file {
    const char *path, *file, *package;
} vendor_file;

static const vendor_file VENDOR[] = {
    {"/vendor/marked.min.js", "/usr/share/javascript/marked/marked.min.js", "libjs-marked"},
    {"/vendor/highlight.min.js", "/usr/share/javascript/highlight.js/highlight.min.js", "libjs-highlight.js"},
};
#define N_VENDOR (sizeof VENDOR / sizeof *VENDOR)

static const srv_web_asset *find_asset(const char *url) {
    for (size_t i = 0; i < srv_web_n_assets; i++)
        if (!strcmp(url, srv_web_assets[i].path)) return &srv_web_assets[i];
    return NULL;
}

static const vendor_file *find_vendor(const char *url) {
    for (size_t i = 0; i < N_VENDOR; i++)
        if (!strcmp(url, VENDOR[i].path)) return &VENDOR[i];
    return NULL;
}

int srv_web_is_path(const char *url) { return find_asset(url) || find_vendor(url); }

/* Revalidated on every load (no-cache), so a new binary's page is never
 * mixed with an old one's script; an unchanged file costs a 304. */
static enum MHD_Result queue(struct MHD_Connection *c, struct MHD_Response *resp, int status, const char *type,
                             const char *etag, int page, int *out_status) {
    if (!resp) return MHD_NO;
    if (type) MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "ETag", etag);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (page) {
        MHD_add_response_header(resp, "Content-Security-Policy", PAGE_CSP);
        MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    }
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    *out_status = status;
    return rc;
}

/* Whether the client's If-None-Match names etag (or is "*"). */
static int not_modified(struct MHD_Connection *c, const char *etag) {
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    if (!inm) return 0;
    if (!strcmp(inm, "*")) return 1;
    size_t n = strlen(etag);
    for (const char *p = strstr(inm, etag); p; p = strstr(p + 1, etag))
        if ((p == inm || p[-1] == ' ' || p[-1] == ',') && (p[n] == 0 || p[n] == ',' || p[n] == ' ')) return 1;
    return 0;
}

static struct MHD_Response *empty_response(void) {
    return MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result answer_vendor(struct MHD_Connection *c, const vendor_file *v, int *status) {
    char etag[64], stub[160];
    int fd = open(v->file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        int n = snprintf(stub, sizeof stub, "/* %s is not installed: the page renders plain text */\n", v->package);
        snprintf(etag, sizeof etag, "\"absent-%d\"", n);
        if (not_modified(c, etag)) return queue(c, empty_response(), 304, NULL, etag, 0, status);
        struct MHD_Response *r = MHD_create_response_from_buffer((size_t)n, stub, MHD_RESPMEM_MUST_COPY);
        return queue(c, r, 200, JS_TYPE, etag, 0, status);
    }
    snprintf(etag, sizeof etag, "\"%llx-%llx\"", (unsigned long long)st.st_size, (unsigned long long)st.st_mtime);
    if (not_modified(c, etag)) {
        close(fd);
        return queue(c, empty_response(), 304, NULL, etag, 0, status);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((size_t)st.st_size, fd);   /* owns fd */
    if (!r) close(fd);
    return queue(c, r, 200, JS_TYPE, etag, 0, status);
}

enum MHD_Result srv_web_answer(struct MHD_Connection *c, const char *url, int *status) {
    const vendor_file *v = find_vendor(url);
    if (v) return answer_vendor(c, v, status);
    const srv_web_asset *a = find_asset(url);
    if (!a) return MHD_NO;
    int page = !strcmp(a->path, "/");
    if (not_modified(c, a->etag)) return queue(c, empty_response(), 304, NULL, a->etag, page, status);
    struct MHD_Response *r = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    return queue(c, r, 200, a->type, a->etag, page, status);
}
