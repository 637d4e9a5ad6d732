/* A progress bar for long work (packing, verifying, hashing): percentage,
 * MB done, MB/s and ETA. On a terminal it redraws one line with \r (at
 * most ~10 times a second); otherwise (a log file, CI) it prints a plain line every
 * ~5% so the log stays readable. */
#ifndef TERN_UTIL_PROGRESS_H
#define TERN_UTIL_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct tern_progress tern_progress;

/* out NULL: a silent bar (every call is a no-op). */
tern_progress *tern_progress_create(FILE *out, const char *label, uint64_t total_bytes);
/* Bytes already done before this run (a resumed pack): shown, but not
 * counted in MB/s. Call before the first set/add. */
void tern_progress_start_at(tern_progress *p, uint64_t done);
/* Sets the bytes done so far. */
void tern_progress_set(tern_progress *p, uint64_t done);
void tern_progress_add(tern_progress *p, uint64_t n);
/* Final line: total, time, average MB/s. */
void tern_progress_finish(tern_progress *p);
void tern_progress_destroy(tern_progress *p);

#endif
