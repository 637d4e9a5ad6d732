/* The chat page tern serve answers at / (docs/SERVER.md, "The chat page"):
 * its files, kept in src/server/web/ and embedded into the binary at build
 * time (scripts/embed_web.sh writes the table below), and the Debian packaged
 * markdown and highlighting libraries under /vendor/, read from their
 * installed paths when present. */
#ifndef TERN_SERVER_WEB_H
#define TERN_SERVER_WEB_H

#include <microhttpd.h>
#include <stddef.h>

typedef struct srv_web_asset {
    const char *path;                /* "/" for index.html, else "/" and the file's name */
    const char *type;                /* Content-Type */
    const char *etag;                /* quoted: a hash of the bytes */
    const unsigned char *data;
    size_t len;
} srv_web_asset;

/* Generated from src/server/web/ (build/gen/web_assets.c). */
extern const srv_web_asset srv_web_assets[];
extern const size_t srv_web_n_assets;

/* Whether url is one of the page's paths (embedded or /vendor/). */
int srv_web_is_path(const char *url);

/* Answers a GET or HEAD of a srv_web_is_path url: 200 with the file, or
 * 304 when If-None-Match holds its ETag. *status gets what was answered. */
enum MHD_Result srv_web_answer(struct MHD_Connection *c, const char *url, int *status);

#endif
