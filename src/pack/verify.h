/* Integrity of a packed model directory (docs/FORMAT.md), the writing
 * side: the install receipt (verified-install.json) that lets a later load
 * check sizes only, and tern verify, which rehashes every file and writes
 * it. The loader's check, which reads the receipt, is model/packed_check.h.
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
#include "model/packed_check.h"
#include "util/progress.h"

#define TERN_TOOL_VERSION "tern 0.1 (packed format 1)"

/* Writes dfd's receipt atomically for manifest m, whose bytes hash to
 * manifest_sha256 and are manifest_size long; model_dir is the directory's
 * real path (where it will be found when loaded). */
int tern_receipt_write(int dfd, const tern_manifest *m, const char *model_dir, const char *manifest_sha256,
                       uint64_t manifest_size, tern_error *err);

#endif
