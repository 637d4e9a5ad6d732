/* What the tests see of the matcher beyond tern.h. */
#ifndef TERN_GRAMMAR_MATCHER_H
#define TERN_GRAMMAR_MATCHER_H

#include "tern.h"

/* Whether token id may come next under budget (as tern_matcher_fill_mask
 * takes it), found by reading the token's bytes from the current state:
 * the slow path the masks must agree with bit for bit. */
int gm_token_allowed(tern_matcher *m, int32_t id, int budget);

#endif
