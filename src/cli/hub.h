/* A client of the Hugging Face hub's HTTP interface (libcurl), for tern pull:
 * the file listing of a revision, a file's size and hash (a HEAD request
 * that does not follow the hub's redirect to its storage), and ranged
 * downloads that retry and resume. One hub per pull; one hub_conn per
 * thread (a curl handle that keeps its connections). */
#ifndef TERN_CLI_HUB_H
#define TERN_CLI_HUB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tern.h"

typedef struct hub hub;
typedef struct hub_conn hub_conn;

/* endpoint: e.g. https://huggingface.co (no trailing slash needed); token:
 * sent as "Authorization: Bearer" (NULL: none); retries: attempts after
 * the first one that made no progress (transient failures only); notes:
 * where each retry is told (NULL: nowhere). */
hub *hub_create(const char *endpoint, const char *token, int retries, FILE *notes, tern_error *err);
void hub_destroy(hub *h);
/* Makes every transfer in progress, and every later one, fail at once
 * (another file failed; the pull is over). Safe from any thread. */
void hub_cancel(hub *h);
const char *hub_endpoint(const hub *h);

hub_conn *hub_conn_create(hub *h, tern_error *err);
void hub_conn_destroy(hub_conn *c);

/* 1 if repo is a well-formed repository id: "owner/name" or "name", of
 * letters, digits, '-', '_' and '.', no "..". */
int hub_repo_ok(const char *repo);

typedef struct hub_listing {
    char commit[41];             /* the revision, resolved to its commit hash */
    char **names;                /* every file of the repository at that commit, sorted (strcmp) */
    int n;
} hub_listing;

int hub_list(hub_conn *c, const char *repo, const char *revision, hub_listing *out, tern_error *err);
void hub_listing_free(hub_listing *l);

typedef struct hub_file {
    uint64_t size;
    int lfs;                     /* stored in LFS: size and sha256 from the X-Linked-* headers */
    /* one of the two is set: a file without a hash is refused */
    char sha256[65];             /* the hub's SHA-256 of the content, or "" */
    char git_sha1[41];           /* a plain git file's blob id (its ETag), or "" */
} hub_file;

/* The size and hash of a file at a commit. */
int hub_head(hub_conn *c, const char *repo, const char *commit, const char *file, hub_file *out, tern_error *err);

/* Where a download goes. offset: the bytes already held, where the next
 * request starts (HTTP Range); write: 0, or -1 with err set (the download
 * stops); restart: the server ignored the Range, the bytes held are
 * discarded and the body starts at 0. */
typedef struct hub_sink {
    void *ctx;
    uint64_t (*offset)(void *ctx);
    int (*write)(void *ctx, const void *data, size_t n, tern_error *err);
    int (*restart)(void *ctx, tern_error *err);
} hub_sink;

/* Downloads the file until the sink holds `size` bytes, resuming after a
 * dropped connection or a server error with a Range request, with
 * backoff. -1 with one line in err: the sink's error, an HTTP error, or
 * the retries running out. */
int hub_get(hub_conn *c, const char *repo, const char *commit, const char *file, uint64_t size, hub_sink *s,
            tern_error *err);

#endif
