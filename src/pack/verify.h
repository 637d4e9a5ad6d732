/* Integrity of a packed model directory (docs/FORMAT.md): rehashing every
 * file against the manifest, the install receipt (verified-install.json)
 * that lets a later load check sizes only, and the check the loader runs.
 *
 * The receipt binds three things: the SHA-256 of manifest.json, the real
 * path of the directory, and the list of files with their sizes and
 * hashes. Moving the directory, editing the manifest or the receipt, or
 * adding/removing a file breaks the binding, and the check falls back to a
 * full rehash — never to silent trust. */
#ifndef TERN_PACK_VERIFY_H
#define TERN_PACK_VERIFY_H

#include <stdint.h>

#include "model/manifest.h"
#include "pack/progress.h"

#define TERN_TOOL_VERSION "tern 0.1 (packed format 1)"
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

/* Writes dfd's receipt atomically for manifest m, whose bytes hash to
 * manifest_sha256 and are manifest_size long; model_dir is the directory's
 * real path (where it will be found when loaded). */
int tern_receipt_write(int dfd, const tern_manifest *m, const char *model_dir, const char *manifest_sha256,
                       uint64_t manifest_size, tern_error *err);

/* Rehashes relative path rel under directory fd root (O_NOFOLLOW on every
 * component) and compares it with f; err names the file as label/rel.
 * bar (may be NULL) advances by the bytes read. */
int tern_check_file(int root, const char *label, const tern_pk_file *f, tern_progress *bar, tern_error *err);

#endif
