/* What the GPU engine checks (tern-cuda-engine-tests) share. */
#ifndef TERN_TESTS_GPU_CHECK_H
#define TERN_TESTS_GPU_CHECK_H

#include "tern.h"

/* One line of the table; a failure when err > tol. */
void report(const char *what, double err, double tol);
/* The model in dir on device ("cuda"; NULL: the CPU); exits on failure. */
tern_model *load(const char *dir, const char *device);

/* check_tiers.c: GPU snapshots in host memory and the prefix cache's
 * tiers, on a packed tern-tiny in dir. */
void check_tiers(const char *dir);
/* check_grammar.c: constrained decoding drawn on the GPU against the CPU
 * sampler, on a packed tern-tiny in dir. */
void check_grammar(const char *dir);

#endif
