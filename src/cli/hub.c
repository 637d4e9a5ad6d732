/* The hub's API over the transport of hub_http.c: repository ids, the
 * listing of a revision, a file's size and hash, and download URLs. */
#include "cli/hub_http.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define MAX_HOPS 5

int hub_repo_ok(const char *repo) {
    size_t n = strlen(repo);
    int slashes = 0;
    if (n == 0 || n > 200 || repo[0] == '/' || repo[n - 1] == '/' || strstr(repo, "..") || strstr(repo, "//"))
        return 0;
    for (const char *p = repo; *p; p++) {
        if (*p == '/') slashes++;
        else if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') return 0;
    }
    return slashes <= 1 && repo[0] != '.' && !strstr(repo, "/.");
}

/* ---- URLs --------------------------------------------------------------- */

/* endpoint/repo/resolve/commit/file, each path segment of file escaped. */
static char *resolve_url(hub_conn *c, const char *repo, const char *commit, const char *file) {
    size_t cap = strlen(c->h->endpoint) + strlen(repo) + strlen(commit) + 3 * strlen(file) + 32;
    char *url = malloc(cap);
    if (!url) return NULL;
    int n = snprintf(url, cap, "%s/%s/resolve/%s", c->h->endpoint, repo, commit);
    for (const char *s = file; *s;) {
        const char *slash = strchr(s, '/');
        size_t len = slash ? (size_t)(slash - s) : strlen(s);
        char *esc = curl_easy_escape(c->curl, s, (int)len);
        if (!esc) { free(url); return NULL; }
        n += snprintf(url + n, cap - (size_t)n, "/%s", esc);
        curl_free(esc);
        s += len + (slash != NULL);
    }
    return url;
}

/* ---- the listing -------------------------------------------------------- */

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i])) return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int parse_listing(const char *body, const char *what, hub_listing *out, tern_error *err) {
    json_error_t je;
    json_t *root = json_loads(body, 0, &je);
    json_t *sha = json_object_get(root, "sha"), *sib = json_object_get(root, "siblings");
    int rc = 0;
    if (!root) rc = tern_fail(err, "%s: the hub's listing is not JSON (%s)", what, je.text);
    else if (!json_is_string(sha) || !is_hex(json_string_value(sha), 40))
        rc = tern_fail(err, "%s: the hub's listing has no commit hash ('sha')", what);
    else if (!json_is_array(sib)) rc = tern_fail(err, "%s: the hub's listing has no 'siblings'", what);
    if (rc == 0) {
        snprintf(out->commit, sizeof out->commit, "%s", json_string_value(sha));
        out->names = calloc(json_array_size(sib) + 1, sizeof *out->names);
        if (!out->names) rc = tern_fail(err, "out of memory");
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(sib); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(sib, i), "rfilename"));
        if (!name) rc = tern_fail(err, "%s: the hub's listing has a file without 'rfilename'", what);
        else if (!(out->names[out->n++] = strdup(name))) rc = tern_fail(err, "out of memory");
    }
    if (rc == 0) qsort(out->names, (size_t)out->n, sizeof *out->names, cmp_str);
    json_decref(root);
    return rc;
}

int hub_list(hub_conn *c, const char *repo, const char *revision, hub_listing *out, tern_error *err) {
    memset(out, 0, sizeof *out);
    char what[512];
    snprintf(what, sizeof what, "%s@%s", repo, revision);
    char *rev = curl_easy_escape(c->curl, revision, 0), *url = NULL;
    if (!rev || asprintf(&url, "%s/api/models/%s/revision/%s", c->h->endpoint, repo, rev) < 0) url = NULL;
    curl_free(rev);
    if (!url) return tern_fail(err, "out of memory");
    int rc = hub_request(c, url, 0, 1, what, err);
    free(url);
    if (rc == 0) rc = parse_listing(c->buf ? c->buf : "", what, out, err);
    if (rc != 0) hub_listing_free(out);
    return rc;
}

void hub_listing_free(hub_listing *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    l->names = NULL;
    l->n = 0;
}

/* ---- a file's size and hash --------------------------------------------- */

