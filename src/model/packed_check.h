/* The loader's check of a packed model directory (docs/FORMAT.md): every
 * file against the manifest, by size when the install receipt
 * (verified-install.json, written by pack/verify.c) binds this manifest,
 * this directory and these files unchanged, else by a full rehash, never
 * by silent trust. */
#ifndef TERN_MODEL_PACKED_CHECK_H
#define TERN_MODEL_PACKED_CHECK_H

#include <jansson.h>
#include <stdint.h>

#include "model/manifest.h"

struct stat;
struct tern_progress;

#define TERN_RECEIPT_NAME "verified-install.json"
#define TERN_RECEIPT_SCHEMA 2

enum tern_check_how {
    TERN_CHECK_RECEIPT = 0,      /* receipt matched: sizes checked */
    TERN_CHECK_REHASH = 1,       /* every file rehashed */
};

/* The loader's check of dir against its manifest m (already read with
 * tern_manifest_read): with a matching receipt, sizes only; otherwise a
 * full rehash. Returns 0, or -1 with err naming the bad file. */
int tern_packed_check(const char *dir, const tern_manifest *m, tern_error *err);
/* The same; *how (may be NULL) tells which path was taken. */
int tern_packed_check_how(const char *dir, const tern_manifest *m, int *how, tern_error *err);

/* The receipt's entry for one file: its size and hash, and with st (may be
 * NULL) the inode, mtime and ctime that the size-only check compares. */
json_t *tern_receipt_file_entry(uint64_t size, const char *sha, const struct stat *st);

/* Opens rel under root (util/path.h's tern_open_in); errors read label/rel. */
int tern_packed_open_file(int root, const char *label, const char *rel, tern_error *err);
/* The size of dir's manifest.json (root: dir opened). */
int tern_packed_manifest_size(int root, const char *dir, uint64_t *size, tern_error *err);

/* Rehashes relative path rel under directory fd root (O_NOFOLLOW on every
 * component) and compares it with f; err names the file as label/rel.
 * bar (may be NULL) advances by the bytes read; *st_out (may be NULL) gets
 * the file's status from before it was hashed, so a change made during the
 * hash shows later. */
int tern_check_file(int root, const char *label, const tern_pk_file *f, struct tern_progress *bar,
                    struct stat *st_out, tern_error *err);

#endif
