/* The prefix cache's disk tier: one file per checkpoint in a directory of
 * the server's own (0700), each 0600, written atomically (a temporary name,
 * fsync, rename) and verified when read (tern_snapshot_read: the model
 * identity, the sizes, the base and a SHA-256).
 *
 * A file is named by the model identity, the hash of the checkpoint's token
 * path and its number, so files of another model are never opened. The
 * index of the checkpoints (their token paths, bases, sizes) lives in
 * memory while the server runs; at a clean exit it is written beside the
 * files (pcdisk_write_index, verified by a SHA-256 of its bytes) and the
 * next start reads it back (pcdisk_read_index), then deletes the index
 * and every file of this model it does not name (pcdisk_sweep): after a
 * crash, with no index, the files are deleted, never trusted. */
#ifndef TERN_SERVER_PCDISK_H
#define TERN_SERVER_PCDISK_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

typedef struct pcdisk pcdisk;

/* Checks dir for the command line: created 0700 when missing; 0 when it is
 * a directory this process may write, else -1 with the cause in err. */
int pcdisk_check_dir(const char *dir, tern_error *err);

/* The tier in dir for model m (what an earlier process left is read or
 * deleted by pcdisk_read_index and pcdisk_sweep). NULL with err. */
pcdisk *pcdisk_open(const char *dir, const tern_model *m, tern_error *err);
void pcdisk_close(pcdisk *d);
/* 1 when model m has the identity the tier's files are named for, 0 when
 * not, -1 with err. */
int pcdisk_matches(const pcdisk *d, const tern_model *m, tern_error *err);
/* The files are read for model m from now (NULL: none until the next
 * call); under m's identity, whose files (an earlier process's) are
 * deleted when it differs. 0, or -1 with err. */
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

/* One checkpoint in the index: its file (key), its token path, the
 * checkpoint whose KV rows it continues or that it was taken after (base,
 * its serial; 0: none) and its file's size. */
typedef struct pcdisk_entry {
    pcdisk_key key;
    uint64_t base, bytes;
    int shares, n;
    const int32_t *tokens;
} pcdisk_entry;

/* Writes the index of n entries (bases before the checkpoints that hold
 * them), atomically. 0, or -1 with err. */
int pcdisk_write_index(pcdisk *d, const pcdisk_entry *e, int n, tern_error *err);
/* Calls fn for each entry of the index an earlier process wrote for this
 * model, in its order, with the entry's file checked to exist at its size
 * and its path to hash to its name (others are skipped); fn returns 0 to
 * go on. The count of entries passed to fn; 0 when there is no index; -1
 * with err when it is unreadable or fails its checksum (then no entry was
 * passed). */
typedef int (*pcdisk_entry_fn)(void *ud, const pcdisk_entry *e);
int pcdisk_read_index(pcdisk *d, pcdisk_entry_fn fn, void *ud, tern_error *err);
/* Deletes the index and every file of this model that keep (may be NULL:
 * none) does not claim. */
void pcdisk_sweep(pcdisk *d, int (*keep)(void *ud, pcdisk_key k), void *ud);

#endif