/* An ETag without W/ and quotes. */
static void bare_etag(const char *in, char *out, size_t cap) {
    if (!strncmp(in, "W/", 2)) in += 2;
    size_t n = strlen(in);
    if (n >= 2 && in[0] == '"' && in[n - 1] == '"') { in++; n -= 2; }
    snprintf(out, cap, "%.*s", (int)n, in);
}

static int head_result(hub_conn *c, const char *what, hub_file *out, tern_error *err) {
    char etag[160], tag[160];
    memset(out, 0, sizeof *out);
    hub_header(c, "X-Linked-Etag", etag, sizeof etag);
    int linked_size = hub_header_u64(c, "X-Linked-Size", &out->size);
    if (etag[0] || linked_size) {
        out->lfs = 1;
        if (!linked_size) return tern_fail(err, "%s: the hub gave no X-Linked-Size", what);
        bare_etag(etag, tag, sizeof tag);
        if (!is_hex(tag, 64)) return tern_fail(err, "%s: the hub gave no SHA-256 (X-Linked-Etag)", what);
        memcpy(out->sha256, tag, 65);
        return 0;
    }
    if (!hub_header_u64(c, "Content-Length", &out->size)) return tern_fail(err, "%s: the hub gave no size", what);
    bare_etag(hub_header(c, "ETag", etag, sizeof etag), tag, sizeof tag);
    if (is_hex(tag, 64)) memcpy(out->sha256, tag, 65);
    else if (is_hex(tag, 40)) memcpy(out->git_sha1, tag, 41);
    else return tern_fail(err, "%s: the hub gave no hash of the file (ETag)", what);
    return 0;
}

/* Sizes are file offsets (off_t) and JSON integers in the receipt. */
static int head_checked(hub_conn *c, const char *what, hub_file *out, tern_error *err) {
    if (head_result(c, what, out, err) != 0) return -1;
    if (out->size > INT64_MAX) return tern_fail(err, "%s: the hub announced an impossible size", what);
    return 0;
}

int hub_head(hub_conn *c, const char *repo, const char *commit, const char *file, hub_file *out, tern_error *err) {
    char what[1200];
    snprintf(what, sizeof what, "%s/%s", repo, file);
    char *url = resolve_url(c, repo, commit, file);
    if (!url) return tern_fail(err, "out of memory");
    int rc = -1, hops = 0;
    c->file_req = 1;
    /* the hub's own redirects (relative: a renamed repo, its resolve
     * cache) are followed; one to its storage (absolute) is the answer */
    for (;; hops++) {
        if (hops == MAX_HOPS) {
            tern_fail(err, "%s: more than %d redirects", what, MAX_HOPS);
            break;
        }
        if (hub_request(c, url, 1, 0, what, err) != 0) break;
        char at[64], loc[2048];
        if (hub_header(c, "X-Repo-Commit", at, sizeof at)[0] && strcmp(at, commit) != 0) {
            tern_fail(err, "%s: the hub answered for commit %.40s, not %s", what, at, commit);
            break;
        }
        long code = hub_status(c);
        hub_header(c, "Location", loc, sizeof loc);
        char *next = NULL;
        if (code >= 300 && code < 400 && loc[0] == '/' && loc[1] != '/') {
            curl_easy_getinfo(c->curl, CURLINFO_REDIRECT_URL, &next);
            if (next && (next = strdup(next))) { free(url); url = next; continue; }
            tern_fail(err, "%s: cannot follow the hub's redirect to %s", what, loc);
            break;
        }
        if (code >= 300 && code < 400 && !hub_header_u64(c, "X-Linked-Size", &(uint64_t){0})) {
            tern_fail(err, "%s: redirected to %s without the file's size (X-Linked-Size)", what, loc);
            break;
        }
        rc = head_checked(c, what, out, err);
        break;
    }
    c->file_req = 0;
    free(url);
    return rc;
}

/* ---- downloads ---------------------------------------------------------- */

int hub_get(hub_conn *c, const char *repo, const char *commit, const char *file, uint64_t size, hub_sink *s,
            tern_error *err) {
    char what[1200];
    snprintf(what, sizeof what, "%s/%s", repo, file);
    char *url = resolve_url(c, repo, commit, file);
    if (!url) return tern_fail(err, "out of memory");
    int rc = hub_download(c, url, what, size, s, err);
    free(url);
    return rc;
}
