/* The prefix cache's disk tier: one file per checkpoint in a directory of
 * the server's own (0700), each 0600, written atomically (a temporary name,
 * fsync, rename) and verified when read (tern_snapshot_read: the model
 * identity, the sizes, the base and a SHA-256).
 *
 * A file is named by the model identity, the hash of the checkpoint's token
 * path and its number in this process, so files of another model are never
 * opened. The index lives in memory only: at start the files this model
 * left are deleted, never loaded. */
#ifndef TERN_SERVER_PCDISK_H
#define TERN_SERVER_PCDISK_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

typedef struct pcdisk pcdisk;

/* Checks dir for the command line: created 0700 when missing; 0 when it is
 * a directory this process may write, else -1 with the cause in err. */
int pcdisk_check_dir(const char *dir, tern_error *err);

/* The tier in dir for model m (its stale files deleted). NULL with err. */
pcdisk *pcdisk_open(const char *dir, const tern_model *m, tern_error *err);
void pcdisk_close(pcdisk *d);
/* 1 when model m has the identity the tier's files are named for, 0 when
 * not, -1 with err. */
int pcdisk_matches(const pcdisk *d, const tern_model *m, tern_error *err);
/* The files are read for model m from now (NULL: none until the next
 * call); under m's identity, whose stale files are deleted when it
 * differs. 0, or -1 with err. */
int pcdisk_rebind(pcdisk *d, const tern_model *m, tern_error *err);

/* A checkpoint's file: hash names its token path, serial the checkpoint. */
typedef struct pcdisk_key {
    uint64_t hash, serial;
} pcdisk_key;

/* Writes snap's own bytes to its file; *bytes: the file's size. */
int pcdisk_write(pcdisk *d, pcdisk_key k, const tern_snapshot *snap, size_t *bytes, tern_error *err);
/* Reads it back over base (NULL: a whole snapshot); NULL with err when
 * the file is missing or fails verification. */
tern_snapshot *pcdisk_read(pcdisk *d, pcdisk_key k, const tern_snapshot *base, tern_error *err);
void pcdisk_remove(pcdisk *d, pcdisk_key k);

/* FNV-1a over token ids: the path part of a file name. */
uint64_t pcdisk_hash(const int32_t *tokens, int n);

#endif
