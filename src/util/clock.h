/* The monotonic clock in seconds, for timings and progress (one definition
 * instead of one per file). */
#ifndef TERN_UTIL_CLOCK_H
#define TERN_UTIL_CLOCK_H

#include <time.h>

static inline double tern_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
