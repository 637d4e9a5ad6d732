/* The depth of each speculative step when a generation asks for
 * TERN_MTP_AUTO: the depth (0, no drafts, included) that has given the
 * most tokens a second on this generation's own steps. Every depth is
 * tried for a few steps first (drafts first, no drafts last); then the best runs, and now and then one
 * other depth is tried again for a couple of steps, so a change in what
 * pays (the text grows predictable, the context longer) is seen. Each
 * depth's rate is a decaying mean, recent steps weighing most. Where
 * no drafts beat every depth by a clear margin cycle after cycle, it
 * settles: no drafts for the rest of the generation, and the caller stops
 * keeping the head in step (which costs a layer a token). A pure function
 * of what it is told: the caller times the steps. */
#ifndef TERN_ENGINE_MTP_AUTO_H
#define TERN_ENGINE_MTP_AUTO_H

#include "tern.h"

enum {
    MTP_AUTO_WARM = 4,        /* steps each depth is tried at first */
    MTP_AUTO_RUN = 48,        /* steps of the best depth between two probes */
    MTP_AUTO_PROBE = 2,       /* steps a probe lasts */
    MTP_AUTO_SETTLE = 4       /* cycles (run and probe) no drafts must lead by the margin to settle */
};

typedef struct mtp_auto {
    double tok[TERN_MTP_MAX_DEPTH + 1], sec[TERN_MTP_MAX_DEPTH + 1];   /* decayed sums at each depth */
    int steps;                /* steps chosen so far */
    int best;                 /* the depth that runs between probes */
    int probe;                /* the depth the next probe tries */
    int lead;                 /* cycles in a row no drafts led by the margin */
    int settled;              /* no drafts from now on */
} mtp_auto;

void mtp_auto_init(mtp_auto *a);
/* The next step's depth. */
int mtp_auto_depth(mtp_auto *a);
/* A step at `depth` took `tokens` tokens in `secs` seconds. */
void mtp_auto_record(mtp_auto *a, int depth, int tokens, double secs);
/* The depth measured best so far. */
int mtp_auto_best(const mtp_auto *a);

#endif
