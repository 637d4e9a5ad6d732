/* The library's messages name load and session parameters (rope_factor,
 * ...); tern run and tern serve take them as flags. tern_flag_names puts
 * the flags in their place, for a message shown to a command-line user.
 * (Header only: the server, built into tests without the CLI, uses it
 * too.) */
#ifndef TERN_CLI_FLAG_NAMES_H
#define TERN_CLI_FLAG_NAMES_H

#include <string.h>

#include "tern.h"

static inline void tern_flag_names(tern_error *err) {
    static const char *const map[][2] = {
        {"rope_scaling", "--rope-scaling"}, {"rope_factor", "--rope-factor"}, {"rope_context", "--ctx"}};
    const size_t n_map = sizeof map / sizeof *map;
    char out[sizeof err->msg];
    size_t n = 0;
    for (const char *p = err->msg; *p && n + 1 < sizeof out;) {
        size_t i = 0;
        while (i < n_map && strncmp(p, map[i][0], strlen(map[i][0]))) i++;
        if (i < n_map && n + strlen(map[i][1]) + 1 < sizeof out) {
            memcpy(out + n, map[i][1], strlen(map[i][1]));
            n += strlen(map[i][1]);
            p += strlen(map[i][0]);
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    memcpy(err->msg, out, n + 1);
}

#endif
