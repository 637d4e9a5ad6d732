#include "engine/mtp_auto.h"

#include <string.h>

#define DEPTHS (TERN_MTP_MAX_DEPTH + 1)
#define DECAY 0.8              /* a record's weight after the next record at its depth */
#define WARM_STEPS (MTP_AUTO_WARM * DEPTHS)
#define CYCLE (MTP_AUTO_RUN + MTP_AUTO_PROBE)
#define MARGIN 0.9             /* no drafts lead when every depth's rate is below this share of theirs */

void mtp_auto_init(mtp_auto *a) { memset(a, 0, sizeof *a); }

static double rate(const mtp_auto *a, int d) { return a->sec[d] > 0 ? a->tok[d] / a->sec[d] : 0; }

int mtp_auto_best(const mtp_auto *a) {
    int best = 0;
    double best_rate = -1;
    for (int d = 0; d < DEPTHS; d++) {
        double r = rate(a, d);
        if (r > best_rate) {
            best = d;
            best_rate = r;
        }
    }
    return best;
}

static int no_drafts_lead(const mtp_auto *a) {
    for (int d = 1; d < DEPTHS; d++)
        if (rate(a, d) >= MARGIN * rate(a, 0)) return 0;
    return 1;
}

int mtp_auto_depth(mtp_auto *a) {
    if (a->settled) return 0;
    int i = a->steps++;
    if (i < WARM_STEPS) return (i / MTP_AUTO_WARM + 1) % DEPTHS;   /* 1, 2, ..., then 0 */
    int k = (i - WARM_STEPS) % CYCLE;
    if (k == 0) {
        /* a cycle begins: the best runs, then the next other depth is probed */
        a->lead = no_drafts_lead(a) ? a->lead + 1 : 0;
        if (a->lead >= MTP_AUTO_SETTLE) {
            a->settled = 1;
            return 0;
        }
        a->best = mtp_auto_best(a);
        do a->probe = (a->probe + 1) % DEPTHS;
        while (a->probe == a->best);
    }
    return k < MTP_AUTO_RUN ? a->best : a->probe;
}

void mtp_auto_record(mtp_auto *a, int depth, int tokens, double secs) {
    if (depth < 0 || depth >= DEPTHS || tokens < 0 || !(secs >= 0)) return;
    a->tok[depth] = a->tok[depth] * DECAY + tokens;
    a->sec[depth] = a->sec[depth] * DECAY + secs;
}
