/* tern pull's parts: which files of a repository to fetch and where
 * (pull_plan.c), fetching them in parallel with resume and verification
 * (pull_fetch.c); cmd_pull.c runs them and then tern pack. */
#ifndef TERN_CLI_PULL_H
#define TERN_CLI_PULL_H

#include <pthread.h>
#include <stdint.h>

#include "cli/hub.h"

/* The receipt a pull writes into the download (and the packed model):
 * repository, requested revision, commit, and each file's size and
 * SHA-256. */
#define PULL_RECEIPT "tern-pull.json"
#define PULL_PARTIAL_SUFFIX ".incomplete"
/* held (flock) by the pull using the download directory */
#define PULL_LOCK ".tern-pull.lock"

typedef struct pull_file {
    char *name;                  /* relative path, checked by pull_name_ok */
    hub_file meta;               /* from the hub (HEAD) */
    char sha256[65];             /* of the bytes on disk, once verified */
} pull_file;

typedef struct pull_job {
    hub *h;
    const char *repo, *revision;
    char commit[41];
    const char *dir;             /* the download directory */
    int root;                    /* its fd */
    int lock;                    /* PULL_LOCK's fd, flocked */
    int jobs;                    /* files at once */
    pull_file *files;
    int n_files;
    /* shared by the workers */
    pthread_mutex_t mu;
    struct tern_progress *bar;
    uint64_t done_bytes;         /* held and verified or downloaded so far */
    int next, failed;
    tern_error first_err;
} pull_job;

/* 1 if a file name from the network is safe to create under the
 * destination: relative, no "." or ".." component, no empty component, no
 * backslash or control character. */
int pull_name_ok(const char *name);

/* Every name in the listing must be safe (a hub that sends one that is not
 * is refused), then the files to fetch: config, generation config,
 * tokenizer files, chat template, and model.safetensors or the index.
 * The index's shards are added by pull_add_shards once it is on disk. */
int pull_select(pull_job *j, const hub_listing *l, tern_error *err);
/* Adds the shards named by the index (already fetched into the download):
 * each must be a safe name ending in .safetensors and in the listing. */
int pull_add_shards(pull_job *j, const hub_listing *l, tern_error *err);
void pull_files_free(pull_job *j);


/* HEAD for files[from..]: each file's size and hash. */
int pull_head_all(pull_job *j, int from, tern_error *err);
/* The bytes already held for files[from..] (complete files of the right
 * size and partial downloads), by their sizes. */
uint64_t pull_bytes_held(pull_job *j, int from);
/* Fetches files[from..]: a complete file is rehashed and kept if it
 * matches, a partial one is continued with a Range request; each is
 * checked against the hub's hash before it takes its name. */
int pull_fetch_all(pull_job *j, int from, tern_error *err);

/* Writes PULL_RECEIPT into the directory fd (atomically). */
int pull_write_receipt(const pull_job *j, int dfd, const char *label, tern_error *err);
/* Takes PULL_LOCK in the download directory: one pull at a time. */
int pull_lock(pull_job *j, tern_error *err);
/* Removes the lock file (still held) and closes it. */
void pull_unlock(pull_job *j);
/* Removes the files of the pull, its receipt, the lock and then the
 * directories it made, if empty. 0, or -1 if something else was left. */
int pull_remove_download(pull_job *j);

#endif
